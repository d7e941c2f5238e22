"""Where a decode step's wall time goes on CUDA, host against device: a torch.profiler trace (the host's Python
functions, aten ops and CUDA runtime calls, and the device's kernels) of one batch-1 greedy generation per method,
and the device's idle time attributed to what the host was running meanwhile (sampled every 2 us).

    python benchmarks/gpu_step_trace.py --random-bench /tmp/rb --methods baseline eagle3:5 medusa:3 --out DIR
    python benchmarks/gpu_step_trace.py --model M --head eagle3=H --methods eagle3:5 --out DIR

With step graphs a step's device work is a few graph replays; whatever the host does between them (packing the
step, the proposer's bookkeeping, reading the accepted tokens) leaves the device idle unless it was queued ahead.
The report per method: wall time a step, device-busy time a step, and the idle time by the innermost host Python
function (self) and by every function on the stack (inclusive). A random head accepts nothing, so a step's
catch-up is one position; the host work per step is what it measures.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import inspect
import json
import re
import shutil
import time
from pathlib import Path

import torch

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"python_function", "cpu_op", "cuda_runtime", "cuda_driver"}


def idle_report(trace: dict, top: int = 25) -> str:
    """The device's idle time inside the decode steps of ``trace`` (a chrome trace), by host function."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    dev = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATS)
    host = [e for e in events if e.get("cat") in HOST_CATS]
    tids = collections.Counter(e["tid"] for e in host if e["cat"] == "python_function")
    main = tids.most_common(1)[0][0] if tids else None
    host = sorted((e for e in host if e["tid"] == main), key=lambda e: (e["ts"], -e["dur"]))
    steps = [e for e in host if e["cat"] == "python_function" and e["name"].endswith("_decode_step")]
    if not steps or not dev:
        return "no decode steps or no device events in the trace\n"
    t0, t1 = steps[0]["ts"], max(e["ts"] + e["dur"] for e in steps)
    merged: list[list[float]] = []  # the device's busy intervals, merged
    for s, e in dev:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    busy = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in merged)
    starts = [m[0] for m in merged]

    def idle(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i < 0 or t >= merged[i][1]

    self_t: collections.Counter = collections.Counter()
    incl_t: collections.Counter = collections.Counter()
    op_t: collections.Counter = collections.Counter()
    stack: list[dict] = []
    i, dt, t = 0, 2.0, t0
    while t < t1:
        while i < len(host) and host[i]["ts"] <= t:
            e = host[i]
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            stack.append(e)
            i += 1
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= t:
            stack.pop()
        if idle(t):
            live = [e for e in stack if e["ts"] + e["dur"] > t]
            py = [re.sub(r" at 0x[0-9a-f]+", "", e["name"]) for e in live if e["cat"] == "python_function"]
            ops = [e["name"] for e in live if e["cat"] != "python_function"]
            self_t[py[-1] if py else "(no python frame)"] += dt
            for name in set(py):
                incl_t[name] += dt
            if ops:
                op_t[ops[-1]] += dt
        t += dt
    n = len(steps)
    wall = (t1 - t0) / n
    idle_total = sum(self_t.values()) / n
    lines = [f"{n} decode steps: {wall:.0f} us a step, device busy {busy / n:.0f} us, idle {idle_total:.0f} us "
             f"({idle_total / wall:.0%})", "idle us a step by innermost python function (self):"]
    lines += [f"  {v / n:8.1f}  {k[:150]}" for k, v in self_t.most_common(top)]
    lines += ["idle us a step by python function on the stack (inclusive):"]
    inner = [(k, v) for k, v in incl_t.most_common() if v < 0.95 * sum(self_t.values())]  # not the outer frames
    lines += [f"  {v / n:8.1f}  {k[:150]}" for k, v in inner[:top]]
    lines += ["idle us a step by innermost op / runtime call:"]
    lines += [f"  {v / n:8.1f}  {k[:150]}" for k, v in op_t.most_common(top)]
    kern_t: collections.Counter = collections.Counter()
    kern_n: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") in DEVICE_CATS and t0 <= e["ts"] < t1:
            name = re.sub(r"<.*", "", e["name"])[:90]  # templates folded: one row per kernel family
            kern_t[name] += e["dur"]
            kern_n[name] += 1
    lines += [f"device kernels a step: {sum(kern_n.values()) / n:.0f} launches, {sum(kern_t.values()) / n:.0f} us; "
              "by kernel (us a step, launches a step):"]
    lines += [f"  {v / n:8.1f} {kern_n[k] / n:6.1f}  {k}" for k, v in kern_t.most_common(top)]
    return "\n".join(lines) + "\n"


HOST_TIMED = (  # (module, attribute path): host time inclusive, per decode step, no syncs added
    ("specdec.engine", "LLM._decode_step"), ("specdec.engine", "LLM._propose"), ("specdec.engine", "LLM._commit"),
    ("specdec.engine", "accept_deferred"), ("specdec.token_buffer", "TokenBuffer.draft_batch"),
    ("specdec.token_buffer", "_fill_hidden"), ("specdec.token_buffer", "TokenBuffer.keep_hidden"),
    ("specdec.verify", "Verifier.checked_drafts"), ("specdec.verify", "Verifier.sample"),
    ("specdec.cuda_graphs", "GraphRunner.forward"), ("specdec.cuda_graphs", "GraphRunner._pack_step"),
    ("specdec.cuda_graphs", "GraphRunner._replay"), ("specdec.cuda_graphs", "SlotStepGraphs.launch"),
    ("specdec.proposer", "Drafts.within_budget"), ("torch.cuda", "CUDAGraph.replay"),
    ("torch.cuda", "Event.synchronize"), ("specdec_eagle.proposer", "EagleProposer.propose"),
    ("specdec_eagle.proposer", "EagleProposer._catch_up"), ("specdec_eagle.proposer", "EagleProposer._features"),
    ("specdec_eagle.graph_chain", "CapturedHeadChain.run"), ("specdec_medusa.proposer", "MedusaProposer.propose"),
    ("specdec_ngram.proposer", "NgramProposer.propose"), ("specdec.policy", "SpeculationPolicy.plan"),
    ("specdec.policy", "SpeculationPolicy.observe"), ("specdec.runner", "ModelRunner.collect"),
    ("specdec.validation", "_check_structure"), ("specdec.validation", "DeferredDrafts.__init__"),
    ("specdec.validation", "DeferredDrafts.lists"), ("specdec.cuda_graphs", "HostArgmax.read"),
    ("specdec.cuda_graphs", "pack_tokens"), ("specdec.cuda_graphs", "logit_rows"),
    ("specdec.engine", "LLM._tokens_write"), ("specdec.engine", "LLM._append"),
    ("specdec.metrics", "StepTimer.lap"), ("specdec.metrics", "SpecDecodingStats.observe_drafts"),
    ("specdec_eagle.proposer", "draft_temperatures"), ("specdec_medusa.proposer", "draft_temperatures"),
    ("specdec_medusa.heads", "MedusaHeads.forward"), ("specdec.engine", "LLM._queue_ahead"),
    ("specdec.engine", "LLM._take_ahead"), ("specdec.cuda_graphs", "GraphRunner.ahead"),
    ("specdec.policy", "SpeculationPolicy.would_draft"),
    # outside the decode steps: prefills, requests joining and leaving (plain_overhead --host-timers)
    ("specdec.engine", "LLM.generate"), ("specdec.engine", "LLM._prefill"), ("specdec.engine", "LLM._retire"),
    ("specdec.engine", "LLM._release"), ("specdec_eagle.proposer", "EagleProposer.add_request"),
    ("specdec_eagle.proposer", "EagleProposer.remove_request"),
    # token trees (issue 25)
    ("specdec.engine", "LLM._tree_step"), ("specdec.engine", "LLM._tree_targets"),
    ("specdec.runner", "ModelRunner.forward_tree"), ("specdec.runner", "ModelRunner.keep_paths"),
    ("specdec.cuda_graphs", "GraphRunner.forward_tree"), ("specdec.runner", "TargetOutput.greedy_token_ids"),
    ("specdec.verify", "Verifier.checked_trees"), ("specdec.engine", "greedy_tree_accept"),
    ("specdec_eagle.proposer", "EagleProposer._tree"), ("specdec_eagle.graph_tree", "CapturedHeadTree.run"),
    ("specdec_eagle.proposer", "draft_tree"), ("specdec.runner", "ModelRunner.forward_tree_ids"),
    ("specdec.cuda_graphs", "GraphRunner.forward_tree_ids"), ("specdec.verify", "Verifier.deferred_trees"),
    ("specdec.validation", "DeferredTrees.nodes"),
    # a seeded sampled batch's queued step (s34: _queue_ahead took ~990 us of host time a step at T = 0.8 against
    # ~390 at T = 0, H100, batch 8, of which GraphRunner.ahead ~450 / ~360)
    ("specdec.engine", "keyed_plain_samples"), ("specdec.keyed", "rows_keys"), ("specdec.keyed", "_kernel_samples"),
    ("specdec.keyed", "inverse_temperatures"), ("specdec.kernels.keyed_triton", "keyed_argmax"),
    ("specdec.engine", "LLM._drawn_copy"), ("torch.cuda", "Event.record"),
    ("specdec.runner", "ModelRunner.forward_ahead"),
    ("specdec.cuda_graphs", "GraphRunner._overlay"), ("specdec.cuda_graphs", "GraphRunner._host"))
TORCH_TIMED = ("copy_", "clone", "index_select", "to", "clamp", "__getitem__", "__setitem__", "tolist", "numpy",
               "index_copy_", "argmax", "pin_memory", "reshape")  # torch.Tensor methods, with --torch-timers


def host_timers(torch_ops: bool = False) -> tuple[collections.Counter, collections.Counter]:
    """Wrap :data:`HOST_TIMED` with wall-clock timers; returns (seconds, calls) by name, filled as they run."""
    import importlib
    import inspect

    secs: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def wrap(fn, key: str):
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                secs[key] += time.perf_counter() - t
                calls[key] += 1
        return timed

    for mod, path in HOST_TIMED:
        try:
            owner = importlib.import_module(mod)
        except ImportError:
            continue
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None:
            continue
        timed = wrap(fn, path)  # a static method stays one (s35: GraphRunner._overlay got self as its graph)
        static = isinstance(owner, type) and isinstance(inspect.getattr_static(owner, name), staticmethod)
        setattr(owner, name, staticmethod(timed) if static else timed)
    if torch_ops:
        for name in TORCH_TIMED:
            setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name), f"Tensor.{name}"))
        for name in ("cat", "from_numpy", "tensor", "stack", "where"):
            setattr(torch, name, wrap(getattr(torch, name), f"torch.{name}"))
    return secs, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--head", action="append", default=[], help="METHOD=DIR (the head of a method)")
    ap.add_argument("--random-bench", metavar="DIR", help="random bench-shaped target and heads built in DIR")
    ap.add_argument("--methods", nargs="+", default=["baseline", "eagle3:5", "medusa:3"])
    ap.add_argument("--option", action="append", default=[], help="KEY=JSON for every speculative method")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=1, help="requests generated together (prompts at different offsets)")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampling (unseeded unless --seed)")
    ap.add_argument("--seed", type=int, default=None, help="with --temperature: seeded requests (keyed sampling)")
    ap.add_argument("--out", default="benchmarks/results/step-trace")
    ap.add_argument("--torch-timers", action="store_true", help="with --host-timers: torch ops too (TORCH_TIMED)")
    ap.add_argument("--host-timers", action="store_true",
                    help="no profiler: wall-clock timers around the step's host functions (HOST_TIMED), us a step")
    ap.add_argument("--torch-tree-step", action="store_true",
                    help="tree steps' positions and mask by the torch steps (specdec.runner.TREE_KERNEL off)")
    ap.add_argument("--head-rows", type=int, metavar="N",
                    help="eagle head steps of up to N rows through the fused row kernel (specdec_eagle.chain.HEAD_ROWS,"
                         " default 1: cuBLAS and torch steps beyond one row)")
    ap.add_argument("--few-slot-moves", type=int, metavar="N",
                    help="keep_paths' per-slot moves up to N slots (specdec.runner.FEW_SLOT_MOVES; 0: one gather and "
                         "scatter for all)")
    args = ap.parse_args()
    from gpu_eagle_profile import random_bench

    if args.torch_tree_step:
        import specdec.runner

        specdec.runner.TREE_KERNEL = False
    if args.few_slot_moves is not None:
        import specdec.runner

        specdec.runner.FEW_SLOT_MOVES = args.few_slot_moves
    if args.head_rows is not None:
        import specdec_eagle.chain

        specdec_eagle.chain.HEAD_ROWS = args.head_rows

    from specdec import LLM, SamplingParams, bundled_model

    heads = dict(h.split("=", 1) for h in args.head)
    if args.random_bench:
        for m in {m.split(":")[0] for m in args.methods} & {"eagle3", "medusa", "dflash"}:
            args.model, heads[m] = random_bench(args.random_bench, m)
    args.model = args.model or bundled_model("tiny")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, ignore_eos=True,
                            seed=args.seed)
    prompt = None
    if args.host_timers:
        secs, calls = host_timers(args.torch_timers)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for label in args.methods:
        method, _, k = label.partition(":")
        spec = None
        if method != "baseline":
            spec = {"method": method, "num_speculative_tokens": int(k or 3), "speculation_policy": "fixed"}
            if method in heads:
                spec["model"] = heads[method]
            for o in args.option:
                key, _, value = o.partition("=")
                spec[key] = json.loads(value)
        llm = LLM(args.model, spec, device=args.device, max_num_seqs=args.batch)
        if prompt is None:
            ids = llm.tokenizer(inspect.getsource(json.decoder)[:6000])["input_ids"]
            prompts = [ids[37 * i: 37 * i + 400] for i in range(args.batch)]
            prompt = prompts[0]
        times = []
        for _ in range(4):
            sync()
            t = time.perf_counter()
            res = llm.generate(prompts, params)[0]
            sync()
            times.append(time.perf_counter() - t)
        best = min(times[1:])
        if args.host_timers:
            secs.clear()
            calls.clear()
            ahead0 = llm.steps_ahead
            sync()
            t = time.perf_counter()
            llm.generate(prompts, params)
            sync()
            wall = time.perf_counter() - t
            n = calls["LLM._decode_step"] or 1
            report = [f"=== {label}: {n} decode steps, {wall / n * 1e6:.0f} us a step (timers on; best unprofiled "
                      f"{best / len(res.token_ids) * 1e6:.0f} us a step of {args.batch}; "
                      f"{llm.steps_ahead - ahead0} steps queued ahead; "
                      f"policy {llm.policy.stats.as_dict() if llm.policy is not None else None})"]
            report += [f"  {secs[k] / n * 1e6:8.1f} us  {calls[k] / n:5.2f} calls  {k}" for k, _ in secs.most_common()]
            print("\n".join(report), flush=True)
            (out / f"host-{label.replace(':', '-')}.txt").write_text("\n".join(report) + "\n")
            del llm
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA], with_stack=True) as prof:
            llm.generate(prompts, params)
            sync()
        path = out / f"trace-{method}.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        with open(path, "rb") as f, gzip.open(f"{path}.gz", "wb") as g:
            shutil.copyfileobj(f, g)
        path.unlink()
        steps = llm.stats.num_drafts if spec else None
        head = (f"=== {label}: {len(res.token_ids)} tokens in {best * 1000:.1f} ms ({len(res.token_ids) / best:.0f} "
                f"tok/s, best of 3 unprofiled){'' if steps is None else f'; drafting steps so far {steps}'}\n")
        report = head + idle_report(trace)
        print(report, flush=True)
        (out / f"idle-{method}.txt").write_text(report)
        del llm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where a speculative step's time goes on a GPU: the device time and kernel count of each captured
graph (target one-token step, target verify step, greedy draft chain, prefill groups), and the host's
wall time of each step phase, side by side, on random-init models of the bench pair's shapes (no
training needed: a graph's cost does not depend on its weights).

    python benchmarks/gpu_parts.py                     # batch 1 and 32, k=3
    python benchmarks/gpu_parts.py --batch 32 -k 2 3 --out parts.json

A replay's device time is timed with CUDA events over ``--replays`` back-to-back replays (the GPU's
cost alone); its kernels are counted under the torch profiler. The host's share of a phase is its
wall time (``LLM(profile_steps=True)``, which synchronises the device per phase) minus the device time
of the graphs it replays.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from specdec import LLM, SamplingParams

TARGET = dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=12, num_attention_heads=12,
              num_key_value_heads=12)
DRAFT = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=8)


def save_random(path: str, vocab: int, **dims) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(max_position_embeddings=1024, vocab_size=vocab, tie_word_embeddings=True, **dims)) \
        .to(torch.bfloat16).save_pretrained(path)
    return path


def time_replay(replay, replays: int) -> dict:
    """Device milliseconds per replay (events around ``replays`` back-to-back replays) and the kernels
    one replay launches (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        replay()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / replays
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    busy_us = sum(getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0) for e in kernels)
    return {"device_ms": round(ms, 4), "kernels": len(kernels), "kernel_busy_ms": round(busy_us / 1000, 4)}


def fill_step(g, bb: int, qb: int, start: int) -> None:
    """A full step's inputs: every row real, ``qb`` tokens after ``start`` committed ones."""
    host = g.host.numpy()
    host[: bb * qb] = 5
    host[bb * qb: bb * qb + bb] = start
    host[bb * qb + bb: bb * qb + 2 * bb] = qb
    host[bb * qb + 2 * bb: 2 * bb * qb + 2 * bb] = range(bb * qb)
    g.inputs.copy_(g.host)


@torch.inference_mode()
def graph_parts(llm: LLM, batch: int, k: int, start: int, prefill_groups: list[int], replays: int) -> dict:
    runner = llm.target.graphs
    kv = next(b for b in runner.kvs if b >= start + k + 1)
    bb = next(b for b in runner.batches if b >= batch)
    out = {}
    for name, q in (("target_step", 1), ("target_verify", k + 1)):
        g = runner.graphs[(bb, q, kv)]
        fill_step(g, bb, q, start)
        out[name] = time_replay(g.graph.replay, replays)
    chain = llm.proposer._chain
    if chain is not None:
        c = chain.chains[(bb, next(b for b in chain.kvs if b >= start + 1 + k))]
        host = c.host.numpy()
        q = chain.q
        host[: bb * q] = 5
        host[bb * q: bb * q + bb] = start
        host[bb * q + bb:] = 1  # a one-token catch-up (the last step's drafts were rejected)
        c.inputs.copy_(c.host)
        out["draft_chain"] = time_replay(c.graph.replay, replays)
    for gsize in prefill_groups:
        key = next(((g, p) for g, p in runner.prefill_shapes if g >= gsize and p >= 256), None)
        if key is None:
            continue
        gb, pb = key
        p = runner.prefills[key]
        host = p.host.numpy()
        host[: gb * pb] = 5
        host[gb * pb: gb * pb + gb] = [256] * gsize + [0] * (gb - gsize)
        host[gb * pb + gb: gb * pb + 2 * gb] = list(range(gsize)) + [0] * (gb - gsize)
        p.inputs.copy_(p.host)
        out[f"prefill_{gsize}x256"] = {"bucket": [gb, pb], **time_replay(p.graph.replay, replays)}
    return out


def host_phases(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts, params)  # warm-up
    llm.step_timer.reset()
    llm.generate(prompts, params)
    return {k: round(v, 4) for k, v in llm.step_timer.per_step_ms().items()}


def loop_ab(target: str, draft: str, batch: int, k: int, passes: int, max_tokens: int) -> list[dict]:
    """Un-profiled wall time per decode step of draft_model with its greedy drafts handed to the verify
    forward on the device (``defer``, the default) and read on the host first (``host``), and of the
    baseline, passes interleaved; 3 x batch requests of varied lengths, so requests join and slots
    go non-contiguous. ``step_vs_baseline``: the step's cost over the baseline's (what drafting and
    verifying k tokens cost; the random draft is almost never accepted).
    ``gpu_busy`` is the share of one more pass's wall time the GPU spent in kernels (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    rng = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 16384, (256,), generator=rng).tolist() for _ in range(3 * batch)]
    lengths = torch.randint(max_tokens // 2, max_tokens + 1, (3 * batch,), generator=rng).tolist()
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    llm = LLM(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": k}, max_num_seqs=batch)
    base = LLM(target, max_num_seqs=batch)
    modes = {"defer": (llm, None), "host": (llm, False), "baseline": (base, None)}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    steps: dict[str, int] = {}
    for i in range(passes + 1):
        for mode, (engine, flag) in modes.items():
            engine._defer_drafts = flag
            engine.step_timer.reset()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            torch.cuda.synchronize()
            if i:  # the first pass warms up
                walls[mode].append(time.perf_counter() - t0)
                steps[mode] = engine.step_timer.steps
    rows = []
    for mode, (engine, flag) in modes.items():
        engine._defer_drafts = flag
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        busy = sum(getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
        best = min(walls[mode])
        rows.append({"batch": batch, "k": k, "mode": mode, "wall_s": [round(w, 4) for w in walls[mode]],
                     "steps": steps[mode], "ms_per_step_incl_prefill": round(1000 * best / steps[mode], 4),
                     "gpu_busy": round(busy / wall, 3)})
    for r in rows:  # a random draft is almost never accepted: both make about one token a step
        r["step_vs_baseline"] = round(r["ms_per_step_incl_prefill"] / rows[-1]["ms_per_step_incl_prefill"], 3)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("-k", type=int, nargs="+", default=[3])
    ap.add_argument("--start", type=int, default=300, help="committed tokens per row in the timed replays")
    ap.add_argument("--prefill-groups", type=int, nargs="+", default=[1, 4, 8, 32])
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--loop-passes", type=int, default=0,
                    help="also time whole generate() calls, drafts deferred vs read first, this many passes each")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "parts.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_parts.py times CUDA graphs: it needs a CUDA device.")
    root = tempfile.mkdtemp(prefix="specdec-parts-")
    target = save_random(os.path.join(root, "target"), 16384, **TARGET)
    draft = save_random(os.path.join(root, "draft"), 16384, **DRAFT)
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 16384, (256,), generator=rng).tolist() for _ in range(max(args.batch))]
    rows = []
    for batch in args.batch:
        base = LLM(target, max_num_seqs=batch, profile_steps=True)
        row = {"batch": batch, "method": "baseline", "host_phases_ms": host_phases(base, prompts[:batch],
                                                                                  args.max_tokens)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del base
        for k in args.k:
            llm = LLM(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": k},
                      max_num_seqs=batch, profile_steps=True)
            row = {"batch": batch, "method": "draft_model", "k": k,
                   "host_phases_ms": host_phases(llm, prompts[:batch], args.max_tokens),
                   "graphs": graph_parts(llm, batch, k, args.start, [g for g in args.prefill_groups if g <= batch]
                                         if batch > 1 else [1], args.replays)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del llm
    loops = []
    if args.loop_passes:
        for batch in args.batch:
            for k in args.k:
                loops += loop_ab(target, draft, batch, k, args.loop_passes, args.max_tokens)
                for r in loops[-3:]:
                    print(json.dumps(r), flush=True)
    print(f"\n{torch.cuda.get_device_name()}: random-init bench-shaped pair (12-layer 768 target, 2-layer 512 draft,"
          f" vocab 16384), bf16, CUDA graphs; replays after {args.start} committed tokens")
    print("| batch | k | graph | device ms | kernels | kernel busy ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for name, g in r.get("graphs", {}).items():
            print(f"| {r['batch']} | {r['k']} | {name} | {g['device_ms']:.3f} | {g['kernels']} | "
                  f"{g['kernel_busy_ms']:.3f} |")
    print("\n| batch | method | k | propose ms | forward ms | sample ms | bookkeeping ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        p = r["host_phases_ms"]
        print(f"| {r['batch']} | {r['method']} | {r.get('k', '-')} | {p['propose']:.3f} | {p['forward']:.3f} | "
              f"{p['sample']:.3f} | {p['bookkeeping']:.3f} |")
    if loops:
        print("\n| batch | k | drafts | ms per step (prefill incl.) | vs baseline | steps | GPU busy |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in loops:
            print(f"| {r['batch']} | {r['k']} | {r['mode']} | {r['ms_per_step_incl_prefill']:.3f} | "
                  f"{r['step_vs_baseline']:.2f} | {r['steps']} | {r['gpu_busy']:.0%} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "loops": loops},
                                         indent=2))


if __name__ == "__main__":
    main()

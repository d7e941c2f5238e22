"""s54: what a decode step's wall time is made of, per engine (baseline, fixed k, auto) in the same passes: the
host thread's CPU time in the step (``time.thread_time``) against its wall time (a step whose wall time runs far
past its CPU time waited: for the device, a lock, the scheduler), and the step's change in the CUDA caching
allocator's counters (device mallocs, frees, retries; pinned host allocations where torch reports them). For s53's
two GPU leads: auto's drafting steps ~50% dearer than fixed k's (ngram, tiny model, batch 32), and auto's stalls of
8-9 ms decaying over ~10 steps at the same places of each pass (medusa, random bench pair, batch 32, T = 0.8).

    python benchmarks/results/h100/s54-2026-12-07/step_probe.py --device cuda --method ngram:4 --batch 32 \
        --prompts 64 --temperature 0 --calls 2
    python benchmarks/results/h100/s54-2026-12-07/step_probe.py --device cuda --model /tmp/rb/target \
        --draft-model /tmp/rb/medusa --method medusa:2 --batch 32 --prompts 64 --temperature 0.8 --calls 2
"""
import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from policy_steps import add_workload_arguments, workload_calls  # noqa: E402

from specdec import LLM, bundled_model  # noqa: E402
from specdec_tools.bench.passes import fresh_proposer, gc_off  # noqa: E402

ap = argparse.ArgumentParser()
add_workload_arguments(ap, prompts=64, max_tokens=128, repeats=3)
ap.add_argument("--calls", type=int, default=2)
ap.add_argument("--engines", nargs="+", default=["baseline", "fixed", "auto"])
args = ap.parse_args()
torch.set_num_threads(args.threads)
model = args.model or bundled_model("tiny")
calls = workload_calls(args, args.calls)
name, k = args.method.split(":")
spec = {"method": name, "num_speculative_tokens": int(k), **({"model": args.draft_model} if args.draft_model else {})}
common = dict(device=args.device, max_num_seqs=args.batch)
make = {"baseline": lambda: LLM(model, **common),
        "fixed": lambda: LLM(model, {**spec, "speculation_policy": "fixed"}, **common),
        "auto": lambda: LLM(model, spec, **common)}
engines = {key: make[key]() for key in args.engines}
cuda = args.device.startswith("cuda")
KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")
HOST = ("num_host_alloc", "num_host_free")
host_stats = getattr(torch.cuda, "host_memory_stats", None) if cuda else None


def counters() -> tuple:
    if not cuda:
        return ()
    m = torch.cuda.memory_stats()
    out = tuple(m.get(key, 0) for key in KEYS)
    if host_stats is not None:
        try:
            h = host_stats()
            out += tuple(h.get(key, 0) for key in HOST)
        except Exception:  # (an older torch)
            pass
    return out


logs = {key: [] for key in engines}  # (rows, mode, wall s, cpu s, counter deltas)
for key, llm in engines.items():
    def step(reqs, _step=llm._decode_step, _log=logs[key], _llm=llm):
        c0 = counters()
        w0, t0 = time.perf_counter(), time.thread_time()
        _step(reqs)
        w1, t1 = time.perf_counter(), time.thread_time()
        c1 = counters()
        p = _llm.policy
        mode = -1 if p is None else int(not p.plain_reason)
        _log.append((len(reqs), mode, w1 - w0, t1 - t0, tuple(b - a for a, b in zip(c0, c1))))
    llm._decode_step = step

for llm in engines.values():  # warm-up pass
    for prompts, params in calls:
        llm.generate(prompts, params)
for log in logs.values():
    log.clear()
best = collections.defaultdict(lambda: float("inf"))
bounds = {key: [] for key in engines}
names = list(engines)
for r in range(args.repeats):
    for key in names[r % len(names):] + names[: r % len(names)]:
        llm = engines[key]
        fresh_proposer(llm)
        bounds[key].append(len(logs[key]))
        with gc_off():
            t0 = time.perf_counter()
            for prompts, params in calls:
                llm.generate(prompts, params)
            best[key] = min(best[key], time.perf_counter() - t0)
print(f"{args.method} {args.workload} b{args.batch} T={args.temperature}: "
      + ", ".join(f"{key} {best[key]:.3f} s" for key in engines))
print("\n| engine | mode | steps | wall ms | cpu ms | wall - cpu ms | rows |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for key, log in logs.items():
    for mode in sorted({m for _, m, *_ in log}):
        rows = [x for x in log if x[1] == mode]
        w = [x[2] for x in rows]
        c = [x[3] for x in rows]
        print(f"| {key} | {('plain', 'draft')[mode] if mode >= 0 else '-'} | {len(rows)} | "
              f"{1e3 * statistics.mean(w):.3f} (med {1e3 * statistics.median(w):.3f}) | "
              f"{1e3 * statistics.mean(c):.3f} (med {1e3 * statistics.median(c):.3f}) | "
              f"{1e3 * (statistics.mean(w) - statistics.mean(c)):.3f} | {statistics.mean(x[0] for x in rows):.1f} |")
print("\nby rows (wall / cpu ms, steps), all modes:")
for key, log in logs.items():
    cells = []
    for lo, hi in ((1, 4), (5, args.batch // 2), (args.batch // 2 + 1, args.batch - 1), (args.batch, args.batch)):
        sel = [x for x in log if lo <= x[0] <= hi]
        if sel:
            cells.append(f"{lo}-{hi}: {1e3 * statistics.mean(x[2] for x in sel):.3f} / "
                         f"{1e3 * statistics.mean(x[3] for x in sel):.3f} ({len(sel)})")
    print(f"  {key}: " + "; ".join(cells))
print(f"\ncounters a step: {KEYS + (HOST if host_stats else ())}; totals over the timed passes:")
for key, log in logs.items():
    tot = [sum(x[4][i] for x in log) for i in range(len(log[0][4]))] if log and log[0][4] else []
    print(f"  {key}: {tot}")
print("\nslow steps (over 4x the engine's median wall): index in pass, rows, mode, wall ms, cpu ms, counter deltas")
for key, log in logs.items():
    med = statistics.median(x[2] for x in log)
    starts = bounds[key] + [len(log)]
    for i, x in enumerate(log):
        if x[2] > 4 * med:
            p = max(j for j, s in enumerate(starts) if s <= i)
            print(f"  {key} pass {p} step {i - starts[p]}: rows {x[0]} mode {x[1]} wall {1e3 * x[2]:.2f} "
                  f"cpu {1e3 * x[3]:.2f} {x[4]}")
    # the steps after each slow one: do they decay?
    for i, x in enumerate(log):
        if x[2] > 4 * med and (i == 0 or log[i - 1][2] <= 4 * med):
            tail = log[i: i + 12]
            print(f"  {key} from {i}: wall " + " ".join(f"{1e3 * y[2]:.1f}" for y in tail)
                  + " | cpu " + " ".join(f"{1e3 * y[3]:.1f}" for y in tail))

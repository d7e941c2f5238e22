"""The auto policy's own host time a decode step: ``plan`` and ``observe`` of one batch in a loop, no model, at each
batch size, where plain has won (``--winner plain``: drafting steps 2x as long and gaining nothing) or where drafting
has (``--winner spec``: greedy k = 3 drafts, 1.8 of them accepted on average, drafting steps 1.8x a plain step; with
``--end``, nobody waiting, so every drafting decision also takes the end rule); with ``--old FILE`` (an earlier
``specdec/policy.py``, say ``git show REV:core/specdec/policy.py > /tmp/old_policy.py``) that policy too, timed in the
same run. A GPU step at the bench model's size is bound by the host (~0.5-0.9 ms at batch 1-32 on the H200), so
what the policy adds to each plain step shows in the speedup of a method that the policy keeps plain.

    python benchmarks/policy_host.py --batch 1 8 32
    python benchmarks/policy_host.py --winner spec --end --batch 1 8 32
    python benchmarks/policy_host.py --old /tmp/old_policy.py
    python benchmarks/policy_host.py --by-step --batch 8 32 --old /tmp/old_policy.py

``--by-step``: where drafting wins, the median microseconds of ``plan``, ``would_draft`` (on plain steps, as the
engine asks) and ``observe`` by kind of step: drafting, and the plain steps of re-measurement bursts, which time the
plain mode (what the policy spends on them beyond a plain run's ~10 us is counted as plain's own).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from types import ModuleType

import specdec.policy


def load(path: str, name: str) -> ModuleType:
    """A policy module from ``path``, imported under ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--old {path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def per_step_us(module: ModuleType, batch: int, steps: int, k: int = 4, winner: str = "plain",
                end: bool = False) -> float:
    """Microseconds a step of ``plan`` + ``observe`` over ``steps`` steps of one batch, after 600 steps in which the
    policy learns the winner: plain (a sampled batch; drafting 2 ms a step, nothing accepted, against plain 1 ms) or
    spec (a greedy batch, k = 3, each request's accepted drafts drawn from 0..3 with mean 1.8 by a fixed seed;
    drafting 1.8 ms against plain 1 ms); ``end``: each step's tokens left are given (nobody waits to join)."""
    import random

    spec = winner == "spec"
    k = 3 if spec else k
    policy = module.SpeculationPolicy(k=k)
    ids = [f"r{i}" for i in range(batch)]
    zeros = [0] * batch
    rng = random.Random(0)
    outcomes = [[rng.choice((0, 1, 2, 3, 3)) for _ in ids] for _ in range(64)] if spec else [zeros]
    left = [1000] * batch if end else None

    def run(n: int) -> None:
        for s in range(n):
            widths = policy.plan(ids, not spec, left)
            drafted = [k if w else 0 for w in widths]
            accepted = [min(w, a) for w, a in zip(drafted, outcomes[s % len(outcomes)])]
            policy.observe(ids, drafted, accepted, (1.8e-3 if spec else 2e-3) if any(widths) else 1e-3,
                           sampled=not spec)

    run(600)
    t0 = time.perf_counter()
    run(steps)
    return (time.perf_counter() - t0) / steps * 1e6


def by_step(module: ModuleType, batch: int, steps: int) -> dict[str, tuple[int, float, float, float]]:
    """``--by-step``: per kind of step ("draft", "plain <reason>"), its count and median microseconds of plan,
    would_draft and observe, where drafting wins (:func:`per_step_us`'s spec outcomes, nobody waiting)."""
    import random

    policy = module.SpeculationPolicy(k=3)
    ids = [f"r{i}" for i in range(batch)]
    rng = random.Random(0)
    outcomes = [[rng.choice((0, 1, 2, 3, 3)) for _ in ids] for _ in range(64)]
    left = [1000] * batch
    times: dict[str, list[tuple[float, float, float]]] = {}
    for s in range(600 + steps):
        t0 = time.perf_counter()
        widths = policy.plan(ids, False, left)
        t1 = time.perf_counter()
        if not any(widths):
            policy.would_draft(ids, False, left)
        t2 = time.perf_counter()
        drafted = [3 if w else 0 for w in widths]
        accepted = [min(w, a) for w, a in zip(drafted, outcomes[s % len(outcomes)])]
        policy.observe(ids, drafted, accepted, 1.8e-3 if any(widths) else 1e-3)
        t3 = time.perf_counter()
        if s >= 600:
            kind = "draft" if any(widths) else f"plain {getattr(policy, 'plain_reason', '') or '?'}"
            times.setdefault(kind, []).append((t1 - t0, t2 - t1, t3 - t2))
    out = {}
    for kind, rows in times.items():
        med = [sorted(r[i] for r in rows)[len(rows) // 2] * 1e6 for i in range(3)]
        out[kind] = (len(rows), *med)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each (the fastest counts)")
    ap.add_argument("--old", default=None, help="an earlier policy.py to time beside this one")
    ap.add_argument("--winner", default="plain", choices=["plain", "spec"], help="the mode that wins (see above)")
    ap.add_argument("--end", action="store_true", help="give tokens left each step (the end rule decides too)")
    ap.add_argument("--by-step", action="store_true", help="drafting winning: plan / would_draft / observe by step")
    args = ap.parse_args()
    modules = {"this": specdec.policy}
    if args.old:
        modules["old"] = load(args.old, "old_policy")
    if args.by_step:
        print("| batch | policy | step | steps | plan us | would_draft us | observe us |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for b in args.batch:
            for key, module in modules.items():
                for kind, (n, plan, would, observe) in sorted(by_step(module, b, args.steps).items()):
                    print(f"| {b} | {key} | {kind} | {n} | {plan:.1f} | {would:.1f} | {observe:.1f} |")
        return
    best: dict[tuple[int, str], float] = {}
    for _ in range(args.repeats):
        for b in args.batch:
            for key, module in modules.items():
                t = per_step_us(module, b, args.steps, winner=args.winner, end=args.end)
                best[b, key] = min(best.get((b, key), t), t)
    print(f"winner {args.winner}{', end rule' if args.end else ''}")
    print("| batch | " + " | ".join(f"{key} policy, us a step" for key in modules) + " |")
    print("| --- |" + " --- |" * len(modules))
    for b in args.batch:
        print(f"| {b} | " + " | ".join(f"{best[b, key]:.2f}" for key in modules) + " |")


if __name__ == "__main__":
    main()

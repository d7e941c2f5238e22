"""The auto policy's own host time a decode step, where plain has won (drafting steps 2x as long and gaining nothing):
``plan`` and ``observe`` of one batch in a loop, no model, at each batch size; with ``--old FILE`` (an earlier
``specdec/policy.py``, say ``git show REV:core/specdec/policy.py > /tmp/old_policy.py``) that policy too, timed in the
same run. A GPU step at the bench model's size is bound by the host (~0.5-0.9 ms at batch 1-32 on the H200), so
what the policy adds to each plain step shows in the speedup of a method that the policy keeps plain.

    python benchmarks/policy_host.py --batch 1 8 32
    python benchmarks/policy_host.py --old /tmp/old_policy.py
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


def per_step_us(module: ModuleType, batch: int, steps: int, k: int = 4) -> float:
    """Microseconds a step of ``plan`` + ``observe`` over ``steps`` steps of one sampled batch, after 600 steps in
    which the policy learns that drafting (2 ms a step, nothing accepted) loses to plain (1 ms)."""
    policy = module.SpeculationPolicy(k=k)
    ids = [f"r{i}" for i in range(batch)]
    zeros = [0] * batch

    def run(n: int) -> None:
        for _ in range(n):
            widths = policy.plan(ids, True, None)
            drafted = [k if w else 0 for w in widths]
            policy.observe(ids, drafted, zeros, 2e-3 if any(widths) else 1e-3, sampled=True)

    run(600)
    t0 = time.perf_counter()
    run(steps)
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each (the fastest counts)")
    ap.add_argument("--old", default=None, help="an earlier policy.py to time beside this one")
    args = ap.parse_args()
    modules = {"this": specdec.policy}
    if args.old:
        modules["old"] = load(args.old, "old_policy")
    best: dict[tuple[int, str], float] = {}
    for _ in range(args.repeats):
        for b in args.batch:
            for key, module in modules.items():
                t = per_step_us(module, b, args.steps)
                best[b, key] = min(best.get((b, key), t), t)
    print("| batch | " + " | ".join(f"{key} policy, us a step" for key in modules) + " |")
    print("| --- |" + " --- |" * len(modules))
    for b in args.batch:
        print(f"| {b} | " + " | ".join(f"{best[b, key]:.2f}" for key in modules) + " |")


if __name__ == "__main__":
    main()

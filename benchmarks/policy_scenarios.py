"""The speculation policy in ``policy_calls_sim.py``'s closed loop over a set of scenarios and seeds: per scenario,
each ``policy.py``'s simulated time over every step plain under the same load (geometric mean over the seeds, and
the worst seed). Scenarios: a CPU-like machine (9.5 ms plain steps) where drafting loses (0.7x), with noise, with
load coming and going, and where drafting pays under load; a GPU-like one (0.55 ms plain steps, 16 ms switches
after a bare run) with the H100's stalls (s42: a stall every ~400 steps, 10x fading over ~8 ms) where drafting
pays, ties and loses, and a cheap-switch lookup method near a tie.

    git show REV:core/specdec/policy.py > /tmp/old_policy.py
    python benchmarks/policy_scenarios.py /tmp/old_policy.py core/specdec/policy.py --seeds 10
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policy_calls_sim as s  # noqa: E402

CPU = "--plain-ms 9.5 --spec-ms 15 --switch-ms 1.5 --short-switch-ms 1 --noise 0.15 --calls 32"
GPU = "--plain-ms 0.55 --spec-ms 1.3 --switch-ms 16 --short-switch-ms 1.5 --episodes 0.0025 --calls 64"
SCENARIOS = {  # name: policy_calls_sim.py's options
    "cpu-noise": f"--acc 0.3 0.15 0.08 0.04 {CPU}",
    "cpu-load1.4": f"--acc 0.3 0.15 0.08 0.04 {CPU} --load 1.4 --load-steps 150",
    "cpu-load1.6": f"--acc 0.3 0.15 0.08 0.04 {CPU} --load 1.6 --load-steps 300",
    "cpu-pays-load": f"--acc 0.8 0.6 0.5 0.4 {CPU} --load 1.5 --load-steps 200",
    "gpu-ep-pays": f"--acc 0.9 0.8 0.7 {GPU}",
    "gpu-ep-tie": f"--acc 0.7 0.5 0.3 {GPU}",
    "gpu-ep-lose": f"--acc 0.5 0.3 0.2 {GPU}",
    "gpu-ep-lose-cheap": f"--acc 0.4 0.2 0.1 0.05 {GPU} --spec-ms 0.85 --switch-ms 0.3 --short-switch-ms 0.1",
    # the workload changes after 32 of 64 calls: drafting loses, then pays (how soon the policy notices)
    "gpu-lose-then-pays": f"--acc 0.5 0.3 0.2 --acc-later 0.9 0.8 0.7 {GPU}",
    "gpu-pays-then-loses": f"--acc 0.9 0.8 0.7 --acc-later 0.5 0.3 0.2 {GPU}",
    # s49's H100 grid, suffix k=4 at batch 8 on e2e's repeated calls (new, same, near-same prompts): each response's
    # first tokens drafted poorly (no earlier text of its own to match), the rest well; fixed k 1.23x
    "gpu-lookup-repeated": f"--acc 0.74 0.88 0.91 0.95 --acc-repeat 0.79 0.91 0.94 0.94 --first-acc 0.35 0.34 0.25 0.5 "
                           f"--first-tokens 6 {GPU} --spec-ms 1.6 --switch-ms 1.2 --short-switch-ms 0.15",
    # ...and where the responses never match well: fixed k loses
    "gpu-lookup-lose": f"--acc 0.45 0.5 0.5 0.5 --first-acc 0.2 0.2 0.2 0.2 --first-tokens 6 {GPU} --spec-ms 1.6 "
                       f"--switch-ms 1.2 --short-switch-ms 0.15",
    # s51's H100 row: medusa:2 at batch 32, T = 0.8, random heads (keyed drafts over near-flat logits, 2.59 tokens
    # a request a drafting step), drafting 1.73 ms against plain 0.62: fixed k 0.94x of plain there (0.83x here,
    # where the batch's shrinking steps cost what full ones do)
    "gpu-head-b32-tie": "--acc 0.85 0.87 --plain-ms 0.62 --spec-ms 1.75 --switch-ms 5.3 --short-switch-ms 0.2 "
                        "--batch 32 --per-call 32 --calls 16 --episodes 0.0025",
}


@functools.cache
def _policy(path: str) -> type:
    """The SpeculationPolicy of policy file ``path`` ("plain": every step plain; "fixed": every step drafting k),
    loaded once a process."""
    if path == "fixed":
        return None
    return s.EveryStepPlain if path == "plain" else s.load(path).SpeculationPolicy


def one(a: tuple[str, str, int, str]) -> float:
    """Simulated seconds of policy file ``path`` ("plain": every step plain; "fixed": fixed k) on scenario
    ``scen``, seed ``seed``, with ``extra`` options."""
    path, scen, seed, extra = a
    args = s.parse_args((SCENARIOS[scen] + f" --seed {seed} {extra}").split())
    return s.simulate(_policy(path), args)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="+", help="policy.py files, or 'fixed' (every step drafting k)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="the scenarios whose names start with this (e.g. gpu)")
    ap.add_argument("--extra", default="", help="options added to every scenario's (e.g. '--collect-ms 0.25')")
    args = ap.parse_args()
    paths, seeds, extra = args.policies, range(args.seeds), args.extra
    print("| scenario | " + " | ".join(paths) + " |")
    print("| --- |" + " --- |" * len(paths))
    with ProcessPoolExecutor(args.workers) as ex:
        for scen in (n for n in SCENARIOS if n.startswith(args.only)):
            plain = list(ex.map(one, [("plain", scen, sd, extra) for sd in seeds]))
            row = [scen]
            for p in paths:
                t = list(ex.map(one, [(p, scen, sd, extra) for sd in seeds]))
                r = [x / y for x, y in zip(t, plain)]
                row.append(f"{math.exp(statistics.mean(math.log(x) for x in r)):.3f} (max {max(r):.3f})")
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()

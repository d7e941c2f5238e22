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
}


@functools.cache
def _policy(path: str) -> type:
    """The SpeculationPolicy of policy file ``path`` ("plain": every step plain), loaded once a process."""
    return s.EveryStepPlain if path == "plain" else s.load(path).SpeculationPolicy


def one(a: tuple[str, str, int]) -> float:
    """Simulated seconds of policy file ``path`` ("plain": every step plain) on scenario ``scen``, seed ``seed``."""
    path, scen, seed = a
    args = s.parse_args((SCENARIOS[scen] + f" --seed {seed}").split())
    return s.simulate(_policy(path), args)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="+", help="policy.py files")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    paths, seeds = args.policies, range(args.seeds)
    print("| scenario | " + " | ".join(paths) + " |")
    print("| --- |" + " --- |" * len(paths))
    with ProcessPoolExecutor(args.workers) as ex:
        for scen in SCENARIOS:
            plain = list(ex.map(one, [("plain", scen, sd) for sd in seeds]))
            row = [scen]
            for p in paths:
                t = list(ex.map(one, [(p, scen, sd) for sd in seeds]))
                r = [x / y for x, y in zip(t, plain)]
                row.append(f"{math.exp(statistics.mean(math.log(x) for x in r)):.3f} (max {max(r):.3f})")
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()

"""s39: the library's end rule against SpreadEnd in ``policy_calls_sim.py``'s closed loop, 5 seeds a scenario.

Run from ``benchmarks/`` with ``spread-end.patch`` applied (``git apply
benchmarks/results/cpu/s39-2026-12-06/spread-end.patch``)::

    python results/cpu/s39-2026-12-06/sim_compare.py
"""

import statistics
import sys

sys.path.insert(0, ".")
from end_rule import SpreadEnd  # noqa: E402
from policy_calls_sim import parse_args, plain_seconds, simulate  # noqa: E402

from specdec.policy import SpeculationPolicy  # noqa: E402

CPU = "--plain-ms 6.89 --spec-ms 10.5 --tokens 96 --switch-ms 2 --short-switch-ms 2 --calls 16"
SCENARIOS = {
    "cpu-T0.8-suffix": "--acc 0.35 0.54 0.74 0.86 " + CPU,
    "cpu-T0-suffix": "--acc 0.75 0.8 0.88 0.9 " + CPU,
    "cpu-T0.8-spread": "--acc 0.45 0.5 0.6 0.7 --spread 0.6 " + CPU,
    "h100-acc95": "--acc 0.95 0.9 0.85",
    "h100-acc90": "--acc 0.9 0.85 0.8",
    "h100-calls32": "--acc 0.95 0.9 0.85 --per-call 32",
    "h100-dud": "--acc 0.95 0.9 0.85 --dud 0.125",
    "h100-cheap": "--acc 0.95 0.9 0.85 --spec-ms 1.1",
    "h100-T0.8": "--acc 0.47 0.51 0.54 --spec-ms 1.6",
    "h100-eagle-T0": "--acc 0.9 0.9 0.9 --spec-ms 1.48 --plain-ms 0.545 --switch-ms 15",
}

for name, options in SCENARIOS.items():
    res = {}
    for label, cls in (("lib", SpeculationPolicy), ("spread", SpreadEnd), ("fixed", None)):
        ts = []
        for seed in range(5):
            args = parse_args(options.split() + ["--seed", str(seed)])
            ts.append(simulate(cls, args)[0] / plain_seconds(args))
        res[label] = statistics.mean(ts)
    print(f"{name:18s} time over all-plain: lib {res['lib']:.3f}  spread {res['spread']:.3f}  "
          f"fixed {res['fixed']:.3f}", flush=True)

"""The one-row projections, their fused neighbours and programmatic dependent launch in whole decode steps (issue
28), one process.

One captured decode step of a random-init target (``target_compile``'s measure: ``b`` rows, KV bucket 512, 300
tokens of context filled), four ways, replayed in turns:

- ``cublas``: the fused forward with cuBLAS projections, every kernel launched plainly (``triton_linear=False``,
  ``PDL = False``);
- ``row``: one-row steps' projections by :func:`specdec.fused_kernels.linear` (batch 1 only), the norms, SiLU * up
  and residual adds as their own kernels (``FUSE_ONE_ROW = False``), no PDL;
- ``fused``: the one-row kernel with those steps inside (:func:`specdec.fused.row_linear`; the default);
- ``fused+pdl``: that with PDL.

Prints milliseconds per step (median of ``--replays``), each mode over ``cublas``, and the share of the
weight-bandwidth floor at the copy bandwidth measured in the same run.

    python benchmarks/target_linear.py --sizes 1b 3b --batch 1 8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from target_compile import measure
from target_sweep import SIZES, build, copy_bandwidth, weight_bytes

import specdec.fused as fused_module
import specdec.fused_kernels as fk

# (TRITON_LINEAR, FUSE_ONE_ROW, PDL)
MODES = {"cublas": (False, False, False), "row": (True, False, False), "fused": (True, True, False),
         "fused+pdl": (True, True, True)}


def step_ms(model: torch.nn.Module, b: int, mode: str, replays: int) -> float:
    """Replay milliseconds of one decode step of ``b`` rows under ``mode`` (see MODES)."""
    saved = fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL
    fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL = MODES[mode]
    try:
        return measure(model, "fused", b, 512, 300, replays)[0]
    finally:
        fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL = saved
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1b", "3b"], choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the modes; the best of each is kept")
    ap.add_argument("--out", default="benchmarks/results/target-linear")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for size in args.sizes:
        model = build(size)
        floor_ms = weight_bytes(model) / bw * 1e3
        for b in args.batch:
            row = {"size": size, "batch": b, "floor_ms": round(floor_ms, 3)}
            for _ in range(args.rounds):
                for mode in MODES:
                    ms = step_ms(model, b, mode, args.replays)
                    row[mode] = round(min(row.get(mode, ms), ms), 4)
            for mode in MODES:
                row[f"{mode}_speedup"] = round(row["cublas"] / row[mode], 3)
                row[f"{mode}_floor_share"] = round(floor_ms / row[mode], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "target-linear.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

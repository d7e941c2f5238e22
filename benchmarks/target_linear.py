"""The one-row projections, their fused neighbours and programmatic dependent launch in whole decode
and verify steps (issue 28), one process.

One captured step of a random-init target (``target_compile``'s measure: ``b`` rows of ``q`` tokens, the logits of
each, KV bucket 512, 300 tokens of context filled), several ways, replayed in turns:

- ``cublas``: the fused forward with cuBLAS projections, every kernel launched plainly (``triton_linear=False``,
  ``PDL = False``);
- ``row``: one-row steps' projections by :func:`specdec.fused_kernels.linear` (batch 1 only), the norms, SiLU * up
  and residual adds as their own kernels (``FUSE_ONE_ROW = False``), no PDL;
- ``fused``: the one-row kernel with those steps inside (:func:`specdec.fused.row_linear`; the default), for
  one-row steps (a step of more rows, a verify of k + 1 tokens among them, is cuBLAS's, with the norms and SiLU * up
  as their own kernels: a few-row kernel lost to cuBLAS on an H100, s38-s39);
- ``fused+pdl``: that with PDL.

Prints milliseconds per step (median of ``--replays``), each mode over the first of ``--modes``, and the share of the
weight-bandwidth floor at the copy bandwidth measured in the same run.

    python benchmarks/target_linear.py --sizes 1b 3b --batch 1 8
    python benchmarks/target_linear.py --sizes bench 1b 3b --batch 1 --q 4 6 --modes cublas fused
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


def step_ms(model: torch.nn.Module, b: int, mode: str, replays: int, q: int = 1) -> float:
    """Replay milliseconds of one step of ``b`` rows of ``q`` tokens under ``mode`` (see MODES)."""
    saved = fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL
    fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL = MODES[mode]
    try:
        return measure(model, "fused", b, 512, 300, replays, q)[0]
    finally:
        fused_module.TRITON_LINEAR, fused_module.FUSE_ONE_ROW, fk.PDL = saved
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1b", "3b"], choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--q", nargs="+", type=int, default=[1], help="tokens a row (a verify step: k + 1)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
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
            for q in args.q:
                row = {"size": size, "batch": b, "q": q, "floor_ms": round(floor_ms, 3)}
                for _ in range(args.rounds):
                    for mode in args.modes:
                        ms = step_ms(model, b, mode, args.replays, q)
                        row[mode] = round(min(row.get(mode, ms), ms), 4)
                for mode in args.modes:
                    row[f"{mode}_speedup"] = round(row[args.modes[0]] / row[mode], 3)
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

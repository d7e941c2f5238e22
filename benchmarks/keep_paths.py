"""``ModelRunner.keep_paths`` two ways, same process, same cache: the per-slot form (an ``index_select`` and an
``index_copy_`` for each slot whose accepted path moves entries: ``specdec.runner.FEW_SLOT_MOVES`` slots or fewer)
against one advanced-indexing gather and scatter over the whole cache for every slot (``FEW_SLOT_MOVES = 0``, the
form before the forty-sixth session). A token tree's accepted path (root, then nodes further down the tree's order)
moves most of its entries, every step.

    python benchmarks/keep_paths.py                     # CPU, the bundled tiny target, batch 1 2 4
    python benchmarks/keep_paths.py --device cuda --model DIR --batch 1 4 8

Each row: microseconds a call (host time until it returns; on CUDA with a synchronize after each call, so device time
too), best of ``--repeats`` blocks of ``--calls`` calls, the two forms interleaved block by block, and their ratio.
Lengths are put back after every call, so every call moves the same entries.
"""

from __future__ import annotations

import argparse
import random
import time

import specdec.runner
from specdec import bundled_model
from specdec.target import HFTargetModel


def _block(target: HFTargetModel, rows: list[int], paths: list[list[int]], lengths: list[int], few: int, calls: int,
           sync) -> float:
    """Microseconds a keep_paths call over ``calls`` calls with ``FEW_SLOT_MOVES = few``."""
    specdec.runner.FEW_SLOT_MOVES = few
    t0 = time.perf_counter()
    for _ in range(calls):
        target.keep_paths(rows, paths)
        for s in rows:  # put the lengths back: the same moves every call
            target.lengths[s] = lengths[s]
        sync()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target directory (default: the bundled tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--path", type=int, default=4, help="accepted nodes after the root")
    ap.add_argument("--nodes", type=int, default=32, help="tree nodes the path is chosen among")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    dtype = "bfloat16" if args.device == "cuda" else "float32"
    target = HFTargetModel(args.model or bundled_model("tiny"), dtype=dtype, device=args.device, max_model_len=512)
    slots = max(args.batch)
    target.allocate(slots)
    for s in range(slots):
        target.advance(s, 100 + 7 * s)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    rng = random.Random(0)
    print(f"keep_paths on {args.device}, {args.path} accepted nodes of {args.nodes} after the root; us a call")
    print("| batch | per slot | one gather + scatter | ratio |\n| --- | --- | --- | --- |")
    for b in args.batch:
        rows = list(range(b))
        paths = [[0] + sorted(rng.sample(range(1, args.nodes + 1), args.path)) for _ in rows]
        lengths = list(target.lengths)
        best = {b: float("inf"), 0: float("inf")}
        for rep in range(args.repeats + 1):  # the first round warms up, untimed
            for few in (b, 0):
                us = _block(target, rows, paths, lengths, few, args.calls, sync)
                best[few] = min(best[few], us) if rep else best[few]
        print(f"| {b} | {best[b]:.1f} | {best[0]:.1f} | {best[0] / best[b]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

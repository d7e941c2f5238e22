"""The few-row projection kernel against cuBLAS, one projection at a time (issue 28), one process.

A verify step at batch 1 runs every projection over k + 1 rows. For each weight shape of a target size (q/k/v, o,
gate/up, down, LM head) and each row count, this times ``F.linear`` (cuBLAS), the one-row kernel (one row) and the
few-row kernel (:func:`specdec.fused_kernels.linear`) in its forms and tile sizes. Each timing replays a CUDA graph
that runs the projection over enough copies of the weight to pass 256 MB, so no weight is read from L2 (as in a real
step, where a layer's weights were last read a whole forward ago); prints microseconds a projection and the weight's
read bandwidth, and writes ``rows-linear.json``.

    python benchmarks/rows_linear.py --sizes bench 1b 3b --rows 1 2 4 6 8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from target_sweep import SIZES

import specdec.fused_kernels as fk

# (name, ROWS_DOT, ROWS_BLOCK_N, ROWS_BLOCK_K) of the few-row kernel's variants
VARIANTS = [("dot16x64", True, 16, 64), ("dot16x128", True, 16, 128), ("dot16x256", True, 16, 256),
            ("dot32x128", True, 32, 128), ("each64", False, 16, 64), ("each128", False, 16, 128),
            ("each256", False, 16, 256), ("each512", False, 16, 512), ("each1024", False, 16, 1024)]


def shapes(size: str) -> dict[str, tuple[int, int]]:
    """(rows n, columns k) of each projection weight of ``size`` (target_sweep's SIZES)."""
    c = SIZES[size]
    h, i = c["hidden_size"], c["intermediate_size"]
    d = h // c["num_attention_heads"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * d
    return {"qkv": (qkv, h), "o": (h, h), "gate_up": (2 * i, h), "down": (h, i), "lm_head": (c["vocab_size"], h)}


def few(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The few-row kernel for ``x``'s rows (``linear`` takes one row by default)."""
    return fk.linear(x, w, rows=fk.ROWS_MAX)


def time_us(fn, weights: list[torch.Tensor], x: torch.Tensor, replays: int = 20) -> float:
    """Microseconds a call of ``fn(x, w)``, from a CUDA graph that calls it once per weight copy."""
    for w in weights[:2]:
        fn(x, w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for w in weights:
            fn(x, w)
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2] * 1e3 / len(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["bench", "1b", "3b"], choices=sorted(SIZES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 6, 8])
    ap.add_argument("--variants", nargs="+", default=[v[0] for v in VARIANTS])
    ap.add_argument("--out", default="benchmarks/results/rows-linear")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    saved = fk.ROWS_DOT, fk.ROWS_BLOCK_N, fk.ROWS_BLOCK_K
    rows = []
    try:
        for size in args.sizes:
            for name, (n, k) in shapes(size).items():
                copies = max(2, -(-256 * 2**20 // (n * k * 2)))
                weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
                for m in args.rows:
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    row = {"size": size, "weight": name, "n": n, "k": k, "rows": m,
                           "cublas": round(time_us(F.linear, weights, x), 2)}
                    if m == 1:
                        row["one_row"] = round(time_us(fk.linear, weights, x), 2)
                    else:
                        for v, dot, bn, bk in VARIANTS:
                            if v in args.variants:
                                fk.ROWS_DOT, fk.ROWS_BLOCK_N, fk.ROWS_BLOCK_K = dot, bn, bk
                                row[v] = round(time_us(few, weights, x), 2)
                    best = min((key for key in row if key not in ("size", "weight", "n", "k", "rows")),
                               key=lambda key: row[key])
                    row["best"] = best
                    row["best_tb_s"] = round(n * k * 2 / row[best] / 1e6, 2)
                    row["cublas_tb_s"] = round(n * k * 2 / row["cublas"] / 1e6, 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del weights
                torch.cuda.empty_cache()
    finally:
        fk.ROWS_DOT, fk.ROWS_BLOCK_N, fk.ROWS_BLOCK_K = saved
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows-linear.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""The target's projections at few rows (issue 28): our small-row Triton kernel against cuBLAS, then whole steps.

Part 1, per projection of a target size (q/k/v, o, gate/up, down) and row count (1, 4, 8, 16): one CUDA graph of
one call per layer, each on its own weight (so the weights stream from HBM as in a real step, not from L2), timed
for cuBLAS (``F.linear``) and for every candidate configuration of
:func:`specdec.fused_kernels.linear`'s kernel; then, at the best configuration, the fused prologues against what
they replace (``norm_linear`` against the RMSNorm kernel + cuBLAS, ``silu_linear`` against the SiLU kernel +
cuBLAS). Prints microseconds per call, TB/s of weight read, and the best configuration.

Part 2, one captured decode step of the whole target (``target_compile``'s measure: ``b`` rows, KV bucket 512, 300
tokens of context): the fused forward with the small-row kernels (default rule), with the tuned table of part 1
(``LINEAR_CONFIGS``), and without them (``triton_linear=False``: the norm and SiLU kernels and cuBLAS).

    python benchmarks/target_linear.py --sizes 1b 3b --rows 1 4 8 16 --batch 1 8 --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from target_sweep import SIZES, build

import specdec.fused as fused_module
import specdec.fused_kernels as fk
from specdec.cuda_graphs import capture_graph


def graph_us(fn, calls: int, replays: int = 20) -> float:
    """Median microseconds per call of ``fn`` (which makes ``calls`` calls) replayed from a CUDA graph."""
    graph, _ = capture_graph(fn, None)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / 5 / calls * 1e6)
    return statistics.median(times)


def per_layer(op, ws: list[torch.Tensor], *args):
    """A function calling ``op(*args, w)`` for every layer's weight ``w``."""
    return lambda: [op(*args, w) for w in ws]


def _unfused_norm_linear(x, res, ln, eps, w):
    return F.linear(fk.add_rmsnorm(x, res, ln, eps)[0], w)


def _unfused_silu_linear(gu, w):
    return F.linear(fk.silu_mul(gu), w)


def shapes(size: str) -> dict[str, tuple[int, int]]:
    """``{projection: (n, k)}`` of a target size's layer (weights ``[n, k]``)."""
    c = SIZES[size]
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    return {"qkv": ((heads + 2 * kv) * d, h), "o": (h, heads * d), "gate_up": (2 * c["intermediate_size"], h),
            "down": (h, c["intermediate_size"])}


def candidates(block_m: int) -> list[tuple[int, int, int, int, bool]]:
    """Configurations tried for ``block_m`` rows: plain dot products (any rows), tensor-core tiles (rows padded to
    16), within a register budget."""
    out = []
    launch = ((4, 1), (4, 3), (8, 3)) if block_m == 1 else ((4, 3), (8, 3))
    for bn, bk, (warps, stages) in itertools.product((4, 8, 16, 32), (256, 512, 1024), launch):
        if block_m * bn * bk <= 8192 * warps and (block_m > 1 or bk >= 512):
            out.append((bn, bk, warps, stages, False))
    if block_m > 1:
        for bn, bk, (warps, stages) in itertools.product((16, 32, 64), (64, 128, 256), ((4, 3), (8, 3))):
            out.append((bn, bk, warps, stages, True))
    return out


def _run_config(x, ws, cfg, block_m):
    n, k = ws[0].shape
    saved = dict(fk.LINEAR_CONFIGS)
    fk.LINEAR_CONFIGS[(block_m, n, k)] = cfg
    try:
        return graph_us(per_layer(fk.linear, ws, x), len(ws))
    finally:
        fk.LINEAR_CONFIGS.clear()
        fk.LINEAR_CONFIGS.update(saved)


def sweep_projections(size: str, rows: list[int], tuned: dict) -> list[dict]:
    c = SIZES[size]
    layers = c["num_hidden_layers"]
    out = []
    for name, (n, k) in shapes(size).items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            block_m = 1 << (m - 1).bit_length()
            cublas = graph_us(per_layer(F.linear, ws, x), layers)
            default = graph_us(per_layer(fk.linear, ws, x), layers)
            best, best_cfg = float("inf"), None
            for cfg in candidates(block_m):
                try:
                    us = _run_config(x, ws, cfg, block_m)
                except Exception as e:  # a configuration the compiler refuses (shared memory, registers)
                    print(f"  {size} {name} m={m} {cfg}: {type(e).__name__}", flush=True)
                    continue
                if us < best:
                    best, best_cfg = us, cfg
            tuned[(block_m, n, k)] = best_cfg
            gb = n * k * 2 / 1e9
            row = {"size": size, "proj": name, "n": n, "k": k, "rows": m, "cublas_us": round(cublas, 2),
                   "default_us": round(default, 2), "default_cfg": list(fk.linear_config(m, n, k)[1]),
                   "best_us": round(best, 2), "best_cfg": list(best_cfg), "cublas_tbs": round(gb / cublas * 1e-3, 2),
                   "best_tbs": round(gb / best * 1e-3, 2), "best_over_cublas": round(cublas / best, 3)}
            if name in ("qkv", "gate_up", "down"):  # the fused prologue against the kernels it replaces
                fk.LINEAR_CONFIGS[(block_m, n, k)] = best_cfg
                ln = torch.ones(k, device="cuda", dtype=torch.bfloat16)
                if name == "down":
                    gu = torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16)
                    row["fused_us"] = round(graph_us(per_layer(fk.silu_linear, ws, gu), layers), 2)
                    row["unfused_us"] = round(graph_us(per_layer(_unfused_silu_linear, ws, gu), layers), 2)
                else:
                    res = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    args = (x, res, ln, 1e-5)
                    row["fused_us"] = round(graph_us(per_layer(fk.norm_linear, ws, *args), layers), 2)
                    row["unfused_us"] = round(graph_us(per_layer(_unfused_norm_linear, ws, *args), layers), 2)
                fk.LINEAR_CONFIGS.clear()
            out.append(row)
            print(json.dumps(row), flush=True)
        del ws
        torch.cuda.empty_cache()
    return out


def steps(size: str, batches: list[int], tuned: dict) -> list[dict]:
    from target_compile import measure

    model = build(size)
    out = []
    for b in batches:
        row = {"size": size, "batch": b}
        for mode in ("cublas", "small", "small_tuned"):
            fused_module.TRITON_LINEAR = mode != "cublas"
            fk.LINEAR_CONFIGS.clear()
            if mode == "small_tuned":
                fk.LINEAR_CONFIGS.update(tuned)
            try:
                row[mode], _ = measure(model, "fused", b, 512, 300, 30)
            finally:
                fused_module.TRITON_LINEAR = True
                fk.LINEAR_CONFIGS.clear()
            torch.cuda.empty_cache()
        row["small_over_cublas"] = round(row["cublas"] / row["small"], 3)
        row["tuned_over_cublas"] = round(row["cublas"] / row["small_tuned"], 3)
        out.append(row)
        print(json.dumps(row), flush=True)
    del model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1b", "3b"], choices=sorted(SIZES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8, 16])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--skip-sweep", action="store_true", help="part 2 only, with the default rule")
    ap.add_argument("--out", default="benchmarks/results/target-linear")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    tuned: dict = {}
    proj = [] if args.skip_sweep else [r for s in args.sizes for r in sweep_projections(s, args.rows, tuned)]
    step = [r for s in args.sizes for r in steps(s, args.batch, tuned)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "target-linear.json").write_text(json.dumps(
        {"projections": proj, "steps": step, "tuned": [[list(k), list(v)] for k, v in tuned.items()]}, indent=1))


if __name__ == "__main__":
    main()

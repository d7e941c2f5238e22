"""Probe: do one-row projections chained with programmatic dependent launch (PDL) beat cuBLAS? (issue 28)

A 1B (or 3B) target's four projections per layer, chained through every layer as a decode step chains them
(each reads the previous one's output), one row, captured in a CUDA graph: cuBLAS; our one-row Triton kernel;
the same kernel launched with PDL, each program loading its first weight tile before it waits for the previous
kernel (weights do not depend on it). Prints microseconds per chain and per layer.

    python benchmarks/pdl_probe.py --size 1b
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton
import triton.language as tl
from target_sweep import SIZES

from specdec.cuda_graphs import capture_graph


@triton.jit
def _row_kernel(x_ptr, w_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
                PRE: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
        if not PRE:
            tl.extra.cuda.gdc_wait()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rk = tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=n_ok[:, None] & (rk < K)[None, :], other=0.0)
    if GDC and PRE:
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + rk, mask=rk < K, other=0.0)
    acc = tl.sum(x.to(tl.float32)[None, :] * w.to(tl.float32), 1)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + rk, mask=k_ok, other=0.0)
        acc += tl.sum(x.to(tl.float32)[None, :] * w.to(tl.float32), 1)
    tl.store(out_ptr + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)


def row_linear(x, w, out, cfg, pdl, pre=True):
    n, k = w.shape
    bn, bk, warps, stages = cfg
    _row_kernel[(triton.cdiv(n, bn),)](x, w, out, n, k, BLOCK_N=bn, BLOCK_K=bk, GDC=pdl, PRE=pre, num_warps=warps,
                                      num_stages=stages, launch_pdl=pdl)
    return out


def graph_us(fn, replays=30):
    graph, _ = capture_graph(fn, None)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / 5 * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1b")
    args = ap.parse_args()
    c = SIZES[args.size]
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    shapes = [((heads + 2 * kv) * d, h), (h, h), (2 * inter, h), (h, inter)]
    cfgs = [(4, 1024, 4, 1), (4, 1024, 4, 3), (8, 1024, 4, 1), (4, 1024, 4, 3)]
    ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for n, k in shapes]
          for _ in range(layers)]
    bufs = [torch.zeros(n, device="cuda", dtype=torch.bfloat16) for n, _ in shapes]
    x0 = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    gb = sum(n * k * 2 for n, k in shapes) * layers / 1e9

    def chain(kind):
        def run():
            x = x0
            for lw in ws:
                for j, w in enumerate(lw):
                    k = w.shape[1]
                    if kind == "cublas":
                        torch.mm(x[None, :k], w.t(), out=bufs[j][None])
                    else:
                        row_linear(x, w, bufs[j], cfgs[j], kind != "triton", kind == "pdl")
                    x = bufs[j]
            return x
        return run

    ref = chain("cublas")()
    res = {}
    for kind in ("cublas", "triton", "pdl", "pdl_wait_first") * 2:
        out = chain(kind)()
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        us = graph_us(chain(kind))
        res.setdefault(kind, []).append(us)
        print(json.dumps({"size": args.size, "kind": kind, "us": round(us, 1), "per_layer_us": round(us / layers, 2),
                          "tbs": round(gb / us * 1e-3, 2), "max_err": err}), flush=True)


if __name__ == "__main__":
    main()

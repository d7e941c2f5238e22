"""Probe: one-row projections chained as a decode step chains them, with and without PDL (issue 28).

A target size's four projections per layer (q/k/v, o, gate/up, down), chained through every layer (each reads the
previous one's output), one row, captured in a CUDA graph: cuBLAS; :func:`specdec.fused_kernels.linear`'s one-row
kernel; the same kernel with programmatic dependent launch (``PDL``: each program loads its first weight tile
before it waits for the kernel that wrote its input). Prints microseconds per chain and per layer.

    python benchmarks/pdl_probe.py --size 1b

The sixteenth session's run (``results/h200/s16-2026-12-03/call2/probe.log``, 1B, us per chain): cuBLAS 679-709,
one-row kernel 625, with PDL 556; a variant that waited before loading any weight (an earlier version of this
script) 611.
"""

from __future__ import annotations

import argparse
import json

import torch
from target_compile import replay_ms
from target_sweep import SIZES

import specdec.fused_kernels as fk

KINDS = {"cublas": (False, False), "row": (True, False), "row+pdl": (True, True)}  # (one-row kernel, PDL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1b", choices=sorted(SIZES))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    c = SIZES[args.size]
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    shapes = [((heads + 2 * kv) * (h // heads), h), (h, h), (2 * inter, h), (h, inter)]
    ws = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for n, k in shapes]
          for _ in range(layers)]
    x0 = torch.randn(1, h, device="cuda", dtype=torch.bfloat16)

    def chain(kind: str):
        row, pdl = KINDS[kind]

        def run() -> torch.Tensor:
            fk.PDL = pdl
            x = x0
            for lw in ws:
                for w in lw:
                    x = x[:, : w.shape[1]]
                    x = fk.linear(x, w) if row else torch.nn.functional.linear(x, w)
            return x
        return run

    ref = chain("cublas")()
    for _ in range(args.rounds):
        for kind in KINDS:
            err = (chain(kind)().float() - ref.float()).abs().max().item()
            us = replay_ms(chain(kind), 30) * 1e3
            row = {"size": args.size, "kind": kind, "us": round(us, 1), "per_layer_us": round(us / layers, 2)}
            print(json.dumps({**row, "max_err": err}), flush=True)
    fk.PDL = False


if __name__ == "__main__":
    main()

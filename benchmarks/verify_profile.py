"""Which kernels a batch-1 verify step of the fused target spends its time in (issue 28).

One step of ``--q`` tokens (a verify of k + 1, ``target_compile.step_fn``) of a random-init target of
``target_sweep``'s shapes, 300 tokens of context, run eagerly ``--steps`` times under ``torch.profiler``; prints the
GPU time a step and its top kernels (name, calls a step, microseconds a call). (s38-s39 ran it with a few-row
projection kernel on and off: 4.40 / 3.80 ms against cuBLAS's 1.32 for a 1B verify of 4 tokens on an H100; the
kernel is gone since.)

    python benchmarks/verify_profile.py --size 1b --q 4
"""

from __future__ import annotations

import argparse
import json

import torch
from target_compile import step_fn
from target_profile import kernel_times
from target_sweep import SIZES, build


def profile(model: torch.nn.Module, q: int, steps: int) -> dict:
    """GPU microseconds a step of ``q`` tokens and its kernels."""
    one = step_fn(model, "fused", 1, 512, 300, q)

    def step() -> None:
        with torch.inference_mode():
            one()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per = {name: (len(v), sum(v)) for name, v in kernel_times(prof).items()}
    busy = sum(us for _, us in per.values()) / steps
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:10]
    return {"gpu_us": round(busy, 1),
            "top": [[name[:70], c // steps, round(us / c, 2), round(us / steps, 1)] for name, (c, us) in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1b", choices=sorted(SIZES))
    ap.add_argument("--q", nargs="+", type=int, default=[4])
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    model = build(args.size)
    for q in args.q:
        print(json.dumps({"size": args.size, "q": q, **profile(model, q, args.steps)}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where a decode step of the target goes (issue 28): the GPU kernels of our baseline's steps (CUDA graphs, fused or
Hugging Face layers) on a random-init Llama of ``target_sweep``'s shapes, under ``torch.profiler``.

For each configuration it prints the wall time of a decode step, the GPU's busy time inside it (the sum of kernel
durations), the kernels a step launches, and the kernels that take the most time: the gap between wall and busy
time is launch gaps plus host work; the kernels show what a fused forward still leaves on the table.

    python benchmarks/target_profile.py --size 1b --batch 1 --out benchmarks/results/h200/profile
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from target_sweep import SIZES, build, weight_bytes

import specdec.fused
from specdec import LLM, SamplingParams


def kernel_times(prof: torch.profiler.profile) -> dict[str, list[float]]:
    """Each CUDA kernel's durations in microseconds, by name, of a finished ``torch.profiler`` run."""
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    return kernels


def profile(llm: LLM, prompts: list[list[int]], new: int) -> dict:
    """Kernel totals of one ``generate`` of ``new`` tokens (after a warm-up), per decode step."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    kernels = kernel_times(prof)
    busy_us = sum(sum(v) for v in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:30]
    steps = new  # one decode step per token (the prefill adds one forward; counted in the totals)
    return {"wall_ms_per_step": round(wall / steps * 1e3, 4), "busy_ms_per_step": round(busy_us / steps / 1e3, 4),
            "kernels_per_step": round(sum(len(v) for v in kernels.values()) / steps, 1),
            "top": [{"name": n[:110], "calls_per_step": round(len(v) / steps, 2),
                     "us_per_step": round(sum(v) / steps, 2), "us_mean": round(sum(v) / len(v), 2)} for n, v in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1b", choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["fused", "hf_layers"],
                    help="fused, fused_torch_rope (rotary as torch ops), fused_sdpa (SDPA attention), hf_layers, "
                    "fused_eager (no CUDA graphs); torch.compile against our kernels: target_compile.py")
    ap.add_argument("--out", default="benchmarks/results/target-profile")
    args = ap.parse_args()
    model = build(args.size)
    wb = weight_bytes(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    report = []
    for b in args.batch:
        prompts = torch.randint(10, SIZES[args.size]["vocab_size"], (b, args.prompt_len), generator=g).tolist()
        for mode in args.modes:
            specdec.fused.TRITON_ROPE = mode != "fused_torch_rope"
            specdec.fused.TRITON_ATTENTION = mode != "fused_sdpa"
            llm = LLM(model, max_num_seqs=b, max_model_len=args.prompt_len + args.new + 8,
                      fused_forward=mode != "hf_layers", cuda_graphs=mode != "fused_eager")
            r = {"size": args.size, "batch": b, "mode": mode, "weight_gb": round(wb / 1e9, 3), **profile(llm, prompts,
                                                                                                        args.new)}
            report.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
            for k in r["top"][:18]:
                print(f"   {k['us_per_step']:8.1f} us/step {k['calls_per_step']:6.1f}x  {k['name']}")
            del llm
            torch.cuda.empty_cache()
    (out / f"profile-{args.size}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

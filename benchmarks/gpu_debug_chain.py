"""Find which part of the draft_model CUDA path hits an illegal memory access (a debugging aid).

Each configuration runs in its own process (a CUDA error poisons the context) with
CUDA_LAUNCH_BLOCKING=1, on random-init models of the bench pair's shapes (no training needed):

    python benchmarks/gpu_debug_chain.py            # every configuration, a summary table last
    python benchmarks/gpu_debug_chain.py --one NAME  # one configuration, in this process
    python benchmarks/gpu_debug_chain.py --configs fused-triton-rope --batch 1 --sanitizer --timeout 500
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

CONFIGS = {
    "fused": {},  # the default: Triton RMSNorm, SiLU, rotary + KV write and attention kernels
    "fused-torch-rope": {"_triton_rope": False},  # the rotary step as torch ops (the Triton one crashed once)
    "unfused": {"draft_fused": False},
    "fused-math-sdpa": {"_sdpa": "math"},
    "fused-no-graph-logits": {"_graph_logits": False},
}


def save(path: str, **dims) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(max_position_embeddings=1024, vocab_size=16384, **dims)).to(torch.bfloat16) \
        .save_pretrained(path)
    return path


def one(name: str, root: str, batch: int) -> None:
    import torch

    import specdec.cuda_graphs as cg
    import specdec.fused as fused
    from specdec import LLM, SamplingParams

    opts = dict(CONFIGS[name])
    if opts.pop("_sdpa", None) == "math":
        from torch.nn.attention import SDPBackend

        import specdec.head_layers as head_layers

        head_layers.SDPA_BACKENDS = [SDPBackend.MATH]
    fused.TRITON_ROPE = opts.pop("_triton_rope", True)
    if opts.pop("_graph_logits", True) is False:
        cg.GRAPH_LOGITS = False
    target, draft = os.path.join(root, "target"), os.path.join(root, "draft")
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 16384, (int(n),), generator=rng).tolist()
               for n in torch.randint(20, 300, (batch * 2,), generator=rng)]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    base = LLM(target, max_num_seqs=batch).generate(prompts, params)
    llm = LLM(target, {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, **opts},
              max_num_seqs=batch)
    out = llm.generate(prompts, params)
    torch.cuda.synchronize()
    agree = sum(a == b for o, p in zip(out, base) for a, b in zip(o.token_ids, p.token_ids)) / (48 * len(prompts))
    print(f"RESULT {name} batch {batch}: ok, chain steps {llm.proposer.chain_steps}, "
          f"fused {llm.proposer._chain is not None and llm.proposer._chain.fused is not None}, "
          f"agreement with baseline {agree:.3f}, prefill replays target {llm.target.graphs.prefill_replays} "
          f"draft {llm.proposer.draft.graphs.prefill_replays}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", default=None)
    ap.add_argument("--root", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                    help="configurations to run (default: all)")
    ap.add_argument("--sanitizer", action="store_true",
                    help="run each configuration under compute-sanitizer's memcheck: names the kernel and the "
                         "address of an illegal access (slow: use one configuration and --batch 1)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per configuration")
    args = ap.parse_args()
    if args.one:
        for b in args.batch:
            try:
                one(args.one, args.root, b)
            except Exception as exc:  # report and stop: the context is gone
                print(f"RESULT {args.one} batch {b}: FAILED {type(exc).__name__}: {str(exc)[:160]!r}", flush=True)
                traceback.print_exc()
                sys.exit(1)
        return
    root = tempfile.mkdtemp(prefix="specdec-debug-")
    save(os.path.join(root, "target"), hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
         num_attention_heads=12, num_key_value_heads=12)
    save(os.path.join(root, "draft"), hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
         num_attention_heads=8, num_key_value_heads=8)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    prefix = []
    if args.sanitizer:
        tool = shutil.which("compute-sanitizer") or next(
            (str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))), None)
        if tool is None:
            sys.exit("--sanitizer: compute-sanitizer is neither on PATH nor in /usr/local/cuda*/bin")
        prefix = [tool, "--tool", "memcheck", "--print-limit", "8"]
    results = []
    for name in args.configs:
        try:
            p = subprocess.run([*prefix, sys.executable, __file__, "--one", name, "--root", root, "--batch",
                                *map(str, args.batch)], env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as exc:
            results.append(f"RESULT {name}: timed out after {exc.timeout:.0f} s")
            continue
        lines = (p.stdout + p.stderr).splitlines()
        results += [line for line in lines if line.startswith("RESULT")] or [f"RESULT {name}: rc {p.returncode}"]
        keep = [line for line in lines if "Loading weights" not in line and not line.startswith("frame #")
                and ("File" in line or "Error" in line or "RESULT" in line or line.startswith("========="))]
        print(f"--- {name} (rc {p.returncode})\n" + "\n".join(keep[-25:]), flush=True)
    print("\n".join(results))


if __name__ == "__main__":
    main()

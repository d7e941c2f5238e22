"""Time per decoding step, split into propose / target forward / sample / bookkeeping, for the
baseline and a speculative method, eager vs CUDA graphs, at several batch sizes, in one run.

    python benchmarks/bench_step.py --device cuda --batch 1 32            # random-init ~88M Llama
    python benchmarks/bench_step.py --model PATH --method ngram -k 4      # a trained model
    python benchmarks/bench_step.py --model T --method ngram draft_model --draft-model D -k 3

The issue target: everything that is not the target forward <= 15% of the step at batch 1 with graphs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from specdec import LLM, SamplingParams


def random_llama(size: str) -> str:
    """Save a random-initialised Llama (``88m`` or ``tiny``) to a temporary directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = {"88m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                        num_key_value_heads=12, vocab_size=8192),
            "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512)}[size]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, **dims))
    path = tempfile.mkdtemp(prefix=f"specdec-llama-{size}-")
    model.save_pretrained(path)
    return path


def run(model: str, config: dict | None, batch: int, graphs: bool, args, prompts) -> dict:
    llm = LLM(model, config, dtype=args.dtype, device=args.device, max_num_seqs=batch, cuda_graphs=graphs,
              profile_steps=True, max_model_len=args.max_model_len)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:batch], params)  # warm-up
    llm.step_timer.reset()
    start = time.perf_counter()
    outs = llm.generate(prompts[:batch], params)
    wall = time.perf_counter() - start
    hot = host_profile(llm, prompts[:batch], params, args.profile) if args.profile and graphs else None
    ms = llm.step_timer.per_step_ms()
    step = sum(ms.values())
    return {"batch": batch, "graphs": graphs, "method": config["method"] if config else "baseline",
            "k": config["num_speculative_tokens"] if config else 0, "step_ms": step,
            **{f"{k}_ms": v for k, v in ms.items()},
            "non_forward_share": 1 - ms["forward"] / step if step else 0.0,
            "tok_s": sum(len(o.token_ids) for o in outs) / wall,
            "mean_acceptance_length": llm.stats.mean_acceptance_length, "host_profile": hot}


def host_profile(llm, prompts, params, top: int) -> list[str]:
    """The ``top`` functions by own time (microseconds per decode step) in one more pass under cProfile:
    where the host time around the forward goes."""
    import cProfile
    import pstats

    llm.step_timer.reset()
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(prompts, params)
    prof.disable()
    steps = max(llm.step_timer.steps, 1)
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return [f"{1e6 * tt / steps:8.1f} us/step {nc / steps:6.1f} calls/step  {Path(fn).name}:{line}({name})"
            for (fn, line, name), (_, nc, tt, _, _) in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="local model dir; default: a random-init Llama (--size)")
    ap.add_argument("--size", default="88m", choices=["88m", "tiny"])
    ap.add_argument("--method", default="copycat", nargs="+", help="one or more methods, each against the baseline")
    ap.add_argument("--draft-model", default=None, help="the draft for --method draft_model")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--graphs-only", action="store_true", help="skip the eager runs on CUDA")
    ap.add_argument("--profile", type=int, default=0, help="also list the N hottest host functions (graph runs)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "step.json"))
    args = ap.parse_args()
    model = args.model or random_llama(args.size)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    rng = random.Random(0)
    # Repetitive prompts so prompt-lookup drafters have something to find.
    prompts = [[rng.randrange(2, vocab) for _ in range(16)] * (args.prompt_len // 16) for _ in range(max(args.batch))]
    modes = ([True] if args.graphs_only else [False, True]) if args.device.startswith("cuda") else [False]
    rows = []
    for batch in args.batch:
        for graphs in modes:
            configs = [{"method": m, "num_speculative_tokens": args.k,
                        **({"model": args.draft_model} if m == "draft_model" and args.draft_model else {})}
                       for m in args.method]
            for config in [None, *configs]:
                rows.append(run(model, config, batch, graphs, args, prompts))
                print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{name}; model {model}; dtype {args.dtype}; {args.max_tokens} new tokens; prompt {args.prompt_len}")
    print("| batch | graphs | method | k | step ms | propose | forward | sample | bookkeeping | non-forward | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['graphs']} | {r['method']} | {r['k']} | {r['step_ms']:.2f} | "
              f"{r['propose_ms']:.2f} | {r['forward_ms']:.2f} | {r['sample_ms']:.2f} | {r['bookkeeping_ms']:.2f} | "
              f"{r['non_forward_share']:.0%} | {r['tok_s']:.0f} |")
    for r in rows:
        if r.get("host_profile"):
            print(f"\nhost profile, batch {r['batch']}, {r['method']} (own time per decode step):")
            print("\n".join(r["host_profile"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": name, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""Baseline vs a speculative method, side by side in one process: tokens/s, speedup, acceptance.

Prompts are the openings of standard-library files (deterministic choice). Greedy outputs are
checked to be identical before any speedup is reported.

    python benchmarks/bench_core.py --method copycat -k 4 --batch 1 4
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import torch

from specdec import LLM, SamplingParams, bundled_model


def stdlib_prompts(n: int, chars: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4 * chars)
    step = max(1, len(files) // n)
    prompts = []
    for path in files[::step][:n]:
        text = path.read_text(encoding="utf-8", errors="replace")
        cut = text.rfind("\n", 0, chars)
        prompts.append(text[: cut + 1 if cut > 0 else chars])
    return prompts


def timed(llm: LLM, prompts: list[str], params: SamplingParams) -> tuple[list, float]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return outs, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="local model dir (default: bundled tiny)")
    ap.add_argument("--method", default="copycat")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-chars", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/core.json")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: fastest for tiny models)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or bundled_model("tiny")
    prompts = stdlib_prompts(args.prompts, args.prompt_chars)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rows = []
    for batch in args.batch:
        base = LLM(model, dtype="float32", max_num_seqs=batch)
        spec = LLM(model, {"method": args.method, "num_speculative_tokens": args.k}, dtype="float32",
                   max_num_seqs=batch)
        base.generate(prompts[:batch], params)  # warm-up
        spec.generate(prompts[:batch], params)
        tb = ts = 0.0
        for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
            bo, t = timed(base, prompts, params)
            tb += t
            so, t = timed(spec, prompts, params)
            ts += t
        if [o.token_ids for o in bo] != [o.token_ids for o in so]:
            raise SystemExit("greedy outputs differ from the baseline: refusing to report a speedup")
        ntok = sum(len(o.token_ids) for o in bo) * args.repeats
        stats = spec.stats
        rows.append({"batch": batch, "method": args.method, "k": args.k, "baseline_tok_s": ntok / tb,
                     "spec_tok_s": ntok / ts, "speedup": tb / ts,
                     "mean_acceptance_length": stats.mean_acceptance_length,
                     "acceptance_rate_per_pos": stats.acceptance_rate_per_pos})
    print(f"model: {model}; {len(prompts)} stdlib prompts, {args.max_tokens} new tokens, greedy, float32, "
          f"torch threads {torch.get_num_threads()}")
    print("| batch | method | k | baseline tok/s | spec tok/s | speedup | mean acceptance length |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['method']} | {r['k']} | {r['baseline_tok_s']:.1f} | {r['spec_tok_s']:.1f} | "
              f"{r['speedup']:.2f}x | {r['mean_acceptance_length']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"model": model, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

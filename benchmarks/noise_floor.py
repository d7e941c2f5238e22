"""How far two identical engines' timed passes differ on this machine: the noise any per-row speedup carries.

Two baseline engines (same model, no drafts) run the same e2e workload in alternating timed passes (the order rotating
each round, the garbage collector off while timing, as ``e2e.py`` times); the ratio of their pass times would be 1.0
on a quiet machine. Prints each round's ratio and the standard deviation of its logarithm: a row of ``e2e.py`` with
n timed passes reads its speedup to about that sd over the square root of n.

    python benchmarks/noise_floor.py                       # CPU: bundled tiny, batch 1, completion, six rounds
    python benchmarks/noise_floor.py --device cuda --model /tmp/bm/bench --batch 8
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from specdec import LLM, SamplingParams, bundled_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="target folder (default: the bundled tiny model)")
    ap.add_argument("--workload", default="completion", choices=["completion", "edit", "repeated"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from specdec_tools.bench import build_workloads
    from specdec_tools.bench.passes import gc_off

    model = args.model or bundled_model("tiny")
    calls = build_workloads(AutoTokenizer.from_pretrained(model), [args.workload], args.prompts, args.batch,
                            256)[0].calls
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engines = [LLM(model, device=args.device, max_num_seqs=args.batch) for _ in range(2)]

    def run(llm: LLM) -> float:
        with gc_off():
            t = time.perf_counter()
            for call in calls:
                llm.generate(call, [params] * len(call))
            return time.perf_counter() - t

    for llm in engines:  # untimed: every shape seen once
        run(llm)
    ratios = []
    for r in range(args.rounds):
        t = {}
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):  # the order alternating each round
            t[i] = run(engines[i])
        ratios.append(t[0] / t[1])
    logs = [math.log(x) for x in ratios]
    sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    print(f"{args.device}, batch {args.batch}, {args.workload}: two identical engines, per-round ratio "
          + ", ".join(f"{x:.3f}" for x in ratios)
          + f"; sd of its log {sd:.3f} (a row of n passes: ~{sd:.3f} / sqrt(n))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

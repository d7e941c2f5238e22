"""What keyed sampling (specdec.keyed, issue 24) costs in acceptance, against the ``min(1, p/q)`` rule.

Seeded requests accept a draft iff it equals the target's keyed sample. A one-hot drafter (ngram, suffix) loses
nothing: its draft ``x`` is accepted with probability ``p(x)`` under either rule. A probabilistic drafter that
draws with the same keyed noise (coupled drafting) is accepted when the races over ``q`` and ``p`` pick the
same token; the ``min(1, p/q)`` rule accepts with probability ``1 - TV(p, q)``, the best any coupling can do.

1. Synthetic pairs ``(p, q)`` at several distances: the coupled acceptance (Monte Carlo over keys) beside
   ``1 - TV``.
2. End to end on the CPU, bundled ``tiny`` target, ``draft_model`` (bundled ``tiny-draft``) and ``eagle3``
   (bundled head) at temperature 0.8: acceptance per draft and throughput of seeded requests (keyed) against the
   same requests unseeded (``min(1, p/q)``), one run.

    python benchmarks/bench_keyed.py [--samples 20000] [--prompts 8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.keyed import keyed_sample, seed_halves


def synthetic(samples: int, vocab: int = 64) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(vocab, generator=gen) * 2.0
    p = torch.softmax(logits, -1)
    seeds = torch.tensor([seed_halves(s) for s in range(samples)])
    pos = torch.full((samples,), 7)
    xp = keyed_sample(p.expand(samples, vocab), seeds, pos)
    print("| q = softmax(log p + eps * z) | 1 - TV(p, q) (min(1, p/q) rule) | coupled keyed acceptance | ratio |")
    print("| --- | --- | --- | --- |")
    for eps in (0.1, 0.3, 0.6, 1.0, 2.0):
        q = torch.softmax(logits + eps * torch.randn(vocab, generator=gen), -1)
        rule = 1 - 0.5 * (p - q).abs().sum().item()
        coupled = (keyed_sample(q.expand(samples, vocab), seeds, pos) == xp).double().mean().item()
        print(f"| eps {eps} | {rule:.3f} | {coupled:.3f} | {coupled / rule:.3f} |")


def end_to_end(prompts: int, max_tokens: int) -> None:
    import inspect
    import json

    import specdec
    from specdec import LLM, SamplingParams

    tiny = specdec.bundled_model("tiny")
    source = inspect.getsource(json.decoder)
    texts = [source[i * 400: i * 400 + 300] for i in range(prompts)]
    print("\n| method | requests | accepted / drafted | tok/s |")
    print("| --- | --- | --- | --- |")
    for method in ("draft_model", "eagle3"):
        llm = LLM(tiny, {"method": method, "num_speculative_tokens": 3}, dtype="float32", device="cpu",
                  max_num_seqs=prompts)
        for label, seed in (("unseeded (min(1, p/q))", None), ("seeded (keyed, coupled)", 1)):
            params = [SamplingParams(temperature=0.8, max_tokens=max_tokens, ignore_eos=True,
                                     seed=None if seed is None else seed + i) for i in range(prompts)]
            llm.generate(texts, params)  # warm-up
            before = (llm.stats.num_accepted_tokens, llm.stats.num_draft_tokens)
            t0 = time.perf_counter()
            out = llm.generate(texts, params)
            sec = time.perf_counter() - t0
            acc = llm.stats.num_accepted_tokens - before[0]
            drafted = llm.stats.num_draft_tokens - before[1]
            toks = sum(len(o.token_ids) for o in out)
            print(f"| {method} | {label} | {acc / max(drafted, 1):.3f} | {toks / sec:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    synthetic(args.samples)
    end_to_end(args.prompts, args.max_tokens)


if __name__ == "__main__":
    main()

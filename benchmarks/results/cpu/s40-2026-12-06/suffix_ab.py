"""s40: suffix@auto with own trees built at the first draft (the library) against the same engine with them built
eagerly (s39's behaviour: the prompt's tree at add_request, observe extending it), in interleaved passes of e2e's
prompts beside the baseline, one process (the drafts are the same; only where the trees' cost falls differs).

    python benchmarks/results/cpu/s40-2026-12-06/suffix_ab.py --temperature 0.8 --repeats 5
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from transformers import AutoTokenizer

from specdec import LLM, bundled_model
from specdec_tools.bench import build_workloads
from specdec_tools.bench.passes import run_pass


def eager(llm: LLM) -> None:
    """``llm``'s suffix proposer (and each fresh one a pass makes) building own trees as s39 did."""
    p = llm.proposer
    add, ingest = p.add_request, p._ingest

    def add_request(req_id, prompt_token_ids):
        add(req_id, prompt_token_ids)
        prompt = np.ascontiguousarray(prompt_token_ids, dtype=np.int32)
        p._native.extend(p._native.local[req_id], 0, prompt)
        p._own[req_id] = len(prompt)

    p.add_request = add_request
    p._ingest = lambda batch, token_ids, i, own: ingest(batch, token_ids, i, True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--workloads", nargs="+", default=["completion", "edit"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = bundled_model("tiny")
    wls = build_workloads(AutoTokenizer.from_pretrained(model), args.workloads, args.prompts, 8, 256)
    spec = {"method": "suffix", "num_speculative_tokens": 4}
    for wl in wls:
        engines = {"baseline": LLM(model, max_num_seqs=8), "lazy": LLM(model, spec, max_num_seqs=8),
                   "eager": LLM(model, spec, max_num_seqs=8)}
        for llm in engines.values():
            run_pass(llm, wl, args.temperature, 16, 0)  # warm-up
        seconds = {n: [] for n in engines}
        for r in range(args.repeats):
            names = list(engines)
            for name in names[r % 3:] + names[: r % 3]:
                llm = engines[name]
                if name == "eager":  # run_pass makes a fresh proposer: patch it after, before the requests
                    import specdec_tools.bench.passes as passes
                    fresh = passes.fresh_proposer
                    passes.fresh_proposer = lambda e, _f=fresh: (_f(e), eager(e))
                    try:
                        seconds[name].append(run_pass(llm, wl, args.temperature, args.max_tokens, 0)[1])
                    finally:
                        passes.fresh_proposer = fresh
                else:
                    seconds[name].append(run_pass(llm, wl, args.temperature, args.max_tokens, 0)[1])
        base = sum(seconds["baseline"])
        for name in ("lazy", "eager"):
            ps = engines[name].policy.stats
            print(f"{wl.name} T={args.temperature}: suffix@auto {name:5s} {base / sum(seconds[name]):.3f}x "
                  f"(passes {' '.join(f'{b / s:.2f}' for b, s in zip(seconds['baseline'], seconds[name]))}; "
                  f"drafted {ps.drafted_step_share:.0%})", flush=True)


if __name__ == "__main__":
    main()

"""The pooled lag-1 correlation of a request's accepted drafts (about its own mean) under fixed k, over e2e's calls of
one workload (bundled tiny pair, batch 8, 16 prompts, 96 tokens), from ``benchmarks/``:
``PYTHONPATH=. python results/cpu/s37-2026-12-06/rho.py suffix 4 completion 0`` (s37: lookup methods 0.56-0.73,
heads and draft models about 0)."""

import argparse
import sys
from collections import defaultdict

import torch
from policy_steps import first_call
from transformers import AutoTokenizer

from specdec import LLM, SamplingParams
from specdec_tools.bench import build_workloads
from specdec_tools.bench.passes import fresh_proposer

torch.set_num_threads(1)
method, k, wl, temp = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
args = argparse.Namespace(model=None, workload=wl, temperature=temp, prompts=16, batch=8, max_tokens=96, threads=1,
                          device="cpu")
model, _, _ = first_call(args)
calls = [(call, [SamplingParams(temperature=temp, max_tokens=96, ignore_eos=True, seed=i if temp else None)
                 for i in range(len(call))])
         for call in build_workloads(AutoTokenizer.from_pretrained(model), [wl], 16, 8, 256)[0].calls]
llm = LLM(model, {"method": method, "num_speculative_tokens": k, "speculation_policy": "fixed"}, device="cpu",
          max_num_seqs=8)
seq = defaultdict(list)
orig = llm._commit


def commit(reqs, drafts, sampled, out, carry=False):
    for r, s in zip(reqs, sampled):
        seq[r.req_id].append(len(s) - 1)
    return orig(reqs, drafts, sampled, out, carry=carry)


llm._commit = commit
fresh_proposer(llm)
for c, p in calls:
    llm.generate(c, p)
cov = var = pairs = n = 0.0
for xs in seq.values():
    if len(xs) < 3:
        continue
    m = sum(xs) / len(xs)
    var += sum((x - m) ** 2 for x in xs)
    n += len(xs)
    cov += sum((a - m) * (b - m) for a, b in zip(xs, xs[1:]))
    pairs += len(xs) - 1
print(method, wl, temp, "requests", len(seq), "rho", round((cov / pairs) / (var / n), 3),
      "mean", round(sum(map(sum, seq.values())) / n, 2))

"""The library's end rule logged at each decision (bucket, drafts?, tokens left, end_gains, the band's gains, each
request's own mean and weighted steps, plain and drafting step ms) over e2e's calls of one workload, suffix:4, the
bundled tiny pair at batch 8, from ``benchmarks/``: ``PYTHONPATH=. python results/cpu/s37-2026-12-06/dbg_end.py
completion``."""

import argparse
import sys

import torch
from end_rule import one_wave_before
from policy_steps import first_call
from transformers import AutoTokenizer

from specdec import LLM, SamplingParams
from specdec.policy import END_SHARE, SpeculationPolicy
from specdec_tools.bench import build_workloads
from specdec_tools.bench.passes import fresh_proposer

torch.set_num_threads(1)
LOG = []


class Logged(SpeculationPolicy):
    def pays_at_end(self, b, req_ids, remaining):
        ok = super().pays_at_end(b, req_ids, remaining)
        if len(remaining) >= 2 and b.ready():
            most = max(remaining)
            g = self.end_gains(req_ids)
            band = [round(x, 2) for x, n in zip(g, remaining) if n >= END_SHARE * most]
            own = [(round(self._end[r][1] / self._end[r][0], 2), round(self._end[r][0], 1)) if r in self._end
                   else None for r in req_ids]
            LOG.append((b.size, ok, list(remaining), [round(x, 2) for x in g], band, own,
                        round(b.seconds[0] * 1e3, 2), round(b.spent(1) * 1e3, 2)))
        return ok


wl = sys.argv[1] if len(sys.argv) > 1 else "completion"
args = argparse.Namespace(model=None, workload=wl, temperature=0.0, prompts=16, batch=8, max_tokens=96, threads=1,
                          device="cpu")
model, _, _ = first_call(args)
calls = [(call, [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in call])
         for call in build_workloads(AutoTokenizer.from_pretrained(model), [wl], 16, 8, 256)[0].calls]
spec = {"method": "suffix", "num_speculative_tokens": 4}
llm = one_wave_before(LLM(model, spec, device="cpu", max_num_seqs=8), Logged)
fresh_proposer(llm)
for c, p in calls:
    llm.generate(c, p)
LOG.clear()
fresh_proposer(llm)
print("calls", [len(c) for c, _ in calls])
for c, p in calls:
    llm.generate(c, p)
for e in LOG:
    print(e)

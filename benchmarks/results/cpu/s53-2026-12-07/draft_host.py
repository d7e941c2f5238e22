"""s53: host time of a decode step, fixed k against auto (both drafting nearly every step), ngram:4 on the bundled
tiny model, e2e's completion prompts, T = 0: one warm-up pass, then one pass each with gpu_step_trace's host timers
(plain_overhead.host_report). On the H100 (call 3) auto's decode steps took 0.79 ms against fixed's 0.51 at batch 32.

    python benchmarks/results/cpu/s53-2026-12-07/draft_host.py --batch 32 --prompts 64
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from plain_overhead import host_report, timed  # noqa: E402

from specdec import LLM, SamplingParams, bundled_model  # noqa: E402
from specdec_tools.bench import build_workloads  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--prompts", type=int, default=64)
ap.add_argument("--method", default="ngram:4")
ap.add_argument("--workload", default="completion")
ap.add_argument("--device", default="cpu")
ap.add_argument("--always", action="store_true", help="auto's bucket rule always picks drafting (the per-request "
                "filter, MIN_GAIN, and the end rule still apply): its drafting steps against fixed k's")
ap.add_argument("--step-graphs", action="store_true", help="CPU: the step graphs' path, uncaptured (as a GPU's)")
args = ap.parse_args()
torch.set_num_threads(1)
if args.always:
    from specdec.policy import SpeculationPolicy

    def _always(b):
        b.exploring = False
        b.decided, b.winner = True, 1
        return True

    SpeculationPolicy._decide = staticmethod(_always)
name, k = args.method.split(":")
kw = dict(device=args.device, max_num_seqs=args.batch)
model = bundled_model("tiny")
engines = {p: LLM(model, {"method": name, "num_speculative_tokens": int(k), "speculation_policy": p}, **kw)
           for p in ("fixed", "auto")}
calls = build_workloads(engines["fixed"].tokenizer, [args.workload], args.prompts, args.batch, 256)[0].calls
params = [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in range(sum(len(c) for c in calls))]
for llm in engines.values():
    if args.step_graphs:
        k = llm.num_speculative_tokens
        llm.target.capture_graphs(sorted({1, k + 1}), hidden=llm._hidden_request, use_graphs=False)
    timed(llm, calls, params)
print(host_report(engines, calls, params))
print({n: e.policy.stats.as_dict() if e.policy else None for n, e in engines.items()})

"""The auto policy's end rule, two ways side by side in one process: counted from when nobody waits to join (the rule
before 2026-12-05: the request with the most tokens left, at its current expected gain) against counted from one
wave before the end (``LLM._end_chains``: each slot's chain of its request's tokens left and the waiting requests'
that will take the slot, at each request's long-run gain), both against the baseline, over ``e2e.py``'s workloads.

A fixed batch of equal-length requests in two waves (16 prompts at batch 8) is where the two differ: drafting in the
first wave sets its requests apart, and the second wave's last request joins no earlier than the first wave's
slowest ends.

    python benchmarks/end_rule.py --batch 8 --method draft_model:3 --temperature 0 --repeats 10
    python benchmarks/end_rule.py --batch 8 --method ngram:4 --temperature 0 0.8 --workload completion edit repeated

Each pass times the three engines one after another with Python's garbage collector off; a row is the geometric
mean over passes of the baseline's time over the engine's, and the share of its decode steps that drafted.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time

import torch
from policy_steps import first_call

from specdec import LLM
from specdec.policy import SpeculationPolicy
from specdec_tools.bench.passes import gc_off


class WhenNobodyWaits(SpeculationPolicy):
    """The end rule before 2026-12-05: only once nobody waits, the least current expected gain among the requests
    within 0.9 of the most tokens left pays for the step (and the switch into drafting over those tokens)."""

    def pays_at_end(self, b, req_ids, remaining, queued=None) -> bool:
        if not b.ready():
            return True
        if len(remaining) < 2:
            if self._last_mode != 0 or not remaining:
                return True
            r0, r1 = b.rate(0), b.rate(1)
            return r1 <= r0 or remaining[0] * b.size * (1.0 / r0 - 1.0 / r1) >= b.switch[1]
        most = max(remaining)
        e = min(self._gain(r) for r, n in zip(req_ids, remaining) if n >= 0.9 * most)
        switch = b.switch[1] * (1.0 + e) / max(most, 1) if self._last_mode == 0 else 0.0
        return (1.0 + e) * b.seconds[0] >= b.spent(1) + switch


def when_nobody_waits(llm: LLM) -> LLM:
    """``llm`` with the end rule before 2026-12-05: tokens left given only when nobody waits, and its rule."""
    def chains(reqs, _llm=llm):
        return (None, None) if len(_llm._calls) else ([_llm._tokens_left(r) for r in reqs], None)

    llm._end_chains = chains
    llm.policy = WhenNobodyWaits(llm.num_speculative_tokens)
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="target folder (default: the bundled tiny model)")
    ap.add_argument("--method", default="draft_model:3", help="NAME:K")
    ap.add_argument("--workload", nargs="+", default=["completion", "edit", "repeated"],
                    choices=["completion", "edit", "repeated"])
    ap.add_argument("--temperature", nargs="+", type=float, default=[0.0, 0.8])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name, k = args.method.split(":")
    spec = {"method": name, "num_speculative_tokens": int(k)}
    print(f"{args.method}, batch {args.batch}, {args.prompts} prompts, {args.max_tokens} tokens, {args.repeats} passes")
    print("| workload | T | nobody waits | one wave before | drafted (nobody waits / one wave before) |")
    print("| --- | --- | --- | --- | --- |")
    for workload in args.workload:
        for temperature in args.temperature:
            run = argparse.Namespace(**{**vars(args), "workload": workload, "temperature": temperature})
            model, prompts, params = first_call(run)
            common = dict(device=args.device, max_num_seqs=args.batch)
            engines = {"baseline": LLM(model, **common), "waits": when_nobody_waits(LLM(model, spec, **common)),
                       "wave": LLM(model, spec, **common)}
            for llm in engines.values():
                llm.generate(prompts, params)  # warm-up: the policy's buckets too
            drafted0 = {key: (llm.policy.stats.steps_drafted, llm.policy.stats.steps_plain)
                        for key, llm in engines.items() if llm.policy is not None}
            times = {key: [] for key in engines}
            for _ in range(args.repeats):
                for key, llm in engines.items():
                    with gc_off():
                        start = time.perf_counter()
                        llm.generate(prompts, params)
                        times[key].append(time.perf_counter() - start)
            ratio, share = {}, {}
            for key in ("waits", "wave"):
                ratio[key] = math.exp(statistics.mean(math.log(b / t) for b, t in zip(times["baseline"], times[key])))
                stats = engines[key].policy.stats
                d, p = stats.steps_drafted - drafted0[key][0], stats.steps_plain - drafted0[key][1]
                share[key] = d / max(d + p, 1)
            print(f"| {workload} | {temperature:g} | {ratio['waits']:.3f}x | {ratio['wave']:.3f}x | "
                  f"{share['waits']:.0%} / {share['wave']:.0%} |", flush=True)
            del engines
            gc.collect()


if __name__ == "__main__":
    main()

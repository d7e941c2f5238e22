"""The auto policy's end rule, two ways side by side in one process: the library's (counted from when nobody waits
to join: the request with the most tokens left, at its current expected gain) against an experiment counted from one
wave before the end (each slot's chain of its request's tokens left and the waiting requests' that will take the
slot, at each request's long-run gain: :class:`OneWaveBefore`), both against the baseline, over ``e2e.py``'s
workloads.

A fixed batch of equal-length requests in two waves (16 prompts at batch 8) is where the two differ: drafting in the
first wave sets its requests apart, and the second wave's last request joins no earlier than the first wave's
slowest ends. The experiment helped draft_model on the CPU (completion, T = 0: 0.93x -> 1.00x) and kept ngram plain
on the H200 where drafting paid (1.06-1.13x -> 0.97-0.99x): it was in the library for part of 2026-12-05 and is kept
here, not there.

    python benchmarks/end_rule.py --batch 8 --method draft_model:3 --temperature 0 --repeats 10
    python benchmarks/end_rule.py --batch 8 --method ngram:4 --temperature 0 0.8 --workload completion edit repeated

Each pass times the three engines one after another with Python's garbage collector off; a row is the geometric
mean over passes of the baseline's time over the engine's, and the share of its decode steps that drafted.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import statistics
import time

import torch
from policy_steps import NoEndRule, first_call
from transformers import AutoTokenizer

from specdec import LLM, SamplingParams
from specdec.policy import END_SHARE, LONG_RUN, SpeculationPolicy
from specdec_tools.bench import build_workloads
from specdec_tools.bench.passes import fresh_proposer, gc_off


class OneWaveBefore(SpeculationPolicy):
    """The experiment: once no more requests wait than run, drafting must end the longest chain of tokens on one slot
    sooner (a running request's tokens left, plus those of the waiting requests that will take its slot, each
    behind the slot that frees first at a token a step), each chain's own tokens at its request's long-run gain
    (:meth:`lasting_gain`), its queued ones at a new request's, at the bucket's drafting step time, against every
    chain at a token a plain step. :func:`one_wave_before` hands it the engine's running and waiting requests."""

    llm: LLM | None = None
    reqs: list | tuple = ()
    _now: tuple = (None, None)

    def _work(self) -> tuple[list[int], list[int]] | None:
        """The running requests' tokens left and the waiting ones', oldest first; None while more wait than run."""
        llm = self.llm
        waiting = list(llm._calls._waiting)
        if len(waiting) > len(self.reqs):
            return None
        return [llm._tokens_left(r) for r in self.reqs], [llm._tokens_left(w) for w in waiting]

    def _chains(self) -> tuple[list[int] | None, list[int] | None]:
        work = self._work()
        if work is None:
            return None, None
        left, waiting = work
        if not waiting:
            return left, None
        queued = [0] * len(left)
        heap = sorted((n, i) for i, n in enumerate(left))
        for tokens in waiting:
            n, i = heap[0]
            queued[i] += tokens
            heapq.heapreplace(heap, (n + tokens, i))
        return left, queued

    def plan(self, req_ids, sampled=False, remaining=None):
        self._now = self._chains()
        return super().plan(req_ids, sampled, self._now[0])

    def would_draft(self, req_ids, sampled=False, remaining=None):
        return super().would_draft(req_ids, sampled, self._now[0])

    def lasting_gain(self, req_id: str | None, sampled: bool = False) -> float:
        """A request's acceptance given drafts (a new request's: the method-wide one) times the method-wide long-run
        chance that asking gets drafts (the stationary state of the two-state chain of ``_found_chance``)."""
        if req_id is None:
            kind, acc = sampled, self._global[sampled]
        else:
            self._gain(req_id)  # applies its pending drift
            kind = self._kind(req_id)
            acc = self._acc.get(req_id, self._global[kind])
        gain, p = 0.0, 1.0
        for a in acc:
            p *= a
            gain += p
        return self._found_chance(None, kind) * gain  # no last ask: the chain's stationary chance

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        if not b.ready():
            return True
        queued = self._now[1] or [0] * len(remaining)
        if len(remaining) < 2 and not any(queued):
            return super().pays_at_end(b, req_ids, remaining)
        new = 1.0 + self.lasting_gain(None, self._plan_sampled) if any(queued) else 1.0
        plain = max(n + q for n, q in zip(remaining, queued))
        spec = max(n / (1.0 + self.lasting_gain(r)) + q / new for r, n, q in zip(req_ids, remaining, queued))
        switch = b.switch[1] if self._last_mode == 0 else 0.0
        return spec * b.spent(1) + switch <= plain * b.seconds[0]


class ScheduledEnd(OneWaveBefore):
    """The experiment's next form (not yet measured on the H200): each mode's end of the work by list scheduling, the
    waiting requests taking the slot that frees first *in that mode* (drafting, a fast request's slot takes them;
    :class:`OneWaveBefore` queues them by plain progress, behind the weakest request's slot as often as not, and on
    the H200 that kept ngram plain where drafting paid): plain, each request's tokens left and then each waiting
    one's at a token a step; drafting, at ``1 + e`` a step (the request's long-run gain; a new request's for the
    waiting ones) and the bucket's drafting step time, plus the switch after plain steps."""

    def _chains(self) -> tuple[list[int] | None, list[int] | None]:
        return self._work() or (None, None)

    @staticmethod
    def _makespan(own: list[float], waiting: list[float]) -> float:
        heap = sorted(own)
        for w in waiting:
            heapq.heapreplace(heap, heap[0] + w)
        return max(heap)

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        if not b.ready():
            return True
        waiting = self._now[1] or []
        if len(remaining) < 2 and not waiting:
            return SpeculationPolicy.pays_at_end(self, b, req_ids, remaining)
        new = 1.0 + self.lasting_gain(None, self._plan_sampled)
        plain = self._makespan([float(n) for n in remaining], [float(w) for w in waiting])
        spec = self._makespan([n / (1.0 + self.lasting_gain(r)) for r, n in zip(req_ids, remaining)],
                              [w / new for w in waiting])
        switch = b.switch[1] if self._last_mode == 0 else 0.0
        return spec * b.spent(1) + switch <= plain * b.seconds[0]


class BandMeanEnd(SpeculationPolicy):
    """An experiment on the library's own moment (nobody waits): the gain that must pay is the mean of the expected
    gains of the requests within ``END_SHARE`` of the most tokens left, not their least. On the H100 (s34) ngram at
    batch 8, T = 0, on calls of 8 equal-length repeated prompts kept 2391 of its steps plain by the end rule and ran
    0.90x where fixed k ran 1.13x: the least of eight noisy per-request estimates (exponential averages at weight
    ``ALPHA``) sits well under what the slowest request gains, so near the rule's threshold it says plain."""

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        if not b.ready() or len(remaining) < 2:
            return super().pays_at_end(b, req_ids, remaining)
        most = max(remaining)
        band = [self._gain(r) for r, n in zip(req_ids, remaining) if n >= END_SHARE * most]
        e = sum(band) / len(band)
        switch = b.switch[1] * (1.0 + e) / max(most, 1) if self._last_mode == 0 else 0.0
        return (1.0 + e) * b.seconds[0] >= b.spent(1) + switch


class LeastEnd(SpeculationPolicy):
    """The library's end rule before s36, to measure the new one against: the gain that must pay is the least of the
    fast per-request estimates (:meth:`SpeculationPolicy._gain`) within ``END_SHARE`` of the most tokens left, and a
    switch into drafting is owed whenever the last step was plain (fresh requests included). In the closed-loop
    simulation (``policy_calls_sim.py``) it took 1.03x the time of plain decoding where fixed k took 0.89x."""

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        long_run = self._last_mode == 0 and self._plain_steps >= LONG_RUN
        if not b.ready() and not (long_run and b.seeded):
            return True
        if len(remaining) < 2:
            if self._last_mode != 0 or not remaining:
                return True
            r0, r1 = b.rate(0), b.rate(1)
            return r1 <= r0 or remaining[0] * b.size * (1.0 / r0 - 1.0 / r1) >= self._switch_cost(b)
        most = max(remaining)
        e = min(self._gain(r) for r, n in zip(req_ids, remaining) if n >= END_SHARE * most)
        switch = self._switch_cost(b) * (1.0 + e) / max(most, 1) if self._last_mode == 0 else 0.0
        return (1.0 + e) * b.seconds[0] >= b.spent(1) + switch


class IndependentEnd(SpeculationPolicy):
    """The library's end rule as s36 left it, to measure s37's against: each request's drafting steps count as
    independent in :meth:`SpeculationPolicy.end_gains` (no correlation between consecutive steps' accepted drafts).
    On the CPU (tiny pair, suffix:4, e2e's completion prompts) five steps without a match early in one response kept it
    apart at ~0.6 drafts a step and the batch plain for its last ~45 steps."""

    def end_gains(self, req_ids: list[str]) -> list[float]:
        lags, self._lag = self._lag, {}
        try:
            return super().end_gains(req_ids)
        finally:
            self._lag = lags


class RowsEnd(SpeculationPolicy):
    """An experiment on the library's moment (nobody waits), for step costs that fall with the rows still running (a
    CPU step): drafting now pays if some schedule "draft for the next m steps, then plain to the end" ends the batch
    sooner than plain throughout, each step costed at its batch size's bucket (a bucket with no timing of that mode:
    the current one's), each request progressing ``1 + e`` a drafting step (:meth:`SpeculationPolicy.end_gains`),
    m tried at every request's end under drafting. The library's rule compares drafting to the end with plain to
    the end at the current bucket's costs: on the CPU a call of near-duplicates whose weak requests set the end
    stayed plain throughout, where drafting while the strong ones ran would have emptied the batch sooner. Measured
    once (s36, CPU, tiny pair, suffix:4, e2e's repeated calls, ``--all-calls``): 1.179x against the library's 1.176x
    (drafting on 50% / 35% of the steps), where the rule before s36 ran 1.22-1.24x: not the explanation."""

    def _step(self, rows: int, mode: int, b) -> float:
        t = self._tables(self._plan_sampled)[0].get(self.bucket(rows))
        if t is not None and t.count[mode]:
            return t.spent(1) if mode else t.seconds[0]
        return b.spent(1) if mode else b.seconds[0]

    def _plain_end(self, left: list[float], b) -> float:
        total, done = 0.0, 0.0
        ends = sorted(left)
        for i, n in enumerate(ends):  # between consecutive ends, len(ends) - i rows run
            if n > done:
                total += (n - done) * self._step(len(ends) - i, 0, b)
                done = n
        return total

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        if not b.ready() or len(remaining) < 2:
            return super().pays_at_end(b, req_ids, remaining)
        gains = self.end_gains(req_ids)
        owes = self._last_mode == 0 and bool(self._behind)
        left = [float(n) for n in remaining]
        plain = self._plain_end(left, b)
        switch = self._switch_cost(b) if owes else 0.0
        rates = [1.0 + g for g in gains]
        for m in sorted({n / r for n, r in zip(left, rates)}):
            total, done, rest = 0.0, 0.0, []
            for f, n, r in sorted((n / r, n, r) for n, r in zip(left, rates)):
                if f <= m:
                    rows = sum(1 for x, r2 in zip(left, rates) if x / r2 > done)
                    total += (f - done) * self._step(rows, 1, b)
                    done = f
                else:
                    rest.append(n - m * r)
            if rest:
                total += (m - done) * self._step(len(rest), 1, b) + self._plain_end(rest, b)
            if total + switch < plain:
                return True
        return False


def one_wave_before(llm: LLM, rule: type[SpeculationPolicy] = OneWaveBefore) -> LLM:
    """``llm`` under ``rule`` (:class:`OneWaveBefore`, :class:`ScheduledEnd`, :class:`BandMeanEnd` or
    :class:`LeastEnd`; its decode steps hand the policy their requests, which the first two read)."""
    policy = rule(llm.num_speculative_tokens)
    policy.llm = llm

    def step(reqs, _step=llm._decode_step):
        policy.reqs = reqs
        return _step(reqs)

    llm.policy, llm._decode_step = policy, step
    return llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="target folder (default: the bundled tiny model)")
    ap.add_argument("--method", default="draft_model:3", help="NAME:K")
    ap.add_argument("--draft-model", default=None, help="the method's model folder (a draft model or a head)")
    ap.add_argument("--workload", nargs="+", default=["completion", "edit", "repeated"],
                    choices=["completion", "edit", "repeated"])
    ap.add_argument("--temperature", nargs="+", type=float, default=[0.0, 0.8])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--all-calls", action="store_true", help="every call of e2e's workload a pass (default: the first)")
    ap.add_argument("--rule", default="chains",
                    choices=["chains", "scheduled", "mean", "least", "rows", "independent", "none"],
                    help="the experiment: OneWaveBefore (chains, measured on the H200), ScheduledEnd (scheduled), "
                         "BandMeanEnd (mean), LeastEnd (least: the library's rule before s36), RowsEnd (rows) or "
                         "IndependentEnd (independent: s36's, drafting steps counted as independent) or NoEndRule "
                         "(none: every step decided by the bucket's rates alone)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name, k = args.method.split(":")
    rules = {"chains": OneWaveBefore, "scheduled": ScheduledEnd, "mean": BandMeanEnd, "least": LeastEnd,
             "rows": RowsEnd, "independent": IndependentEnd, "none": NoEndRule}
    spec = {"method": name, "num_speculative_tokens": int(k),
            **({"model": args.draft_model} if args.draft_model else {})}
    print(f"{args.method}, batch {args.batch}, {args.prompts} prompts, {args.max_tokens} tokens, "
          f"{args.repeats} passes, experiment: {rules[args.rule].__name__}")
    print(f"| workload | T | library | {rules[args.rule].__name__} | drafted (library / {rules[args.rule].__name__}) |")
    print("| --- | --- | --- | --- | --- |")
    for workload in args.workload:
        for temperature in args.temperature:
            run = argparse.Namespace(**{**vars(args), "workload": workload, "temperature": temperature})
            model, prompts, params = first_call(run)
            calls = [(prompts, params)]
            if args.all_calls:  # e2e's calls of the workload, one after another in each pass
                calls = [(call, [SamplingParams(temperature=temperature, max_tokens=args.max_tokens, ignore_eos=True,
                                                seed=i if temperature > 0 else None) for i in range(len(call))])
                         for call in build_workloads(AutoTokenizer.from_pretrained(model), [workload], args.prompts,
                                                     args.batch, 256)[0].calls]
            common = dict(device=args.device, max_num_seqs=args.batch)
            engines = {"baseline": LLM(model, **common), "waits": LLM(model, spec, **common),
                       "wave": one_wave_before(LLM(model, spec, **common), rules[args.rule])}
            for llm in engines.values():
                fresh_proposer(llm)
                for call, call_params in calls:  # warm-up: the policy's buckets too
                    llm.generate(call, call_params)
            drafted0 = {key: (llm.policy.stats.steps_drafted, llm.policy.stats.steps_plain)
                        for key, llm in engines.items() if llm.policy is not None}
            times = {key: [] for key in engines}
            for _ in range(args.repeats):
                for key, llm in engines.items():
                    fresh_proposer(llm)  # as e2e's passes: no suffix tree of an earlier pass's responses
                    with gc_off():
                        start = time.perf_counter()
                        for call, call_params in calls:
                            llm.generate(call, call_params)
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

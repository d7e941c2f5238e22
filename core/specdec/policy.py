"""The speculation policy: per step, whether to draft, and for which requests (issue 24).

Fixed-k speculation pays for drafting and for k + 1 verify rows per request every step whatever the drafts are
worth; at a low acceptance (sampling at T = 0.8, a weak head, a contended CPU) that made steps slower than plain
decoding (0.72x on the H200). ``speculation_policy="auto"`` drafts only where it is expected to pay:

- **Throughput per mode**, per batch-size bucket (powers of two) and batch kind (greedy, or holding a sampled
  request: its steps cost more, keyed sampling and no overlap for unseeded ones; one table for both carried one
  kind's estimates into the other: in an H200 e2e run, one engine per method through T = 0 and 0.8 workloads,
  ngram's drafting step at 8 rows was timed at 0.43 ms over the greedy workloads and 1.00 ms after a sampled one,
  and the next greedy workload started from that); tokens emitted per
  request (counted at the bucket's nominal size, so that steps at 17 and at 32 requests compare: on the H200
  both take about the same time, and counting their tokens as they came made plain steps taken late in a
  shrinking batch look slow) and wall time of the decode steps that drafted (``spec``: propose, verify of the
  drafts, bookkeeping, including steps where the proposer found nothing) and of those that did not (``plain``),
  as running means, then exponential averages (weight :data:`ALPHA_COST`); their ratios are the two modes' tokens
  per second. A timed step enters at most :data:`STEP_CLIP` times its mode's average (a one-off stall, such as a
  full collection of Python's garbage collector, must not flip the winner). The first :data:`SETTLE` steps after a
  switch of mode are
  not timed (they carry the switch: a skipped proposer catching up, its weights back into cache), nor is a plain
  step that could not queue the next one ahead because the next one drafts (``observe(unpiped=True)``: a plain
  run's steps overlap their host work with the device's, and it is that mode whose rate counts).
- **Warm-up** of the first bucket: :data:`MIN_PLAIN` plain steps (exactly one token a request: a few measure
  them), then drafting steps until the drafting rate differs from the plain rate by more than :data:`CLEAR_Z`
  standard errors of its mean (at least :data:`MIN_SPEC`, at most :data:`WARMUP` timed steps): a clear loser
  costs a handful of steps, a near tie (where either choice costs little) is measured longer. A later bucket
  (the batch shrinking as requests finish) starts from the nearest warmed-up bucket's estimates instead: tokens
  per request as there, both step times rescaled at the bucket's first timed step of either mode (so the ratio
  of the two modes stays the neighbour's until both are measured here: copied as they were, a batch-8 plain
  step time against a measured batch-1 drafting step made drafting look 5x faster on the CPU), worth
  :data:`SEED_WEIGHT` steps, and the losing mode re-measured after a quarter of the usual gap (the neighbour's
  ratio need not hold at this size).
- **Re-measurement**: afterwards the losing mode runs for a burst (:data:`BURST`) after every gap of decisions
  chosen so that the bursts cost at most :data:`REGRET` of the time: a burst of n steps of length t_l, each
  losing a share l of its tokens against the winner, over a gap of g winning steps of length t_w, costs
  ``n * l * t_l / (g * t_w)``; g is clamped to :data:`GAP_FIRST` .. :data:`GAP_MAX`, or, where a burst's two
  switches alone would cost more than :data:`SWITCH_SHARE` (1%) of the time at :data:`GAP_MAX`, to the gap at which they
  cost that share (at most :data:`GAP_SECONDS` of the winner's steps). So both estimates follow the
  machine's load (another process on the CPU, a longer context, acceptance that changes), re-measured often
  near a tie and rarely against a clear loser. The loser may not take over while its time is stale: the
  winner's has moved by more than :data:`DRIFT` since the loser was last timed (a stretch of slow steps, the
  machine's, raises the winner's average and not the loser's: :meth:`_Bucket.stale_loser`); if it still would
  :data:`STALE_WAIT` decisions on, its burst comes then, paired with the median of the winner's last
  :data:`RECENT` steps (:meth:`_Bucket.begin_burst`). A burst's timed steps weigh :data:`ALPHA_LOSER` each (the
  winner's, timed every step, :data:`ALPHA_COST`): one burst must be able to show that new prompts changed the
  winner. A drafting step of the warm-up or of a burst asks every request for k drafts, whatever its estimates
  (it is they that are being re-measured). A burst also pays two switches of mode: the extra time of the
  untimed steps after a switch (a draft model catching up) is averaged per mode (``_Bucket.switch``; not where
  no running request is behind: a fresh batch's first drafting step carries its requests' starts) and counted
  in the burst's cost, so near a tie bursts come every few hundred steps for such a proposer, not every
  :data:`GAP_FIRST`.
- **Rule**: a step drafts iff the spec mode's tokens per second is at least the plain mode's; once a mode has
  won, the other must beat it by more than :data:`HYSTERESIS` plus, unless the bucket already runs it (a
  re-measurement burst), what the two switches cost, spread over :data:`PAYBACK` of its steps
  (:meth:`_Bucket.margin`: on the H200, eagle3 at batch 8 near a tie switched mode
  every few dozen steps, each switch into drafting a multi-millisecond catch-up, and ran 0.72-0.81x of the
  baseline while either mode alone ran 0.90-1.06x). The spec mode's accepted tokens are
  scaled by the share of the batch's requests that would draft now (expected gain at least :data:`MIN_GAIN`)
  over the share that drafted when it was timed (:meth:`_Bucket.rate`). Drafting steps in which the proposer
  drafted for nobody (a prompt-lookup method without a match) are timed apart (:meth:`_Bucket.add_empty`), and
  the two kinds are mixed at the chance that the batch's requests get drafts now (:attr:`_Bucket.found`, from
  :meth:`SpeculationPolicy._found_chance`: per request a two-state chain, whether its last ask got drafts and the
  steps since, learned method-wide): a lookup method's matches come in stretches, and one average of both kinds
  fell to one token a step after a stretch without matches.
- **Trees or chains**: for a proposer that drafts token trees (``Proposer.max_tree_nodes`` > 0), drafting steps
  choose the same way, per bucket, between verifying whole trees and their first-child chains (a tree's extra
  verify rows cost little at batch 1 on a GPU and may not pay at batch 32): the same warm-up (chains first),
  rule and re-measurement, over drafting steps only, with nothing to settle after a switch.
- **Per request**, within a drafting step: ``a[r][i]``, an exponential average (weight :data:`ALPHA`) of
  whether draft i was accepted given drafts 1..i-1 were (steps where the request got no draft tell nothing of
  that), and ``m_r``, of whether asking it for drafts got any (a prompt-lookup method finds nothing for some
  requests); new requests start from the method-wide averages of their kind (weight :data:`ALPHA_GLOBAL`;
  greedy and sampled requests apart), and a request left out drifts back towards them (:data:`RECOVER` a step).
  A request whose expected accepted drafts ``e_r = m_r * sum_i prod_{m <= i} a[r][m]`` fall below
  :data:`MIN_GAIN` drafts nothing that step (its verify rows would be wasted).
- **The end of a batch**: while nobody waits to join, the batch only shrinks and ends with its longest request, so
  a drafting step must also pay for that request alone: ``(1 + e) * t_plain >= t_spec`` with ``e`` the least
  expected gain among the requests within :data:`END_SHARE` of the most tokens left
  (:meth:`SpeculationPolicy.pays_at_end`). Drafting at different rates leaves a fixed batch ragged, its last steps
  at a few rows: on the CPU (tiny pair, batch 8, repeated prompts, ngram) one request that ngram drafted for in 6
  of its 84 steps set the end, and auto ran 0.84x of the baseline (fixed k 0.84x); with this rule 0.98x. The rule
  compares the two modes' time to the batch's end, each stretch between two requests' ends at the step time of the
  rows still running (each halving of a batch's step time learned from two steps in a row around it,
  :meth:`SpeculationPolicy._rows_pair`), and lets the last request go on alone plain where that is cheaper: where
  fewer rows cost less (a CPU: 4.9 ms a plain step at 4 rows against 7.6 at 8), drafting that ends most requests
  early pays even while the slowest sets the end (CPU, tiny pair, batch 8, T = 0: suffix's edit 1.19x -> 1.40x,
  fixed k 1.42x); where they cost about the same (a GPU's small batches), the rule is the one above. Each
  request's ``e`` here is an empirical-Bayes estimate (:meth:`SpeculationPolicy.end_gains`): its own accepted drafts
  over its last :data:`END_WINDOW` drafting steps, shrunk towards the batch's pooled mean as far as the spread
  between the batch's requests is no more than those averages' noise. The least of the fast per-request averages
  it replaces picked the unluckiest of identical requests (and the request with the most tokens left is the one
  whose drafts were accepted least, by luck alone), and once it kept a step plain nothing re-measured it: in a
  closed-loop simulation of calls of 8 (``benchmarks/policy_calls_sim.py``) auto ran 1.03x the time of plain
  decoding where fixed k ran 0.89x, and 1.30x at calls of 32. A lookup method's steps accept in stretches, so
  they count for less where the batch's steps correlate, and those estimates fade over a run of plain steps (the
  response's text changes; :meth:`SpeculationPolicy.end_gains`). A switch into drafting is owed only for running
  requests that had plain steps since the last drafting step (a fresh batch after one that ended plain owes none).
  A fresh batch that nothing has measured drafts its first step wherever drafting wins the bucket
  (:meth:`SpeculationPolicy._probe`): the method-wide estimates alone could keep it plain to its end unmeasured.

Greedy output cannot change (only which tokens are drafted does), nor can seeded output (:mod:`specdec.keyed`).
Given the same cost table and acceptance history the decisions are the same: :meth:`SpeculationPolicy.plan`
reads no clock. A proposer that can miss steps (``Proposer.skippable``) is not called on plain steps (the hidden
states of those steps reach it at its next call); any other observes (``Proposer.observe``) or proposes, and its
drafts are dropped. ``"fixed"`` drafts k for every request every step.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SPECULATION_POLICIES", "SpeculationPolicy", "PolicyStats"]

SPECULATION_POLICIES = ("auto", "fixed")
ALPHA = 0.3
ALPHA_GLOBAL = 0.05
ALPHA_COST = 0.04  # a spec step's tokens vary (1 .. k + 1 a request): a long average
ALPHA_LOSER = 0.15  # ...but a re-measurement of the losing mode weighs heavily (it is all that is known of it now)
RECOVER = 0.05
SHARE_SCALE = 3.0  # the drafting rate's accepted tokens scale with the share of rows that would draft, at most so
MIN_GAIN = 0.1
SEED_WEIGHT = 4  # steps a seeded bucket's inherited estimates count for in its running averages
MIN_PLAIN = 3  # timed plain steps a new bucket starts with: each gives exactly one token a request
MIN_SPEC = 3  # timed drafting steps after those before the rule may decide...
WARMUP = 32  # ...and at most this many: the warm-up ends once the two rates differ by more than CLEAR_Z
CLEAR_Z = 2.0  # standard errors of the drafting rate (its tokens vary: 1 .. k + 1 a request), or at WARMUP
REGRET = 0.01  # share of the time the re-measurement of the losing mode may cost: its gap follows from how much
# the losing mode loses per step and how long its steps are
GAP_FIRST = 8  # decisions between re-measurements: at least this...
GAP_MAX = 512  # ...and at most this (how late a change of the winner is noticed at worst)
SWITCH_SHARE = 0.01  # ...unless a burst's switches cost more than this share of the time at that gap: then the gap
# at which they cost this share (on the H200 a switch out of a bare run costs ~15 ms, the recompute, against 0.5 ms
# plain steps at batch 8: bursts every 512 steps cost ~9% of the time), though at most GAP_SECONDS of the winner's
# steps (a change of workload must still be noticed; cheap switches keep GAP_MAX, so a new workload on which
# drafting pays is re-measured as soon as before). 3% until s34: with REGRET it let auto's floor sit ~4% under the
# baseline where switches cost most (eagle3 at batch 8 on the H100: 16-27 ms a switch into drafting against 0.55-0.8
# ms plain steps), against issue 24's 0.97x; at 1% such bursts come every ~2 s of steps instead of ~1 s
GAP_SECONDS = 2.0
DRIFT = math.log(1.25)  # the winner's step time moved this far (in log) since the loser was timed: the loser may
# not take over before it is timed again (_Bucket.stale_loser)...
STALE_WAIT = 32  # ...which comes this many decisions on if the loser still wins then...
RECENT = 8  # ...paired with the median of the winner's last this many timed steps (_Bucket.begin_burst)
END_SHARE = 0.9  # with nothing waiting, the requests within this share of the most tokens left end the batch
ROWS_CHEAPER = 0.9  # ...a batch's smaller buckets count as cheaper only below this share of its step time (noise)
END_WINDOW = 32  # drafting steps a request's own average spans in the end rule's estimate (SpeculationPolicy.end_gains)
END_PRIOR = 8.0  # ...pseudo-steps of the method-wide expected gain in the batch's pooled mean
END_PRIOR_VAR = 1.0  # ...pseudo-steps' variance of accepted drafts a step (a request's), before any is measured
END_MIN_STEPS = 4.0  # ...weighted steps a request needs to count apart from the pooled mean...
END_MIN_REQUESTS = 2  # ...and requests with that many, to tell a spread between requests from noise
END_RHO_MAX = 0.9  # ...and the most a step's accepted drafts may follow the step before's within a request (a lookup
# method's come in stretches: on the CPU, tiny pair, e2e's prompts, fixed k, ngram and suffix 0.56-0.73 at lag 1,
# eagle3 and draft_model -0.19..0.09); n steps then tell what n (1 - rho) / (1 + rho) independent ones would...
END_FADE = 4.0  # ...and over a run of plain steps they fade by (1 - rho / END_FADE) a step (correlated steps come
# from a response whose text changes: on the CPU, suffix b8, e2e's edit calls, at 1 - rho / 32 stale estimates kept
# the batch plain, 1.06x against 1.18x for the fast averages before s36 in the same run; / 8: 1.10x against 1.22x;
# / 4: 1.20x against 1.15x; the library's form against s36's rule, completion / edit / repeated: 1.16 / 1.11 / 1.23x
# against 1.02 / 1.09 / 1.17x)...
END_FADE_EVERY = 8  # ...applied in steps of this many plain steps (end_gains is kept between them)
_KEEP = 1.0 - 1.0 / END_WINDOW
HYSTERESIS = 0.03  # the winner changes only when the other mode is faster by more than this share (noise
# near a tie would otherwise flip it, and each flip restarts the re-measurement gaps at GAP_FIRST)
PAYBACK = 32  # steps of the new mode over which a change of winner must win back the two switches it costs
BURST = (4, 5)  # consecutive steps of the losing mode per re-measurement: plain, spec...
SETTLE = (1, 2)  # ...of which the first ones after a switch are not timed: plain, spec (a skipped proposer
# catches up, and its weights come back into cache, over the first drafting steps after a plain run)
SWITCH_CLIP = 4.0  # a switch's extra time enters its average at most this many times the average, or the last
# switch's extra time if larger (H200: a Triton compile for a new catch-up width, ~0.1 s once, set eagle3's switch at
# 70-100 ms and kept the policy from switching; a cost that repeats is learned at once)
LONG_RUN = 16  # plain steps in a row past which a switch into drafting is learned apart (switch_long): on CUDA the
# engine's bare steps start there (specdec.engine.BARE_AFTER) and the proposer's catch-up then recomputes the run's
# hidden states (eagle3, batch 8: 16-27 ms on the H100 against ~1 ms after a short run); one average of both,
# clipped as one-offs, kept batches of repeated prompts switching back into drafting at the end of long plain runs
ALPHA_SWITCH = 0.5  # the weight of a switch's extra time when it was not clipped (and an average existed): bursts
# come every few hundred steps, and at ALPHA_LOSER's weight a recompute's ~15 ms (H200, batch 8) after early 1 ms
# switches was still learned as 2.8-8.6 ms after the passes of a benchmark (s27), so the gap that should have made
# the switches cost SWITCH_SHARE stayed at GAP_MAX; the first switch and a clipped one keep ALPHA_LOSER
STEP_CLIP = 4.0  # a timed step enters its mode's average at most this many times the average (after MIN_PLAIN of
# them): a one-off stall (a full collection of Python's garbage collector, 190 ms against 6 ms plain steps on the
# CPU with three engines alive; a kernel compiled for a new shape) raised the plain average by 0.04 x 30 and the rule
# switched into drafting at 0.5x for a few dozen steps; a lasting change still comes through, 12% a step or more
PRIOR = 0.6
READ_EVERY = 8  # while plain wins at the requests' estimates, decisions before they are read again
# why :meth:`SpeculationPolicy.plan` kept a step plain: the warm-up's plain steps, plain winning the rule, a
# re-measurement burst of plain steps while drafting wins, no request expecting MIN_GAIN, the end of the batch
PLAIN_REASONS = ("warmup", "slower", "remeasure", "no_gain", "batch_end")
TIMED_PLAIN = ("warmup", "remeasure")  # plain steps taken to time the plain mode while drafting is tried or winning
# why a step drafted: the warm-up's drafting steps, a re-measurement burst while plain wins, drafting the winner
DRAFT_REASONS = ("warmup", "remeasure", "faster")


@dataclass
class PolicyStats:
    """What the policy decided: decode steps that drafted / did not, and request rows that drafted out of all
    rows of decode steps."""

    steps_drafted: int = 0
    steps_plain: int = 0
    rows_drafted: int = 0
    rows: int = 0
    steps_tree: int = 0  # drafting steps that verified whole token trees (a tree proposer's; else 0)
    plain_reasons: dict[str, int] = field(default_factory=dict)  # plain steps by why: see PLAIN_REASONS
    draft_reasons: dict[str, int] = field(default_factory=dict)  # drafting steps by why: see DRAFT_REASONS

    @property
    def drafted_step_share(self) -> float:
        """Share of decode steps that drafted (1.0 before any step)."""
        total = self.steps_drafted + self.steps_plain
        return self.steps_drafted / total if total else 1.0

    def as_dict(self) -> dict[str, float]:
        return {"steps_drafted": self.steps_drafted, "steps_plain": self.steps_plain,
                "rows_drafted": self.rows_drafted, "rows": self.rows, "steps_tree": self.steps_tree,
                "drafted_step_share": round(self.drafted_step_share, 4),
                **{f"plain_{k}": self.plain_reasons.get(k, 0) for k in PLAIN_REASONS},
                **{f"drafted_{k}": self.draft_reasons.get(k, 0) for k in DRAFT_REASONS}}


@dataclass
class _Bucket:
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])  # averaged tokens per step: plain, spec
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])  # averaged seconds per step: plain, spec
    count: list[int] = field(default_factory=lambda: [0, 0])  # timed steps: plain, spec
    decisions: int = 0
    last: int = -1  # the mode of the bucket's last step
    settling: int = 0  # steps after a switch of mode still to leave untimed
    switch: list[float] = field(default_factory=lambda: [0.0, 0.0])  # extra seconds of a switch into: plain, spec
    _extra: float = 0.0  # the current switch's extra seconds so far
    _last_extra: list[float] = field(default_factory=lambda: [0.0, 0.0])  # the last switch's, unclipped, per mode
    switch_long: float = 0.0  # extra seconds of a switch into drafting after at least LONG_RUN plain steps
    _last_long: float = 0.0  # ...the last such switch's, unclipped
    _long: bool = False  # the current switch into drafting follows at least LONG_RUN plain steps
    _fresh: bool = False  # the current switch into drafting has no running request behind: not learned
    decided: bool = False  # past the warm-up: the rule picks the mode
    winner: int = -1  # the mode the rule picked last
    gap: int = GAP_FIRST  # decisions between re-measurements of the losing mode
    since: int = 0  # decisions since the last re-measurement began
    seeded: bool = False  # started from a neighbouring bucket's estimates instead of a warm-up
    spread: list[float] = field(default_factory=lambda: [0.0, 0.0])  # warm-up drafting steps' rates: mean, M2
    size: int = 1  # the nominal batch size whose tokens per step ``tokens`` holds
    exploring: bool = False  # the last decision was a drafting step of the warm-up or of a re-measurement burst
    share: float = 0.0  # the share of the rows that drafted in the timed drafting steps (averaged)
    now: float | None = None  # ...and of those the rule would let draft in the batch being decided (None: unknown)
    empty: float = 0.0  # averaged seconds of the drafting steps in which the proposer drafted nothing (0: none yet)
    empties: int = 0  # ...timed
    found: float | None = None  # the chance that a drafting step of the batch being decided drafts anything, from
    # its requests' estimates (None: unknown, taken as 1)
    read_at: int = -READ_EVERY  # the decision at which :attr:`now` and :attr:`found` were last read from requests
    clipped: int = 0  # timed steps whose seconds were clipped (:data:`STEP_CLIP`)
    ref: float = 0.0  # the winner's step time when the loser was last timed (0: not yet; :meth:`stale_loser`)
    pending: int = -1  # the decision (:attr:`since`) from which a loser kept out as stale is re-measured at once
    paired: bool = False  # the next burst pairs the loser with the winner's last RECENT steps (:meth:`begin_burst`)
    recent: list[deque] = field(default_factory=lambda: [deque(maxlen=RECENT), deque(maxlen=RECENT)])  # each
    # mode's last RECENT timed steps' seconds

    def ready(self) -> bool:
        """Past the warm-up with both modes measured."""
        return self.decided and min(self.count) > 0

    def rate(self, mode: int) -> float:
        """Tokens per second of ``mode`` (0 plain, 1 spec). With :attr:`now` set, the drafting steps' accepted
        tokens are those measured scaled by the share of the batch's requests whose expected gain reaches
        :data:`MIN_GAIN` over the share that drafted when they were measured (at most :data:`SHARE_SCALE`
        times): once every request's estimate has fallen below it, drafting gains nothing, whatever it gained
        when it was last timed (kept as it was, the bucket went on naming drafting the winner while every step
        was plain, and never re-measured the requests). The drafting steps measured are those that drafted
        something; with :attr:`found` below 1, the steps that draft nothing (one token a request in
        :attr:`empty` seconds) are mixed in at their chance (:meth:`_mixed`)."""
        tokens = self.tokens[mode]
        if mode and self.now is not None and self.share > 0:
            accepted = max(0.0, tokens - self.size)  # a request's own token is in every step
            tokens = self.size + accepted * min(self.now / self.share, SHARE_SCALE)
        if mode:
            return self._mixed(tokens, float(self.size)) / max(self.spent(1), 1e-12)
        return tokens / max(self.seconds[mode], 1e-12)

    def _mixed(self, found: float, empty: float) -> float:
        """A drafting step's ``found`` (it drafted something) and ``empty`` (it drafted nothing) values mixed at
        :attr:`found`'s chance, once an empty step was timed (else ``found``)."""
        p = 1.0 if self.found is None else self.found
        return found if p >= 1.0 or not self.empty else p * found + (1.0 - p) * empty

    def spent(self, mode: int) -> float:
        """Expected seconds of a step of ``mode``: a drafting step's mixed as in :meth:`rate`."""
        return self._mixed(self.seconds[1], self.empty) if mode else self.seconds[0]

    def add(self, mode: int, tokens: float, seconds: float, share: float = 1.0) -> None:
        """One timed step of ``mode``: ``tokens`` (per step at the bucket's nominal size) in ``seconds``;
        ``share``: for a drafting step, the share of its rows that drafted."""
        self._rescale(seconds, self.seconds[mode])
        seconds = self._clip(seconds, self.seconds[mode], self.count[mode])
        self.count[mode] += 1
        w = self._weight(mode, self.count[mode])
        if self.decided and mode != self.winner:  # the loser timed: as current as the winner's time now
            self.ref = self.seconds[self.winner]
        self.tokens[mode] += w * (tokens - self.tokens[mode])
        self.seconds[mode] += w * (seconds - self.seconds[mode])
        self.recent[mode].append(seconds)
        if mode:
            self.share += w * (share - self.share)
        if mode and not self.decided:  # Welford's running variance of the drafting steps' rates
            x, mean = tokens / max(seconds, 1e-12), self.spread[0]
            self.spread[0] += (x - mean) / self.count[1]
            self.spread[1] += (x - mean) * (x - self.spread[0])

    def add_empty(self, seconds: float) -> None:
        """One timed drafting step in which the proposer drafted nothing (a prompt-lookup method found no match
        for any request): ``seconds``, averaged apart from the drafting steps that drafted something. Mixed into
        one average, a lookup method's clustered matches (sampled text copying its prompt for a stretch, then
        not) left the drafting rate at one token a step after a stretch without matches, and plain decoding
        chosen where drafting paid (CPU, ngram, batch 1, T = 0.8: auto 0.92x where fixed k ran 1.04x)."""
        self._rescale(seconds, self.empty or self.seconds[0])
        seconds = self._clip(seconds, self.empty, self.empties)
        self.empties += 1
        self.empty += self._weight(1, self.empties) * (seconds - self.empty)
        if self.decided and self.winner == 0:
            self.ref = self.seconds[0]

    def stale_loser(self) -> bool:
        """The winner's step time has moved by more than :data:`DRIFT` since the loser was last timed: the two
        estimates are of different times, and the loser may not take over on them (:meth:`SpeculationPolicy._decide`:
        if it still would :data:`STALE_WAIT` decisions on, it is timed then, in a burst brought forward; a stretch
        of slow steps is over by then, and a lasting change waits no longer than that). On the H100 (s42, random
        bench pair, batch 8, T = 0.8) plain steps of ~0.55 ms ran at 2-7 ms for 20-40 steps at a time in the
        engines' runs (the machine's, not a mode's) and the plain average rose to 1.8 ms; against a drafting time
        from before such a stretch, drafting "won" where it lost by 0.55-0.6x, and ran on (s41's grid, batch 8,
        T = 0.8: 1000-2100 drafting steps at 0.8-0.86x of the baseline) until bursts of plain steps brought its
        inflated estimate back."""
        w = self.winner
        return (w >= 0 and self.ref > 0 and self.seconds[w] > 0
                and abs(math.log(self.seconds[w] / self.ref)) > DRIFT)

    def begin_burst(self) -> None:
        """A burst of the loser begins. If it was brought forward by a stale loser (:attr:`paired`), the winner's
        time becomes the median of its last :data:`RECENT` timed steps: its long average lags a change by tens of
        steps, and the loser timed now against it would be as wrong the other way (a stretch of slow steps fading:
        plain's average still high, drafting timed at the machine's speed again)."""
        if self.paired:
            recent = sorted(self.recent[self.winner])
            if len(recent) >= RECENT // 2:
                self.seconds[self.winner] = recent[len(recent) // 2]
            self.paired = False

    def _clip(self, seconds: float, average: float, count: int) -> float:
        """``seconds`` of a timed step, at most :data:`STEP_CLIP` times ``average`` once ``count`` (its kind's timed
        steps so far) reaches :data:`MIN_PLAIN`; counted in :attr:`clipped`."""
        if count >= MIN_PLAIN and seconds > STEP_CLIP * average > 0:
            self.clipped += 1
            return STEP_CLIP * average
        return seconds

    def _weight(self, mode: int, count: int) -> float:
        """The weight of the ``count``-th timed step of ``mode`` (a drafting step's, for the empty ones): the
        running mean (after the seed's weight), then an exponential average: a long one for the winning mode (timed
        every step it runs), a short one for the loser (timed only in its bursts, and what changes between them, a
        new kind of prompt or another process's load, must show in the next one)."""
        n = count + (SEED_WEIGHT if self.seeded else 0)
        return max(ALPHA_LOSER if self.decided and mode != self.winner else ALPHA_COST, 1.0 / n)

    def _rescale(self, seconds: float, inherited: float) -> None:
        """At a seeded bucket's first own timed step (``seconds``, where it inherited ``inherited``): every
        inherited step time on this bucket's scale."""
        if self.seeded and not any(self.count) and not self.empties:
            f = seconds / max(inherited, 1e-12)
            self.seconds = [t * f for t in self.seconds]
            self.empty *= f

    def clear(self) -> bool:
        """The warm-up may end: the drafting rate differs from the plain rate by more than :data:`CLEAR_Z`
        of its standard errors (after :data:`MIN_SPEC` timed steps), or :data:`WARMUP` steps are timed."""
        n = self.count[1]
        if n + self.empties >= WARMUP:  # steps that drafted nothing count here: a workload without matches ends it
            return True
        if n < MIN_SPEC or self.count[0] < MIN_PLAIN:
            return False
        mean, m2 = self.spread
        se = (m2 / (n - 1) / n) ** 0.5 / max(mean, 1e-12)  # relative standard error of the mean rate
        return abs(self.rate(1) / max(self.rate(0), 1e-12) - 1.0) > CLEAR_Z * se

    def plain_regardless(self) -> bool:
        """Plain has won and keeps winning whatever share of the batch's requests would draft now: the drafting
        rate with all of them (:attr:`now` 1) is not past the plain rate by :meth:`margin`, so :meth:`rate`'s
        only input from the requests' estimates cannot change the rule's choice."""
        if not (self.decided and self.winner == 0 and self.count[0] > 0 and (self.count[1] or self.empties)):
            return False  # (a proposer that has never drafted anything: no drafting rate, plain regardless)
        now, found, self.now, self.found = self.now, self.found, 1.0, 1.0
        try:
            return self.plain_wins()
        finally:
            self.now, self.found = now, found

    def plain_lately(self, ahead: int = 0) -> bool:
        """Plain has won, and wins at the requests' estimates as read (:attr:`now`, :attr:`found`) within the last
        :data:`READ_EVERY` decisions (``ahead``: decisions not yet counted): the rule need not read them again yet.
        During a plain run they only drift, by :data:`RECOVER` a step; read on every step, they cost the H200's host
        ~0.13 ms a step at batch 32 (ngram@auto, T = 0.8: auto's plain steps 0.83 ms against the baseline's 0.69)."""
        if not (self.decided and self.winner == 0 and self.now is not None and self.count[0] > 0):
            return False
        if self.decisions + ahead - self.read_at >= READ_EVERY:
            return False
        return self.plain_wins()

    def burst_unread(self) -> bool:
        """The coming decision is a plain step of a re-measurement burst past its first while drafting wins: the
        requests' estimates read at the burst's first step stand (a plain step only drifts them by :data:`RECOVER`),
        so the rule does not read them again; the steps that time the plain mode then cost the policy what a plain
        run's do. Read on each of them (plan and :meth:`SpeculationPolicy.would_draft`), they cost ~100 us a step
        at batch 32 on the CPU against ~10 in a plain run, which the plain estimate counted as plain's own."""
        since = self.since + 1
        return (self.decided and self.winner == 1 and self.now is not None
                and self.gap + 1 < since <= self.gap + BURST[0])

    def plain_wins(self) -> bool:
        """The drafting rate, at :attr:`now` and :attr:`found` as set, is not past the plain rate by
        :meth:`margin`: plain, the winner, keeps winning."""
        return self.rate(1) <= self.rate(0) * (1 + self.margin(1))

    def bursting(self, since: int) -> bool:
        """Whether the decision ``since`` decisions after the last re-measurement is one of the losing mode's burst
        (after a gap of :attr:`gap`, :data:`BURST` steps of the mode that is not the winner)."""
        return self.gap < since <= self.gap + BURST[1 - self.winner]

    def margin(self, to: int) -> float:
        """How much faster mode ``to`` must be to take over from the winner: :data:`HYSTERESIS`, plus, unless the
        bucket runs ``to`` already (its last step: a re-measurement burst of it), the extra time of a switch into
        each mode (:attr:`switch`) over :data:`PAYBACK` of the winner's steps. After a drafting burst showed that
        new prompts made drafting pay (CPU, eagle3, batch 1: 1.46x), staying in it costs no switch; charged the
        switches, the rule waited for a second burst ~500 steps later."""
        if self.last == to:
            return HYSTERESIS
        return HYSTERESIS + self.switches() / (PAYBACK * max(self.spent(self.winner), 1e-12))

    def switches(self) -> float:
        """The extra seconds of the two switches that leaving the winner's run and coming back cost: into plain and
        into drafting, the latter after a long run (:attr:`switch_long`, once timed) where plain is the winner: a
        re-measurement burst of drafting comes after at least :data:`GAP_FIRST` plain decisions and, wherever
        switches cost enough to matter, after hundreds. Until s40 the gap and the margin took the short run's
        switch: on the H100 (s39's grid, eagle3, batch 8) 1.8 / 4.3 / 13.7 ms where a burst after a long run paid
        15.7 / 22.2 / 17.9 ms, so bursts came every 512 steps at ~5% of the time instead of every ~1.6 s at ~1%."""
        return self.switch[0] + (self.switch_into_drafting(LONG_RUN) if self.winner == 0 else self.switch[1])

    def switch_into_drafting(self, plain_steps: int) -> float:
        """The extra seconds of a switch into drafting after ``plain_steps`` plain steps in a row: after
        :data:`LONG_RUN` or more, the average of such switches (:attr:`switch_long`) once one was timed."""
        return self.switch_long if plain_steps >= LONG_RUN and self.switch_long else self.switch[1]

    @staticmethod
    def learned(average: float, last: float, extra: float) -> float:
        """An average of switches' extra seconds after one more took ``extra`` (the one before it ``last``): a
        switch's time enters at most :data:`SWITCH_CLIP` times the average, or ``last`` if larger (a one-time
        cost, a kernel compiled for a new shape, does not repeat; a cost the last switch had too is no one-off), at
        weight :data:`ALPHA_SWITCH`, or :data:`ALPHA_LOSER` when clipped or the first."""
        cap = max(SWITCH_CLIP * average, last)
        clipped = min(extra, cap) if average else extra
        weight = ALPHA_SWITCH if average and extra <= cap else ALPHA_LOSER
        return average + weight * (clipped - average)

    def next_gap(self) -> int:
        """Decisions until the losing mode is re-measured: its burst costs at most :data:`REGRET` of the time
        (a burst of n steps, each t_l long, losing a share l of its tokens against the winner, over a gap of
        g winning steps t_w long: g = n * l * t_l / (t_w * REGRET)), within GAP_FIRST .. :meth:`gap_max`."""
        w = self.winner
        lose = 1 - w
        loss = max(0.0, 1.0 - self.rate(lose) / max(self.rate(w), 1e-12))
        # a burst also pays two switches (into the losing mode and back): near a tie, a draft model's catch-up
        # after plain steps made bursts every GAP_FIRST steps cost more than either mode (H200, batch 8: 0.87x of
        # the baseline where fixed k ran 1.06x)
        cost = BURST[lose] * loss * self.spent(lose) + self.switches()
        g = cost / max(self.spent(w), 1e-12) / REGRET
        return int(min(self.gap_max(), max(GAP_FIRST, math.ceil(g))))

    def gap_max(self) -> int:
        """The longest gap between re-measurements: :data:`GAP_MAX` decisions, or more where a burst's two switches
        (:meth:`switches`) would cost more than :data:`SWITCH_SHARE` of the time at that gap: the gap at which they
        cost that share, at most :data:`GAP_SECONDS` of the winner's steps."""
        t_w = max(self.spent(self.winner), 1e-12)
        wanted = math.ceil(self.switches() / (t_w * SWITCH_SHARE))
        return max(GAP_MAX, min(wanted, int(GAP_SECONDS / t_w)))


def _chain_gain(acc: list[float]) -> float:
    """The expected accepted drafts of a chain whose draft i is accepted at ``acc[i]`` given the ones before it."""
    gain, p = 0.0, 1.0
    for a in acc:
        p *= a
        gain += p
    return gain


@dataclass
class SpeculationPolicy:
    """Plans each decode step's drafts (:meth:`plan`) and learns from its outcome (:meth:`observe`).

    Attributes:
        k: drafts per request when a request drafts.
        cost: batch-size bucket -> step timings of greedy batches (a test or a tool may fill it to fix the
            decisions); ``cost_sampled`` the same for batches holding a sampled request.
        stats: :class:`PolicyStats`.
        trees: the proposer drafts token trees: each drafting step also chooses whole trees or their first-child
            chains (:attr:`tree_step`), from ``shape``, per bucket, chains as mode 0 and trees as mode 1.
        tree_step: the last :meth:`plan`'s choice for a tree proposer (True: verify whole trees).
        plain_reason: why the last :meth:`plan` kept the step plain (one of :data:`PLAIN_REASONS`; "" when it
            drafted). On "warmup" and "remeasure" plain steps are timed against drafting (:data:`TIMED_PLAIN`):
            with :data:`specdec.engine.TIMED_BARE` the engine runs them as a long plain run would (without
            collecting a proposer's hidden states).
    """

    k: int
    cost: dict[int, _Bucket] = field(default_factory=dict)
    stats: PolicyStats = field(default_factory=PolicyStats)
    trees: bool = False
    shape: dict[int, _Bucket] = field(default_factory=dict)
    cost_sampled: dict[int, _Bucket] = field(default_factory=dict)
    shape_sampled: dict[int, _Bucket] = field(default_factory=dict)
    tree_step: bool = True
    plain_reason: str = ""
    _acc: dict[str, list[float]] = field(default_factory=dict)
    _global: dict[bool, list[float]] = field(default_factory=dict)  # per kind (sampled?): method-wide acceptance
    _planned: dict[str, int] = field(default_factory=dict)
    _made: dict[str, float] = field(default_factory=dict)  # per request: how often asking for drafts got some
    _made_global: dict[bool, float] = field(default_factory=lambda: {False: 1.0, True: 1.0})  # ...and made share
    _end: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # per request, over its last
    # END_WINDOW drafting steps (exponentially weighted): steps, accepted drafts, their squares (end_gains)
    _lag: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # per request, the same window's
    # consecutive pairs of its drafting steps: their count, the sum of their accepted drafts' products, the last step's
    _end_cache: tuple[bool, list[str], int | None, list[float]] | None = None  # end_gains' kind, requests, fade, answer
    # (until a drafting step's outcome or a request's end changes what it reads)
    _behind: set[str] = field(default_factory=set)  # running requests in a plain step since the last drafting step:
    # a skipped proposer catches up on them at the next one (the switch into drafting)
    _found_last: dict[str, tuple[int, int]] = field(default_factory=dict)  # per request: whether its last ask got
    # drafts (1/0), and the observed step it was
    _steps: int = 0  # steps observed
    _found_after: dict[bool, list[float]] = field(default_factory=lambda: {False: [1.0, 1.0], True: [1.0, 1.0]})
    # ...per kind: the share of asks that got drafts after an ask that got none / got some
    _sampled: dict[str, bool] = field(default_factory=dict)  # per request: seen only in batches holding a sampled one
    _step_share: float = 0.0  # the share of the last plan's requests that draft
    _last_mode: int = -1  # the mode of the last step observed, whatever its bucket (a switch is the proposer's)
    _drift: dict[str, int] = field(default_factory=dict)  # per request: plain steps of drift not yet applied
    _run: list[str] = field(default_factory=list)  # the requests of the plain steps in a row counted in _run_steps
    _run_steps: int = 0  # ...not yet in _drift (:meth:`_flush_run`)
    _plain_steps: int = 0  # plain steps in a row since the last drafting step (the switch a return costs)
    _plan_ids: list[str] = field(default_factory=list)  # the last plan's requests...
    _plan_sampled: bool = False  # ...and whether its batch held a sampled one
    _plain_plan: dict[str, int] | None = None  # :attr:`_planned` when the last plan was a plain step's
    _gains: dict[str, float] = field(default_factory=dict)  # expected gains read since the last plan / observe...
    _gains_kept: bool = False  # ...or computed by the last observe, a drafting step's, for the next plan (_fast)
    _unpiped_extra: float = 0.0  # what unpiped plain steps took beyond a plain step, since the last drafting step
    _plan_bucket: _Bucket | None = None  # the bucket the last plan decided on
    _rows_ratio: dict[int, float] = field(default_factory=dict)  # bucket -> its step time over the bucket twice its
    # size's, from consecutive steps (_rows_pair)
    _prev_step: tuple[int, int, float] = (0, -1, 0.0)  # the last timed step's bucket, mode and seconds
    _r1: tuple = ()  # (bucket, its drafting-rate inputs, rate at its now/found, rate at now = found = 1): _plain_sure
    _fast: bool = True  # the plain-run fast paths of plan / would_draft / observe (False: every step the full way,
    # the reference the fast paths must equal decision for decision; tests compare the two)

    def __post_init__(self) -> None:
        self._global = {False: [PRIOR] * self.k, True: [PRIOR] * self.k}

    def _kind(self, req_id: str) -> bool:
        """Which method-wide averages ``req_id`` starts from and feeds (True: sampled): greedy requests'
        acceptance says little of sampled ones' (ngram at T = 0.8 on the H200: 0.36 at the first position against
        0.82 greedy), and one set of averages carried a sampled workload's into the next greedy one."""
        return self._sampled.get(req_id, False)

    @staticmethod
    def bucket(batch_size: int) -> int:
        """The cost bucket of a batch: the smallest power of two >= its size."""
        b = 1
        while b < batch_size:
            b *= 2
        return b

    def expected_gain(self, req_id: str) -> float:
        """Expected accepted drafts of ``req_id`` asked for k now: the share of its drafting steps in which the
        proposer drafted for it at all (a prompt-lookup method finds nothing for some requests), times the accepted
        drafts of a chain."""
        if self._run_steps:
            self._flush_run()
        if req_id in self._drift:
            self._catch_up(req_id)
        kind = self._kind(req_id)
        return self._made.get(req_id, self._made_global[kind]) * _chain_gain(self._acc.get(req_id, self._global[kind]))

    def _catch_up(self, req_id: str) -> None:
        """Apply the :data:`RECOVER` drift of the plain steps ``req_id`` was left out of since its estimates were
        last read or changed (:attr:`_drift`): n steps towards unchanged method-wide estimates ``g`` in closed form,
        ``g + (a - g) * (1 - RECOVER) ** n``. A plain step counts them instead of moving every request's
        estimates (the method-wide ones change only on drafting steps, which apply every pending drift first)."""
        n = self._drift.pop(req_id)
        kind = self._kind(req_id)
        f = (1.0 - RECOVER) ** n
        acc, prior = self._acc[req_id], self._global[kind]
        acc[:] = [g + (a - g) * f for a, g in zip(acc, prior)]
        mp = self._made_global[kind]
        self._made[req_id] = mp + (self._made.get(req_id, mp) - mp) * f

    def _gain(self, req_id: str) -> float:
        """:meth:`expected_gain`, kept until the estimates change (the next :meth:`plan` or :meth:`observe`): a
        step's plan, the engine's :meth:`would_draft` and :meth:`pays_at_end` read the same values."""
        try:
            return self._gains[req_id]
        except KeyError:
            gain = self._gains[req_id] = self.expected_gain(req_id)
            return gain

    def _tables(self, sampled: bool) -> tuple[dict[int, _Bucket], dict[int, _Bucket]]:
        """The step-cost and tree-shape tables of greedy batches, or of batches holding a sampled request."""
        return (self.cost_sampled, self.shape_sampled) if sampled else (self.cost, self.shape)

    def plan(self, req_ids: list[str], sampled: bool = False, remaining: Sequence[int] | None = None) -> list[int]:
        """Drafts each request may make this step (k or 0), in order; ``sampled``: the batch holds a request with
        temperature > 0 (its own cost table); ``remaining``: when no request waits to join (the batch can only
        shrink), each request's tokens left (:meth:`pays_at_end`; a sequence, read only when the rule gets there:
        the engine counts them at their first read)."""
        if self._fast and self._plain_plan is not None and req_ids == self._plan_ids:
            b = self._planned_bucket(sampled)
            if b is not None and self._plain_sure(b, b.decisions + 1):
                # what the full way below would do for this step: the same plain decision, the same state after it
                self._gains.clear()
                self._gains_kept = False
                b.decisions += 1
                b.exploring = False
                b.since += 1
                b.pending = -1
                reasons = self.stats.plain_reasons
                reasons["slower"] = reasons.get("slower", 0) + 1
                self.plain_reason = "slower"
                self._step_share = 0.0
                self._planned = self._plain_plan
                return [0] * len(req_ids)
        cost, shape = self._tables(sampled)
        if not self._gains_kept:  # (those a drafting step's observe computed hold until the estimates change)
            self._gains.clear()
        self._gains_kept = False
        if sampled != self._plan_sampled or req_ids != self._plan_ids:  # (the same batch: nothing changes below)
            if self._run_steps:
                self._flush_run()
            for r in req_ids:
                kind = self._sampled.get(r, True)
                if kind and not sampled and r in self._drift:
                    self._catch_up(r)  # its pending drift was towards the sampled requests' estimates
                    self._gains.pop(r, None)
                self._sampled[r] = kind and sampled
            self._plan_ids, self._plan_sampled = list(req_ids), sampled
        b = self._bucket_for(len(req_ids), cost)
        self._plan_bucket = b
        b.decisions += 1
        widths, why = self._widths(b, req_ids, remaining)
        self.plain_reason = why
        if why:
            self.stats.plain_reasons[why] = self.stats.plain_reasons.get(why, 0) + 1
        else:
            drafted = ("remeasure" if b.decided else "warmup") if b.exploring else "faster"
            self.stats.draft_reasons[drafted] = self.stats.draft_reasons.get(drafted, 0) + 1
        self._step_share = 0.0 if why else sum(1 for w in widths if w) / len(req_ids)
        if not why and self.trees:
            s = self._bucket_for(len(req_ids), shape)
            s.decisions += 1
            self.tree_step = self._decide(s)
        self._planned = dict(zip(req_ids, widths))
        self._plain_plan = self._planned if why else None  # observe's shortcut for a plain step of these requests
        return widths

    def _planned_bucket(self, sampled: bool) -> _Bucket | None:
        """The last plan's bucket, while it is still the one a batch of that kind and size decides on (the same
        kind, and nobody replaced it in its table); else None."""
        b = self._plan_bucket
        if b is None or sampled != self._plan_sampled or self._tables(sampled)[0].get(b.size) is not b:
            return None
        return b

    def _plain_sure(self, b: _Bucket, decisions: int) -> bool:
        """Whether decision number ``decisions`` of bucket ``b`` is plain with reason "slower" by the full rule
        (:meth:`_widths`: plain has won and wins regardless of the requests' estimates, or at them as read within
        :data:`READ_EVERY` decisions; :meth:`_decide` keeps plain the winner and no burst is due), computed by
        the same methods in fewer calls. A plain run's step then costs the policy a few microseconds: on
        the device machine's host plan + would_draft + observe took ~50 us a plain step (H100, batch 8, s34) in a
        step the host bounds at ~0.55 ms. The drafting rates, whose inputs a plain step does not change, are
        kept until those inputs change."""
        if not (b.decided and b.winner == 0 and b.count[0] > 0) or b.since + 1 > b.gap:
            return False
        key = (b.tokens[1], b.seconds[1], b.now, b.share, b.found, b.empty)
        r1 = self._r1
        if not r1 or r1[0] is not b or r1[1] != key:
            now, found = b.now, b.found
            r_now = b.rate(1)
            b.now = b.found = 1.0
            try:
                r_all = b.rate(1)
            finally:
                b.now, b.found = now, found
            r1 = self._r1 = (b, key, r_now, r_all)
        bound = b.rate(0) * (1 + b.margin(1))  # plain_wins' right-hand side
        if not r1[2] <= bound:  # _decide: the rates at the estimates as read keep plain the winner
            return False
        if (b.count[1] or b.empties) and r1[3] <= bound:  # plain_regardless
            return True
        return b.now is not None and decisions - b.read_at < READ_EVERY  # plain_lately

    def _widths(self, b: _Bucket, req_ids: list[str], remaining: Sequence[int] | None) -> tuple[list[int], str]:
        """The step's drafts per request on bucket ``b`` (whose decision state it advances). A drafting step of the
        warm-up or of a re-measurement burst asks every request for k (their estimates are what is being
        re-measured: filtered by them, estimates that fell once, say over prompts a method finds nothing in, kept
        every later request from drafting, and an engine whose drafting paid 1.45x on the next prompts stayed at
        1.00x); any other drafting step asks the requests whose expected gain reaches :data:`MIN_GAIN`, if drafting
        pays at the end of the batch (:meth:`pays_at_end`). Also returns why a plain step is plain (one of
        :data:`PLAIN_REASONS`; "" for a drafting step). Where plain has won and would win even if every request
        would draft (:meth:`_Bucket.plain_regardless`), the requests' estimates are not read (a plain run's steps
        cost the policy a few microseconds, not a pass over every request): only a re-measurement burst's first
        step reads them, for :attr:`_Bucket.now`; where plain wins at their estimates as read, they are read again
        every :data:`READ_EVERY` decisions (:meth:`_Bucket.plain_lately`)."""
        plain = [0] * len(req_ids)
        if b.plain_regardless() or b.plain_lately():
            if not self._decide(b):
                return plain, "slower"
            self._wanted(req_ids, b)
            return [self.k] * len(req_ids), ""  # a drafting burst asks every request
        want = None if b.burst_unread() else self._wanted(req_ids, b)
        if not self._decide(b):
            return plain, "warmup" if not b.decided else ("remeasure" if b.winner else "slower")
        if want is None:  # (rare: a burst's later steps are plain whatever the rates, unless a stale loser's
            # re-measurement moved the gap and ended the burst early)
            want = self._wanted(req_ids, b)
        if b.exploring:
            return [self.k] * len(req_ids), ""
        if not any(want):
            return plain, "no_gain"
        if remaining is not None and not self._probe(req_ids) and not self.pays_at_end(b, req_ids, remaining):
            return plain, "batch_end"
        return want, ""

    def _probe(self, req_ids: list[str]) -> bool:
        """Whether the batch is fresh and unmeasured: none of its requests is behind (:attr:`_behind`: none had a
        plain step) or has drafted (its own estimates in :attr:`_end`). Such a batch drafts its first step where
        drafting wins, whatever the end rule would read from the method-wide estimates alone: those mix every
        earlier request, and on calls of repeated prompts, whose repeats suffix drafts almost wholly from the global
        tree, they can keep batch after batch plain to its end without ever measuring its requests (H100, s41, batch
        8, T = 0: suffix's auto 0.96x, 99% of its steps plain, 70% of them by the end rule, where fixed k ran 1.40x;
        ``benchmarks/policy_calls_sim.py --acc-repeat``, one seed in five: 0.82x the time of every step plain
        against 0.71x with the probe). One drafting step gives the end rule the batch's own pooled mean."""
        if self._behind:
            return False
        end = self._end
        return not any(r in end for r in req_ids)

    def would_draft(self, req_ids: list[str], sampled: bool = False, remaining: Sequence[int] | None = None
                    ) -> bool:
        """Whether :meth:`plan` called now for ``req_ids`` would let any request draft, without counting a decision
        or changing any estimate (the engine asks before the step's outcome is observed, to queue the next step
        ahead when it will be plain; the outcome may still tip the real plan, and the queued step is dropped).
        True for a batch size whose bucket does not exist yet (it is made, and may warm up, at :meth:`plan`)."""
        b = self._tables(sampled)[0].get(self.bucket(len(req_ids)))
        if b is None:
            return True
        if self._fast and self._plain_sure(b, b.decisions + 1):
            return False
        if b.burst_unread():  # a burst's later plain step (plain whatever the rates; a rare stale-loser re-plan
            return False  # may still draft: the step queued ahead is then dropped)
        if b.plain_regardless() or b.plain_lately(ahead=1):  # what _decide would do, read only: a drafting burst
            return b.bursting(b.since + 1)  # is due, or not
        c = copy.copy(b)  # shallow: _decide assigns scalars only
        c.decisions += 1  # as plan counts it first
        return any(self._widths(c, req_ids, remaining)[0])

    def _wanted(self, req_ids: list[str], b: _Bucket) -> list[int]:
        """k for each request whose expected accepted drafts reach :data:`MIN_GAIN`, else 0; their share is the
        bucket's :attr:`_Bucket.now`."""
        want = [self.k if self._gain(r) >= MIN_GAIN else 0 for r in req_ids]
        b.now = sum(1 for w in want if w) / len(req_ids)
        b.read_at = b.decisions
        if not b.empty:  # no drafting step has drafted nothing: the chance is not read (rate, _mixed)
            b.found = None
            return want
        miss, last, sampled = 1.0, self._found_last, self._sampled
        for r, w in zip(req_ids, want):
            if w:
                miss *= 1.0 - self._found_chance(last.get(r), sampled.get(r, False))
                if miss < 1e-4:  # some request gets drafts, all but surely
                    break
        b.found = 1.0 - miss  # that any of them gets drafts
        return want

    def _found_chance(self, last: tuple[int, int] | None, kind: bool) -> float:
        """The chance that asking a request for drafts now gets some, from its last ask (``last``: got drafts,
        at which step) and the method-wide chances after an ask that got none / some (``f0``, ``f1``), a
        two-state chain: n steps on, ``pi + (f_last - pi) * (f1 - f0) ** n`` with ``pi = f0 / (1 - f1 + f0)``."""
        f0, f1 = self._found_after[kind]
        pi = f0 / max(1.0 - f1 + f0, 1e-12)
        if last is None:
            return pi
        lam = f1 - f0
        n = self._steps - last[1]  # steps since the one after that ask
        return pi + ((f1 if last[0] else f0) - pi) * (lam ** n if lam > 0 else float(n == 0))

    def pays_at_end(self, b: _Bucket, req_ids: list[str], remaining: Sequence[int]) -> bool:
        """With nothing waiting to join, the batch (and the call that holds it) ends with its longest request, not
        at the rate of all its tokens: drafting pays only if that request's tokens per step, ``1 + e`` (``e`` its
        expected accepted drafts as :meth:`end_gains` estimates them; the least of those within :data:`END_SHARE` of
        the most tokens left), beat the bucket's drafting step over its plain step. Requests drafting at different
        rates leave a fixed batch ragged, its last steps at a few rows (on the CPU at batch 8, repeated prompts,
        ngram: 26 steps a pass at one row, and 0.86x of the baseline while each drafting step at 8 rows gave 7% more
        tokens per second than a plain one). After plain steps of running requests (:attr:`_behind`), the drafting
        step also pays the switch into drafting (its extra time averaged over that request's steps left), so a
        batch's tail does not go back and forth between the modes (H200, eagle3, batch 8: 197 of 220 plain steps at
        the end of batches, and 0.72x of the baseline). True while the bucket has not timed both modes, and for one
        request (whose bucket measures just that request's steps: the rule above would only add the noise of its
        per-request estimate) unless it owes a switch: then the time drafting saves over its tokens left, at the
        bucket's rates, must pay the switch."""
        owes = self._last_mode == 0 and bool(self._behind)  # a switch into drafting is due (a catch-up)
        long_run = owes and self._plain_steps >= LONG_RUN
        if not b.ready() and not (long_run and b.seeded):
            return True  # (a seeded bucket decides on its neighbour's rates when a long run's switch is at stake:
            # drafting at once in each new bucket of a shrinking batch paid that switch once per bucket)
        if len(remaining) < 2:
            if not owes or not remaining:
                return True
            # after plain steps, the time drafting saves over its tokens left (at the bucket's two rates, as the
            # rule reads them) must pay the switch: a batch's last request went back to drafting for a few tokens
            # after the batch's plain end, each such switch ~2-3 ms (H200, eagle3, batch 8)
            r0, r1 = b.rate(0), b.rate(1)
            return r1 <= r0 or remaining[0] * b.size * (1.0 / r0 - 1.0 / r1) >= self._switch_cost(b)
        most = max(remaining)
        gains = self.end_gains(req_ids)
        e = min(g for g, n in zip(gains, remaining) if n >= END_SHARE * most)
        # each request's drafting steps left; the last to finish no sooner than the longest ones' least gain says
        steps = [n / (1.0 + g) for g, n in zip(gains, remaining)]
        last = max(range(len(steps)), key=steps.__getitem__)
        steps[last] = max(steps[last], most / (1.0 + e))
        # after plain steps drafting first pays its switch (a skipped proposer's catch-up), once for the rest of
        # the batch
        switch = self._switch_cost(b) if owes else 0.0
        t0, t1 = b.seconds[0], b.spent(1)
        alone = t0 / t1 * remaining[last] / steps[last] if t1 > 0.0 and steps[last] > 0.0 else 1.0
        drafting = t1 * self._shrinking(b, steps, alone)
        return drafting + switch <= t0 * self._shrinking(b, remaining)

    def _shrinking(self, b: _Bucket, steps: Sequence[float], alone: float = 1.0) -> float:
        """The time, in steps of bucket ``b``'s batch, of a batch whose requests leave after ``steps`` steps each:
        each stretch between two leavings at the step time of the bucket of the requests still running over ``b``'s
        (:meth:`_rows_scale`); the last request's stretch alone at ``alone`` times that if less (it may go on
        plain: its own bucket decides then). A step of fewer rows costs less on a CPU (tiny pair, ngram, batch 8: a
        plain step 7.6 ms, at 4 rows 4.9), so drafting that ends most requests early pays there even while the
        longest one sets the batch's end; on a GPU's small batches it costs about the same."""
        order = sorted(steps)
        total, done, n = 0.0, 0.0, len(order)
        for i, s in enumerate(order):
            if s > done:
                f = self._rows_scale(b.size, self.bucket(n - i))
                total += (s - done) * f * (min(1.0, alone) if i == n - 1 else 1.0)
                done = s
        return total

    def _rows_scale(self, size: int, smaller: int) -> float:
        """A step's time in bucket ``smaller`` over one in bucket ``size``, from :attr:`_rows_ratio` (each halving's
        learned ratio, multiplied), or 1 where a halving is not yet timed or the product is within
        :data:`ROWS_CHEAPER` of 1 (noise)."""
        f = 1.0
        while smaller < size:
            size //= 2
            r = self._rows_ratio.get(size)
            if r is None:
                return 1.0
            f *= r
        return f if f < ROWS_CHEAPER else 1.0

    def _rows_pair(self, size: int, mode: int, seconds: float) -> None:
        """A timed step of ``mode`` in bucket ``size``: if the step before it was of the same mode in the bucket
        twice its size (a request left), their ratio enters :attr:`_rows_ratio` (in log, weight :data:`ALPHA`). Two
        steps in a row see the machine in the same state: the buckets' own averages, timed at other times, do not
        (the H100's stalls raise a full batch's plain average by a third, and its batch-end buckets, timed between
        them, read 0.6 of it in a simulation where rows cost nothing)."""
        prev, self._prev_step = self._prev_step, (size, mode, seconds)
        if prev[0] == 2 * size and prev[1] == mode >= 0 and prev[2] > 0.0 and seconds > 0.0:
            x = math.log(seconds / prev[2])
            r = self._rows_ratio.get(size)
            self._rows_ratio[size] = math.exp(x if r is None else math.log(r) + ALPHA * (x - math.log(r)))

    def end_gains(self, req_ids: list[str]) -> list[float]:
        """Each request's expected accepted drafts a drafting step, as the end rule (:meth:`pays_at_end`) reads them:
        empirical Bayes over the batch. A request's own mean ``m_r`` over its last :data:`END_WINDOW` drafting steps
        (``n_r`` of them, weighted) is noisy (0 .. k drafts a step), and the batch's requests differ by less than
        that noise or more: with ``g`` the batch's pooled mean (the method-wide expected gain worth
        :data:`END_PRIOR` steps in it), ``v`` the pooled variance of a step within a request, and ``tau`` the
        variance of the requests' means beyond their noise ``v / n_r`` (from requests with at least
        :data:`END_MIN_STEPS` steps, once :data:`END_MIN_REQUESTS` have them; else 0), the estimate is
        ``g + tau / (tau + v / n_r) * (m_r - g)``: the pooled mean for requests alike (whatever their luck so far),
        nearly their own for a request that is truly apart (a lookup method that finds nothing in its text).

        Steps count as independent only as far as they are: with ``rho`` the batch's pooled correlation of a
        request's accepted drafts with its step before (about the request's own mean, from requests counted
        apart, worth :data:`END_PRIOR` pairs of no correlation, less two standard errors ``2 / sqrt(pairs)`` so
        that independent steps read 0 all but by chance; clamped to 0 .. :data:`END_RHO_MAX`), each request's
        ``n_r`` above is ``n_r (1 - rho) / (1 + rho)`` (not the pooled mean's ``n``: faded towards the method-wide
        prior, a batch whose prior sat under its own mean stayed plain in the simulation). A lookup method's
        acceptance comes in stretches: five steps without a match early in a response said little of its later
        text, yet kept it apart at ~0.6 drafts a step against the batch's 2.4 and the batch's last 45 steps plain
        (CPU, tiny pair, suffix, e2e's completion prompts: auto 1.06x against the rule before s36's 1.16x); a
        head's steps are about independent and keep the plain estimate. Such a response's acceptance also changes
        over its text (an edit copies a passage, then writes its own), which the end rule, keeping the batch plain,
        would never see again: over a run of plain steps each ``n_r`` is further multiplied by
        ``(1 - rho / END_FADE) ** run`` (the run counted in steps of :data:`END_FADE_EVERY`), so a request kept
        apart by correlated steps returns towards the pooled mean, and drafting, which measures it again.
        Independent steps (``rho`` 0) do not fade: a request that truly accepts nothing keeps the batch plain to its
        end."""
        kind = self._kind(req_ids[0]) if req_ids else False
        cached = self._end_cache
        at = self._plain_steps // END_FADE_EVERY
        if cached is not None and cached[0] == kind and cached[2] in (None, at) and cached[1] == req_ids:
            return cached[3]  # nothing it reads changed since (a plain run's steps that the end rule decided)
        gain = _chain_gain(self._global[kind])
        stats = [self._end.get(r) for r in req_ids]
        lags = self._lag
        n_all = s_all = ss = df = m1 = m2 = inv = pairs = cov = 0.0
        c = 0  # requests that count apart: their mean's sum, sum of squares, and the sum of their 1 / n
        for r, st in zip(req_ids, stats):
            if st is not None:
                n, s, q = st
                n_all += n
                s_all += s
                if n >= END_MIN_STEPS:
                    m = s / n
                    ss += max(0.0, q - s * m)
                    df += n - 1.0
                    m1 += m
                    m2 += m * m
                    inv += 1.0 / n
                    c += 1
                    lag = lags.get(r)
                    if lag is not None:
                        pairs += lag[0]
                        cov += lag[1] - lag[0] * m * m
        g = (s_all + END_PRIOR * self._made_global[kind] * gain) / (n_all + END_PRIOR)
        gains = [g] * len(req_ids)
        rho = 0.0
        if c >= END_MIN_REQUESTS:
            v = (ss + END_PRIOR * END_PRIOR_VAR) / (df + END_PRIOR)
            # (less two standard errors: independent steps read 0 all but by chance)
            rho = min(max(cov / (pairs + END_PRIOR) / v - 2.0 / math.sqrt(pairs + END_PRIOR), 0.0), END_RHO_MAX)
            f = (1.0 - rho) / (1.0 + rho) * (1.0 - rho / END_FADE) ** (at * END_FADE_EVERY)  # what a step counts for
            tau = (m2 - m1 * m1 / c) / (c - 1) - v * inv / (f * c)  # the means' spread beyond their noise
            if tau > 0.0:
                for i, st in enumerate(stats):
                    if st is not None and st[0] >= END_MIN_STEPS:
                        gains[i] = g + tau / (tau + v / (f * st[0])) * (st[1] / st[0] - g)
        # independent steps do not fade: their answer holds for the whole plain run (None: any fade step)
        self._end_cache = (kind, list(req_ids), at if rho > 0.0 else None, gains)
        return gains

    def _switch_cost(self, b: _Bucket) -> float:
        """What switching into drafting now costs on bucket ``b`` after the plain steps in a row so far
        (:meth:`_Bucket.switch_into_drafting`); where ``b`` has timed no such switch (none at all, or none after a
        long run where this is one), the largest any bucket timed (the proposer's catch-up is the engine's: a batch
        shrinking through new buckets meets it in each)."""
        run = self._plain_steps
        own = b.switch_into_drafting(run)
        if own and (run < LONG_RUN or b.switch_long):
            return own
        return max([own] + [c.switch_into_drafting(run) for t in (self.cost, self.cost_sampled) for c in t.values()])

    @staticmethod
    def _decide(b: _Bucket) -> bool:
        """Mode 1 (drafting; whole trees) or mode 0 (plain; chains) for this step of bucket ``b``;
        ``b.exploring``: mode 1 chosen by the warm-up or by a re-measurement burst, not as the winner."""
        b.exploring = False
        if not b.decided and b.count[0] < MIN_PLAIN:
            return False  # the warm-up: mode 0 first (plain: exactly a token a request, few steps measure it)...
        if not b.decided and not b.clear():
            b.exploring = True
            return True  # ...then mode 1, until its rate is clearly above or below mode 0's
        b.decided = True
        rates = (b.rate(0), b.rate(1))
        winner = int(rates[1] >= rates[0])
        if b.winner >= 0 and winner != b.winner and rates[winner] <= rates[b.winner] * (1 + b.margin(winner)):
            winner = b.winner  # not faster by enough to pay for switching
        if winner != b.winner and b.stale_loser():
            winner = b.winner  # the loser's time is from before the winner's changed: re-measured first, and soon
            if b.pending < 0:  # if it still wins STALE_WAIT decisions on (a stretch of slow steps is over by then:
                b.pending = b.since + STALE_WAIT  # the burst would only cost)
            elif b.since >= b.pending:
                b.gap, b.pending, b.paired = min(b.gap, b.since), -1, True
        else:
            b.pending = -1
        if winner != b.winner:
            first = b.winner < 0
            b.winner, b.since = winner, 0
            b.ref = b.seconds[winner]  # (the old winner, the loser now, was timed up to now)
            # a seeded bucket re-measures its loser soon: the neighbour's ratio need not hold at this size
            b.gap = max(GAP_FIRST, b.next_gap() // 4) if first and b.seeded else b.next_gap()
        b.since += 1
        burst = b.bursting(b.since)
        if b.since == b.gap + 1:
            b.begin_burst()
        if b.since > b.gap + BURST[1 - winner]:  # a re-measurement of the losing mode is over: later again
            b.since, b.gap = 1, b.next_gap()
        b.exploring = burst and not winner
        return bool(winner) != burst  # the losing mode for a burst after each gap

    def _bucket_for(self, batch_size: int, table: dict[int, _Bucket] | None = None) -> _Bucket:
        """The bucket of a batch in ``table`` (default :attr:`cost`), made on first use: from the nearest bucket
        past its warm-up with both modes measured when there is one (tokens per request as there; see
        :meth:`_Bucket.add` for the times), so a batch size seen rarely (the tail of a run) does not spend its
        steps warming up; else empty, to be warmed up."""
        table = self.cost if table is None else table
        size = self.bucket(batch_size)
        b = table.get(size)
        if b is None:
            b = table[size] = _Bucket(size=size)
            ready = [n for n, c in table.items() if c.ready()]
            if ready:
                near = min(ready, key=lambda n: (abs(n - size), -n))
                c = table[near]
                b.tokens = [t * size / near for t in c.tokens]  # plain: exactly `size`
                b.seconds, b.empty = list(c.seconds), c.empty
                b.share = c.share
                b.seeded = b.decided = True
        return b

    def observe(self, req_ids: list[str], drafted: list[int], accepted: list[int], seconds: float,
                tree: bool | None = None, sampled: bool = False, unpiped: bool = False) -> None:
        """The step's outcome: drafts each request made and how many were accepted, and the step's wall time;
        ``tree``: for a tree proposer's drafting step, whether whole trees were verified (else their chains);
        ``sampled``: as given to :meth:`plan`; ``unpiped``: a plain step that would have queued the next step
        ahead (``LLM(overlap_steps=True)``) but did not, the next step drafting: not timed as a plain step (a
        plain run's steps overlap their host work with the device's; this one ran alone, and timed, it made the
        plain mode look slow exactly where the two modes alternate: 0.92 ms a plain step at batch 8 on the H200
        against the baseline's 0.53, and drafting chosen at 0.56x of it); what it took beyond a plain step is
        counted in the next switch into drafting."""
        self._gains.clear()
        self._gains_kept = False
        b = self._planned_bucket(sampled) if self._fast and not unpiped else None
        if (b is not None and self._planned is self._plain_plan and req_ids == self._plan_ids
                and b.last == 0 == self._last_mode and not b.settling):
            # a plain step in a plain run, as planned: what the full way below does for it
            rows = len(req_ids)
            b.add(0, (rows + sum(accepted)) * b.size / rows, seconds, self._step_share)
            self._rows_pair(b.size, 0, seconds)
            self._steps += 1
            self.stats.steps_plain += 1
            self.stats.rows += rows
            self._count_plain(req_ids)
            return
        cost, shape = self._tables(sampled)
        if self._planned is self._plain_plan and req_ids == self._plan_ids:  # as planned: a plain step
            planned, mode = [], 0
        else:
            planned = [self._planned.get(r, 0) for r in req_ids]
            mode = int(any(planned))
        empty = mode and not any(drafted)  # asked, and the proposer drafted for nobody
        rows = len(req_ids)
        if mode and not empty and self.trees and tree is not None:  # chains against trees: nothing to settle after
            # a switch
            s = self._bucket_for(rows, shape)
            s.last = int(tree)
            s.add(int(tree), (rows + sum(accepted)) * s.size / rows, seconds)
            self.stats.steps_tree += int(tree)
        b = self._bucket_for(len(req_ids), cost)
        # The first steps after a switch carry the switch's cost (a skipped proposer's catch-up): not timed. A
        # switch is the engine's, not the bucket's: a batch that shrank during a plain run drafts next in another
        # bucket (or a new one), and that step's catch-up of the whole plain run is no drafting step's usual cost
        # (timed, it set spec steps at 3.4-6.2 ms in buckets 1-4 against 1.9 ms at 8, H200, eagle3, batch 8). A
        # switch is learned only with running requests behind (:attr:`_behind`): fresh requests after a batch that
        # ended plain owe no recompute (their first drafting step, learned as a long run's switch, pulled switch_long
        # to nothing), and that step carries their start, which every way of drafting pays once (suffix's own tree
        # over each prompt, built at a request's first draft since s40; a head's catch-up over the prompt), not a
        # return from plain steps: learned as one, it was charged to every later return of running requests, which
        # do not pay it.
        if (b.last >= 0 and mode != b.last) or (self._last_mode >= 0 and mode != self._last_mode):
            b.settling, b._extra = SETTLE[mode], (self._unpiped_extra if mode else 0.0)
            b._long = bool(mode) and self._plain_steps >= LONG_RUN
            b._fresh = bool(mode) and not self._behind
        b.last = self._last_mode = mode
        if mode:
            self._unpiped_extra = 0.0
        if not mode and unpiped and not b.settling:
            if b.count[0]:
                self._unpiped_extra += max(0.0, seconds - b.seconds[0])
        elif b.settling:
            b.settling -= 1
            usual = b.empty if empty else b.seconds[mode]
            if usual and (b.count[mode] or empty):  # what the switch added to this mode's usual step
                b._extra += max(0.0, seconds - usual)
                if not b.settling and not b._fresh:  # (a bare run's recompute, ~15 ms on the H200, after early
                    # switches of ~1 ms: clipped each time, the estimate took ~8 switches to get there; hence also
                    # switch_long)
                    b.switch[mode] = b.learned(b.switch[mode], b._last_extra[mode], b._extra)
                    b._last_extra[mode] = b._extra
                    if mode and b._long:
                        b.switch_long = b.learned(b.switch_long, b._last_long, b._extra)
                        b._last_long = b._extra
        elif empty:
            b.add_empty(seconds)
        else:  # tokens per request, at the bucket's nominal batch size
            b.add(mode, (rows + sum(accepted)) * b.size / rows, seconds, self._step_share)
        self._rows_pair(b.size, -1 if unpiped else 2 if empty else mode, seconds)
        self._steps += 1
        if mode:
            self.stats.steps_drafted += 1
        else:
            self.stats.steps_plain += 1
        self.stats.rows += len(req_ids)
        if not mode:
            self._count_plain(req_ids)
            return
        acc_of, made_of, sampled_of, drift = self._acc, self._made, self._sampled, self._drift
        if self._run_steps:
            self._flush_run()
        self._plain_steps = 0
        self._end_cache = None
        self._behind.clear()  # the proposer catches up on every running request at a drafting step...
        self._run = []  # ...and the next plain step's requests fall behind again (_count_plain)
        for r in list(drift):  # the method-wide estimates change below: every pending drift applied first
            self._catch_up(r)
        # This loop runs for every request every drafting step: what it reads is bound to locals once (at batch 8
        # it was ~40 us of a drafting step's host time, on a GPU ~0.8-1.5 ms, with plan's ~40; s41)
        glob, made_glob, end, lags, found_last, found_after = (self._global, self._made_global, self._end, self._lag,
                                                                self._found_last, self._found_after)
        step, k, rows_drafted = self._steps, self.k, 0
        # the next plan's expected gains, each request's from its own estimates as this loop leaves them (every
        # request of the step has them, and no drift): as expected_gain computes them
        gains = self._gains if self._fast else {}
        for r, want, made, ok in zip(req_ids, planned, drafted, accepted):
            kind = sampled_of.get(r, False)  # self._kind(r), inlined
            prior, made_prior = glob[kind], made_glob[kind]
            acc = acc_of.get(r)
            if acc is None:
                acc = acc_of[r] = list(prior)
            if not want:
                acc[:] = [a + RECOVER * (g - a) for a, g in zip(acc, prior)]
                m = made_of.get(r, made_prior)
                m = made_of[r] = m + RECOVER * (made_prior - m)
                gains[r] = m * _chain_gain(acc)
                continue
            rows_drafted += 1
            st = end.get(r)
            end[r] = ((1.0, 0.0 + ok, 0.0 + ok * ok) if st is None
                      else (_KEEP * st[0] + 1.0, _KEEP * st[1] + ok, _KEEP * st[2] + ok * ok))
            lag = lags.get(r)
            lags[r] = (0.0, 0.0, ok) if lag is None else (_KEEP * lag[0] + 1.0, _KEEP * lag[1] + ok * lag[2], ok)
            got = 1.0 if made else 0.0
            m = made_of.get(r, made_prior)
            m = made_of[r] = m + ALPHA * (got - m)
            last = found_last.get(r)
            if last is not None and last[1] == step - 1:  # asked in the step before too
                after = found_after[kind]
                after[last[0]] += ALPHA_GLOBAL * (got - after[last[0]])
            found_last[r] = (int(got), step)
            made_glob[kind] += ALPHA_GLOBAL * (got - made_prior)
            gain, p = 0.0, 1.0
            for i in range(k):  # positions whose outcome is known updated; the chain's gain (_chain_gain) read
                a = acc[i]
                if i < ok + 1 and i < made:
                    hit = 1.0 if i < ok else 0.0
                    a = acc[i] = a + ALPHA * (hit - a)
                    prior[i] += ALPHA_GLOBAL * (hit - prior[i])
                p *= a
                gain += p
            gains[r] = m * gain
        self.stats.rows_drafted += rows_drafted
        self._gains_kept = self._fast

    def _count_plain(self, req_ids: list[str]) -> None:
        """A plain step: every request drifts; counted for the batch (:meth:`_flush_run`), applied when read
        (:meth:`_catch_up`)."""
        if req_ids != self._run:
            if self._run_steps:
                self._flush_run()
            self._run = list(req_ids)
            self._behind.update(req_ids)  # (once a batch: the same batch's next plain steps add no one)
        self._run_steps += 1
        self._plain_steps += 1

    def cost_table(self, sampled: bool = False) -> dict[int, dict[str, float]]:
        """What the rule reads, per batch-size bucket (of greedy batches, or with ``sampled`` of batches holding a
        sampled request): timed steps, mean tokens and milliseconds per step, and tokens per second of each mode
        (``plain_*``, ``spec_*``), the learned extra milliseconds of a switch into each mode (``plain_switch_ms``,
        ``spec_switch_ms``: a skipped proposer's catch-up; ``spec_switch_long_ms`` after :data:`LONG_RUN` or more
        plain steps), the drafting steps that drafted nothing apart
        (``spec_empty_steps``, ``spec_empty_ms``; ``spec_*`` are those that drafted something) and the last batch's
        chance of drafting anything (``spec_found``, mixing the two into ``spec_tok_s``), the timed steps whose time
        was clipped as a one-off stall (``clipped_steps``, :data:`STEP_CLIP`), and ``spec_over_plain``,
        the ratio of the two rates (above 1: drafting wins; 0 while a mode has no estimate)."""
        table = {}
        for size, b in sorted(self._tables(sampled)[0].items()):
            row: dict[str, float] = {}
            for mode, name in enumerate(("plain", "spec")):
                row.update({f"{name}_steps": b.count[mode], f"{name}_tokens": round(b.tokens[mode], 3),
                            f"{name}_ms": round(b.seconds[mode] * 1e3, 4), f"{name}_tok_s": round(b.rate(mode), 1),
                            f"{name}_switch_ms": round(b.switch[mode] * 1e3, 4)})
            row["spec_switch_long_ms"] = round(b.switch_long * 1e3, 4)
            row.update(spec_empty_steps=b.empties, spec_empty_ms=round(b.empty * 1e3, 4),
                       spec_found=round(1.0 if b.found is None else b.found, 4), clipped_steps=b.clipped)
            ready = all(b.seconds)  # measured here or seeded from a neighbouring bucket
            row["spec_over_plain"] = round(b.rate(1) / b.rate(0), 4) if ready and b.rate(0) > 0 else 0.0
            table[size] = row
        return table

    def _flush_run(self) -> None:
        """Count the plain steps in a row of one batch (:attr:`_run_steps` of :attr:`_run`) as each of its requests'
        drift (:attr:`_drift`; a request's estimates start from the method-wide ones of its kind at its first plain
        step). A plain step adds one to the batch's count, not to every request's: at batch 32 the loop over the
        requests was a third of the policy's host time a plain step. Exact, as the count is flushed before anything
        reads the drift or changes what it starts from (a kind, the method-wide estimates) and whenever the batch
        changes."""
        n, self._run_steps = self._run_steps, 0
        acc_of, made_of, sampled_of, drift = self._acc, self._made, self._sampled, self._drift
        for r in self._run:
            if r not in acc_of:
                kind = sampled_of.get(r, False)
                acc_of[r], made_of[r] = list(self._global[kind]), self._made_global[kind]
            drift[r] = drift.get(r, 0) + n

    def forget(self, req_id: str) -> None:
        """Drop a finished request's estimates."""
        if self._run_steps:
            self._flush_run()
        self._run, self._plan_ids = [], []
        self._acc.pop(req_id, None)
        self._end.pop(req_id, None)
        self._lag.pop(req_id, None)
        self._end_cache = None
        self._behind.discard(req_id)
        self._drift.pop(req_id, None)
        self._gains.pop(req_id, None)
        self._planned.pop(req_id, None)
        self._made.pop(req_id, None)
        self._found_last.pop(req_id, None)
        self._sampled.pop(req_id, None)

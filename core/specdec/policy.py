"""The speculation policy: per step, whether to draft, and for which requests (issue 24).

Fixed-k speculation pays for drafting and for k + 1 verify rows per request every step whatever the drafts are
worth; at a low acceptance (sampling at T = 0.8, a weak head, a contended CPU) that made steps slower than plain
decoding (0.72x on the H200). ``speculation_policy="auto"`` drafts only where it is expected to pay:

- **Throughput per mode**, per batch-size bucket (powers of two): tokens emitted and wall time of the decode
  steps that drafted (``spec``: propose, verify of the drafts, bookkeeping, including steps where the proposer
  found nothing) and of those that did not (``plain``), as running means, then exponential averages (weight
  :data:`ALPHA_COST`);
  their ratios are the two modes' tokens per second. The first :data:`SETTLE` steps after a switch of mode are
  not timed (they carry the switch: a skipped proposer catching up, its weights back into cache). The first
  bucket starts with :data:`WARMUP` timed spec steps, then as many plain ones; a later bucket starts from the
  nearest warmed-up bucket's estimates (tokens scaled by batch size) instead; afterwards the losing mode runs for a
  burst (:data:`BURST`) after every gap of decisions (:data:`GAP_FIRST`, doubling up to :data:`GAP_MAX`, or up
  to :data:`GAP_MAX_CLEAR` while the winner leads by :data:`CLEAR_MARGIN`; reset when the winner changes), so
  both estimates follow the machine's load (another process on the CPU, a longer context) at a cost of at most
  8 / GAP_MAX of the steps once the winner is stable.
- **Rule**: a step drafts iff the spec mode's tokens per second is at least the plain mode's; once a mode has
  won, the other must beat it by more than :data:`HYSTERESIS` to take over.
- **Per request**, within a drafting step: ``a[r][i]``, an exponential average (weight :data:`ALPHA`) of
  whether draft i was accepted given drafts 1..i-1 were (steps where the request got no draft tell nothing);
  new requests start from the method-wide average (weight :data:`ALPHA_GLOBAL`), and a request left out drifts
  back towards it (:data:`RECOVER` a step). A request whose expected accepted drafts
  ``e_r = sum_i prod_{m <= i} a[r][m]`` fall below :data:`MIN_GAIN` drafts nothing that step (its verify rows
  would be wasted).

Greedy output cannot change (only which tokens are drafted does), nor can seeded output (:mod:`specdec.keyed`).
Given the same cost table and acceptance history the decisions are the same: :meth:`SpeculationPolicy.plan`
reads no clock. A proposer that can miss steps (``Proposer.skippable``) is not called on plain steps (the hidden
states of those steps reach it at its next call); any other observes (``Proposer.observe``) or proposes, and its
drafts are dropped. ``"fixed"`` drafts k for every request every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SPECULATION_POLICIES", "SpeculationPolicy", "PolicyStats"]

SPECULATION_POLICIES = ("auto", "fixed")
ALPHA = 0.3
ALPHA_GLOBAL = 0.05
ALPHA_COST = 0.04  # a spec step's tokens vary (1 .. k + 1 a request): a long average
RECOVER = 0.05
MIN_GAIN = 0.1
WARMUP = 32  # timed steps of each mode (spec first) before the rule decides: enough to average a spec step's
# variable tokens, and runs this short decide by counts alone (no clock)
GAP_FIRST = 8  # decisions before the losing mode is re-measured, doubling after each re-measurement...
GAP_MAX = 128  # ...up to this; back to GAP_FIRST when the winner changes...
GAP_MAX_CLEAR = 512  # ...or up to this while the winner leads by CLEAR_MARGIN or more (less re-measuring)
CLEAR_MARGIN = 0.25
HYSTERESIS = 0.03  # the winner changes only when the other mode is faster by more than this share (noise
# near a tie would otherwise flip it, and each flip restarts the re-measurement gaps at GAP_FIRST)
BURST = (4, 8)  # consecutive steps of the losing mode per re-measurement: plain, spec...
SETTLE = (1, 3)  # ...of which the first ones after a switch are not timed: plain, spec (a skipped proposer
# catches up, and its weights come back into cache, over the first drafting steps after a plain run)
PRIOR = 0.6


@dataclass
class PolicyStats:
    """What the policy decided: decode steps that drafted / did not, and request rows that drafted out of all
    rows of decode steps."""

    steps_drafted: int = 0
    steps_plain: int = 0
    rows_drafted: int = 0
    rows: int = 0

    @property
    def drafted_step_share(self) -> float:
        """Share of decode steps that drafted (1.0 before any step)."""
        total = self.steps_drafted + self.steps_plain
        return self.steps_drafted / total if total else 1.0

    def as_dict(self) -> dict[str, float]:
        return {"steps_drafted": self.steps_drafted, "steps_plain": self.steps_plain,
                "rows_drafted": self.rows_drafted, "rows": self.rows,
                "drafted_step_share": round(self.drafted_step_share, 4)}


@dataclass
class _Bucket:
    tokens: list[float] = field(default_factory=lambda: [0.0, 0.0])  # averaged tokens per step: plain, spec
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])  # averaged seconds per step: plain, spec
    count: list[int] = field(default_factory=lambda: [0, 0])  # steps observed: plain, spec
    decisions: int = 0
    last: int = -1  # the mode of the bucket's last step
    run: int = 0  # consecutive steps in that mode
    winner: int = -1  # the mode the rule picked last
    gap: int = GAP_FIRST  # decisions between re-measurements of the losing mode
    since: int = 0  # decisions since the last re-measurement began
    seeded: bool = False  # started from a neighbouring bucket's estimates instead of a warm-up

    def ready(self) -> bool:
        """Both modes measured past the warm-up."""
        return min(self.count) >= WARMUP

    def rate(self, mode: int) -> float:
        """Tokens per second of ``mode`` (0 plain, 1 spec)."""
        return self.tokens[mode] / max(self.seconds[mode], 1e-12)

    def add(self, mode: int, tokens: float, seconds: float) -> None:
        self.count[mode] += 1
        w = max(ALPHA_COST, 1.0 / self.count[mode])  # the running mean, then an exponential average
        self.tokens[mode] += w * (tokens - self.tokens[mode])
        self.seconds[mode] += w * (seconds - self.seconds[mode])


@dataclass
class SpeculationPolicy:
    """Plans each decode step's drafts (:meth:`plan`) and learns from its outcome (:meth:`observe`).

    Attributes:
        k: drafts per request when a request drafts.
        cost: batch-size bucket -> step timings (a test or a tool may fill it to fix the decisions).
        stats: :class:`PolicyStats`.
    """

    k: int
    cost: dict[int, _Bucket] = field(default_factory=dict)
    stats: PolicyStats = field(default_factory=PolicyStats)
    _acc: dict[str, list[float]] = field(default_factory=dict)
    _global: list[float] = field(default_factory=list)
    _planned: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._global = [PRIOR] * self.k

    @staticmethod
    def bucket(batch_size: int) -> int:
        """The cost bucket of a batch: the smallest power of two >= its size."""
        b = 1
        while b < batch_size:
            b *= 2
        return b

    def expected_gain(self, req_id: str) -> float:
        """Expected accepted drafts of ``req_id`` drafting k now."""
        gain, p = 0.0, 1.0
        for a in self._acc.get(req_id, self._global):
            p *= a
            gain += p
        return gain

    def plan(self, req_ids: list[str]) -> list[int]:
        """Drafts each request may make this step (k or 0), in order."""
        want = [self.k if self.expected_gain(r) >= MIN_GAIN else 0 for r in req_ids]
        b = self._bucket_for(len(req_ids))
        b.decisions += 1
        if not any(want):
            draft = False
        elif b.count[1] < WARMUP and not b.seeded:
            draft = True
        elif b.count[0] < WARMUP and not b.seeded:
            draft = False
        else:
            rates = (b.rate(0), b.rate(1))
            winner = int(rates[1] >= rates[0])
            if b.winner >= 0 and winner != b.winner and rates[winner] <= rates[b.winner] * (1 + HYSTERESIS):
                winner = b.winner  # not faster by enough to switch
            if winner != b.winner:
                b.winner, b.gap, b.since = winner, GAP_FIRST, 0
            b.since += 1
            if b.since > b.gap + BURST[1 - winner]:  # a re-measurement of the losing mode is over: later again
                clear = rates[winner] >= rates[1 - winner] * (1 + CLEAR_MARGIN)
                b.since, b.gap = 1, min(2 * b.gap, GAP_MAX_CLEAR if clear else GAP_MAX)
            draft = bool(winner) != (b.since > b.gap)  # the losing mode for a burst after each gap
        widths = want if draft else [0] * len(req_ids)
        self._planned = dict(zip(req_ids, widths))
        return widths

    def _bucket_for(self, batch_size: int) -> _Bucket:
        """The cost bucket of a batch, made on first use: from the nearest bucket past its warm-up when there is
        one (tokens per step scaled by the batch size, step times as they are; each mode's first timed step
        here replaces them), so a batch size seen rarely (the tail of a run) does not spend its steps warming
        up; else empty, to be warmed up."""
        size = self.bucket(batch_size)
        b = self.cost.get(size)
        if b is None:
            b = self.cost[size] = _Bucket()
            ready = [n for n, c in self.cost.items() if c.ready()]
            if ready:
                near = min(ready, key=lambda n: (abs(n.bit_length() - size.bit_length()), n))
                c = self.cost[near]
                b.tokens = [t * size / near for t in c.tokens]
                b.seconds = list(c.seconds)
                b.seeded = True
        return b

    def observe(self, req_ids: list[str], drafted: list[int], accepted: list[int], seconds: float) -> None:
        """The step's outcome: drafts each request made and how many were accepted, and the step's wall time."""
        planned = [self._planned.get(r, 0) for r in req_ids]
        mode = int(any(planned))
        b = self._bucket_for(len(req_ids))
        # The first step after a switch carries the switch's cost (a skipped proposer's catch-up): not timed,
        # except while a mode has no estimate yet.
        b.run = b.run + 1 if mode == b.last else 1
        b.last = mode
        if b.run > SETTLE[mode] or (b.count[mode] == 0 and not b.seeded):
            b.add(mode, len(req_ids) + sum(accepted), seconds)
        if mode:
            self.stats.steps_drafted += 1
        else:
            self.stats.steps_plain += 1
        self.stats.rows += len(req_ids)
        for r, want, made, ok in zip(req_ids, planned, drafted, accepted):
            acc = self._acc.setdefault(r, list(self._global))
            if not want:
                for i in range(self.k):
                    acc[i] += RECOVER * (self._global[i] - acc[i])
                continue
            self.stats.rows_drafted += 1
            for i in range(min(ok + 1, made, self.k)):  # positions whose outcome is known
                hit = 1.0 if i < ok else 0.0
                acc[i] += ALPHA * (hit - acc[i])
                self._global[i] += ALPHA_GLOBAL * (hit - self._global[i])

    def cost_table(self) -> dict[int, dict[str, float]]:
        """What the rule reads, per batch-size bucket: timed steps, mean tokens and milliseconds per step, and
        tokens per second of each mode (``plain_*``, ``spec_*``), and ``spec_over_plain``, the ratio of the two
        rates (above 1: drafting wins; 0 while a mode has no estimate)."""
        table = {}
        for size, b in sorted(self.cost.items()):
            row: dict[str, float] = {}
            for mode, name in enumerate(("plain", "spec")):
                row.update({f"{name}_steps": b.count[mode], f"{name}_tokens": round(b.tokens[mode], 3),
                            f"{name}_ms": round(b.seconds[mode] * 1e3, 4), f"{name}_tok_s": round(b.rate(mode), 1)})
            ready = all(b.count)
            row["spec_over_plain"] = round(b.rate(1) / b.rate(0), 4) if ready and b.rate(0) > 0 else 0.0
            table[size] = row
        return table

    def forget(self, req_id: str) -> None:
        """Drop a finished request's estimates."""
        self._acc.pop(req_id, None)
        self._planned.pop(req_id, None)

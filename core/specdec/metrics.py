"""Acceptance metrics for speculative decoding: counts, a periodic log line, Prometheus counters.

`SpecDecodingStats` counts what the rejection sampler accepted; `SpecDecodingLogging` turns
accumulated stats into one log line every few seconds; `SpecDecodingProm` exports the same counts
as prometheus_client counters. The mean acceptance length is 1 + accepted / drafts: every verify
step of a drafted request yields its accepted drafts plus one recovered or bonus token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specdec.errors import check_int

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["SpecDecodingLogging", "SpecDecodingProm", "SpecDecodingStats", "StepTimer"]

logger = logging.getLogger("specdec.metrics")


@dataclass(slots=True)
class SpecDecodingStats:
    """Acceptance counts over any number of verify steps, for drafts of at most `num_spec_tokens`.

    Attributes:
        num_spec_tokens: k, the most draft tokens one request proposes per step.
        num_drafts: drafts verified (one per request per step that drafted at least one token).
        num_draft_tokens: draft tokens verified.
        num_accepted_tokens: draft tokens accepted (recovered and bonus tokens not included).
        num_accepted_tokens_per_pos: `[k]`; entry i counts drafts whose token at position i was
            accepted (so it only counts drafts that accepted positions 0..i).
    """

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_int("num_spec_tokens", self.num_spec_tokens, 0)
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens
        if len(self.num_accepted_tokens_per_pos) != self.num_spec_tokens:
            raise ValueError(
                f"num_accepted_tokens_per_pos has {len(self.num_accepted_tokens_per_pos)} entries: "
                f"expected num_spec_tokens={self.num_spec_tokens}."
            )

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one request's verify step: it drafted `num_draft_tokens`, the first
        `num_accepted_tokens` of which were accepted.

        A draft of 0 tokens (a request that proposed nothing this step) is not counted as a draft:
        it would pull the mean acceptance length and per-position rates towards plain decoding
        without saying anything about the drafter.

        Raises:
            ValueError: unless 0 <= num_accepted_tokens <= num_draft_tokens <= num_spec_tokens.
        """
        check_int("num_draft_tokens", num_draft_tokens, 0)
        check_int("num_accepted_tokens", num_accepted_tokens, 0)
        if num_draft_tokens > self.num_spec_tokens:
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} is invalid: it must be <= "
                f"num_spec_tokens={self.num_spec_tokens}."
            )
        if num_accepted_tokens > num_draft_tokens:
            raise ValueError(
                f"num_accepted_tokens={num_accepted_tokens} is invalid: it must be <= "
                f"num_draft_tokens={num_draft_tokens}."
            )
        self._count(num_draft_tokens, num_accepted_tokens)

    def observe_drafts(self, num_draft_tokens: list[int], num_accepted_tokens: list[int]) -> None:
        """:meth:`observe_draft` for a whole batch at once (one verify step of every request), with
        the same rules and errors; requests that drafted nothing are not counted."""
        if len(num_draft_tokens) != len(num_accepted_tokens):
            raise ValueError(f"got {len(num_draft_tokens)} draft counts and {len(num_accepted_tokens)} accepted "
                             "counts: give one of each per request.")
        k = self.num_spec_tokens
        for d, a in zip(num_draft_tokens, num_accepted_tokens):
            if type(d) is not int or type(a) is not int or not 0 <= a <= d <= k:  # noqa: E721 (bools are not counts)
                self.observe_draft(d, a)  # raises with the precise message
        for d, a in zip(num_draft_tokens, num_accepted_tokens):
            self._count(d, a)

    def _count(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Add one validated draft (nothing for a request that drafted nothing)."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafts: tokens produced per drafted verify step, the bonus token included.

        1.0 when nothing was drafted, the value of plain one-token-per-step decoding.
        """
        if self.num_drafts == 0:
            return 1.0
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / drafted tokens, in [0, 1]; 0.0 when nothing was drafted."""
        if self.num_draft_tokens == 0:
            return 0.0
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """`[k]`: for each position, the fraction of drafts that got it accepted; zeros without drafts."""
        if self.num_drafts == 0:
            return [0.0] * self.num_spec_tokens
        return [n / self.num_drafts for n in self.num_accepted_tokens_per_pos]

    def merge(self, other: SpecDecodingStats) -> SpecDecodingStats:
        """Add `other`'s counts into these, in place, and return self.

        Raises:
            ValueError: the two have different `num_spec_tokens` (per-position rates would mix).
        """
        if other.num_spec_tokens != self.num_spec_tokens:
            raise ValueError(
                f"cannot merge stats with num_spec_tokens={other.num_spec_tokens} into stats with "
                f"num_spec_tokens={self.num_spec_tokens}: they must be equal."
            )
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for pos, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[pos] += n
        return self

    def __add__(self, other: SpecDecodingStats) -> SpecDecodingStats:
        """A new stats object with the summed counts of both (see `merge`)."""
        if not isinstance(other, SpecDecodingStats):
            return NotImplemented
        return self.new_empty().merge(self).merge(other)

    def new_empty(self) -> SpecDecodingStats:
        """Zeroed stats with the same `num_spec_tokens`, e.g. to start a logging interval."""
        return SpecDecodingStats(self.num_spec_tokens)

    def reset(self) -> None:
        """Zero every count, in place."""
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens


class SpecDecodingLogging:
    """Accumulates stats between log lines and logs one line per interval.

    Args:
        log_fn: where `log()` writes its line by default; None means `logger.info` of the
            "specdec.metrics" logger.
        interval_s: seconds between lines written by `maybe_log()`.
        clock: the time source, seconds as float (injected by tests; `time.monotonic` otherwise).
    """

    def __init__(
        self,
        log_fn: Callable[[str], object] | None = None,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(interval_s, (int, float)) or interval_s < 0:
            raise ValueError(f"interval_s={interval_s!r} is invalid: it must be a number >= 0.")
        self.log_fn = log_fn
        self.interval_s = float(interval_s)
        self.clock = clock
        self.stats: SpecDecodingStats | None = None
        self.num_generated_tokens = 0
        self.last_log_time = clock()

    def observe(self, stats: SpecDecodingStats, num_generated_tokens: int | None = None) -> None:
        """Add one step's (or any batch of steps') stats; `num_generated_tokens`, when given, is
        the number of tokens the engine emitted over them (adds a generated throughput to the line).
        """
        if self.stats is None:
            self.stats = stats.new_empty()
        self.stats.merge(stats)
        if num_generated_tokens is not None:
            self.num_generated_tokens += check_int("num_generated_tokens", num_generated_tokens, 0)

    def log(self, log_fn: Callable[[str], object] | None = None) -> str | None:
        """Write the interval's line with `log_fn` (else the constructor's, else `logger.info`),
        start a new interval, and return the line.

        Throughputs are tokens over the seconds since the interval began. An interval in which
        nothing was drafted writes nothing and returns None, but still starts a new interval, so
        idle time does not dilute the next line's throughput.
        """
        now = self.clock()
        elapsed = max(now - self.last_log_time, 1e-9)
        stats = self.stats
        generated = self.num_generated_tokens
        self.last_log_time = now
        self.num_generated_tokens = 0
        if stats is None or stats.num_drafts == 0:
            return None
        self.stats = stats.new_empty()
        per_pos = ", ".join(f"{rate:.3f}" for rate in stats.acceptance_rate_per_pos)
        line = (
            f"SpecDecoding metrics: mean acceptance length: {stats.mean_acceptance_length:.2f}, "
            f"accepted throughput: {stats.num_accepted_tokens / elapsed:.1f} tokens/s, "
            f"drafted throughput: {stats.num_draft_tokens / elapsed:.1f} tokens/s, "
            f"accepted: {stats.num_accepted_tokens} tokens, drafted: {stats.num_draft_tokens} tokens, "
            f"per-position acceptance rate: {per_pos}, "
            f"avg draft acceptance rate: {stats.draft_acceptance_rate * 100:.1f}%"
        )
        if generated:
            line += f", generated throughput: {generated / elapsed:.1f} tokens/s"
        (log_fn or self.log_fn or logger.info)(line)
        return line

    def maybe_log(self) -> str | None:
        """`log()` if at least `interval_s` seconds passed since the interval began, else None."""
        if self.clock() - self.last_log_time < self.interval_s:
            return None
        return self.log()


_COUNTERS = {
    "specdec_num_drafts": "Number of drafts verified (requests that proposed at least one token).",
    "specdec_num_draft_tokens": "Number of draft tokens verified.",
    "specdec_num_accepted_tokens": "Number of draft tokens accepted.",
    "specdec_num_accepted_tokens_per_pos": "Number of drafts whose token at this position was accepted.",
}
_register_lock = threading.Lock()


def _counter(name: str, labelnames: tuple[str, ...], registry: CollectorRegistry) -> Any:
    """The Counter `name` of `registry`: the one already registered there, else a new one."""
    # Imported here: only SpecDecodingProm needs prometheus_client, and `import specdec` should not pay for it.
    from prometheus_client import Counter

    with _register_lock:
        # prometheus_client has no public lookup by name; a missing attribute means "create".
        existing = getattr(registry, "_names_to_collectors", {}).get(name)
        if existing is None:
            return Counter(name, _COUNTERS[name], labelnames, registry=registry)
    if not isinstance(existing, Counter) or tuple(getattr(existing, "_labelnames", ())) != labelnames:
        raise ValueError(
            f"metric {name!r} is already registered in this registry as {existing!r}: expected a "
            f"Counter with labels {list(labelnames)}."
        )
    return existing


class SpecDecodingProm:
    """Prometheus counters for acceptance, labelled `model_name` and `method`.

    Counters (prometheus_client exports each with a `_total` suffix, e.g. `specdec_num_drafts_total`):
    `specdec_num_drafts`, `specdec_num_draft_tokens`, `specdec_num_accepted_tokens` and
    `specdec_num_accepted_tokens_per_pos` (extra label `position`, "0" .. str(k - 1)).

    Args:
        num_spec_tokens: k; one `position` series is created per position, starting at 0.
        model_name: value of the `model_name` label.
        method: value of the `method` label (e.g. "ngram").
        registry: where the counters live; None means prometheus_client's global `REGISTRY`.
            Instances sharing a registry share its counters: a second instance reuses the counters
            the first registered (instead of failing with "Duplicated timeseries"), so their
            counts add up, per label values.
    """

    def __init__(
        self,
        num_spec_tokens: int,
        model_name: str,
        method: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.num_spec_tokens = check_int("num_spec_tokens", num_spec_tokens, 0)
        self._seen: dict[int, tuple[SpecDecodingStats, tuple[int, ...]]] = {}
        self._lock = threading.Lock()
        if registry is None:
            from prometheus_client import REGISTRY as registry
        self.registry = registry
        labels = {"model_name": str(model_name), "method": str(method)}
        names = ("model_name", "method")
        self.num_drafts = _counter("specdec_num_drafts", names, self.registry).labels(**labels)
        self.num_draft_tokens = _counter("specdec_num_draft_tokens", names, self.registry).labels(**labels)
        self.num_accepted_tokens = _counter("specdec_num_accepted_tokens", names, self.registry).labels(
            **labels
        )
        per_pos = _counter("specdec_num_accepted_tokens_per_pos", (*names, "position"), self.registry)
        self.num_accepted_tokens_per_pos = [
            per_pos.labels(**labels, position=str(pos)) for pos in range(num_spec_tokens)
        ]

    def observe(self, stats: SpecDecodingStats) -> None:
        """Increment every counter by what `stats` counted since this object last observed it.

        Delta-safe: observing the same cumulative stats object again (such as `LLM.stats` after
        each `generate`) adds only the counts made since, never the same drafts twice. A stats
        object seen for the first time counts in full; one whose counts went down since (it was
        `reset()`) counts from zero again. The last few stats objects observed are remembered.

        Raises:
            ValueError: `stats.num_spec_tokens` exceeds the k these counters were made for.
        """
        if stats.num_spec_tokens > self.num_spec_tokens:
            raise ValueError(
                f"stats.num_spec_tokens={stats.num_spec_tokens} is invalid: these counters have "
                f"num_spec_tokens={self.num_spec_tokens} positions."
            )
        now = _snapshot(stats)
        with self._lock:
            seen = self._seen.pop(id(stats), None)
            before = seen[1] if seen is not None and seen[0] is stats else None
            if before is None or any(b > n for b, n in zip(before, now)):
                before = (0,) * len(now)
            self._seen[id(stats)] = (stats, now)  # holding the object keeps its id from being reused
            while len(self._seen) > _REMEMBERED_STATS:
                self._seen.pop(next(iter(self._seen)))
        delta = [n - b for n, b in zip(now, before)]
        self.inc(delta[0], delta[1], delta[2], delta[3:])

    def inc(self, num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int,
            num_accepted_tokens_per_pos: list[int]) -> None:
        """Add these counts (one step's, say) to the counters as they are."""
        self.num_drafts.inc(num_drafts)
        self.num_draft_tokens.inc(num_draft_tokens)
        self.num_accepted_tokens.inc(num_accepted_tokens)
        for counter, n in zip(self.num_accepted_tokens_per_pos, num_accepted_tokens_per_pos):
            if n:
                counter.inc(n)


_REMEMBERED_STATS = 8  # stats objects SpecDecodingProm.observe keeps a snapshot of


def _snapshot(stats: SpecDecodingStats) -> tuple[int, ...]:
    return (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            *stats.num_accepted_tokens_per_pos)


class StepTimer:
    """Wall time per decode-step part, summed over steps (``totals`` in seconds, ``steps``), plus the
    prefills: ``prefill_seconds`` over ``prefills`` forwards admitting ``prefill_requests`` requests.
    ``rows``: running requests summed over decode steps (``rows / steps`` is the mean batch)."""

    PARTS = ("propose", "forward", "sample", "bookkeeping")

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.reset()

    def reset(self) -> None:
        """Zero every total and the step count."""
        self.totals = dict.fromkeys(self.PARTS, 0.0)
        self.steps = 0
        self.rows = 0
        self.prefill_seconds = 0.0
        self.prefills = 0
        self.prefill_requests = 0
        self._t = 0.0

    def start(self) -> None:
        if self.enabled:
            self._t = time.perf_counter()

    def lap(self, part: str, sync: torch.device | None = None) -> None:
        if not self.enabled:
            return
        if sync is not None and sync.type == "cuda":
            torch.cuda.synchronize(sync)
        now = time.perf_counter()
        self.totals[part] += now - self._t
        self._t = now

    def prefill_lap(self, num_requests: int) -> None:
        """End the timing of one prefill (started by :meth:`start`) of ``num_requests`` requests; it
        waits for the device, whose work the prefill's host read has already waited for."""
        if not self.enabled:
            return
        self.prefill_seconds += time.perf_counter() - self._t
        self.prefills += 1
        self.prefill_requests += num_requests

    def per_step_ms(self) -> dict[str, float]:
        """Mean milliseconds per step for each part."""
        return {k: 1000 * v / max(self.steps, 1) for k, v in self.totals.items()}

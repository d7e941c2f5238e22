"""Tests for specdec.metrics: stats arithmetic, the periodic log line and Prometheus counters."""

from __future__ import annotations

import logging

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from specdec.metrics import SpecDecodingLogging, SpecDecodingProm, SpecDecodingStats

LABELS = {"model_name": "tiny", "method": "ngram"}


def make_stats(k: int, drafts: list[tuple[int, int]]) -> SpecDecodingStats:
    stats = SpecDecodingStats(k)
    for drafted, accepted in drafts:
        stats.observe_draft(drafted, accepted)
    return stats


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- SpecDecodingStats ---------------------------------------------------------------------------


def test_new_stats_are_zero_with_k_positions():
    stats = SpecDecodingStats(4)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (0, 0, 0)
    assert stats.num_accepted_tokens_per_pos == [0, 0, 0, 0]
    assert stats.mean_acceptance_length == 1.0
    assert stats.draft_acceptance_rate == 0.0
    assert stats.acceptance_rate_per_pos == [0.0] * 4


def test_observe_draft_counts_and_per_position():
    stats = make_stats(3, [(3, 2), (3, 0), (2, 2), (3, 3)])
    assert stats.num_drafts == 4
    assert stats.num_draft_tokens == 11
    assert stats.num_accepted_tokens == 7
    # position 0 accepted in drafts 1, 3, 4; position 1 in 1, 3, 4; position 2 only in 4.
    assert stats.num_accepted_tokens_per_pos == [3, 3, 1]
    assert stats.acceptance_rate_per_pos == [0.75, 0.75, 0.25]
    assert stats.draft_acceptance_rate == pytest.approx(7 / 11)


def test_mean_acceptance_length_is_one_plus_accepted_over_drafts():
    stats = make_stats(5, [(5, 4), (5, 1), (3, 0)])
    assert stats.mean_acceptance_length == pytest.approx(1 + 5 / 3)
    assert make_stats(2, [(2, 2)]).mean_acceptance_length == 3.0
    assert make_stats(2, [(2, 0)]).mean_acceptance_length == 1.0


def test_zero_token_draft_is_not_a_draft():
    stats = make_stats(3, [(0, 0), (2, 1), (0, 0)])
    assert stats.num_drafts == 1
    assert stats.num_draft_tokens == 2
    assert stats.mean_acceptance_length == 2.0


@pytest.mark.parametrize(
    ("drafted", "accepted", "fragment"),
    [
        (4, 0, "num_draft_tokens=4 is invalid: it must be <= num_spec_tokens=3"),
        (2, 3, "num_accepted_tokens=3 is invalid: it must be <= num_draft_tokens=2"),
        (0, 1, "num_accepted_tokens=1 is invalid: it must be <= num_draft_tokens=0"),
        (-1, 0, "num_draft_tokens=-1 is invalid: it must be an int >= 0"),
        (2, -1, "num_accepted_tokens=-1 is invalid: it must be an int >= 0"),
        (2.0, 1, "num_draft_tokens=2.0 is invalid"),
    ],
)
def test_observe_draft_validation(drafted, accepted, fragment):
    stats = SpecDecodingStats(3)
    with pytest.raises(ValueError, match=fragment):
        stats.observe_draft(drafted, accepted)
    assert stats.num_drafts == 0 and stats.num_accepted_tokens_per_pos == [0, 0, 0]


@pytest.mark.parametrize(
    "drafted,accepted,fragment",
    [
        (4, 0, "num_draft_tokens=4 is invalid: it must be <= num_spec_tokens=3"),
        (2, 3, "num_accepted_tokens=3 is invalid: it must be <= num_draft_tokens=2"),
        (-1, 0, "num_draft_tokens=-1 is invalid: it must be an int >= 0"),
        (True, 0, "num_draft_tokens=True is invalid"),
    ],
)
def test_observe_drafts_validates_the_whole_batch_first(drafted, accepted, fragment):
    stats = SpecDecodingStats(3)
    with pytest.raises(ValueError, match=fragment):
        stats.observe_drafts([3, drafted], [1, accepted])
    assert stats.num_drafts == 0 and stats.num_accepted_tokens_per_pos == [0, 0, 0]  # nothing half-counted
    with pytest.raises(ValueError, match="got 2 draft counts and 1 accepted counts"):
        stats.observe_drafts([1, 1], [0])


def test_observe_drafts_equals_one_call_per_request():
    batch = [(3, 2), (0, 0), (3, 0), (2, 2), (3, 3), (1, 0)]
    one = SpecDecodingStats(3)
    one.observe_drafts([d for d, _ in batch], [a for _, a in batch])
    assert one == make_stats(3, batch)
    assert one.num_drafts == 5  # the request that drafted nothing is not a draft


def test_constructor_validation():
    with pytest.raises(ValueError, match="num_spec_tokens=-1 is invalid"):
        SpecDecodingStats(-1)
    with pytest.raises(ValueError, match="has 2 entries: expected num_spec_tokens=3"):
        SpecDecodingStats(3, num_accepted_tokens_per_pos=[1, 0])


def test_merge_add_reset_new_empty():
    a = make_stats(3, [(3, 1), (3, 3)])
    b = make_stats(3, [(2, 2)])
    total = a + b
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (3, 8, 6)
    assert total.num_accepted_tokens_per_pos == [3, 2, 1]
    assert (a.num_drafts, b.num_drafts) == (2, 1)  # __add__ leaves its operands alone

    assert a.merge(b) is a
    assert a == total

    empty = a.new_empty()
    assert empty == SpecDecodingStats(3)
    a.reset()
    assert a == SpecDecodingStats(3)

    with pytest.raises(ValueError, match="num_spec_tokens=2 into stats with num_spec_tokens=3"):
        a.merge(SpecDecodingStats(2))


# --- SpecDecodingLogging -------------------------------------------------------------------------


def test_log_line_numbers(caplog):
    clock = FakeClock()
    log = SpecDecodingLogging(clock=clock)
    log.observe(make_stats(3, [(3, 3), (3, 1)]))
    log.observe(make_stats(3, [(3, 2), (1, 0)]))
    clock.now += 2.0
    with caplog.at_level(logging.INFO, logger="specdec.metrics"):
        line = log.log()
    assert [r.getMessage() for r in caplog.records] == [line]
    assert caplog.records[0].name == "specdec.metrics"
    # 4 drafts, 10 drafted, 6 accepted; per position: [3, 2, 1] / 4.
    assert line == (
        "SpecDecoding metrics: mean acceptance length: 2.50, accepted throughput: 3.0 tokens/s, "
        "drafted throughput: 5.0 tokens/s, accepted: 6 tokens, drafted: 10 tokens, "
        "per-position acceptance rate: 0.750, 0.500, 0.250, avg draft acceptance rate: 60.0%"
    )


def test_log_resets_interval_and_adds_generated_throughput():
    clock = FakeClock()
    lines: list[str] = []
    log = SpecDecodingLogging(log_fn=lines.append, clock=clock)
    log.observe(make_stats(2, [(2, 2)]), num_generated_tokens=3)
    clock.now += 1.0
    log.log()
    assert lines[0].endswith("avg draft acceptance rate: 100.0%, generated throughput: 3.0 tokens/s")

    log.observe(make_stats(2, [(2, 0)]))
    clock.now += 4.0
    log.log()
    assert "accepted: 0 tokens, drafted: 2 tokens" in lines[1]
    assert "drafted throughput: 0.5 tokens/s" in lines[1]
    assert "generated throughput" not in lines[1]


def test_log_skips_when_nothing_drafted(caplog):
    clock = FakeClock()
    log = SpecDecodingLogging(clock=clock)
    with caplog.at_level(logging.INFO, logger="specdec.metrics"):
        assert log.log() is None
        log.observe(make_stats(3, [(0, 0)]), num_generated_tokens=5)
        clock.now += 10.0
        assert log.log() is None
    assert caplog.records == []
    assert log.last_log_time == clock.now


def test_log_fn_argument_overrides_constructor():
    ctor_lines: list[str] = []
    call_lines: list[str] = []
    log = SpecDecodingLogging(log_fn=ctor_lines.append, clock=FakeClock())
    log.observe(make_stats(1, [(1, 1)]))
    log.log(call_lines.append)
    assert ctor_lines == [] and len(call_lines) == 1


def test_maybe_log_respects_interval():
    clock = FakeClock()
    lines: list[str] = []
    log = SpecDecodingLogging(log_fn=lines.append, interval_s=5.0, clock=clock)
    log.observe(make_stats(2, [(2, 1)]))
    clock.now += 4.9
    assert log.maybe_log() is None
    assert lines == []
    clock.now += 0.1
    assert log.maybe_log() is not None
    assert len(lines) == 1 and "mean acceptance length: 2.00" in lines[0]

    log.observe(make_stats(2, [(2, 2)]))
    clock.now += 3.0
    assert log.maybe_log() is None
    clock.now += 2.0
    log.maybe_log()
    assert len(lines) == 2 and "mean acceptance length: 3.00" in lines[1]


def test_logging_validation():
    with pytest.raises(ValueError, match="interval_s=-1 is invalid"):
        SpecDecodingLogging(interval_s=-1)
    log = SpecDecodingLogging(clock=FakeClock())
    with pytest.raises(ValueError, match="num_generated_tokens=-2 is invalid"):
        log.observe(make_stats(1, []), num_generated_tokens=-2)


# --- SpecDecodingProm ----------------------------------------------------------------------------


def sample(registry: CollectorRegistry, name: str, **extra: str) -> float | None:
    return registry.get_sample_value(name, {**LABELS, **extra})


def test_prom_counters_read_back():
    registry = CollectorRegistry()
    prom = SpecDecodingProm(3, "tiny", "ngram", registry=registry)
    # Series exist at zero before any observation.
    assert sample(registry, "specdec_num_drafts_total") == 0.0
    assert sample(registry, "specdec_num_accepted_tokens_per_pos_total", position="2") == 0.0

    prom.observe(make_stats(3, [(3, 3), (3, 1), (2, 0)]))
    prom.observe(make_stats(3, [(3, 2)]))
    assert sample(registry, "specdec_num_drafts_total") == 4.0
    assert sample(registry, "specdec_num_draft_tokens_total") == 11.0
    assert sample(registry, "specdec_num_accepted_tokens_total") == 6.0
    per_pos = [
        sample(registry, "specdec_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(3)
    ]
    assert per_pos == [3.0, 2.0, 1.0]
    assert sample(registry, "specdec_num_accepted_tokens_per_pos_total", position="3") is None


def test_two_instances_share_registry_and_accumulate():
    registry = CollectorRegistry()
    first = SpecDecodingProm(2, "tiny", "ngram", registry=registry)
    second = SpecDecodingProm(2, "tiny", "ngram", registry=registry)
    other = SpecDecodingProm(2, "tiny", "eagle", registry=registry)
    first.observe(make_stats(2, [(2, 1)]))
    second.observe(make_stats(2, [(2, 2)]))
    other.observe(make_stats(2, [(1, 1)]))
    assert sample(registry, "specdec_num_drafts_total") == 2.0
    assert sample(registry, "specdec_num_accepted_tokens_total") == 3.0
    assert sample(registry, "specdec_num_accepted_tokens_per_pos_total", position="1") == 1.0
    eagle = {"model_name": "tiny", "method": "eagle"}
    assert registry.get_sample_value("specdec_num_draft_tokens_total", eagle) == 1.0


def test_default_registry_is_global():
    first = SpecDecodingProm(1, "test-global-registry", "ngram")
    second = SpecDecodingProm(1, "test-global-registry", "ngram")
    assert first.registry is prometheus_client.REGISTRY
    labels = {"model_name": "test-global-registry", "method": "ngram"}
    before = prometheus_client.REGISTRY.get_sample_value("specdec_num_drafts_total", labels)
    first.observe(make_stats(1, [(1, 1)]))
    second.observe(make_stats(1, [(1, 0)]))
    after = prometheus_client.REGISTRY.get_sample_value("specdec_num_drafts_total", labels)
    assert after - before == 2.0


def test_prom_rejects_conflicting_metric_and_too_many_positions():
    registry = CollectorRegistry()
    prometheus_client.Gauge("specdec_num_drafts", "not ours", registry=registry)
    with pytest.raises(ValueError, match="'specdec_num_drafts' is already registered"):
        SpecDecodingProm(2, "tiny", "ngram", registry=registry)

    prom = SpecDecodingProm(2, "tiny", "ngram", registry=CollectorRegistry())
    with pytest.raises(ValueError, match="stats.num_spec_tokens=3 is invalid"):
        prom.observe(SpecDecodingStats(3))

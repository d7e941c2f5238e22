"""The speculation policy (specdec.policy): its rule on a given cost table, its warm-up and re-measurement
schedule, per-request acceptance, and through the engine: greedy output unchanged, plain steps skip or observe."""

from __future__ import annotations

import pytest

import specdec
from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.policy import (
    BURST,
    GAP_FIRST,
    GAP_MAX,
    GAP_MAX_CLEAR,
    HYSTERESIS,
    MIN_GAIN,
    SETTLE,
    WARMUP,
    SpeculationPolicy,
)


def _feed(policy, ids, accepted, seconds, steps):
    """``steps`` decisions, each observed with its mode's step time; a drafting step's requests accept the
    next count of the cycle ``accepted`` (a plain step's accept none)."""
    modes = []
    for t in range(steps):
        widths = policy.plan(ids)
        mode = int(any(widths))
        modes.append(mode)
        ok = accepted[t % len(accepted)] if mode else 0
        policy.observe(ids, widths, [min(ok, w) for w in widths], seconds[mode])
    return modes


def test_warm_up_then_the_faster_mode_with_rare_re_measurements():
    p = SpeculationPolicy(k=3)
    ids = ["a", "b"]
    # spec: 2.5 tokens a request in 1.5 ms; plain: 1 token in 1 ms -> spec is 1.67x faster
    modes = _feed(p, ids, [1, 2], {0: 1e-3, 1: 1.5e-3}, 800)
    # the first spec step after the plain warm-up is a transition (not timed): WARMUP + 1 spec steps may pass
    assert modes[:WARMUP] == [1] * WARMUP and 0 in modes[WARMUP: 2 * WARMUP + 2]
    tail = modes[400:]
    assert sum(tail) / len(tail) > 0.95  # spec wins; plain only for re-measurement bursts
    assert p.stats.steps_drafted == sum(modes) and p.stats.steps_plain == len(modes) - sum(modes)


def test_cost_table_reports_what_the_rule_reads():
    p = SpeculationPolicy(k=3)
    assert p.cost_table() == {}
    ids = ["a", "b"]
    _feed(p, ids, [1, 2], {0: 1e-3, 1: 1.5e-3}, 400)  # batch 2: bucket 2
    row = p.cost_table()[2]
    assert row["plain_ms"] == pytest.approx(1.0) and row["spec_ms"] == pytest.approx(1.5)
    assert row["plain_tokens"] == pytest.approx(2.0)
    assert 2 + 2 * 1 <= row["spec_tokens"] <= 2 + 2 * 2  # two requests, accepting 1 or 2 each
    assert row["plain_tok_s"] == pytest.approx(2000.0)
    assert row["spec_over_plain"] == pytest.approx(row["spec_tok_s"] / row["plain_tok_s"], rel=1e-3)
    assert row["spec_over_plain"] > 1 and row["plain_steps"] + row["spec_steps"] <= 400
    fresh = SpeculationPolicy(k=3)
    _feed(fresh, ["a"], [1], {0: 1e-3, 1: 1.5e-3}, 3)  # spec warm-up only: no plain estimate yet
    assert fresh.cost_table()[1]["plain_steps"] == 0 and fresh.cost_table()[1]["spec_over_plain"] == 0.0


def test_plain_wins_when_drafting_does_not_pay():
    p = SpeculationPolicy(k=3)
    # spec: 1.2 tokens a request in 1.5 ms; plain: 1 token in 1 ms -> plain is 1.25x faster
    modes = _feed(p, ["a"], [1, 0, 0, 0, 0], {0: 1e-3, 1: 1.5e-3}, 800)
    tail = modes[400:]
    assert sum(tail) / len(tail) < 0.05 and sum(tail) > 0  # spec now and then, to re-measure it


def test_decisions_are_deterministic_given_the_cost_table():
    runs = []
    for _ in range(2):
        p = SpeculationPolicy(k=4)
        runs.append(_feed(p, ["x", "y", "z"], [1, 0, 2, 0, 1], {0: 1e-3, 1: 1.55e-3}, 300))
    assert runs[0] == runs[1]


def test_re_measurement_gaps_double():
    p = SpeculationPolicy(k=2)
    modes = _feed(p, ["a"], [2], {0: 1e-3, 1: 1.2e-3}, 600)
    starts = [i for i in range(1, len(modes)) if modes[i] == 0 and modes[i - 1] == 1][1:]  # after the warm-up
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    burst = BURST[0]  # spec wins here: plain is the mode re-measured
    assert gaps[:3] == [GAP_FIRST * 2 + burst, GAP_FIRST * 4 + burst, GAP_FIRST * 8 + burst], gaps


def test_re_measurement_gaps_grow_further_only_while_the_winner_leads_clearly():
    clear, close = SpeculationPolicy(k=2), SpeculationPolicy(k=2)
    _feed(clear, ["a"], [2], {0: 1e-3, 1: 1.2e-3}, 3000)  # spec 2.5x faster
    _feed(close, ["a"], [1], {0: 1e-3, 1: 1.8e-3}, 3000)  # spec 2 / 1.8 = 1.11x faster
    assert clear.cost[1].gap == GAP_MAX_CLEAR and close.cost[1].gap == GAP_MAX


def _settled(plain_ms: float, spec_ms: float, winner: int) -> SpeculationPolicy:
    """A policy past its warm-up whose one bucket reads 1 token a step in each mode at these step times."""
    p = SpeculationPolicy(k=2)
    p.plan(["a"])  # makes the bucket
    b = p.cost[1]
    b.count, b.tokens, b.seconds = [WARMUP, WARMUP], [1.0, 1.0], [plain_ms * 1e-3, spec_ms * 1e-3]
    b.winner, b.gap, b.since = winner, 64, 1
    return p


def test_the_winner_changes_only_past_the_hysteresis():
    assert any(_settled(1.0, 1.0 + HYSTERESIS / 2, winner=1).plan(["a"]))  # plain barely faster: spec stays
    p = _settled(1.0, 1.0 + 2 * HYSTERESIS, winner=1)
    assert not any(p.plan(["a"])) and p.cost[1].winner == 0 and p.cost[1].gap == GAP_FIRST
    assert not any(_settled(1.0 + HYSTERESIS / 2, 1.0, winner=0).plan(["a"]))  # and the other way round
    assert any(_settled(1.0 + 2 * HYSTERESIS, 1.0, winner=0).plan(["a"]))


def test_a_new_batch_size_starts_from_the_nearest_warmed_up_bucket():
    p = SpeculationPolicy(k=2)
    ids8 = [str(i) for i in range(8)]
    # batch 8: spec 8 + 8 tokens in 4 ms against plain 8 in 1 ms -> plain wins clearly
    _feed(p, ids8, [1], {0: 1e-3, 1: 4e-3}, 3 * WARMUP)
    assert p.cost[8].ready() and p.cost[8].winner == 0
    # the tail of the run: 3 requests left (bucket 4), no warm-up of 32 drafting steps there
    modes = _feed(p, ids8[:3], [1], {0: 0.6e-3, 1: 2.5e-3}, 12)
    b4 = p.cost[4]
    assert b4.seeded and modes[0] == 0 and sum(modes) <= BURST[1]  # plain from the start; spec re-measured
    assert b4.seconds[0] == pytest.approx(0.6e-3)  # its own first timed plain step replaced the seed
    fresh = SpeculationPolicy(k=2)  # nothing warmed up yet: the first bucket warms up
    assert _feed(fresh, ["a"], [1], {0: 1e-3, 1: 4e-3}, WARMUP) == [1] * WARMUP and not fresh.cost[1].seeded


def test_a_request_that_accepts_nothing_stops_drafting_and_recovers():
    p = SpeculationPolicy(k=3)
    plans = []
    for _ in range(3 * WARMUP):  # drafting pays for "good" (spec steps are the fast ones); "bad" accepts nothing
        widths = p.plan(["bad", "good"])
        plans.append(widths)
        p.observe(["bad", "good"], widths, [0, min(3, widths[1])], 0.5e-3 if any(widths) else 1e-3)
    assert plans[:2] == [[3, 3], [3, 3]] and [0, 3] in plans  # "bad" is left out once its estimate falls
    assert p.expected_gain("good") > 2
    for _ in range(100):  # left out, it drifts back towards the method-wide estimate
        p.plan(["bad", "good"])
        p.observe(["bad", "good"], [0, 3], [0, 3], 0.5e-3)
    assert p.expected_gain("bad") > MIN_GAIN  # drafting again (when the step drafts at all)


def test_no_draft_made_tells_nothing_about_acceptance():
    p = SpeculationPolicy(k=2)
    before = p.expected_gain("r")
    for _ in range(20):
        p.plan(["r"])
        p.observe(["r"], [0], [0], 1e-3)  # ngram found no match: no acceptance information
    assert p.expected_gain("r") == pytest.approx(before)


def test_speculation_policy_key_is_validated_and_round_trips():
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert cfg.speculation_policy == "auto" and cfg.to_dict()["speculation_policy"] == "auto"
    assert SpeculativeConfig.from_dict({**cfg.to_dict(), "speculation_policy": "fixed"}).speculation_policy == "fixed"
    with pytest.raises(ValueError, match=r"speculation_policy='always' is invalid: it must be one of \('auto', "
                                         r"'fixed'\)"):
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, speculation_policy="always")


class _PlainFirst(SpeculationPolicy):
    """Plain for the first ``plain`` decisions, then every request drafts k."""

    plain = 12

    def plan(self, req_ids):
        self.plain -= 1
        widths = [0 if self.plain >= 0 else self.k] * len(req_ids)
        self._planned = dict(zip(req_ids, widths))
        return widths


@pytest.mark.parametrize("method,k", [("ngram", 4), ("draft_model", 3), ("eagle3", 3), ("medusa", 2), ("dflash", 3)])
def test_plain_steps_skip_or_observe_and_output_is_unchanged(method, k):
    """Plain steps, then drafting steps, for the same requests: greedy output is the baseline's; on plain steps
    a skippable proposer is not called, one with ``observe`` only observes, any other proposes (drafts
    dropped)."""
    tiny = specdec.bundled_model("tiny")
    prompts = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Stack:\n    def push(self, x):\n"]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    baseline = [o.token_ids for o in LLM(tiny, dtype="float32", device="cpu").generate(prompts, params)]
    llm = LLM(tiny, {"method": method, "num_speculative_tokens": k}, dtype="float32", device="cpu", max_num_seqs=3)
    proposer, log = llm.proposer, []
    for name in ("propose", "observe"):
        real = getattr(proposer, name)

        def counted(batch, _real=real, _name=name):
            log.append((_name, llm.policy.plain >= 0))
            return _real(batch)
        setattr(proposer, name, counted)
    llm.policy = _PlainFirst(k)
    assert [o.token_ids for o in llm.generate(prompts, params)] == baseline
    assert llm.policy.stats.steps_plain == 12 and llm.policy.stats.steps_drafted > 0
    assert llm.stats.num_draft_tokens > 0
    on_plain = {name for name, plain in log if plain}
    own_observe = type(proposer).observe is not specdec.Proposer.observe
    if type(proposer).skippable:
        assert on_plain == set()
    elif own_observe:
        assert on_plain == {"observe"}
    else:
        assert on_plain == {"observe", "propose"}  # the default observe declines; propose's drafts are dropped
    assert ("propose", False) in log


def test_steps_right_after_a_switch_are_not_timed():
    """A drafting step right after plain ones is slow (a skipped proposer catches up): the first SETTLE of them
    stay out of the spec estimate, which keeps the steady 1 ms."""
    p = SpeculationPolicy(k=2)
    last, run = -1, 0
    for _ in range(600):
        widths = p.plan(["a"])
        mode = int(any(widths))
        run = run + 1 if mode == last else 1
        last = mode
        slow = mode == 1 and run <= SETTLE[1] and p.stats.steps_plain > 0
        p.observe(["a"], widths, [2 if mode else 0], 10e-3 if slow else 1e-3)
    b = p.cost[1]
    assert b.seconds[1] == pytest.approx(1e-3) and b.seconds[0] == pytest.approx(1e-3)
    assert p.stats.steps_plain <= WARMUP + 8 * BURST[0]  # the warm-up and a few re-measurement bursts

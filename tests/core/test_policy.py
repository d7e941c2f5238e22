"""The speculation policy (specdec.policy): its rule on a given cost table, its warm-up and re-measurement
schedule, per-request acceptance, and through the engine: greedy output unchanged, plain steps skip or observe."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest

import specdec
from specdec import LLM, SamplingParams, SpeculativeConfig
from specdec.policy import (
    ALPHA_GLOBAL,
    ALPHA_LOSER,
    ALPHA_SWITCH,
    BURST,
    DRAFT_REASONS,
    END_FADE_EVERY,
    END_MIN_STEPS,
    END_PRIOR,
    GAP_FIRST,
    GAP_MAX,
    GAP_SECONDS,
    HYSTERESIS,
    LONG_RUN,
    MIN_GAIN,
    MIN_PLAIN,
    MIN_SPEC,
    PAYBACK,
    PLAIN_REASONS,
    PRIOR,
    RECOVER,
    REGRET,
    SETTLE,
    STEP_CLIP,
    TIMED_PLAIN,
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
    warm = MIN_PLAIN + SETTLE[1] + MIN_SPEC
    modes = _feed(p, ids, [1, 2], {0: 1e-3, 1: 1.5e-3}, warm)
    # plain first, then drafting (its first SETTLE steps untimed) until the rates differ clearly: here at once
    assert modes == [0] * MIN_PLAIN + [1] * (SETTLE[1] + MIN_SPEC)
    assert p.cost[2].clear() and p.cost[2].winner == -1 and p.cost[2].count == [MIN_PLAIN, MIN_SPEC]
    modes += _feed(p, ids, [1, 2], {0: 1e-3, 1: 1.5e-3}, 800 - warm)
    assert p.cost[2].winner == 1
    tail = modes[400:]
    assert sum(tail) / len(tail) > 0.95  # spec wins; plain only for re-measurement bursts
    assert p.stats.steps_drafted == sum(modes) and p.stats.steps_plain == len(modes) - sum(modes)


def test_a_one_off_stall_does_not_flip_the_winner_and_a_lasting_change_does():
    """Plain steps of 1 ms win against drafting steps of 2 ms giving 1.5 tokens a request. One plain step of 30 ms
    (a full garbage collection, a compile) enters the plain average clipped at STEP_CLIP times it: plain keeps
    winning (unclipped, the average would rise to 2.2 ms and the rule would switch into drafting). A lasting change,
    3 ms or 10 ms a plain step from then on, still makes drafting the winner by the first re-measurement burst
    after it (before it, drafting's time is older than plain's change: _Bucket.stale_loser)."""
    def warmed() -> SpeculationPolicy:
        p = SpeculationPolicy(k=3)
        _feed(p, ["a"], [0, 1], {0: 1e-3, 1: 2e-3}, 60)
        assert p.cost[1].winner == 0
        return p

    p = warmed()
    b = p.cost[1]
    b.since = 1  # the next re-measurement burst far off
    modes = _feed(p, ["a"], [0, 1], {0: 30e-3, 1: 2e-3}, 1) + _feed(p, ["a"], [0, 1], {0: 1e-3, 1: 2e-3}, 40)
    assert modes == [0] * 41 and b.clipped == 1 and b.winner == 0
    assert b.seconds[0] < 1e-3 * (1 + 0.05 * (STEP_CLIP - 1))
    for lasting in (3e-3, 10e-3):
        p = warmed()
        b = p.cost[1]
        b.since = b.gap - 20  # the next burst 20 decisions on
        modes = _feed(p, ["a"], [0, 1], {0: lasting, 1: 2e-3}, 60)
        assert b.winner == 1 and modes[:20] == [0] * 20 and 1 in modes[20:40], (lasting, modes)


@pytest.mark.parametrize("spec_ms", [1.3e-3, 1.5e-3])
def test_a_stretch_of_slow_steps_does_not_make_a_losing_drafting_mode_the_winner(spec_ms):
    """Plain steps of 0.55 ms win against drafting steps giving 1.6 tokens a request (drafting 0.67x / 0.59x
    as fast). Then the machine stalls: 30 steps at 7 ms fading back to 0.55 (seen on the H100 in every engine,
    s42). Plain's average rises ~3x within the stretch; drafting's time is from before it, so drafting may not
    take over (without that rule it did, and ran on at its 0.6x: s41's H100 grid, 1000-2100 such steps). Still
    wanted STALE_WAIT decisions on, drafting is re-measured in one burst, paired with plain's recent steps: it
    loses, and plain stays the winner."""
    p = SpeculationPolicy(k=3)
    _feed(p, ["a"], [0, 1, 1, 2, 0], {0: 0.55e-3, 1: spec_ms}, 80)
    b = p.cost[1]
    assert b.winner == 0
    b.since = 1  # the next re-measurement burst far off
    modes, peak, faster = [], 0.0, p.stats.draft_reasons.get("faster", 0)
    for i in range(120):
        stall = 0.55e-3 * (1 + 12 * math.exp(-i / 8))
        modes += _feed(p, ["a"], [0, 1, 1, 2, 0], {0: stall, 1: spec_ms * stall / 0.55e-3}, 1)
        peak = max(peak, b.seconds[0])
    assert p.stats.draft_reasons.get("faster", 0) == faster and b.winner == 0, modes
    assert sum(modes) <= BURST[1] and modes[-60:] == [0] * 60, modes  # one burst at most, then plain
    assert peak > 1.5e-3  # (the stall did move plain's average: 0.55 ms a step no more)


def test_a_close_call_warms_up_longer():
    """Rates within a few per cent of each other, with drafting's tokens varying step to step: the warm-up
    runs to WARMUP timed drafting steps; a clear loser ends it after MIN_SPEC."""
    close, clear = SpeculationPolicy(k=3), SpeculationPolicy(k=3)
    _feed(close, ["a"], [0, 3, 1, 2], {0: 1e-3, 1: 2.5e-3}, 200)  # 2.5 tokens in 2.5 ms: a tie
    _feed(clear, ["a"], [0, 1], {0: 1e-3, 1: 4e-3}, 200)  # 1.5 tokens in 4 ms
    assert close.cost[1].count[1] >= WARMUP
    assert clear.cost[1].decided and clear.cost[1].count[1] <= MIN_SPEC + 2 * BURST[1]


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
    _feed(fresh, ["a"], [1], {0: 1e-3, 1: 1.5e-3}, MIN_PLAIN)  # the plain warm-up only: no drafting estimate yet
    assert fresh.cost_table()[1]["spec_steps"] == 0 and fresh.cost_table()[1]["spec_over_plain"] == 0.0


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


def test_with_nothing_waiting_drafting_must_pay_for_the_request_that_ends_the_batch():
    """Plain steps 1 ms, drafting steps 1.8 ms (1.8 tokens a request needed): a request whose drafting steps
    accepted 2 drafts each on average pays for drafting, one that accepted 0.3 does not. With tokens left given
    (nothing waits to join), the request with the most tokens left decides; without them (or for one request) the
    bucket's rule alone."""
    p = SpeculationPolicy(k=3)
    b = p._bucket_for(2)
    b.tokens, b.seconds, b.count = [2.0, 5.0], [1e-3, 1.8e-3], [10, 10]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    p._acc = {"fast": [0.8, 0.75, 1.0], "slow": [0.3, 0.0, 0.0]}
    # ten drafting steps each: 2, 2, 2, 2, 2, 2, 3, 3, 1, 1 accepted, and three steps of 1 among seven of 0
    p._end = {"fast": (10.0, 20.0, 44.0), "slow": (10.0, 3.0, 3.0)}
    fast, slow = p.end_gains(["fast", "slow"])
    assert fast == pytest.approx(2.0, abs=0.1) and slow == pytest.approx(0.3, abs=0.1)  # far apart: each its own
    assert p.pays_at_end(b, ["fast", "slow"], [50, 10]) and not p.pays_at_end(b, ["fast", "slow"], [10, 50])
    assert not p.pays_at_end(b, ["fast", "slow"], [50, 47])  # within END_SHARE of the most: the weaker decides
    assert p.pays_at_end(b, ["slow"], [50])  # one request: its bucket measures its own steps
    assert p.would_draft(["fast", "slow"]) and not p.would_draft(["fast", "slow"], remaining=[10, 50])
    assert p.plan(["fast", "slow"], remaining=[10, 50]) == [0, 0]
    assert p.plan(["fast", "slow"], remaining=[50, 10]) == [3, 3] and p.plan(["fast", "slow"]) == [3, 3]


def test_at_the_batch_end_drafting_pays_where_the_batch_it_leaves_behind_runs_cheaper_steps():
    """Four requests with 50 tokens left each, three accepting 2 drafts a step and one 0.3; plain steps 1 ms,
    drafting 1.8 ms. Where a step of fewer rows costs as much (nothing learned: a GPU's small batches), the slow
    request sets the batch's end and drafting does not pay (1.3 tokens a step of it against 1.8 ms). Where the
    consecutive steps as requests left timed 2 rows at half of 4 and 1 row at 0.8 of 2 (a CPU), drafting ends the
    three fast ones after ~17 steps and the slow one goes on alone at 0.4 of a full step: 41 ms against 50 plain."""
    p = SpeculationPolicy(k=3)
    b = p._bucket_for(4)
    b.tokens, b.seconds, b.count = [4.0, 10.0], [1e-3, 1.8e-3], [10, 10]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    ids = ["a", "b", "c", "slow"]
    p._end = {r: (10.0, 20.0, 44.0) for r in ids[:3]} | {"slow": (10.0, 3.0, 3.0)}
    assert p.end_gains(ids) == pytest.approx([2.0, 2.0, 2.0, 0.3], abs=0.1)
    assert not p.pays_at_end(b, ids, [50] * 4)
    # plain steps as the batch shrank: 4 rows 1 ms, 2 rows 0.5 ms, 1 row 0.4 ms; each halving's ratio learned from
    # the two steps around it, not from steps apart in time or of another mode
    p._rows_pair(4, 0, 1e-3)
    p._rows_pair(2, 0, 0.5e-3)
    p._rows_pair(1, 1, 0.9e-3)  # (a drafting step after a plain one: not paired)
    assert p._rows_ratio == {2: pytest.approx(0.5)}
    assert p._rows_scale(4, 1) == 1.0  # (one halving not yet timed: no saving assumed)
    p._rows_pair(2, 0, 0.5e-3)
    p._rows_pair(1, 0, 0.4e-3)
    assert p._rows_scale(4, 2) == pytest.approx(0.5) and p._rows_scale(4, 1) == pytest.approx(0.4)
    assert p.pays_at_end(b, ids, [50] * 4)
    assert p.plan(ids, remaining=[50] * 4) == [3] * 4
    assert p.pays_at_end(b, ids, [0] * 4)  # (nothing left: no time either way)
    p._rows_ratio = {2: 0.95, 1: 0.96}  # (within ROWS_CHEAPER of 1: noise, no saving)
    assert p._rows_scale(4, 2) == 1.0 and not p.pays_at_end(b, ids, [50] * 4)


def test_the_engine_gives_tokens_left_only_when_nobody_waits(tiny_llama_path):
    """Three requests through two slots: while the third waits the policy gets no tokens left; once it runs, the
    tokens each request has left before max_tokens."""
    seen = []

    class Recording(SpeculationPolicy):
        def plan(self, req_ids, sampled=False, remaining=None):
            seen.append(None if remaining is None else list(remaining))  # read during the step, as the rule does
            return super().plan(req_ids, sampled, remaining)

    llm = LLM(tiny_llama_path, {"method": "ngram", "num_speculative_tokens": 2}, dtype="float32", device="cpu",
              max_num_seqs=2)
    llm.policy = Recording(2)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (4, 12, 6)]
    llm.generate([[5, 6, 7], [8, 9], [10, 11, 12]], params)
    assert seen[0] is None and seen[-1] is not None and len(seen[-1]) == 1
    given = [r for r in seen if r is not None]
    assert all(0 < n <= 12 for r in given for n in r) and any(len(r) == 2 for r in given)


def test_greedy_and_sampled_batches_keep_apart_cost_tables():
    """Steps of greedy batches, where drafting pays (2 accepted of 3 in 1.2 ms against 1 ms), alternate with steps of
    batches holding a sampled request, where it does not (4 ms): each kind's table finds its own winner (one table
    mixed the two), and the engine files its steps by the batch's temperatures."""
    p = SpeculationPolicy(k=3)
    ids = ["a", "b"]
    for t in range(600):
        sampled = t % 2 == 1
        widths = p.plan(ids, sampled)
        drafting = any(widths)
        secs = (4e-3 if sampled else 1.2e-3) if drafting else 1e-3
        p.observe(ids, widths, [min(2, w) for w in widths], secs, sampled=sampled)
    assert p.cost[2].winner == 1 and p.cost_sampled[2].winner == 0
    assert p.cost_table()[2]["spec_over_plain"] > 1 > p.cost_table(sampled=True)[2]["spec_over_plain"] > 0
    tiny = specdec.bundled_model("tiny")
    llm = LLM(tiny, {"method": "ngram", "num_speculative_tokens": 3}, dtype="float32", device="cpu", max_num_seqs=2)
    prompts = ["def add(a, b):\n    return a", "import os\nimport sys\n"]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert 2 in llm.policy.cost and not llm.policy.cost_sampled
    llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
                           SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)])
    assert sum(llm.policy.cost_sampled[2].count) > 0


@pytest.mark.parametrize("spec_ms", [1.2, 1.55, 4.0])
def test_would_draft_is_the_next_plans_decision_and_changes_nothing(spec_ms):
    """Asked right before each plan (the engine asks before the step's outcome is observed, to queue the next plain
    step ahead): the same answer as that plan, through the warm-up, the re-measurement bursts and a change of batch
    size, and the cost table untouched; True for a batch size not planned yet."""
    p = SpeculationPolicy(k=3)
    ids = ["a", "b", "c"]
    assert p.would_draft(ids) and not p.cost
    modes, guesses = [], []
    for t in range(500):
        batch = ids if t < 300 else ids[:2]
        if p.cost.get(p.bucket(len(batch))) is not None:
            before = copy.deepcopy(p.cost)
            guesses.append((t, p.would_draft(batch)))
            assert p.cost == before
        widths = p.plan(batch)
        modes.append(bool(any(widths)))
        ok = [1, 0, 2][t % 3] if any(widths) else 0
        p.observe(batch, widths, [min(ok, w) for w in widths], {False: 1e-3, True: spec_ms * 1e-3}[any(widths)])
    assert all(g == modes[t] for t, g in guesses) and len(guesses) == 498
    assert 0 < sum(modes) < len(modes)  # both modes ran: the answers cover switches both ways


@pytest.mark.parametrize("plain_ms, switch_ms", [(0.5, 15.0), (0.1, 100.0), (20.0, 15.0), (0.5, 0.5)])
def test_a_costly_switch_lengthens_the_longest_gap(plain_ms, switch_ms):
    """A burst that pays a costly switch (a bare run's recompute, ~15 ms on the H200) over short steps (0.5 ms at
    batch 8) needs ~3000 steps between bursts to cost REGRET; at GAP_MAX (512) its switches alone cost ~6% of the
    time: the longest gap becomes the one at which they cost SWITCH_SHARE (at most GAP_SECONDS of steps). Cheap
    switches, and long steps (a CPU's), keep GAP_MAX, so a change of workload is re-measured as soon as before."""
    from specdec.policy import SWITCH_SHARE, _Bucket

    b = _Bucket(tokens=[8.0, 8.4], seconds=[plain_ms * 1e-3, 2 * plain_ms * 1e-3], count=[100, 20], decided=True,
                winner=0, switch=[0.0, switch_ms * 1e-3], size=8)
    wanted = (BURST[1] * (1 - b.rate(1) / b.rate(0)) * b.seconds[1] + b.switch[1]) / b.seconds[0] / REGRET
    gap = b.next_gap()
    assert gap == min(b.gap_max(), max(GAP_FIRST, math.ceil(wanted - 1e-9)))
    switches = b.switch[1] / (gap * b.seconds[0])  # the share of the time a burst's switches cost at that gap
    if (plain_ms, switch_ms) == (0.5, 15.0):
        want = math.ceil(15.0 / (0.5 * SWITCH_SHARE))  # (3000 at 1%) its switches cost ~0.06 of the time at 512
        assert GAP_MAX < gap == b.gap_max() == want <= GAP_SECONDS / 0.5e-3 and switches <= SWITCH_SHARE + 1e-9
    elif plain_ms == 0.1:
        assert gap == b.gap_max() == int(GAP_SECONDS / 1e-4)  # capped at 2 s of steps (the share wanted 33334)
    else:
        assert b.gap_max() == GAP_MAX  # long steps, or a cheap switch


@pytest.mark.parametrize("winner", [0, 1])
def test_bursts_after_a_long_plain_run_are_spaced_by_the_long_switch(winner):
    """Where plain wins, a drafting burst comes after hundreds of plain steps and pays the switch after a long run
    (switch_long: an eagle3 recompute, 15.7 ms on the H100 in s39's grid, where a short run's switch took 1.8 ms):
    the gap, the longest gap and the margin count that one, so the bursts' switches cost SWITCH_SHARE of the time
    (at the short switch's gap, 512 steps, they cost ~5%). Where drafting wins, a burst is a few plain steps and
    the switch back is a short run's."""
    from specdec.policy import PAYBACK, SWITCH_SHARE, _Bucket

    b = _Bucket(tokens=[8.0, 8.4], seconds=[0.7e-3, 1.6e-3], count=[100, 20], decided=True, winner=winner,
                switch=[0.5e-3, 1.8e-3], size=8)
    b.switch_long = 15.7e-3
    short = 0.5e-3 + 1.8e-3
    both = 0.5e-3 + 15.7e-3 if winner == 0 else short
    assert b.switches() == pytest.approx(both)
    t_w = b.seconds[winner]
    assert b.gap_max() == max(GAP_MAX, min(math.ceil(both / (t_w * SWITCH_SHARE)), int(GAP_SECONDS / t_w)))
    assert b.margin(1 - winner) == pytest.approx(HYSTERESIS + both / (PAYBACK * t_w))
    if winner == 0:
        assert b.next_gap() == b.gap_max() == math.ceil(both / (0.7e-3 * SWITCH_SHARE)) > 4 * GAP_MAX
        assert b.switches() / (b.next_gap() * 0.7e-3) <= SWITCH_SHARE + 1e-9  # at 512 steps: 4.5% of the time
    else:
        assert b.gap_max() == GAP_MAX  # the short switches fit SWITCH_SHARE at GAP_MAX of 1.6 ms steps


@pytest.mark.parametrize("spec_ms, accepted", [(1.2, [2]), (1.8, [1]), (4.0, [0, 1]), (1.5, [1, 0, 0, 0, 0])])
def test_re_measurement_costs_at_most_the_regret_share(spec_ms, accepted):
    """The losing mode is re-measured after a gap that bounds the share of time its bursts lose (REGRET), longer
    the more it loses, within GAP_FIRST .. GAP_MAX (a loser whose bursts would need a longer gap loses a little
    more); in the run, the time lost to the bursts stays near that share (within 1.5x: the switches back cost
    their settling steps too)."""
    p = SpeculationPolicy(k=2)
    seconds = {0: 1e-3, 1: spec_ms * 1e-3}
    modes = _feed(p, ["a"], accepted, seconds, 4000)
    b = p.cost[1]
    w, lose = b.winner, 1 - b.winner
    loss = 1 - b.rate(lose) / b.rate(w)
    expected = BURST[lose] * loss * b.seconds[lose] / b.seconds[w] / REGRET
    assert b.gap == min(b.gap_max(), max(GAP_FIRST, int(expected) + (expected > int(expected))))
    tail = modes[1000:]
    spent = sum(seconds[m] for m in tail)
    lost = sum(seconds[m] * loss for m in tail if m == lose)
    share = BURST[lose] * loss * b.seconds[lose] / (b.gap * b.seconds[w])  # REGRET unless the gap is capped
    assert share <= REGRET + 1e-9 or b.gap == b.gap_max()
    assert lost / spent < 1.5 * share, (lost / spent, share, b.gap)
    assert tail.count(lose) > 0  # still re-measured


def test_a_winner_that_stops_winning_is_noticed():
    """Drafting pays for 1500 steps (high acceptance), then stops paying (nothing accepted): the policy
    drafts on most steps of the first part and few of the second's last 1000."""
    p = SpeculationPolicy(k=3)
    first = _feed(p, ["a", "b"], [3], {0: 1e-3, 1: 1.5e-3}, 1500)
    second = _feed(p, ["a", "b"], [0], {0: 1e-3, 1: 1.5e-3}, 2000)
    assert sum(first[500:]) / 1000 > 0.9 and sum(second[1000:]) / 1000 < 0.05


def _settled(plain_ms: float, spec_ms: float, winner: int) -> SpeculationPolicy:
    """A policy past its warm-up whose one bucket reads 1 token a step in each mode at these step times."""
    p = SpeculationPolicy(k=2)
    p.plan(["a"])  # makes the bucket
    b = p.cost[1]
    b.count, b.tokens, b.seconds = [WARMUP, WARMUP], [1.0, 1.0], [plain_ms * 1e-3, spec_ms * 1e-3]
    b.decided, b.winner, b.gap, b.since = True, winner, 64, 1
    return p


def test_the_winner_changes_only_past_the_hysteresis():
    assert any(_settled(1.0, 1.0 + HYSTERESIS / 2, winner=1).plan(["a"]))  # plain barely faster: spec stays
    p = _settled(1.0, 1.0 + 2 * HYSTERESIS, winner=1)
    assert not any(p.plan(["a"])) and p.cost[1].winner == 0 and p.cost[1].gap == p.cost[1].next_gap()
    assert not any(_settled(1.0 + HYSTERESIS / 2, 1.0, winner=0).plan(["a"]))  # and the other way round
    assert any(_settled(1.0 + 2 * HYSTERESIS, 1.0, winner=0).plan(["a"]))


def test_a_costly_switch_widens_the_margin_the_other_mode_must_win_by():
    """Plain steps 1 ms, drafting 8% faster per token: past the bare hysteresis. With switches that cost nothing
    the winner changes; with 2 ms into drafting and 1 ms back (a catch-up after each plain run), spread over
    PAYBACK steps the margin is 3% + 3 / 32 and plain stays, unless the bucket's last step drafted already (a
    re-measurement burst: staying costs no switch); 15% faster takes over again."""
    assert any(_settled(1.0, 1.0 / 1.08, winner=0).plan(["a"]))
    p = _settled(1.0, 1.0 / 1.08, winner=0)
    p.cost[1].switch = [1e-3, 2e-3]
    assert p.cost[1].margin(1) == pytest.approx(HYSTERESIS + 3.0 / PAYBACK)
    assert not any(p.plan(["a"])) and p.cost[1].winner == 0
    p = _settled(1.0, 1.0 / 1.08, winner=0)
    p.cost[1].switch, p.cost[1].last = [1e-3, 2e-3], 1  # its last step drafted (a burst): no switch to stay there
    assert p.cost[1].margin(1) == HYSTERESIS and any(p.plan(["a"])) and p.cost[1].winner == 1
    p = _settled(1.0, 1.0 / 1.15, winner=0)
    p.cost[1].switch = [1e-3, 2e-3]
    assert any(p.plan(["a"])) and p.cost[1].winner == 1


def test_after_plain_steps_the_batch_end_pays_the_switch_into_drafting():
    """Plain steps 1 ms, drafting steps 2.5 ms with 2 expected accepted drafts (3 tokens: it pays at a glance,
    3 ms against 2.5), a switch into drafting 3 ms. While drafting, it keeps drafting whatever the tokens left;
    after plain steps it drafts only when the longest request has enough tokens left to win the switch back
    (3 * 3 / R <= 0.5: R >= 18)."""
    p = SpeculationPolicy(k=2)
    b = p._bucket_for(2)
    b.tokens, b.seconds, b.count, b.switch = [2.0, 6.0], [1e-3, 2.5e-3], [10, 10], [0.0, 3e-3]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    p._acc = {"x": [1.0, 1.0], "y": [1.0, 1.0]}
    p._global[False] = [1.0, 1.0]
    p._end = {"x": (20.0, 40.0, 80.0), "y": (20.0, 40.0, 80.0)}  # 2 accepted in each of 20 drafting steps
    ids = ["x", "y"]
    assert p.expected_gain("x") == pytest.approx(2.0) and p.end_gains(ids) == pytest.approx([2.0, 2.0])
    p._last_mode = 1
    assert p.pays_at_end(b, ids, [5, 5])
    p._last_mode = 0
    assert p.pays_at_end(b, ids, [5, 5])  # plain steps of other requests: these owe no switch
    p._behind = {"x"}
    assert not p.pays_at_end(b, ids, [17, 17]) and p.pays_at_end(b, ids, [19, 19])
    assert p.plan(ids, remaining=[10, 10]) == [0, 0] and p.stats.plain_reasons == {"batch_end": 1}


def test_after_plain_steps_a_last_request_drafts_only_if_its_tokens_left_pay_the_switch():
    """One request (its bucket measures its own steps): plain 1 token a ms, drafting 2 (3 tokens in 1.5 ms), a switch
    into drafting 3 ms. While drafting it goes on whatever is left; after plain steps drafting saves 0.5 ms a token,
    so it drafts again only with at least 6 tokens left; without tokens left given (requests waiting) it drafts."""
    p = SpeculationPolicy(k=2)
    b = p._bucket_for(1)
    b.tokens, b.seconds, b.count, b.switch = [1.0, 3.0], [1e-3, 1.5e-3], [10, 10], [0.0, 3e-3]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    p._last_mode = 1
    assert p.pays_at_end(b, ["x"], [2])
    p._last_mode, p._behind = 0, {"x"}
    assert not p.pays_at_end(b, ["x"], [5]) and p.pays_at_end(b, ["x"], [7])
    assert p.plan(["x"], remaining=[3]) == [0] and p.plan(["x"], remaining=[40]) == [2] and p.plan(["x"]) == [2]


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
    warm = _feed(fresh, ["a"], [1], {0: 1e-3, 1: 4e-3}, MIN_PLAIN + SETTLE[1] + MIN_SPEC)
    assert warm == [0] * MIN_PLAIN + [1] * (SETTLE[1] + MIN_SPEC) and not fresh.cost[1].seeded


def test_a_request_that_accepts_nothing_stops_drafting_and_recovers():
    p = SpeculationPolicy(k=3)
    plans = []
    for _ in range(3 * WARMUP):  # drafting pays for "good" (spec steps are the fast ones); "bad" accepts nothing
        widths = p.plan(["bad", "good"])
        plans.append(widths)
        p.observe(["bad", "good"], widths, [0, min(3, widths[1])], 0.5e-3 if any(widths) else 1e-3)
    assert plans[MIN_PLAIN: MIN_PLAIN + 2] == [[3, 3], [3, 3]] and [0, 3] in plans  # "bad" left out once it falls
    assert p.expected_gain("good") > 2
    left_out = plans.index([0, 3])
    assert [3, 3] in plans[left_out:]  # left out, it drifts back towards the method-wide estimate: asked again


def test_plain_steps_drift_the_estimates_as_step_by_step_updates_would():
    """A plain step counts each request's drift instead of moving its estimates; read later (its expected gain, a
    drafting step) they are what n steps of ``a += RECOVER * (g - a)`` give, towards the method-wide estimates of
    the request's kind as they stood."""
    p = SpeculationPolicy(k=2)
    p._acc, p._made = {"r": [0.2, 0.1]}, {"r": 0.5}
    p._planned = {}
    for _ in range(7):
        p.observe(["r"], [0], [0], 1e-3)
    a, m, g = [0.2, 0.1], 0.5, p._global[False]
    for _ in range(7):
        a = [x + RECOVER * (y - x) for x, y in zip(a, g)]
        m = m + RECOVER * (1.0 - m)
    assert p._drift == {} and p._run == ["r"] and p._run_steps == 7  # counted once for the batch...
    assert p.expected_gain("r") == pytest.approx(m * (a[0] + a[0] * a[1]), rel=1e-12)
    assert p._drift == {} and p._run_steps == 0 and p._acc["r"] == pytest.approx(a, rel=1e-12)  # ...applied when read


def test_plain_runs_counted_per_batch_drift_each_request_as_per_step_counts_would():
    """Plain steps of a batch whose requests change (one leaves, one joins, a request joins a sampled batch and
    stays in the greedy one after it, drafting steps between) leave every request's estimates where a per-request
    count of its own plain steps puts them: the batch's run is flushed into each request's drift whenever the batch
    changes or anything reads them."""
    def run(p: SpeculationPolicy) -> int:
        """The steps, on ``p``; returns how many were plain."""
        batches = [["a", "b"]] * 5 + [["a", "b", "c"]] * 4 + [["b", "c"]] * 3 + [["b", "c", "s"]] * 2 + [["c", "s"]] * 6
        plain = 0
        for i, ids in enumerate(batches):
            sampled = ids == ["b", "c", "s"]  # "s" is sampled there, greedy after
            widths = p.plan(list(ids), sampled)
            if i in (7, 15):  # drafting steps: every pending drift applied before the method-wide estimates move
                p._planned = {r: 2 for r in ids}
                widths = [2] * len(ids)
            p.observe(list(ids), widths, [1 if w else 0 for w in widths], 2e-3 if any(widths) else 1e-3,
                      sampled=sampled)
            plain += not any(widths)
            if i == 9:
                p.forget("a")
        return plain

    from specdec.policy import _Bucket

    def policy() -> SpeculationPolicy:  # plain has won at batch sizes 2 and 3, greedy or sampled
        p = SpeculationPolicy(k=2)
        for table in (p.cost, p.cost_sampled):
            for n in (2, 4):
                table[n] = _Bucket(decided=True, winner=0, count=[5, 5], tokens=[n, 1.25 * n], seconds=[1e-3, 2e-3],
                                   size=n)
        return p

    p = policy()
    assert run(p) >= 10  # runs of plain steps between the changes of batch (and re-measurement bursts)
    q = policy()  # the same steps, its run flushed after every step: the per-step count
    flushing = q.observe

    def observe_and_flush(*args, **kwargs):
        flushing(*args, **kwargs)
        if q._run_steps:
            q._flush_run()
    q.observe = observe_and_flush
    run(q)
    for r in ("b", "c", "s"):
        assert p.expected_gain(r) == pytest.approx(q.expected_gain(r), rel=1e-12)
        assert p._acc[r] == pytest.approx(q._acc[r], rel=1e-12)
    assert "a" not in p._acc and "a" not in p._drift


def test_no_draft_made_tells_nothing_about_acceptance_but_counts_as_no_gain():
    """A request asked for drafts that got none (ngram found no match) keeps its acceptance estimates, and its
    expected gain falls with the share of its asks that got drafts (what drafting is worth to it)."""
    p = SpeculationPolicy(k=2)
    before, acc = p.expected_gain("r"), list(p._global[False])
    for _ in range(6):
        assert p.plan(["r"]) in ([0], [2])
        p.observe(["r"], [0], [0], 1e-3)
    assert p._acc["r"] == pytest.approx(acc) and p._global[False] == pytest.approx(acc)
    assert p.expected_gain("r") < 0.5 * before


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

    def plan(self, req_ids, sampled=False, remaining=None):
        self.plain -= 1
        widths = [0 if self.plain >= 0 else self.k] * len(req_ids)
        self._planned = dict(zip(req_ids, widths))
        return widths


@pytest.mark.parametrize("method,k", [("ngram", 4), ("suffix", 4), ("draft_model", 3), ("eagle3", 3), ("medusa", 2),
                                      ("dflash", 3)])
def test_plain_steps_skip_or_observe_and_output_is_unchanged(method, k):
    """Plain steps, then drafting steps, for the same requests: greedy output is the baseline's; on plain steps
    a skippable proposer is not called, one with ``observe`` only observes, any other proposes (drafts
    dropped)."""
    if method == "suffix":
        pytest.importorskip("arctic_inference.suffix_decoding", reason="suffix needs arctic-inference (`make install`)")
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
    assert p.stats.steps_plain <= MIN_PLAIN + 8 * BURST[0]  # the warm-up and a few re-measurement bursts


def test_an_unpiped_plain_step_is_not_timed_as_plain_and_counts_in_the_next_switch():
    """Plain steps of a plain run take 1 ms (their host work overlapped with the device's); the last one before a
    drafting step could not queue the next (``unpiped``) and took 2.5 ms. It stays out of the plain estimate,
    which keeps 1 ms, and its extra 1.5 ms is added to the cost of the switch into drafting; without the flag the
    same step is timed as plain."""
    def run(unpiped):
        p = SpeculationPolicy(k=2)
        ids = ["a", "b"]
        b = p._bucket_for(2)
        b.tokens, b.seconds, b.count = [2.0, 5.0], [1e-3, 2e-3], [10, 10]
        b.decided, b.winner, b.gap, b.since, b.last = True, 1, 64, 1, 0
        p._last_mode = 0
        p._planned = {"a": 0, "b": 0}
        p.observe(ids, [0, 0], [0, 0], 2.5e-3, unpiped=unpiped)
        plain = (b.count[0], b.seconds[0])
        for _ in range(SETTLE[1]):  # the switch into drafting: its settling steps, 2 ms as usual
            p._planned = {"a": 2, "b": 2}
            p.observe(ids, [2, 2], [1, 1], 2e-3)
        return plain, b.switch[1]
    (count, seconds), switch = run(True)
    assert count == 10 and seconds == pytest.approx(1e-3)
    assert switch == pytest.approx(0.15 * 1.5e-3)  # one switch's weight (ALPHA_LOSER) of the extra 1.5 ms
    (count, seconds), switch = run(False)
    assert count == 11 and seconds > 1.05e-3 and switch == 0.0


def test_plain_reason_names_each_plain_step_and_the_timed_ones_are_the_warm_up_and_bursts():
    """``plain_reason`` after each plan: the reason counted in the stats ("" for a drafting step); where drafting
    wins, the plain steps are the warm-up's and the re-measurement bursts' (TIMED_PLAIN: the engine runs them bare,
    as a long plain run's steps)."""
    p = SpeculationPolicy(k=2)
    ids, seen = ["a", "b"], []
    for _ in range(2 * GAP_MAX):
        widths = p.plan(ids)
        before = dict(p.stats.plain_reasons)
        seen.append(p.plain_reason)
        assert (p.plain_reason == "") == any(widths)
        if p.plain_reason:
            assert before.get(p.plain_reason, 0) >= 1
        mode = int(any(widths))
        p.observe(ids, widths, [min(2, w) for w in widths], (1e-3, 1.2e-3)[mode])  # drafting pays: 3 tokens
    plain = [r for r in seen if r]
    assert plain[:MIN_PLAIN] == ["warmup"] * MIN_PLAIN and "remeasure" in plain and set(plain) <= set(TIMED_PLAIN)
    assert len(plain) == p.stats.steps_plain


def test_a_bursts_later_plain_steps_read_no_request_and_decide_as_if_they_did(monkeypatch):
    """While drafting wins, a re-measurement burst's plain steps past its first read no request's estimates (in
    plan or would_draft, except the last one's look at the drafting step after it): what they cost the policy is
    what a plain run's steps cost, not a pass over the batch, since they time the plain mode. Each step's widths
    are those of the full rule, which reads every request on every step."""
    import random

    import specdec.policy as module

    def run(shortcut: bool) -> tuple[list[list[int]], list[int]]:
        if not shortcut:
            monkeypatch.setattr(module._Bucket, "burst_unread", lambda self: False)
        p = SpeculationPolicy(k=3)
        ids = [f"r{i}" for i in range(8)]
        rng = random.Random(3)
        reads = []
        real = p.expected_gain
        p.expected_gain = lambda r: reads.append(1) or real(r)
        plans, per_step = [], []
        for step in range(1500):
            ids = ids[1:] + [f"n{step}"] if step % 97 == 96 else ids  # requests come and go
            before = len(reads)
            widths = p.plan(ids)
            if not any(widths):
                p.would_draft(ids)
            per_step.append(len(reads) - before if not any(widths) and p.plain_reason == "remeasure" else -1)
            plans.append(widths)
            accepted = [min(w, rng.choice((0, 1, 2, 3, 3))) for w in widths]
            p.observe(ids, widths, accepted, (1e-3, 1.4e-3 + rng.random() * 2e-4)[int(any(widths))])
        monkeypatch.undo()
        return plans, per_step

    fast, fast_reads = run(True)
    full, full_reads = run(False)
    assert fast == full
    burst = [n for n in fast_reads if n >= 0]
    assert len(burst) >= 20 and sum(1 for n in burst if n == 0) >= len(burst) // 2  # most of them read nobody
    full_burst = [n for n in full_reads if n >= 0]
    # per burst of four: the first reuses the drafting step's reads, the last looks ahead at the next drafting step
    # (both rules), the full rule reads all eight requests on the two between
    assert sum(full_burst) >= 3 * sum(burst) > 0


def test_plain_steps_are_counted_by_reason():
    """The warm-up's plain steps, plain winning, a request expecting nothing and the end of a batch are told
    apart in the stats (and in ``as_dict``)."""
    p = SpeculationPolicy(k=2)
    _feed(p, ["a"], [0], {0: 1e-3, 1: 3e-3}, 200)  # drafting accepts nothing and is slower: plain wins
    reasons = p.stats.plain_reasons
    assert reasons["warmup"] == MIN_PLAIN and reasons["slower"] > 150 and set(reasons) <= set(PLAIN_REASONS)
    assert sum(reasons.values()) == p.stats.steps_plain
    # its drafting steps: the warm-up's (MIN_SPEC until the loser is clear), then re-measurement bursts only
    _feed(p, ["a"], [0], {0: 1e-3, 1: 3e-3}, 2 * GAP_MAX)  # past the gap (GAP_MAX here): bursts
    drafted = p.stats.draft_reasons
    assert drafted["warmup"] >= MIN_SPEC and drafted["remeasure"] > 0 and "faster" not in drafted
    assert sum(drafted.values()) == p.stats.steps_drafted and set(drafted) <= set(DRAFT_REASONS)
    w = SpeculationPolicy(k=2)
    _feed(w, ["a"], [2], {0: 1e-3, 1: 1.2e-3}, 100)  # drafting accepts both and pays: the winner
    assert w.stats.draft_reasons["faster"] > 50 and w.stats.as_dict()["drafted_faster"] > 50
    q = SpeculationPolicy(k=3)
    b = q._bucket_for(2)
    b.tokens, b.seconds, b.count = [2.0, 5.0], [1e-3, 1.8e-3], [10, 10]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    q._acc = {"fast": [0.8, 0.75, 1.0], "slow": [0.3, 0.0, 0.0], "none": [0.0, 0.0, 0.0], "zero": [0.0] * 3}
    q._end = {"fast": (10.0, 20.0, 44.0), "slow": (10.0, 3.0, 3.0)}
    assert q.plan(["fast", "slow"], remaining=[10, 50]) == [0, 0]
    assert q.plan(["none", "zero"]) == [0, 0]
    assert q.stats.plain_reasons == {"batch_end": 1, "no_gain": 1}
    d = q.stats.as_dict()
    assert d["plain_batch_end"] == 1 and d["plain_no_gain"] == 1 and d["plain_warmup"] == 0


def test_a_switch_in_another_bucket_is_not_timed_either():
    """The batch shrinks during a plain run (bucket 8 -> 4): the first drafting step at 4 catches up the whole run
    (slow here, 10 ms) though bucket 4's own last step drafted too. It is a switch of the engine's mode, so it
    stays out of bucket 4's spec estimate, which keeps its steady 1 ms; a step in the same mode as the engine's
    last one is timed as before."""
    p = SpeculationPolicy(k=2)
    ids = ["a", "b", "c"]
    _feed(p, ids, [2], {0: 1e-3, 1: 1e-3}, 3 * WARMUP)  # bucket 4 warmed up: drafting wins there
    b4 = p.cost[4]
    assert b4.winner == 1 and b4.last == 1 and b4.seconds[1] == pytest.approx(1e-3)
    others = [f"x{i}" for i in range(8)]
    _feed(p, others, [0], {0: 1e-3, 1: 3e-3}, 3 * WARMUP)  # bucket 8, other requests: nothing accepted, plain wins
    assert p.cost[8].winner == 0 and p.cost[8].last == 0
    count = b4.count[1]
    widths = p.plan(ids)
    assert all(widths)
    p.observe(ids, widths, [2, 2, 2], 10e-3)  # the catch-up of bucket 8's plain run
    assert b4.count[1] == count and b4.seconds[1] == pytest.approx(1e-3)
    for _ in range(SETTLE[1] + 2):  # then steady drafting steps: timed once the settling ones are past
        widths = p.plan(ids)
        p.observe(ids, widths, [2, 2, 2], 1e-3)
    assert b4.count[1] > count and b4.seconds[1] == pytest.approx(1e-3)


def _chains(rng, widths, accept):
    """Accepted drafts of each chain of ``widths`` drafts: each accepted with probability ``accept``, up to the
    first rejection."""
    accepted = []
    for w in widths:
        n = 0
        while n < w and rng.random() < accept:
            n += 1
        accepted.append(n)
    return accepted


def _simulate(k, batch, accept, plain_ms, spec_ms, steps, catch_up, seed):
    """A synthetic machine: plain steps of ``plain_ms``, drafting steps of ``spec_ms`` (the first after plain
    ones ``catch_up`` longer), each draft accepted with probability ``accept`` (a chain stops at the first
    rejection), step times +-10% at random. Returns the share of the better fixed mode's throughput kept."""
    import random

    rng, p, ids, last = random.Random(seed), SpeculationPolicy(k), [f"r{i}" for i in range(batch)], 0
    tokens = seconds = 0.0
    for _ in range(steps):
        widths = p.plan(ids)
        mode = int(any(widths))
        accepted = _chains(rng, widths, accept)
        t = (spec_ms * (1 + catch_up * (last == 0)) if mode else plain_ms) * rng.uniform(0.9, 1.1)
        p.observe(ids, widths, accepted, t * 1e-3)
        tokens, seconds, last = tokens + batch + sum(accepted), seconds + t, mode
    expected = sum(accept ** i for i in range(1, k + 1))  # accepted drafts per request of a drafting step
    return tokens / seconds / max(batch / plain_ms, batch * (1 + expected) / spec_ms)


@pytest.mark.parametrize("k, batch, accept, plain_ms, spec_ms, catch_up", [
    (3, 8, 0.3, 3.8, 11.5, 0.5),  # drafting at 0.47x plain's rate (dflash on the CPU at batch 8)
    (2, 8, 0.25, 3.5, 6.6, 0.0),  # 0.70x (medusa)
    (3, 8, 0.8, 3.8, 7.2, 0.0),  # 1.56x (ngram)
    (3, 1, 0.3, 2.0, 5.0, 0.5),  # 0.57x
    (4, 1, 0.85, 2.0, 2.9, 0.0),  # 2.56x
    (3, 1, 0.6, 2.0, 4.6, 0.3),  # 0.95x: nearly a tie
    (2, 32, 0.3, 1.9, 2.8, 0.0),  # 0.94x
    (3, 32, 0.7, 1.9, 4.1, 0.3),  # 1.17x
])
def test_keeps_the_better_modes_throughput_on_short_and_long_runs(k, batch, accept, plain_ms, spec_ms, catch_up):
    """Whichever mode is faster and by however much, the policy keeps >= 94% of its throughput over 300 steps
    (warm-up included) and >= 96.5% over 1500 (issue 24: no row below 0.97x, >= 95% of fixed k where it pays).
    Before the warm-up ended on a clear difference and the re-measurement gaps followed the loss, the 0.47x case
    kept 73% over 300 steps."""
    for steps, floor in ((300, 0.94), (1500, 0.965)):
        kept = [_simulate(k, batch, accept, plain_ms, spec_ms, steps, catch_up, seed) for seed in range(3)]
        assert min(kept) >= floor, (steps, kept)


def test_a_seeded_bucket_keeps_its_neighbours_ratio_until_it_measures_both_modes():
    """A bucket seeded from batch 8 (plain 1 ms, drafting 4 ms for twice the tokens) whose first own step drafts
    in 0.5 ms (a smaller batch is faster): both inherited times are rescaled, so plain still wins 2:1 (copied as
    they were, 1 ms plain against 0.5 ms drafting made drafting look 4x faster); the seed then counts as
    SEED_WEIGHT steps of the running average."""
    from specdec.policy import SEED_WEIGHT, _Bucket

    b = _Bucket(tokens=[1.0, 2.0], seconds=[1e-3, 4e-3], seeded=True, decided=True, size=1)
    b.add(1, 2.0, 0.5e-3)
    assert b.seconds == pytest.approx([0.125e-3, 0.5e-3])
    assert b.rate(1) / b.rate(0) == pytest.approx(0.5)
    b.add(1, 4.0, 0.5e-3)  # a step with twice the tokens moves the estimate by 1 / (2 + SEED_WEIGHT)
    assert b.tokens[1] == pytest.approx(2.0 + 2.0 / (2 + SEED_WEIGHT))


def test_tokens_count_per_request_at_the_buckets_nominal_size():
    """Steps of 17 and of 32 requests share the bucket of 32; their tokens count per request (x 32), so a plain
    step late in a shrinking batch reads 32 tokens, not 17 (on the H200 both take about the same time)."""
    p = SpeculationPolicy(k=2)
    ids = [str(i) for i in range(17)]
    p.plan(ids)
    p.observe(ids, [0] * 17, [0] * 17, 1e-3)
    assert p.cost[32].tokens[0] == pytest.approx(32.0)


@pytest.mark.parametrize("tree_ms, winner", [(1.6e-3, 1), (3.0e-3, 0)])
def test_a_tree_proposers_drafting_steps_choose_trees_or_chains(tree_ms, winner):
    """Trees accept 3 a step, their first-child chains 2; a chain step takes 1.5 ms (2.0 tokens/ms), a tree step
    1.6 ms (2.5 tokens/ms: trees win) or 3 ms (1.33: chains win); plain steps (1 token/ms) lose to both. After the
    warm-ups nearly every step drafts, with the faster shape, and the stats count the tree steps."""
    p = SpeculationPolicy(k=4, trees=True)
    ids = ["a"]
    shapes = []
    for _ in range(600):
        widths = p.plan(ids)
        if not any(widths):
            p.observe(ids, widths, [0], 1e-3, tree=None)
            shapes.append(-1)
            continue
        tree = p.tree_step
        p.observe(ids, widths, [3 if tree else 2], tree_ms if tree else 1.5e-3, tree=tree)
        shapes.append(int(tree))
    tail = shapes[300:]
    assert tail.count(winner) / len(tail) > 0.9, tail
    assert p.shape[1].winner == winner and p.cost[1].winner == 1
    assert p.stats.steps_tree == shapes.count(1) > 0
    assert shapes.count(0) >= MIN_PLAIN  # chains first in the shape warm-up


def _waves(policy, accepted, seconds, waves, steps, sampled=False, start=0):
    """``waves`` of 8 new requests, each decoded for ``steps`` decisions then forgotten (as the engine does when a
    request finishes); every drafting row accepts ``accepted`` drafts. Returns each step's mode."""
    modes = []
    for w in range(start, start + waves):
        ids = [f"w{w}r{i}" for i in range(8)]
        for _ in range(steps):
            widths = policy.plan(ids, sampled)
            modes.append(int(any(widths)))
            policy.observe(ids, widths, [min(accepted, n) for n in widths], seconds[modes[-1]], sampled=sampled)
        for r in ids:
            policy.forget(r)
    return modes


def test_estimates_that_fell_on_one_workload_do_not_keep_the_next_from_drafting():
    """Prompts on which drafting gets nothing accepted (plain wins), then prompts on which it pays 2.4x: the
    re-measurement bursts ask every request for drafts, whatever its estimate (filtered by the estimates, which
    had fallen below MIN_GAIN, no later request was ever asked and the engine never drafted again), and the
    losing mode's burst weighs enough to switch within a few bursts."""
    p = SpeculationPolicy(k=4)
    seconds = {0: 0.5e-3, 1: 1.0e-3}
    _waves(p, 3, seconds, 3, 100)  # drafting paid: hundreds of timed drafting steps behind its estimate
    assert p.cost[8].winner == 1 and p.cost[8].count[1] > 250
    first = _waves(p, 0, seconds, 6, 100, start=3)
    assert p.cost[8].winner == 0 and sum(first[-300:]) <= 3 * BURST[1]
    assert p.expected_gain("new") < MIN_GAIN  # the method-wide estimates fell too
    later = _waves(p, 3, seconds, 12, 100, start=9)
    assert p.cost[8].winner == 1
    switch = next(i for i in range(len(later)) if all(later[i:i + 50]))
    assert switch <= GAP_MAX + 2 * BURST[1]
    assert sum(later[-300:]) >= 0.95 * 300  # plain only in its bursts


def test_sampled_requests_keep_their_own_method_wide_estimates():
    """Acceptance of sampled requests (low at T = 0.8) is not what a new greedy request starts from, and the other
    way round."""
    p = SpeculationPolicy(k=3)
    greedy = p.expected_gain("g")
    _waves(p, 0, {0: 0.5e-3, 1: 1.0e-3}, 2, 40, sampled=True)
    assert p.expected_gain("g") == pytest.approx(greedy) and p._global[False] == pytest.approx([PRIOR] * 3)
    p._sampled["s"] = True
    sampled = p.expected_gain("s")
    assert sampled < 0.5 * greedy
    _waves(p, 3, {0: 0.5e-3, 1: 0.6e-3}, 1, 40, start=2)
    assert p.expected_gain("s") == pytest.approx(sampled) and p.expected_gain("g") > greedy


def test_one_burst_is_enough_to_notice_that_drafting_pays_again():
    """Hundreds of drafting steps timed while drafting paid, then requests that accept one draft of four (drafting
    loses, but every request still drafts when asked), then requests that accept three: the first re-measurement
    burst moves the losing mode's estimate far enough to switch (weighed like the winner's steps, ALPHA_COST each,
    it took two)."""
    p = SpeculationPolicy(k=4)
    seconds = {0: 0.5e-3, 1: 1.2e-3}
    _waves(p, 3, seconds, 4, 100)
    assert p.cost[8].winner == 1 and p.cost[8].count[1] > 350
    _waves(p, 1, seconds, 4, 100, start=4)
    assert p.cost[8].winner == 0
    later = _waves(p, 3, seconds, 4, 100, start=8)
    first = later.index(1)
    assert all(later[first:first + BURST[1] + 8])  # the burst ran on into drafting: the winner changed at once


def _tie(extra, steps=3000):
    """Two requests, drafting exactly as fast as plain steps (2 tokens a request in 2 ms against 1 in 1 ms), the
    first drafting step after plain ones ``extra`` seconds longer (a draft model's catch-up). Returns the number of
    switches between the modes and the policy."""
    p, ids, modes = SpeculationPolicy(k=3), ["a", "b"], []
    for _ in range(steps):
        widths = p.plan(ids)
        modes.append(int(any(widths)))
        switched_in = modes[-1] == 1 and len(modes) > 1 and modes[-2] == 0
        p.observe(ids, widths, [min(1, w) for w in widths], (2e-3 if modes[-1] else 1e-3) + extra * switched_in)
    return sum(a != b for a, b in zip(modes, modes[1:])), p


def test_re_measurement_bursts_are_spaced_by_what_a_switch_costs():
    """Near a tie the losing mode's bursts came every GAP_FIRST decisions; with a switch that costs (a draft model's
    catch-up after plain steps) that cost more than either mode alone (H200, batch 8: 0.87x of the baseline where
    fixed k ran 1.06x). The settle steps' extra time is measured per mode of the switch and bursts are spaced so
    that the two switches of a burst cost at most REGRET of the time too."""
    free, _ = _tie(0.0)
    costly, p = _tie(5e-3)
    assert p.cost[2].switch[1] == pytest.approx(5e-3, rel=0.2) and p.cost[2].switch[0] == 0.0
    row = p.cost_table()[2]  # the report shows what a switch costs
    assert row["spec_switch_ms"] == pytest.approx(p.cost[2].switch[1] * 1e3, abs=1e-4) and row["plain_switch_ms"] == 0
    assert costly < 0.15 * free, (costly, free)
    b = p.cost[2]
    assert b.gap >= 0.9 * b.switch[1] / (b.seconds[b.winner] * REGRET)  # ~235 decisions (GAP_FIRST: 8)


def test_a_one_time_switch_cost_is_clipped():
    """A switch whose extra time is far above the average (on the H200 a Triton compile for a new catch-up width,
    ~0.1 s once) enters the average at most SWITCH_CLIP times it: one such switch after many at 5 ms moves the
    estimate by ALPHA_LOSER * (SWITCH_CLIP - 1) of it, not to tens of milliseconds."""
    from specdec.policy import SWITCH_CLIP

    _, p = _tie(5e-3)
    b = p.cost[2]
    before = b.switch[1]
    ids, modes = ["a", "b"], []
    while b.switch[1] == before:  # run on until the next switch into drafting has settled, that one costing 0.1 s
        widths = p.plan(ids)
        modes.append(int(any(widths)))
        switched_in = modes[-1] == 1 and len(modes) > 1 and modes[-2] == 0
        p.observe(ids, widths, [min(1, w) for w in widths], (2e-3 if modes[-1] else 1e-3) + 0.1 * switched_in)
    assert b.switch[1] == pytest.approx(before + ALPHA_LOSER * (SWITCH_CLIP - 1) * before, rel=1e-6)


def test_a_switch_cost_that_repeats_is_learned_at_once():
    """Cheap switches first (~1 ms), then every switch into drafting costs 15 ms (on the H200 a bare run's recompute,
    once plain runs grew long): the first such switch is clipped like a one-off (weight ALPHA_LOSER), the next ones
    are not (the last switch cost as much) and weigh ALPHA_SWITCH, so the estimate is within 15% of 15 ms after four
    switches (at ALPHA_LOSER it was still under half of it, and the gap it sets stayed short), and the next gap
    between bursts follows it."""
    _, p = _tie(1e-3)
    b = p.cost[2]
    assert b.switch[1] == pytest.approx(1e-3, rel=0.3)
    ids, modes, learned = ["a", "b"], [], []
    while len(learned) < 4:
        widths = p.plan(ids)
        modes.append(int(any(widths)))
        switched_in = modes[-1] == 1 and len(modes) > 1 and modes[-2] == 0
        before = b.switch[1]
        p.observe(ids, widths, [min(1, w) for w in widths], (2e-3 if modes[-1] else 1e-3) + 15e-3 * switched_in)
        if b.switch[1] != before:
            learned.append(b.switch[1])
    # the first clipped at SWITCH_CLIP times the estimate; from the second on, each moves ALPHA_SWITCH towards 15 ms
    assert learned[0] < 2e-3
    assert learned[1] == pytest.approx(learned[0] + ALPHA_SWITCH * (15e-3 - learned[0]), rel=1e-3)
    assert learned[3] > 0.85 * 15e-3
    assert b.next_gap() >= min(b.gap_max(), 0.9 * b.switch[1] / (b.seconds[b.winner] * REGRET))


def test_drafting_steps_that_draft_nothing_are_timed_apart():
    """A lookup method's matches come in stretches: a drafting step whose proposer drafted for nobody is averaged
    apart (``empty``), so a stretch without matches leaves the drafting steps' tokens and time as they were, and
    the rule mixes the two at the chance that asking gets drafts now (a stretch that left drafting at one token a
    step made auto pick plain where fixed k ran 1.04x: CPU, ngram, batch 1, T = 0.8)."""
    p = SpeculationPolicy(k=4)
    _feed(p, ["r"], [3], {0: 2.5e-3, 1: 4e-3}, 200)  # matches: 4 tokens in 4 ms against 1 in 2.5 ms
    b = p.cost[1]
    assert b.winner == 1 and b.empties == 0
    tokens, seconds = b.tokens[1], b.seconds[1]
    for _ in range(40):  # a stretch without matches: every ask drafts nothing
        widths = p.plan(["r"])
        p.observe(["r"], [0], [0], (2.7e-3 if any(widths) else 2.5e-3))
    assert b.empties > 0 and b.empty == pytest.approx(2.7e-3)
    assert (b.tokens[1], b.seconds[1]) == (tokens, seconds)
    b.found, b.now = 0.5, b.share  # half the asks get drafts; the request's estimates as when timed
    assert b.rate(1) == pytest.approx((0.5 * tokens + 0.5) / (0.5 * seconds + 0.5 * 2.7e-3))
    row = p.cost_table()[1]
    assert row["spec_empty_steps"] == b.empties and row["spec_empty_ms"] == pytest.approx(2.7)


def test_the_chance_of_drafts_follows_the_last_ask_and_the_steps_since():
    """Whether an ask gets drafts is a two-state chain learned method-wide (after an ask that got none / some):
    right after an ask its chance is the chain's for that outcome, and steps later it tends to the chain's
    stationary share."""
    p = SpeculationPolicy(k=2)
    f0, f1 = 0.1, 0.8
    p._found_after[False] = [f0, f1]
    pi = f0 / (1 - f1 + f0)
    assert p._found_chance(None, False) == pytest.approx(pi)
    p._steps = 10
    assert p._found_chance((0, 10), False) == pytest.approx(f0)
    assert p._found_chance((1, 10), False) == pytest.approx(f1)
    assert p._found_chance((0, 7), False) == pytest.approx(pi + (f0 - pi) * (f1 - f0) ** 3)
    assert p._found_chance((1, -200), False) == pytest.approx(pi)
    q = SpeculationPolicy(k=2)  # learned from consecutive asks: got, got, none, none, none, got
    for made in (2, 2, 0, 0, 0, 2):
        q._planned = {"r": 2}
        q.observe(["r"], [made], [0], 1e-3)
    a = ALPHA_GLOBAL
    assert q._found_after[False][1] == pytest.approx(1 - a)  # got -> got, then got -> none
    assert q._found_after[False][0] == pytest.approx((1 - a) ** 2 + a * (1 - (1 - a) ** 2))  # none -> none x 2, -> got
    assert q._found_last["r"] == (1, 6)


def test_a_proposer_that_never_drafts_ends_the_warm_up_and_loses():
    """Asks that never get drafts count towards the warm-up's end (:data:`WARMUP`): plain wins, and drafting is
    only re-measured in bursts."""
    p = SpeculationPolicy(k=3)
    modes = []
    for _ in range(400):
        widths = p.plan(["r"])
        modes.append(int(any(widths)))
        p.observe(["r"], [0], [0], 1.1e-3 if any(widths) else 1e-3)
    b = p.cost[1]
    assert b.decided and b.winner == 0 and b.count[1] == 0
    assert sum(modes[MIN_PLAIN + WARMUP + 10:]) / len(modes[MIN_PLAIN + WARMUP + 10:]) < 0.2


def _stretches(batch, seed, steps=3000, k=4, stay=0.95, share=0.2, accept=0.8, plain_ms=2.5, empty_ms=2.7,
               found_ms=4.0, policy=True):
    """A prompt-lookup method on a synthetic machine: each request copies (matches found, each draft accepted
    with probability ``accept``) for stretches (a two-state chain: ``share`` of the steps, staying with
    probability ``stay``), and elsewhere finds a match on 5% of its asks (accepted with probability 0.2). A
    drafting step with no match anywhere takes ``empty_ms``, one with matches up to ``found_ms`` (in proportion to
    the rows that got drafts), a plain step ``plain_ms``; +-10% at random. Returns tokens per ms over plain's."""
    import random

    rng, p, ids = random.Random(seed), SpeculationPolicy(k), [f"r{i}" for i in range(batch)]
    state = [rng.random() < share for _ in ids]
    enter = (1 - stay) * share / (1 - share)
    tokens = ms = 0.0
    for _ in range(steps):
        widths = p.plan(ids) if policy else [k] * batch
        drafted, accepted = [], []
        for i, w in enumerate(widths):
            if w and (state[i] or rng.random() < 0.05):
                n, a = 0, accept if state[i] else 0.2
                while n < w and rng.random() < a:
                    n += 1
                drafted.append(w)
                accepted.append(n)
            else:
                drafted.append(0)
                accepted.append(0)
        found = sum(1 for d in drafted if d)
        t = plain_ms if not any(widths) else empty_ms + (found_ms - empty_ms) * found / batch
        t *= rng.uniform(0.9, 1.1)
        if policy:
            p.observe(ids, drafted, accepted, t * 1e-3)
        tokens, ms = tokens + batch + sum(accepted), ms + t
        state = [rng.random() < stay if s else rng.random() < enter for s in state]
    return tokens / ms / (batch / plain_ms)


@pytest.mark.parametrize("batch, found_ms, empty_ms", [(1, 4.0, 2.7), (8, 4.0, 2.7), (8, 9.0, 3.0)])
def test_matches_in_stretches_keep_the_better_modes_throughput(batch, found_ms, empty_ms):
    """Where a lookup method's matches come in stretches, auto keeps >= 95% of the better of fixed k and plain
    decoding over 3000 steps (at batch 8 with costly drafting steps fixed k runs 0.83x; auto stays near 1)."""
    for seed in range(3):
        auto = _stretches(batch, seed, found_ms=found_ms, empty_ms=empty_ms)
        fixed = _stretches(batch, seed, found_ms=found_ms, empty_ms=empty_ms, policy=False)
        assert auto >= 0.95 * max(1.0, fixed), (seed, auto, fixed)


def test_a_proposer_that_never_drafts_costs_plain_steps_no_pass_over_the_requests():
    """Once plain has won against a proposer that never drafted anything, the rule needs no request's estimates
    (:meth:`_Bucket.plain_regardless`): on the H200 reading them on every plain step (and in ``would_draft``) made
    ngram@auto's plain steps at T = 0.8 on a random target 0.77 ms against the baseline's 0.55 (batch 1)."""
    p = SpeculationPolicy(k=3)
    for _ in range(MIN_PLAIN + WARMUP + 5):
        widths = p.plan(["r"])
        p.observe(["r"], [0], [0], 1.1e-3 if any(widths) else 1e-3)
    assert p.cost[1].plain_regardless()
    read = []
    p.expected_gain = lambda r: read.append(r) or 0.0
    p._gains.clear()
    assert p.plan(["r"]) == [0] and read == []


def test_while_plain_wins_at_the_requests_estimates_they_are_read_every_few_steps():
    """Plain wins because no request would draft now (drafting pays only with their drafts accepted): the rule
    reads their estimates again every READ_EVERY decisions, not every step (at batch 32 on the H200 reading them
    on every plain step cost ~0.13 ms a step), and would_draft agrees with the next plan."""
    from specdec.policy import READ_EVERY

    p = SpeculationPolicy(k=3)
    ids = [f"r{i}" for i in range(4)]
    _feed(p, ids, [3], {0: 1e-3, 1: 1.5e-3}, 120)  # 4 tokens a request in 1.5 ms: drafting wins
    b = p.cost[4]
    assert b.winner == 1
    for _ in range(60):  # then nothing accepted: every request falls below MIN_GAIN, and plain wins
        widths = p.plan(ids)
        p.observe(ids, widths, [0] * 4, 1.5e-3 if any(widths) else 1e-3)
    assert b.winner == 0 and b.now == 0.0 and not b.plain_regardless()
    reads = []
    gain = p.expected_gain
    p.expected_gain = lambda r: reads.append(r) or gain(r)
    modes = []
    for _ in range(4 * READ_EVERY):
        ahead = p.would_draft(ids)
        widths = p.plan(ids)
        assert ahead == any(widths)
        modes.append(any(widths))
        p.observe(ids, widths, [0] * 4, 1.5e-3 if any(widths) else 1e-3)
    plain_steps = modes.count(False)
    assert plain_steps >= 3 * READ_EVERY
    # would_draft and plan each read them: every READ_EVERY decisions, and around each drafting step (of 2 * 4 * 32
    # reads if every step read them)
    assert len(reads) <= 2 * len(ids) * (4 + 2 * modes.count(True) + 1)


def test_the_end_rule_benchmark_runs_both_rules_against_the_baseline():
    """``benchmarks/end_rule.py``: one row per workload and temperature, each rule's ratio to the baseline and the
    share of its steps that drafted; its experimental rule sees each slot's chain once no more wait than run."""
    import importlib.util
    import pathlib
    import subprocess
    import sys

    bench = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    proc = subprocess.run([sys.executable, str(bench / "end_rule.py"), "--device", "cpu", "--method", "ngram:2",
                           "--workload", "repeated", "--temperature", "0", "--prompts", "4", "--batch", "2",
                           "--max-tokens", "12", "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          cwd=bench)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 2 and [c.strip() for c in rows[1][:2]] == ["repeated", "0"]
    assert all(float(c.strip().rstrip("x")) > 0 for c in rows[1][2:4]) and rows[1][4].count("%") == 2

    spec = importlib.util.spec_from_file_location("end_rule", bench / "end_rule.py")
    sys.path.insert(0, str(bench))
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(bench))
    from specdec.calls import Call
    from specdec.requests import Request

    llm = mod.one_wave_before(LLM(specdec.bundled_model("tiny"), {"method": "ngram", "num_speculative_tokens": 2},
                                  device="cpu", max_num_seqs=3))

    def req(i, max_tokens, done=0):
        r = Request(f"r{i}", None, [1, 2, 3], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        r.output, r.num_tokens = [7] * done, 3 + done
        return r

    policy = llm.policy
    policy.reqs = [req(0, 12, 2), req(1, 50), req(2, 31, 1)]
    assert policy._chains() == ([10, 50, 30], None)
    llm._calls.submit(Call(remaining=2, requests=[req(3, 40), req(4, 15)]))
    # the 40 behind the 10 (free first), then the 15 behind the 30 (free at 30, before 50 and 10 + 40)
    assert policy._chains() == ([10, 50, 30], [40, 0, 15])
    scheduled = mod.ScheduledEnd(2)
    scheduled.llm, scheduled.reqs = llm, policy.reqs
    assert scheduled._chains() == ([10, 50, 30], [40, 15])  # the waiting requests' tokens, for each mode to place
    policy.reqs = policy.reqs[:1]
    assert policy._chains() == (None, None)  # two wait, one runs

    # the two forms of the experiment on one case: plain steps 1 ms, drafting 1.8 ms; "fast" (2 accepted drafts a
    # step) has 50 tokens left, "slow" (0.3) 40, and one waiting request 30. By plain progress the waiting one goes
    # behind "slow": 40 / 1.3 + 30 / 3 = 40.8 drafting steps (73 ms) against 70 plain ones, no. Scheduled by mode,
    # drafting frees "fast" first (16.7 steps) and it takes the waiting one: 30.8 drafting steps (55 ms), yes.
    cases = ((mod.OneWaveBefore, ([50, 40], [0, 30]), False), (mod.ScheduledEnd, ([50, 40], [30]), True))
    for rule, now, pays in cases:
        p = rule(k=3)
        b = p._bucket_for(2)
        b.tokens, b.seconds, b.count = [2.0, 5.0], [1e-3, 1.8e-3], [10, 10]
        b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
        p._acc = {"fast": [0.8, 0.75, 1.0], "slow": [0.3, 0.0, 0.0]}
        p._global[False] = [0.8, 0.75, 1.0]
        p._now = now
        assert p.pays_at_end(b, ["fast", "slow"], now[0]) is pays, rule


_CACHES = ("_plan_bucket", "_r1", "_fast", "_gains", "_gains_kept")  # the fast paths' own state (and a read cache)


def _state(p: SpeculationPolicy) -> dict:
    """Everything the policy decides from, but the fast paths' caches: buckets by value."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(p):
        if f.name in _CACHES:
            continue
        v = getattr(p, f.name)
        if isinstance(v, dict) and v and all(isinstance(b, specdec.policy._Bucket) for b in v.values()):
            v = {n: dataclasses.asdict(b) for n, b in v.items()}
        elif dataclasses.is_dataclass(v):
            v = dataclasses.asdict(v)
        out[f.name] = copy.deepcopy(v)
    return out


def _churn(p: SpeculationPolicy, seed: int, steps: int, plain_ms: float, spec_ms: float, accept: float):
    """A batch that changes (requests join and leave), greedy and sampled stretches, unpiped plain steps, the
    engine's would_draft before each observe, step times +-10% with rare 5x stalls, drafts found for some
    requests only; yields (step, plan's widths, would_draft's answer) after each step."""
    import random

    rng = random.Random(seed)
    ids, next_id, sampled = [f"r{i}" for i in range(8)], 8, False
    for step in range(steps):
        if rng.random() < 0.02:  # a request leaves, another joins
            gone = ids.pop(rng.randrange(len(ids)))
            p.forget(gone)
            if rng.random() < 0.8:
                ids.append(f"r{next_id}")
                next_id += 1
        if not ids:
            ids = [f"r{next_id}"]
            next_id += 1
        if rng.random() < 0.005:
            sampled = not sampled
        remaining = [rng.randrange(1, 200) for _ in ids] if rng.random() < 0.3 else None
        widths = p.plan(ids, sampled, remaining)
        ahead = p.would_draft(ids, sampled, remaining)
        mode = any(widths)
        drafted = [w if w and rng.random() < 0.7 else 0 for w in widths]
        accepted = _chains(rng, drafted, accept)
        t = (spec_ms if mode else plain_ms) * rng.uniform(0.9, 1.1) * (5.0 if rng.random() < 0.003 else 1.0)
        p.observe(ids, drafted, accepted, t * 1e-3, sampled=sampled, unpiped=not mode and rng.random() < 0.05)
        yield step, widths, ahead


@pytest.mark.parametrize("plain_ms, spec_ms, accept", [
    (0.55, 1.1, 0.3),  # plain wins clearly: long plain runs (the fast paths' case)
    (0.55, 0.75, 0.35),  # a tie: winners change, bursts, reads of the requests' estimates
    (0.55, 0.75, 0.55),  # drafting wins by ~15%
    (0.55, 0.7, 0.85),  # drafting wins
])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_plain_run_fast_paths_decide_as_the_full_rule(plain_ms, spec_ms, accept, seed):
    """plan / would_draft / observe's fast paths for a plain run (``_fast``) give the decisions and leave the state
    that the full rule does, step for step, over a changing batch (joins, leaves, greedy and sampled stretches,
    unpiped steps, stalls), and they are taken (where plain wins, most steps)."""
    fast, full = SpeculationPolicy(k=4), SpeculationPolicy(k=4)
    full._fast = False
    taken = 0
    sure = SpeculationPolicy._plain_sure

    def counting(self, b, decisions):
        nonlocal taken
        ok = sure(self, b, decisions)
        taken += ok
        return ok

    SpeculationPolicy._plain_sure = counting
    try:
        a = _churn(fast, seed, 3000, plain_ms, spec_ms, accept)
        b = _churn(full, seed, 3000, plain_ms, spec_ms, accept)
        for (step, wa, da), (_, wb, db) in zip(a, b):
            assert (wa, da) == (wb, db), step
            if step % 97 == 0:
                assert _state(fast) == _state(full), step
    finally:
        SpeculationPolicy._plain_sure = sure
    assert _state(fast) == _state(full)
    assert fast.stats == full.stats
    if plain_ms / spec_ms < 0.6:
        assert taken > 2000, taken  # plan and would_draft, each on most of 3000 steps


@pytest.mark.parametrize("seed", [0, 1])
def test_a_drafting_steps_gains_reach_the_next_plan_as_the_full_rule_reads_them(seed):
    """Where drafting wins, a drafting step's observe computes each request's expected gain for the next plan
    (``_fast``), which then reads none of them again: the decisions and the state stay the full rule's step for
    step over a changing batch, and the full rule computes a request's gain a step where the fast way does not."""
    fast, full = SpeculationPolicy(k=4), SpeculationPolicy(k=4)
    full._fast = False
    reads = {id(fast): 0, id(full): 0}
    gain = SpeculationPolicy.expected_gain

    def counting(self, req_id):
        reads[id(self)] += 1
        return gain(self, req_id)

    SpeculationPolicy.expected_gain = counting
    try:
        a = _churn(fast, seed, 2000, 0.55, 0.7, 0.85)
        b = _churn(full, seed, 2000, 0.55, 0.7, 0.85)
        kept = 0
        for (step, wa, da), (_, wb, db) in zip(a, b):
            assert (wa, da) == (wb, db), step
            if fast._gains_kept:  # what the next plan reads: exactly the full rule's reading now
                kept += 1
                assert fast._gains == {r: gain(full, r) for r in fast._gains}, step
    finally:
        SpeculationPolicy.expected_gain = gain
    assert _state(fast) == _state(full) and fast.stats == full.stats
    assert fast.stats.steps_drafted > 1500 and kept > 1500
    assert reads[id(fast)] < 0.1 * reads[id(full)], reads  # (new requests' and sampled stretches' gains only)


def test_tokens_left_are_counted_at_their_first_read_only():
    """The engine hands the policy its requests' tokens left as :class:`specdec.engine.TokensLeft`: its length
    without counting, the counts at the first read (then kept), equal to the list they stand for."""
    from types import SimpleNamespace

    from specdec.engine import TokensLeft

    counted = []

    def left(r):
        counted.append(r)
        return r.n

    reqs = [SimpleNamespace(n=n) for n in (5, 2, 9)]
    t = TokensLeft(SimpleNamespace(_tokens_left=left), reqs)
    assert len(t) == 3 and bool(t) and counted == []
    assert max(t) == 9 and t[1] == 2 and list(t) == [5, 2, 9] and t == [5, 2, 9] and [5, 2, 9] == t
    reqs[0].n = 0
    assert t[0] == 5 and len(counted) == 3  # counted once


def _calls_sim():
    """``benchmarks/policy_calls_sim.py``: the policy in a closed loop on a simulated engine."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_calls_sim.py"
    spec = importlib.util.spec_from_file_location("policy_calls_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _over_plain(argv: list[str]) -> list[float]:
    """The closed-loop simulation's time over every step plain, seeds 0-4, under the library's policy."""
    sim = _calls_sim()
    args = sim.parse_args(argv)
    ratios = []
    for seed in range(5):
        args.seed = seed
        ratios.append(sim.simulate(SpeculationPolicy, args)[0] / sim.plain_seconds(args))
    return ratios


def test_the_simulation_drafts_a_responses_first_tokens_and_later_calls_at_their_own_rates():
    """``--first-acc`` (a lookup method's first drafts of a response) and ``--acc-later`` (a workload that changes):
    with fixed k, drafts accepted never (first-acc 0 over every token) take one step a token, drafts accepted
    always take one step per k + 1 tokens; from call ``--later-calls`` on the later rates hold."""
    sim = _calls_sim()
    base = ["--calls", "4", "--per-call", "8", "--batch", "8", "--tokens", "64", "--plain-ms", "1", "--spec-ms", "2"]
    never = sim.parse_args(base + ["--acc", "1", "1", "1", "--first-acc", "0", "0", "0", "--first-tokens", "64"])
    always = sim.parse_args(base + ["--acc", "1", "1", "1"])
    assert sim.simulate(None, never)[0] == pytest.approx(4 * 64 * 2e-3)
    assert sim.simulate(None, always)[0] == pytest.approx(4 * 16 * 2e-3)
    turned = sim.parse_args(base + ["--acc", "1", "1", "1", "--acc-later", "0", "0", "0", "--later-calls", "1"])
    assert sim.simulate(None, turned)[0] == pytest.approx((16 + 3 * 64) * 2e-3)


@pytest.mark.parametrize("acc", [(0.95, 0.9, 0.85), (0.9, 0.85, 0.8)])
def test_calls_of_eight_stay_near_the_plain_floor_when_a_long_runs_switch_is_costly(acc):
    """Calls of 8 requests (the end rule decides), a switch into drafting of 20 ms after 16 or more plain steps
    and 0.5 ms after fewer (eagle3 at batch 8 on the H100: a bare run's recompute), plain 0.55 ms a step, drafting
    1.6 ms: over 5 seeds auto takes at most 6% more than every step plain (the switch after a long run learned
    apart, LONG_RUN, and charged in new buckets of a shrinking batch; with one average of both switches it took
    13% / 22% more, switching back into drafting ~100-240 times a run)."""
    ratios = _over_plain(["--acc", *map(str, acc), "--calls", "64", "--per-call", "8", "--batch", "8", "--tokens",
                          "128", "--plain-ms", "0.55", "--spec-ms", "1.6", "--switch-ms", "20", "--short-switch-ms",
                          "0.5", "--bare-after", "16"])
    assert sum(ratios) / len(ratios) <= 1.06, [round(t, 3) for t in ratios]


def test_the_machines_stalls_do_not_make_a_losing_drafting_mode_the_winner_in_a_closed_loop():
    """The H100's stalls (s42: a stretch of 2-7 ms steps fading over 20-40 against 0.55 ms, every ~400 steps;
    ``policy_calls_sim.py --episodes``) where drafting loses (eagle3-like: 1.3 ms drafting steps accepting 0.5 /
    0.3 / 0.2, a 16 ms switch after a bare run): auto takes at most 4% more than every step plain under the same
    stalls over seeds 0-5 (without the stale-loser rule, up to 7.7%: drafting taken for the winner in a stretch)."""
    sim = _calls_sim()
    ratios = []
    for seed in range(6):
        args = sim.parse_args(["--acc", "0.5", "0.3", "0.2", "--plain-ms", "0.55", "--spec-ms", "1.3", "--switch-ms",
                               "16", "--short-switch-ms", "1.5", "--episodes", "0.0025", "--calls", "64",
                               "--seed", str(seed)])
        plain = sim.simulate(sim.EveryStepPlain, args)[0]
        assert plain > sim.plain_seconds(args)  # (the stalls do cost)
        ratios.append(sim.simulate(SpeculationPolicy, args)[0] / plain)
    assert max(ratios) <= 1.04, [round(r, 3) for r in ratios]


def test_calls_of_repeated_prompts_are_measured_not_kept_plain_on_the_method_wide_estimates():
    """Calls in threes (e2e's repeated workload): the first accepts little (0.5 / 0.4 / 0.3 / 0.2), its two repeats
    nearly everything (suffix drafts them from the first call's responses). The end rule alone read fresh batches'
    gains from the method-wide estimates, which mix both kinds of call, and in one seed of five kept the repeats
    mostly plain (0.82x the time of every step plain, drafting 13% of the steps; the other seeds 0.69-0.73x, fixed
    k 0.79x); each fresh batch now drafts its first step, which gives the end rule the batch's own pooled mean: no
    seed above 0.75x."""
    ratios = _over_plain(["--acc", "0.5", "0.4", "0.3", "0.2", "--acc-repeat", "0.98", "0.97", "0.96", "0.95",
                          "--spec-ms", "1.2", "--calls", "64", "--per-call", "8", "--batch", "8"])
    assert max(ratios) <= 0.75, [round(t, 3) for t in ratios]


def test_a_fresh_batch_drafts_its_first_step_where_drafting_wins_whatever_the_end_rule_reads():
    """Drafting wins the bucket, but the method-wide estimates say a request gains 0.3 drafts a step, too little to
    pay at the end: a fresh batch (nobody behind, nobody measured) drafts its first step anyway; once its requests
    have drafted, or with a request behind, the end rule decides again."""
    p = SpeculationPolicy(k=2)
    b = p._bucket_for(2)
    b.tokens, b.seconds, b.count = [2.0, 6.0], [1e-3, 2e-3], [10, 10]
    b.decided, b.winner, b.gap, b.since = True, 1, 64, 1
    p._global[False] = [0.3, 0.0]
    ids = ["x", "y"]
    assert not p.pays_at_end(b, ids, [50, 50])
    assert p.plan(ids, remaining=[50, 50]) == [2, 2] and p.stats.draft_reasons == {"faster": 1}
    p.observe(ids, [2, 2], [0, 0], 2e-3)  # measured: nothing accepted
    assert p.plan(ids, remaining=[49, 49]) == [0, 0] and p.stats.plain_reasons == {"batch_end": 1}
    q = SpeculationPolicy(k=2)
    q.cost, q._global[False], q._behind = {2: copy.deepcopy(b)}, [0.3, 0.0], {"x"}
    assert q.plan(ids, remaining=[50, 50]) == [0, 0]  # a request behind: not a fresh batch


def test_a_switch_after_a_long_plain_run_is_learned_apart():
    """Switches into drafting after short plain runs cost 1 ms, after LONG_RUN or more plain steps 20 ms: the bucket
    keeps the two apart (switch[1] stays near 1 ms, switch_long near 20), and the end rule charges the one the
    current run would pay."""
    p = SpeculationPolicy(k=2)
    b = p._bucket_for(2)
    b.tokens, b.seconds, b.count = [2.0, 6.0], [1e-3, 2.5e-3], [10, 10]
    b.decided, b.winner, b.gap, b.since = True, 1, 10 ** 6, 1
    ids = ["x", "y"]
    for rep in range(12):
        run = LONG_RUN + 4 if rep % 2 else 3
        for _ in range(run):  # plain steps, as the engine reports them after a plan that drafted nothing
            p._planned = {r: 0 for r in ids}
            p.observe(ids, [0, 0], [0, 0], 1e-3)
        extra = 20e-3 if run >= LONG_RUN else 1e-3
        for step in range(SETTLE[1]):
            p._planned = {r: 2 for r in ids}
            p.observe(ids, [2, 2], [2, 2], 2.5e-3 + (extra if step == 0 else 0.0))
    assert b.switch[1] < 12e-3 and b.switch_long == pytest.approx(20e-3, rel=0.05)
    assert p.cost_table()[2]["spec_switch_long_ms"] == pytest.approx(b.switch_long * 1e3, abs=1e-4)
    p._last_mode, p._plain_steps = 0, LONG_RUN
    assert b.switch_into_drafting(p._plain_steps) == b.switch_long and p._switch_cost(b) == b.switch_long
    p._plain_steps = LONG_RUN - 1
    assert p._switch_cost(b) == b.switch[1]
    c = p._bucket_for(1)  # a new bucket (the batch shrank): no switch timed there, the largest timed anywhere
    p._plain_steps = LONG_RUN
    assert c.switch_long == 0.0 and p._switch_cost(c) == b.switch_long
    c.switch[1] = 1e-3  # short switches timed there, no long one: a long run is charged the long one timed elsewhere
    assert p._switch_cost(c) == b.switch_long
    p._plain_steps = 3
    assert p._switch_cost(c) == 1e-3


@pytest.mark.parametrize(("argv", "bound", "was"), [
    (["--acc", "0.95", "0.9", "0.85"], 0.93, 1.03),  # fixed k 0.885
    (["--acc", "0.9", "0.85", "0.8", "--batch", "32", "--per-call", "32", "--calls", "16"], 1.04, 1.30),  # fixed 1.005
    (["--acc", "0.95", "0.9", "0.85", "--dud", "0.125"], 1.04, 1.03),  # fixed 2.25: the end rule's reason to be
])
def test_the_end_rule_keeps_drafting_where_it_pays_and_stops_for_a_request_apart(argv, bound, was):
    """Calls of 8 (or 32) requests, the end rule deciding, the costs of the test above: where every request accepts
    the same share of drafts, auto keeps most of fixed k's gain at batch 8 and stays near plain at 32 (with the
    least of the fast per-request averages it took ``was`` times every step plain: the unluckiest request of
    identical ones set the end, and once a step was plain nothing re-measured it); where one request in eight
    accepts nothing (a lookup without matches, fixed k 2.25x plain), auto stays near plain. Mean of 5 seeds."""
    ratios = _over_plain(argv)
    assert sum(ratios) / len(ratios) <= bound, ([round(t, 3) for t in ratios], was)


def test_end_gains_pool_requests_alike_and_keep_a_request_apart():
    """Eight requests whose drafting steps accepted 2 on average with per-step noise (variance 0.5), their means
    spread as that noise makes them over 16 steps: each gets the pooled mean (the one unlucky by 0.3 too). With one
    that accepted 0.2 a step among them, it keeps about its own and the others the pooled mean of theirs. Fewer
    than END_MIN_STEPS steps, or nothing measured: the pooled mean, or the method-wide expected gain."""
    p = SpeculationPolicy(k=3)
    ids = [f"r{i}" for i in range(8)]
    means = [2.0 + d for d in (-0.3, -0.1, -0.05, 0.0, 0.0, 0.05, 0.1, 0.3)]  # sample variance ~0.029 < 0.5 / 16

    def stats(mean: float, n: float = 16.0, var: float = 0.5) -> tuple[float, float, float]:
        return n, n * mean, n * (var + mean * mean)

    p._end = {r: stats(m) for r, m in zip(ids, means)}
    gains = p.end_gains(ids)
    pooled = (sum(16.0 * m for m in means) + END_PRIOR * p.expected_gain("new")) / (16.0 * 8 + END_PRIOR)
    assert gains == pytest.approx([pooled] * 8)
    p._end["r0"], p._end_cache = stats(0.2), None  # (set by hand: what a drafting step's outcome clears)
    gains = p.end_gains(ids)
    assert gains[0] < 0.35 and all(g > 1.7 for g in gains[1:])
    p._end, p._end_cache = {r: stats(m, n=END_MIN_STEPS - 1) for r, m in zip(ids, [0.2] + means[1:])}, None
    gains = p.end_gains(ids)
    assert len(set(gains)) == 1  # too few steps each to tell anyone apart
    p._end, p._end_cache = {}, None
    assert p.end_gains(ids) == pytest.approx([p.expected_gain("new")] * 8)


def _drafting_steps(p: SpeculationPolicy, ids: list[str], accepted: list[list[int]]) -> None:
    """Drafting steps of ``ids`` (k drafts each) through ``observe``, step i accepting ``accepted[i]``."""
    for acc in accepted:
        p._planned, p._plain_plan = dict.fromkeys(ids, p.k), None
        p.observe(ids, [p.k] * len(ids), acc, 2e-3)


def _stretches_or_not(stretch: bool) -> tuple[SpeculationPolicy, list[str]]:
    """Seven requests that accept 4 and 2 drafts equally often over 16 drafting steps, in stretches of four steps
    (``stretch``) or alternating, and one (``w``) that accepts none in them."""
    p = SpeculationPolicy(k=4)
    ids = [f"r{i}" for i in range(7)] + ["w"]
    rows = []
    for step in range(16):
        hit = (step // 4) % 2 == 0 if stretch else step % 2 == 0
        rows.append([4 if hit else 2] * 7 + [0])
    _drafting_steps(p, ids, rows)
    return p, ids


def test_end_gains_count_correlated_steps_for_less():
    """The same accepted drafts a request, in stretches or not: where consecutive steps agree (a lookup method's
    matches come in stretches) sixteen steps tell less, and the request that accepted none in them is held nearer
    the batch's pooled mean than where steps alternate (no positive correlation: exactly the estimate without
    the pairs). Observe keeps each request's pairs of consecutive drafting steps."""
    apart, ids = _stretches_or_not(False)
    together, _ = _stretches_or_not(True)
    assert apart._end["r0"][0] == together._end["r0"][0]  # as many (weighted) steps; only their order differs
    alone = copy.deepcopy(apart)
    alone._lag, alone._end_cache = {}, None
    assert apart.end_gains(ids) == pytest.approx(alone.end_gains(ids))
    a, s = apart.end_gains(ids), together.end_gains(ids)
    assert s[-1] > a[-1] + 0.2 and s[-1] < s[0] - 1.0  # nearer the others', still apart
    n, c, last = together._lag["r0"]  # 15 pairs: products 16, 8 or 4 by the two steps' outcomes
    assert last == 2 and n == pytest.approx(sum((1 - 1 / 32) ** i for i in range(15)))
    x = [4 if (j // 4) % 2 == 0 else 2 for j in range(16)]
    assert c == pytest.approx(sum(x[j] * x[j - 1] * (1 - 1 / 32) ** (15 - j) for j in range(1, 16)))


def test_end_gains_fade_over_a_plain_run_only_where_steps_correlate():
    """Over a run of plain steps (nothing measured), a request kept apart by correlated steps returns towards the
    pooled mean, in steps of END_FADE_EVERY plain steps (so drafting comes back and measures it again); where steps
    are independent it stays apart (a request that truly accepts nothing keeps the batch plain to its end)."""
    for stretch in (True, False):
        p, ids = _stretches_or_not(stretch)
        gap = p.end_gains(ids)[0] - p.end_gains(ids)[-1]
        seen = [p.end_gains(ids)[-1]]
        for _ in range(3):
            for _ in range(END_FADE_EVERY):
                p._planned, p._plain_plan = dict.fromkeys(ids, 0), None  # (as a plain plan leaves them)
                p.observe(ids, [0] * 8, [0] * 8, 1e-3)
                if p._plain_steps % END_FADE_EVERY:
                    assert p.end_gains(ids)[-1] == seen[-1]  # kept between the fade's steps
            seen.append(p.end_gains(ids)[-1])
        if stretch:  # faded to the batch's pooled mean, which itself stays as measured (with the method-wide prior)
            assert seen[0] < seen[1] and p.end_gains(ids)[0] - seen[3] < 0.5 * gap
            pooled = ((sum(s for _, s, _ in p._end.values()) + END_PRIOR * p.expected_gain("new"))
                      / (sum(n for n, _, _ in p._end.values()) + END_PRIOR))
            assert p.end_gains(ids) == pytest.approx([pooled] * 8)
        else:
            assert seen == [seen[0]] * 4


def test_a_switch_into_drafting_is_owed_only_for_running_requests_that_had_plain_steps():
    """A batch that ends plain leaves the requests that follow owing nothing (they had no plain step the proposer
    missed); the next batch's plain step puts its requests behind, a drafting step clears them."""
    p = SpeculationPolicy(k=2)
    _feed(p, ["a", "b"], [0], {0: 1e-3, 1: 3e-3}, 80)  # nothing accepted: plain wins and the run ends plain
    assert p._last_mode == 0 and p._behind == {"a", "b"}
    p.forget("a")
    p.forget("b")
    assert not p._behind
    p.observe(["c", "d"], [0, 0], [0, 0], 1e-3)
    assert p._behind == {"c", "d"}
    p._planned = {"c": 2, "d": 2}
    p._plain_plan = None
    p.observe(["c", "d"], [2, 2], [1, 0], 3e-3)
    assert not p._behind and p._end["c"] == (1.0, 1.0, 1.0) and p._end["d"] == (1.0, 0.0, 0.0)


def test_a_fresh_batchs_first_drafting_step_is_not_learned_as_a_long_runs_switch():
    """After a batch that ended in a long plain run, fresh requests drafting owe no recompute: their first drafting
    steps (no slower than usual here) leave the long run's switch as learned; the same steps of requests that were
    in the plain run are learned into it."""
    learned = []
    for behind in (set(), {"c"}):
        p = SpeculationPolicy(k=2)
        b = p._bucket_for(2)
        b.tokens, b.seconds, b.count, b.switch_long = [2.0, 6.0], [1e-3, 1.5e-3], [10, 10], 0.02
        b.decided, b.winner, b.gap, b.since, b.last = True, 1, 64, 1, 0
        p._last_mode, p._plain_steps, p._behind = 0, LONG_RUN + 4, behind
        for _ in range(SETTLE[1]):
            p._planned, p._plain_plan = {"c": 2, "d": 2}, None
            p.observe(["c", "d"], [2, 2], [2, 2], 1.5e-3)
        learned.append(b.switch_long)
    assert learned[0] == 0.02 and learned[1] < 0.015


def test_a_fresh_batchs_costly_first_drafting_step_is_not_learned_as_a_switch():
    """Fresh requests after a batch that ended plain: their first drafting step carries their starts (20 ms more
    here: a suffix tree over each prompt), which no later switch of running requests pays again: the switch into
    drafting stays as learned (1 ms). The same step of requests that were in the plain run is a switch, learned
    (clipped as a one-off)."""
    learned = []
    for behind in (set(), {"c", "d"}):
        p = SpeculationPolicy(k=2)
        b = p._bucket_for(2)
        b.tokens, b.seconds, b.count = [2.0, 6.0], [1e-3, 1.5e-3], [10, 10]
        b.switch, b._last_extra = [0.0, 1e-3], [0.0, 1e-3]
        b.decided, b.winner, b.gap, b.since, b.last = True, 1, 64, 1, 0
        p._last_mode, p._plain_steps, p._behind = 0, 3, behind
        for t in (21.5e-3, 1.5e-3):  # the switch's settling steps
            p._planned, p._plain_plan = {"c": 2, "d": 2}, None
            p.observe(["c", "d"], [2, 2], [2, 2], t)
        assert b.count == [10, 10]  # neither step timed either way
        learned.append(b.switch[1])
    assert learned[0] == 1e-3 and learned[1] == pytest.approx(1e-3 + ALPHA_LOSER * 3e-3)


def test_end_gains_follow_a_drafting_steps_outcome_and_a_request_leaving():
    """end_gains' answer is kept while nothing it reads changes (a run of plain steps) and follows a drafting step's
    outcome and the batch's requests."""
    p = SpeculationPolicy(k=2)
    ids = ["a", "b", "c"]
    first = p.end_gains(ids)
    p.observe(ids, [0, 0, 0], [0, 0, 0], 1e-3)  # a plain step: nothing changes
    assert p.end_gains(ids) == first
    p._planned, p._plain_plan = dict.fromkeys(ids, 2), None
    p.observe(ids, [2, 2, 2], [2, 2, 2], 2e-3)
    after = p.end_gains(ids)
    assert after[0] > first[0]
    p.forget("a")
    fresh = copy.deepcopy(p)
    fresh._end_cache = None
    assert p.end_gains(["b", "c"]) == fresh.end_gains(["b", "c"]) != after[1:]  # a's steps left the pooled mean

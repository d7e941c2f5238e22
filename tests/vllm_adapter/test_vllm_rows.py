"""specdec_vllm.RowTracker: request identity per vLLM row without request ids (rows reused, moved, prefilling)."""

from __future__ import annotations

import numpy as np
import pytest
from specdec_vllm import RowTracker
from vllm_sim import SimBatch, SimRequest


def _ids(tracker: RowTracker, batch: SimBatch) -> list[str]:
    return tracker.update([[1]] * batch.num_reqs, batch.num_tokens_no_spec, batch.token_ids_cpu).req_ids


def test_same_rows_keep_their_ids_and_new_requests_join():
    sim = SimBatch(4, 64)
    for i in range(2):
        sim.add(SimRequest(f"r{i}", [i, 2, 3, 4 + i], max_tokens=8))
    tracker = RowTracker()
    first = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert [row for row, _ in first.joined] == [0, 1] and first.left == []
    second = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert second.req_ids == first.req_ids and second.joined == [] and second.left == []


def test_reused_row_with_the_same_prompt_is_a_new_request():
    """A request leaves and one with the same prompt takes its row: lengths differ, so the row is new."""
    sim = SimBatch(2, 64)
    a = SimRequest("a", [5, 6, 7, 8, 9], max_tokens=3)
    sim.add(a)
    tracker = RowTracker()
    for _ in range(3):
        ids = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu).req_ids
    sim.remove(a)
    sim.condense()
    sim.add(SimRequest("b", [5, 6, 7, 8, 9], max_tokens=3))
    changes = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert changes.left == ids and changes.joined == [(0, changes.req_ids[0])] and changes.req_ids != ids


def test_condensed_and_swapped_rows_keep_their_requests():
    sim = SimBatch(4, 64)
    reqs = [SimRequest(f"r{i}", [i, 10 + i, 3, 4, 5, 6], max_tokens=50) for i in range(4)]
    for r in reqs:
        sim.add(r)
    tracker = RowTracker()
    ids = dict(zip([r.req_id for r in sim.rows], tracker.update(sim.step(), sim.num_tokens_no_spec,
                                                                 sim.token_ids_cpu).req_ids))
    sim.remove(reqs[1])
    sim.condense()  # r3 moves into row 1
    sim.swap(0, 2)
    changes = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert changes.joined == [] and changes.left == [ids["r1"]]
    assert changes.req_ids == [ids[r.req_id] for r in sim.rows]


def test_prefilling_rows_keep_their_id_until_they_sample():
    """A chunked prefill samples nothing for two steps; the row is one request throughout."""
    sim = SimBatch(2, 64)
    sim.add(SimRequest("a", [1, 2, 3], max_tokens=9))
    sim.add(SimRequest("b", [4, 5, 6, 7], max_tokens=9, prefill_steps=3))
    tracker = RowTracker()
    seen = [tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu) for _ in range(5)]
    assert [len(c.joined) for c in seen] == [2, 0, 0, 0, 0]
    assert all(c.req_ids == seen[0].req_ids for c in seen)


@pytest.mark.parametrize("seed", range(4))
def test_identity_under_random_joins_leaves_and_reorders(seed):
    """Random arrivals, lengths, chunked prefills, condensing and swaps: every true request keeps one tracker id
    for its whole life, and no two requests share one."""
    rng = np.random.default_rng(seed)
    sim = SimBatch(6, 96, vocab=50, seed=seed)
    pending = [SimRequest(f"t{i}", rng.integers(0, 50, size=int(rng.integers(1, 20))).tolist(),
                          max_tokens=int(rng.integers(1, 30)), prefill_steps=int(rng.integers(1, 4)))
               for i in range(40)]
    tracker = RowTracker()
    true_of: dict[str, str] = {}
    tracker_of: dict[str, str] = {}
    while pending or sim.rows:
        for r in sim.finished():
            sim.remove(r)
        while pending and sim.rows.count(None) + 6 - len(sim.rows) > 0 and rng.random() < 0.6:
            sim.add(pending.pop(0))
        sim.condense()
        if len(sim.rows) >= 2 and rng.random() < 0.3:
            i, j = rng.choice(len(sim.rows), 2, replace=False)
            sim.swap(int(i), int(j))
        if not sim.rows:
            continue
        sampled = sim.step()
        for r in sim.rows:  # the toy's drafts: none, so every step appends one token
            r.drafts = []
        ids = tracker.update(sampled, sim.num_tokens_no_spec, sim.token_ids_cpu).req_ids
        assert len(set(ids)) == len(ids)
        for tid, req in zip(ids, sim.rows):
            assert true_of.setdefault(tid, req.req_id) == req.req_id
            assert tracker_of.setdefault(req.req_id, tid) == tid


def test_reset_forgets_every_row():
    sim = SimBatch(2, 32)
    sim.add(SimRequest("a", [1, 2, 3], max_tokens=4))
    tracker = RowTracker()
    ids = tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu).req_ids
    assert len(tracker) == 1 and tracker.reset() == ids and len(tracker) == 0
    assert tracker.update(sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu).joined != []


def test_fingerprint_sizes_are_checked():
    with pytest.raises(ValueError, match="head=0"):
        RowTracker(head=0)


def test_lengths_past_the_arrays_are_refused_before_anything_is_read():
    """The kernel does not bounds-check: a length past token_ids' width (or below 0) is refused by name, and the
    tracker keeps its state (the next good step still matches the rows)."""
    ids = np.arange(20, dtype=np.int32).reshape(2, 10)
    tracker = RowTracker()
    first = tracker.update([[1], [1]], np.array([4, 5], np.int32), ids).req_ids
    with pytest.raises(ValueError, match=r"num_tokens\[1\]=11 is outside \[0, 10\]"):
        tracker.update([[1], [1]], np.array([5, 11], np.int32), ids)
    with pytest.raises(ValueError, match=r"num_tokens\[0\]=-1 is outside \[0, 10\]"):
        tracker.update([[], []], np.array([-1, 5], np.int32), ids)
    assert tracker.update([[1], [1]], np.array([5, 6], np.int32), ids).req_ids == first


def test_same_start_and_length_told_apart_by_the_tail():
    """A new request in a reused row whose length before this step and first tokens equal the old request's is
    still new when the tokens before its end differ."""
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :21] = np.arange(21)
    tracker = RowTracker()
    old = tracker.update([[20]], np.array([21], np.int32), tokens).req_ids
    tokens[0, 13:21] += 30  # another request's 21-token prompt with the same first 13 tokens, then its first token
    tokens[0, 21] = 7
    changes = tracker.update([[7]], np.array([22], np.int32), tokens)
    assert changes.left == old and len(changes.joined) == 1


def test_same_length_and_tail_told_apart_by_the_head():
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :21] = np.arange(21)
    tracker = RowTracker()
    old = tracker.update([[20]], np.array([21], np.int32), tokens).req_ids
    tokens[0, :4] += 40  # another 21-token prompt ending as the old request did, then its first token
    tokens[0, 21] = 7
    changes = tracker.update([[7]], np.array([22], np.int32), tokens)
    assert changes.left == old and len(changes.joined) == 1


def test_short_requests_grow_their_head():
    """A request shorter than the head fingerprint keeps its id while its head fills up."""
    tokens = np.zeros((1, 64), np.int32)
    tokens[0, :3] = [5, 6, 7]
    tracker = RowTracker(head=8, tail=2)
    ids = tracker.update([[7]], np.array([3], np.int32), tokens).req_ids
    for n in range(4, 14):
        tokens[0, n - 1] = n
        changes = tracker.update([[n]], np.array([n], np.int32), tokens)
        assert changes.req_ids == ids and not changes.joined and not changes.left

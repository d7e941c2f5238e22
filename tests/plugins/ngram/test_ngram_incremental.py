"""The incremental index proposes exactly what the scan proposes, step after step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec import DraftBatch
from specdec_ngram.index import NgramIndex
from specdec_ngram.scan import scan_propose

MATCHES = ["leftmost", "recent"]


class Batch:
    """Token histories of a few requests, padded into the [B, L] array the engine hands over."""

    def __init__(self, width: int = 64):
        self.seqs: dict[str, list[int]] = {}
        self.width = width

    def arrays(self, rids):
        width = max([self.width] + [len(self.seqs[r]) for r in rids])
        ids = np.zeros((len(rids), width), np.int32)
        for i, r in enumerate(rids):
            ids[i, : len(self.seqs[r])] = self.seqs[r]
        return ids, np.array([len(self.seqs[r]) for r in rids], np.int64)


def _check_step(index, batch, rids, active, min_n, max_n, k, mml, match, where=""):
    ids, num = batch.arrays(rids)
    got = index.step(rids, ids, num, active, k, mml)
    want = scan_propose(ids, num, min_n, max_n, k, mml, active=active, match=match)
    for name, g, w in (("drafts", got[0], want[0]), ("counts", got[1], want[1])):
        assert np.array_equal(g, w), f"{where}: index {name} {g.tolist()} != scan {w.tolist()}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), match=st.sampled_from(MATCHES), min_n=st.integers(1, 3), extra=st.integers(0, 3),
       vocab=st.integers(1, 4), k=st.integers(1, 5))
def test_index_equals_scan_property(data, match, min_n, extra, vocab, k):
    max_n = min_n + extra
    index, batch = NgramIndex(min_n, max_n, match), Batch()
    tokens = st.lists(st.integers(0, vocab - 1), max_size=12)
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        rid = f"r{data.draw(st.integers(0, 4), label='request')}"
        event = data.draw(st.sampled_from(["append"] * 6 + ["add", "remove", "truncate", "rewrite"]))
        seq = batch.seqs.setdefault(rid, [])
        if event == "add":
            batch.seqs[rid] = data.draw(tokens, label="prompt")
            index.add(rid, np.array(batch.seqs[rid], np.int32))
        elif event == "remove":
            index.remove(rid)
            del batch.seqs[rid]
        elif event == "truncate":  # the history shrank (e.g. the engine rolled back)
            del seq[data.draw(st.integers(0, len(seq)), label="keep"):]
        elif event == "rewrite" and seq:  # same length, different tail: must be noticed
            seq[-1] = (seq[-1] + 1) % (vocab + 1)
        else:
            seq.extend(data.draw(tokens, label="appended"))
        rids = sorted(batch.seqs, key=lambda r: data.draw(st.integers(0, 9), label="order"))
        active = np.array([data.draw(st.booleans(), label="active") for _ in rids], dtype=np.bool_)
        mml = data.draw(st.integers(1, 80), label="max_model_len")
        _check_step(index, batch, rids, active, min_n, max_n, k, mml, match, f"step {step} after {event}")


@pytest.mark.parametrize("match", MATCHES)
def test_index_equals_scan_on_long_growing_sequences(match):
    """Long histories make every table grow several times (relocation, rehash) mid-run."""
    rng = np.random.default_rng(0)
    index, batch = NgramIndex(2, 4, match), Batch()
    rids = [f"r{i}" for i in range(5)]
    for i, r in enumerate(rids):
        batch.seqs[r] = rng.integers(0, 3 + i, int(rng.integers(0, 50))).tolist()
        if i % 2:
            index.add(r, np.array(batch.seqs[r]))  # the others are indexed lazily, from their rows
    for step in range(120):
        for r in rids:
            batch.seqs[r].extend(rng.integers(0, 3 + int(r[1]), int(rng.integers(1, 30))).tolist())
        _check_step(index, batch, rids, np.ones(5, np.bool_), 2, 4, 5, 10**6, match, f"step {step}")
    assert index.nbytes() > 0
    for r in rids:
        index.remove(r)
    assert len(index) == 0 and index.nbytes() == 0


def test_readding_a_request_replaces_its_history():
    index, batch = NgramIndex(1, 2, "leftmost"), Batch()
    batch.seqs["a"] = [1, 2, 3, 1, 2]
    index.add("a", np.array(batch.seqs["a"]))
    _check_step(index, batch, ["a"], np.ones(1, np.bool_), 1, 2, 3, 100, "leftmost")
    batch.seqs["a"] = [7, 8, 9, 7, 8]
    index.add("a", np.array(batch.seqs["a"]))
    _check_step(index, batch, ["a"], np.ones(1, np.bool_), 1, 2, 3, 100, "leftmost")
    with pytest.raises(ValueError, match="1-D integer array"):
        index.add("b", np.array([[1, 2]]))


@pytest.mark.parametrize("match", MATCHES)
def test_incremental_proposer_follows_an_engine_like_run(match):
    """add/remove requests as an engine does; the batch order changes; some rows prefill."""
    rng = np.random.default_rng(1)
    opts = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
            "match": match}
    scan = specdec.create_proposer(opts)
    inc = specdec.create_proposer({**opts, "index": "incremental"})
    batch, live, next_id = Batch(), [], 0
    for step in range(60):
        if len(live) < 4 and rng.random() < 0.5:
            rid = f"q{next_id}"
            next_id += 1
            batch.seqs[rid] = rng.integers(0, 5, int(rng.integers(1, 40))).tolist()
            inc.add_request(rid, np.array(batch.seqs[rid], np.int32))
            live.append(rid)
        if live and rng.random() < 0.1:
            gone = live.pop(int(rng.integers(len(live))))
            inc.remove_request(gone)
        sampled = {}
        for rid in live:
            new = rng.integers(0, 5, int(rng.integers(0, 5))).tolist()
            batch.seqs[rid].extend(new)
            sampled[rid] = new
        order = list(rng.permutation(live))
        ids, num = batch.arrays(order)
        b = DraftBatch(req_ids=order, token_ids=ids, num_tokens=num, num_speculative_tokens=4,
                       sampled_token_ids=[sampled[r] for r in order], max_model_len=150)
        assert inc.propose(b).to_lists() == scan.propose(b).to_lists(), f"step {step}"

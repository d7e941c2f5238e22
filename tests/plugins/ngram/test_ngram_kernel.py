"""Kernels of specdec-plugin-ngram against the slow numpy reference (specdec_ngram.naive)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec_ngram import find_longest_ngram, ngram_propose
from specdec_ngram.gpu import ngram_match_torch
from specdec_ngram.naive import find_longest_ngram_ref, ngram_propose_ref
from specdec_ngram.scan import lps_propose, scan_propose, scan_sampled


def _random_batch(rng, batch, width, vocab, dtype=np.int32):
    ids = rng.integers(0, vocab, (batch, width)).astype(dtype)
    # Repeat earlier spans so that long matches exist even with a big vocabulary.
    for b in range(batch):
        if width > 8 and rng.random() < 0.7:
            span = int(rng.integers(2, width // 2))
            src, dst = sorted(rng.choice(width - span, 2, replace=False))
            ids[b, dst: dst + span] = ids[b, src: src + span].copy()
    num = rng.integers(0, width + 1, batch)
    return ids, num


def _assert_rows(out, num, expected, name):
    got = [row[:n] for row, n in zip(np.asarray(out).tolist(), np.asarray(num).tolist())]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{name}: row {i} drafts {g}, reference {e}"
    pad = np.asarray(out)
    for i, n in enumerate(np.asarray(num).tolist()):
        assert (pad[i, n:] == -1).all(), f"{name}: row {i} is not padded with -1 after {n} drafts"


@pytest.mark.parametrize(
    "tokens, min_n, max_n, k, max_model_len, match, expected",
    [
        ([1, 2, 3, 4, 1, 2, 3], 2, 3, 3, 100, "leftmost", [4, 1, 2]),
        ([7, 1, 2, 8, 3, 1, 2, 9, 3, 1, 2], 2, 3, 3, 100, "leftmost", [9, 3, 1]),  # longest n wins
        ([1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 3, 100, "leftmost", [5, 1, 2]),
        ([1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 3, 100, "recent", [6, 1, 2]),
        ([4, 4, 4, 4], 1, 2, 5, 100, "leftmost", [4, 4]),  # cut at the end of the sequence
        ([4, 4, 4, 4], 1, 2, 5, 100, "recent", [4]),
        ([1, 2, 3, 1, 2], 1, 3, 5, 7, "leftmost", [3, 1]),  # cut at max_model_len
        ([1, 2, 3, 1, 2], 1, 3, 5, 5, "leftmost", []),
        ([1, 2, 3, 4], 1, 3, 3, 100, "leftmost", []),  # no earlier occurrence
        ([3, 3], 3, 4, 3, 100, "leftmost", []),  # shorter than min_n
        ([3], 1, 1, 3, 100, "leftmost", []),
        ([], 1, 1, 3, 100, "leftmost", []),
    ],
)
def test_find_longest_ngram_examples(tokens, min_n, max_n, k, max_model_len, match, expected):
    tokens = np.array(tokens, dtype=np.int64)
    got = find_longest_ngram(tokens, min_n, max_n, k, max_model_len, match)
    assert got.tolist() == expected
    assert got.dtype == tokens.dtype
    assert find_longest_ngram_ref(tokens, min_n, max_n, k, max_model_len, match).tolist() == expected


@pytest.mark.parametrize("vocab", [2, 5, 50_000])
@pytest.mark.parametrize("batch, width", [(1, 1), (3, 17), (7, 130), (5, 333)])
@pytest.mark.parametrize("match", ["leftmost", "recent"])
def test_scan_matches_reference(vocab, batch, width, match):
    rng = np.random.default_rng(vocab * 1000 + batch * 10 + width)
    for min_n, max_n, k in [(1, 1, 1), (1, 4, 5), (2, 3, 4), (3, 7, 2)]:
        ids, num = _random_batch(rng, batch, width, vocab)
        mml = int(rng.integers(1, width + 8))
        expected = ngram_propose_ref(ids, num, min_n, max_n, k, mml, match)
        out, n = scan_propose(ids, num, min_n, max_n, k, mml, match=match)
        _assert_rows(out, n, expected, f"scan_propose(match={match}, n=[{min_n},{max_n}], k={k})")
        assert ngram_propose(ids, num, min_n, max_n, k, mml, match) == expected


@pytest.mark.parametrize("num_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("match", ["leftmost", "recent"])
def test_one_call_path_matches_reference_for_rows_that_sampled(num_dtype, match):
    """scan_sampled (the proposer's path: one kernel call, lengths checked inside it) drafts what the reference
    drafts for the rows that sampled this step and nothing for the others (prefilling rows)."""
    rng = np.random.default_rng(7)
    for batch, width in [(1, 40), (6, 130), (9, 333)]:
        ids, num = _random_batch(rng, batch, width, 5)
        sampled = [[1] * int(rng.integers(0, 3)) for _ in range(batch)]
        mml = int(rng.integers(1, width + 8))
        expected = [e if s else [] for e, s in zip(ngram_propose_ref(ids, num, 1, 4, 5, mml, match), sampled)]
        out, n = scan_sampled(ids, num.astype(num_dtype), sampled, 1, 4, 5, mml, match == "recent")
        _assert_rows(out, n, expected, f"scan_sampled(match={match})")
        assert (out[[not s for s in sampled]] == -1).all()


def test_one_call_path_checks_lengths_and_declines_other_arrays():
    ids = np.zeros((2, 5), np.int32)
    with pytest.raises(ValueError, match=r"num_tokens must lie in \[0, 5\]"):
        scan_sampled(ids, np.array([5, 6]), [[1], [1]], 1, 2, 3, 10, False)
    with pytest.raises(ValueError, match=r"num_tokens must lie in \[0, 5\]"):
        scan_sampled(ids, np.array([-1, 2]), [[], []], 1, 2, 3, 10, False)  # checked even for rows not drafting
    # Arrays the kernel does not take as they are: None, and the proposer goes through check_batch instead.
    assert scan_sampled(ids.astype(np.int16), np.array([5, 5]), [[1], [1]], 1, 2, 3, 10, False) is None
    assert scan_sampled(np.asfortranarray(np.zeros((2, 5), np.int32)), np.array([5, 5]), [[1], [1]], 1, 2, 3, 10,
                        False) is None
    assert scan_sampled(ids, [5, 5], [[1], [1]], 1, 2, 3, 10, False) is None
    assert scan_sampled(ids, np.array([5]), [[1]], 1, 2, 3, 10, False) is None


@pytest.mark.parametrize("vocab", [3, 1000])
def test_vllm_lps_algorithm_matches_reference(vocab):
    rng = np.random.default_rng(vocab)
    for min_n, max_n, k in [(1, 3, 4), (2, 5, 3), (4, 4, 5)]:
        ids, num = _random_batch(rng, 9, 200, vocab)
        out, n = lps_propose(ids, num, min_n, max_n, k, 180)
        _assert_rows(out, n, ngram_propose_ref(ids, num, min_n, max_n, k, 180), "lps_propose")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_thread_count_does_not_change_results(dtype):
    rng = np.random.default_rng(7)
    ids, num = _random_batch(rng, 33, 257, 4, dtype)
    active = rng.random(33) < 0.8
    one = scan_propose(ids, num, 1, 3, 4, 300, active=active, num_threads=1)
    many = scan_propose(ids, num, 1, 3, 4, 300, active=active, num_threads=None, parallel_threshold=0)
    assert np.array_equal(one[0], many[0]) and np.array_equal(one[1], many[1])
    assert (one[1][~active] == 0).all(), "inactive rows must get no drafts"


@pytest.mark.parametrize("match", ["leftmost", "recent"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_torch_kernel_matches_reference(match, dtype):
    rng = np.random.default_rng(11)
    for vocab, (min_n, max_n, k) in [(2, (1, 3, 4)), (6, (2, 4, 3)), (40, (1, 1, 5)), (3, (3, 6, 2))]:
        ids, num = _random_batch(rng, 6, 45, vocab, np.int64)
        active = rng.random(6) < 0.85
        mml = int(rng.integers(10, 60))
        expected = ngram_propose_ref(ids, num, min_n, max_n, k, mml, match)
        expected = [e if a else [] for e, a in zip(expected, active)]
        out, n = ngram_match_torch(torch.from_numpy(ids).to(dtype), torch.from_numpy(num), min_n, max_n, k,
                                   mml, active=torch.from_numpy(active), match=match)
        assert out.dtype == torch.int64 and out.shape == (6, k)
        _assert_rows(out, n, expected, f"ngram_match_torch(match={match}, dtype={dtype})")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile path is exercised on CUDA only")
def test_torch_kernel_compiled_on_cuda_matches_reference():
    rng = np.random.default_rng(5)
    for _ in range(3):  # new shapes every call: dynamic shapes must not change results
        ids, num = _random_batch(rng, int(rng.integers(1, 9)), int(rng.integers(5, 90)), 4, np.int64)
        out, n = ngram_match_torch(torch.from_numpy(ids).cuda(), torch.from_numpy(num), 1, 3, 4, 200,
                                   compile=True)
        _assert_rows(out.cpu(), n.cpu(), ngram_propose_ref(ids, num, 1, 3, 4, 200), "compiled kernel")


def test_launchers_check_their_inputs():
    ids = np.zeros((2, 5), np.int32)
    with pytest.raises(ValueError, match="2-D"):
        scan_propose(ids[0], np.array([5]), 1, 2, 3, 10)
    with pytest.raises(TypeError, match="int32 or int64"):
        scan_propose(ids.astype(np.float32), np.array([5, 5]), 1, 2, 3, 10)
    with pytest.raises(ValueError, match="num_tokens must have shape"):
        scan_propose(ids, np.array([5]), 1, 2, 3, 10)
    with pytest.raises(ValueError, match=r"num_tokens must lie in \[0, 5\]"):
        scan_propose(ids, np.array([5, 6]), 1, 2, 3, 10)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        scan_propose(ids, np.array([5, 5]), 3, 2, 3, 10)
    with pytest.raises(ValueError, match="match="):
        scan_propose(ids, np.array([5, 5]), 1, 2, 3, 10, match="latest")
    with pytest.raises(TypeError, match="int32 or int64"):
        ngram_match_torch(torch.zeros(2, 5), torch.tensor([5, 5]), 1, 2, 3, 10)
    with pytest.raises(ValueError, match="num_tokens must have shape"):
        ngram_match_torch(torch.zeros(2, 5, dtype=torch.int32), torch.tensor([5]), 1, 2, 3, 10)

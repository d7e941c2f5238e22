"""Tests for specdec.rejection_sampler: exact greedy behaviour, bounds safety, seeding, validation,
and statistical losslessness (the emitted tokens follow the target distribution)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from specdec import (
    PLACEHOLDER_TOKEN_ID,
    RejectionSampler,
    SamplingMetadata,
    SamplingParams,
    SpecDecodeMetadata,
    rejection_sample,
)
from specdec.rejection_sampler import compute_target_probs, parse_output

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(autouse=True)
def _seed_global_rng():
    torch.manual_seed(1234)


def _logits_with_argmax(argmax: list[int], vocab: int) -> torch.Tensor:
    """Random logits whose row r has its unique maximum at ``argmax[r]``."""
    logits = torch.randn(len(argmax), vocab)
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] = 10.0
    return logits


def _sample(drafts, logits, params, draft_probs=None):
    metadata = SpecDecodeMetadata.from_draft_token_ids(drafts)
    return rejection_sample(metadata, draft_probs, logits, SamplingMetadata.from_params(params))


# ---------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize(
    ("argmax", "expected"),
    [
        ([1, 2, 3, 4], [1, 2, 3, 4]),  # all accepted, then the bonus row's argmax
        ([5, 2, 3, 4], [5, -1, -1, -1]),  # first draft rejected: its argmax is emitted
        ([1, 5, 3, 4], [1, 5, -1, -1]),  # mismatch in the middle
        ([1, 2, 0, 4], [1, 2, 0, -1]),  # mismatch at the last draft
    ],
)
def test_greedy_single_request(argmax, expected):
    out = _sample([[1, 2, 3]], _logits_with_argmax(argmax, 8), [GREEDY])
    assert out.dtype == torch.int64
    assert out.tolist() == [expected]


def test_greedy_different_draft_counts_and_padding():
    drafts = [[1, 2, 3], [], [4, 5], [6], [7, 7, 7]]
    argmax = [1, 2, 3, 9] + [8] + [4, 0, 1] + [6, 2] + [7, 7, 3, 5]
    out = _sample(drafts, _logits_with_argmax(argmax, 10), [GREEDY] * 5)
    assert out.shape == (5, 4)
    assert out.tolist() == [
        [1, 2, 3, 9],
        [8, -1, -1, -1],
        [4, 0, -1, -1],
        [6, 2, -1, -1],
        [7, 7, 3, -1],
    ]
    assert parse_output(out) == [[1, 2, 3, 9], [8], [4, 0], [6, 2], [7, 7, 3]]


def test_greedy_ties_take_first_index():
    logits = torch.zeros(3, 6)
    logits[:, 2] = logits[:, 4] = 1.0
    assert _sample([[4, 2]], logits, [GREEDY]).tolist() == [[2, -1, -1]]
    assert _sample([[2, 2]], logits, [GREEDY]).tolist() == [[2, 2, 2]]


def test_greedy_ignores_top_k_and_top_p():
    params = SamplingParams(temperature=0.0, top_k=1, top_p=0.01)
    logits = _logits_with_argmax([3, 1], 7)
    assert _sample([[3]], logits, [params]).tolist() == [[3, 1]]


def test_mixed_greedy_and_random_batch():
    vocab = 12
    drafts = [[1, 2, 3], [4, 5], [6, 7, 8], [], [9]]
    params = [GREEDY, SamplingParams(temperature=0.8), GREEDY, SamplingParams(top_k=3, top_p=0.9), GREEDY]
    argmax = {0: [1, 2, 11, 0], 2: [6, 7, 8, 10], 4: [2, 3]}
    rows = []
    for i, d in enumerate(drafts):
        rows.append(_logits_with_argmax(argmax[i], vocab) if i in argmax else torch.randn(len(d) + 1, vocab))
    logits = torch.cat(rows)
    for draft_probs in (None, torch.softmax(torch.randn(9, vocab), -1)):
        out = _sample(drafts, logits, params, draft_probs)
        assert out[0].tolist() == [1, 2, 11, -1]
        assert out[2].tolist() == [6, 7, 8, 10]
        assert out[4].tolist() == [2, -1, -1, -1]
        for i in (1, 3):
            _assert_well_formed(out[i].tolist(), drafts[i], vocab)


def _assert_well_formed(row: list[int], drafts: list[int], vocab: int) -> None:
    """Accepted prefix of the drafts, one token in [0, V), then placeholders."""
    emitted = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
    assert row == emitted + [PLACEHOLDER_TOKEN_ID] * (len(row) - len(emitted))
    assert 1 <= len(emitted) <= len(drafts) + 1
    assert emitted[:-1] == drafts[: len(emitted) - 1]
    assert 0 <= emitted[-1] < vocab


def test_no_drafts_greedy_is_argmax():
    logits = torch.randn(7, 50)
    out = _sample([[]] * 7, logits, [GREEDY] * 7)
    assert out.shape == (7, 1)
    assert out[:, 0].tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temps", [(0.0, 0.0, 0.0), (0.8, 1.3, 0.5), (0.0, 0.8, 0.0), (0.7, 0.0, 1.1)])
def test_no_draft_batch_takes_the_short_path_with_the_general_paths_tokens(temps):
    """A batch without drafts (a plain decode step) skips the acceptance pass: the tokens equal what
    that pass yields with N = 0 on the same prepared inputs (same randomness, same target probs),
    for greedy, random and mixed batches, seeded or not, with top-k / top-p."""
    from specdec.rejection_sampler import _verify, prepare_sampler_inputs, sample_prepared

    b, vocab = len(temps), 300
    for trial in range(20):
        logits = torch.randn(b, vocab) * 3
        params = [SamplingParams(temperature=t, top_k=5 if i == 1 else 0, top_p=0.9 if i == 2 else 1.0,
                                 seed=trial if i != 0 else None) for i, t in enumerate(temps)]
        meta = SpecDecodeMetadata.from_draft_token_ids([[]] * b)
        sm = SamplingMetadata.from_params(params, generators={
            i: torch.Generator().manual_seed(100 * trial + i) for i, p in enumerate(params) if p.seed is not None})
        inputs = prepare_sampler_inputs(meta, None, logits, sm)
        fast = sample_prepared(meta, None, inputs)
        assert fast.shape == (b, 1) and fast.dtype == torch.int64
        assert torch.equal(fast, _verify(meta, None, inputs))
    assert sample_prepared(*_empty_batch()).shape == (0, 1)


def _empty_batch():
    from specdec.rejection_sampler import prepare_sampler_inputs

    meta = SpecDecodeMetadata.from_draft_token_ids([])
    sm = SamplingMetadata.from_params([])
    return meta, None, prepare_sampler_inputs(meta, None, torch.zeros(0, 10), sm)


# ---------------------------------------------------------------------------------- out of range


@pytest.mark.parametrize("bad", [-1, 8, 108])
@pytest.mark.parametrize("with_probs", [False, True])
def test_out_of_range_drafts_are_rejected(bad, with_probs):
    vocab = 8
    drafts = [[bad, 1], [2, bad], [bad]]
    logits = _logits_with_argmax([5, 1, 2, 2, 6, 0, 3, 4], vocab)
    draft_probs = torch.softmax(torch.randn(5, vocab), -1) if with_probs else None
    out = _sample(drafts, logits, [GREEDY] * 3, draft_probs)
    assert out.tolist() == [[5, -1, -1], [2, 6, -1], [3, -1, -1]]
    # Random rows: a top-1 target makes the recovered token (sampled from p) deterministic.
    top1 = [SamplingParams(temperature=1.0, top_k=1)] * 3
    out = _sample(drafts, logits, top1, draft_probs)
    assert out.tolist() == [[5, -1, -1], [2, 6, -1], [3, -1, -1]]
    # Flat random targets: still rejected, and the emitted token is a valid id.
    out = _sample(drafts, torch.zeros(8, vocab), [SamplingParams()] * 3, draft_probs)
    assert out[:, 1].tolist()[0::2] == [-1, -1]
    for row, d in zip(out.tolist(), drafts):
        _assert_well_formed(row, d, vocab)
        assert all(0 <= t < vocab for t in parse_output(torch.tensor([row]))[0])


# ------------------------------------------------------------------------------------- seeding


def _seeded_run(seed: int, companions: str) -> list[int]:
    """Run a seeded request (drafts [3, 1, 4]) alone or among other requests; return its tokens.

    The companions differ in count, draft lengths, seeds, temperatures and logits, and the global
    RNG is in a different state each time, so only the request's own generator can fix its output.
    """
    vocab = 16
    mine_logits = torch.linspace(-1, 1, 4 * vocab).reshape(4, vocab).sin() * 2  # [4, V] fixed rows
    mine_probs = torch.softmax(torch.linspace(1, -1, 3 * vocab).reshape(3, vocab).cos(), -1)  # [3, V]
    mine = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
    torch.manual_seed({"alone": 0, "batch-a": 1, "batch-b": 2}[companions])
    if companions == "alone":
        before, after = [], []
    elif companions == "batch-a":
        before, after = [([5, 6], SamplingParams(seed=5))], [([], GREEDY), ([2, 2, 2, 2], SamplingParams())]
    else:
        before, after = [([], SamplingParams(top_k=2)), ([1], GREEDY), ([7, 7, 7], SamplingParams(seed=5))], []
    drafts = [d for d, _ in before] + [[3, 1, 4]] + [d for d, _ in after]
    params = [sp for _, sp in before] + [mine] + [sp for _, sp in after]
    logits = torch.cat(
        [torch.randn(len(d) + 1, vocab) for d, _ in before] + [mine_logits]
        + [torch.randn(len(d) + 1, vocab) for d, _ in after]
    )
    probs = torch.cat(
        [torch.softmax(torch.randn(len(d), vocab), -1) for d, _ in before] + [mine_probs]
        + [torch.softmax(torch.randn(len(d), vocab), -1) for d, _ in after]
    )
    out = _sample(drafts, logits, params, probs)
    return parse_output(out)[len(before)]


def test_seed_reproducible_and_independent_of_batch():
    for seed in range(5):
        alone = _seeded_run(seed, "alone")
        assert alone == _seeded_run(seed, "alone")
        assert alone == _seeded_run(seed, "batch-a")
        assert alone == _seeded_run(seed, "batch-b")
    assert len({tuple(_seeded_run(seed, "alone")) for seed in range(20)}) > 1


def test_seeded_generator_continues_across_calls():
    vocab = 10
    logits = torch.zeros(1, vocab)
    meta = SpecDecodeMetadata.from_draft_token_ids([[]])
    sm_a = SamplingMetadata.from_params([SamplingParams(seed=3)])
    sm_b = SamplingMetadata.from_params([SamplingParams(seed=3)])
    seq_a = [int(rejection_sample(meta, None, logits, sm_a)[0, 0]) for _ in range(30)]
    seq_b = [int(rejection_sample(meta, None, logits, sm_b)[0, 0]) for _ in range(30)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 1  # the stream advances between calls


def test_global_rng_is_drawn_only_for_unseeded_random_requests():
    """Seeded requests take their randomness from their own generators: a batch where every request
    is seeded (or greedy) leaves the global RNG untouched; one unseeded sampled request draws from it."""
    logits = torch.randn(5, 40)
    drafts = [[1, 2], [3]]
    state = torch.get_rng_state()
    _sample(drafts, logits, [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=1.2, seed=2)])
    _sample(drafts, logits, [GREEDY, GREEDY])
    assert torch.equal(torch.get_rng_state(), state)
    _sample(drafts, logits, [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=1.2)])
    assert not torch.equal(torch.get_rng_state(), state)


def test_module_matches_function_and_has_implementation_seam():
    meta = SpecDecodeMetadata.from_draft_token_ids([[1, 2], [3]])
    logits = torch.randn(5, 9)
    params = [SamplingParams(seed=1), SamplingParams(seed=2, top_k=4)]
    expected = rejection_sample(meta, None, logits, SamplingMetadata.from_params(params))
    got = RejectionSampler()(meta, None, logits, SamplingMetadata.from_params(params))
    assert torch.equal(got, expected)
    calls = []
    custom = RejectionSampler(impl=lambda *args: calls.append(args) or expected)
    assert custom(meta, None, logits, SamplingMetadata.from_params(params)) is expected
    assert len(calls) == 1


# ---------------------------------------------------------------------------------- validation


def test_validation_errors():
    meta = SpecDecodeMetadata.from_draft_token_ids([[1, 2], [3]])  # N = 3, B = 2
    sm = SamplingMetadata.from_params([GREEDY, GREEDY])
    with pytest.raises(ValueError, match=re.escape("logits must have shape [N + B, V] = [5, V]")) as e:
        rejection_sample(meta, None, torch.zeros(4, 9), sm)
    assert "got (4, 9)" in str(e.value)
    with pytest.raises(ValueError, match=re.escape("got (5,)")):
        rejection_sample(meta, None, torch.zeros(5), sm)
    with pytest.raises(ValueError, match=re.escape("draft_probs must have shape [N, V] = [3, 9]")) as e:
        rejection_sample(meta, torch.zeros(3, 8), torch.zeros(5, 9), sm)
    assert "got (3, 8)" in str(e.value)
    with pytest.raises(ValueError, match=re.escape("sampling_metadata.temperature must have shape [B] = [2]")):
        rejection_sample(meta, None, torch.zeros(5, 9), SamplingMetadata.from_params([GREEDY] * 3))
    bad_gen = SamplingMetadata.from_params([GREEDY, GREEDY], generators={4: torch.Generator()})
    with pytest.raises(ValueError, match=re.escape("sampling_metadata.generators has request indices [4]")):
        rejection_sample(meta, None, torch.zeros(5, 9), bad_gen)


# ---------------------------------------------------------------------------- target filtering


def _reference_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """float64 reference: temperature, keep top-k, then the smallest top set with mass >= top_p."""
    order = np.argsort(-logits, kind="stable")
    z = logits[order] / temperature
    if top_k > 0:
        z[top_k:] = -np.inf
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)  # first prefix reaching top_p
        probs[keep:] = 0.0
        probs /= probs.sum()
    out = np.zeros_like(probs)
    out[order] = probs
    return out


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (1.7, 5, 0.8), (1.0, 1, 1.0), (1.0, 0, 1e-6)],
)
def test_compute_target_probs_matches_reference(temperature, top_k, top_p):
    logits = torch.randn(6, 11, dtype=torch.float64).float()
    rows = logits.shape[0]
    p = compute_target_probs(
        logits, torch.full((rows,), temperature), torch.full((rows,), top_k), torch.full((rows,), top_p)
    )
    for r in range(rows):
        ref = _reference_probs(logits[r].double().numpy(), temperature, top_k, top_p)
        np.testing.assert_allclose(p[r].double().numpy(), ref, atol=1e-6)
        assert ((p[r] > 0).numpy() == (ref > 0)).all()
    if top_k == 0 and top_p == 1.0:
        torch.testing.assert_close(compute_target_probs(logits, torch.full((rows,), temperature)), p)


# -------------------------------------------------------------------------- statistical lossless

NUM_SAMPLES = 100_000
VOCAB = 12
K = 3
# Wilson-Hilferty approximation of the chi-square quantile; z = 3.719 is the normal 1 - 1e-4 quantile.
CHI2_Z = 3.719


def _chi2_critical(df: int) -> float:
    return df * (1 - 2 / (9 * df) + CHI2_Z * math.sqrt(2 / (9 * df))) ** 3


def _assert_follows(tokens: torch.Tensor, p: np.ndarray, what: str, tv_max: float) -> None:
    """tokens ~ p: nothing outside p's support, TV below tv_max, chi-square at significance 1e-4."""
    n = tokens.numel()
    assert n > 1000, f"{what}: only {n} samples"
    counts = torch.bincount(tokens, minlength=len(p)).double().numpy()
    support = p > 0
    assert counts[~support].sum() == 0, f"{what}: sampled tokens with p = 0: {np.nonzero(counts * ~support)}"
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < tv_max, f"{what}: total variation {tv:.4f} >= {tv_max}"
    expected = n * p[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    if df > 0:
        assert chi2 < _chi2_critical(df), f"{what}: chi2 {chi2:.1f} >= {_chi2_critical(df):.1f} (df {df})"


def _draft_dist(gen: torch.Generator, logits: torch.Tensor, p: np.ndarray) -> torch.Tensor:
    """A draft distribution near, but unlike, p: a perturbed unfiltered softmax (so it puts mass on
    tokens p filters out) with zero mass on p's second most likely token."""
    q = torch.softmax(logits.double() + torch.randn(VOCAB, generator=gen, dtype=torch.float64), -1)
    q[int(np.argsort(-p)[1])] = 0.0
    return (q / q.sum()).float()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.6, 0, 1.0), (1.0, 4, 1.0), (1.0, 0, 0.7), (1.4, 6, 0.85)],
    ids=["temperature", "top_k", "top_p", "combined"],
)
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
def test_lossless_distribution(temperature, top_k, top_p, one_hot):
    gen = torch.Generator().manual_seed(17)
    base = torch.randn(K + 1, VOCAB, generator=gen) * 1.5  # [k+1, V]: one fixed row per position
    p = [_reference_probs(base[j].double().numpy(), temperature, top_k, top_p) for j in range(K + 1)]
    q = torch.stack([_draft_dist(gen, base[j], p[j]) for j in range(K)])  # [k, V]
    drafts = torch.multinomial(q, NUM_SAMPLES, replacement=True, generator=gen).T.contiguous()  # [B, k]
    meta = SpecDecodeMetadata.from_draft_token_ids(drafts.tolist())
    logits = base.repeat(NUM_SAMPLES, 1)  # [B * (k+1), V]
    draft_probs = None if one_hot else q.repeat(NUM_SAMPLES, 1)  # [B * k, V]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    sm = SamplingMetadata(
        temperature=torch.full((NUM_SAMPLES,), float(temperature)),
        top_k=torch.full((NUM_SAMPLES,), params.top_k),
        top_p=torch.full((NUM_SAMPLES,), float(params.top_p)),
    )
    out = rejection_sample(meta, draft_probs, logits, sm)  # [B, k+1]

    _assert_follows(out[:, 0], p[0], "first token", tv_max=0.01)
    for j in range(1, K + 1):
        reached = out[:, j] != PLACEHOLDER_TOKEN_ID  # drafts 0..j-1 were all accepted
        tv_max = 0.01 * math.sqrt(NUM_SAMPLES / max(int(reached.sum()), 1))
        _assert_follows(out[reached, j], p[j], f"token {j} given {j} accepted", tv_max)
        # Acceptance of draft j-1 (among requests that reached it) matches theory.
        prev = out[:, j - 1] != PLACEHOLDER_TOKEN_ID
        rate = float(reached.sum()) / float(prev.sum())
        qj, pj = q[j - 1].double().numpy(), p[j - 1]
        theory = float((qj * pj).sum() if one_hot else np.minimum(pj, qj).sum())
        assert theory > 0.1, "setup: drafts must be accepted often for the check to mean anything"
        tol = 4 * math.sqrt(theory * (1 - theory) / float(prev.sum())) + 0.002  # ~4 sigma
        assert abs(rate - theory) < tol, f"acceptance at position {j - 1}: {rate:.4f} vs {theory:.4f}"


def test_no_drafts_random_follows_target():
    base = torch.randn(1, VOCAB) * 2
    p = _reference_probs(base[0].double().numpy(), 0.8, 7, 0.9)
    meta = SpecDecodeMetadata.from_draft_token_ids([[]] * NUM_SAMPLES)
    sm = SamplingMetadata(
        temperature=torch.full((NUM_SAMPLES,), 0.8),
        top_k=torch.full((NUM_SAMPLES,), 7),
        top_p=torch.full((NUM_SAMPLES,), 0.9),
    )
    out = rejection_sample(meta, None, base.expand(NUM_SAMPLES, VOCAB), sm)
    assert out.shape == (NUM_SAMPLES, 1)
    _assert_follows(out[:, 0], p, "sampled token", tv_max=0.01)


@pytest.mark.parametrize("temps,top_ks,top_ps", [
    ((0.0, 0.0), (0, 5), (1.0, 0.5)),
    ((0.0, 0.7), (0, 5), (1.0, 1.0)),
    ((0.9, 0.7), (0, 0), (0.9, 1.0)),
    ((0.9,), (3,), (1.0,)),
])
def test_host_flags_equal_the_flags_read_from_tensors(temps, top_ks, top_ps):
    from specdec.rejection_sampler import _batch_flags

    params = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in zip(temps, top_ks, top_ps)]
    md = SamplingMetadata.from_params(params)
    is_greedy = md.temperature == 0
    from_host = _batch_flags(md, is_greedy)
    md.host_flags = None
    assert from_host == _batch_flags(md, is_greedy)


# ------------------------------------------------------------------------- the engine's plain steps


def _plain_step(params: list[SamplingParams], logits: torch.Tensor) -> list[list[int]]:
    """Verifier.sample for a step where nobody drafted (a plain decode step): ``logits [B, V]``."""
    from types import SimpleNamespace

    from specdec.requests import Request
    from specdec.verify import Verifier

    verifier = Verifier(SimpleNamespace(device=torch.device("cpu")), None, None, 0)
    reqs = [Request(str(i), None, [1, 2, 3], p) for i, p in enumerate(params)]
    out = SimpleNamespace(logits=logits, greedy_token_ids=lambda: logits.argmax(-1).tolist())
    return verifier.sample(reqs, [[] for _ in reqs], None, out)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.8, 0, 1.0), (0.8, 7, 0.9), (1.3, 0, 0.6)])
def test_plain_sampled_steps_follow_the_target_without_the_rejection_sampler(temperature, top_k, top_p,
                                                                            no_rejection_sampler):
    """A step without drafts samples each unseeded request straight from softmax(filter(logits / T)) (the
    verifier's plain path, not the rejection sampler: it is made to fail here); greedy rows of the same batch
    take their argmax, and tokens outside top-k / top-p never come out."""
    base = torch.randn(1, VOCAB) * 2
    p = _reference_probs(base[0].double().numpy(), temperature, top_k, top_p)
    n = NUM_SAMPLES // 2
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n + [GREEDY]
    rows = _plain_step(params, base.expand(n + 1, VOCAB).contiguous())
    assert all(len(r) == 1 for r in rows)
    assert rows[-1] == [int(base[0].argmax())]
    _assert_follows(torch.tensor([r[0] for r in rows[:-1]]), p, "plain sampled token", tv_max=0.012)

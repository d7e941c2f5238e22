"""Keyed sampling (specdec.keyed): the hash, the keyed race's distribution, and seeded output that speculation
cannot change: identical tokens with the baseline and with every method, alone and in mixed batches, across
calls (suffix's global tree included), at temperatures and filters that make the drafts matter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec import LLM, SamplingParams
from specdec.draft_sampling import draft_probs_needed, sample_at_temperatures
from specdec.keyed import (
    _hash32,
    _mul32,
    keyed_draft_keys,
    keyed_draft_noise,
    keyed_noise,
    keyed_row_samples,
    keyed_row_tensor,
    keyed_sample,
    seed_halves,
)


def test_mul32_is_multiplication_modulo_2_to_32():
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 2 ** 32, 2000, dtype=np.uint64)
    for c in (0x7FEB352D, 0x846CA68B, 1, 0xFFFFFFFF):
        got = _mul32(torch.from_numpy(xs.astype(np.int64)), c).tolist()
        assert got == [(int(x) * c) % 2 ** 32 for x in xs]


def test_hash_stays_in_32_bits_and_avalanches():
    x = torch.arange(1 << 16, dtype=torch.long)
    h = _hash32(x)
    assert int(h.min()) >= 0 and int(h.max()) < 2 ** 32 and h.unique().numel() == x.numel()  # a bijection here
    flipped = _hash32(x ^ 1)  # one input bit: about half the output bits change
    bits = sum(((h ^ flipped) >> b & 1).sum().item() for b in range(32)) / x.numel()
    assert 14 < bits < 18, bits


def test_seed_halves_cover_the_accepted_seed_range():
    assert seed_halves(0) == (0, 0) and seed_halves(2 ** 64 - 1) == (2 ** 32 - 1, 2 ** 32 - 1)
    assert seed_halves(-1) == seed_halves(2 ** 64 - 1) and seed_halves(2 ** 32 + 5) == (5, 1)


def test_keyed_noise_is_a_function_of_seed_position_and_token():
    seeds = torch.tensor([seed_halves(s) for s in (1, 1, 2, 1)])
    pos = torch.tensor([10, 11, 10, 10])
    a, b = keyed_noise(seeds, pos, 50), keyed_noise(seeds, pos, 50)
    assert torch.equal(a, b) and torch.equal(a[0], a[3])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    ids = torch.tensor([7, 3, 49])  # a drafter's smaller vocabulary: the same noise at those target ids
    assert torch.equal(keyed_noise(seeds, pos, ids), a[:, ids])
    assert bool((a > 0).all()) and bool(torch.isfinite(a).all())


def test_keyed_race_follows_the_distribution_and_positions_are_independent():
    """50 000 seeds: the keyed draws at one position follow p (total variation within sampling error), and
    the pairs (position t, t + 1) of one seed are independent (joint = product of marginals)."""
    n, v = 50_000, 6
    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    seeds = torch.tensor([seed_halves(s) for s in range(n)])
    x0 = keyed_sample(p.expand(n, v), seeds, torch.full((n,), 17))
    x1 = keyed_sample(p.expand(n, v), seeds, torch.full((n,), 18))
    for x in (x0, x1):
        freq = torch.bincount(x, minlength=v).double() / n
        assert 0.5 * (freq - p.double()).abs().sum() < 0.01, freq
    joint = torch.bincount(x0 * v + x1, minlength=v * v).double().view(v, v) / n
    assert 0.5 * (joint - p.double()[:, None] * p.double()[None, :]).abs().sum() < 0.02
    # a run of positions under one seed follows p too
    xs = keyed_sample(p.expand(n, v), torch.tensor([seed_halves(3)] * n), torch.arange(n))
    assert 0.5 * (torch.bincount(xs, minlength=v).double() / n - p.double()).abs().sum() < 0.01


def test_keyed_draft_noise_marks_seeded_sampling_requests_only():
    params = [SamplingParams(temperature=0.8, seed=4), SamplingParams(temperature=0.8),
              SamplingParams(temperature=0.0, seed=4), None]
    noise, keyed = keyed_draft_noise(params, np.array([5, 5, 5, 5]), 3, 20, "cpu")
    assert keyed.tolist() == [True, False, False, False] and noise.shape == (4, 3, 20)
    want = keyed_noise(torch.tensor([seed_halves(4)] * 3), torch.tensor([5, 6, 7]), 20)
    assert torch.equal(noise[0], want) and bool((noise[1:] == 1).all())
    assert keyed_draft_noise(params[1:], [1, 1, 1], 3, 20, "cpu") is None



def _mixed_draft_batch():
    """Five requests: keyed at two temperatures, unseeded sampled, greedy, keyed again; logits ``[5, 3, 40]``."""
    params = [SamplingParams(temperature=0.8, seed=4), SamplingParams(temperature=0.8),
              SamplingParams(temperature=0.0, seed=4), SamplingParams(temperature=1.3, seed=2 ** 40 + 7),
              SamplingParams(temperature=0.5, seed=-3)]
    logits = torch.randn(5, 3, 40, generator=torch.Generator().manual_seed(0)) * 3
    temps = torch.tensor([p.temperature for p in params])
    return params, logits, temps, [9, 9, 9, 30, 2]


def test_keyed_drafts_are_the_targets_keyed_samples_when_the_logits_agree():
    """Coupled drafting from DraftKeys: a keyed request's draft j is exactly the target's keyed sample at its
    position when the draft's logits are the target's (so such a draft is always accepted), greedy rows keep
    their argmax, an unseeded row samples freely, and the noise form (keyed_draft_noise) draws the same law."""
    params, logits, temps, n = _mixed_draft_batch()
    keys = keyed_draft_keys(params, n, 40)
    assert keys.rows == (0, 3, 4) and keys.unkeyed_sampled and keys.starts == (9, 30, 2)
    ids, q = sample_at_temperatures(logits, temps, keys)
    assert torch.allclose(q, torch.softmax(logits / torch.where(temps == 0, 1.0, temps)[:, None, None], -1))
    assert ids[2].tolist() == logits[2].argmax(-1).tolist()
    assert 0 <= int(ids[1].min()) and int(ids[1].max()) < 40
    for i in keys.rows:
        p = params[i]
        want = keyed_row_samples(logits[i], [0, 1, 2], [0, 0, 0], [n[i], n[i] + 1, n[i] + 2], [p.temperature], [0],
                                 [1.0], [p.seed])
        assert ids[i].tolist() == want, i
    # a chain drafter's step j samples position n + j alone
    one, _ = sample_at_temperatures(logits[:, 1:2], temps, keys.step(1))
    assert one[[0, 3, 4], 0].tolist() == ids[[0, 3, 4], 1].tolist()
    # the noise form agrees with the Gumbel form on where each race lands, up to float rounding: over many
    # positions the two pick the same token nearly always
    one_request = [SamplingParams(temperature=0.9, seed=11)]
    wide = torch.randn(1, 400, 40, generator=torch.Generator().manual_seed(1)) * 2
    a, _ = sample_at_temperatures(wide, torch.tensor([0.9]), keyed_draft_keys(one_request, [0], 40))
    b, _ = sample_at_temperatures(wide, torch.tensor([0.9]), keyed_draft_noise(one_request, [0], 400, 40, "cpu"))
    assert (a == b).float().mean() > 0.99


def test_keyed_drafts_over_a_smaller_vocabulary_race_over_the_target_ids():
    """A drafter whose columns stand for target ids (a truncated head vocabulary): the keyed draft is the
    target's keyed race restricted to those ids (the draft's logits scattered into the target's vocabulary,
    -inf elsewhere), returned as a draft column; without the target's size the noise form over the mapped ids."""
    params, logits, temps, n = _mixed_draft_batch()
    vocab = torch.arange(0, 80, 2)  # draft column c stands for target id 2c, of 80
    keys = keyed_draft_keys(params, n, vocab, 80)
    ids, _ = sample_at_temperatures(logits, temps, keys)
    full = torch.full((5, 3, 80), float("-inf")).index_copy_(-1, vocab, logits)
    for i in keys.rows:
        p = params[i]
        want = keyed_row_samples(full[i], [0, 1, 2], [0, 0, 0], [n[i], n[i] + 1, n[i] + 2], [p.temperature], [0],
                                 [1.0], [p.seed])
        assert vocab[ids[i]].tolist() == want, i
    noise_form, _ = sample_at_temperatures(logits, temps, keyed_draft_keys(params, n, vocab))
    noise, mask = keyed_draft_noise(params, n, 3, vocab, "cpu")
    q = torch.softmax(logits / torch.where(temps == 0, 1.0, temps)[:, None, None], -1)
    assert noise_form[[0, 3, 4]].tolist() == (q * noise).argmax(-1)[[0, 3, 4]].tolist() and mask.tolist() == [
        True, False, False, True, True]
    assert keyed_draft_keys(params[1:3], n[1:3], 40) is None


def test_keyed_drafts_without_probs_are_the_same_drafts():
    """``probs=False`` (a batch whose verifier reads no q: draft_probs_needed) gives the same drafts and no
    distributions, keyed and greedy rows alike; with an unseeded sampled request in the batch q is needed."""
    params, logits, temps, n = _mixed_draft_batch()
    keep = [0, 2, 3, 4]  # no unseeded sampled request
    sub = [params[i] for i in keep]
    keys = keyed_draft_keys(sub, [n[i] for i in keep], 40)
    assert not keys.unkeyed_sampled
    with_q, q = sample_at_temperatures(logits[keep], temps[keep], keys)
    without, none = sample_at_temperatures(logits[keep], temps[keep], keys, probs=False)
    assert q is not None and none is None and without.tolist() == with_q.tolist()
    assert not draft_probs_needed(DraftBatchStub(sub)) and draft_probs_needed(DraftBatchStub(params))
    assert not draft_probs_needed(DraftBatchStub(None))


class DraftBatchStub:
    """The one field draft_probs_needed reads."""

    def __init__(self, sampling_params):
        self.sampling_params = sampling_params


def test_keyed_row_tensor_is_keyed_row_samples_in_row_order():
    """Filtered (top-k) and unfiltered rows interleaved: the device tensor holds each row's keyed sample in the
    order the rows were listed, as keyed_row_samples reads them."""
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 2
    rows, owner, positions = [0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 2, 2], [7, 3, 8, 4, 11, 12]
    temps, top_k, top_p, seeds = [0.8, 1.1, 0.6], [0, 5, 0], [1.0, 1.0, 0.9], [1, 2, 3]
    got = keyed_row_tensor(logits, rows, owner, positions, temps, top_k, top_p, seeds)
    want = [keyed_row_samples(logits, [r], [0], [p], [temps[o]], [top_k[o]], [top_p[o]], [seeds[o]])[0]
            for r, o, p in zip(rows, owner, positions)]
    assert got.tolist() == want
    assert keyed_row_tensor(logits, [], [], [], [], [], [], []).numel() == 0

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Stack:\n    def push(self, x):\n",
           "for i in range(10):\n    print(i", "x = [1, 2, 3]\ny = [", "# compute the mean\ndef mean(xs):\n"]


def _params():
    """Seeded at two temperatures and with filters, one unseeded, one greedy: a mixed batch."""
    out = [SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=11),
           SamplingParams(temperature=1.0, top_k=20, max_tokens=24, ignore_eos=True, seed=12),
           SamplingParams(temperature=0.7, top_p=0.9, max_tokens=24, ignore_eos=True, seed=13),
           SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True),
           SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
           SamplingParams(temperature=1.2, max_tokens=24, ignore_eos=True, seed=2 ** 64 - 1)]
    return out


@pytest.fixture(scope="module")
def baseline():
    llm = LLM(specdec.bundled_model("tiny"), dtype="float32", device="cpu", max_num_seqs=8)
    return [o.token_ids for o in llm.generate(PROMPTS, _params())]


@pytest.mark.parametrize("method,k", [("ngram", 4), ("suffix", 6), ("draft_model", 3), ("eagle3", 3), ("eagle", 3),
                                      ("medusa", 2), ("dflash", 3)])
def test_seeded_output_is_the_baselines_for_every_method(baseline, method, k):
    """Each method's seeded (and greedy) requests give the baseline's tokens in a mixed batch, on two calls, and
    alone; the unseeded request only has to finish."""
    if method not in specdec.available_methods():
        pytest.skip(f"method {method!r} is not installed")
    if method == "suffix":
        pytest.importorskip("arctic_inference.suffix_decoding",
                            reason="arctic-inference is not installed (it needs a source build): run `make install`")
    llm = LLM(specdec.bundled_model("tiny"), {"method": method, "num_speculative_tokens": k}, dtype="float32",
              device="cpu", max_num_seqs=8)
    params = _params()
    seeded = [i for i, p in enumerate(params) if p.seed is not None or p.temperature == 0]
    for _ in range(2):  # a second call: suffix's global tree now holds the first call's outputs
        out = [o.token_ids for o in llm.generate(PROMPTS, params)]
        assert [out[i] for i in seeded] == [baseline[i] for i in seeded]
        assert len(out[3]) == 24
    assert llm.stats.num_draft_tokens > 0
    alone = llm.generate([PROMPTS[1]], params[1])[0].token_ids
    assert alone == baseline[1]
    two = [o.token_ids for o in llm.generate([PROMPTS[2], PROMPTS[0]], [params[2], params[0]])]
    assert two == [baseline[2], baseline[0]]


@pytest.mark.parametrize("temperature, seed, keyed, free", [(0.0, None, False, False), (0.0, 3, False, False),
                                                            (0.8, 3, True, False), (0.8, 0, True, False),
                                                            (0.8, None, False, True)])
def test_sampling_params_tell_keyed_from_free_sampling(temperature, seed, keyed, free):
    """``SamplingParams.keyed`` (sampling with a seed: the keyed rule) and ``.free`` (without one: the only
    requests whose draft probs are read); a greedy request is neither, whatever its seed."""
    p = SamplingParams(temperature=temperature, seed=seed)
    assert (p.keyed, p.free, p.greedy) == (keyed, free, temperature == 0.0)

"""Keyed sampling (specdec.keyed): the hash, the keyed race's distribution, and seeded output that speculation
cannot change: identical tokens with the baseline and with every method, alone and in mixed batches, across
calls (suffix's global tree included), at temperatures and filters that make the drafts matter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec import LLM, SamplingParams
from specdec.keyed import _hash32, _mul32, keyed_draft_noise, keyed_noise, keyed_sample, seed_halves


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

"""The lean greedy chain (``specdec_eagle.chain``) drafts what the module path (``EagleHead.decode`` step by
step) drafts: same ids, hidden states within float32 rounding, the same KV written, at every step of a
generation, for EAGLE-1 and EAGLE-3 heads, batch 1 and 3 (padding, non-contiguous slots)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from eagle_formats import random_eagle1, random_eagle3, write

from conftest import TINY_VOCAB
from specdec import LLM, SamplingParams
from specdec_eagle.proposer import Eagle3Proposer, EagleProposer

rng = random.Random(5)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
# different lengths, so requests finish apart and later ones run in non-contiguous slots
GREEDY = [SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]


def _module_drafts(p, propose, batch):
    """The module path's drafts for ``batch`` (``propose``: the proposer class's own), leaving the proposer's
    cache and committed lengths as they were; also the keys it wrote."""
    chain, cache = p.chain, p.cache
    keys, values, committed = cache.keys.clone(), cache.values.clone(), dict(p.committed)
    p.chain = None
    try:
        out = propose(p, batch)
        module_keys = cache.keys.clone()
    finally:
        p.chain = chain
        cache.keys.copy_(keys)
        cache.values.copy_(values)
        p.committed = committed
    return out, module_keys


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_chain_drafts_equal_module_path(tmp_path, register_proposer, tiny_llama_path, kind, batch):
    base = Eagle3Proposer if kind == "eagle3" else EagleProposer
    head = write(tmp_path / kind, *(random_eagle3(TINY_VOCAB, 40, seed=6) if kind == "eagle3"
                                    else random_eagle1(TINY_VOCAB, seed=6)))
    steps, slot_sets = [], set()

    class Both(base):
        method = f"both_{kind}"

        def propose(self, b):
            expected, module_keys = _module_drafts(self, base.propose, b)
            got = super().propose(b)
            if sum(got.num_draft_tokens):
                steps.append((expected, got))
                slot_sets.add(tuple(self.slot[r] for r in b.req_ids))
                # the catch-up's committed KV (what later steps read) is the module path's
                for r in b.req_ids:
                    s, c = self.slot[r], self.committed[r]
                    torch.testing.assert_close(self.cache.keys[s, :, :c], module_keys[s, :, :c])
            return got

    register_proposer(Both)
    llm = LLM(tiny_llama_path, {"method": Both.method, "num_speculative_tokens": 3,
                                "speculation_policy": "fixed", "model": head},
              dtype="float32", max_num_seqs=batch, device="cpu")  # the lean chain is the CPU's
    assert llm.proposer.chain is not None
    llm.generate(PROMPTS, GREEDY)
    assert len(steps) > 10
    if batch > 1:
        assert any(list(s) != list(range(len(s))) for s in slot_sets), slot_sets
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert got.probs is None and expected.probs is None
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)



@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("probs", [False, True])
def test_sampled_chain_drafts_equal_module_path(tmp_path, register_proposer, tiny_llama_path, monkeypatch, kind, batch,
                                                probs):
    """Sampled requests draft through the lean chain too (the proposer's sampler picks each draft from the head's
    float32 logits): seeded requests at T = 0.8 and 1.3 beside a greedy one draw the module path's drafts (keyed
    noise, so the same draws), and the seeded outputs equal the target alone's. Such a batch's verifier reads no
    draft distributions, so neither path sends any; with them asked for (``probs``: as for a batch with an unseeded
    sampled request) both send the same ones."""
    import specdec_eagle.proposer as eagle_proposer

    if probs:
        monkeypatch.setattr(eagle_proposer, "draft_probs_needed", lambda batch: True)
    base = Eagle3Proposer if kind == "eagle3" else EagleProposer
    head = write(tmp_path / kind, *(random_eagle3(TINY_VOCAB, 40, seed=6) if kind == "eagle3"
                                    else random_eagle1(TINY_VOCAB, seed=6)))
    steps, wide = [], [False]  # wide: the chain's last call caught up more than k + 1 positions

    class Both(base):
        method = f"sampled_both_{kind}"

        def propose(self, b):
            expected, _ = _module_drafts(self, base.propose, b)
            got = super().propose(b)
            if any(p.temperature > 0 for p in b.sampling_params) and sum(got.num_draft_tokens):
                steps.append((expected, got, wide[0]))
            return got

    register_proposer(Both)
    params = [SamplingParams(temperature=t, seed=11 + i, max_tokens=10 + 4 * i, ignore_eos=True)
              for i, t in enumerate((0.8, 0.0, 1.3, 0.8))]
    llm = LLM(tiny_llama_path, {"method": Both.method, "num_speculative_tokens": 3, "model": head,
                                "speculation_policy": "fixed"}, dtype="float32", max_num_seqs=batch,
              device="cpu")  # the lean chain is the CPU's
    chain = llm.proposer.chain
    picks = []  # the chain's calls with a sampler: every sampled step's
    real = chain.draft

    def counting(*args):
        picks.append(args[-1] is not None)
        wide[0] = args[4].shape[1] > args[6] + 1  # pos [B, W] against steps + 1
        return real(*args)

    chain.draft = counting
    out = [o.token_ids for o in llm.generate(PROMPTS[:4], params)]
    target = LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch, device="cpu")
    assert out == [o.token_ids for o in target.generate(PROMPTS[:4], params)]
    assert len(steps) > 5 and sum(picks) == len(steps)
    assert any(w for *_, w in steps) and not all(w for *_, w in steps)
    for expected, got, _ in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)
        # float32 rounding, ~1e-7 on a hidden state, which a random head's steps amplify (float64: 1e-16): a wide
        # catch-up's last position runs alone in the chain (the module path computes every position in one batch),
        # and the CPU's SDPA rounds a query row by how many rows it gets (1-2 rows against 4 or more: ~1e-7), which
        # differ between the paths since grouped-query heads run packed as their KV head's rows (head_layers.attention).
        # Measured: up to ~2e-5 here (torch 2.13), 3.1e-4 on one of 288 probabilities on the H100 host's CPU (torch
        # 2.11, EAGLE-1 head; benchmarks/results/h100/s45-2026-12-06); a wrong distribution differs by far more
        if not probs:
            assert got.probs is None and expected.probs is None
            continue
        torch.testing.assert_close(got.probs, expected.probs, atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_wide_catch_up_writes_keys_only_before_each_rows_last(kind):
    """A catch-up wider than a drafting step's (a prompt, a plain run) computes each row's last position alone and
    only the keys and values of the positions before it (a one-layer head's K/V at a position depend on its own
    inputs): in float64 the drafts and the committed K/V equal those of the full catch-up, rows of different widths
    (padding), non-contiguous slots."""
    from specdec_eagle.chain import GreedyHeadChain
    from specdec_eagle.heads import HeadConfig, HeadKVCache, build_head

    cfg = HeadConfig(kind=kind, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=300, draft_vocab_size=100 if kind == "eagle3" else 0)
    torch.manual_seed(1)
    head = build_head(cfg).double()
    for p in head.parameters():
        p.data.normal_(0, 0.1)
    b, width, steps, slots = 3, 9, 3, [2, 0, 3]
    tokens = torch.randint(0, cfg.vocab_size, (b, width))
    feats = torch.randn(b, width, cfg.feature_size, dtype=torch.float64)
    q, start = np.array([9, 4, 1]), np.array([5, 20, 7])
    j = np.arange(width)[None]
    valid, pos = j < q[:, None], start[:, None] + np.minimum(j, q[:, None] - 1)
    out = []
    for chain_steps in (steps, width):  # `steps` takes the wide path; `width` drafts >= width - 1: the full one
        cache = HeadKVCache(cfg, 4, 64, torch.float64, "cpu")
        torch.manual_seed(2)
        cache.keys.normal_()
        cache.values.normal_()
        ids, _ = GreedyHeadChain(head, 64).draft(cache, slots, tokens, feats, pos, valid, chain_steps)
        out.append((ids[:, :steps], cache))
    (ids, wide), (full_ids, full) = out
    assert torch.equal(ids, full_ids)
    for s, end in zip(slots, start + q):  # the catch-up's KV, and what lay below it, as the full catch-up left it
        torch.testing.assert_close(wide.keys[s, :, :end], full.keys[s, :, :end], atol=1e-12, rtol=0)
        torch.testing.assert_close(wide.values[s, :, :end], full.values[s, :, :end], atol=1e-12, rtol=0)
    assert torch.equal(wide.keys[1], full.keys[1])  # a slot outside the batch: untouched


def test_the_catch_up_benchmark_times_both_ways():
    """``benchmarks/eagle_catch_up.py`` (run on the CPU before a device call uses it) prints one row per batch and
    width with both times and their ratio."""
    import pathlib
    import subprocess
    import sys

    bench = pathlib.Path(__file__).resolve().parents[3] / "benchmarks"
    proc = subprocess.run([sys.executable, str(bench / "eagle_catch_up.py"), "--batch", "1", "2", "--width", "16",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300, cwd=bench)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[:2] for r in rows[1:]] == [[" 1 ", " 16 "], [" 2 ", " 16 "]]
    for r in rows[1:]:
        keys, full, ratio = float(r[2]), float(r[3]), float(r[4].strip().rstrip("x"))
        assert keys > 0 and full > 0 and abs(ratio - full / keys) <= ratio * (0.005 / keys + 0.005 / full) + 0.005

"""The capture-ready DFlash step (``specdec_dflash.graph_block.CapturedBlock``), run eagerly on the CPU
(``use_graphs=False``, the same function a CUDA graph captures), drafts what the eager path drafts at every step
of a generation and writes the same context K/V (batch 1 and 3, non-contiguous slots, prompt hand-overs wider
than the graph, KV buckets up to the capacity); greedy output equals the target alone. The CUDA tests capture it
(``draft_cuda_graphs=True``, the default) and check the same on the device."""

from __future__ import annotations

import random

import pytest
import torch
from dflash_formats import random_dflash, write
from specdec_dflash.proposer import DFlashProposer

from conftest import TINY_VOCAB
from specdec import LLM, SamplingParams

rng = random.Random(9)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
# different lengths, so requests finish apart and later ones run in non-contiguous slots
GREEDY = [SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
BLOCK, MASK = 8, 5


def _draft(tmp_path, layout="z-lab"):
    ids = {"target_layer_ids": [1, 2]} if layout == "speculators" else {}
    return write(tmp_path / layout, *random_dflash(TINY_VOCAB, layout, seed=4, block_size=BLOCK, mask_token_id=MASK,
                                                   **ids))


def _eager_drafts(p, batch):
    """The eager path's drafts for ``batch``, leaving the proposer's cache and committed lengths as they were;
    also the keys it wrote (layer 0)."""
    block, cache = p.graph_block, p.cache
    keys, values, committed = [k.clone() for k in cache.keys], [v.clone() for v in cache.values], dict(p.committed)
    p.graph_block = None
    try:
        out = DFlashProposer.propose(p, batch)
        eager_keys = cache.keys[0].clone()
    finally:
        p.graph_block = block
        for a, b in zip(cache.keys + cache.values, keys + values):
            a.copy_(b)
        p.committed = committed
    return out, eager_keys


def _comparing(name, steps, slot_sets, **attrs):
    """A proposer class drafting through its CapturedBlock that records the eager path's drafts beside them
    (only for steps the block served)."""

    class Both(DFlashProposer):
        method = name

        def propose(self, b):
            expected, eager_keys = _eager_drafts(self, b)
            runs = self.graph_block.runs
            got = super().propose(b)
            if self.graph_block.runs > runs:
                steps.append((expected, got))
                Both.buckets.add(self.graph_block.last)
                slot_sets.add(tuple(self.slot[r] for r in b.req_ids))
                for r in b.req_ids:  # the committed context K/V (what later steps read) is the eager path's
                    s, c = self.slot[r], self.committed[r]
                    torch.testing.assert_close(self.cache.keys[0][s, :, :c], eager_keys[s, :, :c])
            return got

    Both.buckets = set()  # (batch, KV) buckets the block ran
    for key, value in attrs.items():
        setattr(Both, key, value)
    return Both


def _check(steps):
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert got.probs is None and expected.probs is None
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)


@pytest.mark.parametrize("layout", ["z-lab", "speculators"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [1, 3, BLOCK - 1])
def test_eager_graph_block_drafts_equal_eager_path(tmp_path, register_proposer, tiny_llama_path, layout, batch, k):
    steps, slot_sets = [], set()
    cls = _comparing(f"graph_dflash_{layout.replace('-', '')}_{batch}_{k}", steps, slot_sets, _eager_graph_block=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": k, "model": _draft(tmp_path, layout),
                                "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=batch)
    block = llm.proposer.graph_block
    assert block is not None and not block.use_graphs and block.q == k + 1
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    target = LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch)
    assert out == [o.token_ids for o in target.generate(PROMPTS, GREEDY)]
    assert len(steps) > 10 and block.runs == len(steps)
    if batch > 1:
        assert any(list(s) != list(range(len(s))) for s in slot_sets), slot_sets
        assert any(bb > 1 for bb, _ in cls.buckets), cls.buckets
    _check(steps)


def test_eager_graph_block_with_uneven_acceptance(tmp_path, register_proposer, tiny_llama_path):
    """Sampling requests with argmax drafts (``draft_sample_method="greedy"``: the block serves them) accept a
    few drafts, so hand-overs of different widths per row reach the graph; drafts still equal the eager path's."""
    steps, slot_sets = [], set()
    cls = _comparing("graph_dflash_uneven", steps, slot_sets, _eager_graph_block=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 4,
                                "speculation_policy": "fixed", "model": _draft(tmp_path),
                                "draft_sample_method": "greedy"}, dtype="float32", max_num_seqs=4)
    torch.manual_seed(0)
    llm.generate(PROMPTS, SamplingParams(temperature=0.3, max_tokens=24, ignore_eos=True, seed=5))
    assert llm.stats.num_accepted_tokens > 0 and len(steps) > 10
    _check(steps)


def test_eager_graph_block_across_kv_buckets_up_to_capacity(tmp_path, register_proposer, tiny_llama_path):
    """Requests that run past the first KV bucket (128 positions) up to max_model_len (256): the block switches
    buckets, and near the end the budget falls below k while the drafts still equal the eager path's."""
    steps, slot_sets = [], set()
    cls = _comparing("graph_dflash_long", steps, slot_sets, _eager_graph_block=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 5, "model": _draft(tmp_path),
                                "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=2)
    prompts = PROMPTS[:2]
    params = [SamplingParams(temperature=0.0, max_tokens=256 - len(p), ignore_eos=True) for p in prompts]
    out = [o.token_ids for o in llm.generate(prompts, params)]
    baseline = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=2).generate(prompts, params)]
    assert out == baseline
    assert {kb for _, kb in cls.buckets} >= {128, 256}, cls.buckets
    assert any(0 < n < 5 for _, got in steps for n in got.num_draft_tokens)
    _check(steps)


def test_eager_graph_block_rebuilt_when_slots_grow(tmp_path, register_proposer, tiny_llama_path):
    """More requests than slots: the cache is reallocated and the block rebuilt over the new tensors."""
    cls = _comparing("graph_dflash_grow", [], set(), _eager_graph_block=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 3,
                                "speculation_policy": "fixed", "model": _draft(tmp_path)},
              dtype="float32", max_num_seqs=1)
    p = llm.proposer
    old = p.graph_block
    for i in range(p.cache.num_slots + 1):
        p.add_request(f"r{i}", PROMPTS[0])
    assert p.graph_block is not old and p.graph_block.cache.keys[0] is p.cache.keys[0]
    assert p.graph_block.batches[-1] == p.cache.num_slots > old.batches[-1]


def test_draft_cuda_graphs_is_ignored_off_cuda(tmp_path, tiny_llama_path):
    for flag in (True, False):
        llm = LLM(tiny_llama_path, {"method": "dflash", "num_speculative_tokens": 3,
                                    "speculation_policy": "fixed", "model": _draft(tmp_path),
                                    "draft_cuda_graphs": flag}, dtype="float32", device="cpu")
        assert llm.proposer.graph_block is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_draft_cuda_graphs_is_on_by_default_on_cuda(tmp_path, tiny_llama_path):
    spec = {"method": "dflash", "num_speculative_tokens": 3, "speculation_policy": "fixed", "model": _draft(tmp_path)}
    block = LLM(tiny_llama_path, spec, dtype="float32", device="cuda").proposer.graph_block
    assert block is not None and block.use_graphs and all(c.graph is not None for c in block.blocks.values())
    off = LLM(tiny_llama_path, {**spec, "draft_cuda_graphs": False}, dtype="float32", device="cuda")
    assert off.proposer.graph_block is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [3, BLOCK - 1])
def test_captured_block_lossless_on_cuda(tmp_path, register_proposer, tiny_llama_path, batch, k):
    """Captured steps on CUDA: greedy output equals the target alone, the graphs served every drafting step,
    and their drafts agree with the eager path's (not bitwise: kernels over different KV lengths may round
    differently, so at least 90% of draft tokens)."""
    steps, slot_sets = [], set()
    cls = _comparing(f"graph_dflash_cuda_{batch}_{k}", steps, slot_sets)
    register_proposer(cls)
    spec = {"method": cls.method, "num_speculative_tokens": k, "model": _draft(tmp_path),
            "speculation_policy": "fixed"}  # every step drafts through the graphs
    llm = LLM(tiny_llama_path, spec, dtype="float32", device="cuda", max_num_seqs=batch)
    block = llm.proposer.graph_block
    assert block is not None and block.use_graphs
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    baseline = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", device="cuda",
                                         max_num_seqs=batch).generate(PROMPTS, GREEDY)]
    assert out == baseline
    assert len(steps) > 10 and block.runs == len(steps)
    same = total = 0
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        keep = expected.token_ids >= 0
        same += int((got.token_ids == expected.token_ids)[keep].sum())
        total += int(keep.sum())
    assert same >= 0.9 * total, (same, total)

"""The capture-ready chain (``specdec_eagle.graph_chain.CapturedHeadChain``), run eagerly on the CPU
(``use_graphs=False``, the same function a CUDA graph captures), drafts what the module path
(``EagleHead.decode`` step by step) drafts at every step of a generation, for EAGLE-1 and EAGLE-3 heads,
batch 1 and 3 (padding, non-contiguous slots), and greedy output equals the target alone. The CUDA test
captures the chain (``draft_cuda_graphs=True``) and checks the same; it has not been run yet (no GPU in the
session that wrote it)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from eagle_formats import random_eagle1, random_eagle3, write

import specdec.fused
from conftest import TINY_VOCAB
from specdec import LLM, SamplingParams
from specdec_eagle.proposer import Eagle3Proposer, EagleProposer

rng = random.Random(7)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
# different lengths, so requests finish apart and later ones run in non-contiguous slots
GREEDY = [SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]


def _head(tmp_path, kind):
    return write(tmp_path / kind, *(random_eagle3(TINY_VOCAB, 40, seed=6) if kind == "eagle3"
                                    else random_eagle1(TINY_VOCAB, seed=6)))


def _module_drafts(p, propose, batch):
    """The module path's drafts for ``batch``, leaving the proposer's cache and committed lengths as they
    were; also the keys it wrote."""
    chains, cache = (p.chain, p.graph_chain), p.cache
    keys, values, committed = cache.keys.clone(), cache.values.clone(), dict(p.committed)
    p.chain = p.graph_chain = None
    try:
        out = propose(p, batch)
        module_keys = cache.keys.clone()
    finally:
        p.chain, p.graph_chain = chains
        cache.keys.copy_(keys)
        cache.values.copy_(values)
        p.committed = committed
    return out, module_keys


def _comparing(kind, name, steps, slot_sets, **attrs):
    """A proposer class that drafts through its chains and records the module path's drafts beside them
    (only for steps the graph chain served)."""
    base = Eagle3Proposer if kind == "eagle3" else EagleProposer

    class Both(base):
        method = name

        def propose(self, b):
            Both.calls += 1
            expected, module_keys = _module_drafts(self, base.propose, b)
            runs = self.graph_chain.runs
            got = super().propose(b)
            if self.graph_chain.runs > runs:
                steps.append((expected, got))
                Both.buckets.add(self.graph_chain.last)
                slot_sets.add(tuple(self.slot[r] for r in b.req_ids))
                # the catch-up's committed KV (what later steps read) is the module path's
                for r in b.req_ids:
                    s, c = self.slot[r], self.committed[r]
                    torch.testing.assert_close(self.cache.keys[s, :, :c], module_keys[s, :, :c])
            return got

    Both.buckets = set()  # (batch, KV) buckets the graph chain ran
    Both.calls = 0
    for key, value in attrs.items():
        setattr(Both, key, value)
    return Both


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_eager_graph_chain_drafts_equal_module_path(tmp_path, register_proposer, tiny_llama_path, kind, batch):
    steps, slot_sets = [], set()
    cls = _comparing(kind, f"graph_{kind}", steps, slot_sets, _eager_graph_chain=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 3, "model": _head(tmp_path, kind),
                                "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=batch)
    chain = llm.proposer.graph_chain
    assert chain is not None and not chain.use_graphs
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    target = LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch)
    assert out == [o.token_ids for o in target.generate(PROMPTS, GREEDY)]
    # every step through the chain: catch-ups wider than its k + 1 columns (the prompts) too, their head
    # positions before the last one through the module path
    assert len(steps) > 10 and chain.runs == len(steps) == cls.calls
    if batch > 1:
        assert any(list(s) != list(range(len(s))) for s in slot_sets), slot_sets
        assert any(bb > 1 for bb, _ in cls.buckets), cls.buckets
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert got.probs is None and expected.probs is None
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)


def test_draft_cuda_graphs_is_ignored_off_cuda(tmp_path, tiny_llama_path):
    head = _head(tmp_path, "eagle3")
    for flag in (True, False):
        llm = LLM(tiny_llama_path, {"method": "eagle3", "num_speculative_tokens": 3,
                                    "speculation_policy": "fixed", "model": head,
                                    "draft_cuda_graphs": flag}, dtype="float32", device="cpu")
        assert llm.proposer.graph_chain is None and llm.proposer.chain is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_draft_cuda_graphs_is_on_by_default_on_cuda(tmp_path, tiny_llama_path):
    head = _head(tmp_path, "eagle3")
    spec = {"method": "eagle3", "num_speculative_tokens": 3, "speculation_policy": "fixed", "model": head}
    assert LLM(tiny_llama_path, spec, dtype="float32", device="cuda").proposer.graph_chain is not None
    off = LLM(tiny_llama_path, {**spec, "draft_cuda_graphs": False}, dtype="float32", device="cuda")
    assert off.proposer.graph_chain is None


def test_eager_graph_chain_rebuilt_when_slots_grow(tmp_path, register_proposer, tiny_llama_path):
    """More requests than slots: the cache is reallocated and the chain rebuilt over the new tensors."""
    cls = _comparing("eagle3", "graph_grow", [], set(), _eager_graph_chain=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 3,
                                "speculation_policy": "fixed", "model": _head(tmp_path, "eagle3")},
              dtype="float32", max_num_seqs=1)
    p = llm.proposer
    old = p.graph_chain
    for i in range(p.cache.num_slots + 1):
        p.add_request(f"r{i}", PROMPTS[0])
    assert p.graph_chain is not old
    assert p.graph_chain.batches[-1] == p.cache.num_slots > old.batches[-1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_captured_chain_lossless_on_cuda(tmp_path, register_proposer, tiny_llama_path, kind, batch):
    """Captured chains (``draft_cuda_graphs=True``) on CUDA: greedy output equals the target alone, the
    graphs served most steps, and their drafts agree with the module path's (not bitwise: different
    kernels may round differently, so at least 90% of draft tokens)."""
    steps, slot_sets = [], set()
    cls = _comparing(kind, f"graph_cuda_{kind}", steps, slot_sets)
    register_proposer(cls)
    spec = {"method": cls.method, "num_speculative_tokens": 3, "model": _head(tmp_path, kind),
            "draft_cuda_graphs": True, "speculation_policy": "fixed"}  # every step drafts through the graphs
    llm = LLM(tiny_llama_path, spec, dtype="float32", device="cuda", max_num_seqs=batch)
    chain = llm.proposer.graph_chain
    assert chain is not None and chain.use_graphs and all(c.graph is not None for c in chain.chains.values())
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    baseline = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", device="cuda",
                                         max_num_seqs=batch).generate(PROMPTS, GREEDY)]
    assert out == baseline
    assert len(steps) > 10 and chain.runs == len(steps)
    if batch > 1:
        assert any(list(s) != list(range(len(s))) for s in slot_sets), slot_sets
    same = total = 0
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        keep = expected.token_ids >= 0
        same += int((got.token_ids == expected.token_ids)[keep].sum())
        total += int(keep.sum())
    assert same >= 0.9 * total, (same, total)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_eager_graph_chain_across_kv_buckets_up_to_capacity(tmp_path, register_proposer, tiny_llama_path, kind):
    """Requests that run past the first KV bucket (128 positions) up to max_model_len (256): the chain
    switches buckets, and near the end its last drafts fall past the capacity (budget < k, writes to
    scratch) while the drafts still equal the module path's."""
    steps, slot_sets = [], set()
    cls = _comparing(kind, f"graph_long_{kind}", steps, slot_sets, _eager_graph_chain=True)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 5, "model": _head(tmp_path, kind),
                                "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=2)
    prompts = PROMPTS[:2]
    params = [SamplingParams(temperature=0.0, max_tokens=256 - len(p), ignore_eos=True) for p in prompts]
    out = [o.token_ids for o in llm.generate(prompts, params)]
    baseline = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=2).generate(prompts, params)]
    assert out == baseline
    assert any(min(got.num_draft_tokens) < 5 for _, got in steps)  # the capacity cut some drafts
    assert {kb for _, kb in cls.buckets} == {128, 256}
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)


@pytest.fixture(scope="module")
def fk(interpreted_copy):
    """The fused kernels module run by the Triton interpreter (on CUDA the compiled kernels serve the captured chains
    by default: test_captured_chain_lossless_on_cuda)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the compiled kernels run the captured chains (test_captured_chain_lossless_on_cuda)")
    with interpreted_copy(Path(specdec.fused.__file__).with_name("fused_kernels.py")) as module:
        yield module


@pytest.mark.parametrize("kind,batch", [("eagle", 3), ("eagle3", 3), ("eagle3", 1)])
def test_fused_head_steps_draft_what_the_module_path_drafts(fk, tmp_path, register_proposer, tiny_llama_path, kind,
                                                            batch, monkeypatch):
    """``draft_fused``'s head steps (the fused kernels: one-row projections with the norms and residual adds inside,
    rotary + KV write, split-key attention up to each row's own end) in the capture-ready chain, float32: every draft
    equals the module path's, the catch-up's committed KV too (checked in _comparing), and greedy output equals the
    target alone's. A catch-up wider than the chain's (a prompt) runs torch ops, never the kernels: Triton compiles
    them again for new widths (on the H200 a switch into drafting then cost 70-100 ms)."""
    widths, attend = [], fk.attend

    def spy(q, *args, **kwargs):
        widths.append(q.shape[1])
        return attend(q, *args, **kwargs)

    monkeypatch.setattr(fk, "attend", spy)
    steps, slot_sets = [], set()
    cls = _comparing(kind, f"fused_{kind}", steps, slot_sets, _eager_graph_chain=True, _chain_kernels=fk)
    register_proposer(cls)
    n = 4 if batch > 1 else 2  # the interpreter's kernels are slow: fewer requests one at a time
    prompts, params = PROMPTS[:n], GREEDY[:n]
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 3, "model": _head(tmp_path, kind),
                                "speculation_policy": "fixed"}, dtype="float32", max_num_seqs=batch)
    p = llm.proposer
    assert p.graph_chain.lean is p.chain and p.chain.kernels is fk
    out = [o.token_ids for o in llm.generate(prompts, params)]
    assert out == [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(
        prompts, params)]
    assert len(steps) > 5 and p.graph_chain.runs == len(steps)
    assert widths and max(widths) <= p.graph_chain.q, widths  # prompts up to 19 tokens: wider catch-ups ran
    if batch > 1:
        assert any(bb > 1 for bb, _ in cls.buckets), cls.buckets
    for expected, got in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)


def test_fused_head_step_equals_the_torch_step(fk):
    """One head step through the kernels against the torch step on the same cache (its positions past each row's
    end hold garbage, which only an over-read would see): a 3-row catch-up with a causal mask, then one-token steps
    with no mask and each row's end, float32: the hidden states and the KV written agree to rounding."""
    from specdec_eagle.chain import GreedyHeadChain
    from specdec_eagle.heads import Eagle3Head, HeadConfig

    torch.manual_seed(0)
    cfg = HeadConfig("eagle3", 64, 96, 4, 2, TINY_VOCAB, draft_vocab_size=40, num_aux_layers=3)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
    plain, fused = GreedyHeadChain(head, 32), GreedyHeadChain(head, 32, fk)
    assert plain.kernels is None and fused.kernels is fk
    with torch.inference_mode():  # as the chains run
        _compare_steps(plain, fused, cfg)


def _compare_steps(plain, fused, cfg):
    from specdec_eagle.heads import HeadKVCache

    caches = [HeadKVCache(cfg, 4, 32, torch.float32, "cpu") for _ in range(2)]
    for c in caches:  # the same garbage everywhere
        g = torch.Generator().manual_seed(1)
        c.keys.copy_(torch.randn(c.keys.shape, generator=g))
        c.values.copy_(torch.randn(c.values.shape, generator=g))
    slots = torch.tensor([2, 0, 3])
    pos = torch.tensor([[5, 6, 7, 7], [0, 1, 2, 3], [9, 10, 10, 10]])  # padding repeats the last position
    write = torch.tensor([[5, 6, 7, 32], [0, 1, 2, 3], [9, 10, 32, 32]])  # padding writes the scratch position
    mask = (torch.arange(11)[None, None, :] <= pos[:, :, None])[:, None]
    embeds, feats = torch.randn(3, 4, 64), torch.randn(3, 4, 3 * 64)
    got = fused._step(caches[1], slots, False, 11, embeds, feats, pos, write, mask, (pos.amax(1) + 1).int())
    want = plain._step(caches[0], slots, False, 11, embeds, feats, pos, write, mask)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(caches[1].keys, caches[0].keys, atol=1e-5, rtol=1e-5)
    h = got[:, -1:]
    for step in range(3):  # one-token chain steps at each row's next position
        at = pos[:, -1:] + 1 + step
        top = int(at.max()) + 1
        m = (torch.arange(top)[None, :] <= at)[:, None, None]
        e = torch.randn(3, 1, 64)
        got = fused._step(caches[1], slots, False, top, e, h, at, at, None, (at[:, 0] + 1).int())
        want = plain._step(caches[0], slots, False, top, e, h, at, at, m)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        h = want
    torch.testing.assert_close(caches[1].values, caches[0].values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused._argmax(h[:, 0]), plain._argmax(h[:, 0]))


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_lean_chain_drafts_what_the_module_path_drafts(fk, tmp_path, register_proposer, tiny_llama_path, batch,
                                                            monkeypatch):
    """The lean chain (the eager greedy path: positions and masks made on the host, no mask at all for one row's
    chain steps) through the same kernels: the module path's drafts, the target's output. Its catch-ups go through
    the kernels only up to k + 1 positions (what a drafting step hands over); the prompts' (up to 19 tokens) take
    torch ops, as the captured chain's do (a Triton kernel compiled again for a new width: ~0.1 s on the H200)."""
    pairs, widths, attend = [], [], fk.attend

    def spy(q, *args, **kwargs):
        widths.append(q.shape[1])
        return attend(q, *args, **kwargs)

    monkeypatch.setattr(fk, "attend", spy)

    class Lean(Eagle3Proposer):
        method = "fused_lean_eagle3"
        _chain_kernels = fk

        def propose(self, b):
            expected, _ = _module_drafts(self, Eagle3Proposer.propose, b)
            got = super().propose(b)
            pairs.append((expected, got))
            return got

    register_proposer(Lean)
    prompts, params = PROMPTS[:batch], GREEDY[:batch]
    llm = LLM(tiny_llama_path, {"method": Lean.method, "num_speculative_tokens": 3, "speculation_policy": "fixed",
                                "model": _head(tmp_path, "eagle3")}, dtype="float32", max_num_seqs=batch)
    assert llm.proposer.graph_chain is None and llm.proposer.chain.kernels is fk
    out = [o.token_ids for o in llm.generate(prompts, params)]
    assert out == [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(
        prompts, params)]
    assert len(pairs) > 5
    assert widths and max(widths) <= 4 and max(len(p) for p in prompts) > 4, widths
    for expected, got in pairs:
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert torch.equal(got.token_ids, expected.token_ids), (got.token_ids, expected.token_ids)


def test_draft_fused_option(tmp_path, tiny_llama_path):
    """``draft_fused`` is ignored off CUDA (the torch ops run); a head_dim below 16 keeps them too."""
    head = _head(tmp_path, "eagle3")
    for flag in (True, False):
        llm = LLM(tiny_llama_path, {"method": "eagle3", "num_speculative_tokens": 3, "speculation_policy": "fixed",
                                    "model": head, "draft_fused": flag}, dtype="float32", device="cpu")
        assert llm.proposer.kernels is None and llm.proposer.chain.kernels is None

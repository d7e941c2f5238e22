"""Token trees that stay on the device (issue 25: no host round trip between drafting and verifying):
``ModelRunner.forward_tree_ids`` reads a proposer's ``(ids, parents)`` tensors as drafted and gives the logits
``forward_tree`` gives for the same trees (eager and through the tree graphs' static path), a malformed tree cannot
index out of range (its root's logits are unchanged), and the engine's deferred trees (``DeferredTrees``, checked on
the host after the forward) keep greedy and seeded output equal to the baseline, cut trees at the depth limit,
and refuse or drop malformed trees with the same errors as the host checks."""

from __future__ import annotations

import random

import pytest
import torch
from test_tree_engine import GREEDY, PROMPTS, TreeCopy, TreeOracle

from specdec import LLM, DraftValidationError, HFTargetModel, HiddenStateRequest, SamplingParams

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA tree graphs need a CUDA device (none here)")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


def _drafted(rng, counts, vocab, width):
    """Random trees as a proposer returns them: ids / parents ``[B, width]`` (-1: the root), padded with junk."""
    ids = torch.randint(2, vocab, (len(counts), width))
    parents = torch.randint(-5, 50, (len(counts), width))
    for i, n in enumerate(counts):
        parents[i, :n] = torch.tensor([rng.randrange(-1, j) for j in range(n)], dtype=torch.long)
    return ids, parents


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graphs", [False, True])
def test_tree_ids_forward_equals_the_list_forward(tiny_llama_path, device, graphs):
    from specdec.cuda_graphs import tree_buckets

    rng = random.Random(5)
    ours = HFTargetModel(tiny_llama_path, dtype="float32", device=device, max_model_len=160)
    ref = HFTargetModel(tiny_llama_path, dtype="float32", device=device, max_model_len=160)
    hidden = HiddenStateRequest(last_layer=True)
    for m in (ours, ref):
        m.allocate(5)
    if graphs:
        assert ours.capture_graphs([1], hidden=hidden, use_graphs=device == "cuda", tree_lens=tree_buckets(20))
    slots = [4, 1, 2]
    prompts = [[rng.randrange(2, 90) for _ in range(rng.randrange(3, 20))] for _ in slots]
    for m in (ours, ref):
        m.forward(slots, prompts, [1] * 3, hidden)
        for s, p in zip(slots, prompts):
            m.advance(s, len(p))
    for step in range(4):
        rows = sorted(rng.sample(slots, 3 if step % 2 else 2)) if step else [0, 1]  # [0, 1]: rows in place
        counts = [rng.randrange(0, 20) for _ in rows]
        ids, parents = _drafted(rng, counts, 90, 20)
        roots = [rng.randrange(2, 90) for _ in rows]
        before = ours.graphs.tree_replays if graphs else 0
        a = ours.forward_tree_ids(rows, roots, ids.to(device), parents.to(device), [1 + n for n in counts], hidden)
        tokens = [[r] + ids[i, :n].tolist() for i, (r, n) in enumerate(zip(roots, counts))]
        par = [[p + 1 for p in parents[i, :n].tolist()] for i, n in enumerate(counts)]
        b = ref.forward_tree(rows, tokens, par, hidden)
        if graphs:
            assert ours.graphs.tree_replays == before + 1
        assert a.query_start_loc.tolist() == b.query_start_loc.tolist()
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.hidden_states, b.hidden_states, atol=1e-4, rtol=1e-4)
        paths = [[0] + ([1] if n and par[i][0] == 0 else []) for i, n in enumerate(counts)]
        ours.keep_paths(rows, paths)
        ref.keep_paths(rows, paths)
    # malformed: ids past the vocabulary, parents past their node; clamped on the device, the root unaffected
    ids = torch.tensor([[10 ** 9, -7, 5, 6]])
    bad = ours.forward_tree_ids([1], [9], ids.to(device), torch.tensor([[3, 7, -9, 2]]).to(device), [5])
    good = ref.forward_tree([1], [[9, 5]], [[0]])
    torch.testing.assert_close(bad.logits[0], good.logits[0], atol=1e-4, rtol=1e-4)
    assert torch.isfinite(bad.logits).all()


def _count(llm, name):
    calls = []
    real = getattr(llm.target, name)
    setattr(llm.target, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("batch", [1, 4])
def test_deferred_trees_equal_the_baseline(tiny_llama_path, register_proposer, batch):
    """Greedy and seeded requests (batch 4: mixed) with trees left on the device (``_defer_drafts=True``, what a
    CUDA proposer's device trees get): every tree goes through forward_tree_ids, none through forward_tree; the
    output is the baseline's, the trees accept off their second branch, and near max_tokens the nodes past the
    depth limit are dropped after the forward (the output would run past max_tokens otherwise)."""
    params = [GREEDY, SamplingParams(temperature=0.8, max_tokens=23, ignore_eos=True, seed=11)] * 2
    base = LLM(tiny_llama_path, dtype="float32", device="cpu", max_num_seqs=batch)
    expected = [o.token_ids for o in base.generate(PROMPTS, params)]
    truth = {tuple(p): p + e + [7] * 8 for p, e in zip(PROMPTS, expected)}  # past the end: more to draft
    register_proposer(type("DevTree", (TreeOracle,), {"method": "dev_tree", "truth": truth}))
    llm = LLM(tiny_llama_path, {"method": "dev_tree", "num_speculative_tokens": 4, "speculation_policy": "fixed"},
              dtype="float32", device="cpu", max_num_seqs=batch)
    llm._defer_drafts = True
    ids_calls, list_calls = _count(llm, "forward_tree_ids"), _count(llm, "forward_tree")
    got = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert got == expected
    assert [len(g) for g in got] == [p.max_tokens for p in params]
    assert ids_calls and not list_calls
    assert llm.stats.num_accepted_tokens > 3 * llm.stats.num_drafts


def test_deferred_trees_of_a_copying_proposer_equal_the_baseline(tiny_llama_path, register_proposer):
    register_proposer(type("DevCopy", (TreeCopy,), {"method": "dev_copy"}))
    llm = LLM(tiny_llama_path, {"method": "dev_copy", "num_speculative_tokens": 4, "speculation_policy": "fixed"},
              dtype="float32", device="cpu", max_num_seqs=3)
    llm._defer_drafts = True
    calls = _count(llm, "forward_tree_ids")
    base = LLM(tiny_llama_path, dtype="float32", device="cpu", max_num_seqs=3)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [o.token_ids for o in
                                                                     base.generate(PROMPTS, GREEDY)]
    assert calls and llm.stats.num_draft_tokens > 0


class OutOfVocab(TreeCopy):
    method = "oov_tree"

    def propose(self, batch):
        drafts = super().propose(batch)
        if drafts.token_ids.shape[1] > 1:
            drafts.token_ids[0, 1] = 10 ** 6
        return drafts


@pytest.mark.parametrize("cls,message", [
    (type("DevBad", (TreeCopy,), {"method": "dev_bad", "bad_parent": True}),
     r"proposer DevBad \(method 'dev_bad'\) returned malformed drafts: request '0''s token tree: draft 0 has "
     r"parent 1; a parent must be an earlier draft \(-1 .. -1, -1: the root\)"),
    (OutOfVocab, r"proposer OutOfVocab \(method 'oov_tree'\) returned malformed drafts: request '0''s token tree: "
                 r"draft id 1000000 outside the vocabulary \[0, 96\)")])
def test_a_malformed_deferred_tree_is_refused_or_dropped(tiny_llama_path, register_proposer, cls, message):
    """The host checks after the forward: the same error as check_tree_drafts (policy "error"), or the tree
    dropped (its request accepts nothing that step) with the output still the baseline's."""
    register_proposer(cls)
    spec = {"method": cls.method, "num_speculative_tokens": 4, "speculation_policy": "fixed"}
    llm = LLM(tiny_llama_path, spec, dtype="float32", device="cpu")
    llm._defer_drafts = True
    with pytest.raises(DraftValidationError, match=message):
        llm.generate(PROMPTS[:1], GREEDY)
    llm = LLM(tiny_llama_path, {**spec, "on_bad_drafts": "drop"}, dtype="float32", device="cpu", max_num_seqs=4)
    llm._defer_drafts = True
    calls = _count(llm, "forward_tree_ids")
    base = LLM(tiny_llama_path, dtype="float32", device="cpu", max_num_seqs=4)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [o.token_ids for o in
                                                                     base.generate(PROMPTS, GREEDY)]
    assert calls


def test_deferred_tree_nodes_after_the_forward():
    """DeferredTrees.nodes: the trees as the forward ran them (root first, parents shifted past the root and
    clamped as the device clamped them), nodes past the depth limit or under a dropped node as -1, a malformed tree
    (here: an id outside the vocabulary) all -1 with the failure reported; a request whose limit is 0 runs its root
    alone."""
    from specdec.validation import DeferredTrees

    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [5, 99, 7, 8, 9], [5, 6, 7, 8, 9]])
    parents = torch.tensor([[-1, 0, 1, -1, 3], [-1, 0, 1, -1, 3], [-1, 0, 1, 2, 3], [-1, -1, -1, -1, -1]])
    failures = []
    d = DeferredTrees(ids, parents, [5, 5, 4, 3], [3, 2, 3, 0], ["a", "b", "c", "d"], 50, failures.append)
    assert d.lens == [6, 6, 5, 1]
    tokens, par = d.nodes([1, 2, 3, 4])
    assert tokens == [[1, 5, 6, 7, 8, 9], [2, 5, 6, -1, 8, 9], [3, -1, -1, -1, -1], [4]]
    assert par == [[0, 1, 2, 0, 4], [0, 1, 2, 0, 4], [0, 1, 2, 3], []]
    assert failures == ["request 'c''s token tree: draft id 99 outside the vocabulary [0, 50)"]


class Int32Parents(TreeCopy):
    method = "int32_tree"

    def propose(self, batch):
        drafts = super().propose(batch)
        drafts.parents = drafts.parents.int()
        return drafts


def test_a_deferred_tree_of_the_wrong_type_is_reported_once(tiny_llama_path, register_proposer, caplog):
    """A structure the checks refuse (parents not int64) is not deferred: the host checks report it, once a step."""
    register_proposer(Int32Parents)
    spec = {"method": "int32_tree", "num_speculative_tokens": 4, "speculation_policy": "fixed"}
    llm = LLM(tiny_llama_path, spec, dtype="float32", device="cpu")
    llm._defer_drafts = True
    with pytest.raises(DraftValidationError, match=r"proposer Int32Parents \(method 'int32_tree'\) returned malformed "
                                                   r"drafts: a token tree needs token_ids and parents as int64"):
        llm.generate(PROMPTS[:1], GREEDY)
    llm = LLM(tiny_llama_path, {**spec, "on_bad_drafts": "drop"}, dtype="float32", device="cpu")
    llm._defer_drafts = True
    calls = []
    real = llm.proposer.propose
    llm.proposer.propose = lambda batch: calls.append(1) or real(batch)
    with caplog.at_level("DEBUG", logger="specdec.engine"):
        out = llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert len(out[0].token_ids) == 6 and calls
    reports = [r for r in caplog.records if "returned malformed drafts" in r.getMessage()]
    assert len(reports) == len(calls)  # one report a step (the warning, then DEBUG), not one per check


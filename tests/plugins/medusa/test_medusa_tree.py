"""Medusa's static token trees (issue 25): greedy output equal to the baseline, verified whole (more tokens
accepted a step than the chain of the heads' best tokens), the tree choices checked, and steps with sampled
requests verifying the first-child chain."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import LLM, SamplingParams
from specdec_medusa.proposer import DEFAULT_TREE_CHOICES, MedusaOptions, tree_from_choices

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n",
           "class Stack:\n    def push(self, x):\n        self.", "for i in range(10):\n    print("]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return specdec.bundled_model("tiny")


@pytest.fixture(scope="module")
def baseline(tiny):
    return [o.token_ids for o in LLM(tiny, dtype="float32", device="cpu", max_num_seqs=4).generate(PROMPTS, GREEDY)]


def _run(tiny, batch, params=GREEDY, **options):
    llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": 3, "speculation_policy": "fixed", **options},
              dtype="float32", device="cpu", max_num_seqs=batch)
    calls = []
    real = llm.target.forward_tree
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    return [o.token_ids for o in llm.generate(PROMPTS, params)], llm.stats, len(calls)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("choices", ["default", [[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]]])
def test_greedy_tree_equals_the_baseline_and_accepts_more_than_the_chain(tiny, baseline, batch, choices):
    tree_out, tree, calls = _run(tiny, batch, tree_choices=choices)
    chain_out, chain, chain_calls = _run(tiny, batch)
    assert tree_out == baseline and chain_out == baseline
    assert calls > 0 and chain_calls == 0
    per_step = [s.num_accepted_tokens / s.num_drafts for s in (tree, chain)]
    assert per_step[0] > per_step[1] > 0, per_step


@pytest.mark.parametrize("batch", [1, 3])
def test_the_captured_tree_step_drafts_the_eager_trees(tiny, baseline, batch, monkeypatch):
    """The tree step a CUDA graph captures (``CapturedMedusaHeads`` with the tree: the heads' top ranks and every
    node's token gathered in one index), run eagerly: the eager path's trees node for node at every step (so the same
    tokens accepted), and the baseline's output."""
    from specdec_medusa.proposer import MedusaProposer

    eager_out, eager, _ = _run(tiny, batch, tree_choices="default")
    pairs = []
    real = MedusaProposer.propose

    def both(self, b):
        graph, self.graph = self.graph, None
        try:
            expected = real(self, b)
        finally:
            self.graph = graph
        runs = graph.runs
        got = real(self, b)
        pairs.append((expected, got, graph.tree is not None and graph.runs == runs + 1))
        return got

    monkeypatch.setattr(MedusaProposer, "_eager_graph", True)
    monkeypatch.setattr(MedusaProposer, "propose", both)
    out, stats, _ = _run(tiny, batch, tree_choices="default")
    assert out == eager_out == baseline
    assert stats.num_accepted_tokens == eager.num_accepted_tokens and stats.num_drafts == eager.num_drafts
    assert len(pairs) > 10
    for expected, got, replayed in pairs:
        assert replayed  # the tree step served it
        assert got.num_draft_tokens == expected.num_draft_tokens
        assert torch.equal(got.token_ids, expected.token_ids) and torch.equal(got.parents, expected.parents)


def test_sampled_requests_take_the_first_child_chain(tiny):
    """Seeded sampled requests beside greedy ones: the trees are cut to their first-child chains (the heads' best
    tokens) and verified by the keyed rule: the output equals the chain configuration's."""
    params = [GREEDY, SamplingParams(temperature=0.8, max_tokens=48, ignore_eos=True, seed=3)] * 2
    assert _run(tiny, 4, params, tree_choices="default")[0] == _run(tiny, 4, params)[0]


def test_tree_choices_are_checked():
    assert tree_from_choices("default") == tuple(sorted(DEFAULT_TREE_CHOICES, key=lambda c: (len(c), c)))
    assert tree_from_choices([[0, 0], [0]]) == ((0,), (0, 0))
    with pytest.raises(ValueError, match=r"tree_choices entry \[1, 0\] has no parent \[1\] in the list"):
        MedusaOptions(tree_choices=[[0], [1, 0]])
    with pytest.raises(ValueError, match=r"tree_choices entry \[-1\] is invalid: each is a non-empty list of ranks"):
        MedusaOptions(tree_choices=[[-1]])
    with pytest.raises(ValueError, match=r"tree_choices='wide' is invalid: pass 'default' or a list of rank paths"):
        MedusaOptions(tree_choices="wide")
    with pytest.raises(ValueError, match="tree_choices has a repeated entry"):
        MedusaOptions(tree_choices=[[0], [0]])


def test_tree_choices_the_heads_cannot_draft_are_refused_at_start(tiny):
    """A rank past the heads' vocabulary, or more nodes within depth k than a tree may hold, is refused when the
    LLM is built, naming the entry and the limit (not an IndexError or a malformed-drafts error mid-generation)."""
    def build(k, choices):
        return LLM(tiny, {"method": "medusa", "num_speculative_tokens": k, "tree_choices": choices},
                   dtype="float32", device="cpu", max_num_seqs=1)

    with pytest.raises(ValueError, match=r"tree_choices entry \[5000\] is invalid for these heads: rank 5000 is past "
                                         r"their 1024-token vocabulary \(ranks run 0..1023\); use smaller ranks\."):
        build(3, [[0], [5000]])
    wide = [[r] for r in range(70)]
    with pytest.raises(ValueError, match=r"tree_choices has 70 paths within depth num_speculative_tokens=3: a token "
                                         r"tree holds at most MAX_TREE_NODES=64 nodes"):
        build(3, wide)
    deep = [[0] * d for d in range(1, 6)] + [[0] * 4 + [r] for r in range(1, 70)]  # 74 paths, 3 within depth 3
    assert build(3, deep).proposer.max_tree_nodes() == 3


def test_max_tree_nodes_counts_the_tree_within_k(tiny):
    for choices, k, nodes in (([[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]], 3, 6),
                              ([[0], [1], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]], 2, 4), (None, 3, 0)):
        llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": k, "tree_choices": choices},
                  dtype="float32", device="cpu", max_num_seqs=1)
        assert llm.proposer.max_tree_nodes() == nodes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tree graphs are captured on CUDA only (none here)")
def test_cuda_tree_graphs_equal_the_baseline(tiny):
    """On CUDA the default tree is verified by replaying the tree graphs captured for its size; float32 greedy
    output is the CUDA baseline's at batch 1 and 3."""
    kw = dict(dtype="float32", device="cuda")
    for batch in (1, 3):
        expected = [o.token_ids for o in LLM(tiny, **kw, max_num_seqs=batch).generate(PROMPTS, GREEDY)]
        llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": 3, "speculation_policy": "fixed",
                         "tree_choices": "default"}, **kw, max_num_seqs=batch)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
        assert llm.target.graphs.tree_lens[-1] == llm.proposer.max_tree_nodes() + 1
        assert llm.target.graphs.tree_replays > 0


def test_auto_policy_chooses_between_the_tree_and_its_chain(tiny, baseline):
    """Under speculation_policy="auto" a tree proposer's drafting steps verify whole trees or their first-child
    chains (the policy's shape choice: chains first in its warm-up); output stays the baseline's."""
    llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": 3, "tree_choices": "default"},
              dtype="float32", device="cpu", max_num_seqs=1)
    assert llm.policy.trees
    chains = []
    real = llm._verifier.sample
    llm._verifier.sample = lambda reqs, drafts, *a: chains.append(any(drafts)) or real(reqs, drafts, *a)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    shape = llm.policy.shape[1]
    assert sum(shape.count) > 0 and shape.count[0] >= 3 and any(chains)
    assert llm.policy.stats.steps_tree == shape.count[1]  # every shape step is timed (nothing to settle)


@pytest.mark.parametrize("batch", [1, 4])
def test_trees_verified_on_the_device_equal_the_baseline(tiny, baseline, batch):
    """With the trees left where they were drafted (as on CUDA; here ``_defer_drafts=True`` on the CPU), every tree
    step goes through forward_tree_ids and is checked after it; greedy output stays the baseline's."""
    llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": 3, "speculation_policy": "fixed",
                     "tree_choices": "default"}, dtype="float32", device="cpu", max_num_seqs=batch)
    llm._defer_drafts = True
    ids_calls, list_calls = [], []
    for name, calls in (("forward_tree_ids", ids_calls), ("forward_tree", list_calls)):
        real = getattr(llm.target, name)
        setattr(llm.target, name, lambda *a, real=real, calls=calls, **kw: calls.append(1) or real(*a, **kw))
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert ids_calls and not list_calls and llm.stats.num_accepted_tokens > 0

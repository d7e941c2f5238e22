"""The capture-ready tree step (``specdec_eagle.graph_tree.CapturedHeadTree``), run eagerly on the CPU
(``use_graphs=False``: the function a CUDA graph captures), grows the trees the eager tree path
(``specdec_eagle.tree.draft_tree`` after the module catch-up) grows, node for node, at every step of a generation,
for EAGLE-1 and EAGLE-3 heads at batch 1 and 3 (padding, non-contiguous slots), and greedy output equals the
target alone. On CUDA the step is captured (``draft_cuda_graphs``, the default) and the output checked the same."""

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

rng = random.Random(11)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
GREEDY = [SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
TREE = {"tree_top_k": 3, "tree_total_tokens": 12}


def _head(tmp_path, kind):
    return write(tmp_path / kind, *(random_eagle3(TINY_VOCAB, 40, seed=4) if kind == "eagle3"
                                    else random_eagle1(TINY_VOCAB, seed=4)))


def _comparing(kind, name, steps):
    """A proposer that drafts through its tree step and records the eager tree path's drafts beside them (for
    the steps the tree step served), the eager path run first on a copy of the cache state."""
    base = Eagle3Proposer if kind == "eagle3" else EagleProposer

    class Both(base):
        method = name
        _eager_graph_tree = True

        def propose(self, b):
            cache, graph = self.cache, self.graph_tree
            keys, values, committed = cache.keys.clone(), cache.values.clone(), dict(self.committed)
            self.graph_tree = None
            try:
                expected = base.propose(self, b)
            finally:
                self.graph_tree = graph
                cache.keys.copy_(keys)
                cache.values.copy_(values)
                self.committed = committed
            runs = graph.runs
            got = super().propose(b)
            if graph.runs > runs:
                steps.append((expected, got, tuple(self.slot[r] for r in b.req_ids)))
            return got

    return Both


@pytest.mark.parametrize("kind,batch,k,total", [("eagle", 1, 3, 12), ("eagle", 3, 3, 12), ("eagle3", 1, 3, 12),
                                                ("eagle3", 3, 3, 12), ("eagle3", 3, 5, 30)])
def test_eager_tree_step_grows_the_eager_paths_trees(tmp_path, register_proposer, tiny_llama_path, kind, batch, k,
                                                     total):
    """(k = 5, 30 nodes: three frontier choices, whose pool indices the step adds up at the end, and deep nodes.)"""
    steps = []
    cls = _comparing(kind, f"graph_tree_{kind}", steps)
    register_proposer(cls)
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": k, "model": _head(tmp_path, kind),
                                "speculation_policy": "fixed", **TREE, "tree_total_tokens": total}, dtype="float32",
              max_num_seqs=batch)
    tree = llm.proposer.graph_tree
    assert tree is not None and not tree.use_graphs and tree.nodes == total
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert out == [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(
        PROMPTS, GREEDY)]
    assert len(steps) > 10 and tree.runs == len(steps)
    if batch > 1:
        assert any(list(s) != list(range(len(s))) for _, _, s in steps)
    if k == 5:  # nodes at depth 4 and 5 were chosen
        from specdec.verify import tree_depths

        assert max(max(tree_depths([p + 1 for p in got.parents[i].tolist()])) for _, got, _ in steps
                   for i in range(got.parents.shape[0])) >= 4
    for expected, got, _ in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        n = max(expected.num_draft_tokens)
        assert torch.equal(got.token_ids[:, :n], expected.token_ids[:, :n]), (got.token_ids, expected.token_ids)
        assert torch.equal(got.parents[:, :n], expected.parents[:, :n])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tree step is captured on CUDA only (none here)")
@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_captured_tree_step_lossless_on_cuda(tmp_path, tiny_llama_path, kind, batch):
    spec = {"method": kind, "num_speculative_tokens": 3, "model": _head(tmp_path, kind), "speculation_policy": "fixed",
            **TREE}
    llm = LLM(tiny_llama_path, spec, dtype="float32", device="cuda", max_num_seqs=batch)
    tree = llm.proposer.graph_tree
    assert tree is not None and tree.use_graphs
    out = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert out == [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", device="cuda",
                                            max_num_seqs=batch).generate(PROMPTS, GREEDY)]
    assert tree.runs > 10 and llm.target.graphs.tree_replays > 0


@pytest.fixture(scope="module")
def fk(interpreted_copy):
    """The fused kernels module run by the Triton interpreter (on CUDA the compiled kernels serve the captured tree
    step: test_captured_tree_step_lossless_on_cuda with heads of head_dim 16 and more)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the compiled kernels run the captured tree step "
                    "(test_captured_tree_step_lossless_on_cuda)")
    with interpreted_copy(Path(specdec.fused.__file__).with_name("fused_kernels.py")) as module:
        yield module


@pytest.mark.parametrize("kind,batch,head_rows", [("eagle3", 1, 1), ("eagle", 3, 1), ("eagle3", 1, 16)])
def test_fused_tree_step_grows_the_eager_paths_trees(fk, tmp_path, register_proposer, tiny_llama_path, kind, batch,
                                                     head_rows, monkeypatch):
    """The tree step through the fused kernels (``draft_fused`` on CUDA): the head steps' kernels with the tree's
    additive float32 mask (its committed prefix made once a step, each depth's ancestor keys set into it), the top-k
    of the draft vocabulary's log-probabilities and of the candidates' scores, and the choice of the tree's nodes from
    the pool (a stable sort's first N), one Triton launch each: the eager tree path's trees node for node, float32,
    and the target's greedy output. ``head_rows`` 16: each depth's rows (and the LM head's) through the few-row
    kernel (``HEAD_ROWS``), which the spy counts."""
    import specdec_eagle.chain

    monkeypatch.setattr(specdec_eagle.chain, "HEAD_ROWS", head_rows)
    few, rows_linear = [], fk._rows_linear_kernel
    monkeypatch.setattr(fk, "_rows_linear_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: few.append(grid) or rows_linear[grid]})())
    calls, topk = [], fk.topk

    def spy(x, k, log_softmax=False):
        calls.append((tuple(x.shape), log_softmax))
        return topk(x, k, log_softmax)

    monkeypatch.setattr(fk, "topk", spy)
    steps = []
    cls = _comparing(kind, f"fused_tree_{kind}", steps)
    cls._chain_kernels = fk
    register_proposer(cls)
    prompts, params = PROMPTS[: batch + 1], GREEDY[: batch + 1]
    llm = LLM(tiny_llama_path, {"method": cls.method, "num_speculative_tokens": 3, "model": _head(tmp_path, kind),
                                "speculation_policy": "fixed", **TREE}, dtype="float32", max_num_seqs=batch)
    tree = llm.proposer.graph_tree
    assert tree is not None and tree.lean.kernels is fk
    out = [o.token_ids for o in llm.generate(prompts, params)]
    assert out == [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(
        prompts, params)]
    assert len(steps) > 5 and tree.runs == len(steps)
    # per step: depth 1 and each of the 2 depth steps over the vocabulary, 1 frontier choice between them, and the
    # tree's nodes chosen from the pool
    assert len(calls) == 5 * tree.runs and sum(lsm for _, lsm in calls) == 3 * tree.runs, calls[:8]
    assert calls[4][0][1] == 3 + 2 * 9 and not calls[4][1], calls[:5]  # the pool: K + 2 K * K candidates a row
    assert bool(few) == (head_rows > 1)  # the few-row kernel served the depth steps' 3 rows only when asked
    for expected, got, _ in steps:
        assert got.num_draft_tokens == expected.num_draft_tokens
        n = max(expected.num_draft_tokens)
        assert torch.equal(got.token_ids[:, :n], expected.token_ids[:, :n]), (got.token_ids, expected.token_ids)
        assert torch.equal(got.parents[:, :n], expected.parents[:, :n])

"""ngram token trees (``tree_branches`` >= 2, issue 25): the continuations of every earlier match of the suffix
n-grams, merged into one tree per request and verified whole; greedy and seeded output equal the baseline."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec import SamplingParams
from specdec.validation import MAX_TREE_NODES
from specdec_ngram.options import NgramOptions
from specdec_ngram.proposer import NgramProposer, branches, merge_branches

# The suffix n-grams recur with different continuations (5 6 -> 7 8 and 9 10; 20 21 -> 22 and 30), so a tree holds
# more than the chain. Ids avoid BOS 0 and EOS 1 of the tiny model.
PROMPTS = [
    [5, 6, 7, 8, 5, 6, 9, 10, 5, 6, 7, 8, 5, 6, 9, 10, 5, 6],
    [20, 21, 22, 23, 20, 21, 30, 31, 20, 21, 22, 23, 20, 21],
    [40, 41, 42, 40, 41, 43, 40, 41, 44, 40, 41],
    [70, 71, 70, 72, 70, 71, 70, 72, 70],
]


def test_branches_are_the_chain_then_other_matches_most_recent_first():
    tokens = np.array([1, 2, 3, 7, 8, 4, 2, 3, 9, 9, 5, 2, 3, 6, 2, 3])
    # suffix 2 3: earlier occurrences at 1 (7 8), 6 (9 9), 11 (6 2); the chain (leftmost) drafted 7 8
    assert branches(tokens, [7, 8], 4, 2, 1, 3) == [[7, 8], [6, 2], [9, 9]]
    assert branches(tokens, [7, 8], 2, 2, 1, 3) == [[7, 8], [6, 2]]
    # n = 3 (1 2 3 / 4 2 3 / 5 2 3 / 6 2 3) matches nothing; n = 1 adds what followed each earlier 3, nothing new
    assert branches(tokens, [7, 8], 8, 2, 3, 3) == [[7, 8]]
    # a continuation equal to, or a prefix of, one already there adds nothing; one that extends one is kept
    assert branches(np.array([4, 5, 6, 4, 5, 6, 4]), [5, 6], 3, 3, 1, 1) == [[5, 6], [5, 6, 4]]
    assert branches(np.array([4, 5, 4, 5, 6, 4]), [5, 4], 3, 3, 1, 1) == [[5, 4], [5, 6, 4], [5, 4, 5]]
    ids, parents = merge_branches([[7, 8, 9], [7, 5], [6]])
    assert ids == [7, 8, 9, 5, 6] and parents == [-1, 0, 1, 0, -1]


def test_drafts_from_lists_pads_trees_alike():
    """``Drafts.from_lists(..., parents=)``, which ngram's and suffix's trees go through: ids and parents padded with
    -1 to the same width, a request without drafts all -1, longer lists cut at the width."""
    out = specdec.Drafts.from_lists([[7, 8, 9], [], [4, 5, 6, 2]], 3, [[-1, 0, -1], [], [-1, 0, 1, 2]])
    assert out.num_draft_tokens == [3, 0, 3]
    assert out.token_ids.tolist() == [[7, 8, 9], [-1, -1, -1], [4, 5, 6]]
    assert out.parents.tolist() == [[-1, 0, -1], [-1, -1, -1], [-1, 0, 1]]
    assert out.parents.dtype == out.token_ids.dtype and specdec.Drafts.from_lists([[1]], 2).parents is None


def test_proposer_drafts_the_chain_as_its_tree_s_first_path(tiny_llama_path):
    chain = specdec.LLM(model=tiny_llama_path, dtype="float32", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    tree = specdec.LLM(model=tiny_llama_path, dtype="float32", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "tree_branches": 3, "speculation_policy": "fixed"})
    assert chain.proposer.max_tree_nodes() == 0 and tree.proposer.max_tree_nodes() == 9
    seen = []
    real = NgramProposer._trees

    def spy(self, batch, chains):
        out = real(self, batch, chains)
        seen.append((chains, out))
        return out

    NgramProposer._trees = spy
    try:
        tree.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16))
    finally:
        NgramProposer._trees = real
    wider = 0
    for chains, out in seen:
        for i, n in enumerate(chains.num_draft_tokens):
            nodes = out.num_draft_tokens[i]
            assert nodes >= n and (n > 0) == (nodes > 0)
            # the chain is the first path: nodes 0 .. n-1, each the child of the one before
            assert out.token_ids[i, :n].tolist() == chains.token_ids[i, :n].tolist()
            assert out.parents[i, :n].tolist() == list(range(-1, n - 1))
            wider += nodes > n
    assert wider > 0, "no tree held more than its chain: the test would prove nothing"


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tree_output_equals_the_baseline(tiny_llama_path, batch, temperature):
    params = [SamplingParams(temperature=temperature, max_tokens=32, seed=11 + i if temperature else None)
              for i in range(len(PROMPTS))]
    base = specdec.LLM(model=tiny_llama_path, dtype="float32", max_num_seqs=batch)
    ref = [o.token_ids for o in base.generate(PROMPTS, params)]
    llm = specdec.LLM(model=tiny_llama_path, dtype="float32", max_num_seqs=batch, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "tree_branches": 3, "speculation_policy": "fixed"})
    trees = []
    real = llm._tree_step
    llm._tree_step = lambda reqs, t, t0: trees.append(len(reqs)) or real(reqs, t, t0)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == ref
    assert trees and llm.stats.num_accepted_tokens > 0  # trees were verified, and drafts accepted


def test_tree_options_are_checked(tiny_llama_path):
    for bad in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match=rf"tree_branches={bad!r} is invalid: it must be an int >= 1"):
            NgramOptions(tree_branches=bad)
    k = MAX_TREE_NODES // 4 + 1
    with pytest.raises(ValueError, match=rf"tree_branches=4 with num_speculative_tokens={k} is invalid: a tree of "
                                         rf"{4 * k} nodes is past MAX_TREE_NODES={MAX_TREE_NODES}"):
        specdec.LLM(model=tiny_llama_path, dtype="float32", speculative_config={
            "method": "ngram", "num_speculative_tokens": k, "tree_branches": 4})


@pytest.mark.parametrize("index", ["scan", "incremental"])
def test_trees_near_max_model_len_equal_the_baseline(tiny_llama_path, index):
    """Trees cut where they would pass max_model_len (the engine's checks), with the incremental index drafting the
    chain and the most recent match first: the same tokens as the baseline, cut at the same length."""
    params = SamplingParams(temperature=0.0, max_tokens=24)
    base = specdec.LLM(model=tiny_llama_path, dtype="float32", max_model_len=40, max_num_seqs=2)
    ref = [o.token_ids for o in base.generate(PROMPTS, params)]
    assert any(len(p) + len(r) == 40 for p, r in zip(PROMPTS, ref))  # some request stops at max_model_len
    llm = specdec.LLM(model=tiny_llama_path, dtype="float32", max_model_len=40, max_num_seqs=2, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "tree_branches": 3, "index": index, "match": "recent", "speculation_policy": "fixed"})
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == ref
    assert llm.stats.num_accepted_tokens > 0

"""Tree verification's target side (issue 25): ModelRunner.forward_tree gives every node of a token tree the
logits a plain Hugging Face forward over the root-to-node path gives, batched over requests with trees of
different shapes, and keep_path commits an accepted path so the next step continues from it."""

from __future__ import annotations

import random

import pytest
import torch

from specdec import HFTargetModel

PROMPTS = [[2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _last_logits(hf, seq):
    with torch.no_grad():
        return hf(torch.tensor([seq])).logits[0, -1]


def _random_tree(rng, nodes, vocab):
    """Tokens (root first) and parents (node j + 1's parent, an earlier index)."""
    tokens = [rng.randrange(2, vocab) for _ in range(nodes + 1)]
    parents = [rng.randrange(0, j) for j in range(1, nodes + 1)]
    return tokens, parents


def _path(parents, node):
    path = [node]
    while path[-1]:
        path.append(parents[path[-1] - 1])
    return path[::-1]


@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen2_path", "tiny_qwen3_path"])
def test_tree_logits_equal_plain_forwards_over_each_path(request, fixture):
    path = request.getfixturevalue(fixture)
    hf, rng = _hf(path), random.Random(fixture)
    t = HFTargetModel(path, dtype="float32", device="cpu")
    t.allocate(3)
    t.forward([0, 1, 2], PROMPTS, [1, 1, 1])
    for i, p in enumerate(PROMPTS):
        t.advance(i, len(p))
    # three shapes at once: a bushy tree, a chain, a root alone; slots out of order
    trees = [_random_tree(rng, 9, 90), ([20, 21, 22, 23], [0, 1, 2]), ([30], [])]
    slots = [2, 0, 1]
    out = t.forward_tree(slots, [tk for tk, _ in trees], [par for _, par in trees])
    assert out.query_start_loc.tolist() == [0, 10, 14, 15]
    for r, (slot, (tokens, parents)) in enumerate(zip(slots, trees)):
        for node in range(len(tokens)):
            seq = PROMPTS[slot] + [tokens[n] for n in _path(parents, node)]
            torch.testing.assert_close(out.logits[out.query_start_loc[r] + node], _last_logits(hf, seq),
                                       atol=1e-4, rtol=1e-4)
    assert t.lengths == [len(p) for p in PROMPTS]  # nothing committed yet


def test_keep_path_continues_from_the_accepted_path(tiny_llama_path):
    hf = _hf(tiny_llama_path)
    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu")
    t.allocate(2)
    t.forward([0, 1], PROMPTS[:2], [1, 1])
    t.advance(0, len(PROMPTS[0]))
    t.advance(1, len(PROMPTS[1]))
    #            root  1   2   3   4   5   6
    tokens = [[40, 41, 42, 43, 44, 45, 46], [50, 51, 52]]
    parents = [[0, 0, 1, 2, 4, 3], [0, 1]]
    t.forward_tree([0, 1], tokens, parents)
    kept = [[0, 2, 4, 5], [0, 1, 2]]  # request 0: a path through moved entries; request 1: a chain, in place
    for slot, path in enumerate(kept):
        t.keep_path(slot, path)
    out = t.forward([0, 1], [[60], [61]], [1, 1])
    for slot, path in enumerate(kept):
        seq = PROMPTS[slot] + [tokens[slot][n] for n in path] + [60 + slot]
        torch.testing.assert_close(out.logits[slot], _last_logits(hf, seq), atol=1e-4, rtol=1e-4)
    assert t.lengths == [len(PROMPTS[0]) + 4, len(PROMPTS[1]) + 3]


def test_malformed_trees_and_paths_are_refused(tiny_llama_path):
    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu")
    t.allocate(1)
    with pytest.raises(ValueError, match=r"request 0: node 2 has parent 2; a parent must be an earlier node "
                                         r"\(0 .. 1\)"):
        t.forward_tree([0], [[5, 6, 7]], [[0, 2]])
    with pytest.raises(ValueError, match=r"request 0: 1 parents for 2 tree nodes"):
        t.forward_tree([0], [[5, 6, 7]], [[0]])
    with pytest.raises(ValueError, match=r"path \[1, 2\] must start at the root \(0\) and increase"):
        t.keep_path(0, [1, 2])


def test_greedy_tree_accept_follows_the_argmax_down_the_tree():
    from specdec.verify import greedy_tree_accept

    #         root  1  2  3  4  5  6
    tokens = [9, 5, 7, 5, 8, 6, 8]
    parents = [0, 0, 1, 1, 3, 3]  # 1, 2 under the root; 3, 4 under 1; 5, 6 under 3
    argmax = [5, 5, 0, 6, 0, 3, 0]  # root -> 5 (node 1), node 1 -> 5 (node 3), node 3 -> 6 (node 5), node 5 -> 3
    assert greedy_tree_accept(tokens, parents, argmax) == ([0, 1, 3, 5], [5, 5, 6, 3])
    assert greedy_tree_accept(tokens, parents, [4] * 7) == ([0], [4])  # no child matches: the bonus alone
    assert greedy_tree_accept([9], [], [2]) == ([0], [2])  # a root alone
    # a chain gives greedy_accept's answer
    from specdec.verify import greedy_accept

    chain, argmax = [1, 2, 3, 4], [2, 3, 9, 0]
    assert greedy_tree_accept(chain, [0, 1, 2], argmax)[1] == greedy_accept([chain[1:]], argmax, [3])[0]

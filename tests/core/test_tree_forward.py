"""Tree verification's target side (issue 25): ModelRunner.forward_tree gives every node of a token tree the
logits a plain Hugging Face forward over the root-to-node path gives, batched over requests with trees of
different shapes, and keep_path commits an accepted path so the next step continues from it."""

from __future__ import annotations

import random
from pathlib import Path

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


NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA tree graphs need a CUDA device (none here)")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
def test_tree_graphs_give_the_eager_tree_forward(tiny_llama_path, device, monkeypatch):
    """The tree graphs (captured on CUDA; on the CPU the same static buffers run without capture) give the logits
    and hidden states of the eager forward_tree, for trees of several shapes on scattered slots of one batch, with
    idle rows in the graph's batch bucket and trees smaller than its node bucket; then keep_paths commits a
    path per slot (on one side an index_select / index_copy_ per slot, on the other one gather and scatter for the
    batch: FEW_SLOT_MOVES 0) and the next steps agree again."""
    import specdec.runner
    from specdec import HiddenStateRequest
    from specdec.cuda_graphs import tree_buckets

    rng = random.Random(3)
    graphs = HFTargetModel(tiny_llama_path, dtype="float32", device=device, max_model_len=160)
    eager = HFTargetModel(tiny_llama_path, dtype="float32", device=device, max_model_len=160)
    for m in (graphs, eager):
        m.allocate(5)
    assert tree_buckets(20) == [8, 21] and tree_buckets(7) == [8] and tree_buckets(0) == []
    hidden = HiddenStateRequest(last_layer=True)
    assert graphs.capture_graphs([1, 4], hidden=hidden, use_graphs=device == "cuda", tree_lens=tree_buckets(20))
    slots = [4, 1, 2]
    prompts = [[rng.randrange(2, 90) for _ in range(rng.randrange(3, 20))] for _ in slots]
    for m in (graphs, eager):
        m.forward(slots, prompts, [1] * 3, hidden)
        for s, p in zip(slots, prompts):
            m.advance(s, len(p))
    for step in range(4):
        trees = [_random_tree(rng, n, 90) for n in (rng.randrange(0, 21), rng.randrange(0, 8), 20)]
        rows = sorted(rng.sample(slots, 3 if step % 2 else 2))
        tk, par = [trees[i][0] for i in range(len(rows))], [trees[i][1] for i in range(len(rows))]
        before = graphs.graphs.tree_replays
        a = graphs.forward_tree(rows, tk, par, hidden)
        b = eager.forward_tree(rows, tk, par, hidden)
        assert graphs.graphs.tree_replays == before + 1
        assert a.query_start_loc.tolist() == b.query_start_loc.tolist()
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.hidden_states, b.hidden_states, atol=1e-4, rtol=1e-4)
        assert a.greedy_token_ids() == b.logits.argmax(-1).tolist()
        paths = []
        for tokens, parents in zip(tk, par):
            path = [rng.randrange(len(tokens))]  # a random node, up to the root
            while path[-1]:
                path.append(parents[path[-1] - 1])
            paths.append(path[::-1])
        graphs.keep_paths(rows, paths)
        with monkeypatch.context() as m:
            m.setattr(specdec.runner, "FEW_SLOT_MOVES", 0)
            eager.keep_paths(rows, paths)
        assert graphs.lengths == eager.lengths
    out = [m.forward(slots, [[7], [8], [9]], [1] * 3) for m in (graphs, eager)]
    torch.testing.assert_close(out[0].logits, out[1].logits, atol=1e-4, rtol=1e-4)
    if device == "cpu":  # the static path ran the same code as the graphs: it must not be the eager one
        assert graphs.graphs.trees and graphs.graphs.trees[next(iter(graphs.graphs.trees))].graph is None


@pytest.fixture(scope="module")
def tree_kernels(interpreted_copy):
    """The tree step's Triton module: compiled on CUDA, else an interpreted copy."""
    if torch.cuda.is_available():
        import specdec.kernels.tree_triton as compiled

        yield compiled
        return
    import specdec.kernels

    with interpreted_copy(Path(specdec.kernels.__file__).with_name("tree_triton.py")) as module:
        yield module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_step_kernel_gives_the_torch_steps(tree_kernels, tiny_llama_path, dtype, monkeypatch):
    """The one-launch tree step tensors (positions, write positions, additive mask) equal the torch steps', exactly,
    for rows of several kinds in one bucket: an empty row at start 0 (its nodes see position 0 only), an empty row
    past a prefix, partly filled and full trees, malformed parents (negative, the node itself, later nodes: clamped
    the same way), positions clamped at max_model_len, a KV bucket wider than every tree."""
    import specdec.runner

    monkeypatch.setattr(specdec.runner, "TREE_KERNEL", False)  # the runner's own steps: the reference
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    runner = HFTargetModel(tiny_llama_path, dtype=dtype, device=dev, max_model_len=40)
    runner.allocate(6)
    rng = random.Random(5)
    q, kv = 9, 41  # the widest KV bucket: max_model_len + 1
    start = torch.tensor([0, 7, 3, 12, 33, 0], device=dev)
    n = torch.tensor([0, 0, 9, 4, 7, 5], device=dev)
    parents = torch.tensor([[rng.randrange(-3, q + 3) for _ in range(q)] for _ in range(6)], device=dev)
    parents[2] = torch.tensor([0, 0, 1, 1, 2, 3, 4, 5, 6])  # a well-formed deep tree
    want = runner.tree_step_tensors(start, n, parents, q, kv)
    got = tree_kernels.tree_step_tensors(start, n, parents, kv, runner.max_model_len, int(runner.cache.scratch), dtype)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w), (g, w)
    assert (want[2][0, 0, :, 0] == 0).all() and (want[2][0, 0, :, 1:] < 0).all()  # the empty row at 0

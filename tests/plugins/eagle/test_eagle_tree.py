"""EAGLE-2 dynamic token trees for ``eagle`` and ``eagle3`` (option ``tree_top_k``, issue 25), with the bundled tiny
target and its trained heads: greedy output equal to the baseline; every step's tree equal to a cache-free EAGLE-2
recomputation (structure, node counts within the budget near ``max_model_len``, the head's top-k at depth 1);
more tokens accepted a step than the chain; seeded sampled output equal to the baseline; the options checked."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import LLM, SamplingParams
from specdec_eagle import tree
from specdec_eagle.proposer import Eagle3Proposer, EagleOptions, EagleProposer
from specdec_eagle.tree import best_nodes

PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n",
           "class Stack:\n    def push(self, x):\n        self.", "for i in range(10):\n    print(",
           "    def __new__(mcls, name, bases, namespace, /, **kwargs):\n        abstracts = {name", "x ="]
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROPOSERS = {"eagle": EagleProposer, "eagle3": Eagle3Proposer}


@pytest.fixture(scope="module")
def tiny():
    return specdec.bundled_model("tiny")


@pytest.fixture(scope="module")
def baseline(tiny):
    return [o.token_ids for o in LLM(tiny, dtype="float32", device="cpu", max_num_seqs=6).generate(PROMPTS, GREEDY)]


def _llm(tiny, method, k, batch=6, **options):
    """An LLM drafting with ``method`` at k (trees with ``tree_top_k`` > 0); ``.tree_calls`` counts the target's
    tree forwards."""
    llm = LLM(tiny, {"method": method, "num_speculative_tokens": k, "speculation_policy": "fixed", **options},
              dtype="float32", device="cpu", max_num_seqs=batch)
    calls = []
    real = llm.target.forward_tree
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    llm.tree_calls = calls
    return llm


@pytest.mark.parametrize("batch", [1, 6])
@pytest.mark.parametrize(("top_k", "total", "k"), [(2, 6, 3), (4, 16, 4), (8, 64, 5)])
@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_greedy_trees_equal_the_baseline(tiny, baseline, method, top_k, total, k, batch):
    llm = _llm(tiny, method, k, batch, tree_top_k=top_k, tree_total_tokens=total)
    assert llm.proposer.max_tree_nodes() == total and llm.proposer.chain is None
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert llm.tree_calls and llm.stats.num_accepted_tokens > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_greedy_trees_on_cuda_equal_the_baseline_without_host_syncs(tiny, monkeypatch, method):
    """On CUDA (the target's tree verification graphs captured for max_tree_nodes): lossless, and the depth loop and
    the final selection never wait for the device (torch's sync debug mode raises on a synchronising call)."""
    def no_sync(fn):
        def run(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return run

    monkeypatch.setattr(tree, "_grow", no_sync(tree._grow))
    monkeypatch.setattr(tree, "best_nodes", no_sync(tree.best_nodes))
    want = [o.token_ids for o in LLM(tiny, dtype="float32", device="cuda", max_num_seqs=6).generate(PROMPTS, GREEDY)]
    for batch in (1, 6):
        llm = LLM(tiny, {"method": method, "num_speculative_tokens": 4, "speculation_policy": "fixed",
                         "tree_top_k": 4, "tree_total_tokens": 16}, dtype="float32", device="cuda", max_num_seqs=batch)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want
        assert llm.stats.num_accepted_tokens > 0


def _reference_tree(head, hf, aux_ids, tokens, depth, top_k, count):
    """EAGLE-2's tree recomputed without any cache (full head forwards over each node's whole sequence: the prompt's
    target features, then the root's and the node's ancestors' head outputs): ``{path: score}`` of the pool's best
    ``count`` nodes of depth <= ``depth``, and the score of the last one kept (paths of target ids)."""
    n = len(tokens)
    with torch.no_grad():
        hs = hf(torch.tensor([tokens[: n - 1]]), output_hidden_states=True).hidden_states
        feats = hs[-1][0] if aux_ids is None else head.fc(torch.cat([hs[i][0] for i in aux_ids], -1))

        def out(path, fed):  # the head's output at a node: its path's tokens, fed the outputs above it
            return head(torch.tensor([tokens[1:] + list(path)]), torch.cat([feats, *fed])[None])[0, -1:]

        def top(h):
            s, i = torch.log_softmax(head.draft_logits(h[0]), -1).topk(top_k)
            return zip(s.tolist(), head.draft_to_target(i).tolist())

        root = out((), [])
        frontier = [(s, (t,), [root]) for s, t in top(root)]
        pool = {path: s for s, path, _ in frontier}
        for _ in range(depth - 1):
            children = []
            for s, path, fed in frontier:
                h = out(path, fed)
                children += [(s + c, path + (t,), fed + [h]) for c, t in top(h)]
            pool.update({path: s for s, path, _ in children})
            frontier = sorted(children, key=lambda c: -c[0])[:top_k]
    kept = sorted(pool.items(), key=lambda kv: -kv[1])[:count]
    return dict(kept), kept[-1][1]


def _paths(tokens, parents):
    """Each node's path from the root (tuples of ids), checking that parents come first."""
    paths = []
    for j, (t, p) in enumerate(zip(tokens, parents)):
        assert -1 <= p < j, (j, p)
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    return paths


@pytest.mark.parametrize(("method", "max_model_len"), [("eagle3", None), ("eagle", None), ("eagle3", 40)])
def test_trees_equal_a_cache_free_recomputation(tiny, register_proposer, method, max_model_len):
    """Every step's tree (top_k 3, 12 nodes, k 4) is EAGLE-2's over the head recomputed from scratch: the same paths,
    except where two candidates' scores tie within float32 rounding at the cut; parents before children; depth and
    node count within the budget (``max_model_len=40``: requests run into it, so the last steps get shallower and
    smaller trees); the depth-1 nodes are the head's top-k tokens at the request's last position."""
    from transformers import AutoModelForCausalLM

    records, base = [], PROPOSERS[method]

    class Recorder(base):
        method = f"tree_rec_{base.method}"

        def propose(self, batch):
            drafts = super().propose(batch)
            for i, (ids, par) in enumerate(zip(drafts.token_ids.tolist(), drafts.parents.tolist())):
                n = int(batch.num_tokens[i])
                budget = min(4, batch.max_model_len - n) if batch.sampled_token_ids[i] else 0
                m = drafts.num_draft_tokens[i]
                records.append((batch.token_ids[i, :n].tolist(), budget, batch.max_model_len - n, ids[:m], par[:m]))
            return drafts

    register_proposer(Recorder)
    spec = {"method": Recorder.method, "num_speculative_tokens": 4, "speculation_policy": "fixed",
            "tree_top_k": 3, "tree_total_tokens": 12}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    want = LLM(tiny, dtype="float32", device="cpu", max_num_seqs=3, max_model_len=max_model_len).generate(
        PROMPTS[:3], params)
    llm = LLM(tiny, spec, dtype="float32", device="cpu", max_num_seqs=3, max_model_len=max_model_len)
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], params)] == [o.token_ids for o in want]
    head, aux = llm.proposer.head, llm.proposer.aux_layer_ids
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    budgets = {r[1] for r in records if r[3]}
    assert (min(budgets) < 4) == bool(max_model_len) and 4 in budgets, budgets
    for tokens, budget, room, ids, parents in records:
        assert len(ids) == (min(12, room, 3 + 9 * (budget - 1)) if budget else 0), (budget, room, len(ids))
        if not ids:
            continue
        paths = _paths(ids, parents)
        assert max(len(p) for p in paths) <= budget
        ref, cut = _reference_tree(head, hf, aux, tokens, budget, 3, len(ids))
        assert [p for p in paths if len(p) == 1] == [p for p in ref if len(p) == 1][: sum(len(p) == 1 for p in paths)]
        for path in set(paths) ^ set(ref):  # only near-ties at the cut may differ
            assert path not in ref or ref[path] - cut < 1e-4, (tokens, path, ref, paths)
        assert len(set(paths) ^ set(ref)) <= 2, (tokens, paths, ref)


def test_ties_keep_parents_before_their_children():
    """Children whose log-probability is 0 tie with their parent (a peaked head in float32): the kept nodes are
    still closed under ancestors and in topological order (a stable sort over the pool laid out by depth); nodes
    deeper than a request's depth are left out."""
    def level(scores, ids, parents):
        return tuple(torch.tensor([row] * 2) for row in (scores, ids, parents))

    pool = [level([0.0, -1.0], [10, 11], [-1, -1]),
            level([0.0, 0.0, -1.0, -1.5], [20, 21, 22, 23], [0, 0, 1, 1]),
            level([0.0, -2.0, 0.0, -3.0], [30, 31, 32, 33], [2, 2, 3, 3])]
    ids, parents = best_nodes(pool, depths=[3, 1], counts=[5, 2])  # request 1: depth 1 only
    assert ids.tolist() == [[10, 20, 21, 30, 32], [10, 11, -1, -1, -1]]
    assert parents.tolist() == [[-1, 0, 0, 1, 2], [-1, -1, -1, -1, -1]]
    ids, parents = best_nodes(pool, depths=[3, 3], counts=[10, 7])
    assert ids[0].tolist() == [10, 20, 21, 30, 32, 11, 22, 23, 31, 33]
    for par in parents.tolist():
        assert all(-1 <= p < j for j, p in enumerate(par)), par


def test_choosing_by_a_top_k_function_keeps_the_sorts_choice():
    """select_nodes with ``topk`` (the fused kernels' one launch on CUDA; here the same contract from a stable sort):
    the same nodes and parents as the stable sort's, with ties across depths and between siblings."""
    from specdec_eagle.tree import select_nodes

    def stable_topk(x, k):
        order = x.sort(dim=1, descending=True, stable=True).indices[:, :k]
        return x.gather(1, order), order

    g = torch.Generator().manual_seed(3)
    b, k = 3, 4
    score = [torch.zeros(b, k) - torch.randint(0, 3, (b, k), generator=g).float()]
    parent = [torch.full((b, k), -1)]
    for d in range(3):  # children of the level above: its score minus 0, 1 or 2 (ties with the parent and each other)
        above = k + (d - 1) * k * k if d else 0
        up = torch.randint(above, above + (k * k if d else k), (b, k * k), generator=g)
        base = torch.cat(score, 1).gather(1, up)
        score.append(base - torch.randint(0, 3, (b, k * k), generator=g).float())
        parent.append(up)
    score, parent = torch.cat(score, 1), torch.cat(parent, 1)
    tok = torch.arange(score.shape[1]).expand(b, -1) + 100
    for width in (1, 7, 20):
        want = select_nodes(score, tok, parent, width)
        got = select_nodes(score, tok, parent, width, topk=stable_topk)
        assert all(torch.equal(g_, w) for g_, w in zip(got, want)), (width, got, want)
        assert (got[1] < torch.arange(width)).all()  # parents chosen before their children


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_trees_accept_more_a_step_than_the_chain(tiny, method):
    stats = {}
    for name, options in (("tree", {"tree_top_k": 4, "tree_total_tokens": 16}), ("chain", {})):
        llm = _llm(tiny, method, 4, **options)
        llm.generate(PROMPTS, GREEDY)
        stats[name] = llm.stats.num_accepted_tokens / llm.stats.num_drafts
        assert bool(llm.tree_calls) == (name == "tree")
    assert stats["tree"] >= stats["chain"] > 0, stats


def test_seeded_sampled_output_equals_the_baseline(tiny):
    """Greedy and seeded requests at temperature 0.8 beside each other: trees verified by the keyed rule give the
    baseline's tokens with the same seeds; unseeded requests (recursive rejection over siblings) run too."""
    params = [GREEDY, SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True, seed=7)] * 3
    want = [o.token_ids for o in LLM(tiny, dtype="float32", device="cpu", max_num_seqs=6).generate(PROMPTS, params)]
    llm = _llm(tiny, "eagle3", 4, tree_top_k=4, tree_total_tokens=16)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want
    assert llm.tree_calls and llm.stats.num_accepted_tokens > 0
    unseeded = SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True)
    assert all(len(o.token_ids) == 24 for o in llm.generate(PROMPTS, unseeded))


def test_tree_options_are_checked(tiny):
    assert EagleOptions().tree_top_k == 0 and EagleOptions().tree_total_tokens == 32
    assert EagleOptions(tree_top_k=4, tree_total_tokens=16).tree_total_tokens == 16
    for options, message in (
            ({"tree_top_k": -1}, "tree_top_k=-1 is invalid: it must be an int from 0 to MAX_TREE_NODES=64 (0 drafts "
                                 "chains; 4 to 10 is EAGLE-2's range)."),
            ({"tree_top_k": 65}, "tree_top_k=65 is invalid: it must be an int from 0 to MAX_TREE_NODES=64"),
            ({"tree_top_k": True}, "tree_top_k=True is invalid: it must be an int from 0"),
            ({"tree_total_tokens": 0}, "tree_total_tokens=0 is invalid: it must be an int from 1 to MAX_TREE_NODES=64 "
                                       "(the nodes of one request's tree, e.g. 32)."),
            ({"tree_total_tokens": 65}, "tree_total_tokens=65 is invalid: it must be an int from 1 to MAX_TREE_NODES"),
            ({"tree_total_tokens": 8.0}, "tree_total_tokens=8.0 is invalid"),
            ({"tree_total_tokens": 16}, "tree_total_tokens=16 has no effect while tree_top_k=0 (chains): set "
                                        "tree_top_k > 0 (4 to 10 is EAGLE-2's range) to draft trees of that many "
                                        "nodes, or leave tree_total_tokens at its default (32).")):
        with pytest.raises(ValueError) as info:
            EagleOptions(**options)
        assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(ValueError, match="tree_top_k=-2 is invalid"):
        LLM(tiny, {"method": "eagle3", "num_speculative_tokens": 3, "tree_top_k": -2}, device="cpu")
    chain = LLM(tiny, {"method": "eagle3", "num_speculative_tokens": 3}, dtype="float32", device="cpu")
    assert chain.proposer.max_tree_nodes() == 0 and chain.proposer.chain is not None


@pytest.mark.parametrize("batch", [1, 6])
def test_trees_verified_on_the_device_equal_the_baseline(tiny, baseline, batch):
    """With the trees left where they were drafted (as on CUDA; here ``_defer_drafts=True`` on the CPU), every tree
    step goes through forward_tree_ids and is checked after it; greedy output stays the baseline's."""
    llm = _llm(tiny, "eagle3", 4, batch, tree_top_k=4, tree_total_tokens=16)
    llm._defer_drafts = True
    calls = []
    real = llm.target.forward_tree_ids
    llm.target.forward_tree_ids = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert calls and not llm.tree_calls and llm.stats.num_accepted_tokens > 0

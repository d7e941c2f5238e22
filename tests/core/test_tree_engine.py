"""Token trees through the engine (issue 25, first part): a proposer returning Drafts with parents gets its trees
verified in one target forward when the step is greedy (output equal to the baseline, more tokens accepted than
its first-child chains), cut to first-child chains in a step with sampled requests (seeded output still the
baseline's), and refused naming the plugin when malformed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec import LLM, Drafts, DraftValidationError, SamplingParams

PROMPTS = [[3, 4, 5, 6, 3, 4, 7, 8, 3, 4, 5, 9], [10, 11, 12, 10, 11, 13, 10, 11, 12], [20, 21, 22, 23, 24],
           [30, 31, 30, 32, 30, 31, 33]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _tree_drafts(rows):
    """Drafts with parents from per-request (tokens, parents) lists, padded with -1."""
    width = max(1, max(len(t) for t, _ in rows))
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    par = np.full((len(rows), width), -1, dtype=np.int64)
    for i, (t, p) in enumerate(rows):
        ids[i, : len(t)], par[i, : len(p)] = t, p
    return Drafts(torch.from_numpy(ids), [len(t) for t, _ in rows], parents=torch.from_numpy(par))


class TreeCopy(specdec.Proposer):
    """Two branches per request: what followed the last and the second-to-last earlier occurrence of the last
    token (``bad_parent``: one node names a later node as its parent)."""

    method = "tree_copy"
    bad_parent = False

    def add_request(self, req_id, prompt_token_ids):
        pass

    def remove_request(self, req_id):
        pass

    def propose(self, batch):
        k = batch.num_speculative_tokens
        rows = []
        for i in range(batch.batch_size):
            seq = batch.token_ids[i, : batch.num_tokens[i]].tolist()
            tokens, parents = [], []
            starts = [j + 1 for j in range(len(seq) - 2, -1, -1) if seq[j] == seq[-1]][:2]
            for s in starts:
                branch = seq[s: s + k]
                for d, t in enumerate(branch):
                    parents.append(-1 if d == 0 else len(tokens) - 1)
                    tokens.append(t)
            rows.append((tokens, parents))
        drafts = _tree_drafts(rows)
        if self.bad_parent and drafts.parents.shape[1] > 1:
            drafts.parents[0, 0] = 1
        return drafts


class TreeOracle(specdec.Proposer):
    """Knows each prompt's greedy output (``truth``): a wrong first branch (every true token + 1), then the true
    continuation as a second branch; ``chain``: the first branch alone, as a chain."""

    method = "tree_oracle"
    truth: dict = {}
    chain = False

    def add_request(self, req_id, prompt_token_ids):
        pass

    def remove_request(self, req_id):
        pass

    def propose(self, batch):
        k, rows = batch.num_speculative_tokens, []
        for i in range(batch.batch_size):
            seq = batch.token_ids[i, : batch.num_tokens[i]].tolist()
            full = next(v for p, v in self.truth.items() if tuple(seq[: len(p)]) == p)
            true = full[len(seq): len(seq) + k]
            wrong = [(t + 1) % 96 for t in true]
            tokens = wrong + ([] if self.chain else true)
            parents = [-1 if j == 0 else j - 1 for j in range(len(wrong))]
            if not self.chain:
                parents += [-1 if j == 0 else len(wrong) + j - 1 for j in range(len(true))]
            rows.append((tokens, parents))
        return _tree_drafts(rows)


@pytest.fixture
def baseline(tiny_llama_path):
    return LLM(tiny_llama_path, dtype="float32", device="cpu", max_num_seqs=4)


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_trees_equal_the_baseline_and_accept_off_the_first_branch(tiny_llama_path, register_proposer,
                                                                        baseline, batch):
    """The true continuation sits in each tree's second branch: the tree step accepts k a step from it (through
    forward_tree and keep_path's moved KV entries), its first-child chain accepts nothing; both outputs are
    the baseline's."""
    expected = [o.token_ids for o in baseline.generate(PROMPTS, GREEDY)]
    truth = {tuple(p): p + e for p, e in zip(PROMPTS, expected)}
    tree = type("Tree", (TreeOracle,), {"truth": truth})
    chain = type("Chain", (TreeOracle,), {"method": "chain_oracle", "truth": truth, "chain": True})
    register_proposer(tree, chain)
    got, stats = {}, {}
    for method in ("tree_oracle", "chain_oracle"):
        llm = LLM(tiny_llama_path, {"method": method, "num_speculative_tokens": 4, "speculation_policy": "fixed"},
                  dtype="float32", device="cpu", max_num_seqs=batch)
        got[method] = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        stats[method] = llm.stats
    assert got["tree_oracle"] == expected and got["chain_oracle"] == expected
    assert stats["chain_oracle"].num_accepted_tokens == 0
    steps = stats["tree_oracle"].num_drafts
    assert stats["tree_oracle"].num_accepted_tokens > 3 * steps  # k = 4 accepted on nearly every step


def test_greedy_trees_of_a_copying_proposer_equal_the_baseline(tiny_llama_path, register_proposer, baseline):
    register_proposer(TreeCopy)
    llm = LLM(tiny_llama_path, {"method": "tree_copy", "num_speculative_tokens": 4, "speculation_policy": "fixed"},
              dtype="float32", device="cpu", max_num_seqs=3)
    calls = []
    real = llm.target.forward_tree
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == [o.token_ids for o in
                                                                     baseline.generate(PROMPTS, GREEDY)]
    assert calls and llm.stats.num_draft_tokens > 0


def test_seeded_sampled_requests_walk_their_trees_by_keyed_samples(tiny_llama_path, register_proposer, baseline):
    """Greedy and seeded requests at temperature 0.8 together: trees whose second branch holds each request's
    baseline output (its keyed samples) are verified whole (forward_tree) and accept off that branch; every
    output is the baseline's with the same seeds."""
    params = [GREEDY, SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=11)] * 2
    expected = [o.token_ids for o in baseline.generate(PROMPTS, params)]
    truth = {tuple(p): p + e for p, e in zip(PROMPTS, expected)}
    register_proposer(type("KeyedTree", (TreeOracle,), {"method": "keyed_tree", "truth": truth}))
    llm = LLM(tiny_llama_path, {"method": "keyed_tree", "num_speculative_tokens": 4, "speculation_policy": "fixed"},
              dtype="float32", device="cpu", max_num_seqs=4)
    calls = []
    real = llm.target.forward_tree
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
    assert calls and llm.stats.num_accepted_tokens > 3 * llm.stats.num_drafts


class TopTree(specdec.Proposer):
    """The target's own three likeliest next tokens, each with its two likeliest followers (9 nodes), from plain
    HF forwards (cached per history): a tree whose siblings the target often samples."""

    method = "top_tree"
    hf = None
    cache: dict = {}

    def add_request(self, req_id, prompt_token_ids):
        pass

    def remove_request(self, req_id):
        pass

    def _top(self, seq, n):
        key = (tuple(seq), n)
        if key not in self.cache:
            with torch.no_grad():
                self.cache[key] = self.hf(torch.tensor([seq])).logits[0, -1].topk(n).indices.tolist()
        return self.cache[key]

    def propose(self, batch):
        ids, par = [], []
        for i in range(batch.batch_size):
            seq = batch.token_ids[i, : batch.num_tokens[i]].tolist()
            tokens, parents = [], []
            for a in self._top(seq, 3):
                tokens.append(a)
                parents.append(-1)
                at = len(tokens) - 1
                for b in self._top(seq + [a], 2):
                    tokens.append(b)
                    parents.append(at)
            ids.append(tokens)
            par.append(parents)
        return Drafts(torch.tensor(ids), [len(t) for t in ids], parents=torch.tensor(par))


def test_unseeded_sampled_trees_follow_the_target_distribution(tiny_llama_path, register_proposer):
    """Unseeded requests at temperature 0.8 verify whole trees by recursive rejection over siblings: the first two
    generated tokens' marginals match the exact target marginals (float64 plain HF forwards) within the bound the
    chain tests use, with most tokens accepted from the trees."""
    from transformers import AutoModelForCausalLM

    from conftest import TINY_VOCAB, exact_two_token_marginals

    prompt, n, temperature = PROMPTS[2], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    register_proposer(type("Top", (TopTree,), {"hf": hf, "cache": {}}))
    torch.manual_seed(0)
    llm = LLM(tiny_llama_path, {"method": "top_tree", "num_speculative_tokens": 2, "speculation_policy": "fixed"},
              dtype="float32", device="cpu", max_num_seqs=64)
    calls = []
    real = llm.target.forward_tree
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert calls and llm.stats.num_accepted_tokens > 0.2 * n
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_a_malformed_tree_is_refused_naming_the_plugin_or_dropped(tiny_llama_path, register_proposer, baseline):
    bad = type("BadTree", (TreeCopy,), {"method": "bad_tree", "bad_parent": True})
    register_proposer(bad)
    spec = {"method": "bad_tree", "num_speculative_tokens": 4, "speculation_policy": "fixed"}
    with pytest.raises(DraftValidationError, match=r"proposer BadTree \(method 'bad_tree'\) returned malformed "
                                                   r"drafts: request '0''s token tree: draft 0 has parent 1; a "
                                                   r"parent must be an earlier draft \(-1 .. -1, -1: the root\)"):
        LLM(tiny_llama_path, spec, dtype="float32", device="cpu").generate(PROMPTS[:1], GREEDY)
    llm = LLM(tiny_llama_path, {**spec, "on_bad_drafts": "drop"}, dtype="float32", device="cpu", max_num_seqs=4)
    expected = [o.token_ids for o in baseline.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tree graphs are captured on CUDA only (none here)")
@pytest.mark.parametrize("declared", [True, False])
def test_cuda_trees_replay_tree_graphs_and_equal_the_baseline(tiny_llama_path, register_proposer, declared):
    """On CUDA, a proposer that declares its largest tree (max_tree_nodes) gets tree graphs captured with the
    step graphs and its trees verified by replaying them; one that declares nothing verifies its trees eagerly;
    greedy output is the baseline's either way (float32), also for a seeded sampled request beside it."""
    params = [GREEDY, SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=5)] * 2
    kw = dict(dtype="float32", device="cuda", max_num_seqs=4)
    expected = [o.token_ids for o in LLM(tiny_llama_path, **kw).generate(PROMPTS, params)]
    truth = {tuple(p): p + e for p, e in zip(PROMPTS, expected)}
    name = f"cuda_tree_{declared}"
    tree = type("CudaTree", (TreeOracle,), {"method": name, "truth": truth,
                                            "max_tree_nodes": (lambda self: 8) if declared else
                                            specdec.Proposer.max_tree_nodes})
    register_proposer(tree)
    llm = LLM(tiny_llama_path, {"method": name, "num_speculative_tokens": 4, "speculation_policy": "fixed"}, **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == expected
    graphs = llm.target.graphs
    assert graphs is not None and graphs.tree_lens == ([9] if declared else [])
    assert (graphs.tree_replays > 0) == declared
    assert llm.stats.num_accepted_tokens > 3 * llm.stats.num_drafts

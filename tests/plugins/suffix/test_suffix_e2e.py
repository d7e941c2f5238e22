"""Plugin specdec-plugin-suffix end to end on a real (random-init) Llama: greedy output equals the
baseline at batch > 1, draft lengths differ per request within a step, repeating a workload raises
acceptance because the global suffix tree has seen the earlier responses, the drafts the engine
gets equal arctic-inference's own, and the documented workarounds make seeded sampling repeat."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import TINY_VOCAB
from specdec import LLM, SamplingParams
from specdec.policy import SpeculationPolicy
from specdec_suffix.reference import record_events, reference_drafts

pytest.importorskip("arctic_inference.suffix_decoding",
                    reason="arctic-inference is not installed (it needs a source build): run `make install`")

rng = random.Random(5)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(4, 20))] for _ in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(tiny_llama_path):
    outs = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4).generate(PROMPTS, GREEDY)
    return [o.token_ids for o in outs]


def record_draft_lengths(llm: LLM) -> list[list[int]]:
    """Wrap the proposer so every step's per-request draft counts are kept."""
    steps: list[list[int]] = []
    propose = llm.proposer.propose

    def recording(batch):
        drafts = propose(batch)
        steps.append(list(drafts.num_draft_tokens))
        return drafts

    llm.proposer.propose = recording
    return steps


def mean_acceptance_length(outs) -> float:
    drafts = sum(o.metrics.num_drafts for o in outs)
    return 1.0 + sum(o.metrics.num_accepted_tokens for o in outs) / drafts if drafts else 1.0


def test_greedy_identical_to_baseline_default_k(tiny_llama_path, baseline):
    llm = LLM(tiny_llama_path, {"method": "suffix", "speculation_policy": "fixed"}, dtype="float32", max_num_seqs=3)
    assert llm.num_speculative_tokens == 24  # k defaults to suffix_decoding_max_tree_depth
    steps = record_draft_lengths(llm)
    for _ in range(2):  # the second pass drafts long runs from the global tree
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert max(max(s) for s in steps) > 5 and max(len(s) for s in steps) == 3
    assert llm.stats.num_accepted_tokens > 0


def test_repeated_requests_accept_more_the_second_time(tiny_llama_path, baseline):
    """Same prompts twice through one LLM (batch 4): output stays the baseline's, draft lengths differ
    per request within a step, and the second pass drafts from the first pass's responses. With the
    global tree disabled (max_cached_requests=0) every pass is like the first."""
    spec = {"method": "suffix", "num_speculative_tokens": 8, "speculation_policy": "fixed"}  # acceptance counts
    llm = LLM(tiny_llama_path, spec, dtype="float32", max_num_seqs=4)
    steps = record_draft_lengths(llm)
    first = llm.generate(PROMPTS, GREEDY)
    second = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in first] == baseline and [o.token_ids for o in second] == baseline
    mixed = [s for s in steps if len({n for n in s if n > 0}) > 1]
    assert mixed, f"no step drafted different positive lengths for two requests: {steps}"
    assert any(0 in s and max(s) > 0 for s in steps)

    no_global = LLM(tiny_llama_path, {**spec, "suffix_decoding_max_cached_requests": 0}, dtype="float32",
                    max_num_seqs=4)
    no_global.generate(PROMPTS, GREEDY)
    repeat_no_global = no_global.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in repeat_no_global] == baseline

    al = [mean_acceptance_length(o) for o in (first, second, repeat_no_global)]
    n_steps = [sum(r.metrics.num_steps for r in o) for o in (first, second, repeat_no_global)]
    print(f"mean acceptance length: first pass {al[0]:.3f}, repeated pass {al[1]:.3f}, repeated pass without "
          f"global tree {al[2]:.3f}; decode steps {n_steps}")
    assert al[1] > al[0] + 2.0 and n_steps[1] < n_steps[0] / 2
    assert al[2] < al[1] - 2.0  # per-request trees alone do not remember earlier responses


def test_default_drafts_equal_arctic_inference_through_the_engine(tiny_llama_path, baseline):
    """The engine drives the proposer (while_verifying included) over two passes of 6 requests at
    batch 3, the global tree on: every draft equals what arctic-inference's SuffixDecodingCache
    returns when driven by hand, vLLM's way (each request's tokens added, then its draft taken).
    Fails with defer_global_updates=True, the default before issue 18."""
    llm = LLM(tiny_llama_path, {"method": "suffix", "num_speculative_tokens": 8, "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=3)  # fixed: every step drafts (auto's plain steps skip it)
    events = record_events(llm)
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    steps = drafted = 0
    for _, rows, drafts, expected in reference_drafts(events):
        assert drafts == [e or [] for e in expected], f"step {steps}: requests {[r[0] for r in rows]}"
        steps += 1
        drafted += sum(map(len, drafts))
    assert steps >= 30 and drafted > 100 and max(len(e[1]) for e in events if e[0] == "propose") == 3


def test_seeded_sampling_repeats_whatever_the_global_tree_holds(tiny_llama_path):
    """Issue 18, defect 9, fixed by keyed sampling (issue 24, specdec.keyed): the global tree remembers the first
    call's responses, so the same seeded requests draft differently on a second call to one LLM, yet their
    tokens repeat exactly (a seeded request's draws are keyed by position, not consumed from a stream), and
    equal the baseline's."""
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32, seed=100 + i, ignore_eos=True)
              for i in range(len(PROMPTS))]
    spec = {"method": "suffix", "num_speculative_tokens": 8, "speculation_policy": "fixed"}  # every step drafts
    llm = LLM(tiny_llama_path, spec, dtype="float32", max_num_seqs=4)
    steps = record_draft_lengths(llm)
    calls = []
    for reset in (False, False, True):
        if reset:
            llm.proposer.reset()
        start = len(steps)
        calls.append(([o.token_ids for o in llm.generate(PROMPTS, params)], steps[start:]))
    (first, first_drafts), (second, second_drafts), (after_reset, reset_drafts) = calls
    assert second_drafts != first_drafts  # the second call drafts from the first's responses
    assert second == first and after_reset == first and reset_drafts == first_drafts
    baseline = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4)
    assert [o.token_ids for o in baseline.generate(PROMPTS, params)] == first

    no_global = LLM(tiny_llama_path, {**spec, "suffix_decoding_max_cached_requests": 0}, dtype="float32",
                    max_num_seqs=4)
    assert [o.token_ids for o in no_global.generate(PROMPTS, params)] == [
        o.token_ids for o in no_global.generate(PROMPTS, params)]


def test_tree_speculation_equals_the_baseline_and_verifies_whole_trees(tiny_llama_path, baseline):
    """use_tree_spec=True: arctic-inference's token trees (several continuations of the matched suffix) are
    verified in one forward per greedy step; output equals the baseline over two passes (the second drafts from
    the global tree)."""
    spec = {"method": "suffix", "num_speculative_tokens": 8, "speculation_policy": "fixed", "use_tree_spec": True}
    llm = LLM(tiny_llama_path, spec, dtype="float32", max_num_seqs=3)
    calls, branched = [], []
    real_tree, real_propose = llm.target.forward_tree, llm.proposer.propose
    llm.target.forward_tree = lambda *a, **kw: calls.append(1) or real_tree(*a, **kw)

    def propose(batch):
        d = real_propose(batch)
        assert d.parents is not None
        branched.extend(int(p) != j - 1 and p >= 0 for row, n in zip(d.parents.tolist(), d.num_draft_tokens)
                        for j, p in enumerate(row[:n]))
        return d
    llm.proposer.propose = propose
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert calls and llm.stats.num_accepted_tokens > 0
    print(f"{sum(branched)} of {len(branched)} tree nodes off their predecessor's branch")


def test_use_tree_spec_is_validated():
    from specdec import SpeculativeConfig

    with pytest.raises(ValueError, match=r"use_tree_spec='yes' is invalid: it must be True \(token trees\) or False"):
        SpeculativeConfig(method="suffix", num_speculative_tokens=4, use_tree_spec="yes")
    for bad in (-1, 65, 2.0, "8"):
        with pytest.raises(ValueError, match=rf"tree_nodes={bad!r} is invalid: it must be an int from 0 \(trees of k "
                                             r"nodes\) to 64 \(specdec.validation.MAX_TREE_NODES\)"):
            SpeculativeConfig(method="suffix", num_speculative_tokens=4, use_tree_spec=True, tree_nodes=bad)
    with pytest.raises(ValueError, match=r"tree_nodes=8 needs use_tree_spec=True \(chains have k drafts\)"):
        SpeculativeConfig(method="suffix", num_speculative_tokens=4, tree_nodes=8)


def test_wider_trees_equal_the_baseline(tiny_llama_path, baseline):
    """tree_nodes=16 with k=4: trees of up to 16 nodes within depth 4, verified whole; output equals the baseline over
    two passes (the second from the global tree), and some steps verified more than k nodes."""
    spec = {"method": "suffix", "num_speculative_tokens": 4, "speculation_policy": "fixed", "use_tree_spec": True,
            "tree_nodes": 16, "suffix_decoding_min_token_prob": 0.0, "suffix_decoding_max_spec_factor": 4.0}
    llm = LLM(tiny_llama_path, spec, dtype="float32", max_num_seqs=3)
    assert llm.proposer.max_tree_nodes() == 16
    sizes, real = [], llm.proposer.propose
    llm.proposer.propose = lambda batch: sizes.extend((d := real(batch)).num_draft_tokens) or d
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert max(sizes) > 4 and llm.stats.num_accepted_tokens > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tree graphs are captured on CUDA only (none here)")
def test_cuda_tree_speculation_replays_tree_graphs(tiny_llama_path):
    """On CUDA, use_tree_spec trees (up to k nodes: max_tree_nodes) are verified by replaying tree graphs; float32
    greedy output is the CUDA baseline's over two passes."""
    kw = dict(dtype="float32", device="cuda", max_num_seqs=3)
    expected = [o.token_ids for o in LLM(tiny_llama_path, **kw).generate(PROMPTS, GREEDY)]
    spec = {"method": "suffix", "num_speculative_tokens": 8, "speculation_policy": "fixed", "use_tree_spec": True}
    llm = LLM(tiny_llama_path, spec, **kw)
    assert llm.proposer.max_tree_nodes() == 8
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert llm.target.graphs.tree_lens == [9] and llm.target.graphs.tree_replays > 0


class _NeverDrafts(SpeculationPolicy):
    """Every step plain: a skippable proposer is never called while its requests run."""

    def plan(self, req_ids, sampled=False, remaining=None):
        widths = [0] * len(req_ids)
        self._planned = dict(zip(req_ids, widths))
        return widths

    def would_draft(self, req_ids, sampled=False, remaining=None):
        return False


def test_responses_finished_in_plain_runs_reach_the_global_tree_whole(tiny_llama_path, baseline):
    """suffix is skippable: plain steps call nothing, and a request that leaves after such steps hands its
    unseen tokens over (the engine's observe before remove_request). With every step plain, the global tree
    then holds each whole response: a probe request drafts from it exactly what a SuffixDecodingCache given the
    full responses by hand drafts, at every context the responses hold. Output stays the baseline's."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    llm = LLM(tiny_llama_path, {"method": "suffix", "num_speculative_tokens": 8}, dtype="float32", max_num_seqs=3)
    calls = []
    for name in ("propose", "observe"):
        real = getattr(llm.proposer, name)

        def counted(batch, _real=real, _name=name):
            calls.append((_name, list(batch.req_ids)))
            return _real(batch)
        setattr(llm.proposer, name, counted)
    llm.policy = _NeverDrafts(8)
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 4 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [b[: p.max_tokens] for b, p in zip(baseline, params)]
    assert {name for name, _ in calls} == {"observe"}  # only the leaving requests' hand-over
    assert sorted(r for _, ids in calls for r in ids) == sorted(o.request_id for o in outs)
    ref = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
    for o, prompt in zip(outs, PROMPTS):
        ref.start_request(o.request_id, prompt)
        ref.add_active_response(o.request_id, o.token_ids)
        ref.stop_request(o.request_id)
    proposer = llm.proposer
    proposer.add_request("probe", np.asarray([1], dtype=np.int32))
    ref.start_request("probe", [1])
    checked = 0
    for o in outs:
        for end in range(2, len(o.token_ids) + 1):
            context = np.asarray(o.token_ids[max(0, end - 24): end], dtype=np.int32)
            want = ref.speculate("probe", context, max_spec_tokens=8, min_token_prob=0.1).token_ids
            got = proposer.cache.speculate("probe", context, max_spec_tokens=8, min_token_prob=0.1).token_ids
            assert got == want, (o.request_id, end)
            checked += bool(want)
    assert checked > 20

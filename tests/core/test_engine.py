"""LLM engine: greedy speculative output equals greedy baseline output, token for token (float32),
whatever the drafts; stop conditions; sampled outputs; bad input."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

import specdec
from conftest import TINY_VOCAB, exact_two_token_marginals
from specdec import LLM, Drafts, DraftValidationError, Proposer, SamplingParams

MAX_TOKENS = 20


def make_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 24))] for _ in range(n)]


PROMPTS = make_prompts(12, seed=0)


@dataclass(frozen=True)
class OracleOptions:
    mode: str = "right"  # right: the baseline's next tokens; wrong: all off by one; random: uniform ids;
    # poison_first: right, but the first row's second draft is outside the vocabulary


class OracleProposer(Proposer):
    """Drafts from the known baseline continuation (set ``reference`` before use)."""

    method = "test_oracle"
    Options = OracleOptions
    reference: ClassVar[dict[tuple[int, ...], list[int]]] = {}

    def __init__(self, config, target=None):
        super().__init__(config, target)
        self.prompts: dict[str, tuple[int, ...]] = {}
        self.rng = np.random.default_rng(0)

    def add_request(self, req_id, prompt_token_ids):
        self.prompts[req_id] = tuple(int(t) for t in prompt_token_ids)

    def remove_request(self, req_id):
        del self.prompts[req_id]

    def propose(self, batch):
        k, drafts = batch.num_speculative_tokens, []
        for i, rid in enumerate(batch.req_ids):
            prompt = self.prompts[rid]
            done = int(batch.num_tokens[i]) - len(prompt)
            ref = self.reference[prompt][done: done + k]
            if self.options.mode == "wrong":
                ref = [(t + 1) % TINY_VOCAB for t in ref]
            elif self.options.mode == "random":
                ref = self.rng.integers(0, TINY_VOCAB, size=k).tolist()
            elif self.options.mode == "poison_first" and i == 0 and len(ref) > 1:
                ref = [ref[0], TINY_VOCAB + 1, *ref[2:]]
            drafts.append(ref)
        return Drafts.from_lists(drafts, k)


@pytest.fixture
def oracle(register_proposer):
    register_proposer(OracleProposer)
    yield OracleProposer
    OracleProposer.reference = {}


@pytest.fixture(scope="module", params=["tiny_llama_path", "tiny_qwen3_path"])
def model_and_baseline(request):
    path = request.getfixturevalue(request.param)
    llm = LLM(path, dtype="float32", max_num_seqs=8)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return path, {tuple(p): o.token_ids for p, o in zip(PROMPTS, outs)}


def test_baseline_matches_hf_generate(tiny_llama_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    llm = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4)
    prompts = PROMPTS[:4]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == ref


def test_baseline_independent_of_batch_size(model_and_baseline):
    path, reference = model_and_baseline
    llm = LLM(path, dtype="float32", max_num_seqs=1)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == [reference[tuple(p)] for p in PROMPTS]


@pytest.mark.parametrize("mode", ["right", "wrong", "random"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("max_num_seqs", [1, 3, 8])
def test_greedy_speculative_equals_baseline(model_and_baseline, oracle, mode, k, max_num_seqs):
    path, reference = model_and_baseline
    oracle.reference = reference
    llm = LLM(path, {"method": "test_oracle", "num_speculative_tokens": k, "mode": mode}, dtype="float32",
              max_num_seqs=max_num_seqs)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == reference[tuple(prompt)], f"prompt {prompt}"
    stats = llm.stats
    assert stats.num_drafts > 0
    if mode == "right":
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        assert stats.mean_acceptance_length > 1 + 0.6 * k
    elif mode == "wrong":
        assert stats.num_accepted_tokens == 0
    # Per-request metrics add up to the engine's stats.
    assert sum(o.metrics.num_accepted_tokens for o in outs) == stats.num_accepted_tokens
    assert sum(o.metrics.num_draft_tokens for o in outs) == stats.num_draft_tokens


class VerifyHookProposer(OracleProposer):
    """The oracle's drafts, recording when the engine calls propose and while_verifying, and how many
    tokens each request had at that moment."""

    method = "test_verify_hook"
    events: ClassVar[list[tuple[str, tuple[int, ...]]]] = []

    def propose(self, batch):
        self.events.append(("propose", tuple(int(n) for n in batch.num_tokens)))
        self._lengths = batch
        return super().propose(batch)

    def while_verifying(self):
        self.events.append(("verify", tuple(int(n) for n in self._lengths.num_tokens)))


def test_while_verifying_runs_once_a_step_between_propose_and_its_outcome(model_and_baseline, register_proposer):
    """The hook of host work in the verify forward's shadow: once per decode step, right after that
    step's propose and before its tokens are appended (the requests' lengths are still the ones
    propose saw); the output stays the baseline's."""
    path, reference = model_and_baseline
    register_proposer(VerifyHookProposer)
    VerifyHookProposer.reference, VerifyHookProposer.events = reference, []
    llm = LLM(path, {"method": "test_verify_hook", "num_speculative_tokens": 3, "mode": "wrong"}, dtype="float32",
              max_num_seqs=4)
    outs = llm.generate(PROMPTS[:6], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == [reference[tuple(p)] for p in PROMPTS[:6]]
    events = VerifyHookProposer.events
    VerifyHookProposer.reference, VerifyHookProposer.events = {}, []
    kinds = [kind for kind, _ in events]
    assert kinds == ["propose", "verify"] * (len(events) // 2) and len(events) >= 2 * (MAX_TOKENS - 1)
    assert all(events[i][1] == events[i + 1][1] for i in range(0, len(events), 2))


def test_admit_group_sets_when_waiting_requests_join(model_and_baseline):
    """Requests that finish at different steps free slots one by one: with admit_group=4 (all four
    slots) waiting requests join four at a time, with admit_group=1 as soon as a slot is free; the
    outputs are the same either way."""
    path, reference = model_and_baseline
    lengths = [3 + (5 * i) % (MAX_TOKENS - 3) for i in range(len(PROMPTS))]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in lengths]
    want = [reference[tuple(p)][:m] for p, m in zip(PROMPTS, lengths)]
    prefills = {}
    for group in (4, 1, None):
        llm = LLM(path, dtype="float32", max_num_seqs=4, admit_group=group, profile_steps=True)
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want
        prefills[group] = llm.step_timer.prefills
        assert llm.step_timer.prefill_requests == len(PROMPTS)
    assert prefills[4] == len(PROMPTS) // 4  # a group per four free slots
    assert prefills[1] > prefills[4]
    assert prefills[None] == prefills[1]  # the default, max_num_seqs // 4, is 1 for four slots


@pytest.mark.parametrize("defer", [False, True])
def test_dropped_request_leaves_the_others_intact(model_and_baseline, oracle, defer):
    """on_bad_drafts='drop' with one bad request in the batch: its drafts are dropped (it accepts none)
    while the other requests' right drafts are all accepted, whether the drafts are checked before
    the verify forward or, left on the device (forced on the CPU), after it (the dropped request's
    rows are still in the verified batch)."""
    path, reference = model_and_baseline
    oracle.reference = reference
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    llm = LLM(path, {"method": "test_oracle", "num_speculative_tokens": 3, "mode": "poison_first",
                     "on_bad_drafts": "drop"}, dtype="float32", max_num_seqs=4)
    llm._defer_drafts = defer
    outs = llm.generate(PROMPTS[:4], params)
    assert [o.token_ids for o in outs] == [reference[tuple(p)] for p in PROMPTS[:4]]
    assert outs[0].metrics.num_draft_tokens == 0  # slot 0, the first row until it finishes, last
    others = outs[1:]
    assert sum(o.metrics.num_accepted_tokens for o in others) == sum(o.metrics.num_draft_tokens for o in others) > 0


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("mode", ["right", "poison_first", "random"])
def test_seeded_drafts_left_on_the_device_keep_the_keyed_samples(model_and_baseline, oracle, register_proposer,
                                                                  monkeypatch, defer, mode):
    """A batch of seeded and greedy requests with its drafts left on the device (``defer``, forced on the CPU
    here) or read before the verify forward: each request's tokens are the baseline's (keyed samples, argmax), right
    drafts are all accepted (the keyed sample read with the argmax after the forward), a request with a bad draft
    is dropped, and the deferred path is the one taken exactly when asked for (the drafts on the target's device:
    on CUDA too)."""
    import specdec.engine as engine_module

    class OnDevice(OracleProposer):
        method = "test_oracle_on_device"

        def propose(self, batch):
            d = super().propose(batch)
            return Drafts(d.token_ids.to(self.target.device), d.num_draft_tokens)

    register_proposer(OnDevice)
    path, _ = model_and_baseline
    params = [SamplingParams(temperature=0.8, seed=10 + i, max_tokens=MAX_TOKENS) if i % 2 == 0
              else SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS) for i in range(4)]
    want = [o.token_ids for o in LLM(path, dtype="float32", max_num_seqs=4).generate(PROMPTS[:4], params)]
    oracle.reference = {tuple(p): w for p, w in zip(PROMPTS[:4], want)}
    deferred = []
    real = engine_module.accept_deferred

    def spy(d, out, reqs=None):
        deferred.append(sum(r.params.seed is not None for r in reqs))
        return real(d, out, reqs)

    monkeypatch.setattr(engine_module, "accept_deferred", spy)
    llm = LLM(path, {"method": OnDevice.method, "num_speculative_tokens": 3, "mode": mode, "on_bad_drafts": "drop",
                     "speculation_policy": "fixed"}, dtype="float32", max_num_seqs=4)
    llm._defer_drafts = defer
    outs = llm.generate(PROMPTS[:4], params)
    assert [o.token_ids for o in outs] == want
    assert bool(deferred) == defer and (not defer or max(deferred) == 2)
    if mode == "right":
        assert llm.stats.num_accepted_tokens == llm.stats.num_draft_tokens > 0
    elif mode == "poison_first":
        assert outs[0].metrics.num_draft_tokens <= 1  # dropped while it had two drafts or more
        assert sum(o.metrics.num_accepted_tokens for o in outs[1:]) == sum(
            o.metrics.num_draft_tokens for o in outs[1:]) > 0


def test_fixture_plugin_by_entry_point_is_lossless(model_and_baseline):
    """The third-party distribution in tests/fixtures is installed for real and selected by name."""
    path, reference = model_and_baseline
    assert specdec.available_methods()["copycat"].distribution == "specdec-plugin-copycat"
    llm = LLM(path, {"method": "copycat", "num_speculative_tokens": 4}, dtype="float32", max_num_seqs=5)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == [reference[tuple(p)] for p in PROMPTS]
    assert llm.stats.num_drafts > 0


def test_max_tokens_per_request_and_length_reason(model_and_baseline, oracle):
    path, reference = model_and_baseline
    oracle.reference = reference
    llm = LLM(path, {"method": "test_oracle", "num_speculative_tokens": 5}, dtype="float32")
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (1, 2, 7, 20)]
    outs = llm.generate(PROMPTS[:4], params)
    for prompt, p, out in zip(PROMPTS[:4], params, outs):
        assert out.token_ids == reference[tuple(prompt)][: p.max_tokens]
        assert out.finish_reason == "length"


def test_stop_token_ids(model_and_baseline, oracle):
    path, reference = model_and_baseline
    oracle.reference = reference
    prompt = PROMPTS[0]
    ref = reference[tuple(prompt)]
    stop = ref[6]
    expected = ref[: ref.index(stop) + 1]
    for config in (None, {"method": "test_oracle", "num_speculative_tokens": 8}):
        llm = LLM(path, config, dtype="float32")
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=[stop]))[0]
        assert out.token_ids == expected
        assert out.finish_reason == "stop"


def test_eos_stops_and_ignore_eos(tmp_path, model_and_baseline, oracle):
    from transformers import AutoConfig, AutoModelForCausalLM

    path, reference = model_and_baseline
    prompt = PROMPTS[1]
    ref = reference[tuple(prompt)]
    eos = ref[4]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).eos_token_id == eos
    oracle.reference = {tuple(prompt): ref}
    llm = LLM(str(tmp_path), {"method": "test_oracle", "num_speculative_tokens": 8}, dtype="float32")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0]
    assert out.token_ids == ref[: ref.index(eos) + 1] and out.finish_reason == "stop"
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    assert out.token_ids == ref


def test_max_model_len_stops(model_and_baseline, oracle):
    path, reference = model_and_baseline
    oracle.reference = reference
    prompt = max(PROMPTS, key=len)
    llm = LLM(path, {"method": "test_oracle", "num_speculative_tokens": 8}, dtype="float32",
              max_model_len=len(prompt) + 5)
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    assert out.token_ids == reference[tuple(prompt)][:5]
    assert out.finish_reason == "length"


def test_seeded_sampling_reproducible(tiny_llama_path):
    params = [SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=s, max_tokens=12) for s in (1, 2, 1)]
    for config in (None, {"method": "copycat", "num_speculative_tokens": 3}):
        llm = LLM(tiny_llama_path, config, dtype="float32")
        first = [o.token_ids for o in llm.generate(PROMPTS[:3], params)]
        again = [o.token_ids for o in llm.generate(PROMPTS[:3], params)]
        assert first == again
        alone = llm.generate([PROMPTS[0]], params[0])[0].token_ids
        assert alone == first[0]
        assert first[0] != first[2] or PROMPTS[0] != PROMPTS[2]


def test_sampled_speculative_output_follows_target(tiny_llama_path, oracle):
    """Random drafts at temperature 0.8: the first two generated tokens' marginals match the exact
    target marginals (computed in float64 with plain HF forwards) within a total-variation bound."""
    prompt = PROMPTS[2]
    oracle.reference = {tuple(prompt): []}
    n, temperature = 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(0)
    llm = LLM(tiny_llama_path, {"method": "test_oracle", "num_speculative_tokens": 2, "mode": "random",
                                   "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert llm.stats.num_accepted_tokens > 0
    for position, p in ((0, p1), (1, p2)):
        freq = np.bincount(toks[:, position], minlength=TINY_VOCAB) / n
        tv = 0.5 * np.abs(freq - p).sum()
        # E[TV] for n samples is about sum(sqrt(p(1-p)/n))/2 * sqrt(2/pi); 0.08 is several sigmas above it.
        assert tv < 0.08, (position, tv)


def test_plain_sampled_output_follows_target_without_the_rejection_sampler(tiny_llama_path, no_rejection_sampler):
    """Without speculation every step is plain: unseeded requests at temperature 0.8 are sampled straight from the
    target's distribution (Verifier._plain_samples; the rejection sampler is made to fail here), and the first two
    tokens' marginals match the exact target marginals."""
    prompt, n, temperature = PROMPTS[2], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(0)
    llm = LLM(tiny_llama_path, dtype="float32", max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=2, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_seeded_sampled_output_follows_target_and_ignores_drafts(tiny_llama_path, oracle):
    """Seeded requests (keyed sampling, specdec.keyed), one seed each, random drafts at temperature 0.8: the
    first two tokens' marginals match the exact target marginals, and every request's tokens equal the
    baseline's with the same seed (the drafts change nothing)."""
    prompt = PROMPTS[2]
    oracle.reference = {tuple(prompt): []}
    n, temperature = 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    params = [SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True, seed=s) for s in range(n)]
    llm = LLM(tiny_llama_path, {"method": "test_oracle", "num_speculative_tokens": 2, "mode": "random",
                                   "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=64)
    outs = [o.token_ids for o in llm.generate([prompt] * n, params)]
    assert llm.stats.num_accepted_tokens > 0
    toks = np.array([o[:2] for o in outs])
    for position, p in ((0, p1), (1, p2)):
        freq = np.bincount(toks[:, position], minlength=TINY_VOCAB) / n
        assert 0.5 * np.abs(freq - p).sum() < 0.08, position
    base = LLM(tiny_llama_path, dtype="float32", max_num_seqs=64)
    assert [o.token_ids for o in base.generate([prompt] * 300, params[:300])] == outs[:300]


class BadProposer(Proposer):
    method = "test_bad"
    kind: ClassVar[str] = "shape"

    def propose(self, batch):
        b, k = batch.batch_size, batch.num_speculative_tokens
        if self.kind == "shape":
            return Drafts(torch.zeros(b + 1, k, dtype=torch.int64), [k] * (b + 1))
        if self.kind == "dtype":
            return Drafts(torch.zeros(b, k, dtype=torch.int32), [k] * b)
        if self.kind == "vocab":
            return Drafts(torch.full((b, k), TINY_VOCAB + 5, dtype=torch.int64), [k] * b)
        if self.kind == "vocab_edge":  # the first id past the vocabulary, after a valid one
            return Drafts(torch.tensor([[1, TINY_VOCAB]] * b), [k] * b)
        if self.kind == "negative":  # a padding value inside the counted drafts
            return Drafts(torch.tensor([[2, -1]] * b), [k] * b)
        if self.kind == "too_many":
            return Drafts(torch.zeros(b, k + 2, dtype=torch.int64), [k + 2] * b)
        return [[1, 2]] * b


@pytest.mark.parametrize("kind,fragment", [
    ("shape", "token_ids has shape (4, 2); expected [B=3, <=k=2]"),
    ("dtype", "token_ids is a torch.int32 tensor of shape (3, 2); expected an int64 tensor"),
    ("vocab", f"draft id {TINY_VOCAB + 5} outside the vocabulary [0, {TINY_VOCAB})"),
    ("vocab_edge", f"draft id {TINY_VOCAB} outside the vocabulary [0, {TINY_VOCAB})"),
    ("negative", f"draft id -1 outside the vocabulary [0, {TINY_VOCAB})"),
    ("too_many", "token_ids has shape (3, 4); expected [B=3, <=k=2]"),
    ("list", "propose() returned list, expected specdec.Drafts"),
])
@pytest.mark.parametrize("defer", [False, True])
def test_malformed_drafts(model_and_baseline, register_proposer, kind, fragment, defer):
    """Each kind of malformed drafts: the same error whether the drafts are checked before the verify
    forward or, left on the device (``defer``; forced on the CPU here), after it."""
    path, reference = model_and_baseline
    register_proposer(BadProposer)
    BadProposer.kind = kind
    prompts = PROMPTS[:3]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    llm = LLM(path, {"method": "test_bad", "num_speculative_tokens": 2}, dtype="float32")
    llm._defer_drafts = defer
    with pytest.raises(DraftValidationError) as err:
        llm.generate(prompts, params)
    assert "proposer BadProposer (method 'test_bad') returned malformed drafts" in str(err.value)
    assert fragment in str(err.value)
    assert "on_bad_drafts='drop'" in str(err.value)
    # The documented alternative: drop those drafts and go on; output stays exact.
    llm = LLM(path, {"method": "test_bad", "num_speculative_tokens": 2, "on_bad_drafts": "drop"}, dtype="float32")
    llm._defer_drafts = defer
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [reference[tuple(p)] for p in prompts]

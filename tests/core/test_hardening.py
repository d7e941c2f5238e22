"""Issue 18's engine defects: draft probs a plugin cannot lie with, threads, Prometheus counters."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from conftest import TINY_VOCAB, exact_two_token_marginals
from specdec import LLM, Drafts, DraftValidationError, Proposer, SamplingParams
from specdec.metrics import SpecDecodingProm

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [20, 21, 22], [30, 31]]


@dataclass(frozen=True)
class LiarOptions:
    lie: str = "zero"  # how odd-numbered requests' probs lie; even-numbered ones are honest


class LiarProposer(Proposer):
    """Drafts uniform random tokens. Even-numbered requests report the honest uniform q; odd-numbered
    ones report a q that would bias the verifier: q(x) = 0 (accept every draft), negative, NaN, inf,
    or rows summing to 2."""

    method = "test_liar"
    Options = LiarOptions
    drafted_token: ClassVar[int] = 7

    def __init__(self, config, target=None):
        super().__init__(config, target)
        self.rng = torch.Generator().manual_seed(0)

    def propose(self, batch):
        b, k = batch.batch_size, batch.num_speculative_tokens
        ids = torch.randint(0, TINY_VOCAB, (b, k), generator=self.rng)
        probs = torch.full((b, k, TINY_VOCAB), 1.0 / TINY_VOCAB)
        for i, rid in enumerate(batch.req_ids):
            if int(rid) % 2 == 0:
                continue
            ids[i] = self.drafted_token  # a fixed token, always "accepted" if the verifier trusted q
            row = probs[i, :, :]
            if self.options.lie == "zero":
                row[:, self.drafted_token] = 0.0
                row.div_(row.sum(-1, keepdim=True))  # a proper distribution, only not over its draft
            elif self.options.lie == "negative":
                row[:, self.drafted_token] = -0.5
            elif self.options.lie == "nan":
                row[:, 3] = float("nan")
            elif self.options.lie == "inf":
                row[:, 3] = float("inf")
            elif self.options.lie == "unnormalised":
                row.mul_(2.0)
        return Drafts(ids, [k] * b, probs)


@pytest.fixture
def liar(register_proposer):
    register_proposer(LiarProposer)
    return LiarProposer


@pytest.mark.parametrize("lie,fragment", [
    ("zero", "at draft position 0 give q=0 to its own draft 7 (it must be > 0)"),
    ("negative", "at draft position 0 hold a negative probability"),
    ("nan", "at draft position 0 are not finite (NaN or inf)"),
    ("inf", "at draft position 0 are not finite (NaN or inf)"),
    ("unnormalised", "at draft position 0 sum to 2, not 1 (tolerance 0.001)"),
])
def test_lying_draft_probs_raise_naming_the_plugin(tiny_llama_path, liar, lie, fragment):
    llm = LLM(tiny_llama_path, {"method": "test_liar", "num_speculative_tokens": 3, "lie": lie}, dtype="float32")
    with pytest.raises(DraftValidationError) as err:
        llm.generate(PROMPTS[:2], SamplingParams(temperature=0.8, max_tokens=8))  # unseeded: q is read
    msg = str(err.value)
    assert msg.startswith("proposer LiarProposer (method 'test_liar') returned malformed drafts: request '1' has "
                          "draft probs that " + fragment)
    assert "on_bad_drafts='drop'" in msg


def test_greedy_requests_ignore_draft_probs(tiny_llama_path, liar):
    """The verifier never reads q for a greedy request, so a greedy batch is not refused for it."""
    llm = LLM(tiny_llama_path, {"method": "test_liar", "num_speculative_tokens": 3}, dtype="float32")
    base = LLM(tiny_llama_path, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=10)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in base.generate(PROMPTS, params)]


@pytest.mark.parametrize("lie", ["zero", "nan"])
def test_seeded_requests_ignore_draft_probs(tiny_llama_path, liar, lie):
    """Seeded requests are verified by the keyed rule, which never reads q: lying probs neither refuse the batch
    nor change a token (the baseline's keyed samples, in float32)."""
    llm = LLM(tiny_llama_path, {"method": "test_liar", "num_speculative_tokens": 3, "lie": lie,
                                "speculation_policy": "fixed"}, dtype="float32")
    base = LLM(tiny_llama_path, dtype="float32")
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [o.token_ids for o in base.generate(PROMPTS, params)]
    assert llm.stats.num_draft_tokens > 0


@pytest.mark.parametrize("lie", ["zero", "negative"])
def test_output_follows_target_despite_a_lying_plugin(tiny_llama_path, liar, lie):
    """With on_bad_drafts='drop', the lying requests' drafts are discarded and the honest ones verified:
    the first two tokens' marginals match the exact target marginals (float64, plain HF forwards).
    Before the check, q(x) = 0 made the verifier accept the fixed token 7 at every step."""
    prompt = PROMPTS[2]
    n, temperature = 2000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(0)
    # fixed: every step drafts (auto's timing-driven plain steps would make the draws differ run to run)
    config = {"method": "test_liar", "num_speculative_tokens": 2, "lie": lie, "on_bad_drafts": "drop",
              "speculation_policy": "fixed"}
    llm = LLM(tiny_llama_path, config, dtype="float32", max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    assert llm.stats.num_accepted_tokens > 0  # the honest half was verified, not dropped
    liars = np.array([o.token_ids[:2] for o in outs if int(o.request_id) % 2 == 1])
    honest = np.array([o.token_ids[:2] for o in outs if int(o.request_id) % 2 == 0])
    for toks in (liars, honest):
        for position, p in ((0, p1), (1, p2)):
            freq = np.bincount(toks[:, position], minlength=TINY_VOCAB) / len(toks)
            tv = 0.5 * np.abs(freq - p).sum()
            # E[TV] for 1000 samples is about 0.07 here; a fixed accepted token would put TV near 1 - p(7).
            assert tv < 0.12, (position, tv)


@dataclass(frozen=True)
class SlyOptions:
    q_of_draft: float = 1e-30


class SlyProposer(Proposer):
    """Always drafts token 7 but reports a well-formed q that puts almost nothing on it: every check
    passes, and min(1, p/q) accepts the draft whenever p(7) > 0. No single draw can reveal the lie."""

    method = "test_sly"
    Options = SlyOptions

    def propose(self, batch):
        b, k = batch.batch_size, batch.num_speculative_tokens
        probs = torch.full((b, k, TINY_VOCAB), (1.0 - self.options.q_of_draft) / (TINY_VOCAB - 1))
        probs[:, :, 7] = self.options.q_of_draft
        return Drafts(torch.full((b, k), 7), [k] * b, probs)


@pytest.mark.parametrize("trust", [True, False])
def test_ignoring_draft_probs_is_lossless_against_a_well_formed_lie(tiny_llama_path, register_proposer, trust):
    """What no check can see (docs/design.md section 8) and the switch that closes it: with the
    plugin's q trusted the second token (the first drafted one) is 7 far more often than the target
    says; with trust_draft_probs=False the drafts are verified as one-hot and the output follows the
    target."""
    register_proposer(SlyProposer)
    prompt, n, temperature = PROMPTS[2], 1500, 0.8
    _, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(0)
    llm = LLM(tiny_llama_path, {"method": "test_sly", "num_speculative_tokens": 2, "speculation_policy": "fixed"},
              dtype="float32", max_num_seqs=64, trust_draft_probs=trust)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    freq = np.bincount([o.token_ids[1] for o in outs], minlength=TINY_VOCAB) / n
    tv = 0.5 * np.abs(freq - p2).sum()
    if trust:
        assert freq[7] > 0.5 and tv > 0.4, (freq[7], p2[7], tv)
    else:
        assert tv < 0.1, tv


def _outputs(llm, prompts, params):
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("config", [None, {"method": "copycat", "num_speculative_tokens": 3}])
def test_concurrent_generate_calls_return_what_each_would_alone(tiny_llama_path, config):
    llm = LLM(tiny_llama_path, config, dtype="float32", max_num_seqs=4)
    jobs = [
        (PROMPTS, SamplingParams(temperature=0.0, max_tokens=12)),
        (PROMPTS[::-1], [SamplingParams(temperature=0.9, seed=s, max_tokens=10) for s in range(len(PROMPTS))]),
        (PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)),
    ]
    alone = [_outputs(llm, p, s) for p, s in jobs]
    results: dict[tuple[int, int], list[list[int]]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs) * 2)

    def work(j: int, rep: int) -> None:
        try:
            start.wait()
            results[(j, rep)] = _outputs(llm, *jobs[j])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(j, rep)) for j in range(len(jobs)) for rep in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(results[(j, rep)] == alone[j] for j in range(len(jobs)) for rep in range(2))


class Recorder(Proposer):
    """Drafts nothing; records which requests each step ran, signals once a step has run, and fails
    the step holding a request whose prompt starts with the poison token."""

    method = "test_recorder"
    poison: ClassVar[int] = 77
    batches: ClassVar[list[list[str]]] = []
    stepped: ClassVar[threading.Event] = threading.Event()

    def __init__(self, config, target=None):
        super().__init__(config, target)
        self.first: dict[str, int] = {}

    def add_request(self, req_id, prompt_token_ids):
        self.first[req_id] = int(prompt_token_ids[0])

    def remove_request(self, req_id):
        del self.first[req_id]

    def propose(self, batch):
        self.batches.append(list(batch.req_ids))
        if len(self.batches) >= 3:
            self.stepped.set()
        if any(self.first[r] == self.poison for r in batch.req_ids):
            raise RuntimeError("poisoned step")
        return Drafts.from_lists([[] for _ in batch.req_ids], batch.num_speculative_tokens)


@pytest.fixture
def recorder(register_proposer):
    register_proposer(Recorder)
    Recorder.batches, Recorder.stepped = [], threading.Event()
    return Recorder


def _in_thread(fn, *args):
    box: dict[str, object] = {}

    def run():
        try:
            box["out"] = fn(*args)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_requests_of_two_threads_share_the_running_batch(tiny_llama_path, recorder):
    llm = LLM(tiny_llama_path, {"method": "test_recorder", "num_speculative_tokens": 2}, dtype="float32",
              max_num_seqs=4, admit_group=1)
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    alone = (_outputs(llm, PROMPTS[:2], long), _outputs(llm, PROMPTS[2:4], short))
    recorder.batches, recorder.stepped = [], threading.Event()
    a, box_a = _in_thread(llm.generate, PROMPTS[:2], long)
    assert recorder.stepped.wait(60)
    b, box_b = _in_thread(llm.generate, PROMPTS[2:4], short)
    a.join(60)
    b.join(60)
    outs_a, outs_b = box_a["out"], box_b["out"]
    assert [o.token_ids for o in outs_a] == alone[0] and [o.token_ids for o in outs_b] == alone[1]
    both = {o.request_id for o in outs_a} | {o.request_id for o in outs_b}
    assert any(both <= set(ids) for ids in recorder.batches)  # one step ran both calls' requests


def test_a_failing_step_ends_only_the_calls_in_it(tiny_llama_path, recorder):
    """Two slots: the first call fills them; a call with a poisoned request waits, joins when they
    free up, and its step fails. The first call's outputs are untouched; the engine goes on."""
    llm = LLM(tiny_llama_path, {"method": "test_recorder", "num_speculative_tokens": 2}, dtype="float32",
              max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    alone = _outputs(llm, PROMPTS[:2], params)
    recorder.batches, recorder.stepped = [], threading.Event()
    a, box_a = _in_thread(_outputs, llm, PROMPTS[:2], params)
    assert recorder.stepped.wait(60)
    b, box_b = _in_thread(_outputs, llm, [[Recorder.poison, 5, 6]], params)
    a.join(60)
    b.join(60)
    assert box_a == {"out": alone}
    assert isinstance(box_b.get("error"), RuntimeError) and str(box_b["error"]) == "poisoned step"
    assert _outputs(llm, PROMPTS[:2], params) == alone


def test_generate_from_inside_generate_raises(tiny_llama_path, register_proposer):
    class Reentrant(Proposer):
        method = "test_reentrant"
        llm: ClassVar[LLM | None] = None

        def propose(self, batch):
            self.llm.generate([[5, 6]], SamplingParams(max_tokens=2))

    register_proposer(Reentrant)
    llm = LLM(tiny_llama_path, {"method": "test_reentrant", "num_speculative_tokens": 2}, dtype="float32")
    Reentrant.llm = llm
    with pytest.raises(RuntimeError, match="called from inside a generate call on the same thread"):
        llm.generate([[5, 6]], SamplingParams(max_tokens=4))
    Reentrant.llm = None


def _counts(registry: CollectorRegistry, model: str, method: str) -> tuple[float, ...]:
    labels = {"model_name": model, "method": method}
    get = registry.get_sample_value
    return (get("specdec_num_drafts_total", labels), get("specdec_num_draft_tokens_total", labels),
            get("specdec_num_accepted_tokens_total", labels),
            *(get("specdec_num_accepted_tokens_per_pos_total", {**labels, "position": str(p)}) for p in range(3)))


def test_llm_feeds_prometheus_once_per_step(tiny_llama_path):
    registry = CollectorRegistry()
    llm = LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 3}, dtype="float32",
              prometheus=registry)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for _ in range(2):
        llm.generate(PROMPTS, params)
        s = llm.stats
        assert s.num_drafts > 0
        expected = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, *s.num_accepted_tokens_per_pos)
        assert _counts(registry, tiny_llama_path, "copycat") == tuple(float(x) for x in expected)


def test_observe_is_delta_safe(tiny_llama_path):
    """observe(llm.stats) after each generate counts each draft once (it double-counted before)."""
    registry = CollectorRegistry()
    prom = SpecDecodingProm(3, "m", "copycat", registry=registry)
    llm = LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 3}, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for _ in range(2):
        llm.generate(PROMPTS, params)
        prom.observe(llm.stats)
    prom.observe(llm.stats)  # nothing new
    s = llm.stats
    assert _counts(registry, "m", "copycat") == tuple(
        float(x) for x in (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, *s.num_accepted_tokens_per_pos))
    drafts = s.num_drafts
    s.reset()  # a reset stats object counts from zero again
    llm.generate(PROMPTS[:1], params)
    prom.observe(llm.stats)
    assert _counts(registry, "m", "copycat")[0] == drafts + llm.stats.num_drafts


def test_prometheus_argument_is_checked(tiny_llama_path):
    with pytest.raises(TypeError, match=r"prometheus='yes' is invalid: pass a prometheus_client.CollectorRegistry"):
        LLM(tiny_llama_path, prometheus="yes")


def test_array_prompts_and_tuple_params(tiny_llama_path):
    """A 1-D array or tensor is one prompt, a 2-D one a prompt per row; a tuple of SamplingParams is
    one per prompt (each was refused before)."""
    llm = LLM(tiny_llama_path, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=5)
    want = _outputs(llm, [[5, 6, 7], [8, 9, 10]], params)
    assert _outputs(llm, np.array([5, 6, 7]), params) == want[:1]
    assert _outputs(llm, torch.tensor([[5, 6, 7], [8, 9, 10]]), params) == want
    assert _outputs(llm, [[5, 6, 7], [8, 9, 10]], (params, params)) == want


def test_dropped_drafts_warn_once_per_proposer(tiny_llama_path, liar, caplog):
    config = {"method": "test_liar", "num_speculative_tokens": 2, "on_bad_drafts": "drop"}
    llm = LLM(tiny_llama_path, config, dtype="float32")
    with caplog.at_level("DEBUG", logger="specdec.engine"):
        llm.generate(PROMPTS, SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True))
    drops = [r for r in caplog.records if "returned malformed drafts" in r.getMessage()]
    assert len(drops) > 1
    assert [r.levelname for r in drops].count("WARNING") == 1
    assert "further drops from this proposer are logged at DEBUG" in drops[0].getMessage()


def test_a_plugin_failing_in_remove_request_fails_the_call_without_hanging(tiny_llama_path, register_proposer):
    class Leaky(Proposer):
        method = "test_leaky"
        broken: ClassVar[bool] = True

        def propose(self, batch):
            return Drafts.from_lists([[] for _ in batch.req_ids], batch.num_speculative_tokens)

        def remove_request(self, req_id):
            if self.broken:
                raise KeyError(f"no request {req_id}")

    register_proposer(Leaky)
    llm = LLM(tiny_llama_path, {"method": "test_leaky", "num_speculative_tokens": 2}, dtype="float32",
              max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    t, box = _in_thread(llm.generate, PROMPTS, params)
    t.join(60)
    assert not t.is_alive() and isinstance(box.get("error"), KeyError)
    Leaky.broken = False
    assert [len(o.token_ids) for o in llm.generate(PROMPTS, params)] == [4] * len(PROMPTS)


def test_an_interrupted_call_leaves_nothing_queued(tiny_llama_path, monkeypatch):
    """Ctrl-C while a call waits (or between steps): its requests leave the queue, so a later call does
    not run them first; the engine stays usable."""
    llm = LLM(tiny_llama_path, dtype="float32", max_num_seqs=2)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    want = _outputs(llm, PROMPTS, params)

    def interrupted(call):
        raise KeyboardInterrupt

    monkeypatch.setattr(llm, "_drive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, params)
    assert len(llm._calls) == 0
    monkeypatch.undo()
    assert _outputs(llm, PROMPTS, params) == want


def test_k_must_fit_the_model(tiny_llama_path):
    with pytest.raises(ValueError, match=r"^num_speculative_tokens=64 is invalid: it must be < max_model_len=64; "):
        LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 64}, dtype="float32", max_model_len=64)
    llm = LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 63}, dtype="float32", max_model_len=64)
    assert len(llm.generate([[5, 6, 5, 6]], SamplingParams(temperature=0.0, max_tokens=8))[0].token_ids) == 8


@pytest.mark.parametrize("kwargs,error,message", [
    ({"device": "tpu"}, ValueError, "device='tpu' is invalid: use 'cpu', 'cuda' or 'cuda:N'"),
    ({"device": 2.5}, TypeError, "device=2.5 is invalid: pass 'cpu', 'cuda', 'cuda:N' or a torch.device."),
    ({"log_stats": "no"}, TypeError, "log_stats='no' is invalid: it must be True or False."),
    ({"profile_steps": 1}, TypeError, "profile_steps=1 is invalid: it must be True or False."),
    ({"cuda_graphs": "yes"}, TypeError, "cuda_graphs='yes' is invalid: it must be True, False or None"),
    ({"log_interval_s": -1}, ValueError, "log_interval_s=-1 is invalid: it must be a number of seconds > 0."),
    ({"trust_draft_probs": None}, TypeError, "trust_draft_probs=None is invalid: it must be True or False."),
])
def test_engine_arguments_are_checked(tiny_llama_path, kwargs, error, message):
    with pytest.raises(error) as err:
        LLM(tiny_llama_path, dtype="float32", **kwargs)
    assert str(err.value).startswith(message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_device_without_cuda_is_refused(tiny_llama_path):
    with pytest.raises(ValueError, match=r"^device='cuda' is invalid: CUDA is not available here"):
        LLM(tiny_llama_path, device="cuda")


def test_use_tqdm_is_checked(tiny_llama_path):
    with pytest.raises(TypeError, match=r"^use_tqdm='yes' is invalid: it must be True or False\.$"):
        LLM(tiny_llama_path, dtype="float32").generate([[5, 6]], SamplingParams(max_tokens=2), use_tqdm="yes")

"""Shared fixtures: small random-initialised Hugging Face models saved with save_pretrained, and
throwaway proposers registered by hand (and unregistered afterwards)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.policy import SpeculationPolicy

TINY_VOCAB = 96


def _import_triton_interpreted() -> None:
    """Without CUDA, import triton first under ``TRITON_INTERPRET=1``: its standard library's jit functions
    (``tl.cdiv``, ``tl.max``, ...) are made for the interpreter only when triton is first imported that way, and a
    kernel module copied for the interpreter later (``interpreted_copy``) cannot call them otherwise ("Cannot call
    @triton.jit'd outside of the scope of a kernel"), e.g. after a session fixture saved a Hugging Face model (which
    imports triton through torch._inductor). Without CUDA no kernel is compiled, so nothing else changes."""
    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        import triton.language  # noqa: F401


_import_triton_interpreted()


@contextlib.contextmanager
def _interpreted_copy(path: str | Path):
    """A private copy of the Triton kernel module at ``path`` whose kernels run in the Triton interpreter while the
    context lasts (the package's own module stays compiled for CUDA)."""
    path = Path(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        spec = importlib.util.spec_from_file_location(f"_specdec_{path.stem}_interpreted", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module


@pytest.fixture(scope="session")
def interpreted_copy():
    """``interpreted_copy(path)``: a context manager yielding an interpreted copy of a Triton kernel module (CPU
    tests of kernels; skip them where CUDA is present, the compiled kernels are tested there)."""
    return _interpreted_copy

# The test models are tiny: one intra-op thread is fastest, and it keeps the suite from
# oversubscribing CI's two cores.
torch.set_num_threads(1)


def _save_model(config, path: Path, seed: int) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # A wide init makes logits peaked, so float32 near-ties between a 1-token step and a
    # (k+1)-token verify pass are vanishingly rare and greedy comparisons are exact.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25)
    model.save_pretrained(path)
    return str(path)


def _common(**extra):
    return dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, **extra)


def scheduled_policy(llm, schedule: set[int], plain_reason: str = "slower") -> None:
    """``llm``'s auto policy drafts on the decode steps (counted per engine) in ``schedule`` only, plain elsewhere
    (with ``plain_reason``), whatever it measures (its own state still kept going), and never has a plain step queue
    the next one."""
    policy, real = llm.policy, llm.policy.plan
    step = iter(range(10 ** 6))

    def plan(req_ids, sampled=False, remaining=None):
        real(req_ids, sampled, remaining)
        n = next(step)
        policy._planned = {r: (policy.k if n in schedule else 0) for r in req_ids}
        policy.plain_reason = "" if n in schedule else plain_reason
        return [policy._planned[r] for r in req_ids]

    policy.plan = plan
    policy.would_draft = lambda *a, **kw: False


def bare_step_run(path: str, recording: type, head: str, batch: int, bare_after: int, monkeypatch,
                  schedule: set[int], prompts: list, params: list, plain_reason: str = "slower"
                  ) -> tuple[list[list[int]], list, list[list[int]]]:
    """Generate ``prompts`` with the proposer class ``recording`` (registered; ``head``, k = 3, the auto policy
    drafting on ``schedule``'s steps only, plain elsewhere with ``plain_reason``: :func:`scheduled_policy`) where a
    plain run goes bare past ``bare_after`` steps, on the CPU too. Returns the outputs' token ids, what
    ``recording.calls`` gathered over the run, and per recompute of bare steps (``forward_hidden``) its tokens a
    request."""
    import specdec.engine
    from specdec import LLM

    monkeypatch.setattr(specdec.engine, "BARE_AFTER", bare_after)
    monkeypatch.setattr(specdec.engine, "BARE_DEVICES", ("cuda", "cpu"))  # on by default on CUDA only
    recording.calls = []
    llm = LLM(path, {"method": recording.method, "num_speculative_tokens": 3, "model": head,
                     "speculation_policy": "auto"}, dtype="float32", max_num_seqs=batch)
    scheduled_policy(llm, schedule, plain_reason)
    recomputed = []
    real = llm.target.forward_hidden

    def spy(slots, tokens, starts, hidden):
        recomputed.append([len(t) for t in tokens])
        return real(slots, tokens, starts, hidden)

    llm.target.forward_hidden = spy
    return [o.token_ids for o in llm.generate(prompts, params)], list(recording.calls), recomputed


def exact_two_token_marginals(path: str, prompt: list[int], temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact float64 marginals of the first two generated tokens at ``temperature`` (plain HF forwards
    over every possible first token)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    with torch.no_grad():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        seqs = torch.cat([torch.tensor([prompt]).repeat(TINY_VOCAB, 1), torch.arange(TINY_VOCAB)[:, None]], 1)
        p2_given = torch.softmax(hf(seqs).logits[:, -1] / temperature, -1)  # [V, V]
    return p1.numpy(), (p1[:, None] * p2_given).sum(0).numpy()


class AlternatingPolicy(SpeculationPolicy):
    """A speculation policy that drafts on two decisions out of six, so a skippable proposer misses four steps
    at a time (the engine hands over their hidden states at its next call)."""

    n = -1

    def plan(self, req_ids, sampled=False, remaining=None):
        self.n += 1
        widths = [self.k if self.n % 6 < 2 else 0] * len(req_ids)
        self._planned = dict(zip(req_ids, widths))
        return widths


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> str:
    """A 3-layer Llama (GQA) with a 96-token vocabulary; EOS id 1."""
    from transformers import LlamaConfig

    return _save_model(LlamaConfig(**_common()), tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_path(tmp_path_factory) -> str:
    """A 3-layer Qwen3 (q/k norms, explicit head_dim) with the same vocabulary."""
    from transformers import Qwen3Config

    return _save_model(Qwen3Config(**_common(head_dim=16)), tmp_path_factory.mktemp("tiny-qwen3"), seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory) -> str:
    """A 3-layer Qwen2 (qkv bias) with the same vocabulary."""
    from transformers import Qwen2Config

    return _save_model(Qwen2Config(**_common()), tmp_path_factory.mktemp("tiny-qwen2"), seed=2)


@pytest.fixture
def register_proposer():
    """Register proposer classes by hand for one test; they are unregistered afterwards."""
    import specdec

    names = []

    def register(*classes, name=None):
        class _Plugin:
            @specdec.hookimpl
            def specdec_register_proposers(self, register):
                for cls in classes:
                    register(cls)

        plugin_name = name or f"test-plugin-{len(names)}-{classes[0].method}"
        specdec.register_plugin(_Plugin(), name=plugin_name)
        names.append(plugin_name)
        return plugin_name

    yield register
    for n in names:
        specdec.unregister_plugin(n)


@pytest.fixture
def no_rejection_sampler(monkeypatch):
    """specdec.verify's RejectionSampler made to fail: a test that takes it proves its steps went another way."""
    import specdec.verify

    def no_sampler(*a, **k):
        raise AssertionError("a step without drafts went through the rejection sampler")

    monkeypatch.setattr(specdec.verify.RejectionSampler, "forward", no_sampler)


@pytest.fixture(scope="session")
def tiny_llama_draft_path(tmp_path_factory) -> str:
    """A 1-layer Llama sharing the tiny models' vocabulary: a draft for draft_model tests."""
    from transformers import LlamaConfig

    config = LlamaConfig(**{**_common(), "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64})
    return _save_model(config, tmp_path_factory.mktemp("tiny-llama-draft"), seed=3)


def pytest_collection_modifyitems(session, config, items):
    """Run the Triton-interpreter parity tests first: before :func:`_import_triton_interpreted`, the first import
    of triton (through ``torch._inductor``, which Hugging Face's ``generate()`` imports) decided whether the
    interpreter could run kernels from a freshly loaded module in the same process; the order stays as a second
    guard."""
    items.sort(key=lambda item: 0 if item.path.name in ("test_rejection_triton.py", "test_fused.py") else 1)

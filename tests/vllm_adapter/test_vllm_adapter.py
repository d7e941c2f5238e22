"""specdec_vllm.SpecdecProposer driven as vLLM drives it, without vLLM: a simulated persistent batch (rows reused,
condensed, reordered, chunked prefills) and its drafts compared with the same method run with the true request ids.
The tests that run inside vLLM itself are in tests_vllm/ (``make test-vllm``)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from specdec_vllm import Ngram, SpecdecProposer, Suffix, TokenOnlyError, methods, read_settings
from vllm_sim import SimBatch, SimRequest

import specdec
from specdec import DraftValidationError


def vllm_config(k: int = 4, max_model_len: int = 96, vocab: int = 16) -> SimpleNamespace:
    """The parts of vLLM's VllmConfig the adapter reads."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab))


def _arctic() -> bool:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


class TrueIds:
    """The reference: the same method driven with the simulation's true request ids (added when first seen,
    removed when gone), proposing over the same rows."""

    def __init__(self, settings: dict, k: int, max_model_len: int) -> None:
        self.proposer, _ = specdec_vllm_build(settings, k)
        self.k, self.max_model_len, self.seen = k, max_model_len, set()

    def propose(self, sim: SimBatch, sampled: list[list[int]]) -> list[list[int]]:
        now = [r.req_id for r in sim.rows]
        for gone in self.seen - set(now):
            self.proposer.remove_request(gone)
        b = len(now)
        for i, rid in enumerate(now):
            if rid not in self.seen:
                self.proposer.add_request(rid, sim.token_ids_cpu[i, : sim.num_tokens_no_spec[i] - len(sampled[i])])
        self.seen = set(now)
        n = sim.num_tokens_no_spec[:b]
        batch = specdec.DraftBatch(req_ids=now, token_ids=sim.token_ids_cpu[:b], num_tokens=n,
                                   sampled_token_ids=sampled, num_speculative_tokens=self.k,
                                   max_model_len=self.max_model_len)
        lists = self.proposer.propose(batch).to_lists()
        return [d[: min(self.k, self.max_model_len - int(m))] if s else [] for d, m, s in zip(lists, n, sampled)]


def specdec_vllm_build(settings: dict, k: int):
    from specdec_vllm import build_proposer

    return build_proposer(settings, k)


def drive(adapter: SpecdecProposer, sim: SimBatch, requests: list[SimRequest], seed: int,
          reference: TrueIds | None = None, max_num_seqs: int = 4) -> int:
    """Run every request through the simulated batch with the adapter's drafts; check each step's drafts (and the
    reference's, when given). Returns how many drafts the toy target accepted."""
    rng = np.random.default_rng(seed)
    pending, accepted, k = list(requests), 0, adapter.k
    while pending or sim.rows:
        for r in sim.finished():
            sim.remove(r)
        while pending and sum(r is not None for r in sim.rows) < max_num_seqs and rng.random() < 0.7:
            sim.add(pending.pop(0))
        sim.condense()
        if len(sim.rows) >= 2 and rng.random() < 0.25:
            i, j = rng.choice(len(sim.rows), 2, replace=False)
            sim.swap(int(i), int(j))
        if not sim.rows:
            continue
        before = [len(r.output) for r in sim.rows]
        drafted = [len(r.drafts) for r in sim.rows]
        sampled = sim.step()
        accepted += sum(max(0, len(r.output) - b - 1) for r, b, d in zip(sim.rows, before, drafted) if d)
        drafts = adapter.propose(sampled, sim.num_tokens_no_spec, sim.token_ids_cpu, slot_mappings=None)
        assert len(drafts) == len(sim.rows)
        for d, s, n in zip(drafts, sampled, sim.num_tokens_no_spec):
            assert isinstance(d, list) and len(d) <= min(k, sim.max_model_len - int(n))
            assert all(isinstance(t, int) and 0 <= t < sim.vocab for t in d)
            if not s:
                assert d == []
        if reference is not None:
            assert drafts == reference.propose(sim, sampled)
        for r, d in zip(sim.rows, drafts):
            r.drafts = d
    return accepted


def _requests(seed: int, count: int = 24, vocab: int = 16, repeat: bool = False) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    base = [rng.integers(0, vocab, size=int(rng.integers(3, 24))).tolist() for _ in range(count)]
    if repeat:  # the same prompts again: requests that repeat earlier ones (suffix's global tree)
        base = base[: count // 2] * 2
    return [SimRequest(f"t{i}", p, max_tokens=int(rng.integers(1, 40)), prefill_steps=int(rng.integers(1, 3)))
            for i, p in enumerate(base)]


METHODS = [
    pytest.param({"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}, id="ngram-scan"),
    pytest.param({"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3, "index": "incremental"},
                 id="ngram-incremental"),
    pytest.param({"method": "copycat"}, id="copycat"),
    pytest.param({"method": "suffix"}, id="suffix",
                 marks=pytest.mark.skipif(not _arctic(), reason="arctic-inference is not installed: make install")),
]


@pytest.mark.parametrize("settings", METHODS)
@pytest.mark.parametrize("seed", [0, 1])
def test_drafts_equal_the_method_run_with_true_request_ids(settings, seed):
    """Rows reused, condensed and swapped, chunked prefills, repeated prompts: every step's drafts equal those of
    the same method told the true request ids, so its per-request state follows vLLM's rows."""
    k, max_model_len = 4, 96
    adapter = SpecdecProposer(vllm_config(k, max_model_len), settings=settings)
    reference = TrueIds(settings, k, max_model_len)
    accepted = drive(adapter, SimBatch(4, max_model_len, seed=seed), _requests(seed, repeat=True), seed, reference)
    assert accepted > 0


@pytest.mark.parametrize("index", ["scan", "incremental"])
def test_ngram_drafts_are_vllms_rule(index):
    """Through the adapter, ngram drafts what vLLM's prompt lookup drafts (find_longest_ngram, the left-most
    match) for every decoding row."""
    from specdec_ngram import find_longest_ngram

    adapter = Ngram(vllm_config(4, 96), settings={"prompt_lookup_min": 1, "prompt_lookup_max": 3, "index": index})
    sim = SimBatch(4, 96, seed=3)
    for r in _requests(3, count=4):
        sim.add(r)
    for _ in range(12):
        sampled = sim.step()
        drafts = adapter.propose(sampled, sim.num_tokens_no_spec, sim.token_ids_cpu)
        for i, (d, s) in enumerate(zip(drafts, sampled)):
            n = int(sim.num_tokens_no_spec[i])
            want = find_longest_ngram(sim.token_ids_cpu[i, :n], 1, 3, 4, 96).tolist() if s else []
            assert d == want
            sim.rows[i].drafts = d


def test_arrays_are_not_copied(register_proposer):
    """The proposer sees views of vLLM's arrays (same memory), rows 0..B-1."""
    seen = {}

    class Peek(specdec.Proposer):
        method = "peek_rows"

        def propose(self, batch):
            seen["ids"], seen["num"] = batch.token_ids, batch.num_tokens
            return specdec.Drafts.empty(batch.batch_size)

    register_proposer(Peek)
    sim = SimBatch(4, 32)
    sim.add(SimRequest("a", [1, 2, 3], max_tokens=5))
    sampled = sim.step()
    SpecdecProposer(vllm_config(2, 32), settings={"method": "peek_rows"}).propose(
        sampled, sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert np.shares_memory(seen["ids"], sim.token_ids_cpu) and np.shares_memory(seen["num"], sim.num_tokens_no_spec)
    assert seen["ids"].shape == (1, 32) and seen["num"].shape == (1,)


def test_bad_drafts_never_reach_vllm(register_proposer):
    """Ids outside the vocabulary, more than k drafts, drafts for prefilling rows or past max_model_len: refused
    with the plugin named (on_bad_drafts="error"), or dropped / cut ("drop")."""

    class Wild(specdec.Proposer):
        method = "wild_drafts"

        def propose(self, batch):
            return specdec.Drafts.from_lists([[99, 1], [2, 3], [4, 5]], batch.num_speculative_tokens)

    class TooMany(specdec.Proposer):
        method = "too_many_drafts"

        def propose(self, batch):
            return specdec.Drafts.from_lists([[1] * 9] * batch.batch_size)

    register_proposer(Wild, TooMany)
    sim = SimBatch(4, 8)
    sim.add(SimRequest("a", [1, 2, 3], max_tokens=5))
    sim.add(SimRequest("b", [1, 2, 3, 4, 5, 6, 7], max_tokens=5))  # one token from max_model_len after this step
    sim.add(SimRequest("c", [1, 2], max_tokens=5, prefill_steps=2))
    sampled = sim.step()
    args = (sampled, sim.num_tokens_no_spec, sim.token_ids_cpu)
    with pytest.raises(DraftValidationError, match="wild_drafts.*outside the vocabulary"):
        SpecdecProposer(vllm_config(2, 8), settings={"method": "wild_drafts"}).propose(*args)
    dropped = SpecdecProposer(vllm_config(2, 8), settings={"method": "wild_drafts", "on_bad_drafts": "drop"})
    assert dropped.propose(*args) == [[], [], []]  # row 1: no room left; row 2: prefilling
    sim.num_tokens_no_spec[1] = 7
    assert dropped.propose(*args) == [[], [2], []]  # one position left before max_model_len
    with pytest.raises(DraftValidationError, match="too_many_drafts"):
        SpecdecProposer(vllm_config(2, 8), settings={"method": "too_many_drafts"}).propose(*args)


def test_token_trees_become_their_first_chain(register_proposer):
    """vLLM verifies chains: a proposer's token tree is cut to its first-child chain (then to k)."""

    class Tree(specdec.Proposer):
        method = "tree_drafts"

        def propose(self, batch):
            # root -> 5 -> 6 -> 7, root -> 9 (second branch), 5 -> 8
            ids = torch.tensor([[5, 9, 6, 8, 7]] * batch.batch_size)
            parents = torch.tensor([[-1, -1, 0, 0, 2]] * batch.batch_size)
            return specdec.Drafts(token_ids=ids, num_draft_tokens=[5] * batch.batch_size, parents=parents)

    register_proposer(Tree)
    sim = SimBatch(2, 32)
    sim.add(SimRequest("a", [1, 2, 3], max_tokens=5))
    out = SpecdecProposer(vllm_config(2, 32), settings={"method": "tree_drafts"}).propose(
        sim.step(), sim.num_tokens_no_spec, sim.token_ids_cpu)
    assert out == [[5, 6]]


@pytest.mark.skipif(not _arctic(), reason="arctic-inference is not installed: make install")
def test_suffix_learns_from_earlier_requests():
    """suffix keeps earlier responses in its global tree across vLLM's rows: a repeated request drafts (and the toy
    target accepts) more than its first run; reset() forgets them."""
    first = drive(Suffix(vllm_config()), SimBatch(4, 96, seed=5), _requests(5, count=6), 5)
    adapter = Suffix(vllm_config())
    sim = SimBatch(4, 96, seed=5)
    drive(adapter, sim, _requests(5, count=6), 5)
    again = drive(adapter, sim, _requests(5, count=6), 5)
    assert again > first
    adapter.reset()  # the global tree emptied: as a fresh engine again
    assert drive(adapter, SimBatch(4, 96, seed=5), _requests(5, count=6), 5) == first


def test_refuses_methods_that_need_a_model_or_hidden_states(register_proposer):
    """A draft-model method and a hidden-state method are refused, naming the method and vLLM's own methods."""

    class Hidden(specdec.Proposer):
        method = "needs_hidden"

        def hidden_states_needed(self):
            return specdec.HiddenStateRequest()

        def propose(self, batch):
            raise AssertionError("never called")

    class Model(specdec.Proposer):
        method = "needs_model"
        takes_draft_model = True

        def propose(self, batch):
            raise AssertionError("never called")

    register_proposer(Hidden, Model)
    with pytest.raises(TokenOnlyError, match="'needs_hidden'.*hidden states.*eagle3"):
        SpecdecProposer(vllm_config(), settings={"method": "needs_hidden"})
    with pytest.raises(TokenOnlyError, match="'needs_model'.*draft model"):
        SpecdecProposer(vllm_config(), settings={"method": "needs_model"})
    with pytest.raises(TokenOnlyError, match="token-only"):
        SpecdecProposer(vllm_config(), settings={"method": "ngram", "model": "/some/draft"})


@pytest.mark.parametrize("method", ["eagle3", "medusa", "dflash", "draft_model", "extract_hidden_states"])
def test_refuses_the_bundled_model_methods(method):
    if method not in specdec.available_methods():
        pytest.skip(f"plugin for {method} not installed")
    with pytest.raises(TokenOnlyError, match=repr(method)):
        methods.adapter_class(method)(vllm_config())


def test_settings_from_the_environment(tmp_path, monkeypatch):
    """SPECDEC_VLLM_CONFIG (a file), SPECDEC_VLLM_METHOD and SPECDEC_VLLM_OPTIONS, later ones overriding."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "copycat", "prompt_lookup_min": 2}))
    env = {"SPECDEC_VLLM_CONFIG": str(path), "SPECDEC_VLLM_METHOD": "ngram",
           "SPECDEC_VLLM_OPTIONS": '{"prompt_lookup_max": 3, "index": "incremental"}'}
    assert read_settings(environ=env) == {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 3,
                                          "index": "incremental"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    adapter = SpecdecProposer(vllm_config(3))
    assert adapter.config.method == "ngram" and adapter.config.prompt_lookup_min == 2 and adapter.k == 3
    assert Ngram(vllm_config()).config.index == "incremental"
    with pytest.raises(ValueError, match="runs method 'copycat'.*asks for method 'ngram'"):
        methods.copycat(vllm_config())


@pytest.mark.parametrize("env, match", [
    ({}, "no specdec method given"),
    ({"SPECDEC_VLLM_METHOD": "ngram", "SPECDEC_VLLM_OPTIONS": "{bad"}, "not valid JSON"),
    ({"SPECDEC_VLLM_METHOD": "ngram", "SPECDEC_VLLM_OPTIONS": "[1]"}, "must be a JSON object"),
    ({"SPECDEC_VLLM_CONFIG": "/no/such/spec.json"}, "SPECDEC_VLLM_CONFIG='/no/such/spec.json'.*does not exist"),
])
def test_settings_errors_name_the_variable(env, match):
    with pytest.raises(ValueError, match=match):
        read_settings(environ=env)


def test_config_errors():
    with pytest.raises(ValueError, match="num_speculative_tokens=5.*vLLM's speculative_config has "
                                         "num_speculative_tokens=4"):
        SpecdecProposer(vllm_config(4), settings={"method": "ngram", "num_speculative_tokens": 5})
    with pytest.raises(specdec.UnknownMethodError, match="'ngrm'"):
        SpecdecProposer(vllm_config(), settings={"method": "ngrm"})
    with pytest.raises(ValueError, match="prompt_lookup_mn"):
        Ngram(vllm_config(), settings={"prompt_lookup_mn": 1})


def test_class_paths_per_method():
    """vLLM resolves "specdec_vllm.methods.<name>" with getattr: one class per method name."""
    assert methods.copycat is methods.copycat and methods.copycat.method == "copycat"
    assert issubclass(methods.suffix, SpecdecProposer) and methods.suffix.__module__ == "specdec_vllm.methods"
    with pytest.raises(AttributeError):
        methods._private  # noqa: B018
    with pytest.raises(ValueError, match="identifiers"):
        methods.adapter_class("not-a-name")


def test_importing_the_adapter_does_not_import_vllm_or_numba():
    # numba loaded before vLLM's CPU worker starts breaks it (the worker walks the loaded modules for Triton
    # kernels and trips on llvmlite's objects): the adapter loads it only when a proposer first drafts.
    code = ("import sys, specdec_vllm, specdec_vllm.methods, specdec_vllm.proposer, specdec_vllm.rows; "
            "sys.exit(str(sorted(m for m in ('vllm', 'numba', 'llvmlite') if m in sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.strip() == "[]", run.stderr

"""Bare steps (issue 24): in a long plain run a hidden-state method's engine (on CUDA; here the CPU is let in)
stops collecting the target's hidden states after ``BARE_AFTER`` steps and recomputes them (``forward_hidden``:
reads the cache, writes nothing) before the proposer's next call. Greedy output stays the baseline's; the proposer
is handed what it would have been handed had every plain step collected its states (float32, within 1e-4) and
drafts the same; the cache is untouched by the recompute."""

from __future__ import annotations

import random

import pytest
import torch
from eagle_formats import random_eagle3, write

import specdec.engine
from conftest import TINY_VOCAB, bare_step_run
from specdec import LLM, HiddenStateRequest, SamplingParams
from specdec_eagle.proposer import Eagle3Proposer

rng = random.Random(11)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(5)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=60 + 7 * i, ignore_eos=True) for i in range(len(PROMPTS))]
# decode steps (counted per engine) that draft: a few at first, then after long plain runs
SCHEDULE = {0, 1, 2, 40, 41, 75, 110}


class Recording(Eagle3Proposer):
    """Records, per call, the aux hidden states it is handed (request by request) and its drafts."""

    method = "eagle3_bare_rec"
    calls: list = []

    def propose(self, batch):
        qsl = batch.query_start_loc_cpu
        aux = torch.cat(list(batch.aux_hidden_states), -1)
        got = super().propose(batch)
        Recording.calls.append(([aux[qsl[i]: qsl[i + 1]].clone() for i in range(len(qsl) - 1)],
                                got.token_ids.clone()))
        return got


def _run(tiny_llama_path, head, batch, bare_after, monkeypatch, plain_reason="slower"):
    """bare_step_run with each recompute's tokens summed."""
    out, calls, recomputed = bare_step_run(tiny_llama_path, Recording, head, batch, bare_after, monkeypatch,
                                           SCHEDULE, PROMPTS, PARAMS, plain_reason)
    return out, calls, [sum(n) for n in recomputed]


@pytest.mark.parametrize("batch", [1, 3])
def test_bare_steps_hand_over_what_kept_steps_would(tmp_path, register_proposer, tiny_llama_path, batch,
                                                    monkeypatch):
    register_proposer(Recording)
    head = write(tmp_path / "eagle3", *random_eagle3(TINY_VOCAB, 40, seed=6))
    base = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(PROMPTS, PARAMS)]
    bare, bare_calls, recomputed = _run(tiny_llama_path, head, batch, 8, monkeypatch)
    kept, kept_calls, none = _run(tiny_llama_path, head, batch, 10 ** 9, monkeypatch)
    assert bare == base and kept == base  # greedy output is the baseline's either way
    # each engine's first recompute is its one-token warm-up at the first decode step (LLM._warm_recompute)
    assert recomputed[0] == none[0] == 1
    recomputed, none = recomputed[1:], none[1:]
    assert not none and len(recomputed) >= 2 and sum(recomputed) > 40  # long runs recomputed, the short ones not
    _same_hand_over(bare_calls, kept_calls)


def _same_hand_over(bare_calls, kept_calls):
    """Each proposer call of the two runs got the same aux hidden states (float32, within 1e-4), drafted the same."""
    assert len(bare_calls) == len(kept_calls) > 5
    for (a, da), (b, db) in zip(bare_calls, kept_calls):
        assert [x.shape for x in a] == [x.shape for x in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
        assert torch.equal(da, db)


@pytest.mark.parametrize("batch", [1, 3])
def test_plain_steps_timed_against_drafting_go_bare(tmp_path, register_proposer, tiny_llama_path, batch, monkeypatch):
    """With ``specdec.engine.TIMED_BARE``, plain steps the policy takes to time the plain mode
    (``specdec.policy.TIMED_PLAIN``: its warm-up, re-measurement bursts) run bare from their first step, as a long
    run's steps do (collecting, they timed the plain mode slow: ~0.9 ms against 0.62 at batch 32 on the H100), and
    the switch back recomputes them: output and hand-over as when every step collects. The policy's other plain
    steps collect until BARE_AFTER as before, and so do the timed ones by default."""
    register_proposer(Recording)
    monkeypatch.setattr(specdec.engine, "TIMED_BARE", True)  # off by default (its note says why)
    head = write(tmp_path / "eagle3", *random_eagle3(TINY_VOCAB, 40, seed=6))
    base = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(PROMPTS, PARAMS)]
    timed, timed_calls, recomputed = _run(tiny_llama_path, head, batch, 10 ** 9, monkeypatch, "remeasure")
    kept, kept_calls, none = _run(tiny_llama_path, head, batch, 10 ** 9, monkeypatch, "no_gain")
    assert timed == base and kept == base
    assert none == [1] and recomputed[0] == 1  # the warm-up recompute alone where plain steps are not timed
    assert len(recomputed) >= 3 and sum(recomputed[1:]) > 60  # each plain run before a drafting step, whole
    _same_hand_over(timed_calls, kept_calls)
    monkeypatch.setattr(specdec.engine, "TIMED_BARE", False)  # the default: timed plain steps collect
    _, _, recomputed = _run(tiny_llama_path, head, batch, 10 ** 9, monkeypatch, "remeasure")
    assert recomputed == [1]


@pytest.mark.parametrize("fused", [False, True])
def test_forward_hidden_reads_the_cache_and_writes_nothing(tiny_llama_path, fused, monkeypatch):
    """The recompute equals the states the steps computed, and leaves every cache entry as it was; positions past
    a slot's committed length are refused. With the fused forward on, the recompute runs the Hugging Face modules
    (no Triton kernel compiled per new shape) over the fused forward's cache, with cuDNN's attention off."""
    from specdec.fused import FusedLlama
    from specdec.target import HFTargetModel

    hidden = HiddenStateRequest(last_layer=True, aux_layer_ids=(1, 0))
    m = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64, fused_forward=fused)
    assert (m.fused is not None) == fused
    if fused:
        steps = []
        real = FusedLlama.forward
        monkeypatch.setattr(FusedLlama, "forward", lambda self, ids, *a, **kw: steps.append(ids.shape) or real(
            self, ids, *a, **kw))
    m.allocate(2)
    toks = [[5, 6, 7, 8, 9], [10, 11, 12]]
    first = m.forward([0, 1], toks, [1, 1], hidden)
    for s, t in zip([0, 1], toks):
        m.advance(s, len(t))
    cap = m.cache.scratch  # the scratch position (last) takes every write: nothing reads it
    keys = [k[:, :, :cap].clone() for k in m.cache.keys + m.cache.values]
    again = m.forward_hidden([1, 0], [toks[1][1:], toks[0][2:4]], [1, 2], hidden)
    assert all(torch.equal(k[:, :, :cap], k0) for k, k0 in zip(m.cache.keys + m.cache.values, keys))
    qsl = first.query_start_loc.tolist()
    want = torch.cat((first.hidden_states[qsl[1] + 1: qsl[2]], first.hidden_states[2:4]))
    torch.testing.assert_close(again.hidden_states, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(again.aux_hidden_states, first.aux_hidden_states):
        torch.testing.assert_close(a, torch.cat((b[qsl[1] + 1: qsl[2]], b[2:4])), atol=1e-5, rtol=1e-5)
    if fused:
        assert steps == [(2, 5)]  # the steps' forward only
    # attention without cuDNN's per-shape plans (0.1 s each new shape on the H200), inside the recompute only
    seen = []
    real_eager = m._eager
    monkeypatch.setattr(m, "_eager", lambda *a, **kw: seen.append(torch.backends.cuda.cudnn_sdp_enabled()) or
                        real_eager(*a, **kw))
    m.forward_hidden([0], [toks[0][:2]], [0], hidden)
    assert seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(ValueError, match="must be committed"):
        m.forward_hidden([1], [[1, 2]], [2], hidden)


def test_bare_runs_are_for_cuda_targets_by_default(tmp_path, tiny_llama_path):
    """On the CPU a plain step's forward computes the states anyway: bare runs are off there unless asked."""
    head = write(tmp_path / "eagle3", *random_eagle3(TINY_VOCAB, 40, seed=6))
    llm = LLM(tiny_llama_path, {"method": "eagle3", "num_speculative_tokens": 3, "model": head}, dtype="float32",
              device="cpu")
    assert specdec.engine.BARE_DEVICES == ("cuda",) and not llm._bare_ok

"""Bare steps for Medusa (issue 24): its heads read each request's last accepted position alone
(``HiddenStateRequest.all_positions=False``), so after a long plain run that collected no hidden states (on CUDA;
here the CPU is let in) the engine recomputes that one position a request, not the whole run, and hands it over
alone. Greedy output stays the baseline's; the heads get the state they would have got had every plain step kept
its states (float32, within 1e-4) and draft the same."""

from __future__ import annotations

import random

import pytest
import torch
from medusa_formats import random_fasterdecoding, write

from conftest import TINY_VOCAB, bare_step_run
from specdec import LLM, SamplingParams
from specdec_medusa.proposer import MedusaProposer

rng = random.Random(12)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(5)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=60 + 7 * i, ignore_eos=True) for i in range(len(PROMPTS))]
SCHEDULE = {0, 1, 2, 40, 41, 75, 110}  # decode steps that draft: a few at first, then after long plain runs


class Recording(MedusaProposer):
    """Records, per call, each request's last hidden state handed over, the rows handed over, and the drafts."""

    method = "medusa_bare_rec"
    calls: list = []

    def propose(self, batch):
        got = super().propose(batch)
        Recording.calls.append((batch.hidden_states[batch.last_hidden_indices].clone(), batch.hidden_states.shape[0],
                                got.token_ids.clone()))
        return got


@pytest.mark.parametrize("batch", [1, 3])
def test_bare_runs_recompute_the_last_position_alone(tmp_path, register_proposer, tiny_llama_path, batch,
                                                     monkeypatch):
    register_proposer(Recording)
    head = write(tmp_path / "medusa", *random_fasterdecoding(TINY_VOCAB, heads=3, layers=1, seed=4))
    base = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=batch).generate(PROMPTS, PARAMS)]
    run = (SCHEDULE, PROMPTS, PARAMS)
    bare, bare_calls, recomputed = bare_step_run(tiny_llama_path, Recording, head, batch, 8, monkeypatch, *run)
    kept, kept_calls, none = bare_step_run(tiny_llama_path, Recording, head, batch, 10 ** 9, monkeypatch, *run)
    assert bare == base and kept == base  # greedy output is the baseline's either way
    assert none == [[1]] and recomputed[0] == [1]  # each engine's one-token warm-up at its first decode step
    assert len(recomputed) >= 3 and all(n == [1] * len(n) for n in recomputed[1:])  # one position a request
    assert len(bare_calls) == len(kept_calls) > 5
    fewer = 0
    for (a, rows_a, da), (b, rows_b, db) in zip(bare_calls, kept_calls):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert torch.equal(da, db)
        fewer += rows_a < rows_b
    assert fewer >= 2  # after each long run one row a request was handed over, not the run's

"""The runner example in docs/runner.md (docs/examples/own_model_proposer.py) runs and is lossless."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specdec import LLM, SamplingParams

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "own_model_proposer.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("own_model_proposer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_model_proposer_on_the_public_runner_is_lossless(example, register_proposer, tiny_llama_path,
                                                               tiny_llama_draft_path):
    register_proposer(example.SmallLMProposer)
    prompts = [[5, 9, 11, 2, 7, 3], [8, 8, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = LLM(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4)
    want = [o.token_ids for o in base.generate(prompts, params, use_tqdm=False)]
    spec = LLM(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4,
               speculative_config={"method": "small_lm", "num_speculative_tokens": 3, "model": tiny_llama_draft_path})
    got = [o.token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    assert got == want
    stats = spec.stats
    assert stats.num_draft_tokens > 0
    # The draft is a different random model: it is still checked, and every slot was handed back.
    assert sorted(spec.proposer.free) == list(range(len(spec.proposer.draft.lengths)))


def test_small_model_proposer_drafts_the_target_itself_exactly(example, register_proposer, tiny_llama_path):
    """Drafting with a copy of the target: every draft is accepted, which checks the rollback and catch-up."""
    register_proposer(example.SmallLMProposer)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    spec = LLM(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=2,
               speculative_config={"method": "small_lm", "num_speculative_tokens": 3, "model": tiny_llama_path})
    spec.generate([[5, 9, 11], [4, 4, 2, 7]], params, use_tqdm=False)
    assert spec.stats.num_accepted_tokens == spec.stats.num_draft_tokens > 0

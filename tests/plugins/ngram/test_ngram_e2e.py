"""End to end: speculative greedy decoding with ngram drafts equals the baseline, token for token."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams

# Periodic prompts (ids avoid BOS 0 and EOS 1 of the tiny model): the lookup finds continuations in
# the prompt at once, and greedy decoding of a small random model soon repeats itself too.
PROMPTS = [
    [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7],
    [20, 21, 22, 20, 21, 22, 20, 21, 22, 20, 21],
    [40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42, 43],
    [70, 71, 70, 71, 70, 71, 70, 71, 70],
]
PARAMS = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module")
def baseline(tiny_llama_path):
    llm = specdec.LLM(model=tiny_llama_path, dtype="float32")
    return [out.token_ids for out in llm.generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize(
    "options",
    [
        {"method": "ngram"},
        {"method": "ngram", "index": "incremental"},
        {"method": "ngram", "index": "incremental", "match": "recent", "prompt_lookup_min": 2},
        {"method": "ngram_gpu", "match": "leftmost"},
    ],
    ids=["scan", "incremental", "incremental-recent", "gpu"],
)
def test_greedy_output_matches_baseline(tiny_llama_path, baseline, options):
    config = {"num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3, **options}
    llm = specdec.LLM(model=tiny_llama_path, speculative_config=config, dtype="float32")
    outs = llm.generate(PROMPTS, PARAMS)
    for i, (out, ref) in enumerate(zip(outs, baseline)):
        assert list(out.token_ids) == list(ref), f"request {i} differs from the baseline with {options}"
    assert llm.stats.num_draft_tokens > 0
    assert llm.stats.num_accepted_tokens > 0, "no draft was accepted: the test would prove nothing"


def test_gpu_proposer_on_the_device_token_mirror(tiny_llama_path, baseline):
    """ngram_gpu reads DraftBatch.token_ids_device: the engine's mirror, started on first read and
    updated with each step's tokens. Forced on here (a CPU target normally has none), with two slots
    for four prompts so requests join mid-run and slots are reused."""
    config = {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = specdec.LLM(model=tiny_llama_path, speculative_config=config, dtype="float32", max_num_seqs=2)
    llm._tokens.use_mirror = True
    seen = []
    propose = llm.proposer.propose

    def spy(batch):
        seen.append(batch.token_ids_device is not None and bool(
            (batch.token_ids_device.cpu().numpy() == batch.token_ids).all()))
        return propose(batch)

    llm.proposer.propose = spy
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == baseline
    assert seen and all(seen)  # the mirror held exactly the host ids at every step
    mirror = llm._tokens.mirror
    assert mirror is not None and mirror.data_ptr() != torch.from_numpy(llm._tokens.host).data_ptr()


def test_cpu_proposer_never_starts_the_mirror(tiny_llama_path):
    llm = specdec.LLM(model=tiny_llama_path, speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                      dtype="float32")
    llm._tokens.use_mirror = True
    llm.generate(PROMPTS, PARAMS)
    assert llm._tokens.mirror is None and not llm._tokens.dirty

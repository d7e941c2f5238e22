"""End to end: speculative greedy decoding with ngram drafts equals the baseline, token for token."""

from __future__ import annotations

import pytest

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

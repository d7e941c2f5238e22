"""specdec methods inside vLLM (CPU build) through the adapter: greedy output equals vLLM's without speculation at
batch 1 and 8, with requests joining and leaving mid-run (rows reused, condensed, chunked prefills).

Run by ``make test-vllm`` in .venv-vllm; the log is benchmarks/results/vllm/test-vllm.log.
"""

from __future__ import annotations

import pytest
from vllm_worker import MAX_NUM_SEQS, K

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm`, which builds .venv-vllm")


def _arctic() -> bool:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


NGRAM_1_3 = '{"prompt_lookup_min": 1, "prompt_lookup_max": 3}'
# (class path, environment): the three ways to name a method, each with its options from the environment.
METHODS = [
    pytest.param(("specdec_vllm.Ngram", {"SPECDEC_VLLM_OPTIONS": NGRAM_1_3}), id="ngram"),
    pytest.param(("specdec_vllm.SpecdecProposer",
                  {"SPECDEC_VLLM_METHOD": "ngram",
                   "SPECDEC_VLLM_OPTIONS": '{"prompt_lookup_min": 1, "prompt_lookup_max": 3, "index": "incremental"}'}),
                 id="ngram-incremental"),
    pytest.param(("specdec_vllm.methods.suffix", {}), id="suffix",
                 marks=pytest.mark.skipif(not _arctic(), reason="arctic-inference is not installed in this venv")),
    pytest.param(("specdec_vllm.methods.copycat", {}), id="copycat"),
]


def _runs() -> list[dict]:
    """Prompts from held-out standard-library files. Batch 1: four requests, one per call. Batch 8: 20 requests at
    once (8 completions, then groups of the same prompt twice and a near-duplicate) of different lengths, so
    requests finish at different steps and the queued ones take their rows mid-run."""
    from transformers import AutoTokenizer

    import specdec
    from specdec_tools.bench.workloads import build_workloads

    tok = AutoTokenizer.from_pretrained(str(specdec.bundled_model("tiny")))
    completion, repeated = build_workloads(tok, ["completion", "repeated"], num_prompts=12, batch=4,
                                           prompt_tokens=192)
    batch8 = completion.prompts[:8] + repeated.prompts
    return [{"name": "batch1", "batch": 1, "prompts": completion.prompts[:2] + repeated.prompts[:2],
             "max_tokens": [48] * 4},
            {"name": "batch8", "batch": 8, "prompts": batch8, "max_tokens": [16 + 13 * (i % 7) for i in
                                                                             range(len(batch8))]}]


RUNS = _runs()


@pytest.fixture(scope="module")
def baseline(run_engine) -> dict:
    """vLLM without speculation, same settings: the outputs every method must reproduce."""
    return run_engine({"speculative_config": None, "runs": RUNS})["runs"]


@pytest.fixture(scope="module", params=METHODS)
def adapted(request, run_engine) -> dict:
    """One vLLM engine per adapted method, its options in the environment while vLLM builds the adapter."""
    path, env = request.param
    result = run_engine({"env": env, "speculative_config": {"model": path, "num_speculative_tokens": K},
                         "runs": RUNS})
    assert "error" not in result, result.get("error")
    return result["runs"]


def _first_difference(got: list[list[int]], want: list[list[int]]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            j = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            return f"request {i} differs at token {j}: {g[j:j + 5]} vs baseline {w[j:j + 5]}"
    return f"{len(got)} outputs vs {len(want)}"


@pytest.mark.parametrize("run", ["batch1", "batch8"])
def test_greedy_output_equals_vllm_without_speculation(adapted, baseline, run):
    runs = adapted
    got, want = runs[run]["outputs"], baseline[run]["outputs"]
    log, counters = runs[run]["log"], runs[run]["counters"]
    drafted, accepted = counters["vllm:spec_decode_num_draft_tokens"], counters["vllm:spec_decode_num_accepted_tokens"]
    print(f"\n{run}: {len(got)} requests, {log['calls']} propose calls, up to {log['max_rows']} rows, "
          f"{log['prefill_rows']} prefill rows, {log['moved']} row moves; vLLM counted {drafted:.0f} drafted, "
          f"{accepted:.0f} accepted; the adapter returned {log['drafted']} drafts, saw {log['accepted']} accepted")
    assert got == want, _first_difference(got, want)
    assert drafted > 0 and accepted > 0 and log["accepted"] == accepted
    # Every request was one request id for the adapter, from its first step to its last: none was taken for
    # another (rows reused) or restarted (rows moved, chunked prefill).
    assert len(log["req_ids"]) == len(got)
    if run == "batch8":
        assert log["max_rows"] == MAX_NUM_SEQS and log["prefill_rows"] > 0


def test_specdec_ngram_drafts_what_vllms_ngram_drafts(run_engine):
    """Same rule, same drafts: vLLM's own ngram and specdec's through the adapter (k=4, n in 1..3) draft and accept
    the same number of tokens at batch 1 and 8."""
    ours = run_engine({"env": {"SPECDEC_VLLM_OPTIONS": NGRAM_1_3}, "runs": RUNS,
                       "speculative_config": {"model": "specdec_vllm.methods.ngram", "num_speculative_tokens": K}})
    theirs = run_engine({"runs": RUNS, "speculative_config": {"method": "ngram", "prompt_lookup_min": 1,
                                                              "prompt_lookup_max": 3, "num_speculative_tokens": K}})
    for run in ("batch1", "batch8"):
        assert ours["runs"][run]["outputs"] == theirs["runs"][run]["outputs"]
        assert ours["runs"][run]["counters"] == theirs["runs"][run]["counters"]


@pytest.mark.parametrize("method, says", [
    ("eagle3", "reads the target's hidden states"),
    ("draft_model", "drafts with a draft model"),
])
def test_methods_that_need_more_than_tokens_are_refused_inside_vllm(run_engine, method, says):
    import specdec

    if method not in specdec.available_methods():
        pytest.skip(f"the plugin providing {method!r} is not installed in this venv")
    result = run_engine({"speculative_config": {"model": f"specdec_vllm.methods.{method}",
                                                "num_speculative_tokens": K}, "runs": []})
    assert "error" in result and any(says in text and repr(method) in text for text in result["error"]), result

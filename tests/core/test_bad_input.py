"""Bad input: each error names the value, the rule and the fix; the engine stays usable afterwards."""

from __future__ import annotations

import pytest

from specdec import LLM, SamplingParams, UnknownMethodError


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(tiny_llama_path, dtype="float32", max_model_len=64)


GOOD = [[5, 6, 7], [8, 9]]


@pytest.mark.parametrize("prompts,error,fragment", [
    ([[5, 6], []], ValueError, "prompt 1 is empty: every prompt needs at least one token"),
    ([[5, 96]], ValueError, "prompt 0 has token id 96 outside the vocabulary [0, 96)"),
    ([[5, -1]], ValueError, "prompt 0 has token id -1 outside the vocabulary [0, 96)"),
    ([[5] * 64], ValueError, "prompt 0 has 64 tokens but max_model_len=64 leaves no room"),
    (["hello"], ValueError, "prompt 0 is a string but the model has no tokenizer"),
    ([], ValueError, "prompts is an empty list"),
    ([3.5], TypeError, "prompt 0 has type float"),
])
def test_bad_prompts_then_good_batch_still_works(llm, prompts, error, fragment):
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with pytest.raises(error) as err:
        llm.generate(prompts, params)
    assert fragment in str(err.value)
    outs = llm.generate(GOOD, params)
    assert [len(o.token_ids) for o in outs] == [4, 4]


@pytest.mark.parametrize("kwargs,fragment", [
    ({"temperature": -0.5}, "temperature=-0.5 is invalid: it must be a number >= 0"),
    ({"top_p": 0.0}, "top_p=0.0 is invalid: it must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p=1.5 is invalid: it must be in (0, 1]"),
    ({"top_k": -3}, "top_k=-3 is invalid"),
    ({"max_tokens": 0}, "max_tokens=0 is invalid: it must be an int >= 1"),
    ({"stop_token_ids": [-2]}, "stop_token_ids=[-2] is invalid"),
])
def test_sampling_params_validation(kwargs, fragment):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert fragment in str(err.value)


def test_sampling_params_count_mismatch(llm):
    with pytest.raises(ValueError, match="got 3 SamplingParams for 2 prompts"):
        llm.generate(GOOD, [SamplingParams()] * 3)


@pytest.mark.parametrize("config,error,fragment", [
    ({"method": "dflsh", "num_speculative_tokens": 3}, UnknownMethodError, "Unknown method 'dflsh'. Installed:"),
    ({"method": "copycat", "num_speculative_tokens": 0}, ValueError, "num_speculative_tokens=0 is invalid"),
    ({"method": "copycat", "num_speculative_tokens": "3"}, ValueError, "num_speculative_tokens='3' is invalid"),
    ({"method": "copycat", "num_speculative_tokens": 3, "bogus": 1}, ValueError,
     "Unknown option(s) ['bogus'] for method 'copycat'. Valid options: min_history"),
])
def test_bad_speculative_config(tiny_llama_path, config, error, fragment):
    with pytest.raises(error) as err:
        LLM(tiny_llama_path, config, dtype="float32")
    assert fragment in str(err.value)


def test_bad_engine_arguments(tiny_llama_path):
    with pytest.raises(ValueError, match="max_num_seqs=0 is invalid"):
        LLM(tiny_llama_path, max_num_seqs=0)
    with pytest.raises(ValueError, match=r"prefill_graph_tokens=-1 is invalid: it must be an int >= 0 \(0 turns"):
        LLM(tiny_llama_path, prefill_graph_tokens=-1)
    with pytest.raises(ValueError, match=r"admit_group=0 is invalid: it must be an int >= 1 \(the free slots that "
                                         r"let waiting requests join\) or None \(max_num_seqs // 4\)"):
        LLM(tiny_llama_path, admit_group=0)
    with pytest.raises(ValueError, match="dtype='float8' is invalid"):
        LLM(tiny_llama_path, dtype="float8")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM("/no/such/model")


def test_check_int_names_value_rule_and_hint():
    from specdec.errors import check_int

    assert check_int("k", 3, 1) == 3
    with pytest.raises(ValueError, match=r"^k=0 is invalid: it must be an int >= 1\.$"):
        check_int("k", 0, 1)
    with pytest.raises(ValueError, match=r"^k=True is invalid: it must be an int >= 0 \(a bool is not\)\.$"):
        check_int("k", True, 0, "(a bool is not)")
    with pytest.raises(ValueError, match=r"^k=2\.0 is invalid: it must be an int >= 1\.$"):
        check_int("k", 2.0, 1)

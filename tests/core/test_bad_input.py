"""Bad input: each error names the value, the rule and the fix; the engine stays usable afterwards."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

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
    # Issue 18: float ids ran truncated, bools ran as ids, strings and nested lists gave int() errors
    # with no prompt index, arrays of the wrong shape or dtype ran or failed the same way.
    ([[1.5, 2.7]], TypeError, "prompt 0 has 1.5 (float) at position 0: token ids must be ints"),
    ([[5, 6], [5, 2.0]], TypeError, "prompt 1 has 2.0 (float) at position 1: token ids must be ints"),
    ([[5, True]], TypeError, "prompt 0 has True (bool) at position 1: token ids must be ints (a bool or"),
    ([["a"]], TypeError, "prompt 0 has 'a' (str) at position 0: token ids must be ints"),
    ([[5], [[1, 2]]], TypeError, "prompt 1 has [1, 2] (list) at position 0: token ids must be ints (a bool or a "
                                 "float is not one); a prompt is a flat list of ints"),
    ([[5, None]], TypeError, "prompt 0 has None (NoneType) at position 1"),
    ([np.array([[1, 2], [3, 4]])], ValueError, "prompt 0 is a numpy array of shape (2, 2): a prompt must be 1-D"),
    ([[5], torch.tensor([[1, 2]])], ValueError, "prompt 1 is a tensor of shape (1, 2): a prompt must be 1-D"),
    ([np.array([1.0, 2.0])], TypeError, "prompt 0 is a numpy array of dtype float64: token ids must be ints; pass "
                                        "x.astype(np.int64)"),
    ([torch.tensor([True, False])], TypeError, "prompt 0 is a tensor of dtype torch.bool: token ids must be ints"),
    ([[5, 10**30]], ValueError, f"prompt 0 has token id {10**30} outside the vocabulary [0, 96) at position 1"),
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


@pytest.mark.parametrize("kwargs,error,fragment", [
    # Issue 18: nan ran greedy alone and at T=1 next to a sampled request; inf sampled uniform
    # noise; a float32-denormal temperature made every token 0.
    ({"temperature": float("nan")}, ValueError, "temperature=nan is invalid: it must be a number >= 0, either 0 "
                                                "(greedy) or between 1e-06 and 10000. Pass temperature=0.0"),
    ({"temperature": float("inf")}, ValueError, "temperature=inf is invalid"),
    ({"temperature": 1e-40}, ValueError, "temperature=1e-40 is invalid"),
    ({"temperature": 10**400}, ValueError, "temperature=<int of about 400 digits> is invalid: it is too large"),
    ({"temperature": True}, TypeError, "temperature=True is invalid: it must be a number, not bool"),
    ({"temperature": "0.5"}, TypeError, "temperature='0.5' is invalid: it must be a number, not str"),
    ({"top_p": True}, TypeError, "top_p=True is invalid: it must be a number, not bool"),
    # top_k=2**63 and seed=2**70 failed at generate time ("Overflow when unpacking long long").
    ({"top_k": 2**63}, ValueError, "top_k=9223372036854775808 is invalid: it must be an int >= -1 and <= 2147483647"),
    ({"top_k": 2.0}, TypeError, "top_k=2.0 is invalid: it must be an int, not float"),
    ({"seed": 2**70}, ValueError, "seed=1180591620717411303424 is invalid: it must be an int >= "
                                  "-9223372036854775808 and <= 18446744073709551615"),
    ({"seed": "1"}, TypeError, "seed='1' is invalid: it must be an int, not str"),
    ({"max_tokens": 2**31}, ValueError, "max_tokens=2147483648 is invalid: it must be an int >= 1 and <= "),
    ({"max_tokens": True}, TypeError, "max_tokens=True is invalid: it must be an int, not bool"),
    # stop_token_ids=5 gave "'int' object is not iterable"; [True] was accepted as token 1.
    ({"stop_token_ids": 5}, TypeError, "stop_token_ids=5 is invalid: it must be a list of token ids, not int. "
                                       "Pass a list, e.g. stop_token_ids=[5]."),
    ({"stop_token_ids": [True]}, TypeError, "stop_token_ids=[True] is invalid: it must be a list of ints >= 0, "
                                            "and holds True (bool)"),
    ({"stop_token_ids": [1.0]}, TypeError, "stop_token_ids=[1.0] is invalid"),
    # ignore_eos="no" was truthy, so it ignored EOS.
    ({"ignore_eos": "no"}, TypeError, "ignore_eos='no' is invalid: it must be True or False, not str"),
    ({"ignore_eos": 1}, TypeError, "ignore_eos=1 is invalid"),
])
def test_sampling_params_rejects_non_finite_huge_and_wrong_types(kwargs, error, fragment):
    with pytest.raises(error) as err:
        SamplingParams(**kwargs)
    assert fragment in str(err.value)


def test_sampling_params_takes_numpy_scalars_and_the_whole_seed_range(llm):
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9), seed=np.uint64(7),
                       max_tokens=np.int8(2), stop_token_ids=np.array([3, 4]), ignore_eos=np.bool_(True))
    assert (p.temperature, p.top_k, p.top_p, p.seed, p.max_tokens, p.stop_token_ids, p.ignore_eos) == (
        0.5, 3, pytest.approx(0.9), 7, 2, [3, 4], True)
    assert [type(v) for v in (p.temperature, p.top_k, p.top_p, p.seed, p.max_tokens, p.ignore_eos)] == [
        float, int, float, int, int, bool]
    assert SamplingParams(top_k=-1).top_k == 0
    # torch.Generator.manual_seed takes [-2**63, 2**64 - 1]; -1 and 2**64 - 1 are the same seed.
    outs = llm.generate([[5, 6, 7]] * 3, [SamplingParams(seed=s, max_tokens=4) for s in (-(2**63), -1, 2**64 - 1)])
    assert outs[1].token_ids == outs[2].token_ids


def test_prompts_as_numpy_and_torch_integers_run_like_lists(llm):
    params = SamplingParams(temperature=0.0, max_tokens=3)
    want = llm.generate([[5, 6, 7]], params)[0].token_ids
    prompts = [(5, 6, 7), np.array([5, 6, 7], dtype=np.int32), torch.tensor([5, 6, 7]), np.array([5, 6, 7], object),
               [np.int64(5), torch.tensor(6), np.uint8(7)]]
    assert [o.token_ids for o in llm.generate(prompts, params)] == [want] * len(prompts)


def test_check_sampling_params_names_the_prompt_the_id_and_the_fix():
    from specdec.validation import check_sampling_params

    check_sampling_params([SamplingParams(stop_token_ids=[95])] * 2, 96)
    # Issue 18: a stop id outside the vocabulary was accepted (and could never match).
    with pytest.raises(ValueError, match=r"^sampling params for prompt 1: stop_token_ids holds 1000000000, outside "
                                         r"the vocabulary \[0, 96\): use ids produced by this model's tokenizer\.$"):
        check_sampling_params([SamplingParams(), SamplingParams(stop_token_ids=[10**9])], 96)
    # A dict gave AttributeError: 'dict' object has no attribute 'seed'.
    with pytest.raises(TypeError, match=r"^sampling params for prompt 1 are a dict \(\{'temperature': 0\}\), not "
                                        r"a specdec.SamplingParams: pass SamplingParams\(\*\*d\) instead of the "
                                        r"dict d\.$"):
        check_sampling_params([SamplingParams(), {"temperature": 0}], 96)
    with pytest.raises(TypeError, match=r"^sampling params for prompt 0 are a tuple .* pass one SamplingParams, or a "
                                        r"list with one per prompt\.$"):
        check_sampling_params([(SamplingParams(),)], 96)
    # A field set after construction is checked again.
    p = SamplingParams()
    p.temperature = float("nan")
    with pytest.raises(ValueError, match=r"^sampling params for prompt 0: temperature=nan is invalid"):
        check_sampling_params([p], 96)


def test_generate_checks_sampling_params_then_still_works(llm):
    with pytest.raises(TypeError, match=r"^sampling params for prompt 0 are a dict .* pass SamplingParams\(\*\*d\)"):
        llm.generate(GOOD, {"temperature": 0.0})
    with pytest.raises(ValueError, match=r"^sampling params for prompt 1: stop_token_ids holds 1000000000"):
        llm.generate(GOOD, [SamplingParams(), SamplingParams(stop_token_ids=[10**9])])
    outs = llm.generate(GOOD, SamplingParams(temperature=0.0, max_tokens=4))
    assert [len(o.token_ids) for o in outs] == [4, 4]


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
    for model in (None, 3, {"path": tiny_llama_path}):  # an AttributeError deep in the engine before
        with pytest.raises(TypeError, match=rf"LLM\(model={re.escape(repr(model))}\) is invalid: pass a local model "
                                            r"directory \(str or Path\), a loaded Hugging Face causal LM"):
            LLM(model)


def test_check_int_names_value_rule_and_hint():
    from specdec.errors import check_int

    assert check_int("k", 3, 1) == 3
    with pytest.raises(ValueError, match=r"^k=0 is invalid: it must be an int >= 1\.$"):
        check_int("k", 0, 1)
    with pytest.raises(ValueError, match=r"^k=True is invalid: it must be an int >= 0 \(a bool is not\)\.$"):
        check_int("k", True, 0, "(a bool is not)")
    with pytest.raises(ValueError, match=r"^k=2\.0 is invalid: it must be an int >= 1\.$"):
        check_int("k", 2.0, 1)

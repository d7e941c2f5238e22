"""Property tests of what users hand specdec: any SamplingParams arguments, any prompts, any
speculative config either work or raise the documented errors (ValueError, TypeError; a config
path that is not a file: FileNotFoundError or IsADirectoryError), with a message of our own that
names what was wrong; never an AttributeError, IndexError, KeyError, OverflowError or an error
from deep inside torch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from specdec import LLM, SamplingMetadata, SamplingParams
from specdec.config import SpeculativeConfig
from specdec.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE
from specdec.validation import check_sampling_params

VOCAB = 96  # tests/conftest.py's tiny models
MAX_MODEL_LEN = 64
FIELDS = ("temperature", "top_k", "top_p", "seed", "max_tokens", "stop_token_ids", "ignore_eos")
# An example takes about 1-30 ms (generate and LLM() the longest): the file runs in ~10 s on 2 cores.
FAST = settings(max_examples=150, deadline=None)
SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

EDGE_INTS = [0, 1, -1, 2, 95, 96, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64,
             10**30, -(10**30), 2**200]
EDGE_FLOATS = [0.0, -0.0, 1e-300, 1e-40, 1e-7, 1e-6, 0.5, 1.0, 1.5, 1e4, 1e5, 1e39, float("nan"), float("inf"),
               -float("inf"), -1.0]
numpy_scalars = st.one_of(
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.uint64, st.integers(0, 2**64 - 1)),
    st.builds(np.int8, st.integers(-128, 127)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.float64, st.floats()),
    st.builds(np.bool_, st.booleans()),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(EDGE_INTS), st.floats(),
                    st.sampled_from(EDGE_FLOATS), st.text(max_size=4), numpy_scalars)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)


# -- SamplingParams -----------------------------------------------------------------------------
plausible = {
    "temperature": st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(0, 2), st.integers(0, 3)),
    "top_k": st.one_of(st.integers(-2, 100), st.sampled_from(EDGE_INTS)),
    "top_p": st.one_of(st.floats(0, 1), st.sampled_from(EDGE_FLOATS)),
    "seed": st.one_of(st.none(), st.integers(), st.sampled_from(EDGE_INTS)),
    "max_tokens": st.one_of(st.integers(-1, 5), st.sampled_from(EDGE_INTS)),
    "stop_token_ids": st.one_of(st.lists(st.integers(-1, 200), max_size=3), st.integers(0, 5),
                                st.tuples(st.sampled_from(EDGE_INTS))),
    "ignore_eos": st.one_of(st.booleans(), st.sampled_from([0, 1, "no", None])),
}
sampling_kwargs = st.fixed_dictionaries({}, optional={k: st.one_of(v, anything) for k, v in plausible.items()})


def _check_accepted(p: SamplingParams) -> None:
    """The invariants every accepted SamplingParams holds: plain Python values in range."""
    t = p.temperature
    assert type(t) is float and (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE), t
    assert type(p.top_k) is int and 0 <= p.top_k < 2**31
    assert type(p.top_p) is float and 0.0 < p.top_p <= 1.0
    assert p.seed is None or (type(p.seed) is int and -(2**63) <= p.seed < 2**64)
    assert type(p.max_tokens) is int and 1 <= p.max_tokens < 2**31
    assert type(p.stop_token_ids) is list and all(type(s) is int and 0 <= s < 2**63 for s in p.stop_token_ids)
    assert type(p.ignore_eos) is bool


@FAST
@given(kwargs=sampling_kwargs)
@example(kwargs={"temperature": float("nan")})
@example(kwargs={"temperature": float("inf")})
@example(kwargs={"top_k": 2**63})
@example(kwargs={"seed": 2**70})
@example(kwargs={"stop_token_ids": 5})
@example(kwargs={"ignore_eos": "no"})
def test_sampling_params_work_or_raise_a_named_error(kwargs):
    try:
        p = SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        # The message starts with the parameter at fault: "top_k=... is invalid: ...".
        assert re.match(rf"({'|'.join(kwargs)})=.* is invalid: ", str(exc)), str(exc)
        return
    _check_accepted(p)
    # The sampler's tensors and the seeded generator accept it too.
    meta = SamplingMetadata.from_params([p])
    assert bool(torch.isfinite(meta.temperature).all())
    assert (meta.temperature > 0).tolist() == [not p.greedy]


@FAST
@given(params=st.lists(st.one_of(st.builds(SamplingParams, stop_token_ids=st.lists(st.integers(0, 200), max_size=2)),
                                 anything), min_size=1, max_size=3))
def test_check_sampling_params_accepts_only_sampling_params_in_the_vocabulary(params):
    try:
        check_sampling_params(params, VOCAB)
    except (ValueError, TypeError) as exc:
        assert re.match(r"sampling params for prompt \d+", str(exc)), str(exc)
        return
    assert all(isinstance(p, SamplingParams) and all(s < VOCAB for s in p.stop_token_ids) for p in params)


# -- prompts and generate ----------------------------------------------------------------------
token = st.one_of(st.integers(0, VOCAB - 1), st.integers(-3, VOCAB + 3), st.sampled_from(EDGE_INTS),
                  st.sampled_from(EDGE_FLOATS + [2.0]), st.booleans(), st.none(), st.text(max_size=2),
                  st.builds(np.int64, st.integers(0, VOCAB - 1)),
                  st.builds(torch.tensor, st.integers(0, VOCAB - 1)), st.builds(np.float32, st.floats(0, 95)))
dtypes = st.sampled_from([np.int64, np.int32, np.uint8, np.float32, np.bool_, object])
valid_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)
prompt = st.one_of(
    valid_ids,
    st.lists(st.integers(0, VOCAB - 1), min_size=MAX_MODEL_LEN - 2, max_size=MAX_MODEL_LEN + 2),
    st.lists(token, max_size=5),
    st.tuples(token, token),
    st.lists(st.lists(token, max_size=2), max_size=2),  # nested
    st.builds(lambda ids, dt: np.array(ids, dtype=dt), st.lists(st.integers(0, VOCAB - 1), max_size=5), dtypes),
    st.builds(lambda ids, dt: np.array([ids, ids], dtype=dt), valid_ids, dtypes),  # 2-D
    st.builds(lambda ids: torch.tensor(ids), valid_ids),
    st.builds(lambda ids: torch.tensor(ids, dtype=torch.float32), valid_ids),
    st.builds(lambda ids: torch.tensor([ids]), valid_ids),  # 2-D
    st.builds(lambda ids: torch.tensor(ids) > 5, valid_ids),  # bool
    st.builds(lambda i: torch.tensor(i), st.integers(0, VOCAB - 1)),  # 0-d
    anything,
)
# A few prompts with one SamplingParams each (every param in range: what the sampler does with
# extreme but legal values is part of the property), plus prompts given in other shapes.
legal_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.0, MIN_TEMPERATURE, 0.7, 1.0, MAX_TEMPERATURE]),
    top_k=st.sampled_from([-1, 0, 1, 5, VOCAB, 2**31 - 1]),
    top_p=st.sampled_from([1e-9, 0.5, 1.0]),
    seed=st.one_of(st.none(), st.sampled_from([0, -1, -(2**63), 2**64 - 1])),
    max_tokens=st.integers(1, 3),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=2),
    ignore_eos=st.booleans(),
)


@st.composite
def generate_calls(draw):
    kind = draw(st.sampled_from(["valid", "valid", "mixed", "mixed", "one prompt"]))
    if kind == "one prompt":  # a single prompt (or anything) instead of a list of them
        return draw(prompt), draw(legal_params)
    prompts = draw(st.lists(valid_ids if kind == "valid" else prompt, min_size=1, max_size=3))
    if draw(st.booleans()):
        return prompts, draw(st.lists(legal_params, min_size=len(prompts), max_size=len(prompts)))
    return prompts, draw(legal_params)


def _holds_float_or_bool(x: object) -> bool:
    """Whether a float or a bool hides anywhere in ``x`` (what must never run as a token id)."""
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.bool or x.is_floating_point()
    if isinstance(x, np.ndarray) and x.dtype != object:
        return x.dtype == np.bool_ or np.issubdtype(x.dtype, np.floating)
    if isinstance(x, (list, tuple, np.ndarray)):
        return any(_holds_float_or_bool(t) for t in list(x))
    return isinstance(x, (bool, float, np.bool_, np.floating))


@pytest.fixture(scope="module")
def llm(tiny_llama_path):
    return LLM(tiny_llama_path, dtype="float32", max_model_len=MAX_MODEL_LEN)


@SLOW
@given(call=generate_calls())
@example(call=([[1.5, 2.7]], SamplingParams(temperature=0.0, max_tokens=2)))
@example(call=([[5, True]], SamplingParams(temperature=0.0, max_tokens=2)))
@example(call=([["a"]], SamplingParams(temperature=0.0, max_tokens=2)))
@example(call=([[[1, 2]]], SamplingParams(temperature=0.0, max_tokens=2)))
@example(call=([np.array([[1, 2], [3, 4]])], SamplingParams(temperature=0.0, max_tokens=2)))
@example(call=([[5, 6]], SamplingParams(seed=2**64 - 1, max_tokens=2)))
def test_generate_works_or_raises_a_named_error(llm, call):
    prompts, params = call
    try:
        outs = llm.generate(prompts, params)
    except (ValueError, TypeError) as exc:
        assert re.match(r"(prompts? |sampling params for prompt |got \d+ SamplingParams)", str(exc)), str(exc)
        event(f"{type(exc).__name__}: {str(exc).split(':')[0].split(' has ')[0]}")
        return
    event("generated")
    assert not _holds_float_or_bool(prompts)  # it ran, so no float or bool was taken for a token id
    plist = params if isinstance(params, list) else [params] * len(outs)
    assert len(outs) == len(plist)
    for out, p in zip(outs, plist):
        assert 1 <= len(out.token_ids) <= p.max_tokens
        assert all(0 <= t < VOCAB for t in out.token_ids)
        assert all(type(t) is int for t in out.prompt_token_ids)
    assert [len(o.token_ids) for o in llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2))] == [2]


# -- speculative configs -----------------------------------------------------------------------
OPTION_NAMES = ["min_history", "draft_sample_method", "draft_dtype", "draft_device", "draft_cuda_graphs",
                "draft_prefill_graph_tokens", "draft_fused", "draft_chain", "prompt_lookup_min", "prompt_lookup_max",
                "index", "match", "num_threads", "parallel_threshold", "compile", "suffix_decoding_max_tree_depth",
                "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
                "suffix_decoding_min_token_prob", "defer_global_updates"]
# Values an option might plausibly get ("always" compiles with inductor on CPU: slow, so left out).
option_value = st.one_of(st.integers(-2, 6), st.sampled_from([None, True, False, 0.5, 1e9, 2**63, "scan", "leftmost",
                                                             "rightmost", "auto", "never", "greedy", "float32",
                                                             "cpu", "bogus"]),
                         anything)
config_dicts = st.fixed_dictionaries(
    {"method": st.one_of(st.sampled_from(["ngram", "suffix", "copycat", "ngram_gpu", "draft_model", "broken",
                                          "nope", ""]), anything)},
    optional={
        "num_speculative_tokens": st.one_of(st.integers(-1, 6), anything),
        "model": st.one_of(st.none(), st.just("/no/such/dir"), anything),
        "on_bad_drafts": st.one_of(st.sampled_from(["error", "drop"]), anything),
        **{name: option_value for name in OPTION_NAMES},
    },
)
configs = st.one_of(config_dicts, st.dictionaries(st.text(max_size=6), anything, max_size=3), anything)


@FAST
@given(config=configs)
@example(config=[])
@example(config=42)
@example(config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": "4"})
def test_speculative_config_from_dict_works_or_raises(config):
    try:
        parsed = SpeculativeConfig.from_dict(config)
    except (ValueError, TypeError) as exc:
        assert str(exc)
        return
    assert isinstance(parsed.num_speculative_tokens, int) and parsed.num_speculative_tokens >= 1
    assert SpeculativeConfig.from_dict(parsed.to_dict()) == parsed


def _llm_or_documented_error(path: str, config: object) -> LLM | None:
    try:
        return LLM(path, config, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=2)
    except (ValueError, TypeError, FileNotFoundError, IsADirectoryError) as exc:  # the last two: config paths
        assert str(exc)
        return None
    except ImportError as exc:  # a method whose optional backend this machine lacks (suffix's arctic-inference on
        assert "could not be imported" in str(exc) and "make install" in str(exc)  # the H200 image): the fix named
        return None


@SLOW
@given(config=st.one_of(config_dicts, st.dictionaries(st.text(max_size=6), anything, max_size=3),
                        st.text(max_size=6), st.none()))
@example(config={"method": "draft_model", "num_speculative_tokens": 2, "model": "/no/such/dir"})
@example(config="/no/such/spec.json")
def test_llm_with_any_speculative_config_dict_works_or_raises(tiny_llama_path, config):
    llm = _llm_or_documented_error(tiny_llama_path, config)
    if llm is not None:
        outs = llm.generate([[5, 6, 7, 5, 6]], SamplingParams(temperature=0.0, max_tokens=3))
        assert len(outs[0].token_ids) == 3


@SLOW
@given(config=anything.filter(lambda c: not isinstance(c, (dict, str, type(None)))))
@example(config=[])
@example(config=42)
def test_llm_with_a_non_dict_speculative_config_raises(tiny_llama_path, config):
    with pytest.raises((TypeError, ValueError)):
        LLM(tiny_llama_path, config, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=2)

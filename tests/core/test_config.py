"""Tests for specdec.SpeculativeConfig (docs/design.md section 3): construction from keywords, dicts and
JSON/YAML files, validation of the core keys and of the method's Options, and the round trip.

The method used is `copycat`, from the fixture distribution tests/fixtures/specdec-plugin-copycat
(Options: ``min_history: int = 2``, validated ``>= 2``; no default k).
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import json
from dataclasses import dataclass, field

import pytest
import yaml

import specdec
from specdec import SpeculativeConfig

pytestmark = pytest.mark.skipif(
    "copycat" not in {ep.name for ep in importlib_metadata.entry_points(group="specdec")},
    reason="fixture plugin not installed: pip install tests/fixtures/specdec-plugin-copycat",
)

CORE = "(core keys: method, num_speculative_tokens, model, on_bad_drafts, speculation_policy)"


@dataclass(frozen=True)
class _DefaultKOptions:
    default_k: int = 4


class DefaultKProposer(specdec.Proposer):
    """A method whose k has a default derived from its options."""

    method = "default_k_method"
    Options = _DefaultKOptions

    @classmethod
    def default_num_speculative_tokens(cls, options):
        return options.default_k

    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


@dataclass(frozen=True)
class _DerivedOptions:
    window: int = 3
    span: int = field(init=False, default=0)  # derived in __post_init__, not a config key

    def __post_init__(self):
        object.__setattr__(self, "span", 2 * self.window)


class NoOptionsProposer(specdec.Proposer):
    method = "no_options_method"

    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


class DerivedOptionsProposer(NoOptionsProposer):
    method = "derived_options_method"
    Options = _DerivedOptions


# --- construction ---------------------------------------------------------------------------------


def test_from_keywords():
    config = SpeculativeConfig(method="copycat", num_speculative_tokens=3)
    assert config.method == "copycat"
    assert config.num_speculative_tokens == 3
    assert config.model is None
    assert config.on_bad_drafts == "error"
    assert type(config.options) is specdec.get_proposer_class("copycat").Options
    assert config.options.min_history == 2


def test_from_keywords_with_model_and_option():
    config = SpeculativeConfig(method="copycat", num_speculative_tokens=5, model="/ckpt/head",
                               on_bad_drafts="drop", min_history=7)
    assert (config.num_speculative_tokens, config.model, config.on_bad_drafts) == (5, "/ckpt/head", "drop")
    assert config.options.min_history == 7


def test_from_dict_equals_keywords():
    data = {"method": "copycat", "num_speculative_tokens": 4, "min_history": 3}
    config = SpeculativeConfig.from_dict(data)
    assert config == SpeculativeConfig(method="copycat", num_speculative_tokens=4, min_history=3)
    assert config != SpeculativeConfig(method="copycat", num_speculative_tokens=4)
    assert data == {"method": "copycat", "num_speculative_tokens": 4, "min_history": 3}  # not mutated


def test_from_dict_rejects_non_dict_and_missing_method():
    with pytest.raises(TypeError, match="speculative config must be a dict, got list"):
        SpeculativeConfig.from_dict([("method", "copycat")])
    with pytest.raises(ValueError, match="has no 'method' key; add e.g. \"method\": \"ngram\""):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 3})


def test_from_json_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "copycat", "num_speculative_tokens": 3, "min_history": 5}))
    config = SpeculativeConfig.from_file(path)
    assert (config.method, config.num_speculative_tokens, config.min_history) == ("copycat", 3, 5)
    assert SpeculativeConfig.from_file(str(path)) == config


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_from_yaml_file(tmp_path, suffix):
    path = tmp_path / f"spec{suffix}"
    path.write_text("method: copycat\nnum_speculative_tokens: 2\nmin_history: 4\non_bad_drafts: drop\n")
    config = SpeculativeConfig.from_file(path)
    assert config == SpeculativeConfig(method="copycat", num_speculative_tokens=2, min_history=4,
                                       on_bad_drafts="drop")


def test_from_file_missing_path(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json") as exc:
        SpeculativeConfig.from_file(missing)
    assert "does not exist" in str(exc.value)


def test_from_file_must_hold_a_dict(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("- method\n- copycat\n")
    with pytest.raises(TypeError, match="must be a dict, got list"):
        SpeculativeConfig.from_file(path)


# --- method ---------------------------------------------------------------------------------------


def test_unknown_method():
    with pytest.raises(specdec.UnknownMethodError) as exc:
        SpeculativeConfig(method="copycta", num_speculative_tokens=3)
    assert isinstance(exc.value, ValueError)
    message = str(exc.value)
    assert "Unknown method 'copycta'" in message
    assert "copycat" in message.split("Installed: ", 1)[1]
    assert "pip install specdec-plugin-" in message


# --- num_speculative_tokens -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "fragments"),
    [
        (0, ["num_speculative_tokens=0 is invalid", "must be >= 1"]),
        (-1, ["num_speculative_tokens=-1 is invalid", "must be >= 1"]),
        (1.5, ["num_speculative_tokens=1.5 is invalid", "must be an int >= 1"]),
        ("3", ["num_speculative_tokens='3' is invalid", "must be an int >= 1"]),
        (True, ["num_speculative_tokens=True is invalid", "must be an int >= 1"]),
        (False, ["num_speculative_tokens=False is invalid", "must be an int >= 1"]),
        (None, ["num_speculative_tokens is required for method 'copycat'", "int >= 1"]),
    ],
)
def test_invalid_num_speculative_tokens(k, fragments):
    with pytest.raises(ValueError) as exc:
        SpeculativeConfig(method="copycat", num_speculative_tokens=k)
    for fragment in fragments:
        assert fragment in str(exc.value)


def test_num_speculative_tokens_omitted_uses_the_method_default(register_proposer):
    register_proposer(DefaultKProposer)
    assert SpeculativeConfig(method="default_k_method").num_speculative_tokens == 4
    assert SpeculativeConfig(method="default_k_method", default_k=6).num_speculative_tokens == 6
    assert SpeculativeConfig(method="default_k_method", num_speculative_tokens=2).num_speculative_tokens == 2
    # a default is validated like a value the user passed
    with pytest.raises(ValueError, match="num_speculative_tokens=0 is invalid"):
        SpeculativeConfig(method="default_k_method", default_k=0)


def test_num_speculative_tokens_one_is_valid():
    assert SpeculativeConfig(method="copycat", num_speculative_tokens=1).num_speculative_tokens == 1


# --- method options -------------------------------------------------------------------------------


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError) as exc:
        SpeculativeConfig(method="copycat", num_speculative_tokens=3, min_histroy=3)
    assert str(exc.value) == (
        f"Unknown option(s) ['min_histroy'] for method 'copycat'. Valid options: min_history {CORE}."
    )


def test_unknown_option_of_a_method_without_options(register_proposer):
    register_proposer(NoOptionsProposer)
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['window', 'x'\] for method 'no_options_method'\. "
                                         r"Valid options: none"):
        SpeculativeConfig(method="no_options_method", num_speculative_tokens=2, x=1, window=3)
    config = SpeculativeConfig(method="no_options_method", num_speculative_tokens=2)
    assert config.options == specdec.NoOptions()
    assert config.to_dict() == {"method": "no_options_method", "num_speculative_tokens": 2, "model": None,
                                "on_bad_drafts": "error", "speculation_policy": "auto"}


def test_derived_option_field_is_not_a_config_key(register_proposer):
    register_proposer(DerivedOptionsProposer)
    config = SpeculativeConfig(method="derived_options_method", num_speculative_tokens=2, window=5)
    assert config.span == 10  # readable as an attribute
    data = config.to_dict()
    assert data == {"method": "derived_options_method", "num_speculative_tokens": 2, "model": None,
                    "on_bad_drafts": "error", "speculation_policy": "auto", "window": 5}
    assert SpeculativeConfig.from_dict(data) == config
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['span'\] .* Valid options: window \(core keys"):
        SpeculativeConfig(method="derived_options_method", num_speculative_tokens=2, span=4)


def test_options_post_init_validation_surfaces():
    with pytest.raises(ValueError, match=r"min_history=1 is invalid: it must be an int >= 2\."):
        SpeculativeConfig(method="copycat", num_speculative_tokens=3, min_history=1)


def test_options_are_attributes_of_the_config():
    config = SpeculativeConfig(method="copycat", num_speculative_tokens=3, min_history=6)
    assert config.min_history == 6 == config.options.min_history
    with pytest.raises(AttributeError, match="SpeculativeConfig has no attribute 'max_history'"):
        _ = config.max_history
    assert not hasattr(config, "prompt_lookup_max")


# --- on_bad_drafts --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["error", "drop"])
def test_on_bad_drafts_valid(policy):
    assert SpeculativeConfig(method="copycat", num_speculative_tokens=2, on_bad_drafts=policy).on_bad_drafts == policy


@pytest.mark.parametrize("policy", ["ignore", "", None, "DROP"])
def test_on_bad_drafts_invalid(policy):
    with pytest.raises(ValueError) as exc:
        SpeculativeConfig(method="copycat", num_speculative_tokens=2, on_bad_drafts=policy)
    assert str(exc.value) == f"on_bad_drafts={policy!r} is invalid: it must be one of ('error', 'drop')."


# --- to_dict --------------------------------------------------------------------------------------


def test_to_dict_fills_defaults_and_round_trips(tmp_path):
    config = SpeculativeConfig(method="copycat", num_speculative_tokens=3)
    data = config.to_dict()
    assert data == {"method": "copycat", "num_speculative_tokens": 3, "model": None, "on_bad_drafts": "error",
                    "speculation_policy": "auto",
                    "min_history": 2}
    assert SpeculativeConfig.from_dict(data) == config
    assert SpeculativeConfig(**data) == config

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    assert SpeculativeConfig.from_file(path) == config
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    assert SpeculativeConfig.from_file(path) == config


def test_repr_shows_the_set_keys():
    config = SpeculativeConfig(method="copycat", num_speculative_tokens=3, model="m")
    assert repr(config) == (
        "SpeculativeConfig(method='copycat', num_speculative_tokens=3, model='m', on_bad_drafts='error', "
        "speculation_policy='auto', "
        "min_history=2)"
    )


# --- as_speculative_config: what a config may be (issue 18, defect 5) ------------------------------

KINDS = ('a dict such as {"method": "ngram", "num_speculative_tokens": 5}, a SpeculativeConfig, the path of a JSON '
         "(.json) or YAML (.yaml/.yml) file holding such a dict, or None (no speculation)")


def test_as_speculative_config_accepts_each_kind(tmp_path):
    from specdec.config import as_speculative_config

    config = SpeculativeConfig(method="copycat", num_speculative_tokens=3)
    assert as_speculative_config(None) is None
    assert as_speculative_config(config) is config
    assert as_speculative_config({"method": "copycat", "num_speculative_tokens": 3}) == config
    for name, text in (("spec.json", json.dumps(config.to_dict())), ("spec.yaml", yaml.safe_dump(config.to_dict())),
                       ("spec.yml", "method: copycat\nnum_speculative_tokens: 3\n")):
        path = tmp_path / name
        path.write_text(text)
        assert as_speculative_config(path) == config
        assert as_speculative_config(str(path)) == config


@pytest.mark.parametrize("value", [[], 42, 3.5, True, b"spec.json", ("method", "copycat")])
def test_as_speculative_config_refuses_other_types(value):
    from specdec.config import as_speculative_config

    with pytest.raises(TypeError) as exc:
        as_speculative_config(value)
    assert str(exc.value) == (f"speculative_config={value!r} ({type(value).__name__}) is invalid: a speculative "
                              f"config may be {KINDS}.")


def test_as_speculative_config_method_name_string_suggests_a_dict():
    from specdec.config import as_speculative_config

    with pytest.raises(ValueError) as exc:
        as_speculative_config("copycat")
    assert str(exc.value) == (f"speculative_config='copycat' is not a file, and a bare method name is not a config. "
                              f"A speculative config may be {KINDS}; for method 'copycat' pass "
                              '{"method": \'copycat\', "num_speculative_tokens": 5}.')


def test_as_speculative_config_missing_file_says_what_a_config_may_be(tmp_path):
    from specdec.config import as_speculative_config

    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError) as exc:
        as_speculative_config(str(missing))
    assert str(exc.value) == f"speculative config file {str(missing)!r} does not exist. A speculative config may be " \
                             f"{KINDS}."


@pytest.mark.parametrize("name,text,error,fragment", [
    ("bad.yaml", "method: copycat\nnum_speculative_tokens: [3\n", ValueError,
     "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 3, column 1; fix the syntax"),
    ("bad.yml", "method: copycat\n  k: : 3\n", ValueError, "is not valid YAML: "),
    ("bad.json", '{"method": "copycat",\n "num_speculative_tokens": 3,}', ValueError,
     "is not valid JSON: Expecting property name enclosed in double quotes at line 2, column 30"),
    ("list.json", "[1, 2]", TypeError, "must be a dict, got list"),
    ("scalar.yaml", "copycat\n", TypeError, "must be a dict, got str"),
    ("empty.yaml", "", ValueError, "is empty: write a mapping such as method: ngram"),
    ("keys.yaml", "method: copycat\n1: 2\n", TypeError,
     "has key 1 (int): every key must be a string, such as 'method' or 'num_speculative_tokens'"),
    ("spec.txt", '{"method": "copycat"}', ValueError, "has suffix '.txt': it must end in .json, .yaml or .yml"),
])
def test_malformed_config_files_name_the_file(tmp_path, name, text, error, fragment):
    from specdec.config import as_speculative_config

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(error) as exc:
        as_speculative_config(path)
    assert repr(str(path)) in str(exc.value)
    assert fragment in str(exc.value)
    with pytest.raises(error):
        SpeculativeConfig.from_file(path)


def test_config_file_not_utf8_or_a_directory(tmp_path):
    path = tmp_path / "spec.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=r"spec\.json' is not UTF-8 text \(invalid start byte at byte 0\)"):
        SpeculativeConfig.from_file(path)
    with pytest.raises(IsADirectoryError, match="is a directory: pass a JSON or YAML file"):
        SpeculativeConfig.from_file(tmp_path)


def test_from_dict_refuses_non_string_keys():
    with pytest.raises(TypeError) as exc:
        SpeculativeConfig.from_dict({"method": "copycat", "num_speculative_tokens": 3, 7: "x"})
    assert str(exc.value) == ("speculative config has key 7 (int): every key must be a string, such as 'method' or "
                              "'num_speculative_tokens'.")


def test_read_config_file_returns_only_the_keys_set(tmp_path):
    from specdec.config import read_config_file

    path = tmp_path / "spec.yaml"
    path.write_text("method: copycat\nmin_history: 4\n")
    assert read_config_file(path) == {"method": "copycat", "min_history": 4}


# --- option values are checked against the Options annotations (defect 6) --------------------------


@dataclass(frozen=True)
class _TypedOptions:
    flag: bool = True
    count: int = 1
    ratio: float = 0.5
    name: str = "a"
    limit: int | None = None
    sizes: tuple[int, ...] = ()  # not a simple type: left to the Options


class TypedProposer(NoOptionsProposer):
    method = "typed_method"
    Options = _TypedOptions


@dataclass(frozen=True)
class _UnresolvableOptions:
    size: NotDefinedAnywhere = 1  # noqa: F821  (a string annotation that does not resolve: no checks)


class UnresolvableProposer(NoOptionsProposer):
    method = "unresolvable_method"
    Options = _UnresolvableOptions


@pytest.mark.parametrize("option,value,rule,example", [
    ("flag", "no", "a bool (true or false, unquoted)", "true"),
    ("flag", 0, "a bool (true or false, unquoted)", "true"),
    ("count", True, "an int (not a bool)", "4"),
    ("count", 2.0, "an int (not a bool)", "4"),
    ("count", "2", "an int (not a bool)", "4"),
    ("ratio", float("nan"), "a finite number (an int or a float)", "0.5"),
    ("ratio", True, "a finite number (an int or a float)", "0.5"),
    ("ratio", "0.5", "a finite number (an int or a float)", "0.5"),
    ("name", 3, "a string", '"text"'),
    ("limit", "3", "an int (not a bool) or None", "4"),
])
def test_option_of_the_wrong_type_is_refused(register_proposer, option, value, rule, example):
    register_proposer(TypedProposer)
    with pytest.raises(TypeError) as exc:
        SpeculativeConfig(method="typed_method", num_speculative_tokens=2, **{option: value})
    assert str(exc.value) == (f"option {option}={value!r} of method 'typed_method' is invalid: it must be {rule}, "
                              f"got {type(value).__name__}; e.g. {option}={example}.")


def test_options_of_the_right_type_pass(register_proposer):
    register_proposer(TypedProposer, UnresolvableProposer)
    config = SpeculativeConfig(method="typed_method", num_speculative_tokens=2, flag=False, count=3, ratio=1,
                               name="b", limit=None, sizes=("anything", "goes"))
    assert (config.flag, config.count, config.ratio, config.limit, config.sizes) == (False, 3, 1, None,
                                                                                     ("anything", "goes"))
    assert SpeculativeConfig(method="typed_method", num_speculative_tokens=2, limit=7).limit == 7
    assert SpeculativeConfig(method="unresolvable_method", num_speculative_tokens=2, size="x").size == "x"


@pytest.mark.skipif("draft_model" not in {ep.name for ep in importlib_metadata.entry_points(group="specdec")},
                    reason="specdec-plugin-draft_model not installed")
def test_draft_model_bool_option_refuses_a_string():
    with pytest.raises(TypeError, match=r"option draft_cuda_graphs='no' of method 'draft_model' is invalid: it must "
                                        r"be a bool \(true or false, unquoted\), got str"):
        SpeculativeConfig(method="draft_model", num_speculative_tokens=2, model="/ckpt", draft_cuda_graphs="no")

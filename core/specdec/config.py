"""SpeculativeConfig: which method drafts, how many tokens, and the method's own options."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from specdec import registry
from specdec.options import CORE_KEYS, NoOptions, init_option_names
from specdec.policy import SPECULATION_POLICIES
from specdec.proposer import Proposer

__all__ = ["SpeculativeConfig", "NoOptions", "CORE_KEYS", "as_speculative_config", "create_proposer",
           "read_config_file", "option_names"]

_BAD_DRAFT_POLICIES = ("error", "drop")
_FILE_FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
CONFIG_KINDS = ('a dict such as {"method": "ngram", "num_speculative_tokens": 5}, a SpeculativeConfig, '
                "the path of a JSON (.json) or YAML (.yaml/.yml) file holding such a dict, or None (no speculation)")


class SpeculativeConfig:
    """Speculative decoding settings, in vLLM's flat style.

    ``SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_max=4)`` or
    ``SpeculativeConfig.from_dict({...})`` / ``from_file("spec.json")``.

    Core keys:
        method: name a plugin registered (``specdec methods`` lists them).
        num_speculative_tokens: k, drafts per request per step (int >= 1). When omitted, the
            method's default is used if it has one.
        model: draft model / head checkpoint path, for methods that need one.
        on_bad_drafts: ``"error"`` (default) raises :class:`specdec.DraftValidationError` naming
            the plugin when a proposer returns malformed drafts; ``"drop"`` logs a warning, discards
            that step's drafts for the affected requests and goes on (output stays exact).
        speculation_policy: ``"auto"`` (default) drafts only on steps and for requests where it is
            expected to pay, from each request's measured acceptance and running step timings
            (:mod:`specdec.policy`); ``"fixed"`` drafts k for every request every step.

    Every other keyword is validated against the method's ``Options`` dataclass and available as
    ``config.options`` (and as attributes of the config, e.g. ``config.prompt_lookup_max``).

    The config holds only these values: the registry resolves the method once, here, to check the
    options (an unknown method or option fails at construction, not when the engine starts).
    """

    def __init__(
        self,
        method: str,
        num_speculative_tokens: int | None = None,
        model: str | None = None,
        on_bad_drafts: str = "error",
        speculation_policy: str = "auto",
        **options: Any,
    ) -> None:
        # Raises UnknownMethodError naming the installed methods, or the option's own error.
        proposer_cls, self.options = registry.resolve_options(method, options)
        self.method = method
        self.model = model
        if on_bad_drafts not in _BAD_DRAFT_POLICIES:
            raise ValueError(
                f"on_bad_drafts={on_bad_drafts!r} is invalid: it must be one of {_BAD_DRAFT_POLICIES}."
            )
        self.on_bad_drafts = on_bad_drafts
        if speculation_policy not in SPECULATION_POLICIES:
            raise ValueError(
                f"speculation_policy={speculation_policy!r} is invalid: it must be one of {SPECULATION_POLICIES} "
                "('auto' drafts where it is expected to pay, 'fixed' drafts k every step)."
            )
        self.speculation_policy = speculation_policy
        if num_speculative_tokens is None:
            num_speculative_tokens = proposer_cls.default_num_speculative_tokens(self.options)
            if num_speculative_tokens is None:
                raise ValueError(
                    f"num_speculative_tokens is required for method {method!r}: pass an int >= 1, "
                    "e.g. num_speculative_tokens=5."
                )
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int):
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens!r} is invalid: it must be an int >= 1 "
                "(the number of drafts per request per step), e.g. num_speculative_tokens=5."
            )
        if num_speculative_tokens <= 0:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens} is invalid: it must be >= 1 "
                "(to decode without speculation, leave speculative_config out)."
            )
        self.num_speculative_tokens = num_speculative_tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculativeConfig:
        """Build from a flat dict such as ``{"method": "ngram", "num_speculative_tokens": 5}``."""
        if not isinstance(data, dict):
            raise TypeError(f"speculative config must be a dict, got {type(data).__name__}.")
        _check_keys(data, "speculative config")
        if "method" not in data:
            raise ValueError(f"speculative config {data!r} has no 'method' key; add e.g. \"method\": \"ngram\".")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> SpeculativeConfig:
        """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) file holding a flat dict (see
        :func:`read_config_file` for the errors)."""
        return cls.from_dict(read_config_file(path))

    def to_dict(self) -> dict[str, Any]:
        """The flat dict this config was built from, with defaults filled in."""
        out = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "model": self.model,
            "on_bad_drafts": self.on_bad_drafts,
            "speculation_policy": self.speculation_policy,
        }
        keys = init_option_names(self.options)  # init=False fields are derived, not keys a config may set
        out.update((k, v) for k, v in asdict(self.options).items() if k in keys)
        return out

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not real attributes: the method's options.
        options = self.__dict__.get("options")
        if options is not None and name in {f.name for f in fields(options)}:
            return getattr(options, name)
        raise AttributeError(f"SpeculativeConfig has no attribute {name!r}")

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if v is not None)
        return f"SpeculativeConfig({items})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SpeculativeConfig) and self.to_dict() == other.to_dict()


def option_names(method: str) -> list[str]:
    """The option keys method ``method`` accepts besides :data:`CORE_KEYS` (raises UnknownMethodError)."""
    return init_option_names(registry.get_proposer_class(method).Options)


def create_proposer(config: SpeculativeConfig | Mapping[str, Any], target: Any = None) -> Proposer:
    """Instantiate the proposer for ``config.method``; a dict is read with :meth:`SpeculativeConfig.from_dict`.

    This is ``specdec.create_proposer``. It lives here, above the registry, because reading a dict
    needs :class:`SpeculativeConfig`, which itself asks the registry for the method's options.
    """
    if isinstance(config, Mapping):
        config = SpeculativeConfig.from_dict(dict(config))
    return registry.create_proposer(config, target)


def as_speculative_config(value: Any) -> SpeculativeConfig | None:
    """``value`` as a :class:`SpeculativeConfig`: None stays None, a SpeculativeConfig is returned as is,
    a dict (flat, vLLM style) goes through :meth:`SpeculativeConfig.from_dict` and a ``str``/``Path``
    naming an existing ``.json``/``.yaml``/``.yml`` file through :meth:`SpeculativeConfig.from_file`.

    Raises TypeError for any other type, and for a string that names no file FileNotFoundError (or
    ValueError when it looks like a method name, with the dict to write instead).
    """
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, Mapping):
        return SpeculativeConfig.from_dict(dict(value))
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = Path(value)
        if not path.exists() and isinstance(value, str) and value.isidentifier():
            raise ValueError(
                f"speculative_config={value!r} is not a file, and a bare method name is not a config. A "
                f"speculative config may be {CONFIG_KINDS}; for method {value!r} pass "
                f'{{"method": {value!r}, "num_speculative_tokens": 5}}.'
            )
        return SpeculativeConfig.from_file(path)
    raise TypeError(
        f"speculative_config={value!r} ({type(value).__name__}) is invalid: a speculative config may be "
        f"{CONFIG_KINDS}."
    )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The dict a JSON or YAML speculative config file holds, only the keys it sets (no defaults).

    Raises FileNotFoundError / IsADirectoryError for a path that is not a file, ValueError for an
    unknown suffix, text that is not UTF-8, or malformed JSON/YAML (with the line and column), and
    TypeError when the top level is not a mapping or a key is not a string; each names the file.
    """
    path = Path(path)
    name = str(path)
    if path.is_dir():
        raise IsADirectoryError(f"speculative config path {name!r} is a directory: pass a JSON or YAML file.")
    if not path.is_file():
        raise FileNotFoundError(f"speculative config file {name!r} does not exist. A speculative config may be "
                                f"{CONFIG_KINDS}.")
    fmt = _FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"speculative config file {name!r} has suffix {path.suffix!r}: it must end in .json, "
                         ".yaml or .yml so its format is known; rename it.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"speculative config file {name!r} is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}): save it as UTF-8 {fmt}.") from None
    data = _parse_yaml(text, name) if fmt == "YAML" else _parse_json(text, name)
    if data is None:
        raise ValueError(f"speculative config file {name!r} is empty: write a mapping such as "
                         "method: ngram / num_speculative_tokens: 5.")
    if not isinstance(data, dict):
        raise TypeError(f"the top level of speculative config file {name!r} must be a dict, got "
                        f"{type(data).__name__}: write a flat mapping such as {{\"method\": \"ngram\", "
                        '"num_speculative_tokens": 5}.')
    _check_keys(data, f"speculative config file {name!r}")
    return data


def _parse_json(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"speculative config file {name!r} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno}; fix the syntax (a flat object such as "
                         '{"method": "ngram", "num_speculative_tokens": 5}).') from None


def _parse_yaml(text: str, name: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"speculative config file {name!r} is not valid YAML: {problem}{where}; fix the syntax "
                         "(a flat mapping, one 'key: value' per line).") from None


def _check_keys(data: dict[Any, Any], where: str) -> None:
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise TypeError(f"{where} has key {bad[0]!r} ({type(bad[0]).__name__}): every key must be a string, "
                        "such as 'method' or 'num_speculative_tokens'.")

"""SpeculativeConfig: which method drafts, how many tokens, and the method's own options."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["SpeculativeConfig", "NoOptions", "CORE_KEYS"]

# Keys every config understands; every other key belongs to the method's Options dataclass.
CORE_KEYS = ("method", "num_speculative_tokens", "model", "on_bad_drafts")
_BAD_DRAFT_POLICIES = ("error", "drop")


@dataclass(frozen=True, slots=True)
class NoOptions:
    """Options of a method that has none."""


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

    Every other keyword is validated against the method's ``Options`` dataclass and available as
    ``config.options`` (and as attributes of the config, e.g. ``config.prompt_lookup_max``).
    """

    def __init__(
        self,
        method: str,
        num_speculative_tokens: int | None = None,
        model: str | None = None,
        on_bad_drafts: str = "error",
        **options: Any,
    ) -> None:
        from specdec.registry import get_proposer_class

        cls = get_proposer_class(method)  # raises UnknownMethodError naming the installed methods
        self.method = method
        self.model = model
        if on_bad_drafts not in _BAD_DRAFT_POLICIES:
            raise ValueError(
                f"on_bad_drafts={on_bad_drafts!r} is invalid: it must be one of {_BAD_DRAFT_POLICIES}."
            )
        self.on_bad_drafts = on_bad_drafts
        self.options = _build_options(cls, method, options)
        if num_speculative_tokens is None:
            num_speculative_tokens = cls.default_num_speculative_tokens(self.options)
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
        if "method" not in data:
            raise ValueError(f"speculative config {data!r} has no 'method' key; add e.g. \"method\": \"ngram\".")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | Path) -> SpeculativeConfig:
        """Read a JSON (``.json``) or YAML (``.yaml``/``.yml``) file holding a flat dict."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"speculative config file {str(path)!r} does not exist.")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The flat dict this config was built from, with defaults filled in."""
        out = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "model": self.model,
            "on_bad_drafts": self.on_bad_drafts,
        }
        keys = _option_names(self.options)  # init=False fields are derived, not keys a config may set
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


def _option_names(options: Any) -> list[str]:
    return [f.name for f in fields(options) if f.init]


def _build_options(cls: type, method: str, options: dict[str, Any]) -> Any:
    valid = _option_names(cls.Options)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(
            f"Unknown option(s) {unknown} for method {method!r}. Valid options: {listed} "
            f"(core keys: {', '.join(CORE_KEYS)})."
        )
    return cls.Options(**options)

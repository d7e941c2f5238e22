"""Which specdec method runs inside vLLM, with which options: read from the environment or a config file.

vLLM builds a custom proposer from its own config only, so the method's options travel beside it:

- ``SPECDEC_VLLM_CONFIG``: path of a JSON or YAML file holding a flat specdec config, as
  ``specdec generate --config`` reads (``{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}``).
- ``SPECDEC_VLLM_METHOD``: the method name (overrides the file's ``method``).
- ``SPECDEC_VLLM_OPTIONS``: a JSON object of options (overrides the file's keys one by one).

k is vLLM's ``num_speculative_tokens``; a config that names another k is an error. The method must draft from
tokens alone: a method that needs a draft model or the target's hidden states is refused (vLLM runs those itself,
with its own ``eagle``/``eagle3``/``medusa``/``draft_model``/... methods).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from specdec import Proposer, SpeculativeConfig, get_proposer_class
from specdec.config import read_config_file

__all__ = ["ENV_METHOD", "ENV_OPTIONS", "ENV_CONFIG", "read_settings", "build_proposer", "TokenOnlyError"]

logger = logging.getLogger("specdec.vllm")

ENV_METHOD = "SPECDEC_VLLM_METHOD"
ENV_OPTIONS = "SPECDEC_VLLM_OPTIONS"
ENV_CONFIG = "SPECDEC_VLLM_CONFIG"
# Keys of a specdec config that have no meaning inside vLLM: vLLM decides when to draft.
_IGNORED = ("speculation_policy",)
# vLLM's own methods for what this adapter refuses.
_VLLM_METHODS = "eagle, eagle3, medusa, mtp, dflash, draft_model, extract_hidden_states"


class TokenOnlyError(ValueError):
    """The method needs more than tokens (a draft model or the target's hidden states): vLLM runs those itself."""


def read_settings(method: str | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The flat specdec config (``method`` plus options, no k) that the environment asks for.

    ``method``: fixed by the adapter class (``specdec_vllm.Ngram``, ``specdec_vllm.methods.<name>``); the file
    and ``SPECDEC_VLLM_METHOD`` may then only repeat it. Raises ValueError naming the variable at fault.
    """
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    path = env.get(ENV_CONFIG, "").strip()
    if path:
        try:
            data.update(read_config_file(path))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"{ENV_CONFIG}={path!r}: {exc}") from exc
    if env.get(ENV_METHOD, "").strip():
        data["method"] = env[ENV_METHOD].strip()
    raw = env.get(ENV_OPTIONS, "").strip()
    if raw:
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_OPTIONS}={raw!r} is not valid JSON ({exc}); it must be a JSON object such as "
                             '\'{"prompt_lookup_min": 1, "prompt_lookup_max": 3}\'.') from exc
        if not isinstance(options, dict):
            raise ValueError(f"{ENV_OPTIONS}={raw!r} is a JSON {type(options).__name__}; it must be a JSON object "
                             'such as \'{"prompt_lookup_min": 1, "prompt_lookup_max": 3}\'.')
        data.update(options)
    if method is not None:
        if data.get("method", method) != method:
            raise ValueError(f"this adapter class runs method {method!r}, but {_source(env)} asks for method "
                             f"{data['method']!r}: use specdec_vllm.SpecdecProposer (the method from {ENV_METHOD}) "
                             f"or specdec_vllm.methods.{data['method']}, or drop the method from the environment.")
        data["method"] = method
    if "method" not in data:
        raise ValueError(f"no specdec method given: set {ENV_METHOD} (e.g. {ENV_METHOD}=ngram), put \"method\" in "
                         f"the file {ENV_CONFIG} names, or name the method in the class path "
                         "(speculative_config={\"model\": \"specdec_vllm.methods.ngram\", ...}).")
    return data


def _source(env: Any) -> str:
    return " / ".join(v for v in (ENV_CONFIG, ENV_METHOD, ENV_OPTIONS) if env.get(v, "").strip()) or "the environment"


def build_proposer(settings: dict[str, Any], num_speculative_tokens: int) -> tuple[Proposer, SpeculativeConfig]:
    """The specdec proposer for ``settings`` (from :func:`read_settings`) at vLLM's k, and its config.

    Raises :class:`TokenOnlyError` for a method that needs a draft model or the target's hidden states,
    ValueError for a k that differs from vLLM's or a ``model`` key, and the config's own errors (unknown method
    or option) as they are.
    """
    data = dict(settings)
    method = data.pop("method")
    k = data.pop("num_speculative_tokens", num_speculative_tokens)
    if k != num_speculative_tokens:
        raise ValueError(f"the specdec config sets num_speculative_tokens={k!r}, but vLLM's speculative_config has "
                         f"num_speculative_tokens={num_speculative_tokens}: k is vLLM's; drop the key or make the "
                         "two equal.")
    if data.get("model") is not None:
        raise TokenOnlyError(f"the specdec config for method {method!r} sets model={data['model']!r}: inside vLLM the "
                             "adapter runs token-only methods, which take no model; vLLM runs draft models and "
                             f"heads itself (its methods {_VLLM_METHODS}).")
    data.pop("model", None)
    for key in _IGNORED:
        if key in data:
            logger.warning("specdec config key %s=%r has no effect inside vLLM (vLLM decides when to draft).",
                           key, data.pop(key))
    cls = get_proposer_class(method)
    if cls.takes_draft_model:
        raise TokenOnlyError(f"method {method!r} drafts with a draft model; vLLM runs draft models itself: "
                             f'speculative_config={{"method": "draft_model", "model": "<draft path>", ...}}.')
    overrides = cls.hidden_states_needed is not Proposer.hidden_states_needed
    try:
        config = SpeculativeConfig(method=method, num_speculative_tokens=num_speculative_tokens, **data)
        proposer = cls(config, None)
    except Exception as exc:
        if overrides:  # a hidden-state method that cannot even be configured or built without its target and head
            raise TokenOnlyError(_hidden_message(method, cls)) from exc
        raise
    if proposer.hidden_states_needed() is not None:
        raise TokenOnlyError(_hidden_message(method, cls))
    return proposer, config


def _hidden_message(method: str, cls: type) -> str:
    return (f"method {method!r} ({cls.__module__}.{cls.__name__}) reads the target's hidden states, which vLLM's "
            "custom-class hook does not pass: the adapter runs token-only methods (ngram, suffix, ...); use vLLM's "
            f"own method for it (vLLM runs {_VLLM_METHODS} itself).")

"""One vLLM class path per installed specdec method: ``specdec_vllm.methods.<method>``.

``speculative_config={"model": "specdec_vllm.methods.copycat", "num_speculative_tokens": 4}`` makes vLLM import
this module and read its attribute ``copycat``: a :class:`~specdec_vllm.SpecdecProposer` subclass whose method is
``copycat``, made on first access for any name (the registry checks at construction that a plugin provides it).
Options still come from ``SPECDEC_VLLM_OPTIONS`` / ``SPECDEC_VLLM_CONFIG``.
"""

from __future__ import annotations

from specdec_vllm.proposer import SpecdecProposer

__all__: list[str] = []  # the attributes are made on demand, one per method name

_MADE: dict[str, type[SpecdecProposer]] = {}


def adapter_class(method: str) -> type[SpecdecProposer]:
    """The :class:`SpecdecProposer` subclass that runs ``method`` (one class per name, made once)."""
    if not method.isidentifier():
        raise ValueError(f"method={method!r} is invalid: specdec method names are Python identifiers, e.g. 'ngram'.")
    cls = _MADE.get(method)
    if cls is None:
        cls = type(method, (SpecdecProposer,), {
            "method": method, "__module__": __name__,
            "__doc__": f"specdec method {method!r} as a vLLM custom proposer (see specdec_vllm.SpecdecProposer).",
        })
        _MADE[method] = cls
    return cls


def __getattr__(name: str) -> type[SpecdecProposer]:
    if name.startswith("_"):  # private and dunder lookups (pickle, copy, inspect) are not method names
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return adapter_class(name)

"""Options of the ``ngram`` and ``ngram_gpu`` methods, validated on construction.

Both follow vLLM's defaulting of the n-gram range: if neither ``prompt_lookup_min`` nor
``prompt_lookup_max`` is given both are 5; if only one is given the other copies it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NgramOptions", "NgramGPUOptions", "INDEX_KINDS", "MATCH_KINDS", "COMPILE_MODES"]

INDEX_KINDS = ("scan", "incremental")
MATCH_KINDS = ("leftmost", "recent")
COMPILE_MODES = ("auto", "always", "never")
_DEFAULT_N = 5


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is invalid: it must be one of {', '.join(map(repr, choices))}.")


def _resolve_range(opts: object) -> None:
    lo, hi = opts.prompt_lookup_min, opts.prompt_lookup_max
    for key, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{key}={value!r} is invalid: it must be an int >= 1 (an n-gram length).")
    if lo is None and hi is None:
        lo = hi = _DEFAULT_N
    elif lo is None:
        lo = hi
    elif hi is None:
        hi = lo
    if lo > hi:
        raise ValueError(
            f"prompt_lookup_min={lo} and prompt_lookup_max={hi} are invalid: the rule is "
            "prompt_lookup_min <= prompt_lookup_max."
        )
    # Frozen dataclass: the resolved defaults are written once, here.
    object.__setattr__(opts, "prompt_lookup_min", lo)
    object.__setattr__(opts, "prompt_lookup_max", hi)


@dataclass(frozen=True, slots=True)
class NgramOptions:
    """Knobs of method ``ngram`` (CPU, Numba).

    Attributes:
        prompt_lookup_min: shortest n-gram that may match (int >= 1; see module docstring).
        prompt_lookup_max: longest n-gram tried; the longest matching n in [min, max] wins.
        index: ``"scan"`` (default, vLLM's behaviour) rescans each request's whole history every
            step, O(context) per step. ``"incremental"`` keeps per request a hash index of the
            n-grams seen so far, updated with the tokens appended each step, O(new tokens x
            (max - min + 1)) per step whatever the context length, and proposes exactly what the
            scan proposes. It costs memory: 16-30 bytes per token per n-gram length, plus a copy
            of the history (see :mod:`specdec_ngram.index`).
        match: which earlier occurrence of the longest matching n-gram drafts. ``"leftmost"``
            (default, vLLM's choice) takes the earliest one; ``"recent"`` the latest one, which
            follows recent edits better (a rewritten passage drafts its newest version), at the
            price of shorter drafts when the latest occurrence is close to the end of the sequence.
        num_threads: most Numba threads the scan uses (None = all of ``NUMBA_NUM_THREADS``;
            larger values are clamped to it). Results do not depend on it.
        parallel_threshold: below this many tokens in the batch the scan runs on one thread, as
            waking threads costs more than it saves (int >= 0). vLLM uses 8192 for its KMP pass;
            this scan is ~5x faster per token, so the break-even batch is larger: 2^20 tokens.
        tree_branches: 1 (default): each request drafts a chain. >= 2: a token tree per request (issue 25) of
            up to this many distinct continuations of its matching n-grams, the chain's draft first, then the
            other earlier occurrences' continuations, longest n-gram first and most recent first within one n,
            merged where they share a prefix (at most ``tree_branches * k`` nodes, at most
            ``specdec.validation.MAX_TREE_NODES``); the engine verifies every branch in one forward.
    """

    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    index: str = "scan"
    match: str = "leftmost"
    num_threads: int | None = None
    parallel_threshold: int = 1 << 20
    tree_branches: int = 1

    def __post_init__(self) -> None:
        _resolve_range(self)
        _check_choice("index", self.index, INDEX_KINDS)
        _check_choice("match", self.match, MATCH_KINDS)
        if self.num_threads is not None and (not _is_int(self.num_threads) or self.num_threads < 1):
            raise ValueError(
                f"num_threads={self.num_threads!r} is invalid: it must be None (all Numba threads) "
                "or an int >= 1."
            )
        if not _is_int(self.parallel_threshold) or self.parallel_threshold < 0:
            raise ValueError(
                f"parallel_threshold={self.parallel_threshold!r} is invalid: it must be an int >= 0 "
                "(tokens in the batch below which the scan uses one thread)."
            )
        if not _is_int(self.tree_branches) or self.tree_branches < 1:
            raise ValueError(
                f"tree_branches={self.tree_branches!r} is invalid: it must be an int >= 1 (1: chains; more: token "
                "trees of that many continuations)."
            )


@dataclass(frozen=True, slots=True)
class NgramGPUOptions:
    """Knobs of method ``ngram_gpu`` (torch, whole batch at once; same semantics as ``ngram``).

    Attributes:
        prompt_lookup_min, prompt_lookup_max, match: as for :class:`NgramOptions`.
        compile: ``"auto"`` (default) wraps the kernel in ``torch.compile`` when the token ids live
            on CUDA and runs it eagerly elsewhere; ``"always"`` compiles on any device;
            ``"never"`` always runs eagerly.
    """

    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    match: str = "leftmost"
    compile: str = "auto"

    def __post_init__(self) -> None:
        _resolve_range(self)
        _check_choice("match", self.match, MATCH_KINDS)
        _check_choice("compile", self.compile, COMPILE_MODES)

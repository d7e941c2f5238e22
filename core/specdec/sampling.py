"""Per-request sampling parameters and the batched tensors the sampler reads."""

from __future__ import annotations

import numbers
import reprlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["SamplingParams", "SamplingMetadata"]

# A positive temperature below this underflows to 0 (or a float32 denormal) in the sampler's
# tensors, or overflows logits / temperature to inf: the output turns to garbage (all token 0).
MIN_TEMPERATURE = 1e-6
# Far above anything useful (the distribution is uniform to float32 precision long before); a
# larger value is taken for a typo.
MAX_TEMPERATURE = 1e4
# top_k goes into an int64 tensor (2**63 overflowed it) and max_model_len caps max_tokens anyway:
# 2**31 - 1 is far above any vocabulary or context, and fits any int tensor. torch.Generator's
# manual_seed takes an int64 or a uint64.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SEED_RANGE = (-(2**63), 2**64 - 1)


class _ShortRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        # repr() of an int over 4300 digits raises ValueError; an error message must not.
        return repr(x) if x.bit_length() <= 128 else f"<int of about {int(x.bit_length() * 0.30103)} digits>"


_repr = _ShortRepr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxtuple = 10


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to a readable length for error messages (huge ints, long lists)."""
    return _repr.repr(value)


def _real(name: str, value: Any, fix: str) -> float:
    """``value`` as a float when it is a real number (numpy scalars too, not a bool); else TypeError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={short_repr(value)} is invalid: it must be a number, not "
                        f"{type(value).__name__}. {fix}")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise ValueError(f"{name}={short_repr(value)} is invalid: it is too large. {fix}") from None


def _int(name: str, value: Any, lo: int, hi: int, fix: str) -> int:
    """``value`` as an int in ``[lo, hi]`` (numpy integers too, not a bool); else TypeError/ValueError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}={short_repr(value)} is invalid: it must be an int, not {type(value).__name__}. {fix}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name}={short_repr(value)} is invalid: it must be an int >= {lo} and <= {hi}. {fix}")
    return value


def _stop_ids(value: Any) -> list[int]:
    """``stop_token_ids`` as a list of ints >= 0 (None: none)."""
    if value is None:
        return []
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple, set, frozenset, range)):
        one_id = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        example = f"[{short_repr(value)}]" if one_id else "[2, 7]"
        raise TypeError(f"stop_token_ids={short_repr(value)} is invalid: it must be a list of token ids, not "
                        f"{type(value).__name__}. Pass a list, e.g. stop_token_ids={example}.")
    out = []
    for t in value:
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"stop_token_ids={short_repr(value)} is invalid: it must be a list of ints >= 0, "
                            f"and holds {short_repr(t)} ({type(t).__name__}). Pass token ids as ints, e.g. "
                            "stop_token_ids=[2, 7].")
        if not 0 <= t <= INT64_MAX:
            raise ValueError(f"stop_token_ids={short_repr(value)} is invalid: it must be a list of ints >= 0 "
                             f"(and < 2**63), and holds {short_repr(t)}. Remove that id.")
        out.append(int(t))
    return out


@dataclass(slots=True)
class SamplingParams:
    """How one request samples.

    Every field is checked (and numpy scalars are turned into Python numbers) when the object is
    built, and again by ``LLM.generate``; a bad value raises ValueError, a wrong type TypeError.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it. Must be 0 or in
            ``[1e-6, 1e4]``.
        top_k: keep the k most likely tokens; 0 (or -1) turns it off. At most ``2**31 - 1``.
        top_p: nucleus mass in (0, 1]; 1 turns it off.
        seed: seeds a per-request generator, so the request's output is reproducible. Any int
            ``torch.Generator.manual_seed`` takes: ``[-2**63, 2**64 - 1]``.
        max_tokens: most tokens to generate, in ``[1, 2**31 - 1]``.
        stop_token_ids: generation stops after any of these (the token is kept in the output). A
            list of ints >= 0; ``LLM.generate`` also checks that they are in the vocabulary.
        ignore_eos: keep generating past the tokenizer's EOS token (True or False).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check and normalise every field (``LLM.generate`` calls this again, so a field set after
        construction is checked too)."""
        greedy_fix = "Pass temperature=0.0 for greedy decoding, or e.g. temperature=0.8 to sample."
        t = _real("temperature", self.temperature, greedy_fix)
        if not (t == 0.0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):  # nan fails every comparison
            raise ValueError(f"temperature={short_repr(self.temperature)} is invalid: it must be a number >= 0, "
                             f"either 0 (greedy) or between {MIN_TEMPERATURE:g} and {MAX_TEMPERATURE:g}. {greedy_fix}")
        self.temperature = t
        self.top_k = _int("top_k", self.top_k, -1, INT32_MAX, "Pass e.g. top_k=50, or top_k=0 (or -1) to turn it off.")
        if self.top_k == -1:
            self.top_k = 0
        top_p_fix = "Pass e.g. top_p=0.9, or top_p=1.0 to turn it off."
        p = _real("top_p", self.top_p, top_p_fix)
        if not 0.0 < p <= 1.0:  # nan fails too
            raise ValueError(f"top_p={short_repr(self.top_p)} is invalid: it must be in (0, 1]. {top_p_fix}")
        self.top_p = p
        self.max_tokens = _int("max_tokens", self.max_tokens, 1, INT32_MAX,
                               "Pass e.g. max_tokens=16 (max_model_len also caps the output).")
        if self.seed is not None:
            self.seed = _int("seed", self.seed, *SEED_RANGE, "Pass e.g. seed=0, or seed=None for no seed.")
        self.stop_token_ids = _stop_ids(self.stop_token_ids)
        if isinstance(self.ignore_eos, np.bool_):
            self.ignore_eos = bool(self.ignore_eos)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos={short_repr(self.ignore_eos)} is invalid: it must be True or False, not "
                            f"{type(self.ignore_eos).__name__}. Pass ignore_eos=True to generate past EOS.")

    @property
    def greedy(self) -> bool:
        """True when temperature is 0."""
        return self.temperature == 0.0

    @property
    def keyed(self) -> bool:
        """True when the request samples with a seed (temperature > 0): its tokens are keyed samples
        (:mod:`specdec.keyed`), and its drafts are verified by the keyed rule, which reads no draft probs."""
        return self.temperature > 0.0 and self.seed is not None

    @property
    def free(self) -> bool:
        """True when the request samples without a seed (temperature > 0): the only kind whose drafts are
        verified by the ``min(1, p/q)`` rule, reading their draft probs."""
        return self.temperature > 0.0 and self.seed is None


@dataclass
class SamplingMetadata:
    """Batched sampling parameters, one entry per request.

    Attributes:
        temperature: ``[B]`` float32; 0 marks a greedy request.
        top_k: ``[B]`` int64; 0 means off.
        top_p: ``[B]`` float32; 1 means off.
        generators: request index -> ``torch.Generator`` for seeded requests.
        host_flags: (any greedy, any random, any random request with top-k, any with top-p), known
            on the host when built by :meth:`from_params`, so the sampler needs no device read for
            them; None means the sampler computes them from the tensors.
        all_greedy / all_random: shortcuts that let the sampler skip work.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    host_flags: tuple[bool, bool, bool, bool] | None = None

    @property
    def all_greedy(self) -> bool:
        """Every request is greedy (reads the device tensor)."""
        return bool((self.temperature == 0).all())

    @property
    def all_random(self) -> bool:
        """Every request samples (reads the device tensor)."""
        return bool((self.temperature > 0).all())

    @property
    def needs_top_k(self) -> bool:
        """Some request has top-k on (reads the device tensor)."""
        return bool((self.top_k > 0).any())

    @property
    def needs_top_p(self) -> bool:
        """Some request has top-p below 1 (reads the device tensor)."""
        return bool((self.top_p < 1.0).any())

    @classmethod
    def from_params(
        cls,
        params: list[SamplingParams],
        device: torch.device | str = "cpu",
        generators: dict[int, torch.Generator] | None = None,
    ) -> SamplingMetadata:
        """Batch ``params``. Seeded requests get a fresh generator unless ``generators`` gives one
        (the engine passes its long-lived per-request generators so a request's random stream
        continues across steps)."""
        device = torch.device(device)
        gens = dict(generators or {})
        for i, p in enumerate(params):
            if p.seed is not None and i not in gens:
                g = torch.Generator(device=device)
                g.manual_seed(p.seed)
                gens[i] = g
        return cls(
            temperature=torch.tensor([float(p.temperature) for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([int(p.top_k) for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([float(p.top_p) for p in params], dtype=torch.float32, device=device),
            generators=gens,
            host_flags=(
                any(p.temperature == 0 for p in params),
                any(p.temperature > 0 for p in params),
                any(p.temperature > 0 and p.top_k > 0 for p in params),
                any(p.temperature > 0 and p.top_p < 1.0 for p in params),
            ),
        )

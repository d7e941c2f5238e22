"""Per-request sampling parameters and the batched tensors the sampler reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.errors import check_int

__all__ = ["SamplingParams", "SamplingMetadata"]


@dataclass(slots=True)
class SamplingParams:
    """How one request samples.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it. Must be >= 0.
        top_k: keep the k most likely tokens; 0 (or -1) turns it off.
        top_p: nucleus mass in (0, 1]; 1 turns it off.
        seed: seeds a per-request generator, so the request's output is reproducible.
        max_tokens: most tokens to generate (>= 1).
        stop_token_ids: generation stops after any of these (the token is kept in the output).
        ignore_eos: keep generating past the tokenizer's EOS token.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(
                f"temperature={self.temperature!r} is invalid: it must be a number >= 0 "
                "(0 means greedy). Pass temperature=0.0 for greedy decoding."
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(
                f"top_k={self.top_k!r} is invalid: it must be an int >= 0 (0 or -1 turn it off)."
            )
        if self.top_k == -1:
            self.top_k = 0
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(
                f"top_p={self.top_p!r} is invalid: it must be in (0, 1]. Pass top_p=1.0 to turn it off."
            )
        check_int("max_tokens", self.max_tokens, 1)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r} is invalid: it must be an int or None.")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids={self.stop_token_ids!r} is invalid: it must be a list of ints >= 0."
            )

    @property
    def greedy(self) -> bool:
        """True when temperature is 0."""
        return self.temperature == 0.0


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

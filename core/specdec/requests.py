"""A request's state in the engine, what a finished one returns, and how prompts become requests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdec.sampling import SamplingParams
from specdec.validation import check_sampling_params, validate_prompts

__all__ = ["Request", "RequestOutput", "RequestMetrics", "make_requests"]


@dataclass(slots=True)
class RequestMetrics:
    """Per-request speculation counters and timings.

    ``acceptance_length`` = 1 + accepted / drafts: tokens produced per verify step that drafted.
    """

    num_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    first_token_time: float = 0.0
    latency: float = 0.0

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / drafts (1.0 when nothing was drafted)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(slots=True)
class RequestOutput:
    """One finished request: generated ``token_ids`` (prompt excluded), ``text`` when a tokenizer is
    present, ``finish_reason`` (``"stop"``: EOS or a stop token, ``"length"``: max_tokens or
    max_model_len) and ``metrics``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    metrics: RequestMetrics


@dataclass(slots=True)
class Request:
    """One prompt from waiting to finished. ``slot`` is its KV slot and token-buffer row while it runs
    (-1 before); ``hidden`` holds the target hidden states its proposer reads next step (row ranges of the
    target's outputs and the last accepted row: :meth:`specdec.token_buffer.TokenBuffer.keep_hidden`); ``bare``
    the positions of its plain steps that collected none (recomputed before its proposer's next call)."""

    req_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    last_sampled: list[int] = field(default_factory=list)
    slot: int = -1
    finish_reason: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    start_time: float = 0.0
    hidden: tuple[list[Any], int, int] | None = None
    bare: list[int] | None = None  # [first position, count]: plain steps whose hidden states were not collected
    in_proposer: bool = False
    call: Any = None  # the generate call (specdec.calls.Call) it belongs to
    num_tokens: int = 0  # prompt + output, kept by LLM._append (read several times a step)

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_ids) + len(self.output)

    def to_output(self, tokenizer: Any) -> RequestOutput:
        text = None
        if tokenizer is not None:
            text = tokenizer.decode(self.output, skip_special_tokens=True)
        return RequestOutput(self.req_id, self.prompt, list(self.prompt_ids), list(self.output), text,
                             self.finish_reason or "length", self.metrics)


def make_requests(prompts: Any, sampling_params: SamplingParams | list[SamplingParams] | None, tokenizer: Any,
                  vocab_size: int, max_model_len: int, device: torch.device, ids: Iterator[int]) -> list[Request]:
    """``LLM.generate``'s prompts and params, every one checked before any is queued (a bad one
    raises naming its index); request ids come from ``ids``. ``device`` is unused (kept for callers): seeded
    requests need no generator, their draws are keyed by (seed, position) (:mod:`specdec.keyed`)."""
    prompt_list = _as_prompt_list(prompts)
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, (list, tuple)):
        params = list(sampling_params)
    else:
        params = [sampling_params] * len(prompt_list)
    if len(params) != len(prompt_list):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompt_list)} prompts; pass one "
                         "SamplingParams or one per prompt.")
    token_lists = validate_prompts(prompt_list, tokenizer, vocab_size, max_model_len)
    check_sampling_params(params, vocab_size)
    requests = []
    for prompt, token_ids, p in zip(prompt_list, token_lists, params):
        requests.append(Request(str(next(ids)), prompt if isinstance(prompt, str) else None, token_ids, p))
    return requests


def _as_prompt_list(prompts: Any) -> list[str | list[int]]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (np.ndarray, torch.Tensor)) and prompts.ndim in (1, 2):
        return [prompts] if prompts.ndim == 1 else list(prompts)  # one prompt of ids, or one per row
    if isinstance(prompts, (list, tuple)):
        if len(prompts) == 0:
            raise ValueError("prompts is an empty list: pass at least one prompt (a string or token ids).")
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]
        return list(prompts)
    raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; got "
                    f"{type(prompts).__name__}.")

"""The verified model's contract: the :class:`TargetModel` protocol the engine needs.

Its reference implementation is :class:`specdec.runner.ModelRunner`, which runs any Hugging Face
causal LM; ``HFTargetModel``, the name the target has always had, is that class (kept here and in
``specdec`` so existing code keeps working).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from specdec.proposer import HiddenStateRequest
from specdec.runner import ModelRunner, TargetOutput, kv_cache_bytes, read_model_config, resolve_device, resolve_dtype

__all__ = ["HFTargetModel", "ModelRunner", "TargetModel", "TargetOutput", "kv_cache_bytes", "read_model_config",
           "resolve_device", "resolve_dtype"]

HFTargetModel = ModelRunner


@runtime_checkable
class TargetModel(Protocol):
    """What the engine and model-based proposers need from a model that runs with a KV cache.

    Each request lives in a *slot*; ``lengths[slot]`` tokens of it have valid KV entries.
    ``forward`` processes new tokens at positions ``lengths[slot] + j`` without committing them;
    ``advance`` commits a prefix of them (rejected drafts are simply never committed).

    Optional: a model whose class sets ``accepts_draft_ids = True`` takes ``draft_ids`` in
    ``forward`` (see :meth:`specdec.ModelRunner.forward`); the engine then verifies greedy drafts that a
    proposer leaves on the device without copying them to the host first.
    """

    vocab_size: int
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    model_name: str

    def allocate(self, num_slots: int) -> None: ...
    def forward(self, slots: list[int], tokens: list[list[int]], num_logits: list[int],
                hidden: HiddenStateRequest | None = None) -> TargetOutput: ...
    def ensure_slots(self, num_slots: int) -> None: ...
    def advance(self, slot: int, num_tokens: int) -> None: ...
    def reset_slot(self, slot: int) -> None: ...
    def get_input_embeddings(self) -> nn.Module: ...
    def get_output_embeddings(self) -> nn.Module: ...

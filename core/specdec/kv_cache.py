"""A slot-indexed KV cache that plugs into Hugging Face attention layers.

Every request owns one slot (a row of a preallocated ``[slots, kv_heads, capacity, head_dim]``
buffer per layer) and a valid length. A forward writes the new tokens' keys/values at
``length + j`` (vLLM's slot mapping, one row per request), so rejecting drafts is only a matter of
not advancing the length: the stale entries are masked out and overwritten by the next step. No
cache copy ever happens for rejected drafts.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

__all__ = ["SlotKVCache"]


class SlotKVCache(Cache):
    """Per-slot KV buffers for ``num_layers`` layers; ``capacity`` positions per slot plus one
    scratch position where padding tokens write (so they never touch a request's entries). ``keys[i]`` and
    ``values[i]`` are views of one tensor, :attr:`kv` ``[2, num_layers, slots, kv_heads, capacity + 1, head_dim]``,
    so that moving entries across every layer (a tree step's accepted path) is one gather and one scatter."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(layers=[])
        self.kv = torch.zeros((2, num_layers, num_slots, num_kv_heads, capacity + 1, head_dim), dtype=dtype,
                              device=device)
        # one select per layer (unbind's views may not be written in place under autograd)
        self.keys = [self.kv[0, i] for i in range(num_layers)]
        self.values = [self.kv[1, i] for i in range(num_layers)]
        self.capacity = capacity
        self.scratch = capacity
        # Set by the runner before each forward:
        self._rows: slice | torch.Tensor = slice(0, 0)
        self._row_index = torch.zeros(0, 1, dtype=torch.long, device=device)  # [b, 1]
        self._write_pos = torch.zeros(0, 0, dtype=torch.long, device=device)  # [b, q]
        self._kv_len = 0

    def prepare(self, rows: slice | torch.Tensor, row_index: torch.Tensor, write_pos: torch.Tensor,
                kv_len: int) -> None:
        """Point the next forward at ``rows`` (a slice when contiguous: views, no copies), writing
        query token j of row i at ``write_pos[i, j]`` and exposing the first ``kv_len`` positions."""
        self._rows = rows
        self._row_index = row_index
        self._write_pos = write_pos
        self._kv_len = kv_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        # key_states: [b, kv_heads, q, d] -> indexed assignment wants [b, q, kv_heads, d]
        k_buf[self._row_index, :, self._write_pos] = key_states.transpose(1, 2).to(k_buf.dtype)
        v_buf[self._row_index, :, self._write_pos] = value_states.transpose(1, 2).to(v_buf.dtype)
        return k_buf[self._rows, :, : self._kv_len], v_buf[self._rows, :, : self._kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._kv_len, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    @property
    def is_compileable(self) -> bool:
        return False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("SlotKVCache does not support beam search")

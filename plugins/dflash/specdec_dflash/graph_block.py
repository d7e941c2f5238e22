"""A capture-ready greedy DFlash step: the context append of a decode step and the block forward in one
function over static buffers, captured in a CUDA graph per (batch, KV) bucket.

The eager path (:meth:`specdec_dflash.proposer.DFlashProposer.propose`) builds its gathers, masks and
positions on the host and launches ~20 kernels per layer with shapes that change every step, so at batch 1
drafting costs more than the target's own step. Here, per bucket ``(bb, kb)``, the rows of every tensor are
the cache's slots ``0 .. bb - 1`` and the host hands over only one static integer buffer (per slot: the
bonus token, the bonus position ``p`` = context length, the first new context position and how many new
context positions there are, then the batch's slots in request order) and a device copy of the new
positions' target features ``[bb, q, F]`` (``q = k + 1``: a verify step hands over at most the previous bonus
and k accepted drafts). On the device:

1. **append**: ``fc`` + ``hidden_norm`` of the features, every layer's roped K/V written at the new positions
   of its slot (padding columns and idle slots write the cache's scratch position);
2. **block**: ``[bonus, mask x (block_size - 1)]`` at ``p ..``, attending to the first ``p`` cached
   positions of its slot (within the KV bucket ``kb >= max p``) and to the whole block;
3. the argmax of the logits at block indices ``1..k`` (target ids) into a static ``[bb, k]`` buffer.

The math is :class:`specdec_dflash.heads.DFlashDraft`'s own modules (``context``, ``DFlashLayer.kv``,
``block_hidden``, ``logits``), so the eager and captured paths cannot drift apart. A hand-over wider than
``q`` (the prompt after a prefill) is appended eagerly first; the graph then appends nothing. With
``use_graphs=False`` the same function runs eagerly on the same buffers, so CPU tests cover its logic.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specdec.cuda_graphs import SlotStepGraphs, StaticStep
from specdec_dflash.heads import ContextKVCache, DFlashDraft

__all__ = ["CapturedBlock"]

logger = logging.getLogger("specdec.dflash")


class CapturedBlock(SlotStepGraphs):
    """Greedy DFlash drafting over a :class:`ContextKVCache`, one static step per (batch, KV) bucket. Holds the
    cache's tensors: rebuild it when the cache is reallocated (the proposer does, when slots grow)."""

    def __init__(self, draft: DFlashDraft, cache: ContextKVCache, k: int, use_graphs: bool) -> None:
        super().__init__(cache.num_slots, cache.capacity, k, draft.cfg.feature_size, use_graphs)
        self.draft, self.cache = draft, cache

    @property
    def blocks(self) -> dict[tuple[int, int], StaticStep]:
        """The (batch, KV) buckets' static steps."""
        return self.steps

    @classmethod
    def build(cls, draft: DFlashDraft, cache: ContextKVCache, k: int, use_graphs: bool = True) -> CapturedBlock | None:
        """Prepare (``use_graphs=False``) or capture every (batch, KV) bucket, or return None (with a log line)
        where that fails: the proposer then drafts eagerly."""
        if k < 1 or (use_graphs and cache.keys[0].device.type != "cuda"):
            return None
        block = cls(draft, cache, k, use_graphs)
        return block if block.capture_all("dflash draft steps", "drafting eagerly", logger) else None

    @torch.inference_mode()
    def _capture(self, bb: int, kb: int) -> StaticStep:
        draft, cache, k, q, cap = self.draft, self.cache, self.k, self.q, self.cap
        cfg = draft.cfg
        dev = cache.keys[0].device
        inputs, host, feats, drafts = self.buffers(bb, 5 * bb, cache.keys[0].dtype, dev)
        bonus, p, first, new = (inputs[i * bb: (i + 1) * bb] for i in range(4))
        cols = torch.arange(q, device=dev)[None, :]
        rows = torch.arange(bb, device=dev)[:, None].expand(bb, q)
        masks = torch.full((bb, cfg.block_size - 1), cfg.mask_token_id, dtype=torch.long, device=dev)

        def fn() -> torch.Tensor:
            # append: padding repeats the last new position (a real row) and writes scratch
            pos = first[:, None] + torch.minimum(cols, (new - 1).clamp(min=0)[:, None])  # [bb, q]
            write = torch.where(cols < new[:, None], pos, cap)
            ctx = draft.context(feats)
            for layer, keys, values in zip(draft.layers, cache.keys, cache.values):
                kk, vv = layer.kv(ctx, pos, draft.inv_freq)
                keys[rows, :, write] = kk.transpose(1, 2).to(keys.dtype)
                values[rows, :, write] = vv.transpose(1, 2).to(values.dtype)
            # block over the first p cached positions of each slot
            block = torch.cat((bonus[:, None], masks), 1)
            ctx_kv = [(kc[:bb, :, :kb], vc[:bb, :, :kb]) for kc, vc in zip(cache.keys, cache.values)]
            hidden = draft.block_hidden(draft.embed_tokens(block), p, p, ctx_kv)
            return drafts.copy_(draft.logits(hidden[:, 1: 1 + k]).argmax(-1))

        return self.finish(inputs, host, feats, drafts, fn)

    def run(self, slots: list[int], bonus: np.ndarray, p: np.ndarray, first: np.ndarray, new: np.ndarray,
            feats: torch.Tensor | None) -> torch.Tensor | None:
        """k greedy drafts (target ids) ``[len(slots), k]`` on the device, in the order of ``slots``, or None when
        no bucket fits (the caller drafts eagerly). Request i: bonus token ``bonus[i]`` at position ``p[i]``
        (its context length), ``new[i]`` new context positions from ``first[i]`` whose target features are
        ``feats[i, :new[i]]`` (``[B, W <= q, F]`` on the device; None when ``new`` is all zero)."""
        b = len(slots)
        if not slots or int(new.max()) > self.q or (feats is not None and feats.shape[-1] != self.width):
            return None
        key = self.bucket(slots, int(p.max()))
        if key is None:
            return None
        bb = key[0]
        host = self.steps[key].host.numpy()
        host[: 4 * bb] = 0  # every slot idle (nothing new, bonus 0 at position 0) but the batch's
        s = np.asarray(slots)
        host[s], host[bb + s], host[2 * bb + s], host[3 * bb + s] = bonus, p, first, new
        host[4 * bb: 4 * bb + b] = s
        return self.launch(key, 4 * bb, b, feats)

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
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec.cuda_graphs import batch_buckets, capture_buckets, capture_graph, kv_buckets
from specdec_dflash.heads import ContextKVCache, DFlashDraft

__all__ = ["CapturedBlock"]

logger = logging.getLogger("specdec.dflash")


@dataclass
class _Block:
    inputs: torch.Tensor  # [4 * bb + bb] long, device: bonus, p, first new position, new count per slot; slot order
    host: torch.Tensor  # the same layout on the host (pinned on CUDA)
    feats: torch.Tensor  # [bb, q, F] device: the new context positions' target features, row = slot
    drafts: torch.Tensor  # [bb, k] long output (target ids), row = slot
    graph: torch.cuda.CUDAGraph | None
    fn: Any


class CapturedBlock:
    """Greedy DFlash drafting over a :class:`ContextKVCache`, one static step per (batch, KV) bucket. Holds the
    cache's tensors: rebuild it when the cache is reallocated (the proposer does, when slots grow)."""

    def __init__(self, draft: DFlashDraft, cache: ContextKVCache, k: int, use_graphs: bool) -> None:
        self.draft, self.cache, self.k, self.q = draft, cache, k, k + 1
        self.use_graphs = use_graphs
        self.cap = cache.capacity
        self.width = draft.cfg.feature_size
        self.batches = batch_buckets(cache.num_slots)
        self.kvs = kv_buckets(cache.capacity)
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.runs = 0  # steps drafted (for tests and profiles)
        self.last: tuple[int, int] | None = None  # the (batch, KV) bucket of the last run

    @classmethod
    def build(cls, draft: DFlashDraft, cache: ContextKVCache, k: int, use_graphs: bool = True) -> CapturedBlock | None:
        """Prepare (``use_graphs=False``) or capture every (batch, KV) bucket, or return None (with a log line)
        where that fails: the proposer then drafts eagerly."""
        if k < 1 or (use_graphs and cache.keys[0].device.type != "cuda"):
            return None
        block = cls(draft, cache, k, use_graphs)
        t0 = time.perf_counter()
        try:
            shapes = [(b, kv) for b in block.batches for kv in block.kvs]
            block.blocks = capture_buckets(shapes, block._capture, desc="Capturing dflash draft steps",
                                           use_graphs=use_graphs)
        except Exception as exc:  # a draft whose step cannot be captured: the eager path stays
            logger.warning("dflash draft step capture failed (%s: %s): drafting eagerly.", type(exc).__name__, exc)
            return None
        logger.info("%s dflash greedy draft steps (k=%d) for batch %s x kv %s in %.1f s.",
                    "Captured" if use_graphs else "Prepared", k, block.batches, block.kvs, time.perf_counter() - t0)
        return block

    @torch.inference_mode()
    def _capture(self, bb: int, kb: int) -> _Block:
        draft, cache, k, q, cap = self.draft, self.cache, self.k, self.q, self.cap
        cfg = draft.cfg
        dev = cache.keys[0].device
        inputs = torch.zeros(5 * bb, dtype=torch.long, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        feats = torch.zeros(bb, q, self.width, dtype=cache.keys[0].dtype, device=dev)
        drafts = torch.zeros(bb, k, dtype=torch.long, device=dev)
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

        if not self.use_graphs:
            return _Block(inputs, host, feats, drafts, None, fn)
        graph, _ = capture_graph(fn, self.pool)  # inputs are zeros: every slot idle, warm-ups write scratch only
        return _Block(inputs, host, feats, drafts, graph, fn)

    def run(self, slots: list[int], bonus: np.ndarray, p: np.ndarray, first: np.ndarray, new: np.ndarray,
            feats: torch.Tensor | None) -> torch.Tensor | None:
        """k greedy drafts (target ids) ``[len(slots), k]`` on the device, in the order of ``slots``, or None when
        no bucket fits (the caller drafts eagerly). Request i: bonus token ``bonus[i]`` at position ``p[i]``
        (its context length), ``new[i]`` new context positions from ``first[i]`` whose target features are
        ``feats[i, :new[i]]`` (``[B, W <= q, F]`` on the device; None when ``new`` is all zero)."""
        b = len(slots)
        if not slots or int(new.max()) > self.q or (feats is not None and feats.shape[-1] != self.width):
            return None
        bb = next((x for x in self.batches if x > max(slots)), None)
        kb = next((x for x in self.kvs if x >= int(p.max())), None)
        if bb is None or kb is None:
            return None
        c = self.blocks[(bb, kb)]
        host = c.host.numpy()
        host[: 4 * bb] = 0  # every slot idle (nothing new, bonus 0 at position 0) but the batch's
        s = np.asarray(slots)
        host[s], host[bb + s], host[2 * bb + s], host[3 * bb + s] = bonus, p, first, new
        host[4 * bb: 4 * bb + b] = s
        cuda = c.inputs.device.type == "cuda"
        c.inputs.copy_(c.host, non_blocking=cuda)
        order = c.inputs[4 * bb: 4 * bb + b]
        if feats is not None:
            c.feats[order, : feats.shape[1]] = feats.to(c.feats.dtype)
        if c.graph is not None:
            c.graph.replay()
        else:
            c.fn()
        self.runs += 1
        self.last = (bb, kb)
        return c.drafts.index_select(0, order)

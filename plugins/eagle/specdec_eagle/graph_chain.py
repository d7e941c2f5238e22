"""A capture-ready greedy chain for EAGLE heads: the catch-up forward and the k - 1 one-token head steps of
a decode step in one function over static buffers, captured in a CUDA graph per (batch, KV) bucket.

Modelled on ``specdec_draft_model.chain.GreedyChain``. :class:`specdec_eagle.chain.GreedyHeadChain` makes
every position and mask on the host, so it cannot be captured; here the host hands over only, per bucket,
one static buffer (catch-up token ids ``[bb, k + 1]``, ``start``, ``n``, the slots in request order) plus a
device copy of the target's features ``[bb, k + 1, F]``, and the function computes on the device:

1. the catch-up: row ``r`` is slot ``r``; its ``n`` real tokens sit at head positions ``start ..
   start + n - 1`` (padding repeats the last position and writes the cache's scratch position); the output
   at the last real token gives draft 1;
2. ``k - 1`` one-token steps, draft j and the head's own output fed back at position
   ``start + n - 2 + j`` (clamped to the capacity: past it, the KV write goes to scratch and the proposer
   drops the draft). Slots with ``n == 0`` (not in the batch) stay idle: every write goes to scratch.

The head math is :class:`GreedyHeadChain`'s (its prepared weights, ``_step`` and ``_argmax``), with a mask
over the whole KV bucket. Drafts (target ids) land in a static ``[bb, k]`` buffer. With
``use_graphs=False`` the same function runs eagerly on the same buffers, so CPU tests cover its logic.

Status: the eager version is tested on the CPU against the module path; the captured version passed
``tests/plugins/eagle/test_eagle_graph_chain.py::test_captured_chain_lossless_on_cuda`` on the H200 (2026-12-02),
so the proposer's ``draft_cuda_graphs`` option is on by default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch

from specdec.cuda_graphs import SlotStepGraphs, StaticStep
from specdec_eagle.chain import GreedyHeadChain
from specdec_eagle.heads import EagleHead, HeadKVCache

__all__ = ["CapturedHeadChain", "FeatureCopier"]

# Writes a step's target features into a chain's feature buffer [bb, q, F], given the step's slots in request order.
FeatureCopier = Callable[[torch.Tensor, list[int]], None]

logger = logging.getLogger("specdec.eagle")


class CapturedHeadChain(SlotStepGraphs):
    """Greedy drafting for one head over its slot KV cache, one static chain per (batch, KV) bucket. Holds
    the cache's tensors: rebuild it when the cache is reallocated (the proposer does, when slots grow)."""

    def __init__(self, lean: GreedyHeadChain, cache: HeadKVCache, k: int, use_graphs: bool) -> None:
        super().__init__(cache.num_slots, cache.capacity, k, lean.cfg.feature_size, use_graphs)
        self.lean, self.cache = lean, cache

    @property
    def chains(self) -> dict[tuple[int, int], StaticStep]:
        """The (batch, KV) buckets' static chains."""
        return self.steps

    @classmethod
    def build(cls, head: EagleHead, cache: HeadKVCache, k: int, use_graphs: bool = True,
              lean: GreedyHeadChain | None = None, kernels: ModuleType | None = None) -> CapturedHeadChain | None:
        """Prepare (``use_graphs=False``) or capture every (batch, KV) bucket, or return None (with a log
        line) where that fails. ``lean``: a :class:`GreedyHeadChain` of ``head`` to share its weights; else one
        is made with ``kernels`` (its fused head steps)."""
        if k < 1 or (use_graphs and cache.keys.device.type != "cuda"):
            return None
        chain = cls(lean or GreedyHeadChain(head, cache.capacity, kernels), cache, k, use_graphs)
        ok = chain.capture_all("eagle draft chains", "drafting one head forward at a time", logger)
        return chain if ok else None

    @torch.inference_mode()
    def _capture(self, bb: int, kb: int) -> StaticStep:
        lean, cache, k, q, cap = self.lean, self.cache, self.k, self.q, self.cap
        dev = cache.keys.device
        inputs, host, feats, drafts = self.buffers(bb, bb * q + 3 * bb, cache.keys.dtype, dev)
        ids, start, n = inputs[: bb * q].view(bb, q), inputs[bb * q: bb * q + bb], inputs[bb * q + bb: bb * q + 2 * bb]
        rows = torch.arange(bb, device=dev)
        cols = torch.arange(q, device=dev)[None, :]
        span = torch.arange(kb, device=dev)

        def fn() -> torch.Tensor:
            live = n > 0
            last = (n - 1).clamp(min=0)  # [bb] the last real token's column (0 for idle rows)
            pos = start[:, None] + torch.minimum(cols, last[:, None])  # [bb, q] padding repeats the last position
            write = torch.where(cols < n[:, None], pos, cap)
            mask = (span[None, None, :] <= pos[:, :, None])[:, None]  # [bb, 1, q, kb]
            h = lean._step(cache, rows, True, kb, lean.embed[ids], feats, pos, write, mask,
                           (start + last + 1).int())
            h = h[rows, last][:, None]  # [bb, 1, H]
            toks = [lean._argmax(h[:, 0])]  # draft-vocabulary ids [bb] each
            p, step = start + last, live.long()
            for _ in range(1, k):
                p = p + step  # idle rows stay put (and write scratch)
                pc = p.clamp(max=cap - 1)
                wr = torch.where(live & (p < cap), pc, cap)
                # [bb, 1, 1, kb]; the fused attention stops at each row's end (pc + 1): no mask needed
                m = None if lean.kernels is not None else (span[None, :] <= pc[:, None])[:, None, None]
                h = lean._step(cache, rows, True, kb, lean.embed_draft[toks[-1][:, None]], h, pc[:, None],
                               wr[:, None], m, (pc + 1).int())
                toks.append(lean._argmax(h[:, 0]))
            out = torch.stack(toks, dim=1)
            if lean.d2t is not None:
                out = out + lean.d2t[out]
            return drafts.copy_(out)

        return self.finish(inputs, host, feats, drafts, fn)

    def run(self, slots: list[int], tokens: np.ndarray, feats: torch.Tensor | FeatureCopier, start: np.ndarray,
            n: np.ndarray) -> torch.Tensor | None:
        """k greedy drafts (target ids) ``[len(slots), k]`` on the device, in the order of ``slots``, or None
        when no chain fits (the caller drafts another way). Catch-up of row i: ``tokens[i, :n[i]]`` with
        target features ``feats[i, :n[i]]`` (``[B, W, F]`` on the device) at head positions ``start[i] ..
        start[i] + n[i] - 1``; padding columns are ignored. Writes the catch-up's KV (the caller commits it)
        and the first k - 1 drafts' KV (never committed). ``feats`` may instead be a :data:`FeatureCopier`,
        called with the feature buffer ``[bb, q, F]`` and ``slots`` to write the rows itself."""
        b, w = tokens.shape
        if not slots or w > self.q or int(n.min()) < 1 or (not callable(feats) and feats.shape[-1] != self.width):
            return None
        key = self.bucket(slots, min(int((start + n).max()) + self.k - 1, self.cap))  # the last step reads to here
        if key is None:
            return None
        bb, q = key[0], self.q
        host = self.steps[key].host.numpy()
        host[bb * q: bb * q + 2 * bb] = 0  # every row idle (start 0, n 0) but the batch's
        host[: bb * q].reshape(bb, q)[slots, :w] = tokens
        host[bb * q + np.asarray(slots)] = start
        host[bb * q + bb + np.asarray(slots)] = n
        host[bb * q + 2 * bb: bb * q + 2 * bb + b] = slots
        return self.launch(key, bb * q + 2 * bb, b, feats)

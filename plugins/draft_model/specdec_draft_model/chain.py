"""Greedy draft chains: all k draft forwards of a step in one CUDA graph, drafts read once.

Drafting k tokens one forward at a time costs k host round trips: each argmax is read back so the
next forward's input can be packed on the host. Greedy drafting does not need the host in between:
the argmax of step j is the input of step j + 1, on the device. A chain captures, for a batch bucket
``bb`` and a KV-length bucket ``kb``:

1. the catch-up forward: up to ``k + 1`` new tokens per slot (``n`` real ones) at the slot's
   committed length ``start``; the argmax at each row's last real token is draft 1;
2. ``k - 1`` one-token forwards, draft j fed back as the input of step j + 1 at position
   ``start + n + j - 1``; slots with ``n == 0`` (idle this step) stay idle and write only scratch.

Per step the host packs one buffer (catch-up ids, start, n), copies it with one host-to-device
copy and replays the graph. The drafts stay on the device for the target's verify forward, queued
right behind the chain; their host copy, queued too, is read after it
(:meth:`GreedyChain.host_drafts`). Without graphs (``use_graphs=False``) the same function runs
eagerly on the same buffers, so CPU tests cover the chain's logic.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specdec import ModelRunner
from specdec.cuda_graphs import batch_buckets, capture_buckets, capture_graph, kv_buckets
from specdec.fused import FusedLlama
from specdec.layout import pack_tokens

__all__ = ["GreedyChain"]

logger = logging.getLogger("specdec.draft_model")


@dataclass
class _Chain:
    inputs: torch.Tensor  # [bb * q + 3 * bb] device: catch-up ids, then start, n, the slots in request order
    host: torch.Tensor  # the same layout on the host (pinned on CUDA)
    drafts: torch.Tensor  # [bb, k] int64 output
    drafts_host: torch.Tensor  # [bb, k] its host copy (pinned on CUDA), made after each replay
    graph: torch.cuda.CUDAGraph | None
    fn: Any


class GreedyChain:
    """Captured greedy draft chains of one draft model, looked up by (batch, KV) bucket."""

    def __init__(self, draft: ModelRunner, k: int, use_graphs: bool, fused: FusedLlama | None = None) -> None:
        self.draft, self.k, self.q = draft, k, k + 1
        self.fused = fused
        self.use_graphs = use_graphs
        self.batches = batch_buckets(len(draft.lengths))
        self.kvs = kv_buckets(draft.max_model_len)
        self.chains: dict[tuple[int, int], _Chain] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.event = torch.cuda.Event() if use_graphs else None  # recorded after the drafts' host copy
        self._last: _Chain | None = None

    @classmethod
    def build(cls, draft: ModelRunner, k: int, use_graphs: bool = True,
              fused: FusedLlama | None = None) -> GreedyChain | None:
        """Capture every (batch, KV) bucket, or return None (with a log line) where that fails.
        ``fused``: run the draft's forwards through :class:`FusedLlama` instead of its own layers."""
        if k < 1 or (use_graphs and draft.device.type != "cuda"):
            return None
        chain = cls(draft, k, use_graphs, fused)
        try:
            chain._capture_all()
        except Exception as exc:  # a model whose forward cannot be captured: the per-token path stays
            logger.warning("draft chain capture failed (%s: %s): drafting one forward at a time.",
                           type(exc).__name__, exc)
            return None
        return chain

    def _capture_all(self) -> None:
        t0 = time.perf_counter()
        shapes = [(b, kv) for b in self.batches for kv in self.kvs]
        self.chains = capture_buckets(shapes, self._capture, desc="Capturing draft chains", use_graphs=self.use_graphs)
        logger.info("%s greedy draft chains (k=%d%s) for batch %s x kv %s in %.1f s.",
                    "Captured" if self.use_graphs else "Prepared", self.k, ", fused forward" if self.fused else "",
                    self.batches, self.kvs, time.perf_counter() - t0)

    @torch.inference_mode()
    def _capture(self, bb: int, kb: int) -> _Chain:
        d, dev, k, q = self.draft, self.draft.device, self.k, self.q
        inputs = torch.zeros(bb * q + 3 * bb, dtype=torch.long, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        drafts = torch.zeros(bb, k, dtype=torch.long, device=dev)
        drafts_host = torch.zeros(bb, k, dtype=torch.long, pin_memory=self.use_graphs)
        ids, start, n = inputs[: bb * q].view(bb, q), inputs[bb * q: bb * q + bb], inputs[bb * q + bb: bb * q + 2 * bb]
        row_index = torch.arange(bb, device=dev)[:, None]
        rows = slice(0, bb)
        scratch = torch.full((bb,), d.scratch_position, dtype=torch.long, device=dev)

        def argmax(h: torch.Tensor) -> torch.Tensor:
            # Without soft-capping the LM head's own dtype has the same argmax (float32 holds bf16 exactly).
            if getattr(d.config, "final_logit_softcapping", None):
                return d.compute_logits(h).argmax(-1)
            return d.lm_head(h).argmax(-1)

        def forward(x: torch.Tensor, step_tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
            if self.fused is None:
                return d.run(x, rows, row_index, kb, step_tensors)[0]
            return self.fused.forward(x, *step_tensors, rows, row_index, kb)

        def fn() -> torch.Tensor:
            nxt = start + n
            h = forward(ids, d.step_tensors(start, n, q, kb))  # [bb, q, H]: the catch-up forward
            last = (n - 1).clamp(min=0)
            toks = [argmax(h[row_index[:, 0], last])]  # [bb] each
            # Then one token per row: draft j at position nxt + j - 1. Idle slots (n == 0) stay idle:
            # their position, scratch write position and prefix do not move (step 0).
            live = n > 0
            step = live.long()
            pos = nxt
            write_pos = torch.where(live, nxt, scratch)
            limit = nxt - 1 + step  # the last key each query sees: itself, or an idle row's prefix
            for j in range(1, k):
                if j > 1:
                    pos, write_pos, limit = pos + step, write_pos + step, limit + step
                mask = d.mask_from_limit(limit[:, None], kb)
                h = forward(toks[-1][:, None], (pos[:, None], write_pos[:, None], mask))
                toks.append(argmax(h[:, 0]))
            return torch.stack(toks, dim=1, out=drafts)  # one write of the k drafts

        if not self.use_graphs:
            return _Chain(inputs, host, drafts, drafts_host, None, fn)
        graph, _ = capture_graph(fn, self.pool)
        return _Chain(inputs, host, drafts, drafts_host, graph, fn)

    def run(self, slots: list[int], tokens: list[list[int]]) -> torch.Tensor | None:
        """k greedy drafts per slot, ``[len(slots), k]`` on the device in the order of ``slots``, or None
        when no chain fits (the caller drafts one forward at a time). Nothing waits for the device:
        the drafts' host copy is on its way (:meth:`host_drafts`). Writes the catch-up tokens' and the
        first k - 1 drafts' KV; the caller commits the catch-up tokens and keeps the drafts pending."""
        lens = [len(t) for t in tokens]
        if not slots or min(lens) < 1 or max(lens) > self.q:
            return None
        lengths = self.draft.lengths
        bb = next((b for b in self.batches if b > max(slots)), None)
        # The last draft forward writes at start + n + k - 2 and reads one position further.
        kb = next((b for b in self.kvs if b >= max(lengths[s] + n for s, n in zip(slots, lens)) + self.k - 1),
                  None)
        if bb is None or kb is None:
            return None
        c = self.chains[(bb, kb)]
        # The previous replay's copy from c.host is complete: the host has waited for a later step since.
        host = c.host.numpy()
        q = self.q
        pack_tokens(slots, tokens, lens, bb, q, out=host[: bb * q].reshape(bb, q))
        host[bb * q: bb * q + bb] = lengths[:bb]
        counts = host[bb * q + bb: bb * q + 2 * bb]
        counts[:] = 0
        counts[slots] = lens
        contiguous = slots == list(range(len(slots)))
        if not contiguous:
            host[bb * q + 2 * bb: bb * q + 2 * bb + len(slots)] = slots
        cuda = c.inputs.device.type == "cuda"
        c.inputs.copy_(c.host, non_blocking=cuda)
        if c.graph is not None:
            c.graph.replay()
        else:
            c.fn()
        c.drafts_host.copy_(c.drafts, non_blocking=cuda)
        if self.event is not None:
            self.event.record()
        self._last = c
        if contiguous:
            return c.drafts[: len(slots)]
        return c.drafts.index_select(0, c.inputs[bb * q + 2 * bb: bb * q + 2 * bb + len(slots)])

    def host_drafts(self) -> np.ndarray:
        """The last :meth:`run`'s drafts on the host, ``[bb, k]`` with row = slot (waits for their copy,
        long done once the step's verify forward has been read)."""
        if self.event is not None:
            self.event.synchronize()
        return self._last.drafts_host.numpy()

"""EAGLE-2 dynamic token trees in CUDA graphs: the catch-up forward, the tree's growth and the choice of its best
nodes in one function over static buffers, captured per (batch, KV) bucket like :class:`CapturedHeadChain`.

The rule is :mod:`specdec_eagle.tree`'s (top ``K`` tokens at depth 1; at each depth below, the best ``K`` frontier
nodes by cumulative log-probability each get their ``K`` best children; the best ``N`` nodes of the pool are kept,
best first, a stable sort so parents come first). What differs is where the numbers live so that nothing
depends on the host during a replay:

- the catch-up is :class:`CapturedHeadChain`'s (row ``r`` is slot ``r``; ``start``, ``n`` per row; idle rows
  write the scratch position), with :class:`GreedyHeadChain`'s prepared weights;
- each depth is one head step of the lean chain (:meth:`GreedyHeadChain._step`: with ``kernels``, the fused
  projections, rotary + KV write and split-key attention of the chains, ~12 launches instead of ~40 torch ops): the
  tree's keys and values go to the slot's own cache right after its committed prefix (frontier node ``i`` of depth
  step ``j`` at ``n - 1 + j K + i``, past anything committed, overwritten by the next catch-up), and the attention
  mask shows each node the committed prefix (positions ``<= n - 2``), its ancestors and itself;
- every request keeps ``N = min(tree_total_tokens, pool)`` nodes at full depth k: the proposer takes this path only
  when every drafting request has room for that and for the ``(k - 1) K`` tree positions (else
  :func:`specdec_eagle.tree.draft_tree`, eager).

Output per slot row: ``N`` node ids (target vocabulary) then ``N`` parents (-1: the root).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from specdec.cuda_graphs import SlotStepGraphs, StaticStep
from specdec_eagle.chain import GreedyHeadChain
from specdec_eagle.graph_chain import FeatureCopier
from specdec_eagle.heads import EagleHead, HeadKVCache
from specdec_eagle.tree import select_nodes

__all__ = ["CapturedHeadTree"]

logger = logging.getLogger("specdec.eagle")


class CapturedHeadTree(SlotStepGraphs):
    """Token trees of one head over its slot KV cache, one static step per (batch, KV) bucket. Holds the cache's
    tensors: rebuild it when the cache is reallocated."""

    def __init__(self, lean: GreedyHeadChain, cache: HeadKVCache, k: int, top_k: int, total: int,
                 use_graphs: bool) -> None:
        super().__init__(cache.num_slots, cache.capacity, k, lean.cfg.feature_size, use_graphs)
        self.lean, self.cache = lean, cache
        self.top_k = min(top_k, lean.cfg.draft_vocab_size)
        self.nodes = min(total, self.top_k + (k - 1) * self.top_k ** 2)  # N
        self.tree_keys = (k - 1) * self.top_k  # cache positions the growth writes after the committed prefix

    @classmethod
    def build(cls, head: EagleHead, cache: HeadKVCache, k: int, top_k: int, total: int, use_graphs: bool = True,
              lean: GreedyHeadChain | None = None) -> CapturedHeadTree | None:
        """Prepare (``use_graphs=False``) or capture every (batch, KV) bucket, or return None (with a log line)
        where that fails."""
        if k < 1 or (use_graphs and cache.keys.device.type != "cuda"):
            return None
        tree = cls(lean or GreedyHeadChain(head, cache.capacity), cache, k, top_k, total, use_graphs)
        ok = tree.capture_all("eagle draft trees", "growing trees one head forward at a time", logger)
        return tree if ok else None

    def _top(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``top_k`` best draft ids of head outputs ``h [..., H]`` and their float32 log-probabilities over the
        draft vocabulary, best first: one Triton launch with :attr:`GreedyHeadChain.kernels` (the softmax and the
        selection together), else ``log_softmax`` then ``topk``."""
        lean = self.lean
        logits = lean.logits(h)
        if lean.kernels is not None:
            return lean.kernels.topk(logits, self.top_k, log_softmax=True)
        return torch.log_softmax(logits.float(), -1).topk(self.top_k, -1)

    def _best(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``top_k`` largest of each row of ``x [B, m]`` (candidate scores) and their columns."""
        if self.lean.kernels is not None:
            return self.lean.kernels.topk(x, self.top_k)
        return x.topk(self.top_k, -1)

    @torch.inference_mode()
    def _capture(self, bb: int, kb: int) -> StaticStep:
        lean, cache, k, q, cap, kk, nodes = self.lean, self.cache, self.k, self.q, self.cap, self.top_k, self.nodes
        dev = cache.keys.device
        inputs, host, feats, _ = self.buffers(bb, bb * q + 3 * bb, cache.keys.dtype, dev)
        out = torch.zeros(bb, 2 * nodes, dtype=torch.long, device=dev)  # ids, then parents
        ids, start, n = inputs[: bb * q].view(bb, q), inputs[bb * q: bb * q + bb], inputs[bb * q + bb: bb * q + 2 * bb]
        rows = torch.arange(bb, device=dev)
        cols = torch.arange(q, device=dev)[None, :]
        span = torch.arange(kb, device=dev)
        own = torch.eye(kk, dtype=torch.bool, device=dev)
        frontier = torch.arange(kk, device=dev)[None, :]
        d2t = lean.d2t
        grow = k - 1  # depth steps after depth 1
        t = grow * kk  # the tree's keys after the committed prefix
        steps = torch.arange(grow, device=dev)[:, None, None]  # [J, 1, 1]
        # a node of depth step j, frontier place i, writes its key at top + 1 + j K + i
        key_at = steps * kk + frontier[None] + 1  # [J, 1, K]
        # the pool index of the first node of each depth step's frontier level: depth 1 at 0, then step j's children
        # at K + j K * K
        level_at = torch.tensor([0] + [kk + j * kk * kk for j in range(grow - 1)], device=dev)[None, :, None]
        masked = torch.finfo(torch.float32).min
        kernels = lean.kernels is not None

        def fn() -> torch.Tensor:
            last = (n - 1).clamp(min=0)  # [bb] the last real token's column (0 for idle rows)
            pos = start[:, None] + torch.minimum(cols, last[:, None])
            write = torch.where(cols < n[:, None], pos, cap)
            mask = (span[None, None, :] <= pos[:, :, None])[:, None]
            h0 = lean._step(cache, rows, True, kb, lean.embed[ids], feats, pos, write, mask,
                            (pos.max(1).values + 1).to(torch.int32))[rows, last]  # [bb, H]
            top = start + last  # n - 2: the committed prefix ends here
            score, tok = self._top(h0)  # [bb, K] draft ids, best first
            pools = [(score, tok)]
            if grow:
                # Every depth step's positions, KV write positions and reach at once (host-known shapes): [J, bb, K]
                # positions (a depth's nodes sit where a chain's draft of that depth would), writes (scratch past the
                # capacity or in an idle row), one past the last key a step sees [J, bb] int32
                p_all = (top[None, :, None] + 1 + steps).clamp(max=cap - 1).expand(grow, bb, kk).contiguous()
                w_all = top[None, :, None] + key_at
                w_all = torch.where((n > 0)[None, :, None] & (w_all < cap), w_all, cap)
                ends = (top[None, :] + 1 + kk * (steps[:, :, 0] + 1)).clamp(max=kb).to(torch.int32)
                # Key c of the bucket is tree key rel = c - top - 1 (a column of each node's ancestor set ``sees``,
                # [bb, K, t + 1]: column t is never set, and every key outside the tree reads it); the prefix is
                # visible to all
                rel = span[None, :] - (top + 1)[:, None]  # [bb, kb]
                rel = torch.where((rel >= 0) & (rel < t), rel, t)[:, None, :].expand(bb, kk, kb)
                prefix = span[None, :] <= top[:, None]  # [bb, kb]
                if kernels:  # the attention kernel's additive mask, the prefix's part made once
                    prefix = torch.where(prefix, 0.0, masked)[:, None, None, :]  # [bb, 1, 1, kb]
                sees = torch.zeros(bb, kk, t + 1, dtype=torch.bool, device=dev)
                sees[:, :, :kk] = own
                fh = h0[:, None].expand(bb, kk, h0.shape[-1])
                froms = [frontier.expand(bb, kk)]  # each step's frontier nodes, as places in their level
            for j in range(grow):
                seen = sees.gather(2, rel)  # [bb, K, kb] the tree keys each frontier node sees
                m = torch.where(seen[:, None], 0.0, prefix) if kernels else (prefix[:, None, :] | seen)[:, None]
                h = lean._step(cache, rows, True, kb, lean.embed_draft[tok], fh, p_all[j], w_all[j], m, ends[j])
                child, ctok = self._top(h)  # [bb, K, K]
                child = (score[:, :, None] + child).flatten(1)
                ctok = ctok.flatten(1)
                pools.append((child, ctok))
                if j == grow - 1:
                    break
                score, pick = self._best(child)
                froms.append(pick)
                parent = pick // kk
                tok = ctok.gather(1, pick)
                fh = h.gather(1, parent[:, :, None].expand(-1, -1, h.shape[-1]))
                sees = sees.gather(1, parent[:, :, None].expand(-1, -1, t + 1))
                sees[:, :, (j + 1) * kk: (j + 2) * kk] = own
            sc, tokens = (torch.cat(x, 1) for x in zip(*pools))  # [bb, P]
            # each candidate's parent in the pool: -1 at depth 1, below the frontier node it grew from (its level's
            # first pool index plus its place), each of the K children of a frontier node in turn
            up = tok.new_full((bb, kk), -1)
            if grow:
                at = torch.stack(froms, 1) + level_at  # [bb, J, K]
                up = torch.cat((up, at[:, :, :, None].expand(-1, -1, -1, kk).reshape(bb, -1)), 1)
            chosen, up = select_nodes(sc, tokens, up, nodes, topk=lean.kernels.topk if kernels else None)
            if d2t is not None:
                chosen = chosen + d2t[chosen]
            return out.copy_(torch.cat((chosen, up), 1))

        return self.finish(inputs, host, feats, out, fn)

    def run(self, slots: list[int], tokens: np.ndarray, feats: torch.Tensor | FeatureCopier, start: np.ndarray,
            n: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Trees of ``nodes`` nodes for the requests in ``slots`` (catch-up as :meth:`CapturedHeadChain.run`, ``feats``
        a device tensor ``[B, W, F]`` or a :data:`~specdec_eagle.graph_chain.FeatureCopier`): ids and parents
        ``[len(slots), nodes]`` on the device, in request order, or None when no bucket fits."""
        b, w = tokens.shape
        if not slots or w > self.q or int(n.min()) < 1 or (not callable(feats) and feats.shape[-1] != self.width):
            return None
        key = self.bucket(slots, int((start + n).max()) + self.tree_keys)  # the tree's keys after the prefix
        if key is None:
            return None
        bb, q = key[0], self.q
        host = self.steps[key].host.numpy()
        host[bb * q: bb * q + 2 * bb] = 0
        host[: bb * q].reshape(bb, q)[slots, :w] = tokens
        host[bb * q + np.asarray(slots)] = start
        host[bb * q + bb + np.asarray(slots)] = n
        host[bb * q + 2 * bb: bb * q + 2 * bb + b] = slots
        out = self.launch(key, bb * q + 2 * bb, b, feats)
        return out[:, : self.nodes], out[:, self.nodes:]

"""EAGLE-2 dynamic token trees in CUDA graphs: the catch-up forward, the tree's growth and the choice of its best
nodes in one function over static buffers, captured per (batch, KV) bucket like :class:`CapturedHeadChain`.

The rule is :mod:`specdec_eagle.tree`'s (top ``K`` tokens at depth 1; at each depth below, the best ``K`` frontier
nodes by cumulative log-probability each get their ``K`` best children; the best ``N`` nodes of the pool are kept,
best first, a stable sort so parents come first). What differs is where the numbers live so that nothing
depends on the host during a replay:

- the catch-up is :class:`CapturedHeadChain`'s (row ``r`` is slot ``r``; ``start``, ``n`` per row; idle rows
  write the scratch position), with :class:`GreedyHeadChain`'s prepared weights;
- the tree's keys and values go to a static ``[bb, kv_heads, (k - 1) K, d]`` buffer, and attention reads the
  slot's committed prefix in place (positions ``<= n - 2``: the cache is never copied) and the tree buffer (the
  node's ancestors and itself), as two score blocks under one softmax;
- every request keeps ``N = min(tree_total_tokens, pool)`` nodes at full depth k: the proposer takes this path only
  when every drafting request has room for that (else :func:`specdec_eagle.tree.draft_tree`, eager).

Output per slot row: ``N`` node ids (target vocabulary) then ``N`` parents (-1: the root).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

from specdec.cuda_graphs import SlotStepGraphs, StaticStep
from specdec_eagle.chain import GreedyHeadChain
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

    def _logprobs(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 log-probabilities over the draft vocabulary of head outputs ``h [..., H]``."""
        lean = self.lean
        if lean.eagle3:
            h = lean._norm(h, lean.norm_w)
        return torch.log_softmax(F.linear(h, lean.lm_w).float(), -1)

    def _node_step(self, embeds: torch.Tensor, feats: torch.Tensor, pos: torch.Tensor, kc: torch.Tensor,
                   vc: torch.Tensor, prefix: torch.Tensor, tk: torch.Tensor, tv: torch.Tensor, at: int,
                   sees: torch.Tensor) -> torch.Tensor:
        """One head forward of ``K`` frontier nodes per row: ``embeds``, ``feats`` ``[bb, K, H]``, rotary position
        ``pos [bb]`` (one depth); their K/V written to the tree buffers ``tk``/``tv`` at ``at .. at + K``; each
        attends the committed keys ``kc``/``vc`` ``[bb, kv_heads, kb, d]`` where ``prefix [bb, kb]`` and the tree
        keys ``0 .. at + K`` where ``sees [bb, K, at + K]``. -> hidden ``[bb, K, H]``."""
        lean = self.lean
        b, q = embeds.shape[:2]
        nh, nkv, d = lean.nh, lean.nkv, lean.d
        x, residual = lean._inputs(embeds, feats)
        qk, v = lean._qkv(x, pos[:, None].expand(b, q))
        tk[:, :, at: at + q] = qk[:, :, nh:].transpose(1, 2)
        tv[:, :, at: at + q] = v.transpose(1, 2)
        rep = nh // nkv
        qg = qk[:, :, :nh].transpose(1, 2).reshape(b, nkv, rep * q, d).float()  # q head h = kv head h // rep
        scale = d ** -0.5
        s_c = (qg @ kc.float().transpose(-1, -2)) * scale  # [bb, nkv, rep K, kb]
        s_c = s_c.masked_fill(~prefix[:, None, None, :], float("-inf"))
        s_t = (qg @ tk[:, :, : at + q].float().transpose(-1, -2)) * scale  # [bb, nkv, rep K, at + K]
        s_t = s_t.view(b, nkv, rep, q, at + q).masked_fill(~sees[:, None, None], float("-inf"))
        p = torch.softmax(torch.cat((s_c, s_t.view(b, nkv, rep * q, at + q)), -1), -1)
        kb = kc.shape[2]
        out = p[..., :kb] @ vc.float() + p[..., kb:] @ tv[:, :, : at + q].float()  # [bb, nkv, rep K, d]
        return lean._finish(out.view(b, nh, q, d).transpose(1, 2).to(embeds.dtype), residual)

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
        t = max(1, (k - 1) * kk)
        shape = (bb, cache.keys.shape[1], t, cache.keys.shape[3])
        tk = torch.zeros(shape, dtype=cache.keys.dtype, device=dev)
        tv = torch.zeros(shape, dtype=cache.values.dtype, device=dev)
        own = torch.eye(kk, dtype=torch.bool, device=dev)
        d2t = lean.d2t

        def fn() -> torch.Tensor:
            last = (n - 1).clamp(min=0)  # [bb] the last real token's column (0 for idle rows)
            pos = start[:, None] + torch.minimum(cols, last[:, None])
            write = torch.where(cols < n[:, None], pos, cap)
            mask = (span[None, None, :] <= pos[:, :, None])[:, None]
            h0 = lean._step(cache, rows, True, kb, lean.embed[ids], feats, pos, write, mask)[rows, last]  # [bb, H]
            top = start + last  # n - 2: the committed prefix ends here
            prefix = span[None, :] <= top[:, None]  # [bb, kb]
            score, tok = self._logprobs(h0).topk(kk, -1)  # [bb, K] draft ids, best first
            pools = [(score, tok, tok.new_full((bb, kk), -1))]
            fh = h0[:, None].expand(bb, kk, h0.shape[-1])
            sees = own.expand(bb, kk, kk).clone()
            at = torch.arange(kk, device=dev)[None, :].expand(bb, kk)
            offset = kk
            for j in range(k - 1):
                p = (top + 1 + j).clamp(max=cap - 1)
                h = self._node_step(lean.embed_draft[tok], fh, p, cache.keys[:bb, :, :kb], cache.values[:bb, :, :kb],
                                    prefix, tk, tv, j * kk, sees)
                child, ctok = self._logprobs(h).topk(kk, -1)  # [bb, K, K]
                child = (score[:, :, None] + child).flatten(1)
                ctok = ctok.flatten(1)
                pools.append((child, ctok, at[:, :, None].expand(bb, kk, kk).flatten(1)))
                if j == k - 2:
                    break
                score, pick = child.topk(kk, -1)
                parent = pick // kk
                tok = ctok.gather(1, pick)
                fh = h.gather(1, parent[:, :, None].expand(-1, -1, h.shape[-1]))
                sees = torch.cat((sees.gather(1, parent[:, :, None].expand(-1, -1, sees.shape[2])),
                                  own.expand(bb, kk, kk)), 2)
                at = offset + pick
                offset += kk * kk
            sc, tokens, parents = (torch.cat(x, 1) for x in zip(*pools))  # [bb, P]
            chosen, up = select_nodes(sc, tokens, parents, nodes)
            if d2t is not None:
                chosen = chosen + d2t[chosen]
            return out.copy_(torch.cat((chosen, up), 1))

        return self.finish(inputs, host, feats, out, fn)

    def run(self, slots: list[int], tokens: np.ndarray, feats: torch.Tensor, start: np.ndarray, n: np.ndarray
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Trees of ``nodes`` nodes for the requests in ``slots`` (catch-up as :meth:`CapturedHeadChain.run`):
        ids and parents ``[len(slots), nodes]`` on the device, in request order, or None when no bucket fits."""
        b, w = tokens.shape
        if not slots or w > self.q or int(n.min()) < 1 or feats.shape[-1] != self.width:
            return None
        key = self.bucket(slots, min(int((start + n).max()), self.cap))
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

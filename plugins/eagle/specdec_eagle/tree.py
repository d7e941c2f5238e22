"""EAGLE-2 dynamic token trees: from the head's output at ``n - 2`` (after the catch-up), a tree of drafts grown
by cumulative log-probability, verified whole by the engine (:attr:`specdec.Drafts.parents`).

With ``K = tree_top_k``: the depth-1 nodes are the head's top K tokens (score: their log-probability). For each
further depth, the frontier is the top K nodes of the depth above by score; one batched head forward over the
frontier of every request (K rows each) gives each frontier node K children (score: its own plus the child's
log-probability), and all those candidates join the pool. A node is fed where a chain's draft of its depth would
be (depth ``d`` at head position ``n - 2 + d``), with its own token and its parent's head output as the feature
(the chain's rule along each branch), and sees the slot's committed prefix (positions ``<= n - 2``), its
ancestors and itself. The tree's K/V live in a buffer made for the step (the committed keys, then the tree's),
so the slot cache is only read and nothing needs rolling back. Last, each request keeps its best
``tree_total_tokens`` pool nodes.

Why a stable sort gives a tree: a child's score is its parent's plus a log-probability (``<= 0``, so never above
the parent's), and the pool is laid out by depth, so a stable descending sort puts every parent before its
children, ties included: every prefix of the order is closed under ancestors and already topological.

Everything from the depth-1 top-k to the final selection is device ops over host-known shapes (no reads of the
device); the caller reads the result when it checks the drafts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specdec import Drafts
from specdec_eagle.heads import EagleHead, HeadKVCache

__all__ = ["best_nodes", "draft_tree", "select_nodes", "tree_node_counts"]


def tree_node_counts(top_k: int, total: int, depths: list[int], room: list[int]) -> list[int]:
    """Nodes of each request's tree: ``total``, at most ``room[i]`` (KV positions left) and the pool's nodes of
    depth ``<= depths[i]`` (``top_k`` at depth 1, ``top_k ** 2`` at each depth below); 0 where ``depths[i]`` is 0."""
    return [min(total, r, top_k + (d - 1) * top_k * top_k) if d > 0 else 0 for d, r in zip(depths, room)]


@torch.inference_mode()
def draft_tree(head: EagleHead, cache: HeadKVCache, slots: torch.Tensor, h0: torch.Tensor, n: np.ndarray,
               depths: list[int], room: list[int], top_k: int, total: int) -> Drafts:
    """Token trees from head outputs ``h0 [B, H]`` at position ``n - 2`` of each request (``n [B]``: its tokens;
    the slot ``slots[i]`` holds the committed KV up to ``n - 2``): request ``i`` gets nodes of depth at most
    ``depths[i]`` (0: none) and :func:`tree_node_counts` of them. Token ids in the target vocabulary."""
    b = h0.shape[0]
    k = min(top_k, head.cfg.draft_vocab_size)
    counts = tree_node_counts(k, total, depths, room)
    steps = max(depths, default=0)
    if not any(counts):
        return Drafts.empty(b)
    score, tok = torch.log_softmax(head.draft_logits(h0), -1).topk(k, -1)  # [B, K] each, best first
    pool = [(score, tok, tok.new_full((b, k), -1))]  # per depth: (score, draft id, parent's pool index) [B, m]
    if steps > 1:
        _grow(head, cache, slots, h0, n, score, tok, steps, pool)
    ids, parents = best_nodes(pool, depths, counts)
    return Drafts(torch.where(ids >= 0, head.draft_to_target(ids.clamp(min=0)), -1), counts, parents=parents)


def _grow(head: EagleHead, cache: HeadKVCache, slots: torch.Tensor, h0: torch.Tensor, n: np.ndarray,
          score: torch.Tensor, tok: torch.Tensor, steps: int, pool: list) -> None:
    """Depths 2 .. ``steps`` into ``pool``: ``steps - 1`` batched forwards of the frontier (``score``, ``tok``
    ``[B, K]``: the depth-1 nodes first)."""
    b, k = tok.shape
    dev = h0.device
    s = int(n.max()) - 1  # committed positions 0 .. n - 2 of the longest request
    t = k * (steps - 1)  # tree keys: K frontier nodes per forward
    keys = torch.cat((cache.keys[slots, :, :s], cache.keys.new_zeros(b, cache.keys.shape[1], t, cache.keys.shape[3])),
                     2)  # [B, kv_heads, S + T, d]
    values = torch.cat((cache.values[slots, :, :s], torch.zeros_like(keys[:, :, s:])), 2)
    mask = torch.zeros(b, k, s + t, dtype=torch.bool, device=dev)  # [B, K, S + T] True = visible
    mask[:, :, :s] = _to(dev, np.arange(s)[None, :] < (n - 1)[:, None])[:, None]
    own = torch.eye(k, dtype=torch.bool, device=dev)
    anc = torch.zeros(b, k, t, dtype=torch.bool, device=dev)  # each frontier node's ancestors and itself
    anc[:, :, :k] = own
    pos = _to(dev, n - 1)[:, None].expand(b, k)  # depth-1 nodes sit where a chain's draft 1 does
    feats = h0[:, None].expand(b, k, h0.shape[-1])
    at = torch.arange(k, device=dev)[None, :].expand(b, k)  # the frontier's pool indices
    offset = k
    for j in range(steps - 1):
        end = s + (j + 1) * k
        x, residual = head.attn_input(head.embed(head.draft_to_target(tok)), feats)
        q, kj, vj = head.self_attn.qkv(x, pos + j)
        keys[:, :, s + j * k: end] = kj.to(keys.dtype)
        values[:, :, s + j * k: end] = vj.to(values.dtype)
        mask[:, :, s:] = anc
        h = head.finish(residual, head.self_attn.attend(q, keys[:, :, :end].to(q.dtype),
                                                        values[:, :, :end].to(q.dtype), mask[:, :, :end]))
        child, ctok = torch.log_softmax(head.draft_logits(h), -1).topk(k, -1)  # [B, K, K]
        child = (score[:, :, None] + child).flatten(1)  # [B, K * K], row r's children at r * K ..
        ctok = ctok.flatten(1)
        pool.append((child, ctok, at[:, :, None].expand(b, k, k).flatten(1)))
        if j == steps - 2:
            break
        score, pick = child.topk(k, -1)  # the next frontier
        parent = pick // k
        tok = ctok.gather(1, pick)
        feats = h.gather(1, parent[:, :, None].expand(b, k, h.shape[-1]))
        anc = anc.gather(1, parent[:, :, None].expand(b, k, t))
        anc[:, :, (j + 1) * k: (j + 2) * k] = own
        at = offset + pick
        offset += k * k


def best_nodes(pool: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], depths: list[int], counts: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``counts[i]`` nodes of request i's pool by score, within depth ``depths[i]``, best first: their ids
    and parents (indices among them, -1: the root) ``[B, max(counts)]``, -1 past each request's count. ``pool``:
    per depth from 1, ``(score, id, parent)`` ``[B, m]``, ``parent`` an index into the pool laid out depth by depth
    (-1 at depth 1), and a child's score never above its parent's (the module's note: why parents come first)."""
    score, tok, parent = (torch.cat(x, 1) for x in zip(*pool))  # [B, P]
    dev = score.device
    depth = _to(dev, [d + 1 for d, level in enumerate(pool) for _ in range(level[0].shape[1])])
    width = max(counts)
    ids, up = select_nodes(score, tok, parent, width, hidden=depth[None, :] > _to(dev, depths)[:, None])
    keep = torch.arange(width, device=dev)[None, :] < _to(dev, counts)[:, None]
    return torch.where(keep, ids, -1), torch.where(keep, up, -1)


def select_nodes(score: torch.Tensor, tok: torch.Tensor, parent: torch.Tensor, width: int,
                 hidden: torch.Tensor | None = None,
                 topk: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``width`` nodes of each row of a pool ``[B, P]`` (``score``, ``tok``, ``parent``: an index into the
    pool, -1 the root), best first by a stable sort: their ids and their parents as indices among the chosen (-1:
    the root), ``[B, width]``. ``hidden [B, P]``: nodes that may not be chosen (scored -inf, so last). ``topk``: a
    function ``(x, k) -> (values, indices)`` giving each row's k largest, largest first and equal ones by index (a
    stable sort's first k), used instead of the sort (:func:`specdec.fused_kernels.topk`: one launch). Device ops
    over device tensors only: :class:`~specdec_eagle.graph_tree.CapturedHeadTree` runs it inside a CUDA graph."""
    b, p = score.shape
    if hidden is not None:
        score = score.masked_fill(hidden, float("-inf"))
    if topk is not None:
        sel = topk(score, width)[1]  # [B, N]
        # a chosen node's parent is chosen (the module's note), so only the chosen need a place
        rank = sel.new_full((b, p), -1).scatter_(1, sel, torch.arange(width, device=score.device).expand(b, width))
    else:
        order = score.sort(dim=1, descending=True, stable=True).indices
        sel = order[:, :width]  # [B, N]
        place = torch.arange(p, device=score.device).expand(b, p)
        rank = torch.empty_like(order).scatter_(1, order, place)  # pool index -> place in the order
    up = parent.gather(1, sel)
    return tok.gather(1, sel), torch.where(up >= 0, rank.gather(1, up.clamp(min=0)), -1)


def _to(dev: torch.device, x: np.ndarray | list[int]) -> torch.Tensor:
    """Host values on ``dev`` without waiting for the device (as :meth:`specdec.Drafts.within_budget` does)."""
    t = torch.as_tensor(np.asarray(x))
    return t.to(dev, non_blocking=True) if dev.type != "cpu" else t

"""Greedy Medusa drafting (chains, or a static token tree) in a CUDA graph per batch bucket.

A step's drafting is a handful of small ops (the heads' blocks, their vocabulary projections, the argmax, the map to
target ids): each launch costs more host time than its kernel takes on a GPU, and the host time of a batch-1 step is
what holds a speculative method back on a fast target (H200, bench target: ~0.29 ms of host time for the heads'
eager forward against ~0.02 ms for a replay). Here the heads run over a static ``[bb, H]`` input, captured once per
batch bucket; a step copies its hidden rows in, replays and reads the drafts ``[b, k]`` (target ids) from a static
output. With a static tree (``tree``: Medusa's choices, each a path of ranks) the replay also takes each head's
top ranks and gathers every node's token (head ``len(c) - 1``'s token of rank ``c[-1]``) in one index, so a tree
step drafts in one replay as a chain step does (eagerly it was a launch per node). With ``use_graphs=False`` the
same function runs eagerly on the same buffers (CPU tests cover it).
"""

from __future__ import annotations

import logging

import torch

from specdec.cuda_graphs import batch_buckets, capture_buckets, capture_graph
from specdec_medusa.heads import MedusaConfig, MedusaHeads

__all__ = ["CapturedMedusaHeads", "check_tree_ranks", "tree_indices"]

logger = logging.getLogger("specdec.medusa")


def check_tree_ranks(choices: list[tuple[int, ...]] | tuple[tuple[int, ...], ...], cfg: MedusaConfig) -> None:
    """Refuse Medusa tree ``choices`` with a rank past the heads' vocabulary (``cfg``: their ``MedusaConfig``): each
    head ranks only its ``head_vocab_size`` (or ``vocab_size``) tokens."""
    vocab = cfg.head_vocab_size or cfg.vocab_size
    wide = max(choices, key=lambda c: c[-1])
    if wide[-1] >= vocab:
        raise ValueError(f"tree_choices entry {list(wide)} is invalid for these heads: rank {wide[-1]} is past their "
                         f"{vocab}-token vocabulary (ranks run 0..{vocab - 1}); use smaller ranks.")


def tree_indices(choices: list[tuple[int, ...]] | tuple[tuple[int, ...], ...], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each of a Medusa tree's ``choices`` (parents before children) as int64 tensors on ``device``: its parent among
    them (-1: the root), its head (``len(c) - 1``: the depth it drafts) and its rank (``c[-1]``: which of that head's
    top tokens it is)."""
    at = {c: j for j, c in enumerate(choices)}
    parents = [at[c[:-1]] if len(c) > 1 else -1 for c in choices]
    return tuple(torch.tensor(x, dtype=torch.long, device=device)
                 for x in (parents, [len(c) - 1 for c in choices], [c[-1] for c in choices]))


class CapturedMedusaHeads:
    """The first ``k`` heads' greedy drafts for up to ``max_batch`` hidden rows, one static step per batch bucket:
    ``[b, k]`` chains, or with ``tree`` (choices, parents before children, each of depth at most ``k``) ``[b, N]``
    tree nodes in the order of ``tree``."""

    def __init__(self, heads: MedusaHeads, k: int, max_batch: int, device: torch.device, dtype: torch.dtype,
                 use_graphs: bool = True, tree: tuple[tuple[int, ...], ...] | None = None) -> None:
        self.heads, self.k, self.use_graphs = heads, k, use_graphs
        self.tree = tree
        if tree is not None:  # every node's (head, rank), and the ranks each head's top-k must reach
            if not tree or max(len(c) for c in tree) > k:
                raise ValueError(f"a Medusa tree of depth at most k={k} is needed, got {tree!r}")
            check_tree_ranks(tree, heads.cfg)
            self.ranks = 1 + max(c[-1] for c in tree)
            _, self.node_head, self.node_rank = tree_indices(tree, device)
        self.batches = batch_buckets(max_batch)
        self.device, self.dtype = device, dtype
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.runs = 0  # steps served (for tests and logs)
        self.steps = capture_buckets([(bb,) for bb in self.batches], self._capture, desc="Capturing medusa heads",
                                     use_graphs=use_graphs)

    @classmethod
    def build(cls, heads: MedusaHeads, k: int, max_batch: int, device: torch.device, dtype: torch.dtype,
              use_graphs: bool = True, tree: tuple[tuple[int, ...], ...] | None = None) -> CapturedMedusaHeads | None:
        """Capture (or, ``use_graphs=False``, prepare) every bucket, or return None with a log line where that
        fails (the proposer then runs the heads eagerly)."""
        try:
            return cls(heads, k, max_batch, device, dtype, use_graphs, tree)
        except Exception as exc:
            logger.warning("medusa heads capture failed (%s: %s): running them eagerly.", type(exc).__name__, exc)
            return None

    @torch.inference_mode()
    def _capture(self, bb: int) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph | None, object]:
        x = torch.zeros(bb, self.heads.cfg.hidden_size, dtype=self.dtype, device=self.device)
        out = torch.zeros(bb, self.k if self.tree is None else len(self.tree), dtype=torch.long, device=self.device)

        def fn() -> torch.Tensor:
            logits = self.heads(x, self.k)  # [k, bb, Vd]
            if self.tree is None:
                return out.copy_(self.heads.to_target(logits.argmax(-1)).T)
            top = logits.topk(self.ranks, dim=-1).indices  # [k, bb, r]
            return out.copy_(self.heads.to_target(top[self.node_head, :, self.node_rank]).T)  # [bb, N]

        graph = capture_graph(fn, self.pool)[0] if self.use_graphs else None
        return x, out, graph, fn

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor | None:
        """Drafts ``[len(rows), k]`` (target ids; with a tree its ``[len(rows), N]`` nodes) from the rows ``rows`` of
        ``hidden [T, H]``; None when no bucket holds that many rows."""
        b = len(rows)
        bb = next((x for x in self.batches if x >= b), None)
        if bb is None or b == 0:
            return None
        x, out, graph, fn = self.steps[(bb,)]
        if rows == list(range(rows[0], rows[0] + b)):  # consecutive rows (every batch-1 step): a slice, no index
            x[:b].copy_(hidden[rows[0]: rows[0] + b])
        else:
            torch.index_select(hidden, 0, torch.tensor(rows).to(hidden.device, non_blocking=True), out=x[:b])
        if graph is not None:
            graph.replay()
        else:
            fn()
        self.runs += 1
        return out[:b].clone()  # a tensor of its own: a caller may keep a step's drafts past the next run

"""Greedy Medusa drafting in a CUDA graph per batch bucket.

A step's drafting is a handful of small ops (the heads' blocks, their vocabulary projections, the argmax, the map to
target ids): each launch costs more host time than its kernel takes on a GPU, and the host time of a batch-1 step is
what holds a speculative method back on a fast target (H200, bench target: ~0.29 ms of host time for the heads'
eager forward against ~0.02 ms for a replay). Here the heads run over a static ``[bb, H]`` input, captured once per
batch bucket; a step copies its hidden rows in, replays and reads the drafts ``[b, k]`` (target ids) from a static
output. With ``use_graphs=False`` the same function runs eagerly on the same buffers (CPU tests cover it).
"""

from __future__ import annotations

import logging

import torch

from specdec.cuda_graphs import batch_buckets, capture_buckets, capture_graph
from specdec_medusa.heads import MedusaHeads

__all__ = ["CapturedMedusaHeads"]

logger = logging.getLogger("specdec.medusa")


class CapturedMedusaHeads:
    """The first ``k`` heads' greedy drafts for up to ``max_batch`` hidden rows, one static step per batch bucket."""

    def __init__(self, heads: MedusaHeads, k: int, max_batch: int, device: torch.device, dtype: torch.dtype,
                 use_graphs: bool = True) -> None:
        self.heads, self.k, self.use_graphs = heads, k, use_graphs
        self.batches = batch_buckets(max_batch)
        self.device, self.dtype = device, dtype
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.runs = 0  # steps served (for tests and logs)
        self.steps = capture_buckets([(bb,) for bb in self.batches], self._capture, desc="Capturing medusa heads",
                                     use_graphs=use_graphs)

    @classmethod
    def build(cls, heads: MedusaHeads, k: int, max_batch: int, device: torch.device, dtype: torch.dtype,
              use_graphs: bool = True) -> CapturedMedusaHeads | None:
        """Capture (or, ``use_graphs=False``, prepare) every bucket, or return None with a log line where that
        fails (the proposer then runs the heads eagerly)."""
        try:
            return cls(heads, k, max_batch, device, dtype, use_graphs)
        except Exception as exc:
            logger.warning("medusa heads capture failed (%s: %s): running them eagerly.", type(exc).__name__, exc)
            return None

    @torch.inference_mode()
    def _capture(self, bb: int) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph | None, object]:
        x = torch.zeros(bb, self.heads.cfg.hidden_size, dtype=self.dtype, device=self.device)
        out = torch.zeros(bb, self.k, dtype=torch.long, device=self.device)

        def fn() -> torch.Tensor:
            ids = self.heads.to_target(self.heads(x, self.k).argmax(-1))  # [k, bb]
            return out.copy_(ids.T)

        graph = capture_graph(fn, self.pool)[0] if self.use_graphs else None
        return x, out, graph, fn

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor | None:
        """Drafts ``[len(rows), k]`` (target ids) from the
        rows ``rows`` of ``hidden [T, H]``; None when no bucket holds that many rows."""
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

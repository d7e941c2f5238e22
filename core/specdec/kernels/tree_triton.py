"""Triton kernel for a tree verification step's positions, KV write positions and attention mask
(:meth:`specdec.ModelRunner.tree_step_tensors`) in one launch.

The torch form builds them from the trees' parents on the device (capturable): depths and ancestor sets by pointer
doubling (:func:`specdec.layout.tree_layout_device`, ``ceil(log2(nodes))`` rounds of two gathers each), then the
mask over the KV bucket in a dozen elementwise steps: about 46 launches in every tree graph, each a few microseconds
on an H200 where a bench-sized target's whole verify is a few hundred. ``_tree_step_kernel``, grid ``[rows, nodes]``,
walks node ``j`` of row ``i`` up to the root through the parents (clamped as the torch form clamps them: a parent that
is not an earlier node becomes node ``j - 1``, a negative one the root; so every walk ends, within ``j`` steps) and
writes its position, write position and mask row itself. The result is the torch form's, exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK_K", "tree_step_tensors"]

BLOCK_K = 1024  # mask entries per inner step of a node's row


@triton.jit
def _tree_step_kernel(par_ptr, start_ptr, n_ptr, pos_ptr, write_ptr, mask_ptr, Q, KV, MAX_POS, SCRATCH, MASKED,
                      BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    start = tl.load(start_ptr + i)
    n = tl.load(n_ptr + i)
    nodes = tl.arange(0, BLOCK_Q)
    seen = nodes == j  # node j's ancestors and itself, as node indices of its row
    cur = j
    depth = tl.zeros((), dtype=tl.int64)
    while cur > 0:
        cur = tl.minimum(tl.maximum(tl.load(par_ptr + i * Q + cur), 0), cur - 1)
        seen = seen | (nodes == cur)
        depth += 1
    tl.store(pos_ptr + i * Q + j, tl.minimum(start + depth, MAX_POS - 1))
    tl.store(write_ptr + i * Q + j, tl.where(j < n, start + j, SCRATCH))
    row = mask_ptr + (i * Q + j) * KV
    dtype = mask_ptr.dtype.element_ty
    empty = (start == 0) & (n == 0)  # a padding node of an empty row sees nothing: it is shown position 0
    for k0 in range(0, KV, BLOCK_K):  # the committed prefix (and nothing else) outside the tree's keys
        keys = k0 + tl.arange(0, BLOCK_K)
        outside = (keys < start) | (keys >= start + n)
        vis = (keys < start) | ((keys == 0) & empty)
        tl.store(row + keys, tl.where(vis, 0.0, MASKED).to(dtype), mask=(keys < KV) & outside)
    keys = start + nodes  # the tree's keys: node m's at start + m, visible where m is an ancestor (or j itself)
    tl.store(row + keys, tl.where(seen, 0.0, MASKED).to(dtype), mask=(nodes < n) & (keys < KV))


def tree_step_tensors(start: torch.Tensor, n: torch.Tensor, parents: torch.Tensor, kv_len: int, max_model_len: int,
                      scratch: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`specdec.ModelRunner.tree_step_tensors` in one launch: ``start``, ``n`` ``[b]`` and ``parents [b, q]``
    (int64, on the device) -> positions and write positions ``[b, q]`` (int64) and the additive mask ``[b, 1, q,
    kv_len]`` of ``dtype`` (0 visible, its most negative value hidden); ``scratch``: the cache's scratch position."""
    b, q = parents.shape
    parents = parents.contiguous()
    dev = parents.device
    positions = torch.empty(b, q, dtype=torch.int64, device=dev)
    write = torch.empty(b, q, dtype=torch.int64, device=dev)
    mask = torch.empty(b, 1, q, kv_len, dtype=dtype, device=dev)
    _tree_step_kernel[(b, q)](parents, start.contiguous(), n.contiguous(), positions, write, mask, q, kv_len,
                              max_model_len, scratch, float(torch.finfo(dtype).min),
                              BLOCK_Q=triton.next_power_of_2(q), BLOCK_K=min(BLOCK_K, triton.next_power_of_2(kv_len)))
    return positions, write, mask

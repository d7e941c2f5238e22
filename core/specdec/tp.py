"""Tensor parallelism for the target (issue 27): the target runs sharded through transformers' own TP plan over
``torch.distributed`` (one process per device, launched with ``torchrun``); specdec's engine, proposers and
verifier run unchanged on every rank, in lockstep, and what they decide is taken from rank 0.

- **Loading**: ``from_pretrained(path, distributed_config=DistributedConfig(tp_size=N))`` (older transformers:
  ``tp_plan="auto"``) shards the attention heads and MLP columns; transformers starts the process group from
  torchrun's environment (gloo on the CPU, NCCL on CUDA) and needs ``accelerate``. Hidden states and logits come
  out whole on every rank (the plan gathers them).
- **KV cache**: each rank's :class:`~specdec.kv_cache.SlotKVCache` holds its own KV heads only
  (:func:`local_kv_heads`).
- **Agreement**: every rank must issue the same forwards (each holds a slice of every layer's collectives), so the
  engine takes the speculation policy's plan, the drafts and the verified tokens of each step from rank 0
  (:func:`from_rank0`); with identical logits on every rank they agree anyway, and a rank that drifted (a
  timing-based policy decision, a sampled draw) cannot make the ranks diverge.
- **Not yet**: CUDA graphs (the target runs eagerly under TP), the fused forward (it needs whole weights).
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["check_tp_device", "check_tp_launch", "from_rank0", "is_tp", "local_kv_heads", "shutdown", "tp_load_kwargs",
           "tp_rank"]


def check_tp_launch(size: Any) -> int:
    """``size`` checked against the launch: an int >= 1; for > 1 the process must have been started by ``torchrun``
    (or another launcher that sets ``WORLD_SIZE``/``RANK``) with exactly ``size`` processes."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size={size!r} is invalid: it must be an int >= 1 (1: no tensor "
                         "parallelism).")
    if size == 1:
        return 1
    world = os.environ.get("WORLD_SIZE")
    if world is None or os.environ.get("RANK") is None:
        raise RuntimeError(f"tensor_parallel_size={size} needs one process per rank: launch with "
                           f"`torchrun --nproc-per-node {size} your_script.py` (no WORLD_SIZE/RANK in the "
                           "environment).")
    if int(world) != size:
        raise ValueError(f"tensor_parallel_size={size} does not match the launch: WORLD_SIZE={world}; pass "
                         f"tensor_parallel_size={world} or launch {size} processes.")
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ImportError("tensor_parallel_size > 1 loads the target with transformers' TP plan, which needs "
                          "`accelerate`: pip install accelerate")
    return size


def check_tp_device(size: int, device: torch.device) -> None:
    """Refuse ``device`` where transformers' TP plan would not put the ranks: it binds each rank to the machine's
    accelerator (GPU ``LOCAL_RANK``) whenever one is visible, so CPU ranks need a machine, or an environment, without
    one."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if device.type == "cpu" and accelerator is not None:
        raise RuntimeError(f"tensor_parallel_size={size} with device='cpu' on a machine with a visible "
                           f"{accelerator.type} device: transformers' TP plan binds each rank to the accelerator. Run "
                           f"the ranks on the CPU with the devices hidden (CUDA_VISIBLE_DEVICES=''), or pass "
                           f"device={accelerator.type!r}.")


def tp_load_kwargs(size: int) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments that shard a model over ``size`` ranks."""
    try:
        from transformers.distributed import DistributedConfig

        return {"distributed_config": DistributedConfig(tp_size=size)}
    except (ImportError, TypeError):  # transformers without DistributedConfig(tp_size=...)
        return {"tp_plan": "auto"}


def local_kv_heads(model: torch.nn.Module, kv_heads: int, size: int) -> int:
    """KV heads this rank's shard of ``model`` holds (``kv_heads`` in all); raises ValueError where the plan cannot
    split them evenly over ``size`` ranks."""
    if size == 1:
        return kv_heads
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    try:
        from transformers.distributed.tensor_parallel import get_kv_heads_per_rank

        heads = get_kv_heads_per_rank(plan, kv_heads, size)
    except ImportError:  # older transformers: k_proj is column-sharded by every Llama-family plan
        heads = kv_heads // size if kv_heads % size == 0 else None
    if heads is None:
        raise ValueError(f"tensor_parallel_size={size} does not divide the model's {kv_heads} KV heads: pick a "
                         "size that divides them.")
    return int(heads)


def is_tp(target: Any) -> bool:
    """True when ``target`` runs sharded over more than one rank."""
    return getattr(target, "tp_size", 1) > 1


def tp_rank() -> int:
    """This process's rank (0 without a process group)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a picklable host object: lists of ints, tuples); ``obj`` itself without a
    process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown() -> None:
    """End of a tensor-parallel run: once every rank is past its last collective (a barrier), tear the process group
    down. Call it on every rank before the process exits; without a process group it does nothing. Left to the
    interpreter's exit, one rank closing its gloo connections while another's threads still held them aborted that
    other rank now and then (SIGABRT, "terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

"""The pieces of :func:`specdec_tools.train.train`: settings, schedule, held-out split, batch order, the step,
held-out evaluation and checkpoints (atomic; a resumed run replays exactly what the interrupted one would have)."""

from __future__ import annotations

import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from specdec.errors import check_int

if TYPE_CHECKING:
    from specdec_tools.train import Trainer

__all__ = ["Settings", "State", "batch_indices", "evaluate", "held_out_split", "lr_at", "run_steps", "start_state"]


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    """The learning rate of step ``step`` (0-based): linear warm-up to ``peak`` over ``warmup`` steps, then
    cosine decay to 10% of it at ``total`` (the schedule of specdec_tools.zoo)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def held_out_split(n: int, fraction: float) -> tuple[list[int], list[int]]:
    """(train, held-out) sequence indices: the held-out ones are the ``ceil(n * fraction)`` (at least 1, at most
    n - 1) indices first in a fixed hash order, the same on every machine and for every seed."""
    if n < 2:
        raise ValueError(f"the data holds {n} sequence(s): training needs at least 2 (one to train on, one held "
                         "out to evaluate); give it more text or longer shards.")
    k = min(n - 1, max(1, math.ceil(n * fraction)))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0x5EC0DE)).tolist()
    held = sorted(order[:k])
    held_set = set(held)
    return [i for i in range(n) if i not in held_set], held


def batch_indices(train_ids: list[int], step: int, batch_size: int, seed: int, cache: dict[int, list[int]]
                  ) -> list[int]:
    """The sequences of step ``step``: a seeded permutation of the training set per epoch, read in order. A pure
    function of (step, seed), so a resumed run draws exactly the batches the interrupted one would have."""
    n, out = len(train_ids), []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch = pos // n
        if epoch not in cache:
            cache.clear()
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            cache[epoch] = [train_ids[i] for i in torch.randperm(n, generator=g).tolist()]
        out.append(cache[epoch][pos % n])
    return out


@dataclass(frozen=True, slots=True)
class Settings:
    """The loop's settings, validated once (ValueError naming the value and the rule)."""

    steps: int
    batch_size: int
    lr: float
    warmup: int
    weight_decay: float
    grad_clip: float
    seed: int
    eval_every: int
    save_every: int
    eval_fraction: float
    max_eval_sequences: int

    def __post_init__(self) -> None:
        check_int("steps", self.steps, 1, "(optimizer steps)")
        check_int("batch_size", self.batch_size, 1, "(sequences per step)")
        check_int("warmup", self.warmup, 0, "(warm-up steps)")
        check_int("seed", self.seed, 0)
        check_int("eval_every", self.eval_every, 1, "(steps between held-out evaluations)")
        check_int("save_every", self.save_every, 1, "(steps between checkpoints)")
        check_int("max_eval_sequences", self.max_eval_sequences, 1, "(held-out sequences per evaluation)")
        for name, value, rule in (("lr", self.lr, "a finite number > 0, e.g. 1e-3"),
                                  ("weight_decay", self.weight_decay, "a finite number >= 0"),
                                  ("grad_clip", self.grad_clip, "a finite number >= 0 (0 = no clipping)"),
                                  ("eval_fraction", self.eval_fraction, "in (0, 1), e.g. 0.05")):
            number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            ok = number and (value > 0 if name == "lr" else value >= 0 if name != "eval_fraction" else 0 < value < 1)
            if not ok:
                raise ValueError(f"{name}={value!r} is invalid: it must be {rule}.")

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with the one it continues (eval and checkpoint spacing may change)."""
        keys = ("steps", "batch_size", "lr", "warmup", "weight_decay", "grad_clip", "seed", "eval_fraction")
        return {k: getattr(self, k) for k in keys}


@dataclass(slots=True)
class State:
    """Where the run is: the optimizer, the next step, the eval history, time, and the step timings."""

    opt: torch.optim.Optimizer
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    running: torch.Tensor | None = None  # the smoothed training loss the progress bar shows
    resumed_from: int | None = None
    step_seconds: float = 0.0
    target_seconds: float = 0.0
    timed_steps: int = 0


def options_dict(options: Any) -> dict[str, Any]:
    return asdict(options) if is_dataclass(options) and not isinstance(options, type) else {}


def _optimizer(head: nn.Module, s: Settings, device: torch.device) -> torch.optim.AdamW:
    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the trainer's head has no trainable parameters (every parameter has requires_grad=False).")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, trainer: Trainer, state: State, identity: dict[str, Any], elapsed: float) -> None:
    """The head, optimizer, step, RNG states and history, through a temporary file that is flushed to disk and
    renamed over ``path``: a crash leaves the previous checkpoint or the new one, never half of one."""
    obj = {"identity": identity, "step": state.step, "head": trainer.head.state_dict(), "optimizer":
           state.opt.state_dict(), "rng": _rng_state(), "history": state.history, "elapsed": elapsed,
           "running": None if state.running is None else state.running.item()}
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def start_state(trainer: Trainer, s: Settings, device: torch.device, checkpoint: Path | None,
                identity: dict[str, Any], log: Callable[[str], None]) -> State:
    """Seed, build the head on ``device`` and its optimizer; then load ``checkpoint`` when given and present
    (after checking it was written by a run with the same ``identity``)."""
    torch.manual_seed(s.seed)
    np.random.seed(s.seed)
    random.seed(s.seed)
    head = trainer.head.to(device).float().train()
    state = State(_optimizer(head, s, device))
    if checkpoint is None:
        return state
    if not checkpoint.exists():
        log(f"specdec train: --resume: no checkpoint in {str(checkpoint.parent)!r} yet, starting at step 0")
        return state
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)  # our own file: it holds numpy RNG state
    for key, value in identity.items():
        if ckpt["identity"].get(key) != value:
            raise ValueError(f"--resume: the checkpoint {str(checkpoint)!r} was written by a run with {key}="
                             f"{ckpt['identity'].get(key)!r}, this run has {key}={value!r}; resume with the same "
                             "settings, or train into a new --out.")
    head.load_state_dict(ckpt["head"])
    state.opt.load_state_dict(ckpt["optimizer"])
    _set_rng_state(ckpt["rng"])
    state.step = state.resumed_from = ckpt["step"]
    state.history, state.elapsed = ckpt["history"], ckpt["elapsed"]
    state.running = None if ckpt["running"] is None else torch.tensor(ckpt["running"], device=device)
    log(f"specdec train: resuming {trainer.method} from step {state.step} of {s.steps} ({checkpoint})")
    return state


@torch.no_grad()
def evaluate(trainer: Trainer, data: Any, held: list[int], batch_size: int, device: torch.device
             ) -> dict[str, Any]:
    """Mean held-out loss (weighted by sequences per batch) and the acceptance estimate per draft position."""
    head, keys = trainer.head, trainer.hidden_keys()
    was_training = head.training
    head.eval()
    loss_sum, rows = 0.0, []
    for i in range(0, len(held), batch_size):
        ids = held[i: i + batch_size]
        batch = data.batch(ids, keys, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss_sum += trainer.loss(batch).float().item() * len(ids)
            rows.append(trainer.acceptance(batch).bool().cpu())
    head.train(was_training)
    accepted = torch.cat(rows).float()  # [M, k]
    per_pos = accepted.mean(0) if len(accepted) else torch.zeros(accepted.shape[1])
    prefix = accepted.cumprod(1).mean(0) if len(accepted) else torch.zeros(accepted.shape[1])
    return {"loss": loss_sum / len(held), "acceptance_per_position": [round(x, 4) for x in per_pos.tolist()],
            "accepted_prefix_per_position": [round(x, 4) for x in prefix.tolist()],
            "mean_acceptance_length": round(1.0 + prefix.sum().item(), 4), "positions": int(len(accepted))}


def _step(trainer: Trainer, data: Any, s: Settings, state: State, ids: list[int], device: torch.device) -> None:
    """One optimizer step on the sequences ``ids``; times it (but the first of a process, which warms up)."""
    t0, target_before = time.perf_counter(), data.target_seconds
    for group in state.opt.param_groups:
        group["lr"] = lr_at(state.step, s.lr, s.warmup, s.steps)
    batch = data.batch(ids, trainer.hidden_keys(), device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        loss = trainer.loss(batch)
    loss.backward()
    if s.grad_clip:
        torch.nn.utils.clip_grad_norm_(trainer.head.parameters(), s.grad_clip)
    state.opt.step()
    state.opt.zero_grad(set_to_none=True)
    loss = loss.detach().float()
    state.running = loss if state.running is None else 0.9 * state.running + 0.1 * loss
    if state.step != (state.resumed_from or 0):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        state.step_seconds += time.perf_counter() - t0
        state.target_seconds += data.target_seconds - target_before
        state.timed_steps += 1
    state.step += 1


def run_steps(trainer: Trainer, data: Any, s: Settings, state: State, split: tuple[list[int], list[int]],
              device: torch.device, checkpoint: Path, identity: dict[str, Any], progress: bool,
              log: Callable[[str], None]) -> None:
    """Steps from ``state.step`` to ``s.steps``: held-out evaluation every ``eval_every`` steps and at the end, a
    checkpoint every ``save_every`` steps before the end, a tqdm bar with the smoothed loss."""
    from tqdm.auto import tqdm

    train_ids, held = split
    cache: dict[int, list[int]] = {}
    bar = tqdm(total=s.steps, initial=state.step, disable=not progress, desc=f"train {trainer.method}",
               unit="step", dynamic_ncols=True)
    t_run = time.perf_counter()
    while state.step < s.steps:
        _step(trainer, data, s, state, batch_indices(train_ids, state.step, s.batch_size, s.seed, cache), device)
        done = state.step
        bar.update(1)
        if done % 10 == 0 or done == s.steps:
            bar.set_postfix(loss=f"{state.running.item():.3f}", refresh=False)
        if done % s.eval_every == 0 or done == s.steps:
            result = evaluate(trainer, data, held, s.batch_size, device)
            state.history.append({"step": done, "train_loss": round(state.running.item(), 4), **result})
            line = (f"step {done}/{s.steps}: held-out loss {result['loss']:.4f}, acceptance per position "
                    f"{result['acceptance_per_position']}")
            if progress:
                tqdm.write(line, file=sys.stderr)
            else:
                log(line)
        if done % s.save_every == 0 and done < s.steps:
            save_checkpoint(checkpoint, trainer, state, identity, state.elapsed + time.perf_counter() - t_run)
    bar.close()
    state.elapsed += time.perf_counter() - t_run

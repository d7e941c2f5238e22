"""Training a drafting method's head: the trainer contract a plugin implements, and the loop every method shares.

A plugin registers a :class:`Trainer` subclass through the hook ``specdec_register_trainers(register)``. The
trainer owns what is specific to its method: the head (an ``nn.Module`` built from the target's config and the
method's options), the loss on a batch of target hidden states, a held-out acceptance estimate per draft position,
and ``save`` in the method's published format. :func:`train` owns the rest: AdamW, linear warm-up then cosine decay
(the habit of :mod:`specdec_tools.zoo`), bf16 autocast on CUDA, gradient clipping, seeding, periodic held-out
evaluation, atomic checkpoints that a resumed run continues bit for bit, a progress bar, and the model card
(``README.md`` + ``metrics.json``). Data comes from :mod:`specdec_tools.train_data`: shards written by
``specdec extract``, or text run through the target inside the loop (``--online``). See docs/training.md.
"""

from __future__ import annotations

import abc
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from specdec.errors import check_int
from specdec.options import NoOptions, build_options, init_option_names

__all__ = ["Batch", "TargetInfo", "Trainer", "build_trainer", "held_out_split", "lr_at", "train",
           "CHECKPOINT", "LAST"]

LAST = "last"  # the key of the final hidden state (after the final norm, what the LM head reads)
CHECKPOINT = "checkpoint.pt"


@dataclass(slots=True)
class Batch:
    """What a trainer's ``loss`` and ``acceptance`` get: ``B`` sequences padded on the right to ``T`` tokens.

    ``input_ids`` ``[B, T]`` int64; ``valid`` ``[B, T]`` bool (False on padding); ``loss_mask`` ``[B, T]`` bool,
    True where the token at that position is one the head should learn to predict (every real token of plain
    text, the response tokens of a conversation; always False on padding); ``hidden`` maps ``str(layer_id)``
    (HF ``output_hidden_states`` indexing: 0 = embeddings, i = output of decoder layer i) and ``"last"``
    (after the final norm) to ``[B, T, H]`` float32 tensors, for the layers the trainer asked for only.
    """

    input_ids: torch.Tensor
    valid: torch.Tensor
    loss_mask: torch.Tensor
    hidden: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        shape = tuple(self.input_ids.shape)
        for name, t in (("valid", self.valid), ("loss_mask", self.loss_mask), *self.hidden.items()):
            if tuple(t.shape[:2]) != shape:
                raise ValueError(f"Batch.{name} has shape {tuple(t.shape)}; its first two dims must be input_ids' "
                                 f"{shape}.")


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """The target a head is trained for: its directory and Hugging Face config, and its weights on demand
    (read from its safetensors files, so a trainer can share the LM head or embedding without loading the model)."""

    path: str
    config: Any

    @classmethod
    def from_path(cls, path: str, trust_remote_code: bool = False) -> TargetInfo:
        from transformers import AutoConfig

        from specdec.loading import check_model_dir

        check_model_dir(path, trust_remote_code)
        return cls(str(path), AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))

    @property
    def hidden_size(self) -> int:
        return int(self.config.get_text_config().hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.get_text_config().vocab_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.get_text_config().num_hidden_layers)

    def _weight_files(self) -> list[Path]:
        root = Path(self.path)
        index = root / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [root / f for f in files]
        return sorted(root.glob("*.safetensors"))

    def weight(self, *suffixes: str) -> torch.Tensor:
        """The first tensor of the target's safetensors whose name is, or ends with ``.`` + one of ``suffixes``
        (in the order given), as float32 on CPU; a KeyError names what was looked for."""
        from safetensors import safe_open

        handles = [safe_open(str(f), framework="pt") for f in self._weight_files()]
        for suffix in suffixes:
            for h in handles:
                for key in h.keys():
                    if key == suffix or key.endswith("." + suffix):
                        return h.get_tensor(key).float()
        raise KeyError(f"target {self.path!r} has no weight named {' or '.join(suffixes)} in its safetensors files.")

    def lm_head_weight(self) -> torch.Tensor:
        """``[V, H]``: the LM head, or the input embedding when the target ties them."""
        if getattr(self.config.get_text_config(), "tie_word_embeddings", False):
            return self.weight("embed_tokens.weight", "wte.weight", "lm_head.weight")
        return self.weight("lm_head.weight")


class Trainer(abc.ABC):
    """What a plugin implements to train its method's head (docs/training.md).

    Class attributes: ``method`` (the method the head is for; what users pass as ``--method``) and ``Options`` (a
    dataclass of the method's training knobs, with defaults; ``--option key=value`` sets them). Instance or class
    attributes read by the loop after ``__init__``: ``layer_ids`` (the HF hidden-state indices the loss needs) and
    ``last_layer`` (whether it needs the final hidden state, key ``"last"``). The head is built once, on first
    use of :attr:`head`, by :meth:`build_head`; the loop moves it to the device, seeds before building it and owns
    its optimizer.
    """

    method: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    layer_ids: tuple[int, ...] = ()
    last_layer: bool = True

    def __init__(self, target: TargetInfo, options: Any = None) -> None:
        self.target = target
        self.options = self.Options() if options is None else options
        self._head: nn.Module | None = None

    @property
    def head(self) -> nn.Module:
        if self._head is None:
            self._head = self.build_head()
        return self._head

    def hidden_keys(self) -> list[str]:
        """The keys of :attr:`Batch.hidden` this trainer reads: its layer ids, then ``"last"``."""
        return [str(i) for i in self.layer_ids] + ([LAST] if self.last_layer else [])

    @abc.abstractmethod
    def build_head(self) -> nn.Module:
        """The head to train, from ``self.target`` (config, shared weights) and ``self.options``."""

    @abc.abstractmethod
    def loss(self, batch: Batch) -> torch.Tensor:
        """A scalar training loss of :attr:`head` on ``batch`` (mean over the positions it counts)."""

    @abc.abstractmethod
    def acceptance(self, batch: Batch) -> torch.Tensor:
        """``[M, k]`` bool: for M positions of ``batch`` where all k draft positions can be checked, whether the
        head's top-1 draft at position j equals the target's own next token there (its greedy token given the
        true prefix). The loop averages it per column, and the prefix products estimate a chain's acceptance."""

    @abc.abstractmethod
    def save(self, out_dir: Path) -> None:
        """Write :attr:`head` into ``out_dir`` (which exists) in the method's published format, loadable as the
        method's ``model=``. The loop writes README.md and metrics.json beside it afterwards."""

    def describe(self) -> str:
        """One line for the model card: what the head is."""
        params = sum(p.numel() for p in self.head.parameters() if p.requires_grad)
        return f"{type(self).__name__} head, {params:,} trainable parameters"


def build_trainer(cls: type[Trainer], target: TargetInfo, options: dict[str, Any] | None = None) -> Trainer:
    """``cls(target, Options(**options))`` after checking the option names and types like a proposer's config."""
    given = dict(options or {})
    valid = init_option_names(cls.Options)
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"Unknown training option(s) {unknown} for method {cls.method!r}. Valid options: "
                         f"{', '.join(valid) or 'none'} (set with --option key=value).")
    return cls(target, build_options(cls.Options, cls.method, given))


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


def _batch_indices(train_ids: list[int], step: int, batch_size: int, seed: int, cache: dict[int, list[int]]
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


def _save_atomic(obj: Any, path: Path) -> None:
    """torch.save to a temporary file beside ``path``, flushed to disk, then renamed over it: a crash leaves the
    previous checkpoint or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(slots=True)
class _Run:
    """The loop's settings (validated once) and what it has measured so far."""

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
        for name, value, ok, rule in (
            ("lr", self.lr, self.lr > 0, "a finite number > 0, e.g. 1e-3"),
            ("weight_decay", self.weight_decay, self.weight_decay >= 0, "a finite number >= 0"),
            ("grad_clip", self.grad_clip, self.grad_clip >= 0, "a finite number >= 0 (0 = no clipping)"),
            ("eval_fraction", self.eval_fraction, 0 < self.eval_fraction < 1, "in (0, 1), e.g. 0.05"),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok:
                raise ValueError(f"{name}={value!r} is invalid: it must be {rule}.")

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed run must share with the one it continues (eval and checkpoint spacing may change)."""
        keys = ("steps", "batch_size", "lr", "warmup", "weight_decay", "grad_clip", "seed", "eval_fraction")
        return {k: getattr(self, k) for k in keys}


def _options_dict(options: Any) -> dict[str, Any]:
    return asdict(options) if is_dataclass(options) and not isinstance(options, type) else {}


@torch.no_grad()
def _evaluate(trainer: Trainer, data: Any, held: list[int], batch_size: int, device: torch.device,
              keys: list[str]) -> dict[str, Any]:
    """Mean held-out loss (weighted by sequences per batch) and the acceptance estimate per draft position."""
    head = trainer.head
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
    accepted = torch.cat(rows) if rows else torch.zeros(0, 0, dtype=torch.bool)  # [M, k]
    per_pos = accepted.float().mean(0) if len(accepted) else torch.zeros(accepted.shape[1])
    prefix = accepted.float().cumprod(1).mean(0) if len(accepted) else torch.zeros(accepted.shape[1])
    return {"loss": loss_sum / max(1, len(held)), "acceptance_per_position": [round(x, 4) for x in per_pos.tolist()],
            "accepted_prefix_per_position": [round(x, 4) for x in prefix.tolist()],
            "mean_acceptance_length": round(1.0 + prefix.sum().item(), 4), "positions": int(len(accepted))}


def _optimizer(head: nn.Module, lr: float, weight_decay: float, device: torch.device) -> torch.optim.AdamW:
    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the trainer's head has no trainable parameters (every parameter has requires_grad=False).")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def _load_checkpoint(path: Path, trainer: Trainer, opt: torch.optim.Optimizer, identity: dict[str, Any]
                     ) -> dict[str, Any]:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)  # our own file: it holds numpy RNG state
    for key, value in identity.items():
        if ckpt["identity"].get(key) != value:
            raise ValueError(f"--resume: the checkpoint {str(path)!r} was written by a run with {key}="
                             f"{ckpt['identity'].get(key)!r}, this run has {key}={value!r}; resume with the same "
                             "settings, or train into a new --out.")
    trainer.head.load_state_dict(ckpt["head"])
    opt.load_state_dict(ckpt["optimizer"])
    _set_rng_state(ckpt["rng"])
    return ckpt


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def train(trainer: Trainer, data: Any, out_dir: str | Path, *, steps: int, batch_size: int = 8, lr: float = 1e-3,
          warmup: int | None = None, weight_decay: float = 0.0, grad_clip: float = 1.0, seed: int = 0,
          eval_every: int = 100, eval_fraction: float = 0.05, device: str | torch.device = "cpu",
          resume: bool = False, progress: bool = True, save_every: int | None = None,
          max_eval_sequences: int = 256, keep_checkpoint: bool = False, command: str | None = None,
          log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train ``trainer.head`` on ``data`` and write it, its model card and metrics.json into ``out_dir``.

    ``data``: a :class:`specdec_tools.train_data.ShardData` or :class:`~specdec_tools.train_data.OnlineData`.
    ``warmup`` defaults to min(100, steps // 10); ``save_every`` (checkpoint spacing) to ``eval_every``. A
    checkpoint (head, optimizer, step, RNG states, eval history) is written atomically to ``out_dir/checkpoint.pt``
    every ``save_every`` steps; ``resume=True`` continues from it and ends with the weights an uninterrupted run
    would have. It is deleted once the run has written its outputs, unless ``keep_checkpoint``. Returns the
    metrics written to metrics.json.
    """
    from tqdm.auto import tqdm

    from specdec_tools.train_card import collect_metrics, write_card

    run = _Run(steps, batch_size, lr, min(100, steps // 10) if warmup is None else warmup, weight_decay,
               grad_clip, seed, eval_every, save_every or eval_every, eval_fraction, max_eval_sequences)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    dev = torch.device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT
    if ckpt_path.exists() and not resume:
        raise ValueError(f"--out {str(out)!r} holds the checkpoint of an unfinished run ({CHECKPOINT}): pass "
                         "--resume to continue it, or train into a new --out.")
    keys = trainer.hidden_keys()
    data.check(trainer)
    train_ids, held = held_out_split(len(data), run.eval_fraction)
    held = held[: run.max_eval_sequences]
    identity = {"method": trainer.method, "options": _options_dict(trainer.options), **run.fingerprint(),
                "data": data.fingerprint()}

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    head = trainer.head.to(dev).float().train()
    opt = _optimizer(head, run.lr, run.weight_decay, dev)
    start, history, elapsed, resumed_from = 0, [], 0.0, None
    running: torch.Tensor | None = None  # the smoothed training loss the progress bar shows
    if resume and ckpt_path.exists():
        ckpt = _load_checkpoint(ckpt_path, trainer, opt, identity)
        start, history, elapsed, resumed_from = ckpt["step"], ckpt["history"], ckpt["elapsed"], ckpt["step"]
        running = None if ckpt["running"] is None else torch.tensor(ckpt["running"], device=dev)
        log(f"specdec train: resuming {trainer.method} from step {start} of {steps} ({ckpt_path})")
    elif resume:
        log(f"specdec train: --resume: no checkpoint in {str(out)!r} yet, starting at step 0")

    cache: dict[int, list[int]] = {}
    step_seconds, target_seconds, timed_steps = 0.0, 0.0, 0
    bar = tqdm(total=steps, initial=start, disable=not progress, desc=f"train {trainer.method}", unit="step",
               dynamic_ncols=True)
    t_run = time.perf_counter()
    for step in range(start, steps):
        t0 = time.perf_counter()
        target_before = data.target_seconds
        for group in opt.param_groups:
            group["lr"] = lr_at(step, run.lr, run.warmup, steps)
        batch = data.batch(_batch_indices(train_ids, step, batch_size, seed, cache), keys, dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = trainer.loss(batch)
        loss.backward()
        if run.grad_clip:
            torch.nn.utils.clip_grad_norm_(head.parameters(), run.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        running = loss.detach().float() if running is None else 0.9 * running + 0.1 * loss.detach().float()
        if step > start:  # the first step of a process pays for allocation and warm-up
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            step_seconds += time.perf_counter() - t0
            target_seconds += data.target_seconds - target_before
            timed_steps += 1
        done = step + 1
        bar.update(1)
        if done % 10 == 0 or done == steps:
            bar.set_postfix(loss=f"{running.item():.3f}", refresh=False)
        if done % run.eval_every == 0 or done == steps:
            result = _evaluate(trainer, data, held, batch_size, dev, keys)
            history.append({"step": done, "train_loss": round(running.item(), 4), **result})
            bar.set_postfix(loss=f"{running.item():.3f}", held_out=f"{result['loss']:.3f}", refresh=False)
            line = (f"step {done}/{steps}: held-out loss {result['loss']:.4f}, acceptance per position "
                    f"{result['acceptance_per_position']}")
            if progress:
                tqdm.write(line, file=sys.stderr)
            else:
                log(line)
        if done % run.save_every == 0 and done < steps:
            _save_atomic({"identity": identity, "step": done, "head": head.state_dict(), "optimizer": opt.state_dict(),
                          "rng": _rng_state(), "history": history,
                          "running": None if running is None else running.item(),
                          "elapsed": elapsed + time.perf_counter() - t_run}, ckpt_path)
    bar.close()
    elapsed += time.perf_counter() - t_run

    timing = {"seconds": round(elapsed, 2), "timed_steps": timed_steps,
              "mean_step_seconds": round(step_seconds / timed_steps, 5) if timed_steps else None,
              "target_forward_share": (round(target_seconds / step_seconds, 4)
                                       if data.online and step_seconds > 0 else None)}
    if timed_steps:
        share = (f", {timing['target_forward_share']:.0%} of it in the target forward"
                 if timing["target_forward_share"] is not None else "")
        log(f"specdec train: mean step time {timing['mean_step_seconds'] * 1000:.1f} ms over {timed_steps} "
            f"steps{share}")
    trainer.save(out)
    metrics = collect_metrics(trainer, data, run_settings={**run.fingerprint(), "eval_every": run.eval_every,
                                                          "save_every": run.save_every},
                              history=history, timing=timing, device=_device_name(dev), resumed_from=resumed_from,
                              split=(len(train_ids), len(held)), command=command)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(out, metrics)
    if ckpt_path.exists() and not keep_checkpoint:
        ckpt_path.unlink()
    return metrics

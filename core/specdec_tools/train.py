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
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from specdec.options import NoOptions, build_options, init_option_names
from specdec_tools.train_loop import Settings, State, held_out_split, lr_at, options_dict, run_steps, start_state

__all__ = ["Batch", "FrozenWeight", "TargetInfo", "TrainedHeads", "Trainer", "build_trainer", "held_out_split",
           "lr_at", "train", "CHECKPOINT", "LAST"]  # held_out_split and lr_at live in train_loop; re-exported

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


class FrozenWeight(nn.Module):
    """A target weight a head reads but never trains: its embedding (``embedding=True``: ``F.embedding``) or its LM
    head (``F.linear`` in the input's dtype), held as a non-persistent buffer, so that it is neither a parameter of
    the optimiser nor written into checkpoints or the saved head."""

    def __init__(self, weight: torch.Tensor, embedding: bool) -> None:
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding:
            return nn.functional.embedding(x, self.weight)
        return nn.functional.linear(x, self.weight.to(x.dtype))


class TrainedHeads(nn.Module):
    """What a head trainer's loop trains and checkpoints: the head (``net``), the target's LM head (frozen and not
    saved: the target's own distribution and greedy token, :meth:`target_logits`) and ``token_counts [V]`` of the
    training batches so far (persistent, so a resumed run keeps them; they pick a truncated draft vocabulary)."""

    def __init__(self, net: nn.Module, target_lm_head: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("target_lm_head", target_lm_head, persistent=False)
        self.register_buffer("token_counts", torch.zeros(target_lm_head.shape[0], dtype=torch.long))

    def target_logits(self, last: torch.Tensor) -> torch.Tensor:
        """The target's float32 logits from its final hidden states ``last [..., H]``."""
        return (last @ self.target_lm_head.to(last.dtype).T).float()

    def count_tokens(self, ids: torch.Tensor) -> None:
        """Add the token ids a training batch learns (``ids``, any shape) to :attr:`token_counts`; evaluation (the
        module in eval mode, or gradients off) leaves them as they are."""
        if self.training and torch.is_grad_enabled():
            self.token_counts += torch.bincount(ids.reshape(-1), minlength=self.token_counts.numel())


def build_trainer(cls: type[Trainer], target: TargetInfo, options: dict[str, Any] | None = None) -> Trainer:
    """``cls(target, Options(**options))`` after checking the option names and types like a proposer's config."""
    given = dict(options or {})
    valid = init_option_names(cls.Options)
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"Unknown training option(s) {unknown} for method {cls.method!r}. Valid options: "
                         f"{', '.join(valid) or 'none'} (set with --option key=value).")
    return cls(target, build_options(cls.Options, cls.method, given))


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
    would have. It is deleted once the run has written its outputs, unless ``keep_checkpoint``. ``log`` gets the
    loop's lines (default: stderr). Returns the metrics written to metrics.json.
    """
    s = Settings(steps, batch_size, lr, min(100, steps // 10) if warmup is None and isinstance(steps, int) else warmup,
                 weight_decay, grad_clip, seed, eval_every, save_every or eval_every, eval_fraction, max_eval_sequences)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    dev = torch.device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    if checkpoint.exists() and not resume:
        raise ValueError(f"--out {str(out)!r} holds the checkpoint of an unfinished run ({CHECKPOINT}): pass "
                         "--resume to continue it, or train into a new --out.")
    data.check(trainer)
    train_ids, held = held_out_split(len(data), s.eval_fraction)
    held = held[: s.max_eval_sequences]
    identity = {"method": trainer.method, "options": options_dict(trainer.options), **s.fingerprint(),
                "data": data.fingerprint()}
    state = start_state(trainer, s, dev, checkpoint if resume else None, identity, log)
    run_steps(trainer, data, s, state, (train_ids, held), dev, checkpoint, identity, progress, log)
    metrics = _finish(trainer, data, s, state, out, dev, (len(train_ids), len(held)), command, log)
    if checkpoint.exists() and not keep_checkpoint:
        checkpoint.unlink()
    return metrics


def _finish(trainer: Trainer, data: Any, s: Settings, state: State, out: Path, device: torch.device,
            split: tuple[int, int], command: str | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Log the step time, then write the head (the trainer's format), metrics.json and README.md."""
    from specdec_tools.train_card import collect_metrics, write_card

    n = state.timed_steps
    share = state.target_seconds / state.step_seconds if data.online and state.step_seconds > 0 else None
    timing = {"seconds": round(state.elapsed, 2), "timed_steps": n,
              "mean_step_seconds": round(state.step_seconds / n, 5) if n else None,
              "target_forward_share": None if share is None else round(share, 4)}
    if n:
        in_target = f", {share:.0%} of it in the target forward" if share is not None else ""
        log(f"specdec train: mean step time {state.step_seconds / n * 1000:.1f} ms over {n} steps{in_target}")
    trainer.save(out)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    metrics = collect_metrics(trainer, data, run_settings={**s.fingerprint(), "eval_every": s.eval_every,
                                                          "save_every": s.save_every},
                              history=state.history, timing=timing, device=name, resumed_from=state.resumed_from,
                              split=split, command=command)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(out, metrics)
    return metrics

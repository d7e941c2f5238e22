"""Training Medusa heads: ``specdec train --method medusa`` (Medusa-1: the target frozen, only the heads train).

The trainer owns the method's part of ``specdec train`` (docs/training.md): the heads (:mod:`specdec_medusa.heads`),
the loss, the held-out acceptance estimate and the two published layouts; the common loop does the rest.

- **Heads**: ``num_heads`` heads of ``num_layers`` residual blocks over the target's last hidden state (after the
  final norm). Blocks start at zero (the identity, as Medusa trains them) and every vocabulary projection starts
  as the target's LM head, so head i starts by guessing the next token; training moves it i + 1 tokens further.
- **Loss**: head i at position t is scored against the token at t + 2 + i: cross-entropy against the target's own
  distribution there (its logits at position t + 1 + i; ``soft_labels``, the self-distillation the Medusa paper
  recommends when the training text is not the target's own output), else against the data's token. Head i's
  weight is ``head_weight ** i`` (the paper's 0.8^i), and the sum is divided by the sum of the weights.
- **Acceptance**: at every position, head i's argmax against the target's greedy token at t + 1 + i given the
  true prefix (draft i + 1 of a step that drafts from position t).
- **Layouts** (``format``): ``fasterdecoding`` (default: ``medusa_lm_head.safetensors`` + ``medusa_num_heads`` /
  ``medusa_num_layers``); with ``num_layers`` > 1 each head trains one block applied ``num_layers`` times and
  writes it ``num_layers`` times, because the reference builds ``[ResBlock] * layers`` (one module) and would
  load only one of several distinct blocks. ``vllm``: ``model.safetensors`` with ``blocks.*`` / ``lm_heads.*``
  (blocks of their own, with bias), and with ``draft_vocab_size`` > 0 a truncated vocabulary: the training
  batches' most frequent target ids (ties: the lower id), ascending, as ``token_map``, and those rows of each
  projection (the heads train over the whole vocabulary while the tokens are counted; the held-out acceptance
  already drafts from the kept set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import check_int
from specdec_medusa.heads import MedusaConfig, MedusaHeads
from specdec_tools.train import LAST, Batch, TargetInfo, TrainedHeads, Trainer

__all__ = ["MedusaTrainer", "MedusaTrainOptions", "TrainedMedusa", "SAVE_FORMATS", "frequent_tokens"]

SAVE_FORMATS = ("fasterdecoding", "vllm")


@dataclass(frozen=True)
class MedusaTrainOptions:
    """``num_heads``: heads (the most drafts a step can take). ``num_layers``: residual blocks per head.
    ``head_weight``: head i's loss weight is ``head_weight ** i``. ``soft_labels``: cross-entropy against the
    target's distribution (else the data's token). ``format``: ``fasterdecoding`` or ``vllm``.
    ``draft_vocab_size``: with ``format=vllm``, a truncated head vocabulary of the training data's most frequent
    tokens (0 = the target's whole vocabulary)."""

    num_heads: int = 4
    num_layers: int = 1
    head_weight: float = 0.8
    soft_labels: bool = True
    format: str = "fasterdecoding"
    draft_vocab_size: int = 0

    def __post_init__(self) -> None:
        check_int("num_heads", self.num_heads, 1, "(heads: the most drafts a step can take)")
        check_int("num_layers", self.num_layers, 0, "(residual blocks per head)")
        check_int("draft_vocab_size", self.draft_vocab_size, 0, "(0 = the target's vocabulary)")
        w = self.head_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w <= 1:
            raise ValueError(f"head_weight={w!r} is invalid: it must be a number in (0, 1] (head i's loss weight is "
                             "head_weight**i).")
        if self.format not in SAVE_FORMATS:
            raise ValueError(f"format={self.format!r} is invalid: it must be one of {', '.join(SAVE_FORMATS)}.")
        if self.draft_vocab_size and self.format != "vllm":
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} needs format=vllm: only vLLM's layout has a "
                             "truncated vocabulary (token_map); FasterDecoding's heads project onto the whole "
                             "vocabulary.")


def frequent_tokens(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids of ``counts [V]`` (ties: the lower id), ascending: a ``token_map``."""
    return torch.sort(-counts.cpu(), stable=True).indices[:size].sort().values


def _shift(x: torch.Tensor, n: int, fill: Any = 0) -> torch.Tensor:
    """``x`` moved ``n`` positions left along dim 1 (``out[:, i] = x[:, i + n]``), padded with ``fill``."""
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat((x[:, n:], pad), 1)


class TrainedMedusa(TrainedHeads):
    """What the loop trains and checkpoints (:class:`~specdec_tools.train.TrainedHeads`): the heads as ``net``, the
    target's LM head frozen, the training batches' token counts (they pick a truncated vocabulary)."""

    net: MedusaHeads


class MedusaTrainer(Trainer):
    """``specdec train --method medusa``: Medusa-1 heads on the target's last hidden state."""

    method = "medusa"
    Options = MedusaTrainOptions
    last_layer = True

    def __init__(self, target: TargetInfo, options: MedusaTrainOptions | None = None) -> None:
        super().__init__(target, options)
        vd = self.options.draft_vocab_size
        if vd > target.vocab_size:
            raise ValueError(f"draft_vocab_size={vd} is invalid: it must be at most the target's vocab_size="
                             f"{target.vocab_size} (0 = the whole vocabulary).")
        self.vocab_size = vd or target.vocab_size

    def build_head(self) -> nn.Module:
        o = self.options
        cfg = MedusaConfig(o.num_heads, o.num_layers, self.target.hidden_size, self.target.vocab_size,
                           shared_block=o.format == "fasterdecoding")
        net = MedusaHeads(cfg)
        lm = self.target.lm_head_weight()
        with torch.no_grad():
            net.lm_head.copy_(lm.expand_as(net.lm_head))
        return TrainedMedusa(net, lm)

    def _hidden(self, batch: Batch) -> torch.Tensor:
        """Every head's block outputs at every position: ``[N, B * T, H]``."""
        last = batch.hidden[LAST]
        return self.head.net.hidden(last.reshape(-1, last.shape[-1]))

    def loss(self, batch: Batch) -> torch.Tensor:
        head, o = self.head, self.options
        learn = batch.valid & batch.loss_mask
        head.count_tokens(batch.input_ids[learn])  # the training data's token frequencies (truncated vocabulary)
        with torch.no_grad():
            target_logits = head.target_logits(batch.hidden[LAST])  # [B, T, V]
        hidden = self._hidden(batch)  # [N, B*T, H]
        total, weights = 0.0, 0.0
        for i in range(o.num_heads):
            mask = _shift(learn, 2 + i, False).reshape(-1)  # head i at t predicts token t + 2 + i
            logp = F.log_softmax(head.net.head_logits(hidden[i, mask], i).float(), -1)  # [M, V]
            if o.soft_labels:  # the target's distribution after position t + 1 + i
                p = F.softmax(_shift(target_logits, 1 + i).reshape(-1, target_logits.shape[-1])[mask], -1)
                nll = -(p * logp).sum(-1)
            else:
                nll = -logp.gather(-1, _shift(batch.input_ids, 2 + i).reshape(-1)[mask][:, None])[:, 0]
            step = nll.sum() / mask.sum().clamp(min=1)
            total, weights = total + o.head_weight ** i * step, weights + o.head_weight ** i
        return total / weights

    def token_map(self) -> torch.Tensor | None:
        """The truncated vocabulary from the token counts so far, or None (the whole vocabulary)."""
        if self.vocab_size == self.target.vocab_size:
            return None
        return frequent_tokens(self.head.token_counts, self.vocab_size)

    def acceptance(self, batch: Batch) -> torch.Tensor:
        n, head = self.options.num_heads, self.head
        b, t_all = batch.input_ids.shape
        t = t_all - n  # positions whose n drafts all have a target token to compare with
        if t <= 0:
            return torch.zeros(0, n, dtype=torch.bool, device=batch.input_ids.device)
        greedy = head.target_logits(batch.hidden[LAST]).argmax(-1)  # [B, T]: the target's token after each position
        logits = head.net.logits(self._hidden(batch)).view(n, b, t_all, -1)  # [N, B, T, V]
        tm = self.token_map()
        if tm is not None:
            allowed = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            allowed[tm.to(logits.device)] = True
            logits = logits.masked_fill(~allowed, float("-inf"))
        drafts = logits.argmax(-1).permute(1, 2, 0)[:, :t]  # [B, t, N]
        want = torch.stack([greedy[:, 1 + i: 1 + i + t] for i in range(n)], -1)  # [B, t, N]
        return (drafts == want)[batch.valid[:, n: n + t]]  # [M, N]

    def save(self, out_dir: Path) -> None:
        from safetensors.torch import save_file

        net, o, out = self.head.net, self.options, Path(out_dir)
        w, lm = net.weight.detach().float().cpu(), net.lm_head.detach().float().cpu()
        bias = net.bias.detach().float().cpu()
        tensors: dict[str, torch.Tensor] = {}
        if o.format == "fasterdecoding":
            for i in range(o.num_heads):
                for j in range(o.num_layers):  # one shared block, written once per layer (the reference's keys)
                    tensors[f"{i}.{j}.linear.weight"], tensors[f"{i}.{j}.linear.bias"] = w[i, 0].clone(), bias[i, 0]
                tensors[f"{i}.{o.num_layers}.weight"] = lm[i]
            config = {"medusa_num_heads": o.num_heads, "medusa_num_layers": o.num_layers,
                      "base_model_name_or_path": self.target.path}
            name = "medusa_lm_head.safetensors"
        else:
            tm = self.token_map()
            for i in range(o.num_heads):
                for j in range(o.num_layers):
                    tensors[f"blocks.{i}.layers.{j}.weight"] = w[i, j]
                    tensors[f"blocks.{i}.layers.{j}.bias"] = bias[i, j]
                tensors[f"lm_heads.{i}.weight"] = lm[i] if tm is None else lm[i][tm]
            if tm is not None:
                tensors["token_map"] = tm
            config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": net.cfg.hidden_size,
                      "vocab_size": self.target.vocab_size, "num_heads": o.num_heads, "num_hidden_layers": o.num_layers,
                      "truncated_vocab_size": self.vocab_size, "medusa_fc_bias": True, "original_lm_head": False,
                      "base_model_name_or_path": self.target.path}
            name = "model.safetensors"
        save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(out / name), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def describe(self) -> str:
        o = self.options
        params = sum(p.numel() for p in self.head.parameters() if p.requires_grad)
        vocab = (f"truncated vocabulary {self.vocab_size} (most frequent tokens)" if self.vocab_size <
                 self.target.vocab_size else "the target's vocabulary")
        return (f"Medusa-1 heads: {o.num_heads} heads of {o.num_layers} residual block(s) over the target's last "
                f"hidden state, {vocab}; loss weights {o.head_weight}^i, {'soft' if o.soft_labels else 'hard'} labels; "
                f"{o.format} layout ({params:,} trainable parameters while training)")

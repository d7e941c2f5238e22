"""Training EAGLE heads: ``specdec train --method eagle3`` (EAGLE-3) and ``--method eagle`` (EAGLE-1).

The trainers own the method's part of ``specdec train`` (docs/training.md): the head (:mod:`specdec_eagle.heads`,
with the target's embedding shared and frozen), the loss, the held-out acceptance estimate and the published
layouts (:mod:`specdec_eagle.train_layouts`); the common loop does the rest.

- **EAGLE-3** reads the target's hidden states ``layer_ids`` (default: 2, N//2, N-3, the inputs of those layers,
  deduplicated and ascending: what the loader assumes), concatenated low to high. Training-time test: the head is
  unrolled ``ttt_steps`` times on its own outputs (:func:`unroll`); step s at position t predicts token t + 2 + s
  and is scored by cross-entropy against the target's distribution there (``soft_labels``; else the data's
  token), weighted ``step_weight ** s``, normalised by the sum of the weights. Its ``lm_head`` starts as the
  target's and is trained.
- **EAGLE-1** reads the target's last hidden state (after the final norm) and reads out through the target's frozen
  LM head. Loss as in the paper and SafeAILab's trainer: ``feature_weight`` (1.0) x smooth L1 between the head's
  output and the target's next feature + ``token_weight`` (0.1) x cross-entropy against the target's next-token
  distribution. ``ttt_steps`` > 1 unrolls it like EAGLE-3 (default 1: the paper's single step).

**Draft vocabulary** (EAGLE-3, ``draft_vocab_size`` < V): the trainer hook sees no data before the head is built,
so the head trains over the full vocabulary while it counts the tokens of every training batch (a buffer of the
head, so a resumed run keeps the counts); :meth:`Eagle3Trainer.save` keeps the ``draft_vocab_size`` most frequent
target ids (ties: lower id), ascending, as ``d2t`` (draft id -> offset to the target id) and ``t2d`` (bool over
the target vocabulary), and the matching rows of ``lm_head``. The held-out acceptance already drafts from that set.

**Acceptance** (both): at every position t, the greedy chain of ``acceptance_steps`` drafts, each step fed the
head's own token and hidden state, compared with the target's greedy token given the true prefix (from its LM
head on ``hidden["last"]``): draft j against the target's token after position t + 1 + j.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import check_int
from specdec.head_layers import rope_from_config
from specdec_eagle.heads import EagleHead, HeadConfig, build_head
from specdec_eagle.train_layouts import WRITE_KEYS, eagle1_config, eagle3_config, rename, speculators_config
from specdec_tools.train import LAST, Batch, FrozenWeight, TargetInfo, TrainedHeads, Trainer

__all__ = ["EagleTrainer", "Eagle3Trainer", "EagleTrainOptions", "Eagle3TrainOptions", "TrainedHead",
           "default_layer_ids", "draft_vocab", "unroll"]

SAVE_FORMATS = ("safeailab", "speculators")


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's feature layers: inputs of layers 2, N//2, N-3 (HF ``hidden_states`` indexing), deduplicated and
    ascending (the loader's rule: a 4-layer target gives (1, 2))."""
    return tuple(sorted({2, num_layers // 2, num_layers - 3}))


def _number(name: str, value: Any, rule: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{name}={value!r} is invalid: it must be {rule}.")


def _check_common(o: Any) -> None:
    check_int("ttt_steps", o.ttt_steps, 1, "(head steps unrolled on its own outputs in training)")
    check_int("acceptance_steps", o.acceptance_steps, 1, "(draft positions in the held-out acceptance estimate)")
    check_int("intermediate_size", o.intermediate_size, 0, "(the head's MLP width; 0 = the target's)")
    _number("step_weight", o.step_weight, "a number in (0, 1] (loss weight of unrolled step s: step_weight**s)",
            lambda v: 0 < v <= 1)


@dataclass(frozen=True)
class Eagle3TrainOptions:
    """``layer_ids``: the target hidden states the head reads (HF indexing; ``"2,8,13"`` or a list; default 2, N//2,
    N-3). ``ttt_steps``: steps unrolled on the head's own outputs (training-time test). ``step_weight``: step s's loss
    weight is ``step_weight ** s``. ``draft_vocab_size``: the draft vocabulary, the most frequent tokens of the
    training data (0 = the target's whole vocabulary). ``soft_labels``: cross-entropy against the target's
    distribution (else against the data's next token). ``acceptance_steps``: draft positions of the held-out
    estimate. ``intermediate_size``: the head's MLP width (0 = the target's). ``format``: ``safeailab``
    (``midlayer.*``, ``LlamaForCausalLMEagle3``) or ``speculators`` (``layers.0.*``)."""

    layer_ids: Any = None
    ttt_steps: int = 3
    step_weight: float = 0.8
    draft_vocab_size: int = 0
    soft_labels: bool = True
    acceptance_steps: int = 5
    intermediate_size: int = 0
    format: str = "safeailab"

    def __post_init__(self) -> None:
        ids = self.layer_ids
        if isinstance(ids, str) and not ids.strip():
            ids = None
        elif isinstance(ids, str):
            try:
                ids = [int(x) for x in ids.split(",")]
            except ValueError:
                pass  # refused below, naming the value
        elif isinstance(ids, int) and not isinstance(ids, bool):
            ids = [ids]
        if ids is not None:
            if (not isinstance(ids, (list, tuple)) or not ids or
                    not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
                raise ValueError(f"layer_ids={self.layer_ids!r} is invalid: it must be target layer ids >= 0 (HF "
                                 "hidden_states indexing), e.g. layer_ids=2,8,13 or [2, 8, 13].")
            ids = tuple(sorted(set(ids)))
        object.__setattr__(self, "layer_ids", ids)
        _check_common(self)
        check_int("draft_vocab_size", self.draft_vocab_size, 0, "(0 = the target's vocabulary)")
        if self.format not in SAVE_FORMATS:
            raise ValueError(f"format={self.format!r} is invalid: it must be one of {', '.join(SAVE_FORMATS)}.")


@dataclass(frozen=True)
class EagleTrainOptions:
    """``ttt_steps``: steps unrolled on the head's own features (1 = the paper's single step). ``step_weight``: step
    s's loss weight is ``step_weight ** s``. ``feature_weight`` / ``token_weight``: the smooth-L1 feature regression
    and the token cross-entropy (SafeAILab's 1.0 and 0.1). ``bias``: ``fc`` has a bias (the config's ``bias`` key).
    ``acceptance_steps``, ``intermediate_size``: as for eagle3."""

    ttt_steps: int = 1
    step_weight: float = 0.8
    feature_weight: float = 1.0
    token_weight: float = 0.1
    bias: bool = True
    acceptance_steps: int = 5
    intermediate_size: int = 0

    def __post_init__(self) -> None:
        _check_common(self)
        for name in ("feature_weight", "token_weight"):
            _number(name, getattr(self, name), "a finite number >= 0", lambda v: 0 <= v < float("inf"))
        if self.feature_weight == 0 and self.token_weight == 0:
            raise ValueError("feature_weight and token_weight are both 0: nothing to train; set one > 0.")


def draft_vocab(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [size] int64, t2d [V] bool)``: the ``size`` most frequent target ids of ``counts [V]`` (ties: the lower
    id), ascending, so that target id = draft id + ``d2t[draft id]``; ``t2d`` marks them."""
    ids = torch.sort(-counts.cpu(), stable=True).indices[:size].sort().values
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(size), t2d


def _shift(x: torch.Tensor, n: int, fill: Any = 0) -> torch.Tensor:
    """``x`` moved ``n`` positions left along dim 1 (``out[:, i] = x[:, i + n]``), padded with ``fill``."""
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat((x[:, n:], pad), 1)


def unroll(net: EagleHead, input_ids: torch.Tensor, features: torch.Tensor, steps: int,
           feed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The head's chain at every position at once (EAGLE-3's training-time test): ``steps`` hidden states ``[B, T,
    H]``. Step s at position i reads the token at i + 1 + s (or, with ``feed``, the token ``feed`` picks from step
    s - 1's hidden state) and step s - 1's own hidden state (step 0: the target features at i), at rotary position
    i + s, and attends to step 0's keys at positions <= i (the context, from the target's features) and to its own
    earlier steps' keys at i: what the chain anchored at i sees when it drafts."""
    t = input_ids.shape[1]
    pos = torch.arange(t, device=input_ids.device)
    causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=input_ids.device)
    hidden, (k, v) = net(_shift(input_ids, 1), features, pos, return_kv=True)
    keys, values, out = [k], [v], [hidden]
    for s in range(1, steps):
        tokens = _shift(input_ids, 1 + s) if feed is None else feed(hidden)
        mask = torch.cat([causal] + [eye] * s, 1)[None]  # [1, T, (s + 1) T]: context causal, own steps diagonal
        hidden, (k, v) = net(tokens, hidden, pos + s, past_kv=(torch.cat(keys, 2), torch.cat(values, 2)),
                             attn_mask=mask, return_kv=True)
        keys.append(k)
        values.append(v)
        out.append(hidden)
    return out


class TrainedHead(TrainedHeads):
    """What the loop trains and checkpoints (:class:`~specdec_tools.train.TrainedHeads`): the EAGLE head as ``net``,
    the target's LM head frozen, the training batches' token counts (they pick the draft vocabulary)."""

    net: EagleHead


class _EagleBase(Trainer):
    """What both trainers share: the head config from the target, features, the unrolled loss and acceptance."""

    kind: str

    def __init__(self, target: TargetInfo, options: Any = None) -> None:
        super().__init__(target, options)
        self.last_layer = True  # the target's distribution and greedy token come from its LM head on "last"

    def head_config(self, draft_vocab_size: int = 0) -> HeadConfig:
        c = self.target.config.get_text_config()
        theta, scaling = rope_from_config(c)
        heads = int(c.num_attention_heads)
        return HeadConfig(
            kind=self.kind, hidden_size=self.target.hidden_size,
            intermediate_size=self.options.intermediate_size or int(c.intermediate_size), num_attention_heads=heads,
            num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            vocab_size=self.target.vocab_size, draft_vocab_size=draft_vocab_size,
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
            bias=bool(getattr(self.options, "bias", True)), num_aux_layers=max(1, len(self.layer_ids)))

    def _net(self, draft_vocab_size: int = 0) -> EagleHead:
        net = build_head(self.head_config(draft_vocab_size))
        net.embed_tokens = FrozenWeight(self.target.weight("embed_tokens.weight", "wte.weight"), embedding=True)
        return net

    def features(self, batch: Batch) -> torch.Tensor:
        return batch.hidden[LAST]

    def step_loss(self, s: int, hidden: torch.Tensor, batch: Batch, target_logits: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` loss of unrolled step ``s`` at each position (before masking)."""
        raise NotImplementedError

    def loss(self, batch: Batch) -> torch.Tensor:
        head, o = self.head, self.options
        learn = batch.valid & batch.loss_mask
        head.count_tokens(batch.input_ids[learn])  # the training data's token frequencies (draft vocabulary)
        with torch.no_grad():
            target_logits = head.target_logits(batch.hidden[LAST])  # [B, T, V]
        total, weights = 0.0, 0.0
        for s, hidden in enumerate(unroll(head.net, batch.input_ids, self.features(batch), o.ttt_steps)):
            mask = _shift(learn, 2 + s, False).float()  # step s at i predicts token i + 2 + s
            step = (self.step_loss(s, hidden, batch, target_logits) * mask).sum() / mask.sum().clamp(min=1)
            total, weights = total + o.step_weight ** s * step, weights + o.step_weight ** s
        return total / weights

    def draft_mask(self) -> torch.Tensor | None:
        """``[V]`` bool: the target ids the saved head can draft (None: all)."""
        return None

    def acceptance(self, batch: Batch) -> torch.Tensor:
        k, head = self.options.acceptance_steps, self.head
        t = batch.input_ids.shape[1] - k  # positions whose k drafts all have a target token to compare with
        if t <= 0:
            return torch.zeros(0, k, dtype=torch.bool, device=batch.input_ids.device)
        greedy = head.target_logits(batch.hidden[LAST]).argmax(-1)  # [B, T]: the target's token after each position
        allowed = self.draft_mask()

        def pick(hidden: torch.Tensor) -> torch.Tensor:
            logits = head.net.logits(hidden)
            return (logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))).argmax(-1)

        hiddens = unroll(head.net, batch.input_ids, self.features(batch), k, feed=pick)
        drafts = torch.stack([pick(h)[:, :t] for h in hiddens], -1)  # [B, t, k]
        want = torch.stack([greedy[:, 1 + j: 1 + j + t] for j in range(k)], -1)  # [B, t, k]
        return (drafts == want)[batch.valid[:, k: k + t]]  # [M, k]

    def _write(self, out_dir: Path, config: dict[str, Any], state: dict[str, torch.Tensor], layout: str) -> None:
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous() for k, v in rename(state, WRITE_KEYS[layout]).items()}
        save_file({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()},
                  str(Path(out_dir) / "model.safetensors"), metadata={"format": "pt"})
        (Path(out_dir) / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def _sizes(self, cfg: HeadConfig) -> dict[str, Any]:
        c = self.target.config.get_text_config()
        return {**asdict(cfg), "max_position_embeddings": int(getattr(c, "max_position_embeddings", 2048))}


class Eagle3Trainer(_EagleBase):
    method = "eagle3"
    Options = Eagle3TrainOptions
    kind = "eagle3"

    def __init__(self, target: TargetInfo, options: Eagle3TrainOptions | None = None) -> None:
        super().__init__(target, options)
        n = target.num_layers
        self.layer_ids = self.options.layer_ids or default_layer_ids(n)
        bad = [i for i in self.layer_ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"layer_ids {list(self.layer_ids)} are invalid for target {target.path!r}: it has "
                             f"{n} layers, so EAGLE-3 feature ids run from 0 to {n - 1} (inputs of layers); pass "
                             "--option layer_ids=... with ids in that range.")
        vd = self.options.draft_vocab_size
        if vd > target.vocab_size:
            raise ValueError(f"draft_vocab_size={vd} is invalid: it must be at most the target's vocab_size="
                             f"{target.vocab_size} (0 = the whole vocabulary).")
        self.vocab_size = vd or target.vocab_size

    def build_head(self) -> nn.Module:
        net = self._net()  # trains over the full vocabulary; save() keeps the draft vocabulary's rows
        with torch.no_grad():
            net.lm_head.weight.copy_(self.target.lm_head_weight())
        return TrainedHead(net, self.target.lm_head_weight())

    def features(self, batch: Batch) -> torch.Tensor:
        return torch.cat([batch.hidden[str(i)] for i in self.layer_ids], -1)  # [B, T, n * Ht], low to high

    def step_loss(self, s: int, hidden: torch.Tensor, batch: Batch, target_logits: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(self.head.net.draft_logits(hidden), -1)  # [B, T, V]
        if self.options.soft_labels:  # the target's distribution after position i + 1 + s
            return -(F.softmax(_shift(target_logits, 1 + s), -1) * logp).sum(-1)
        return -logp.gather(-1, _shift(batch.input_ids, 2 + s)[..., None])[..., 0]

    def vocab_map(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(d2t, t2d)`` from the token counts so far, or None when the draft vocabulary is the target's."""
        if self.vocab_size == self.target.vocab_size:
            return None
        return draft_vocab(self.head.token_counts, self.vocab_size)

    def draft_mask(self) -> torch.Tensor | None:
        m = self.vocab_map()
        return None if m is None else m[1].to(self.head.token_counts.device)

    def save(self, out_dir: Path) -> None:
        net = self.head.net
        state = dict(net.state_dict())
        m = self.vocab_map()
        state.pop("d2t")
        state.pop("t2d")
        if m is not None:
            d2t, t2d = m
            state["lm_head.weight"] = state["lm_head.weight"].cpu()[torch.arange(self.vocab_size) + d2t]
            state["d2t"], state["t2d"] = d2t, t2d
        sizes = {**self._sizes(net.cfg), "draft_vocab_size": self.vocab_size}
        ids = list(self.layer_ids)
        if self.options.format == "speculators":
            verifier = {"name_or_path": self.target.path,
                        "architectures": list(getattr(self.target.config, "architectures", None) or [])}
            config = speculators_config(sizes, ids, verifier, self.options.acceptance_steps)
            self._write(out_dir, config, state, "speculators-eagle3")
        else:
            self._write(out_dir, eagle3_config(sizes, ids), state, "eagle3")

    def describe(self) -> str:
        params = sum(p.numel() for p in self.head.parameters() if p.requires_grad)
        vocab = f"draft vocabulary {self.vocab_size}" + (" (the target's)" if self.vocab_size ==
                                                        self.target.vocab_size else " (most frequent tokens)")
        o = self.options
        return (f"EAGLE-3 head over target layers {list(self.layer_ids)}, one decoder layer, {vocab}; training-time "
                f"test over {o.ttt_steps} step(s), weights {o.step_weight}^s; {o.format} layout ({params:,} trainable "
                "parameters while training)")


class EagleTrainer(_EagleBase):
    method = "eagle"
    Options = EagleTrainOptions
    kind = "eagle"

    def build_head(self) -> nn.Module:
        net = self._net()
        lm_head = self.target.lm_head_weight()
        net.lm_head = FrozenWeight(lm_head, embedding=False)  # EAGLE-1 reads out through the target's LM head
        return TrainedHead(net, lm_head)

    def step_loss(self, s: int, hidden: torch.Tensor, batch: Batch, target_logits: torch.Tensor) -> torch.Tensor:
        o = self.options
        feature = F.smooth_l1_loss(hidden.float(), _shift(batch.hidden[LAST], 1 + s).float(), reduction="none")
        logp = F.log_softmax(self.head.net.logits(hidden), -1)
        token = -(F.softmax(_shift(target_logits, 1 + s), -1) * logp).sum(-1)
        return o.feature_weight * feature.mean(-1) + o.token_weight * token

    def save(self, out_dir: Path) -> None:
        net = self.head.net
        self._write(out_dir, eagle1_config(self._sizes(net.cfg)), dict(net.state_dict()), "eagle1")

    def describe(self) -> str:
        params = sum(p.numel() for p in self.head.parameters() if p.requires_grad)
        o = self.options
        return (f"EAGLE-1 head over the target's last hidden state, one decoder layer, the target's LM head; loss "
                f"{o.feature_weight} x smooth L1 (next feature) + {o.token_weight} x cross-entropy, {o.ttt_steps} "
                f"step(s) ({params:,} trainable parameters)")

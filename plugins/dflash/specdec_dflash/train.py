"""Training DFlash drafts: ``specdec train --method dflash``.

The trainer owns the method's part of ``specdec train`` (docs/training.md): the draft (:mod:`specdec_dflash.heads`,
with the target's embedding and LM head shared and frozen, never saved), the block loss, the held-out acceptance
estimate and the published layouts (z-lab by default, ``format=speculators``); the common loop does the rest.

**What a block sees** (exactly what :class:`specdec_dflash.proposer.DFlashProposer` gives it when drafting): for an
anchor position ``a`` the block is ``[input_ids[a], mask x (block_size - 1)]`` at rotary positions
``a .. a + block_size - 1``; its context is the target's features (the chosen layers' outputs concatenated in
``target_layer_ids`` order, then ``fc`` and ``hidden_norm``) at positions ``0 .. a - 1`` only: at inference the
bonus token at ``p`` has not been through the target yet, so its own features are not in the context. Inside the
block attention is non-causal. Block index ``j`` (1 .. block_size - 1) drafts the token at ``a + j``.

**Loss**: ``anchors`` positions per sequence are drawn at random each step among those with a token to learn
right after them (``a >= 1``: at least one context position, as after any prefill; ``loss_mask`` at ``a + 1``),
and all blocks of a batch run in one forward: every row packs its blocks one after another, and an attention mask
lets each block see its own context prefix and its own block only. Block index ``j`` is scored by cross-entropy
against the target's distribution at position ``a + j`` (``soft_labels``: its LM head on the final hidden state
at ``a + j - 1``; else the data's token ``input_ids[a + j]``), counted where that token exists and is one to
learn, and weighted ``exp(-(j - 1) / loss_decay)`` (DFlash's decay: an early draft gates every later one, since a
chain accepts a prefix; ``loss_decay`` 0 weighs all positions alike); the loss is the weighted mean. Held-out
batches draw their anchors from a fixed seed, so evaluations compare.

**Acceptance** (held out): every position ``a`` with ``acceptance_steps`` checkable positions after it is an
anchor (in chunks of :data:`ACCEPTANCE_CHUNK` anchors per forward); draft ``j`` (the block's argmax at index
``j``) is compared with the target's greedy token after position ``a + j - 1`` given the true prefix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import check_int
from specdec.head_layers import rope_from_config
from specdec_dflash.heads import DFlashConfig, DFlashDraft
from specdec_dflash.loader import default_target_layer_ids
from specdec_tools.train import LAST, Batch, FrozenWeight, TargetInfo, Trainer

__all__ = ["ACCEPTANCE_CHUNK", "DFlashTrainOptions", "DFlashTrainer", "TrainedDraft", "block_hidden",
           "context_kv", "loss_weights", "pick_anchors"]

SAVE_FORMATS = ("z-lab", "speculators")
ACCEPTANCE_CHUNK = 32  # anchors per sequence in one forward of the held-out acceptance estimate
_EVAL_SEED = 0xDF1A5  # held-out anchors: the same every evaluation


@dataclass(frozen=True)
class DFlashTrainOptions:
    """Options of ``specdec train --method dflash`` (``--option key=value``).

    Attributes:
        num_layers: draft decoder layers.
        target_layer_ids: the target layers whose outputs the draft reads (z-lab ids: decoder layer ``i``, Hugging
            Face ``hidden_states[i + 1]``), ``"1,2"`` or a list, in the order they are concatenated; default
            DFlash's rule (:func:`specdec_dflash.loader.default_target_layer_ids`).
        block_size: tokens per block (the bonus and ``block_size - 1`` masks: at most ``block_size - 1`` drafts).
        mask_token_id: the id filling the block; -1 (default) = the last id of the target's vocabulary (the last
            BPE merge, about the rarest token; its embedding is the target's, frozen like the rest).
        anchors: blocks per training sequence per step (fewer where the sequence has fewer eligible positions).
        loss_decay: block index ``j`` weighs ``exp(-(j - 1) / loss_decay)``; 0 = all alike.
        soft_labels: cross-entropy against the target's distribution (else the data's token).
        acceptance_steps: draft positions of the held-out estimate (0 = ``block_size - 1``).
        intermediate_size: the draft's MLP width (0 = the target's).
        format: ``"z-lab"`` (``DFlashDraftModel`` config with ``dflash_config``) or ``"speculators"``.
    """

    num_layers: int = 1
    target_layer_ids: Any = None
    block_size: int = 8
    mask_token_id: int = -1
    anchors: int = 32
    loss_decay: float = 4.0
    soft_labels: bool = True
    acceptance_steps: int = 0
    intermediate_size: int = 0
    format: str = "z-lab"

    def __post_init__(self) -> None:
        ids = self.target_layer_ids
        if isinstance(ids, str):
            try:
                ids = [int(x) for x in ids.split(",")] if ids.strip() else None
            except ValueError:
                pass  # refused below, naming the value
        elif isinstance(ids, int) and not isinstance(ids, bool):
            ids = [ids]
        if ids is not None:
            if (not isinstance(ids, (list, tuple)) or not ids or len(set(ids)) != len(ids) or
                    not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
                raise ValueError(f"target_layer_ids={self.target_layer_ids!r} is invalid: it must be distinct target "
                                 "decoder layer ids >= 0 (z-lab ids: the outputs of those layers), e.g. "
                                 "target_layer_ids=1,2 or [1, 2].")
            ids = tuple(ids)
        object.__setattr__(self, "target_layer_ids", ids)
        check_int("num_layers", self.num_layers, 1, "(draft decoder layers)")
        check_int("block_size", self.block_size, 2, "(a block holds the bonus token and at least one mask)")
        check_int("mask_token_id", self.mask_token_id, -1, "(-1 = the target's last vocabulary id)")
        check_int("anchors", self.anchors, 1, "(blocks per training sequence per step)")
        check_int("acceptance_steps", self.acceptance_steps, 0, "(draft positions in the held-out estimate; "
                                                                "0 = block_size - 1)")
        check_int("intermediate_size", self.intermediate_size, 0, "(the draft's MLP width; 0 = the target's)")
        if self.acceptance_steps > self.block_size - 1:
            raise ValueError(f"acceptance_steps={self.acceptance_steps} is invalid: a block of block_size="
                             f"{self.block_size} drafts at most {self.block_size - 1} tokens.")
        d = self.loss_decay
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < math.inf:
            raise ValueError(f"loss_decay={d!r} is invalid: it must be a finite number >= 0 (block index j weighs "
                             "exp(-(j - 1) / loss_decay); 0 = all alike).")
        if self.format not in SAVE_FORMATS:
            raise ValueError(f"format={self.format!r} is invalid: it must be one of {', '.join(SAVE_FORMATS)}.")


class TrainedDraft(nn.Module):
    """What the loop trains and checkpoints: ``draft`` (a :class:`DFlashDraft` whose ``embed_tokens`` and
    ``lm_head`` are the target's, frozen); the target's own logits come from the same LM head."""

    def __init__(self, draft: DFlashDraft) -> None:
        super().__init__()
        self.draft = draft

    def target_logits(self, last: torch.Tensor) -> torch.Tensor:
        """The target's float32 logits from its final hidden states ``[..., H]``."""
        return self.draft.lm_head(last).float()


def loss_weights(block_size: int, decay: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[block_size - 1]``: the loss weight of block indices ``1 .. block_size - 1`` (``exp(-(j - 1) / decay)``,
    or ones for ``decay`` 0)."""
    j = torch.arange(block_size - 1, dtype=torch.float32, device=device)
    return torch.ones_like(j) if decay == 0 else torch.exp(-j / decay)


def pick_anchors(batch: Batch, count: int, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(anchors [B, n], ok [B, n])``: up to ``count`` distinct random anchor positions per row (ascending),
    among ``a >= 1`` whose next token is real and one to learn; ``ok`` is False on the slots a short row could
    not fill (n = ``min(count, T)``)."""
    b, t = batch.input_ids.shape
    learn = batch.valid & batch.loss_mask
    eligible = torch.zeros(b, t, dtype=torch.bool, device=learn.device)
    eligible[:, 1: t - 1] = learn[:, 2:]
    scores = torch.rand(b, t, generator=generator).to(learn.device)
    scores = torch.where(eligible, scores, -1.0)
    top = scores.topk(min(count, t), dim=1)
    anchors, ok = top.indices, top.values >= 0
    order = torch.where(ok, anchors, t).argsort(1)  # ascending; unfilled slots last
    return anchors.gather(1, order), ok.gather(1, order)


def context_kv(draft: DFlashDraft, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's context keys/values ``[B, kv_heads, T, d]`` from target ``features [B, T, n_ids * Ht]`` at
    positions ``0 .. T - 1`` (what :meth:`DFlashDraft.append_context` caches)."""
    b, t, _ = features.shape
    ctx = draft.context(features)
    positions = torch.arange(t, device=features.device)[None, :].expand(b, t)
    return [layer.kv(ctx, positions, draft.inv_freq) for layer in draft.layers]


def block_hidden(draft: DFlashDraft, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], input_ids: torch.Tensor,
                 anchors: torch.Tensor) -> torch.Tensor:
    """The normed outputs ``[B, n, block_size, H]`` of the blocks anchored at ``anchors [B, n]``, all in one
    forward: block ``i`` of row ``r`` is ``[input_ids[r, a], mask, ...]`` at positions ``a ..`` (a =
    ``anchors[r, i]``) and attends to the context positions ``< a`` and to its own block (non-causally)."""
    cfg = draft.cfg
    b, n = anchors.shape
    size, dev = cfg.block_size, anchors.device
    t = ctx_kv[0][0].shape[2]
    ids = torch.full((b, n, size), cfg.mask_token_id, dtype=torch.long, device=dev)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    positions = (anchors[:, :, None] + torch.arange(size, device=dev)).reshape(b, n * size)
    start = anchors[:, :, None].expand(b, n, size).reshape(b, n * size)
    ctx_visible = torch.arange(t, device=dev)[None, None, :] < start[:, :, None]  # [B, n * size, T]
    own = torch.arange(n, device=dev).repeat_interleave(size)
    block_visible = (own[:, None] == own[None, :])[None]  # [1, n * size, n * size]
    x = draft.embed_tokens(ids.view(b, n * size))
    for layer, (k, v) in zip(draft.layers, ctx_kv):
        x = layer(x, positions, draft.inv_freq, k.to(x.dtype), v.to(x.dtype), ctx_visible, block_visible)
    return draft.norm(x).view(b, n, size, -1)


class DFlashTrainer(Trainer):
    """Method ``dflash``: a new DFlash draft for the target (hidden size, heads and rotary the target's; vocabulary
    and embeddings the target's), trained with the block objective (module docstring)."""

    method = "dflash"
    Options = DFlashTrainOptions
    last_layer = True  # the target's distribution and greedy token

    def __init__(self, target: TargetInfo, options: DFlashTrainOptions | None = None) -> None:
        super().__init__(target, options)
        o, n = self.options, target.num_layers
        self.target_layer_ids = o.target_layer_ids or default_target_layer_ids(n, o.num_layers)
        bad = [i for i in self.target_layer_ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"target_layer_ids {list(self.target_layer_ids)} are invalid for target "
                             f"{target.path!r}: it has {n} decoder layers, so ids run from 0 to {n - 1}; pass "
                             "--option target_layer_ids=... with ids in that range.")
        self.layer_ids = tuple(sorted({i + 1 for i in self.target_layer_ids}))  # Hugging Face hidden_states indexing
        v = target.vocab_size
        self.mask_token_id = v - 1 if o.mask_token_id == -1 else o.mask_token_id
        if self.mask_token_id >= v:
            raise ValueError(f"mask_token_id={o.mask_token_id} is invalid for target {target.path!r}: its vocabulary "
                             f"has {v} ids (0 .. {v - 1}); pass an id in it, or -1 for the last one.")
        self.acceptance_steps = o.acceptance_steps or o.block_size - 1

    def draft_config(self) -> DFlashConfig:
        """The new draft's :class:`DFlashConfig`, from the target's config and the options."""
        c, o = self.target.config.get_text_config(), self.options
        heads = int(c.num_attention_heads)
        theta, scaling = rope_from_config(c)
        h = self.target.hidden_size
        return DFlashConfig(
            hidden_size=h, intermediate_size=o.intermediate_size or int(c.intermediate_size),
            num_attention_heads=heads, num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            num_layers=o.num_layers, vocab_size=self.target.vocab_size,
            target_layer_ids=tuple(self.target_layer_ids), mask_token_id=self.mask_token_id,
            block_size=o.block_size, head_dim=int(getattr(c, "head_dim", None) or h // heads),
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling)

    def build_head(self) -> nn.Module:
        draft = DFlashDraft(self.draft_config())
        draft.embed_tokens = FrozenWeight(self.target.weight("embed_tokens.weight", "wte.weight"), embedding=True)
        draft.lm_head = FrozenWeight(self.target.lm_head_weight(), embedding=False)
        return TrainedDraft(draft)

    def features(self, batch: Batch) -> torch.Tensor:
        """``[B, T, n_ids * Ht]``: the target layers' outputs in ``target_layer_ids`` order."""
        return torch.cat([batch.hidden[str(i + 1)] for i in self.target_layer_ids], -1)

    def anchor_loss(self, batch: Batch, anchors: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        """The weighted block loss of the blocks at ``anchors [B, n]`` (``ok [B, n]``: real anchors)."""
        head, o = self.head, self.options
        draft, size = head.draft, o.block_size
        t = batch.input_ids.shape[1]
        hidden = block_hidden(draft, context_kv(draft, self.features(batch)), batch.input_ids, anchors)[:, :, 1:]
        logp = F.log_softmax(draft.logits(hidden), -1)  # [B, n, size - 1, V] float32
        pos = anchors[:, :, None] + torch.arange(1, size, device=anchors.device)  # the drafted tokens' positions
        inside = pos < t
        pos = pos.clamp(max=t - 1)
        b, n, s = pos.shape
        flat = pos.view(b, n * s)
        learn = (batch.valid & batch.loss_mask).gather(1, flat).view(b, n, s) & inside & ok[:, :, None]
        if o.soft_labels:  # the target's distribution at a + j: its LM head after position a + j - 1
            last = batch.hidden[LAST].gather(1, (flat - 1)[..., None].expand(b, n * s, batch.hidden[LAST].shape[-1]))
            with torch.no_grad():
                want = F.softmax(head.target_logits(last).view(b, n, s, -1), -1)
            ce = -(want * logp).sum(-1)
        else:
            ce = -logp.gather(-1, batch.input_ids.gather(1, flat).view(b, n, s, 1))[..., 0]
        w = loss_weights(size, o.loss_decay, ce.device) * learn.float()
        return (ce * w).sum() / w.sum().clamp(min=1e-6)

    def loss(self, batch: Batch) -> torch.Tensor:
        """:meth:`anchor_loss` on ``anchors`` random anchors per row (a fixed seed while the head is in eval
        mode, so held-out losses compare)."""
        g = None if self.head.training else torch.Generator().manual_seed(_EVAL_SEED)
        return self.anchor_loss(batch, *pick_anchors(batch, self.options.anchors, g))

    @torch.no_grad()
    def acceptance(self, batch: Batch) -> torch.Tensor:
        """``[M, k]``: at every anchor ``a >= 1`` whose ``k`` next positions are real, whether block draft ``j``
        equals the target's greedy token after position ``a + j - 1`` (true prefix)."""
        head, k = self.head, self.acceptance_steps
        draft = head.draft
        b, t = batch.input_ids.shape
        dev = batch.input_ids.device
        if t < k + 2:
            return torch.zeros(0, k, dtype=torch.bool, device=dev)
        greedy = head.target_logits(batch.hidden[LAST]).argmax(-1)  # [B, T]: the target's token after each position
        ctx = context_kv(draft, self.features(batch))
        rows = []
        for lo in range(1, t - k, ACCEPTANCE_CHUNK):
            a = torch.arange(lo, min(lo + ACCEPTANCE_CHUNK, t - k), device=dev)  # anchors with a + k <= T - 1
            anchors = a[None, :].expand(b, a.numel())
            hidden = block_hidden(draft, ctx, batch.input_ids, anchors)[:, :, 1: 1 + k]
            drafts = draft.logits(hidden).argmax(-1)  # [B, n, k]
            want = greedy[:, a[:, None] + torch.arange(k, device=dev)]  # after a + j - 1, j = 1..k: [B, n, k]
            rows.append((drafts == want)[batch.valid[:, a + k]])
        return torch.cat(rows)

    def save(self, out_dir: Path) -> None:
        """The draft in the z-lab layout (or speculators'): config.json + model.safetensors (float32), without
        the target's embedding and LM head."""
        from safetensors.torch import save_file

        draft = self.head.draft
        state = {k: v.detach().float().cpu().contiguous() for k, v in draft.state_dict().items()}
        save_file(state, str(Path(out_dir) / "model.safetensors"), metadata={"format": "pt"})
        config = self.speculators_config() if self.options.format == "speculators" else self.zlab_config()
        (Path(out_dir) / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    def _layer_config(self) -> dict[str, Any]:
        cfg = self.head.draft.cfg
        c = self.target.config.get_text_config()
        layer = {"model_type": "qwen3", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                 "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                 "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_layers, "hidden_act": "silu",
                 "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
                 "max_position_embeddings": int(getattr(c, "max_position_embeddings", 2048)),
                 "vocab_size": cfg.vocab_size, "attention_bias": False, "tie_word_embeddings": False,
                 "layer_types": ["full_attention"] * cfg.num_layers, "sliding_window": None,
                 "use_sliding_window": False}
        if cfg.rope_scaling:
            layer["rope_scaling"] = dict(cfg.rope_scaling)
        return layer

    def zlab_config(self) -> dict[str, Any]:
        """z-lab's ``DFlashDraftModel`` config.json (a Qwen3 config plus ``dflash_config``)."""
        cfg = self.head.draft.cfg
        return {"architectures": ["DFlashDraftModel"], **self._layer_config(), "block_size": cfg.block_size,
                "num_target_layers": self.target.num_layers,
                "dflash_config": {"block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layer_ids),
                                  "mask_token_id": cfg.mask_token_id},
                "dtype": "float32"}

    def speculators_config(self) -> dict[str, Any]:
        """speculators' ``dflash`` config.json (the layer settings nested in ``transformer_layer_config``)."""
        cfg = self.head.draft.cfg
        verifier = {"name_or_path": self.target.path,
                    "architectures": list(getattr(self.target.config, "architectures", None) or [])}
        return {"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash",
                "speculators_version": "0.1.0",
                "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy",
                                                             "speculative_tokens": cfg.block_size - 1}],
                                       "verifier": verifier},
                "transformer_layer_config": self._layer_config(), "draft_vocab_size": cfg.vocab_size,
                "target_hidden_size": cfg.target_hidden_size, "block_size": cfg.block_size,
                "aux_hidden_state_layer_ids": list(cfg.aux_layer_ids), "mask_token_id": cfg.mask_token_id,
                "sample_from_anchor": False, "torch_dtype": "float32"}

    def describe(self) -> str:
        o = self.options
        params = sum(p.numel() for p in self.head.parameters() if p.requires_grad)
        decay = f"weights exp(-(j-1)/{o.loss_decay})" if o.loss_decay else "uniform weights"
        return (f"DFlash draft over target layers {list(self.target_layer_ids)}, {o.num_layers} decoder layer(s), "
                f"block size {o.block_size}, mask token {self.mask_token_id}; {o.anchors} anchors per sequence, "
                f"{'soft' if o.soft_labels else 'hard'} cross-entropy with {decay}; {o.format} layout ({params:,} "
                "trainable parameters)")

"""Loading DFlash drafts from a local directory, in the z-lab and the speculators layouts.

- z-lab (``dflash``): a Qwen3 config plus ``architectures: ["DFlashDraftModel"]``, ``block_size``,
  ``num_target_layers`` and ``dflash_config: {target_layer_ids, mask_token_id, block_size}`` (each key may sit
  at the top level instead). ``target_layer_ids`` are decoder layers whose OUTPUTS are read.
- speculators (``speculators_model_type: "dflash"``): the layer settings in ``transformer_layer_config``;
  ``aux_hidden_state_layer_ids`` in Hugging Face ``hidden_states`` indexing (z-lab ids + 1), ``mask_token_id``,
  ``block_size``, ``draft_vocab_size``, ``target_hidden_size``; with a draft vocabulary smaller than the
  target's, its own ``lm_head.weight`` and ``d2t``.

Weights: ``model.safetensors`` (or shards) or ``pytorch_model.bin`` read with ``torch.load(weights_only=True)``.
The z-lab checkpoints ship their modelling code for ``trust_remote_code``: it is never imported or run; the
architecture is :mod:`specdec_dflash.heads`. A draft that does not fit the target is refused naming the value,
the rule and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.loading import read_json_object, read_state_dict
from specdec_dflash.heads import DFlashConfig, DFlashDraft

__all__ = ["TargetInfo", "LoadedDraft", "default_target_layer_ids", "read_draft", "load_draft"]

logger = logging.getLogger("specdec.dflash")

_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
               "vocab_size")


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """What a draft is checked against: the target's hidden size, vocabulary and decoder layer count."""

    hidden_size: int
    vocab_size: int
    num_layers: int


@dataclass(slots=True)
class LoadedDraft:
    """A draft read from a directory: its layout (``"z-lab"`` or ``"speculators"``) and module."""

    layout: str
    draft: DFlashDraft


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default feature layers: ``[N // 2]`` for one draft layer, else ``round(1 + i * (N - 4) / (n - 1))``
    for ``i`` in ``0..n-1`` (N target layers, n draft layers)."""
    n, big = num_draft_layers, num_target_layers
    if n == 1:
        return (big // 2,)
    return tuple(int(round(1 + i * (big - 4) / (n - 1))) for i in range(n))


def _layout(config: dict[str, Any], path: str) -> str:
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "dflash":
            raise ValueError(f"draft directory {path!r} is a speculators {kind!r} checkpoint; method 'dflash' loads "
                             f"speculators_model_type 'dflash' only (an eagle3 head is method 'eagle3').")
        return "speculators"
    if "DFlashDraftModel" in (config.get("architectures") or []) or isinstance(config.get("dflash_config"), dict):
        return "z-lab"
    raise ValueError(f"draft directory {path!r} is not a DFlash checkpoint: its config.json has neither "
                     "architectures ['DFlashDraftModel'] / a dflash_config object (z-lab) nor "
                     "speculators_model_type 'dflash' (speculators); got architectures="
                     f"{config.get('architectures')!r}.")


def _int(config: dict[str, Any], key: str, path: str, default: Any = None, low: int = 1) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"draft config {path!r}/config.json has {key}={value!r}: it must be an int >= {low}.")
    return value


def _ids(value: Any, key: str, path: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value):
        raise ValueError(f"draft config {path!r}/config.json has {key}={value!r}: it must be a non-empty list of "
                         "ints.")
    return tuple(value)


def _check_attention(layer: dict[str, Any], path: str) -> None:
    """Sliding-window layers are refused: how a non-causal block meets a window differs between DFlash
    implementations, and no published z-lab draft uses one."""
    types = layer.get("layer_types") or []
    if "sliding_attention" in types or (layer.get("use_sliding_window") and not types):
        raise ValueError(f"draft directory {path!r} has sliding-window attention layers (layer_types={types!r}, "
                         f"sliding_window={layer.get('sliding_window')!r}), which the dflash plugin does not "
                         "implement: only full-attention drafts (layer_types all 'full_attention') are supported.")
    if layer.get("hidden_act", "silu") != "silu":
        raise ValueError(f"draft config {path!r}/config.json has hidden_act={layer['hidden_act']!r}: DFlash drafts "
                         "use a SiLU-gated MLP ('silu').")


def _config(layout: str, config: dict[str, Any], path: str, target: TargetInfo | None) -> DFlashConfig:
    if layout == "speculators":
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"draft config {path!r}/config.json has no transformer_layer_config object: a "
                             "speculators checkpoint keeps the decoder layers' settings there.")
        if config.get("sample_from_anchor"):
            raise ValueError(f"draft directory {path!r} sets sample_from_anchor=true (drafts from the bonus "
                             "position too), which the dflash plugin does not implement: only the standard DFlash "
                             "block (drafts at block indices 1..block_size-1) is supported.")
        ids = config.get("aux_hidden_state_layer_ids")
        target_ids = tuple(i - 1 for i in _ids(ids, "aux_hidden_state_layer_ids", path)) if ids is not None else None
        block = config.get("block_size", 8)
        mask = config.get("mask_token_id")
        num_target = None
    else:
        layer = config
        dflash = config.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise ValueError(f"draft config {path!r}/config.json has dflash_config={dflash!r}: it must be an object.")
        ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
        target_ids = _ids(ids, "target_layer_ids", path) if ids is not None else None
        block = dflash.get("block_size", config.get("block_size", 16))
        mask = dflash.get("mask_token_id", config.get("mask_token_id"))
        num_target = config.get("num_target_layers")
    _check_attention(layer, path)
    for key in _LAYER_KEYS:
        _int(layer, key, path, default=layer.get("num_attention_heads") if key == "num_key_value_heads" else None)
    if mask is None:
        raise ValueError(f"draft config {path!r}/config.json has no mask_token_id (dflash_config.mask_token_id or "
                         "top level): DFlash fills its block with that token, and it cannot be guessed.")
    mask = _int({"mask_token_id": mask}, "mask_token_id", path, low=0)
    block = _int({"block_size": block}, "block_size", path, low=2)
    n = layer["num_hidden_layers"]
    if target_ids is None:
        if num_target is None and target is None:
            raise ValueError(f"draft config {path!r}/config.json names no target_layer_ids and no num_target_layers: "
                             "the default ids depend on the target's layer count.")
        big = num_target if num_target is not None else target.num_layers
        target_ids = default_target_layer_ids(_int({"num_target_layers": big}, "num_target_layers", path), n)
    if num_target is not None and target is not None and num_target != target.num_layers:
        raise ValueError(f"draft {path!r} does not fit the target: its num_target_layers={num_target} but the "
                         f"target has num_hidden_layers={target.num_layers}; a DFlash draft only works with the "
                         "target it was trained on.")
    rope = layer.get("rope_scaling") or layer.get("rope_parameters")
    rope = rope if isinstance(rope, dict) else None
    theta = float(layer.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0)
    if rope is not None and rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = None
    vocab = layer["vocab_size"]
    heads = layer["num_attention_heads"]
    return DFlashConfig(
        hidden_size=layer["hidden_size"], intermediate_size=layer["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads), num_layers=n, vocab_size=vocab,
        target_layer_ids=target_ids, mask_token_id=mask, block_size=block,
        head_dim=int(layer.get("head_dim") or layer["hidden_size"] // heads),
        target_hidden_size=int(config.get("target_hidden_size") or layer["hidden_size"]),
        draft_vocab_size=int(config.get("draft_vocab_size") or vocab) if layout == "speculators" else vocab,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=rope,
        attention_bias=bool(layer.get("attention_bias", False)))


def _checkpoint_key(name: str) -> str:
    """Module key -> checkpoint key (the draft vocabulary's lm_head is ``draft_lm_head`` in the module)."""
    return "lm_head.weight" if name == "draft_lm_head.weight" else name


def read_draft(path: str, target: TargetInfo | None = None) -> LoadedDraft:
    """Build the draft of directory ``path`` and load its weights (checked by name and shape). ``target`` supplies
    the layer count for default ``target_layer_ids``; the fit checks are :func:`load_draft`'s."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"draft directory {path!r} does not exist or is not a directory: method 'dflash' "
                                "needs model= a local directory holding config.json and the draft's weights.")
    if not (p / "config.json").is_file():
        raise ValueError(f"draft directory {path!r} has no config.json.")
    config = read_json_object(p / "config.json", "draft config")
    layout = _layout(config, path)
    cfg = _config(layout, config, path, target)
    state = read_state_dict(path, "draft")
    draft = DFlashDraft(cfg)
    expected = {n: t for n, t in draft.state_dict().items() if n != "d2t"}
    for name, want in expected.items():
        key = _checkpoint_key(name)
        got = state.get(key)
        if got is None:
            raise ValueError(f"draft directory {path!r} lacks key {key!r} ({tuple(want.shape)} expected from its "
                             "config.json): the weights are incomplete or belong to another architecture.")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ValueError(f"draft directory {path!r}: key {key!r} has shape {shape}, expected {tuple(want.shape)} "
                             f"from its config.json (hidden_size={cfg.hidden_size}, {len(cfg.target_layer_ids)} "
                             f"target layers x target_hidden_size={cfg.target_hidden_size}, "
                             f"intermediate_size={cfg.intermediate_size}, head_dim={cfg.head_dim}).")
    with torch.no_grad():
        for name in expected:
            draft.get_parameter(name).copy_(state[_checkpoint_key(name)])
    if cfg.draft_vocab_size != cfg.vocab_size:
        _set_d2t(draft, state.get("d2t"), path)
    used = {_checkpoint_key(n) for n in expected} | {"d2t", "t2d"}
    unused = sorted(k for k in state if k not in used)
    if unused:  # e.g. a speculators embed_tokens.weight: the target's embeddings are used, as speculators does
        logger.warning("draft directory %r: ignoring %d tensors (e.g. %s)", path, len(unused), unused[:3])
    return LoadedDraft(layout, draft)


def _set_d2t(draft: DFlashDraft, d2t: Any, path: str) -> None:
    cfg = draft.cfg
    if not isinstance(d2t, torch.Tensor) or tuple(d2t.shape) != (cfg.draft_vocab_size,):
        raise ValueError(f"draft directory {path!r} lacks key 'd2t' [{cfg.draft_vocab_size}]: its draft_vocab_size="
                         f"{cfg.draft_vocab_size} differs from vocab_size={cfg.vocab_size}, so draft ids need d2t to "
                         "map to target ids.")
    d2t = d2t.to(torch.long)
    ids = torch.arange(cfg.draft_vocab_size) + d2t
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size or ids.unique().numel() != ids.numel():
        raise ValueError(f"draft directory {path!r}: key 'd2t' maps draft ids to target ids outside "
                         f"[0, {cfg.vocab_size}) or to the same id twice: it does not belong to this vocabulary.")
    draft.d2t.copy_(d2t)


def load_draft(path: str, target: TargetInfo, embeddings: nn.Module, lm_head: nn.Module) -> LoadedDraft:
    """:func:`read_draft`, the checks against the target, and the target's shared parts: ``embeddings`` embed
    the block, ``lm_head`` gives the logits (unless the draft has its own draft-vocabulary head). Raises
    ``ValueError`` naming the value, the rule and the fix on a misfit."""
    loaded = read_draft(path, target)
    cfg = loaded.draft.cfg
    if cfg.hidden_size != target.hidden_size:
        raise ValueError(f"draft {path!r} does not fit the target: its hidden_size={cfg.hidden_size} but the "
                         f"target's hidden_size={target.hidden_size}; DFlash embeds its block with the target's "
                         "embeddings and reads them with the target's lm_head, so both must be equal: use a "
                         "draft trained for this target.")
    if cfg.target_hidden_size != target.hidden_size:
        raise ValueError(f"draft {path!r} does not fit the target: its target_hidden_size={cfg.target_hidden_size} "
                         f"but the target's hidden_size={target.hidden_size}: use a draft trained for this target.")
    if cfg.vocab_size != target.vocab_size:
        raise ValueError(f"draft {path!r} does not fit the target: its vocab_size={cfg.vocab_size} but the target's "
                         f"vocab_size={target.vocab_size}: use a draft trained for this target.")
    ids = list(cfg.target_layer_ids)
    if len(set(ids)) != len(ids) or not all(0 <= i < target.num_layers for i in ids):
        raise ValueError(f"draft {path!r} does not fit the target: target_layer_ids={ids} but the target has "
                         f"num_hidden_layers={target.num_layers} (ids must be distinct decoder layers in "
                         f"0..{target.num_layers - 1}); use a draft trained for this target.")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise ValueError(f"draft {path!r} does not fit the target: mask_token_id={cfg.mask_token_id} is outside the "
                         f"target's vocabulary 0..{target.vocab_size - 1}; set mask_token_id in the draft's "
                         "config.json to the id it was trained with.")
    loaded.draft.embed_tokens = embeddings
    if cfg.draft_vocab_size == cfg.vocab_size:
        if tuple(lm_head.weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"draft {path!r}: DFlash uses the target's lm_head, which is "
                             f"{tuple(lm_head.weight.shape)}, not [vocab_size={cfg.vocab_size}, "
                             f"hidden_size={cfg.hidden_size}].")
        loaded.draft.lm_head = lm_head
    return loaded

"""Loading EAGLE-1 / EAGLE-3 heads from a local directory, in every published layout (docs/formats.md).

Layouts: EAGLE-1 (SafeAILab: ``fc``, ``layers.0.*``, optional ``embed_tokens``), EAGLE-3 (SafeAILab /
SpecForge: ``midlayer.*``, ``LlamaForCausalLMEagle3`` configs) and speculators (``speculators_model_type:
"eagle3"``, ``layers.0.*``). Weights come from ``model.safetensors`` (or its shards) or from
``pytorch_model.bin`` through ``torch.load(weights_only=True)``; nothing in the directory is executed.
A head that does not fit the target is refused with a message naming the key or both values.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.loading import read_json_object, read_state_dict
from specdec_eagle.heads import EagleHead, HeadConfig, build_head

__all__ = ["LoadedHead", "TargetInfo", "load_head", "read_head", "default_aux_layer_ids"]

logger = logging.getLogger("specdec.eagle")

_UNSUPPORTED_SPECULATORS_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """What a head is checked against: the target's hidden size, vocabulary and decoder layer count."""

    hidden_size: int
    vocab_size: int
    num_layers: int


@dataclass(slots=True)
class LoadedHead:
    """A head read from a directory: its layout name, module, and (EAGLE-3) the target layers it reads."""

    layout: str  # "eagle1", "eagle3", "speculators-eagle3"
    head: EagleHead
    aux_layer_ids: tuple[int, ...] | None
    has_embeddings: bool


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default feature layers: inputs of layers 2, N//2, N-3 (HF indexing), in ascending order."""
    return tuple(sorted({2, num_layers // 2, num_layers - 3}))


def _layout(config: dict[str, Any], state: dict[str, torch.Tensor], path: str) -> str:
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "eagle3":
            raise ValueError(f"head directory {path!r} is a speculators {kind!r} checkpoint; the eagle plugin "
                             "loads speculators_model_type 'eagle3' only.")
        return "speculators-eagle3"
    if any(k.startswith("midlayer.") for k in state):
        return "eagle3"
    if "fc.weight" in state and any(k.startswith("layers.0.") for k in state):
        return "eagle3" if "draft_vocab_size" in config or "d2t" in state else "eagle1"
    raise ValueError(f"head directory {path!r} is not an EAGLE checkpoint: its weights have neither 'midlayer.*' "
                     "(EAGLE-3) nor 'fc.weight' with 'layers.0.*' (EAGLE-1 / speculators).")


def _int(config: dict[str, Any], key: str, path: str, default: Any = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"head config {path!r}/config.json has {key}={value!r}: it must be an int >= 1.")
    return value


def _head_config(kind: str, layout: str, config: dict[str, Any], path: str) -> HeadConfig:
    layer = config
    if layout == "speculators-eagle3":
        for flag in _UNSUPPORTED_SPECULATORS_FLAGS:
            if config.get(flag):
                raise ValueError(f"head directory {path!r} sets {flag}={config[flag]!r}, which the eagle plugin "
                                 "does not implement yet; only norm_before_residual is supported.")
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ValueError(f"head config {path!r}/config.json has no transformer_layer_config object: a speculators "
                             "checkpoint keeps the decoder layer's settings there.")
    hidden = _int(layer, "hidden_size", path)
    heads = _int(layer, "num_attention_heads", path)
    rope = layer.get("rope_scaling") or layer.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "default":
        rope = None
    draft_vocab = config.get("draft_vocab_size") or layer.get("draft_vocab_size") or 0
    return HeadConfig(
        kind=kind, hidden_size=hidden, intermediate_size=_int(layer, "intermediate_size", path),
        num_attention_heads=heads, num_key_value_heads=_int(layer, "num_key_value_heads", path, heads),
        vocab_size=_int(layer, "vocab_size", path),
        # The SafeAILab reference derives the head size from hidden_size; vLLM honours head_dim where given.
        head_dim=int(layer.get("head_dim") or hidden // heads) if layout == "speculators-eagle3" else hidden // heads,
        target_hidden_size=int(config.get("target_hidden_size") or layer.get("target_hidden_size") or hidden),
        draft_vocab_size=int(draft_vocab), rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(layer.get("rope_theta", (rope or {}).get("rope_theta", 10000.0))),
        rope_scaling=rope if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) else None,
        bias=bool(config.get("bias", True)),
        # vLLM: an absent norm_before_residual is True for speculators checkpoints, False otherwise.
        norm_before_residual=bool(config.get("norm_before_residual", layout == "speculators-eagle3")),
    )


def _rename(key: str, layout: str) -> str:
    """Checkpoint key -> module key."""
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    return key[len(prefix):] if key.startswith(prefix) else key


def read_head(path: str, method: str) -> tuple[LoadedHead, dict[str, torch.Tensor]]:
    """Build the head of directory ``path`` for ``method`` ("eagle" or "eagle3") and load the weights it has
    (checked by name and shape). Returns it with the checkpoint's tensors for the keys the caller still
    has to fill (``embed_tokens.weight``, EAGLE-1's ``lm_head.weight``) when present."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"head directory {path!r} does not exist or is not a directory: method {method!r} "
                                "needs model= a local directory holding config.json and the head's weights.")
    if not (p / "config.json").is_file():
        raise ValueError(f"head directory {path!r} has no config.json.")
    config = read_json_object(p / "config.json", "head config")
    state = read_state_dict(path, "head")
    layout = _layout(config, state, path)
    kind = "eagle" if layout == "eagle1" else "eagle3"
    if kind != method:
        raise ValueError(f"head directory {path!r} holds an {'EAGLE-1' if kind == 'eagle' else 'EAGLE-3'} head "
                         f"({layout} layout) but method={method!r} was asked: use method={kind!r}.")
    cfg = _head_config(kind, layout, config, path)
    aux = None
    if kind == "eagle3":
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        if ids is not None:
            if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                               for i in ids):
                raise ValueError(f"head config {path!r}/config.json has eagle_aux_hidden_state_layer_ids={ids!r}: "
                                 "it must be a list of ints.")
            aux = tuple(ids)
        # How many target layers the fc reads: the ids the checkpoint names, else its fc width (a head for a
        # target of few layers reads fewer than 3: 2, N//2 and N-3 coincide), else EAGLE-3's three.
        fc = state.get("fc.weight")
        width = int(fc.shape[1]) if isinstance(fc, torch.Tensor) and fc.dim() == 2 else 0
        num = len(aux) if aux else (width // cfg.target_hidden_size if width and width % cfg.target_hidden_size == 0
                                    and width != cfg.hidden_size else cfg.num_aux_layers)
        cfg = dataclasses.replace(cfg, num_aux_layers=num)
    head = build_head(cfg)
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    renamed = {_rename(k, layout): (k, v) for k, v in state.items()}
    expected = head.state_dict()
    optional = {"embed_tokens.weight"} | ({"lm_head.weight"} if kind == "eagle" else {"d2t", "t2d"})
    loaded: dict[str, torch.Tensor] = {}
    for name, want in expected.items():
        if name not in renamed:
            if name in optional:
                continue
            ckpt = name if name.split(".")[0] in ("fc", "norm", "lm_head", "d2t", "t2d") else prefix + name
            raise ValueError(f"head directory {path!r} lacks key {ckpt!r} ({tuple(want.shape)} expected from its "
                             "config.json): the weights are incomplete or belong to another architecture.")
        ckpt, got = renamed[name]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ValueError(f"head directory {path!r}: key {ckpt!r} has shape {shape}, expected {tuple(want.shape)} "
                             f"from its config.json (hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size}, "
                             f"draft_vocab_size={cfg.draft_vocab_size}, target_hidden_size={cfg.target_hidden_size}).")
        loaded[name] = got
    unused = sorted(k for name, (k, _) in renamed.items() if name not in expected)
    if unused:
        logger.warning("head directory %r: ignoring %d unknown tensors (e.g. %s)", path, len(unused), unused[:3])
    with torch.no_grad():
        for name, tensor in loaded.items():
            if name in ("d2t", "t2d"):
                continue
            head.get_parameter(name).copy_(tensor)
    if kind == "eagle3" and "d2t" in loaded:
        _set_d2t(head, loaded["d2t"], path)
    elif kind == "eagle3" and cfg.draft_vocab_size != cfg.vocab_size:
        raise ValueError(f"head directory {path!r} lacks key 'd2t': its draft_vocab_size={cfg.draft_vocab_size} "
                         f"differs from vocab_size={cfg.vocab_size}, so draft ids need d2t to map to target ids.")
    return LoadedHead(layout, head, aux, "embed_tokens.weight" in loaded), loaded


def _set_d2t(head: EagleHead, d2t: torch.Tensor, path: str) -> None:
    cfg = head.cfg
    d2t = d2t.to(torch.long)
    target = torch.arange(cfg.draft_vocab_size) + d2t
    if int(target.min()) < 0 or int(target.max()) >= cfg.vocab_size or target.unique().numel() != target.numel():
        raise ValueError(f"head directory {path!r}: key 'd2t' maps draft ids to target ids outside "
                         f"[0, {cfg.vocab_size}) or to the same id twice: it does not belong to this vocabulary.")
    head.set_vocab_map(d2t)


def load_head(path: str, method: str, target: TargetInfo, embeddings: nn.Module | None = None,
              lm_head: nn.Module | None = None) -> LoadedHead:
    """:func:`read_head`, then the checks against the target and the target's shared parts:
    ``embeddings`` (used when the checkpoint has no ``embed_tokens.weight``) and, for EAGLE-1 without its own
    ``lm_head.weight``, the target's ``lm_head``. Raises ``ValueError`` naming both values on a misfit."""
    loaded, tensors = read_head(path, method)
    head, cfg = loaded.head, loaded.head.cfg
    if cfg.target_hidden_size != target.hidden_size:
        key = "hidden_size" if cfg.kind == "eagle" else "target_hidden_size"
        raise ValueError(f"head {path!r} does not fit the target: its {key}={cfg.target_hidden_size} but the target's "
                         f"hidden_size={target.hidden_size}.")
    if cfg.vocab_size != target.vocab_size:
        raise ValueError(f"head {path!r} does not fit the target: its vocab_size={cfg.vocab_size} but the target's "
                         f"vocab_size={target.vocab_size}.")
    if cfg.kind == "eagle3":
        ids = loaded.aux_layer_ids or default_aux_layer_ids(target.num_layers)
        bad = [i for i in ids if not 0 <= i < target.num_layers]
        if bad or len(set(ids)) != len(ids) or len(ids) != cfg.num_aux_layers:
            raise ValueError(f"head {path!r} does not fit the target: eagle_aux_hidden_state_layer_ids={list(ids)} "
                             f"but the target has num_hidden_layers={target.num_layers} (ids must be "
                             f"{cfg.num_aux_layers} distinct layers in 0..{target.num_layers - 1}).")
        loaded.aux_layer_ids = tuple(sorted(ids))
    if not loaded.has_embeddings:
        if embeddings is None or tuple(embeddings.weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            got = tuple(embeddings.weight.shape) if embeddings is not None else None
            raise ValueError(f"head {path!r} has no embed_tokens.weight and the target's embeddings are {got}, not "
                             f"[vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}]: they cannot be shared.")
        head.embed_tokens = embeddings
    if cfg.kind == "eagle":
        if "lm_head.weight" not in tensors:
            if lm_head is None or tuple(lm_head.weight.shape) != (cfg.vocab_size, cfg.hidden_size):
                got = tuple(lm_head.weight.shape) if lm_head is not None else None
                raise ValueError(f"head {path!r}: EAGLE-1 uses the target's lm_head, which is {got}, not "
                                 f"[vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}].")
            head.lm_head = lm_head
    return loaded

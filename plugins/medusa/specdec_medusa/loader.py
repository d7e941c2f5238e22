"""Loading Medusa heads from a local directory, in both published layouts (docs/formats.md, "Medusa").

- **FasterDecoding** (``medusa-llm``): config ``medusa_num_heads``, ``medusa_num_layers``,
  ``base_model_name_or_path``; weights ``medusa_lm_head.safetensors`` (or ``medusa_lm_head.pt``), keys
  ``{i}.{j}.linear.weight [H, H]`` / ``{i}.{j}.linear.bias [H]`` for ``j < layers`` and ``{i}.{layers}.weight
  [V, H]``; prefixed ``medusa_head.`` inside a full Medusa-2 model (``model.safetensors``: only those keys are
  read). The reference applies one shared block ``layers`` times, so its saved blocks repeat one tensor; each
  saved block is loaded as given, which is the same computation.
- **vLLM** (older format): config ``num_heads``, ``num_hidden_layers``, ``vocab_size``, ``truncated_vocab_size``,
  ``medusa_fc_bias``, ``original_lm_head``; keys ``blocks.{i}.layers.{j}.weight`` (+ ``.bias`` with
  ``medusa_fc_bias``), ``lm_heads.{i}.weight`` (only ``lm_heads.0`` with ``original_lm_head``), optional
  ``token_map [Vd]`` (draft id -> target id, used when the vocabulary is truncated); ``medusa_heads.`` stripped.

Pickle files are read only through ``torch.load(weights_only=True)``; nothing in the directory is executed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.loading import check_weights, read_json_object
from specdec_medusa.heads import MedusaConfig, MedusaHeads

__all__ = ["LoadedMedusa", "read_medusa", "load_medusa", "LAYOUTS"]

logger = logging.getLogger("specdec.medusa")

LAYOUTS = ("fasterdecoding", "vllm")
_PREFIXES = ("medusa_head.", "medusa_heads.")
_FD_KEY = re.compile(r"^\d+\.\d+\.")
_SAFETENSORS = ("medusa_lm_head.safetensors", "model.safetensors")
_PICKLES = ("medusa_lm_head.pt", "pytorch_model.bin")


@dataclass(slots=True)
class LoadedMedusa:
    """Heads read from a directory: the layout (``"fasterdecoding"`` or ``"vllm"``), the module, and the
    checkpoint key its sizes were read from (named in misfit messages)."""

    layout: str
    heads: MedusaHeads
    size_key: str


def _safetensors_files(p: Path) -> list[Path]:
    for name in _SAFETENSORS:
        if (p / name).is_file():
            return [p / name]
    index = p / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"weights index {str(index)!r} has no weight_map object.")
        return [p / f for f in sorted(set(map(str, weight_map.values())))]
    return []


def _head_keys(keys: list[str]) -> dict[str, str]:
    """Checkpoint key -> head key: inside a full model only the prefixed keys, prefix stripped."""
    prefixed = {k: k[len(pre):] for k in keys for pre in _PREFIXES if k.startswith(pre)}
    return prefixed or {k: k for k in keys}


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """The head tensors of directory ``path``, keyed without the ``medusa_head.`` / ``medusa_heads.`` prefix."""
    p = Path(path)
    files = _safetensors_files(p)
    if files:
        from safetensors import safe_open

        if files[0].name != "medusa_lm_head.safetensors":
            check_weights(path)
        state: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                state.update({new: h.get_tensor(old) for old, new in _head_keys(list(h.keys())).items()})
        return state
    for name in _PICKLES:
        if (p / name).is_file():
            try:
                raw = torch.load(p / name, map_location="cpu", weights_only=True)
            except Exception as exc:  # weights_only refuses pickles that would run code: say so
                raise ValueError(f"head weights {str(p / name)!r} could not be read with torch.load(weights_only="
                                 f"True) ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): "
                                 "specdec never unpickles arbitrary objects; re-save the heads as "
                                 "medusa_lm_head.safetensors.") from None
            if not isinstance(raw, dict) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
                raise ValueError(f"head weights {str(p / name)!r} hold a {type(raw).__name__}, not a state dict of "
                                 "tensors.")
            return {new: raw[old] for old, new in _head_keys(list(raw)).items()}
    raise ValueError(f"head directory {path!r} has no weights: expected medusa_lm_head.safetensors or "
                     "medusa_lm_head.pt (FasterDecoding), or model.safetensors / pytorch_model.bin (vLLM layout or a "
                     "full Medusa-2 model).")


def _int(config: dict[str, Any], keys: tuple[str, ...], path: str, low: int, default: Any = None) -> int:
    key = next((k for k in keys if k in config), keys[0])
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"head config {path!r}/config.json has {key}={value!r}: it must be an int >= {low}.")
    return value


def _tensor(state: dict[str, torch.Tensor], key: str, shape: tuple[int, ...], path: str, why: str) -> torch.Tensor:
    if key not in state:
        raise ValueError(f"head directory {path!r} lacks key {key!r} ({list(shape)} expected from {why}): the "
                         "weights are incomplete or belong to another architecture.")
    t = state[key]
    if tuple(t.shape) != shape:
        raise ValueError(f"head directory {path!r}: key {key!r} has shape {list(t.shape)}, expected {list(shape)} "
                         f"from {why}.")
    return t


def _fasterdecoding(config: dict[str, Any], state: dict[str, torch.Tensor], path: str) -> LoadedMedusa:
    n = _int(config, ("medusa_num_heads",), path, 1)
    layers = _int(config, ("medusa_num_layers",), path, 0, 1)
    size_key = f"0.{layers}.weight"
    lm = state.get(size_key)
    if lm is None or lm.dim() != 2:
        raise ValueError(f"head directory {path!r} lacks key {size_key!r} (head 0's vocabulary projection [V, H] "
                         f"after medusa_num_layers={layers} blocks): the weights do not match config.json.")
    v, h = (int(s) for s in lm.shape)
    why = f"medusa_num_heads={n}, medusa_num_layers={layers}, hidden size {h}, vocabulary {v}"
    heads = MedusaHeads(MedusaConfig(n, layers, h, v))
    used = set()
    with torch.no_grad():
        for i in range(n):
            for j in range(layers):
                for part, shape, dest in (("weight", (h, h), heads.weight), ("bias", (h,), heads.bias)):
                    key = f"{i}.{j}.linear.{part}"
                    dest[i, j].copy_(_tensor(state, key, shape, path, why))
                    used.add(key)
            key = f"{i}.{layers}.weight"
            heads.lm_head[i].copy_(_tensor(state, key, (v, h), path, why))
            used.add(key)
    _warn_unused(state, used, path)
    return LoadedMedusa("fasterdecoding", heads, size_key)


def _vllm(config: dict[str, Any], state: dict[str, torch.Tensor], path: str) -> LoadedMedusa:
    # vLLM's MedusaConfig renames any key with "num" and "heads" / "layers": medusa_num_heads works too.
    n = _int(config, ("num_heads", "medusa_num_heads"), path, 1)
    layers = _int(config, ("num_hidden_layers", "medusa_num_layers"), path, 0, 1)
    bias, shared = bool(config.get("medusa_fc_bias", False)), bool(config.get("original_lm_head", False))
    size_key = "lm_heads.0.weight"
    lm = state.get(size_key)
    if lm is None or lm.dim() != 2:
        raise ValueError(f"head directory {path!r} lacks key {size_key!r} (head 0's vocabulary projection "
                         "[truncated_vocab_size, H]): the weights do not match config.json.")
    vd, h = (int(s) for s in lm.shape)
    vocab = _int(config, ("vocab_size",), path, 1, vd)
    truncated = _int(config, ("truncated_vocab_size",), path, 1, vocab)
    why = (f"num_heads={n}, num_hidden_layers={layers}, medusa_fc_bias={bias}, original_lm_head={shared}, "
           f"truncated_vocab_size={truncated}, hidden size {h}")
    if vd != truncated:
        raise ValueError(f"head directory {path!r}: key {size_key!r} has {vd} rows but config.json has "
                         f"truncated_vocab_size={truncated}: they must be equal.")
    token_map = state.get("token_map") if truncated < vocab else None
    if truncated < vocab and token_map is None:
        raise ValueError(f"head directory {path!r} has truncated_vocab_size={truncated} < vocab_size={vocab} but no "
                         "'token_map' tensor: a truncated vocabulary needs the map from draft ids to target ids.")
    heads = MedusaHeads(MedusaConfig(n, layers, h, vocab, truncated if token_map is not None else 0, bias,
                                     shared_lm_head=shared))
    used = {"token_map"}
    with torch.no_grad():
        for i in range(n):
            for j in range(layers):
                key = f"blocks.{i}.layers.{j}.weight"
                heads.weight[i, j].copy_(_tensor(state, key, (h, h), path, why))
                used.add(key)
                if bias:
                    key = f"blocks.{i}.layers.{j}.bias"
                    heads.bias[i, j].copy_(_tensor(state, key, (h,), path, why))
                    used.add(key)
        for i in range(1 if shared else n):
            key = f"lm_heads.{i}.weight"
            heads.lm_head[i].copy_(_tensor(state, key, (vd, h), path, why))
            used.add(key)
        if token_map is not None:
            _tensor(state, "token_map", (vd,), path, why)
            heads.token_map.copy_(token_map.to(torch.long))
    _warn_unused(state, used, path)
    return LoadedMedusa("vllm", heads, size_key)


def _warn_unused(state: dict[str, torch.Tensor], used: set[str], path: str) -> None:
    unused = sorted(set(state) - used)
    if unused:
        logger.warning("head directory %r: ignoring %d unknown tensors (e.g. %s)", path, len(unused), unused[:3])


def read_medusa(path: str) -> LoadedMedusa:
    """The heads of directory ``path`` in either layout (told apart by their keys), float32 on the CPU."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"head directory {path!r} does not exist or is not a directory: method 'medusa' "
                                "needs model= a local directory holding config.json and the Medusa heads' weights.")
    if not (p / "config.json").is_file():
        raise ValueError(f"head directory {path!r} has no config.json.")
    config = read_json_object(p / "config.json", "head config")
    state = read_weights(path)
    if any(_FD_KEY.match(k) for k in state):
        return _fasterdecoding(config, state, path)
    if any(k.startswith(("blocks.", "lm_heads.")) for k in state):
        return _vllm(config, state, path)
    raise ValueError(f"head directory {path!r} is not a Medusa checkpoint: its weights have neither "
                     "'{i}.{j}.linear.weight' keys (FasterDecoding) nor 'blocks.*' / 'lm_heads.*' (vLLM).")


def load_medusa(path: str, hidden_size: int, vocab_size: int) -> LoadedMedusa:
    """:func:`read_medusa`, then the checks against the target (its ``hidden_size`` and ``vocab_size``): raises
    ``ValueError`` naming the head's value, the target's, the rule and the fix on a misfit."""
    loaded = read_medusa(path)
    cfg, fix = loaded.heads.cfg, "use heads trained for this target (specdec train --method medusa --target ...)"
    if cfg.hidden_size != hidden_size:
        raise ValueError(f"head {path!r} does not fit the target: its hidden size is {cfg.hidden_size} (key "
                         f"{loaded.size_key!r}) but the target's hidden_size={hidden_size}; Medusa heads read the "
                         f"target's last hidden state, so the two must be equal: {fix}.")
    if cfg.vocab_size != vocab_size:
        where = "vocab_size in config.json" if loaded.layout == "vllm" else f"rows of key {loaded.size_key!r}"
        raise ValueError(f"head {path!r} does not fit the target: its vocabulary has {cfg.vocab_size} tokens ({where}) "
                         f"but the target's vocab_size={vocab_size}; drafts are target token ids, so the two must be "
                         f"equal: {fix}.")
    tm = loaded.heads.token_map
    repeats = tm is not None and tm.unique().numel() != tm.numel()
    if tm is not None and (int(tm.min()) < 0 or int(tm.max()) >= vocab_size or repeats):
        raise ValueError(f"head {path!r} does not fit the target: its token_map holds ids {int(tm.min())}.."
                         f"{int(tm.max())}{' with repeats' if repeats else ''} but the target's vocab_size="
                         f"{vocab_size}; every draft id must map to a distinct target id in 0..{vocab_size - 1}: "
                         f"{fix}.")
    return loaded

"""Test helpers: random Medusa heads written in each published layout (FasterDecoding: medusa_lm_head.safetensors,
medusa_lm_head.pt, a full Medusa-2 model's model.safetensors with ``medusa_head.`` keys; vLLM: ``blocks.*`` /
``lm_heads.*`` with or without bias, shared lm_head, truncated vocabulary and ``token_map``), and an independent
plain-torch reference that reads the checkpoint's own key names.

The reference shares no code with specdec_medusa: one head at a time, one ``F.linear`` per block, the vocabulary
projection, then (truncated vocabulary) the logits scattered into the target vocabulary with -inf elsewhere, as
vLLM's ``compute_logits`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

H = 64  # the tiny targets' hidden size


def _w(*shape, scale=0.1):
    return torch.randn(*shape) * scale


def random_fasterdecoding(vocab: int, heads: int = 4, layers: int = 1, hidden: int = H, seed: int = 0,
                          shared: bool = True) -> tuple[dict, dict]:
    """(config.json, state dict) in FasterDecoding's keys. ``shared``: the reference's ``[ResBlock] * layers``
    quirk, every block of a head the same tensors; else distinct ones (what a loader must also read as given)."""
    torch.manual_seed(seed)
    sd = {}
    for i in range(heads):
        w, b = _w(hidden, hidden), _w(hidden)
        for j in range(layers):
            if not shared:
                w, b = _w(hidden, hidden), _w(hidden)
            sd[f"{i}.{j}.linear.weight"], sd[f"{i}.{j}.linear.bias"] = w.clone(), b.clone()
        sd[f"{i}.{layers}.weight"] = _w(vocab, hidden, scale=0.3)
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny-target"}
    return cfg, sd


def random_vllm(vocab: int, heads: int = 4, layers: int = 1, hidden: int = H, seed: int = 0, bias: bool = False,
                original_lm_head: bool = False, truncated: int = 0, prefix: str = "") -> tuple[dict, dict]:
    """(config.json, state dict) in vLLM's older Medusa keys; ``truncated`` > 0 adds a random ``token_map``."""
    torch.manual_seed(seed)
    vd = truncated or vocab
    sd = {}
    for i in range(heads):
        for j in range(layers):
            sd[f"{prefix}blocks.{i}.layers.{j}.weight"] = _w(hidden, hidden)
            if bias:
                sd[f"{prefix}blocks.{i}.layers.{j}.bias"] = _w(hidden)
        if i == 0 or not original_lm_head:
            sd[f"{prefix}lm_heads.{i}.weight"] = _w(vd, hidden, scale=0.3)
    if truncated:
        sd[f"{prefix}token_map"] = torch.randperm(vocab)[:truncated].sort().values
    cfg = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": hidden, "vocab_size": vocab,
           "num_heads": heads, "num_hidden_layers": layers, "truncated_vocab_size": vd, "medusa_fc_bias": bias,
           "original_lm_head": original_lm_head}
    return cfg, sd


def write(path: Path, cfg: dict, sd: dict, how: str = "safetensors") -> str:
    """Write a head directory. ``how``: "safetensors" (medusa_lm_head.safetensors), "pt" (medusa_lm_head.pt),
    "medusa2" (a full model's model.safetensors: ``medusa_head.`` keys beside base-model weights), "vllm"
    (model.safetensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v.contiguous() for k, v in sd.items()}
    if how == "safetensors":
        save_file(tensors, str(path / "medusa_lm_head.safetensors"))
    elif how == "pt":
        torch.save(tensors, path / "medusa_lm_head.pt")
    elif how == "medusa2":
        base = {"model.embed_tokens.weight": torch.zeros(8, 4), "lm_head.weight": torch.zeros(8, 4)}
        save_file({**base, **{f"medusa_head.{k}": v for k, v in tensors.items()}}, str(path / "model.safetensors"))
    elif how == "vllm":
        save_file(tensors, str(path / "model.safetensors"))
    else:
        raise ValueError(how)
    return str(path)


def reference_logits(cfg: dict, sd: dict, x: torch.Tensor) -> torch.Tensor:
    """``[heads, M, V]`` logits over the target vocabulary of every head for hidden states ``x [M, H]``."""
    sd = {k.removeprefix("medusa_heads."): v for k, v in sd.items()}
    out = []
    if "medusa_num_heads" in cfg:
        n, layers = cfg["medusa_num_heads"], cfg["medusa_num_layers"]
        for i in range(n):
            h = x
            for j in range(layers):
                h = h + F.silu(F.linear(h, sd[f"{i}.{j}.linear.weight"], sd[f"{i}.{j}.linear.bias"]))
            out.append(F.linear(h, sd[f"{i}.{layers}.weight"]))
        return torch.stack(out)
    for i in range(cfg["num_heads"]):
        h = x
        for j in range(cfg["num_hidden_layers"]):
            h = h + F.silu(F.linear(h, sd[f"blocks.{i}.layers.{j}.weight"], sd.get(f"blocks.{i}.layers.{j}.bias")))
        logits = F.linear(h, sd[f"lm_heads.{0 if cfg['original_lm_head'] else i}.weight"])
        if "token_map" in sd:
            full = torch.full((x.shape[0], cfg["vocab_size"]), float("-inf"))
            full[:, sd["token_map"]] = logits
            logits = full
        out.append(logits)
    return torch.stack(out)

"""Test helpers: random EAGLE heads written in each published layout (docs/formats.md), and an independent
plain-torch reference of both architectures that reads the checkpoint's own key names.

The reference deliberately shares no code with specdec_eagle.heads: explicit softmax attention, its own
rotary and RMSNorm, GQA by indexing, features concatenated and projected as the papers describe.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

H, INTER, HEADS, KV_HEADS = 64, 96, 4, 2  # the tiny targets' hidden size is 64


def _w(*shape, scale=0.25):
    return torch.randn(*shape) * scale


def random_eagle1(vocab: int, bias: bool = True, embed: bool = False, seed: int = 0) -> tuple[dict, dict]:
    """(config.json dict, state dict in SafeAILab EAGLE-1 key names)."""
    torch.manual_seed(seed)
    d = H // HEADS
    sd = {"fc.weight": _w(H, 2 * H, scale=0.15),
          "layers.0.self_attn.q_proj.weight": _w(HEADS * d, H), "layers.0.self_attn.k_proj.weight": _w(KV_HEADS * d, H),
          "layers.0.self_attn.v_proj.weight": _w(KV_HEADS * d, H), "layers.0.self_attn.o_proj.weight": _w(H, HEADS * d),
          "layers.0.mlp.gate_proj.weight": _w(INTER, H), "layers.0.mlp.up_proj.weight": _w(INTER, H),
          "layers.0.mlp.down_proj.weight": _w(H, INTER),
          "layers.0.post_attention_layernorm.weight": 1 + _w(H, scale=0.1)}
    if bias:
        sd["fc.bias"] = _w(H, scale=0.1)
    if embed:
        sd["embed_tokens.weight"] = _w(vocab, H, scale=1.0)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": INTER,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab, "bias": bias}
    return cfg, sd


def random_eagle3(vocab: int, draft_vocab: int, layout: str = "eagle3", embed: bool = False, seed: int = 0,
                  **extra) -> tuple[dict, dict]:
    """(config.json dict, state dict) of an EAGLE-3 head in ``layout`` "eagle3" (SafeAILab/SpecForge) or
    "speculators"; ``extra`` goes into the config (eagle_aux_hidden_state_layer_ids, norm_before_residual)."""
    torch.manual_seed(seed)
    d = H // HEADS
    p = "midlayer." if layout == "eagle3" else "layers.0."
    sd = {"fc.weight": _w(H, 3 * H, scale=0.1),
          p + "hidden_norm.weight": 1 + _w(H, scale=0.1), p + "input_layernorm.weight": 1 + _w(H, scale=0.1),
          p + "post_attention_layernorm.weight": 1 + _w(H, scale=0.1),
          p + "self_attn.q_proj.weight": _w(HEADS * d, 2 * H, scale=0.15),
          p + "self_attn.k_proj.weight": _w(KV_HEADS * d, 2 * H, scale=0.15),
          p + "self_attn.v_proj.weight": _w(KV_HEADS * d, 2 * H, scale=0.15),
          p + "self_attn.o_proj.weight": _w(H, HEADS * d),
          p + "mlp.gate_proj.weight": _w(INTER, H), p + "mlp.up_proj.weight": _w(INTER, H),
          p + "mlp.down_proj.weight": _w(H, INTER), "norm.weight": 1 + _w(H, scale=0.1),
          "lm_head.weight": _w(draft_vocab, H, scale=0.1)}
    if draft_vocab != vocab:
        targets = torch.sort(torch.randperm(vocab)[:draft_vocab]).values
        sd["d2t"] = targets - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[targets] = True
        sd["t2d"] = t2d
    if embed:
        sd["embed_tokens.weight"] = _w(vocab, H, scale=1.0)
    layer = {"model_type": "llama", "hidden_size": H, "intermediate_size": INTER, "num_attention_heads": HEADS,
             "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
             "vocab_size": vocab}
    if layout == "eagle3":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": draft_vocab,
               "target_hidden_size": H, **extra}
    else:
        cfg = {"speculators_model_type": "eagle3", "speculators_version": "0.9.0",
               "architectures": ["Eagle3Speculator"],
               "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
                   {"proposal_type": "greedy", "speculative_tokens": 3}], "default_proposal_method": "greedy",
                   "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
               "transformer_layer_config": layer, "draft_vocab_size": draft_vocab, "target_hidden_size": H, **extra}
    return cfg, sd


def write(path: Path, cfg: dict, sd: dict, fmt: str = "safetensors") -> str:
    """Save like the publishers do: config.json plus model.safetensors or a pickled pytorch_model.bin."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    else:
        torch.save(sd, path / "pytorch_model.bin")
    return str(path)


# -- the independent reference ------------------------------------------------------------------

def _rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x, theta=10000.0):
    """x [T, heads, d]; rotary on halves at positions 0..T-1."""
    t, _, d = x.shape
    freqs = [[p / theta ** (2 * i / d) for i in range(d // 2)] for p in range(t)]
    ang = torch.tensor(freqs, dtype=x.dtype)[:, None, :]  # [T, 1, d/2]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def _attention(x, sd, p):
    t = x.shape[0]
    d = H // HEADS
    q = _rope((x @ sd[p + "self_attn.q_proj.weight"].T).view(t, HEADS, d))
    k = _rope((x @ sd[p + "self_attn.k_proj.weight"].T).view(t, KV_HEADS, d))
    v = (x @ sd[p + "self_attn.v_proj.weight"].T).view(t, KV_HEADS, d)
    out = torch.empty(t, HEADS, d)
    for head in range(HEADS):
        g = head // (HEADS // KV_HEADS)
        scores = q[:, head] @ k[:, g].T / math.sqrt(d)
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        out[:, head] = torch.softmax(scores, -1) @ v[:, g]
    return out.reshape(t, HEADS * d) @ sd[p + "self_attn.o_proj.weight"].T


def _mlp(x, sd, p):
    gate = x @ sd[p + "mlp.gate_proj.weight"].T
    return (gate * torch.sigmoid(gate) * (x @ sd[p + "mlp.up_proj.weight"].T)) @ sd[p + "mlp.down_proj.weight"].T


def reference_eagle1_logits(sd, embed, lm_head, ids, feats):
    """EAGLE-1 over one sequence: ids [T] (token t+1 at position t), feats [T, H] -> logits [T, V]."""
    x = torch.cat((embed[ids], feats), -1) @ sd["fc.weight"].T
    if "fc.bias" in sd:
        x = x + sd["fc.bias"]
    h = x + _attention(x, sd, "layers.0.")
    h = h + _mlp(_rms(h, sd["layers.0.post_attention_layernorm.weight"]), sd, "layers.0.")
    return h @ lm_head.T


def reference_eagle3_logits(sd, embed, ids, aux, vocab, prefix="midlayer.", norm_before_residual=False):
    """EAGLE-3 over one sequence: aux = list of 3 [T, Ht] target layers (ascending) -> logits [T, V] over the
    target vocabulary (-inf outside the draft vocabulary)."""
    f = torch.cat(aux, -1) @ sd["fc.weight"].T
    normed = _rms(f, sd[prefix + "hidden_norm.weight"])
    x = torch.cat((_rms(embed[ids], sd[prefix + "input_layernorm.weight"]), normed), -1)
    h = (normed if norm_before_residual else f) + _attention(x, sd, prefix)
    h = h + _mlp(_rms(h, sd[prefix + "post_attention_layernorm.weight"]), sd, prefix)
    draft = _rms(h, sd["norm.weight"]) @ sd["lm_head.weight"].T  # [T, Vd]
    out = torch.full((ids.shape[0], vocab), float("-inf"))
    vd = draft.shape[-1]
    target_ids = torch.arange(vd) + sd["d2t"] if "d2t" in sd else torch.arange(vd)
    out[:, target_ids] = draft
    return out

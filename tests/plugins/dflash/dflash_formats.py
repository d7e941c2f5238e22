"""Test helpers: random DFlash drafts written in the z-lab and speculators layouts, and an independent
plain-torch reference of the block forward that reads the checkpoint's own key names.

The reference shares no code with specdec_dflash: explicit softmax attention per head, its own rotary and
RMSNorm, GQA by indexing, one sequence at a time, the context K/V recomputed from scratch every call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

H, INTER, HEADS, KV_HEADS, HEAD_DIM = 64, 96, 4, 2, 16  # the tiny targets' hidden size is 64
THETA = 1_000_000.0  # Qwen3's; differs from the loader's fallback, so a config that is not read shows


def _w(*shape, scale=0.25):
    return torch.randn(*shape) * scale


def random_dflash(vocab: int, layout: str = "z-lab", num_layers: int = 2, block_size: int = 8,
                  target_layer_ids: list[int] | None = (0, 2), mask_token_id: int | None = 5,
                  draft_vocab: int | None = None, num_target_layers: int | None = 3, seed: int = 0,
                  bias: bool = False, **extra) -> tuple[dict, dict]:
    """(config.json dict, state dict) of a random DFlash draft in ``layout`` "z-lab" or "speculators".
    ``target_layer_ids`` are z-lab ids (speculators writes them + 1); None leaves them out of the config (the
    default ids apply); ``mask_token_id`` None leaves it out; ``draft_vocab`` (speculators) adds a draft
    vocabulary's ``lm_head``/``d2t``/``t2d``; ``extra`` goes into the config's top level."""
    torch.manual_seed(seed)
    n_ids = len(target_layer_ids) if target_layer_ids is not None else (1 if num_layers == 1 else num_layers)
    sd = {"fc.weight": _w(H, n_ids * H, scale=0.1), "hidden_norm.weight": 1 + _w(H, scale=0.1),
          "norm.weight": 1 + _w(H, scale=0.1)}
    for i in range(num_layers):
        p = f"layers.{i}."
        sd |= {p + "input_layernorm.weight": 1 + _w(H, scale=0.1),
               p + "post_attention_layernorm.weight": 1 + _w(H, scale=0.1),
               p + "self_attn.q_proj.weight": _w(HEADS * HEAD_DIM, H),
               p + "self_attn.k_proj.weight": _w(KV_HEADS * HEAD_DIM, H),
               p + "self_attn.v_proj.weight": _w(KV_HEADS * HEAD_DIM, H),
               p + "self_attn.o_proj.weight": _w(H, HEADS * HEAD_DIM),
               p + "self_attn.q_norm.weight": 1 + _w(HEAD_DIM, scale=0.1),
               p + "self_attn.k_norm.weight": 1 + _w(HEAD_DIM, scale=0.1),
               p + "mlp.gate_proj.weight": _w(INTER, H), p + "mlp.up_proj.weight": _w(INTER, H),
               p + "mlp.down_proj.weight": _w(H, INTER)}
        if bias:
            sizes = (("q", HEADS * HEAD_DIM), ("k", KV_HEADS * HEAD_DIM), ("v", KV_HEADS * HEAD_DIM), ("o", H))
            for name, size in sizes:
                sd[p + f"self_attn.{name}_proj.bias"] = _w(size, scale=0.1)
    layer = {"model_type": "qwen3", "hidden_size": H, "intermediate_size": INTER, "num_attention_heads": HEADS,
             "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": num_layers,
             "rms_norm_eps": 1e-6, "rope_theta": THETA, "vocab_size": vocab, "max_position_embeddings": 256,
             "hidden_act": "silu", "attention_bias": bias, "layer_types": ["full_attention"] * num_layers,
             "sliding_window": None, "use_sliding_window": False}
    if layout == "z-lab":
        dflash = {"block_size": block_size}
        if target_layer_ids is not None:
            dflash["target_layer_ids"] = list(target_layer_ids)
        if mask_token_id is not None:
            dflash["mask_token_id"] = mask_token_id
        cfg = {"architectures": ["DFlashDraftModel"], **layer, "block_size": block_size, "dflash_config": dflash,
               "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "dtype": "bfloat16"}
        if num_target_layers is not None:
            cfg["num_target_layers"] = num_target_layers
        return cfg | extra, sd
    cfg = {"speculators_model_type": "dflash", "speculators_version": "0.9.0", "architectures": ["DFlashSpeculator"],
           "speculators_config": {"algorithm": "dflash", "proposal_methods": [
               {"proposal_type": "greedy", "speculative_tokens": block_size - 1}],
               "default_proposal_method": "greedy",
               "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
           "transformer_layer_config": layer, "draft_vocab_size": draft_vocab or vocab, "block_size": block_size,
           "target_hidden_size": H, "sample_from_anchor": False, "sliding_window_non_causal": False}
    if target_layer_ids is not None:
        cfg["aux_hidden_state_layer_ids"] = [i + 1 for i in target_layer_ids]
    if mask_token_id is not None:
        cfg["mask_token_id"] = mask_token_id
    if draft_vocab is not None and draft_vocab != vocab:
        targets = torch.sort(torch.randperm(vocab)[:draft_vocab]).values
        sd["lm_head.weight"] = _w(draft_vocab, H, scale=0.5)
        sd["d2t"] = targets - torch.arange(draft_vocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[targets] = True
        sd["t2d"] = t2d
    return cfg | extra, sd


def write(path: Path, cfg: dict, sd: dict) -> str:
    """Save like the publishers do: config.json plus model.safetensors."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    return str(path)


# -- the independent reference ------------------------------------------------------------------

def _rms(x, w, eps=1e-6):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta=THETA):
    """x [T, heads, d] at integer ``positions`` (a list); rotary on halves."""
    d = x.shape[-1]
    ang = torch.tensor([[p / theta ** (2 * i / d) for i in range(d // 2)] for p in positions],
                       dtype=torch.float64).to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()), -1)


def _proj(x, sd, name):
    y = x @ sd[name + ".weight"].T
    return y + sd[name + ".bias"] if name + ".bias" in sd else y


def _layer(x, ctx, sd, i, ctx_pos, blk_pos):
    p = f"layers.{i}.self_attn."
    h = _rms(x, sd[f"layers.{i}.input_layernorm.weight"])
    b, c = x.shape[0], ctx.shape[0]
    q = _rope(_rms(_proj(h, sd, p + "q_proj").view(b, HEADS, HEAD_DIM), sd[p + "q_norm.weight"]), blk_pos)
    kc = _rope(_rms(_proj(ctx, sd, p + "k_proj").view(c, KV_HEADS, HEAD_DIM), sd[p + "k_norm.weight"]), ctx_pos)
    kb = _rope(_rms(_proj(h, sd, p + "k_proj").view(b, KV_HEADS, HEAD_DIM), sd[p + "k_norm.weight"]), blk_pos)
    keys = torch.cat((kc, kb), 0)
    values = torch.cat((_proj(ctx, sd, p + "v_proj").view(c, KV_HEADS, HEAD_DIM),
                        _proj(h, sd, p + "v_proj").view(b, KV_HEADS, HEAD_DIM)), 0)
    out = torch.empty(b, HEADS, HEAD_DIM, dtype=x.dtype)
    for head in range(HEADS):
        g = head // (HEADS // KV_HEADS)
        scores = q[:, head] @ keys[:, g].T / math.sqrt(HEAD_DIM)  # every block query sees every key
        out[:, head] = torch.softmax(scores, -1) @ values[:, g]
    x = x + _proj(out.reshape(b, HEADS * HEAD_DIM), sd, p + "o_proj")
    m = f"layers.{i}.mlp."
    h = _rms(x, sd[f"layers.{i}.post_attention_layernorm.weight"])
    gate = h @ sd[m + "gate_proj.weight"].T
    return x + (gate * torch.sigmoid(gate) * (h @ sd[m + "up_proj.weight"].T)) @ sd[m + "down_proj.weight"].T


def reference_block_logits(sd, embed, lm_head, features, block_ids, vocab):
    """DFlash over one sequence: ``features`` = list of target layer outputs, each ``[C, Ht]`` at positions
    ``0..C-1`` (concatenated in list order); ``block_ids [B]`` at ``C..C+B-1`` -> logits ``[B, V]`` over the
    target vocabulary (with a draft vocabulary: -inf outside it)."""
    ctx = _rms(torch.cat(features, -1) @ sd["fc.weight"].T, sd["hidden_norm.weight"])
    c, b = ctx.shape[0], block_ids.shape[0]
    ctx_pos, blk_pos = list(range(c)), list(range(c, c + b))
    x = embed[block_ids]
    layers = len({k.split(".")[1] for k in sd if k.startswith("layers.")})
    for i in range(layers):
        x = _layer(x, ctx, sd, i, ctx_pos, blk_pos)
    h = _rms(x, sd["norm.weight"])
    if "d2t" not in sd:
        return h @ lm_head.T
    out = torch.full((b, vocab), float("-inf"), dtype=h.dtype)
    out[:, torch.arange(sd["d2t"].shape[0]) + sd["d2t"]] = h @ sd["lm_head.weight"].T
    return out


def reference_logits(sd, hf, target_layer_ids, tokens, mask_token_id, block_size):
    """Block logits ``[block_size, V]`` for a request holding ``tokens`` (the last one the bonus), recomputed from
    scratch: one HF forward over ``tokens[:-1]`` for the features (outputs of ``target_layer_ids``:
    ``hidden_states[id + 1]``), then the reference block forward."""
    with torch.no_grad():
        hs = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states
        feats = [hs[i + 1][0] for i in target_layer_ids]
        block = torch.tensor([tokens[-1]] + [mask_token_id] * (block_size - 1))
        return reference_block_logits(sd, hf.get_input_embeddings().weight, hf.get_output_embeddings().weight,
                                      feats, block, hf.config.vocab_size)


def reference_drafts(sd, hf, target_layer_ids, tokens, k, mask_token_id, block_size):
    """The k greedy drafts of :func:`reference_logits` (block indices 1..k)."""
    logits = reference_logits(sd, hf, target_layer_ids, tokens, mask_token_id, block_size)
    return logits[1: 1 + k].argmax(-1).tolist()

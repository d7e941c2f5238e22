"""The published layouts a trained EAGLE head is written in (docs/formats.md): one table per layout from the names of
:mod:`specdec_eagle.heads`' modules to the checkpoint's keys (:data:`WRITE_KEYS`), its inverse (:data:`READ_KEYS`),
and the config.json of each layout.

Plain data and dict work: no training code and no torch import, so a loader can share these tables (a key renamed in
one place is renamed for the writer and the reader together).

Layouts:

- ``"eagle1"``: SafeAILab EAGLE-1 (``fc.*``, ``layers.0.*``; LlamaConfig keys plus ``bias``).
- ``"eagle3"``: SafeAILab / SpecForge EAGLE-3 (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``/``t2d``;
  ``LlamaForCausalLMEagle3`` config with ``draft_vocab_size``).
- ``"speculators-eagle3"``: speculators (``midlayer.`` renamed ``layers.0.``; ``speculators_model_type: "eagle3"``
  and its nested ``transformer_layer_config``).

The head's frozen parts (``embed_tokens.weight``, EAGLE-1's ``lm_head.weight``) are the target's: the writer leaves
them out, the tables still name them (the layouts allow an ``embed_tokens.weight``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LAYOUTS", "READ_KEYS", "WRITE_KEYS", "eagle1_config", "eagle3_config", "rename", "speculators_config"]

LAYOUTS = ("eagle1", "eagle3", "speculators-eagle3")

_LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight"]
_EAGLE3_LAYER = [*_LAYER, "hidden_norm.weight", "input_layernorm.weight"]
_EAGLE3_TOP = ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight"]

# module key (heads.Eagle1Head / Eagle3Head state_dict) -> checkpoint key
WRITE_KEYS: dict[str, dict[str, str]] = {
    "eagle1": {"fc.weight": "fc.weight", "fc.bias": "fc.bias", "embed_tokens.weight": "embed_tokens.weight",
               **{k: f"layers.0.{k}" for k in _LAYER}},
    "eagle3": {**{k: k for k in _EAGLE3_TOP}, **{k: f"midlayer.{k}" for k in _EAGLE3_LAYER}},
    "speculators-eagle3": {**{k: k for k in _EAGLE3_TOP}, **{k: f"layers.0.{k}" for k in _EAGLE3_LAYER}},
}
# checkpoint key -> module key
READ_KEYS: dict[str, dict[str, str]] = {layout: {v: k for k, v in table.items()}
                                        for layout, table in WRITE_KEYS.items()}


def rename(state: dict[str, Any], table: dict[str, str]) -> dict[str, Any]:
    """``state`` with every key renamed through ``table``; a key the table lacks is a KeyError naming it and the
    keys it knows (a head module and a layout that do not match)."""
    missing = sorted(k for k in state if k not in table)
    if missing:
        raise KeyError(f"no layout key for {missing}: the table knows {sorted(table)}.")
    return {table[k]: v for k, v in state.items()}


def _layer_config(h: dict[str, Any]) -> dict[str, Any]:
    """LlamaConfig fields of the one decoder layer, from the head's sizes ``h`` (keys of heads.HeadConfig plus
    ``max_position_embeddings``)."""
    config = {"model_type": "llama", "hidden_size": h["hidden_size"], "intermediate_size": h["intermediate_size"],
              "num_attention_heads": h["num_attention_heads"], "num_key_value_heads": h["num_key_value_heads"],
              "head_dim": h["head_dim"], "num_hidden_layers": 1, "hidden_act": "silu",
              "rms_norm_eps": h["rms_norm_eps"],
              "rope_theta": h["rope_theta"], "max_position_embeddings": h["max_position_embeddings"],
              "vocab_size": h["vocab_size"], "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
              "torch_dtype": "float32"}
    if h.get("rope_scaling"):
        config["rope_scaling"] = dict(h["rope_scaling"])
    return config


def eagle1_config(h: dict[str, Any]) -> dict[str, Any]:
    """SafeAILab EAGLE-1: LlamaConfig keys plus the raw ``bias`` key."""
    return {"architectures": ["LlamaForCausalLM"], **_layer_config(h), "bias": bool(h["bias"])}


def eagle3_config(h: dict[str, Any], layer_ids: list[int]) -> dict[str, Any]:
    """SafeAILab / SpecForge EAGLE-3 (``LlamaForCausalLMEagle3``), plus the feature layers it was trained on."""
    return {"architectures": ["LlamaForCausalLMEagle3"], **_layer_config(h), "draft_vocab_size": h["draft_vocab_size"],
            "target_hidden_size": h["target_hidden_size"], "eagle_aux_hidden_state_layer_ids": list(layer_ids)}


def speculators_config(h: dict[str, Any], layer_ids: list[int], verifier: dict[str, Any],
                       speculative_tokens: int) -> dict[str, Any]:
    """speculators ``eagle3``: the layer's LlamaConfig nested in ``transformer_layer_config``. The head adds ``fc``'s
    output to the residual before ``hidden_norm`` (SafeAILab's order), so ``norm_before_residual`` is written false:
    vLLM reads an absent one as true for speculators checkpoints."""
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.1.0",
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": speculative_tokens}],
                                   "verifier": verifier},
            "transformer_layer_config": _layer_config(h), "draft_vocab_size": h["draft_vocab_size"],
            "target_hidden_size": h["target_hidden_size"], "eagle_aux_hidden_state_layer_ids": list(layer_ids),
            "norm_before_residual": False, "torch_dtype": "float32"}

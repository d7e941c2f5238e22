"""Shared fixtures: small random-initialised Hugging Face models saved with save_pretrained, and
throwaway proposers registered by hand (and unregistered afterwards)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

TINY_VOCAB = 96


def _save_model(config, path: Path, seed: int) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # A wide init makes logits peaked, so float32 near-ties between a 1-token step and a
    # (k+1)-token verify pass are vanishingly rare and greedy comparisons are exact.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25)
    model.save_pretrained(path)
    return str(path)


def _common(**extra):
    return dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, **extra)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory) -> str:
    """A 3-layer Llama (GQA) with a 96-token vocabulary; EOS id 1."""
    from transformers import LlamaConfig

    return _save_model(LlamaConfig(**_common()), tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_path(tmp_path_factory) -> str:
    """A 3-layer Qwen3 (q/k norms, explicit head_dim) with the same vocabulary."""
    from transformers import Qwen3Config

    return _save_model(Qwen3Config(**_common(head_dim=16)), tmp_path_factory.mktemp("tiny-qwen3"), seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory) -> str:
    """A 3-layer Qwen2 (qkv bias) with the same vocabulary."""
    from transformers import Qwen2Config

    return _save_model(Qwen2Config(**_common()), tmp_path_factory.mktemp("tiny-qwen2"), seed=2)


@pytest.fixture
def register_proposer():
    """Register proposer classes by hand for one test; they are unregistered afterwards."""
    import specdec

    names = []

    def register(*classes, name=None):
        class _Plugin:
            @specdec.hookimpl
            def specdec_register_proposers(self, register):
                for cls in classes:
                    register(cls)

        plugin_name = name or f"test-plugin-{len(names)}-{classes[0].method}"
        specdec.register_plugin(_Plugin(), name=plugin_name)
        names.append(plugin_name)
        return plugin_name

    yield register
    for n in names:
        specdec.unregister_plugin(n)

"""HFTargetModel: batched slots of different lengths give the same logits and hidden states as plain
Hugging Face forwards; rejected drafts' KV is dropped without copying the cache."""

from __future__ import annotations

import pytest
import torch

from specdec import HFTargetModel, HiddenStateRequest

PROMPTS = [[2, 3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13, 14, 15]]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _ref_logits(hf, seq, last):
    with torch.no_grad():
        return hf(torch.tensor([seq])).logits[0, -last:]


@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen2_path", "tiny_qwen3_path"])
def test_forward_matches_plain_hf_with_rejections(request, fixture):
    path = request.getfixturevalue(fixture)
    hf = _hf(path)
    t = HFTargetModel(path, dtype="float32", device="cpu")
    t.allocate(3)
    key_ptrs = [k.data_ptr() for k in t.cache.keys]

    out = t.forward([0, 1, 2], PROMPTS, [1, 1, 1])
    for i, p in enumerate(PROMPTS):
        torch.testing.assert_close(out.logits[i], _ref_logits(hf, p, 1)[0], atol=1e-4, rtol=1e-4)
        t.advance(i, len(p))

    # Verify-style step on non-contiguous slots with different draft counts.
    new = {0: [20, 21, 22], 2: [30, 31]}
    out = t.forward([0, 2], [new[0], new[2]], [3, 2])
    torch.testing.assert_close(out.logits[:3], _ref_logits(hf, PROMPTS[0] + new[0], 3), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits[3:], _ref_logits(hf, PROMPTS[2] + new[2], 2), atol=1e-4, rtol=1e-4)

    # Slot 0 keeps only its first new token (two drafts rejected); slot 2 keeps both.
    t.advance(0, 1)
    t.advance(2, 2)
    out = t.forward([0, 1, 2], [[40], [41, 42], [43]], [1, 2, 1])
    torch.testing.assert_close(out.logits[0], _ref_logits(hf, PROMPTS[0] + [20, 40], 1)[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits[1:3], _ref_logits(hf, PROMPTS[1] + [41, 42], 2), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.logits[3], _ref_logits(hf, PROMPTS[2] + [30, 31, 43], 1)[0], atol=1e-4,
                               rtol=1e-4)
    # The cache buffers were never reallocated or copied.
    assert [k.data_ptr() for k in t.cache.keys] == key_ptrs


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen2_path", "tiny_qwen3_path"])
def test_hidden_states_and_embeddings(request, fixture, fused):
    """Aux hidden states numbered as Hugging Face's output_hidden_states (0: embeddings, L: after the final
    norm, negative from the end), from the fused forward's taps, or through Hugging Face's layers by taps on the
    asked layers only (Hugging Face's own capture would hook every layer)."""
    hf = _hf(request.getfixturevalue(fixture))
    t = HFTargetModel(request.getfixturevalue(fixture), dtype="float32", device="cpu", fused_forward=fused)
    t.allocate(3)
    n_layers = hf.config.num_hidden_layers
    for layers in ((0, 2, n_layers), (1, -2, -1)):
        out = t.forward([0, 1, 2], PROMPTS, [1, 1, 1], HiddenStateRequest(last_layer=True, aux_layer_ids=layers))
        assert out.query_start_loc.tolist() == [0, 5, 7, 14]
        assert out.hidden_states.shape == (14, hf.config.hidden_size)
        assert len(out.aux_hidden_states) == 3
        for i, p in enumerate(PROMPTS):
            s, e = out.query_start_loc[i], out.query_start_loc[i + 1]
            with torch.no_grad():
                ref = hf(torch.tensor([p]), output_hidden_states=True).hidden_states
            for got, layer in zip(out.aux_hidden_states, layers):
                torch.testing.assert_close(got[s:e], ref[layer][0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(out.hidden_states[s:e], ref[-1][0], atol=1e-4, rtol=1e-4)
    # taps wrap the asked layers' own forward (no module hooks: those take torch's slower call path every step):
    # index 0 (layer 0's input), 1 and 2 (= -2 with 3 layers); not the norm
    assert all(not layer._forward_hooks and not layer._forward_pre_hooks for layer in t.base.layers)
    taps = [True, True, False] if not fused else [False, False, False]  # the fused forward taps its own stream
    assert ["forward" in vars(layer) for layer in t.base.layers] == taps
    assert t._tapped == ({0, 1, 2} if not fused else set())
    assert t.get_input_embeddings().weight.shape == (hf.config.vocab_size, hf.config.hidden_size)
    assert t.get_output_embeddings().weight.shape == (hf.config.vocab_size, hf.config.hidden_size)


def test_loaded_module_and_max_model_len(tiny_llama_path):
    t = HFTargetModel(_hf(tiny_llama_path), dtype="float32", device="cpu", max_model_len=64)
    assert t.max_model_len == 64 and t.vocab_size == 96
    t.allocate(1)
    with pytest.raises(ValueError, match="would exceed max_model_len=64"):
        t.forward([0], [list(range(2, 67))], [1])
    with pytest.raises(ValueError, match="max_model_len=1000 exceeds the model's max_position_embeddings=256"):
        HFTargetModel(tiny_llama_path, max_model_len=1000)


def test_missing_path_and_not_a_causal_lm(tmp_path):
    with pytest.raises(FileNotFoundError, match="model path '/nonexistent/model' does not exist.*never downloads"):
        HFTargetModel("/nonexistent/model")
    with pytest.raises(ValueError, match="has no config.json"):
        HFTargetModel(str(tmp_path))
    from transformers import ResNetConfig

    ResNetConfig().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type='resnet'.*is not a causal language model"):
        HFTargetModel(str(tmp_path))


def test_kv_cache_that_cannot_fit_is_refused_with_the_fix(tiny_llama_path, monkeypatch):
    import specdec.runner as target_mod

    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu")
    need = target_mod.kv_cache_bytes(4, 3, 2, 16, 256, torch.float32)
    assert need == 2 * 4 * 3 * 2 * 16 * 257 * 4
    monkeypatch.setattr(target_mod, "_available_bytes", lambda device: need)
    with pytest.raises(MemoryError, match=r"KV cache needs .* MiB \(4 slots x max_model_len=256 x 3 layers\).*"
                                          r"pass a smaller max_model_len or max_num_seqs"):
        t.allocate(4)
    monkeypatch.setattr(target_mod, "_available_bytes", lambda device: 10 * need)
    t.allocate(4)
    assert t.cache.keys[0].shape == (4, 2, 257, 16)

"""specdec_dflash loading and block forward: both published layouts load into the same module, whose block logits
equal an independent plain-torch reference given the same target features (cache-free, and through the context
cache with rows of different lengths); drafts that do not fit are refused with messages naming the value."""

from __future__ import annotations

import pytest
import torch
from dflash_formats import random_dflash, reference_block_logits, write
from specdec_dflash.heads import ContextKVCache
from specdec_dflash.loader import TargetInfo, default_target_layer_ids, load_draft, read_draft

from conftest import TINY_VOCAB

INFO = TargetInfo(hidden_size=64, vocab_size=TINY_VOCAB, num_layers=3)


@pytest.fixture(scope="module")
def hf(tiny_qwen3_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32).eval()


def _load(path, hf, info=INFO):
    return load_draft(path, info, hf.get_input_embeddings(), hf.get_output_embeddings()).draft


def _features(hf, tokens, ids):
    with torch.no_grad():
        hs = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return [hs[i + 1][0] for i in ids]


CASES = {
    "z-lab": dict(layout="z-lab"),
    "z-lab-bias-3-layers": dict(layout="z-lab", num_layers=3, target_layer_ids=[2, 0, 1], bias=True),
    "speculators": dict(layout="speculators", target_layer_ids=[1, 2]),
    "speculators-draft-vocab": dict(layout="speculators", draft_vocab=40),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_logits_equal_reference(tmp_path, hf, case):
    cfg, sd = random_dflash(TINY_VOCAB, seed=3, **CASES[case])
    loaded = read_draft(write(tmp_path / case, cfg, sd), INFO)
    assert loaded.layout == CASES[case]["layout"]
    draft = _load(str(tmp_path / case), hf)
    ids = list(draft.cfg.target_layer_ids)
    assert draft.cfg.aux_layer_ids == tuple(i + 1 for i in ids)
    tokens = [3, 17, 40, 9, 77, 12, 60]
    block = torch.tensor([[tokens[-1]] + [5] * 7])
    feats = _features(hf, tokens[:-1], ids)
    want = reference_block_logits(sd, hf.get_input_embeddings().weight, hf.get_output_embeddings().weight, feats,
                                  block[0], TINY_VOCAB)
    with torch.no_grad():
        got = draft(torch.cat(feats, -1)[None], block)[0]
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert finite.sum() == 8 * (40 if "vocab" in case else TINY_VOCAB)
    # float32 logits of magnitude ~5 from two orders of the same sums: a clean-clone run saw 1.1e-5 (rel 2e-6)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=1e-5)


def test_cached_batched_block_equals_reference(tmp_path, hf):
    """Rows with contexts of 1, 6 and 11 positions, appended in uneven pieces with padding, through the slot
    cache (slots out of order): each row's block logits equal the reference over its own context alone."""
    cfg, sd = random_dflash(TINY_VOCAB, seed=4)
    draft = _load(write(tmp_path / "d", cfg, sd), hf)
    seqs = [[7], [3, 17, 40, 9, 77, 12], [50, 2, 8, 91, 33, 4, 64, 21, 70, 11, 6]]
    cache = ContextKVCache(draft.cfg, 4, 32, torch.float32, "cpu")
    slots = torch.tensor([2, 0, 3])
    feats = [torch.cat(_features(hf, s, [0, 2]), -1) for s in seqs]
    with torch.no_grad():
        done = [0, 0, 0]
        for piece in ([1, 4, 5], [0, 2, 6]):  # positions appended per row at each call (0: padding only)
            width = max(piece)
            pos = torch.zeros(3, width, dtype=torch.long)
            valid = torch.zeros(3, width, dtype=torch.bool)
            rows = torch.zeros(3, width, feats[0].shape[-1])
            for r, q in enumerate(piece):
                for j in range(width):
                    p = done[r] + min(j, max(q - 1, 0))
                    pos[r, j], valid[r, j], rows[r, j] = p, j < q, feats[r][min(p, len(seqs[r]) - 1)]
                done[r] += q
            draft.append_context(cache, slots, rows, pos, valid)
        assert done == [len(s) for s in seqs]
        bonus = [88, 1, 45]
        block = torch.tensor([[b] + [5] * 7 for b in bonus])
        ctx_len = torch.tensor([len(s) for s in seqs])
        got = draft.logits(draft.cached_block_hidden(cache, slots, draft.embed_tokens(block), ctx_len, 11))
    for r, s in enumerate(seqs):
        want = reference_block_logits(sd, hf.get_input_embeddings().weight, hf.get_output_embeddings().weight,
                                      _features(hf, s, [0, 2]), block[r], TINY_VOCAB)
        torch.testing.assert_close(got[r], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["z-lab", "speculators"])
def test_default_target_layer_ids(tmp_path, hf, layout):
    assert default_target_layer_ids(36, 1) == (18,)
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)  # z-lab's Qwen3-8B drafts
    assert default_target_layer_ids(28, 3) == (1, 13, 25)
    cfg, sd = random_dflash(TINY_VOCAB, layout=layout, num_layers=1, target_layer_ids=None)
    assert _load(write(tmp_path / "d", cfg, sd), hf).cfg.target_layer_ids == (1,)  # N // 2 of the 3 layers


def _refusal(tmp_path, hf, info=INFO, **kwargs) -> str:
    cfg, sd = random_dflash(TINY_VOCAB, **{k: v for k, v in kwargs.items() if k not in ("drop", "edit")})
    if "drop" in kwargs:
        sd.pop(kwargs["drop"])
    kwargs.get("edit", lambda c, s: None)(cfg, sd)
    path = write(tmp_path / "bad", cfg, sd)
    with pytest.raises(ValueError) as info_:
        _load(path, hf, info)
    return str(info_.value).replace(path, "P")


def test_refusals(tmp_path, hf):
    def ids_out_of_range(c, s):
        c["dflash_config"]["target_layer_ids"] = [0, 3]

    assert _refusal(tmp_path, hf, edit=ids_out_of_range) == (
        "draft 'P' does not fit the target: target_layer_ids=[0, 3] but the target has num_hidden_layers=3 (ids "
        "must be distinct decoder layers in 0..2); use a draft trained for this target.")
    assert _refusal(tmp_path, hf, mask_token_id=TINY_VOCAB) == (
        f"draft 'P' does not fit the target: mask_token_id={TINY_VOCAB} is outside the target's vocabulary "
        f"0..{TINY_VOCAB - 1}; set mask_token_id in the draft's config.json to the id it was trained with.")
    assert _refusal(tmp_path, hf, info=TargetInfo(32, TINY_VOCAB, 3)) == (
        "draft 'P' does not fit the target: its hidden_size=64 but the target's hidden_size=32; DFlash embeds its "
        "block with the target's embeddings and reads them with the target's lm_head, so both must be equal: use "
        "a draft trained for this target.")
    assert _refusal(tmp_path, hf, info=TargetInfo(64, 100, 3)) == (
        f"draft 'P' does not fit the target: its vocab_size={TINY_VOCAB} but the target's vocab_size=100: use a "
        "draft trained for this target.")
    assert _refusal(tmp_path, hf, num_target_layers=36) == (
        "draft 'P' does not fit the target: its num_target_layers=36 but the target has num_hidden_layers=3; a "
        "DFlash draft only works with the target it was trained on.")

    def fc_too_wide(c, s):  # three target layers' worth of fc for two ids
        s["fc.weight"] = torch.zeros(64, 3 * 64)

    assert _refusal(tmp_path, hf, edit=fc_too_wide) == (
        "draft directory 'P': key 'fc.weight' has shape (64, 192), expected (64, 128) from its config.json "
        "(hidden_size=64, 2 target layers x target_hidden_size=64, intermediate_size=96, head_dim=16).")
    assert _refusal(tmp_path, hf, drop="layers.1.self_attn.k_norm.weight") == (
        "draft directory 'P' lacks key 'layers.1.self_attn.k_norm.weight' ((16,) expected from its config.json): "
        "the weights are incomplete or belong to another architecture.")
    assert _refusal(tmp_path, hf, mask_token_id=None) == (
        "draft config 'P'/config.json has no mask_token_id (dflash_config.mask_token_id or top level): DFlash "
        "fills its block with that token, and it cannot be guessed.")

    def sliding(c, s):
        c["layer_types"] = ["sliding_attention", "full_attention"]
        c["sliding_window"] = 4096

    assert _refusal(tmp_path, hf, edit=sliding) == (
        "draft directory 'P' has sliding-window attention layers (layer_types=['sliding_attention', "
        "'full_attention'], sliding_window=4096), which the dflash plugin does not implement: only "
        "full-attention drafts (layer_types all 'full_attention') are supported.")
    assert _refusal(tmp_path, hf, layout="speculators", sample_from_anchor=True) == (
        "draft directory 'P' sets sample_from_anchor=true (drafts from the bonus position too), which the dflash "
        "plugin does not implement: only the standard DFlash block (drafts at block indices 1..block_size-1) is "
        "supported.")

    def eagle3(c, s):
        c["speculators_model_type"] = "eagle3"

    assert _refusal(tmp_path, hf, layout="speculators", edit=eagle3) == (
        "draft directory 'P' is a speculators 'eagle3' checkpoint; method 'dflash' loads speculators_model_type "
        "'dflash' only (an eagle3 head is method 'eagle3').")

    def plain_qwen3(c, s):
        del c["dflash_config"]
        c["architectures"] = ["Qwen3ForCausalLM"]

    assert _refusal(tmp_path, hf, edit=plain_qwen3) == (
        "draft directory 'P' is not a DFlash checkpoint: its config.json has neither architectures "
        "['DFlashDraftModel'] / a dflash_config object (z-lab) nor speculators_model_type 'dflash' (speculators); "
        "got architectures=['Qwen3ForCausalLM'].")


def test_remote_code_is_never_run(tmp_path, hf):
    """The z-lab directory ships modelling code for trust_remote_code (config auto_map): loading reads
    config.json and the weights only."""
    cfg, sd = random_dflash(TINY_VOCAB)
    path = tmp_path / "zlab"
    write(path, cfg, sd)
    (path / "dflash.py").write_text("raise SystemExit('remote code ran')\n")
    assert cfg["auto_map"]
    assert _load(str(path), hf).cfg.mask_token_id == 5


def test_missing_directory(tmp_path, hf):
    with pytest.raises(FileNotFoundError, match="needs model= a local directory holding config.json"):
        _load(str(tmp_path / "nowhere"), hf)

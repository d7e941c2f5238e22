"""EAGLE heads in every published layout load, compute what the architecture says (against an independent
reference), and are refused with exact messages when they do not fit the target."""

from __future__ import annotations

import re

import pytest
import torch
from eagle_formats import H, random_eagle1, random_eagle3, reference_eagle1_logits, reference_eagle3_logits, write
from torch import nn

from specdec_eagle.heads import HeadConfig, HeadKVCache, build_head
from specdec_eagle.loader import TargetInfo, load_head

V, T = 96, 11
TARGET = TargetInfo(hidden_size=H, vocab_size=V, num_layers=12)


@pytest.fixture(scope="module")
def target_parts():
    torch.manual_seed(123)
    embed = nn.Embedding(V, H)
    lm_head = nn.Linear(H, V, bias=False)
    with torch.no_grad():
        embed.weight.normal_(0, 1.0)
        lm_head.weight.normal_(0, 0.05)
    return embed, lm_head


def _inputs(width):
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, V, (T,), generator=g), torch.randn(T, width, generator=g)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("own_embed", [False, True])
def test_eagle1_matches_reference(tmp_path, target_parts, fmt, bias, own_embed):
    embed, lm_head = target_parts
    cfg, sd = random_eagle1(V, bias=bias, embed=own_embed)
    path = write(tmp_path / "e1", cfg, sd, fmt)
    loaded = load_head(path, "eagle", TARGET, embed, lm_head)
    assert loaded.layout == "eagle1" and loaded.aux_layer_ids is None
    ids, feats = _inputs(H)
    with torch.no_grad():
        got = loaded.head.logits(loaded.head(ids[None], feats[None]))[0]
        want = reference_eagle1_logits(sd, sd.get("embed_tokens.weight", embed.weight), lm_head.weight, ids, feats)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout,extra,nbr", [
    ("eagle3", {}, False),
    ("eagle3", {"eagle_aux_hidden_state_layer_ids": [1, 4, 8]}, False),
    ("speculators", {}, True),  # vLLM's default for speculators: norm_before_residual absent = true
    ("speculators", {"norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [3, 6, 9]}, False),
])
@pytest.mark.parametrize("draft_vocab", [40, V])
def test_eagle3_matches_reference(tmp_path, target_parts, layout, extra, nbr, draft_vocab):
    embed, _ = target_parts
    cfg, sd = random_eagle3(V, draft_vocab, layout, embed=layout == "speculators", **extra)
    loaded = load_head(write(tmp_path / "e3", cfg, sd, "safetensors"), "eagle3", TARGET, embed)
    assert loaded.layout == ("eagle3" if layout == "eagle3" else "speculators-eagle3")
    assert loaded.aux_layer_ids == tuple(extra.get("eagle_aux_hidden_state_layer_ids", (2, 6, 9)))
    ids, feats = _inputs(3 * H)
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    with torch.no_grad():
        got = loaded.head.logits(loaded.head(ids[None], feats[None]))[0]
        want = reference_eagle3_logits(sd, sd.get("embed_tokens.weight", embed.weight), ids, list(feats.split(H, -1)),
                                       V, prefix, norm_before_residual=nbr)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_decode_over_slot_cache_equals_full_forward(kind):
    """Chunks of one sequence through the slot cache (with rolled-back garbage in between) give the full
    forward's hidden states."""
    cfg = HeadConfig(kind=kind, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=V, draft_vocab_size=30)
    torch.manual_seed(0)
    head = build_head(cfg).eval()
    ids, feats = torch.randint(0, V, (2, 9)), torch.randn(2, 9, cfg.feature_size)
    cache = HeadKVCache(cfg, 5, 16, torch.float32, "cpu")
    slots = torch.tensor([4, 0])
    with torch.no_grad():
        want = head(ids, feats)
        a = head.decode(cache, slots, ids[:, :4], feats[:, :4], torch.arange(4).expand(2, 4))
        # a speculative step at positions 4..5, never committed: overwritten below
        head.decode(cache, slots, ids[:, :2], torch.randn(2, 2, 32), torch.arange(4, 6).expand(2, 2))
        b = head.decode(cache, slots, ids[:, 4:], feats[:, 4:], torch.arange(4, 9).expand(2, 5))
    torch.testing.assert_close(torch.cat((a, b), 1), want, atol=1e-5, rtol=0)


# -- refusals -----------------------------------------------------------------------------------

def _refused(path, method, target=TARGET, embed=None, lm_head=None):
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        load_head(path, method, target, embed, lm_head)
    return str(info.value)


def test_refuses_hidden_size_and_vocab(tmp_path, target_parts):
    embed, lm_head = target_parts
    p3 = write(tmp_path / "e3", *random_eagle3(V, 40))
    small = TargetInfo(hidden_size=32, vocab_size=V, num_layers=12)
    assert _refused(p3, "eagle3", small, embed) == (
        f"head {p3!r} does not fit the target: its target_hidden_size=64 but the target's hidden_size=32.")
    p1 = write(tmp_path / "e1", *random_eagle1(V))
    assert _refused(p1, "eagle", TargetInfo(H, 100, 12), embed, lm_head) == (
        f"head {p1!r} does not fit the target: its vocab_size={V} but the target's vocab_size=100.")


def test_refuses_layer_ids(tmp_path, target_parts):
    path = write(tmp_path / "s", *random_eagle3(V, 40, "speculators", eagle_aux_hidden_state_layer_ids=[1, 5, 12]))
    assert _refused(path, "eagle3", TARGET, target_parts[0]) == (
        f"head {path!r} does not fit the target: eagle_aux_hidden_state_layer_ids=[1, 5, 12] but the target has "
        "num_hidden_layers=12 (ids must be 3 distinct layers in 0..11).")


def test_refuses_missing_and_misshaped_keys(tmp_path, target_parts):
    cfg, sd = random_eagle3(V, 40)
    del sd["midlayer.self_attn.k_proj.weight"]
    path = write(tmp_path / "missing", cfg, sd)
    assert _refused(path, "eagle3", embed=target_parts[0]) == (
        f"head directory {path!r} lacks key 'midlayer.self_attn.k_proj.weight' ((32, 128) expected from its "
        "config.json): the weights are incomplete or belong to another architecture.")
    cfg, sd = random_eagle1(V)
    sd["fc.weight"] = sd["fc.weight"][:, :H]
    path = write(tmp_path / "shape", cfg, sd, "bin")
    assert _refused(path, "eagle") == (
        f"head directory {path!r}: key 'fc.weight' has shape (64, 64), expected (64, 128) from its config.json "
        f"(hidden_size=64, vocab_size={V}, draft_vocab_size={V}, target_hidden_size=64).")


def test_refuses_wrong_method_and_non_eagle_dirs(tmp_path):
    path = write(tmp_path / "e3", *random_eagle3(V, 40))
    assert _refused(path, "eagle") == (
        f"head directory {path!r} holds an EAGLE-3 head (eagle3 layout) but method='eagle' was asked: use "
        "method='eagle3'.")
    cfg, sd = random_eagle3(V, 40, "speculators")
    path = write(tmp_path / "df", {**cfg, "speculators_model_type": "dflash"}, sd)
    assert _refused(path, "eagle3") == (
        f"head directory {path!r} is a speculators 'dflash' checkpoint; the eagle plugin loads "
        "speculators_model_type 'eagle3' only.")
    assert "does not exist" in _refused(str(tmp_path / "nowhere"), "eagle3")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert _refused(str(tmp_path / "empty"), "eagle3") == (
        f"head directory {str(tmp_path / 'empty')!r} has no weights: expected model.safetensors (or shards with "
        "model.safetensors.index.json) or pytorch_model.bin.")


class _Evil:
    def __reduce__(self):
        return (print, ("pickle code ran",))


def test_pickle_that_runs_code_is_refused(tmp_path, capsys):
    cfg, sd = random_eagle1(V)
    path = write(tmp_path / "evil", cfg, {**sd, "extra": _Evil()}, "bin")
    msg = _refused(path, "eagle")
    assert re.search(r"could not be read with torch.load\(weights_only=True\)", msg)
    assert "pickle code ran" not in capsys.readouterr().out


def test_refuses_speculators_flags_not_implemented(tmp_path):
    path = write(tmp_path / "s", *random_eagle3(V, 40, "speculators", norm_before_fc=True))
    assert _refused(path, "eagle3") == (
        f"head directory {path!r} sets norm_before_fc=True, which the eagle plugin does not implement yet; only "
        "norm_before_residual is supported.")

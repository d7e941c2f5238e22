"""EAGLE trainers, piece by piece (fast, CPU): options, the draft vocabulary, the unrolled chain against the heads'
own drafting path, the loss's masks, and the published layouts (save, then load the state dict back into
heads.py's module: identical logits). Real training runs are in test_train_eagle_run.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import specdec
from specdec_eagle.heads import HeadConfig, HeadKVCache, build_head
from specdec_eagle.train import (
    Eagle3Trainer,
    Eagle3TrainOptions,
    EagleTrainer,
    EagleTrainOptions,
    default_layer_ids,
    draft_vocab,
    unroll,
)
from specdec_eagle.train_layouts import READ_KEYS, WRITE_KEYS, rename
from specdec_tools.train import LAST, Batch, TargetInfo, build_trainer

TINY = specdec.bundled_model("tiny")  # 4 layers, hidden 256, vocabulary 4096
H, V = 256, 4096


@pytest.fixture(scope="module")
def tiny():
    return TargetInfo.from_path(TINY)


# ---------------------------------------------------------------- options and layer ids


def test_default_layer_ids_are_the_loaders():
    assert default_layer_ids(4) == (1, 2) and default_layer_ids(32) == (2, 16, 29) and default_layer_ids(6) == (2, 3)
    loader = pytest.importorskip("specdec_eagle.loader")
    for n in (3, 4, 6, 8, 32, 80):
        assert default_layer_ids(n) == loader.default_aux_layer_ids(n)


@pytest.mark.parametrize("given, ids", [(None, None), ("3,1", (1, 3)), ([2, 1, 2], (1, 2)), (2, (2,)), ("", None)])
def test_layer_ids_option_forms(given, ids):
    assert Eagle3TrainOptions(layer_ids=given).layer_ids == ids


@pytest.mark.parametrize("kw, message", [
    ({"layer_ids": "a,b"}, "layer_ids='a,b' is invalid: it must be target layer ids >= 0"),
    ({"layer_ids": [-1]}, "layer_ids=[-1] is invalid"),
    ({"ttt_steps": 0}, "ttt_steps=0 is invalid: it must be an int >= 1"),
    ({"step_weight": 0}, "step_weight=0 is invalid: it must be a number in (0, 1]"),
    ({"format": "vllm"}, "format='vllm' is invalid: it must be one of safeailab, speculators."),
    ({"draft_vocab_size": -1}, "draft_vocab_size=-1 is invalid: it must be an int >= 0"),
])
def test_eagle3_options_are_checked(kw, message):
    with pytest.raises(ValueError) as exc:
        Eagle3TrainOptions(**kw)
    assert str(exc.value).startswith(message)


def test_eagle_options_are_checked():
    with pytest.raises(ValueError, match="nothing to train"):
        EagleTrainOptions(feature_weight=0, token_weight=0)
    with pytest.raises(ValueError, match=r"acceptance_steps=0 is invalid"):
        EagleTrainOptions(acceptance_steps=0)


def test_trainer_checks_options_against_the_target(tiny):
    with pytest.raises(ValueError, match=r"layer_ids \[1, 4\] are invalid for target .* it has 4 layers, so EAGLE-3 "
                       r"feature ids run from 0 to 3"):
        build_trainer(Eagle3Trainer, tiny, {"layer_ids": "1,4"})
    with pytest.raises(ValueError, match="draft_vocab_size=5000 is invalid: it must be at most the target's "
                       "vocab_size=4096"):
        build_trainer(Eagle3Trainer, tiny, {"draft_vocab_size": 5000})
    with pytest.raises(ValueError, match=r"Unknown training option\(s\) \['format'\] for method 'eagle'"):
        build_trainer(EagleTrainer, tiny, {"format": "speculators"})
    t = build_trainer(Eagle3Trainer, tiny, {})
    assert t.layer_ids == (1, 2) and t.hidden_keys() == ["1", "2", LAST]
    assert build_trainer(EagleTrainer, tiny, {}).hidden_keys() == [LAST]


# ---------------------------------------------------------------- draft vocabulary


def test_draft_vocab_keeps_the_most_frequent_ids_in_order():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    d2t, t2d = draft_vocab(counts, 4)
    ids = torch.arange(4) + d2t
    assert ids.tolist() == [0, 2, 3, 5]  # 9, 9, then the tie 5/5; ascending target ids
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]
    assert d2t.dtype == torch.int64 and (d2t >= 0).all() and (d2t.diff() >= 0).all()
    d2t, t2d = draft_vocab(counts, 8)
    assert not d2t.any() and t2d.all()


def _batch(b: int, t: int, keys: list[str], seed: int = 0, pad: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    if pad:
        valid[-1, t - pad:] = False
        ids[-1, t - pad:] = 0
    hidden = {k: torch.randn(b, t, H, generator=g) for k in keys}
    return Batch(ids, valid, valid.clone(), hidden)


def test_training_counts_tokens_and_the_draft_vocab_follows(tiny):
    trainer = build_trainer(Eagle3Trainer, tiny, {"draft_vocab_size": 64, "ttt_steps": 1})
    trainer.head.train()
    batch = _batch(2, 16, trainer.hidden_keys(), pad=4)
    batch.input_ids[:, :8] = 7  # token 7 is the most frequent
    trainer.loss(batch)
    with torch.no_grad():
        trainer.loss(batch)  # no grad: an evaluation, not counted
    trainer.head.eval()
    trainer.loss(batch)
    want = torch.bincount(batch.input_ids[batch.valid], minlength=V)
    assert torch.equal(trainer.head.token_counts, want)
    d2t, t2d = trainer.vocab_map()
    ids = torch.arange(64) + d2t
    assert 7 in ids.tolist() and t2d.sum() == 64 and t2d[ids].all()
    assert want[ids].min() >= want[~t2d].max()  # every draft token is at least as frequent as any other


# ---------------------------------------------------------------- the chain


def _cfg(kind: str, **kw) -> HeadConfig:
    return HeadConfig(kind=kind, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=50, target_hidden_size=32, num_aux_layers=3, **kw)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_unroll_is_the_drafting_chain(kind):
    """The training-time test's masks give, at every position i, the hidden states that heads.decode gives when it
    drafts from i: context 0..i from the target's features, then steps fed the head's own token and hidden."""
    torch.manual_seed(0)
    net = build_head(_cfg(kind, rope_theta=100.0)).eval()
    b, t, k = 2, 9, 4
    ids = torch.randint(0, 50, (b, t))
    feats = torch.randn(b, t, net.cfg.feature_size)

    def pick(h):
        return net.logits(h).argmax(-1)

    with torch.no_grad():
        hiddens = unroll(net, ids, feats, k, feed=pick)
        for i in (0, 3, t - 2):
            cache = HeadKVCache(net.cfg, num_slots=b, capacity=t + k, dtype=torch.float32, device="cpu")
            slots = torch.arange(b)
            ctx = net.decode(cache, slots, ids[:, 1: i + 2], feats[:, : i + 1], torch.arange(i + 1).expand(b, -1))
            h = ctx[:, -1:]
            torch.testing.assert_close(h[:, 0], hiddens[0][:, i], rtol=1e-5, atol=1e-5)
            for s in range(1, k):
                h = net.decode(cache, slots, pick(h), h, torch.full((b, 1), i + s))
                torch.testing.assert_close(h[:, 0], hiddens[s][:, i], rtol=1e-5, atol=1e-5)


def test_unroll_teacher_forced_reads_the_next_tokens():
    torch.manual_seed(1)
    net = build_head(_cfg("eagle3")).eval()
    ids = torch.randint(0, 50, (1, 8))
    feats = torch.randn(1, 8, 96)
    with torch.no_grad():
        forced = unroll(net, ids, feats, 3)
        fed = unroll(net, ids, feats, 3, feed=lambda h: torch.cat((ids[:, 2:], torch.zeros(1, 2, dtype=torch.long)), 1))
        plain = net(ids.roll(-1, 1), feats)  # step 0 is the plain causal forward (the last token has no next)
        assert torch.equal(forced[0][:, :-1], plain[:, :-1])
    torch.testing.assert_close(forced[1], fed[1])


@pytest.mark.parametrize("cls", [Eagle3Trainer, EagleTrainer])
def test_loss_and_acceptance_ignore_padding(tiny, cls):
    trainer = build_trainer(cls, tiny, {"ttt_steps": 2, "acceptance_steps": 3})
    trainer.head.eval()
    batch = _batch(2, 20, trainer.hidden_keys(), pad=6)
    with torch.no_grad():
        loss, acc = trainer.loss(batch), trainer.acceptance(batch)
        for v in batch.hidden.values():
            v[-1, 14:] = 1e3  # change what padding holds
        batch.input_ids[-1, 14:] = 5
        assert torch.equal(trainer.loss(batch), loss) and torch.equal(trainer.acceptance(batch), acc)
    assert acc.shape == (17 + 11, 3) and acc.dtype == torch.bool  # T - k rows, less the padded ones
    assert torch.isfinite(loss) and loss > 0


# ---------------------------------------------------------------- layouts


def _perturbed(trainer, seed=0):
    """The trainer's head with every trainable weight moved off its initial value, and counts for a vocabulary."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainer.head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        trainer.head.token_counts.copy_(torch.randint(0, 1000, (V,), generator=g))
    return trainer.head.eval()


def _load_back(out, layout: str, kind: str, tiny) -> torch.nn.Module:
    """Build heads.py's module from the saved config.json and load the saved tensors through READ_KEYS; the
    embedding (and EAGLE-1's LM head) are the target's, as the loader shares them."""
    config = json.loads((out / "config.json").read_text())
    layer = config.get("transformer_layer_config", config)
    cfg = HeadConfig(kind=kind, hidden_size=layer["hidden_size"], intermediate_size=layer["intermediate_size"],
                     num_attention_heads=layer["num_attention_heads"],
                     num_key_value_heads=layer["num_key_value_heads"], vocab_size=layer["vocab_size"],
                     target_hidden_size=config.get("target_hidden_size", 0),
                     draft_vocab_size=config.get("draft_vocab_size", 0), rms_norm_eps=layer["rms_norm_eps"],
                     rope_theta=layer["rope_theta"], bias=config.get("bias", True),
                     num_aux_layers=len(config.get("eagle_aux_hidden_state_layer_ids", [0, 0, 0])),
                     norm_before_residual=config.get("norm_before_residual", False))
    net = build_head(cfg)
    state = rename(load_file(str(out / "model.safetensors")), READ_KEYS[layout])
    state["embed_tokens.weight"] = tiny.weight("embed_tokens.weight")
    if kind == "eagle":
        state["lm_head.weight"] = tiny.lm_head_weight()
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"d2t", "t2d"}
    if "d2t" in state:
        net.set_vocab_map(state["d2t"])
        assert torch.equal(net.t2d, state["t2d"])
    return net.eval()


def _same_logits(trained, loaded, features, ids):
    with torch.no_grad():
        a, b = unroll(trained, ids, features, 2), unroll(loaded, ids, features, 2)
        for ha, hb in zip(a, b):
            assert torch.equal(ha, hb)
            la, lb = trained.logits(ha), loaded.logits(hb)
            keep = torch.isfinite(lb[0, 0])
            assert torch.equal(la[..., keep], lb[..., keep]) and torch.isinf(lb[..., ~keep]).all()
            return int(keep.sum())


EAGLE3_LAYER = ["hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]


@pytest.mark.parametrize("fmt, layout, prefix", [("safeailab", "eagle3", "midlayer."),
                                                  ("speculators", "speculators-eagle3", "layers.0.")])
def test_eagle3_saves_the_published_layout_and_loads_back(tiny, tmp_path, fmt, layout, prefix):
    trainer = build_trainer(Eagle3Trainer, tiny, {"draft_vocab_size": 1000, "format": fmt})
    _perturbed(trainer)
    trainer.save(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    want = {"fc.weight": (H, 2 * H), "norm.weight": (H,), "lm_head.weight": (1000, H), "d2t": (1000,), "t2d": (V,),
            **{prefix + k: None for k in EAGLE3_LAYER}}
    assert set(saved) == set(want)
    assert {k: tuple(v.shape) for k, v in saved.items() if want[k]} == {k: s for k, s in want.items() if s}
    assert tuple(saved[prefix + "self_attn.q_proj.weight"].shape) == (H, 2 * H)  # 4 heads x 64 over [embed; hidden]
    assert saved["d2t"].dtype == torch.int64 and saved["t2d"].dtype == torch.bool and saved["t2d"].sum() == 1000
    d2t, t2d = trainer.vocab_map()
    assert torch.equal(saved["d2t"], d2t) and torch.equal(saved["t2d"], t2d)
    torch.testing.assert_close(saved["lm_head.weight"], trainer.head.net.lm_head.weight[torch.arange(1000) + d2t],
                               rtol=0, atol=0)

    config = json.loads((tmp_path / "config.json").read_text())
    if fmt == "safeailab":
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 1000
        assert config["target_hidden_size"] == H and config["num_hidden_layers"] == 1
    else:
        assert config["speculators_model_type"] == "eagle3" and config["norm_before_residual"] is False
        assert config["transformer_layer_config"]["hidden_size"] == H and config["draft_vocab_size"] == 1000
        assert config["speculators_config"]["verifier"]["name_or_path"] == TINY
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]

    net = _load_back(tmp_path, layout, "eagle3", tiny)
    torch.manual_seed(3)
    kept = _same_logits(trainer.head.net, net, torch.randn(2, 12, 2 * H), torch.randint(0, V, (2, 12)))
    assert kept == 1000


def test_eagle3_full_vocabulary_writes_no_map(tiny, tmp_path):
    trainer = build_trainer(Eagle3Trainer, tiny, {})
    _perturbed(trainer)
    trainer.save(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert "d2t" not in saved and "t2d" not in saved and saved["lm_head.weight"].shape == (V, H)
    assert json.loads((tmp_path / "config.json").read_text())["draft_vocab_size"] == V
    net = _load_back(tmp_path, "eagle3", "eagle3", tiny)
    assert _same_logits(trainer.head.net, net, torch.randn(1, 10, 2 * H), torch.randint(0, V, (1, 10))) == V


def test_eagle1_saves_the_safeailab_layout_and_loads_back(tiny, tmp_path):
    trainer = build_trainer(EagleTrainer, tiny, {"bias": False})
    _perturbed(trainer)
    trainer.save(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    layer = ["post_attention_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
             "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
             "mlp.down_proj.weight"]
    assert set(saved) == {"fc.weight", *("layers.0." + k for k in layer)}  # no input_layernorm, norm or lm_head
    assert saved["fc.weight"].shape == (H, 2 * H)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["bias"] is False and config["num_hidden_layers"] == 1 and config["vocab_size"] == V
    net = _load_back(tmp_path, "eagle1", "eagle", tiny)
    assert _same_logits(trainer.head.net, net, torch.randn(2, 10, H), torch.randint(0, V, (2, 10))) == V

    trainer = build_trainer(EagleTrainer, tiny, {})
    trainer.save(tmp_path)
    assert load_file(str(tmp_path / "model.safetensors"))["fc.bias"].shape == (H,)
    assert json.loads((tmp_path / "config.json").read_text())["bias"] is True


def test_write_and_read_tables_are_inverse():
    for layout, table in WRITE_KEYS.items():
        assert len(set(table.values())) == len(table)
        assert {v: k for k, v in READ_KEYS[layout].items()} == table
    with pytest.raises(KeyError, match=r"no layout key for \['midlayer.fc.weight'\]"):
        rename({"midlayer.fc.weight": 1}, WRITE_KEYS["eagle3"])


@pytest.mark.parametrize("fmt", ["safeailab", "speculators"])
def test_the_plugins_loader_reads_what_the_trainer_writes(tiny, tmp_path, fmt):
    loader = pytest.importorskip("specdec_eagle.loader")
    trainer = build_trainer(Eagle3Trainer, tiny, {"draft_vocab_size": 512, "format": fmt, "layer_ids": "1,2,3"})
    _perturbed(trainer, seed=4)
    trainer.save(tmp_path)
    loaded, _ = loader.read_head(str(tmp_path), "eagle3")
    net = loaded.head
    net.embed_tokens = trainer.head.net.embed_tokens
    assert loaded.aux_layer_ids == (1, 2, 3)
    kept = _same_logits(trainer.head.net, net.eval(), torch.randn(1, 10, 3 * H), torch.randint(0, V, (1, 10)))
    assert kept == 512


def test_the_plugins_loader_reads_an_eagle1_head(tiny, tmp_path):
    loader = pytest.importorskip("specdec_eagle.loader")
    trainer = build_trainer(EagleTrainer, tiny, {})
    _perturbed(trainer, seed=5)
    trainer.save(tmp_path)
    loaded, _ = loader.read_head(str(tmp_path), "eagle")
    net = loaded.head
    net.embed_tokens, net.lm_head = trainer.head.net.embed_tokens, trainer.head.net.lm_head
    assert _same_logits(trainer.head.net, net.eval(), torch.randn(1, 10, H), torch.randint(0, V, (1, 10))) == V


# ---------------------------------------------------------------- the hook


def test_hook_registers_both_trainers_and_imports_no_training_code():
    import subprocess
    import sys

    from specdec import registry
    from specdec_eagle import training_hook

    code = ("import sys, specdec_eagle.training_hook; "
            "assert not [m for m in sys.modules if m.startswith(('specdec_tools', 'specdec_eagle.train'))"
            " and m != 'specdec_eagle.training_hook'], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    registered = "eagle3" in registry.available_trainers()  # once the plugin's __init__ imports the hook
    name = None if registered else specdec.register_plugin(training_hook, name="eagle_hook")
    try:
        assert registry.get_trainer_class("eagle3") is Eagle3Trainer
        assert registry.get_trainer_class("eagle") is EagleTrainer
    finally:
        if name:
            specdec.unregister_plugin(name)


def test_the_plugins_loader_reads_a_two_layer_eagle3_head(tiny, tmp_path):
    loader = pytest.importorskip("specdec_eagle.loader")
    trainer = build_trainer(Eagle3Trainer, tiny, {})
    trainer.save(tmp_path)
    loaded, _ = loader.read_head(str(tmp_path), "eagle3")
    assert loaded.head.cfg.num_aux_layers == 2 and loaded.aux_layer_ids == (1, 2)

"""Real EAGLE training on the bundled tiny target (CPU, seconds each): `specdec train --method eagle3 / eagle`
through the trainer hook, text run through the target (--online); the held-out loss falls, the draft vocabulary
is the training data's most frequent tokens, the saved directory has the published keys, and a run killed
mid-way resumes to the weights of an uninterrupted one."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specdec
from specdec.cli import main
from specdec_eagle.train import Eagle3Trainer, draft_vocab
from specdec_tools.train import CHECKPOINT, TargetInfo, build_trainer, held_out_split, train
from specdec_tools.train_data import OnlineData
from specdec_tools.train_loop import batch_indices

TINY = specdec.bundled_model("tiny")
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_FILES = [str(STDLIB / n) for n in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py")]


@pytest.fixture(scope="module", autouse=True)
def eagle_trainers():
    """The eagle trainers through the registry: the plugin's own hook when its __init__ has it, else the hook
    module registered by hand for these tests."""
    from specdec import registry

    if "eagle3" in registry.available_trainers():
        yield
        return
    from specdec_eagle import training_hook

    name = specdec.register_plugin(training_hook, name="eagle_training_hook")
    yield
    specdec.unregister_plugin(name)


@pytest.fixture(scope="module")
def online():
    return OnlineData(TINY, TEXT_FILES, seq_len=128)


def _losses(metrics: dict) -> list[float]:
    return [e["loss"] for e in metrics["eval_history"]]


def test_eagle3_learns_and_its_draft_vocabulary_is_the_datas_most_frequent_tokens(online, tmp_path):
    trainer = build_trainer(Eagle3Trainer, TargetInfo.from_path(TINY), {"draft_vocab_size": 512})
    steps, batch = 24, 4
    metrics = train(trainer, online, tmp_path, steps=steps, batch_size=batch, lr=3e-3, eval_every=8,
                    eval_fraction=0.1, progress=False)
    losses = _losses(metrics)
    assert losses[-1] < losses[0] - 0.3, losses
    held = metrics["held_out"]
    assert len(held["acceptance_per_position"]) == 5 and held["positions"] > 1000
    assert held["acceptance_per_position"][0] > 0.1
    assert held["mean_acceptance_length"] == pytest.approx(1 + sum(held["accepted_prefix_per_position"]), abs=1e-3)

    train_ids, _ = held_out_split(len(online), 0.1)
    cache: dict[int, list[int]] = {}
    seen = [i for step in range(steps) for i in batch_indices(train_ids, step, batch, 0, cache)]
    counts = torch.bincount(online.windows[seen].flatten(), minlength=4096)  # the tokens it trained on
    saved = load_file(str(tmp_path / "model.safetensors"))
    d2t, t2d = draft_vocab(counts, 512)
    assert torch.equal(saved["d2t"], d2t) and torch.equal(saved["t2d"], t2d)
    ids = torch.arange(512) + saved["d2t"]
    assert t2d[ids].all() and int(t2d.sum()) == 512  # t2d marks exactly the draft tokens
    assert counts[ids].min() >= counts[~t2d].max()  # each one at least as frequent as any token left out
    assert counts[ids].sum() > 0.8 * counts.sum()  # code: 512 of 4096 tokens cover most of the text
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 512
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json", "metrics.json",
                                                          "model.safetensors"]
    assert metrics["head"].startswith("EAGLE-3 head over target layers [1, 2]")


def _cli(out: Path, method: str, *options: str, steps: int) -> list[str]:
    argv = ["train", "--method", method, "--target", TINY, "--online", "--text", *TEXT_FILES, "--seq-len", "128",
            "--out", str(out), "--steps", str(steps), "--batch-size", "4", "--lr", "3e-3", "--eval-every",
            str(steps // 2), "--eval-fraction", "0.1", "--threads", "1", "--no-progress"]
    for o in options:
        argv += ["--option", o]
    return argv


def test_specdec_train_eagle_writes_a_safeailab_eagle1_head(tmp_path, capsys):
    assert main(_cli(tmp_path, "eagle", "acceptance_steps=3", steps=16)) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert _losses(metrics)[-1] < _losses(metrics)[0], _losses(metrics)
    assert len(metrics["held_out"]["acceptance_per_position"]) == 3 and metrics["hidden_states"] == ["last"]
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved["fc.weight"].shape == (256, 512) and saved["fc.bias"].shape == (256,)
    assert "layers.0.self_attn.q_proj.weight" in saved and not any("input_layernorm" in k for k in saved)
    assert json.loads((tmp_path / "config.json").read_text())["bias"] is True
    assert "specdec train --method eagle" in (tmp_path / "README.md").read_text()
    assert capsys.readouterr().out.splitlines()[0].startswith("method: eagle; 16 steps in ")


def test_specdec_train_eagle3_speculators_layout(tmp_path):
    assert main(_cli(tmp_path, "eagle3", "format=speculators", "layer_ids=0,1,3", "ttt_steps=2", steps=6)) == 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved["fc.weight"].shape == (256, 768) and saved["layers.0.self_attn.q_proj.weight"].shape == (256, 512)
    assert not any(k.startswith("midlayer.") for k in saved) and "d2t" not in saved  # full vocabulary: no map
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["hidden_states"] == ["0", "1", "3", "last"] and metrics["options"]["ttt_steps"] == 2


def test_eagle3_resumes_to_the_weights_and_vocabulary_of_an_uninterrupted_run(tmp_path):
    class Interrupted(Eagle3Trainer):
        calls, interrupt_at = 0, None

        def loss(self, batch):
            if self.head.training:
                Interrupted.calls += 1
                if Interrupted.calls == Interrupted.interrupt_at:
                    raise KeyboardInterrupt
            return super().loss(batch)

    data = OnlineData(TINY, TEXT_FILES[:2], seq_len=64)
    target = TargetInfo.from_path(TINY)
    options = {"draft_vocab_size": 300, "ttt_steps": 2, "acceptance_steps": 2}
    kw = dict(steps=6, batch_size=2, lr=3e-3, eval_every=3, save_every=2, eval_fraction=0.2, progress=False)
    full = train(build_trainer(Interrupted, target, options), data, tmp_path / "full", **kw)

    Interrupted.calls, Interrupted.interrupt_at = 0, 5  # killed during step 5: the last checkpoint is step 4's
    with pytest.raises(KeyboardInterrupt):
        train(build_trainer(Interrupted, target, options), data, tmp_path / "cut", **kw)
    assert torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=False)["step"] == 4
    Interrupted.interrupt_at = None
    resumed = train(build_trainer(Interrupted, target, options), data, tmp_path / "cut", resume=True, **kw)
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(tmp_path / "cut" /
                                                                                  "model.safetensors"))
    assert a.keys() == b.keys() and {"d2t", "t2d"} <= a.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["training"]["resumed_from_step"] == 4 and resumed["held_out"] == full["held_out"]

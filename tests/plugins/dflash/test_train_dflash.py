"""Training DFlash drafts on the bundled tiny target (CPU, seconds): options, anchors, the batched block loss and the
acceptance estimate against a plain recomputation one block at a time through the inference forward, a real run
whose held-out loss falls, both published layouts loading back through the plugin's loader and drafting
losslessly, and `specdec train --method dflash` from the command line."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from specdec_dflash.loader import TargetInfo as DraftTarget
from specdec_dflash.loader import read_draft
from specdec_dflash.train import ACCEPTANCE_CHUNK, DFlashTrainer, DFlashTrainOptions, loss_weights, pick_anchors

import specdec
from specdec.cli import main
from specdec_tools.train import LAST, Batch, TargetInfo, build_trainer, train
from specdec_tools.train_data import OnlineData

TINY = specdec.bundled_model("tiny")  # 4 layers, hidden 256, vocabulary 4096
H, V = 256, 4096
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_FILES = [str(STDLIB / n) for n in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py")]
GREEDY = specdec.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PROMPTS = ["def split(self, text):\n    ", "import os\nimport sys\n\n\nclass "]


@pytest.fixture(scope="module")
def tiny():
    return TargetInfo.from_path(TINY)


@pytest.fixture(scope="module")
def online():
    return OnlineData(TINY, TEXT_FILES, seq_len=128)


@pytest.fixture(scope="module")
def baseline():
    return [o.token_ids for o in specdec.LLM(TINY, device="cpu").generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("kw, message", [
    ({"block_size": 1}, "block_size=1 is invalid: it must be an int >= 2 (a block holds the bonus token and at "
                        "least one mask)."),
    ({"target_layer_ids": "1,1"}, "target_layer_ids='1,1' is invalid: it must be distinct target decoder layer "
                                  "ids >= 0 (z-lab ids: the outputs of those layers), e.g. target_layer_ids=1,2 or "
                                  "[1, 2]."),
    ({"acceptance_steps": 8}, "acceptance_steps=8 is invalid: a block of block_size=8 drafts at most 7 tokens."),
    ({"loss_decay": -1.0}, "loss_decay=-1.0 is invalid: it must be a finite number >= 0 (block index j weighs "
                           "exp(-(j - 1) / loss_decay); 0 = all alike)."),
    ({"format": "hf"}, "format='hf' is invalid: it must be one of z-lab, speculators."),
])
def test_options_are_checked(kw, message):
    with pytest.raises(ValueError) as exc:
        DFlashTrainOptions(**kw)
    assert str(exc.value) == message


def test_trainer_defaults_and_target_checks(tiny):
    t = build_trainer(DFlashTrainer, tiny, {})
    assert t.target_layer_ids == (2,) and t.layer_ids == (3,) and t.hidden_keys() == ["3", LAST]
    assert t.mask_token_id == V - 1 and t.acceptance_steps == 7
    t = build_trainer(DFlashTrainer, tiny, {"num_layers": 3, "target_layer_ids": "2,0", "mask_token_id": 7})
    assert t.target_layer_ids == (2, 0) and t.layer_ids == (1, 3) and t.mask_token_id == 7
    with pytest.raises(ValueError, match=r"target_layer_ids \[4\] are invalid .* it has 4 decoder layers"):
        build_trainer(DFlashTrainer, tiny, {"target_layer_ids": "4"})
    with pytest.raises(ValueError, match="mask_token_id=4096 is invalid"):
        build_trainer(DFlashTrainer, tiny, {"mask_token_id": 4096})


def _batch(b=3, t=14, seed=0, keys=("2", "3")):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 10:] = False  # a padded row
    learn = valid.clone()
    learn[2, 3:6] = False  # tokens not to learn (a prompt)
    hidden = {k: torch.randn(b, t, H, generator=g) for k in (*keys, LAST)}
    return Batch(ids, valid, learn, hidden)


def test_anchors_are_distinct_eligible_positions():
    batch = _batch(t=14)
    anchors, ok = pick_anchors(batch, 20, torch.Generator().manual_seed(3))
    assert anchors.shape == ok.shape == (3, 14)
    learn = batch.valid & batch.loss_mask
    for r in range(3):
        real = anchors[r][ok[r]].tolist()
        eligible = [a for a in range(1, 13) if learn[r, a + 1]]
        assert real == eligible  # more slots than eligible positions: all of them, ascending
    anchors, ok = pick_anchors(batch, 4, torch.Generator().manual_seed(3))
    assert ok.all() and (anchors.diff(dim=1) > 0).all() and (anchors >= 1).all()


def _perturb(trainer, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in trainer.head.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)


@pytest.mark.parametrize("soft", [True, False])
def test_loss_equals_a_plain_recomputation_one_block_at_a_time(tiny, soft):
    """Each block through the draft's inference forward over the context positions < a only (the proposer's
    view: the bonus token's own features are not in it), scored against the target's distribution at a + j (its
    LM head after a + j - 1) or the data's token there, weighted exp(-(j-1)/decay), mean over learnable targets."""
    trainer = build_trainer(DFlashTrainer, tiny, {"target_layer_ids": "1,2", "soft_labels": soft, "block_size": 5,
                                                  "loss_decay": 2.0})
    _perturb(trainer)
    batch = _batch()
    anchors, ok = pick_anchors(batch, 6, torch.Generator().manual_seed(1))
    draft = trainer.head.draft
    feats = torch.cat([batch.hidden["2"], batch.hidden["3"]], -1)
    lm = trainer.target.lm_head_weight()
    num, den = 0.0, 0.0
    with torch.no_grad():
        got = trainer.anchor_loss(batch, anchors, ok)
        for r in range(3):
            for a in anchors[r][ok[r]].tolist():
                block = torch.tensor([[int(batch.input_ids[r, a])] + [V - 1] * 4])
                logits = draft(feats[r: r + 1, :a], block)[0]
                for j in range(1, 5):
                    p = a + j
                    if p >= 14 or not (batch.valid[r, p] and batch.loss_mask[r, p]):
                        continue
                    logp = F.log_softmax(logits[j], -1)
                    if soft:
                        ce = -(F.softmax(batch.hidden[LAST][r, p - 1] @ lm.T, -1) * logp).sum()
                    else:
                        ce = -logp[batch.input_ids[r, p]]
                    w = math.exp(-(j - 1) / 2.0)
                    num, den = num + w * ce, den + w
    assert den > 10
    torch.testing.assert_close(got, num / den, atol=1e-5, rtol=1e-5)
    assert torch.allclose(loss_weights(5, 2.0), torch.tensor([1.0, math.exp(-0.5), math.exp(-1), math.exp(-1.5)]))
    assert torch.equal(loss_weights(5, 0), torch.ones(4))


def test_acceptance_equals_a_plain_recomputation(tiny, monkeypatch):
    """Draft j of the block at a against the target's greedy token after a + j - 1; the target's "greedy" token
    is planted (one-hot logits read from the last state's first feature) to equal the plain draft 1 at even
    anchors, so rows hold both outcomes."""
    trainer = build_trainer(DFlashTrainer, tiny, {"acceptance_steps": 3})
    _perturb(trainer, seed=1)
    batch = _batch(t=40, keys=("3",))  # 36 anchors per full row: two chunks of ACCEPTANCE_CHUNK
    draft = trainer.head.draft
    monkeypatch.setattr(trainer.head, "target_logits", lambda last: F.one_hot(last[..., 0].long(), V).float())
    plain = {}
    with torch.no_grad():
        batch.hidden[LAST][..., 0] = torch.randint(0, V, (3, 40)).float()
        for r in range(3):
            for a in range(1, 37):
                block = torch.tensor([[int(batch.input_ids[r, a])] + [V - 1] * 7])
                plain[r, a] = draft(batch.hidden["3"][r: r + 1, :a], block)[0, 1:4].argmax(-1)
                if a % 2 == 0:
                    batch.hidden[LAST][r, a, 0] = float(plain[r, a][0])
        greedy = batch.hidden[LAST][..., 0].long()
        got = trainer.acceptance(batch)
    want = [plain[r, a] == greedy[r, a: a + 3] for lo in range(1, 37, ACCEPTANCE_CHUNK) for r in range(3)
            for a in range(lo, min(lo + ACCEPTANCE_CHUNK, 37)) if batch.valid[r, a + 3]]
    assert got.shape == (36 + 6 + 36, 3) and 0 < got[:, 0].float().mean() < 1
    assert torch.equal(got, torch.stack(want))


def test_training_lowers_the_held_out_loss_and_both_layouts_draft_losslessly(online, tiny, tmp_path, baseline):
    trainer = build_trainer(DFlashTrainer, tiny, {"target_layer_ids": "1,2", "anchors": 16})
    metrics = train(trainer, online, tmp_path / "zlab", steps=20, batch_size=4, lr=3e-3, eval_every=5,
                    eval_fraction=0.1, progress=False)
    losses = [e["loss"] for e in metrics["eval_history"]]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.25, losses
    held = metrics["held_out"]
    assert len(held["acceptance_per_position"]) == 7 and held["positions"] > 500
    assert metrics["head"].startswith("DFlash draft over target layers [1, 2], 1 decoder layer(s), block size 8")
    assert "Held-out acceptance estimate" in (tmp_path / "zlab" / "README.md").read_text()
    spec = build_trainer(DFlashTrainer, tiny, {"target_layer_ids": "1,2", "format": "speculators"})
    spec._head = trainer.head
    (tmp_path / "spec").mkdir()
    spec.save(tmp_path / "spec")

    zlab = json.loads((tmp_path / "zlab" / "config.json").read_text())
    assert zlab["architectures"] == ["DFlashDraftModel"] and zlab["num_target_layers"] == 4
    assert zlab["dflash_config"] == {"block_size": 8, "target_layer_ids": [1, 2], "mask_token_id": V - 1}
    sc = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert sc["speculators_model_type"] == "dflash" and sc["aux_hidden_state_layer_ids"] == [2, 3]
    saved = load_file(str(tmp_path / "zlab" / "model.safetensors"))
    assert saved.keys() == load_file(str(tmp_path / "spec" / "model.safetensors")).keys()
    assert saved["fc.weight"].shape == (H, 2 * H) and not any("embed" in k or "lm_head" in k for k in saved)

    info = DraftTarget(H, V, 4)
    feats, block = torch.randn(1, 9, 2 * H), torch.tensor([[17] + [V - 1] * 7])
    with torch.no_grad():
        want = trainer.head.draft(feats, block)
    for layout, name in (("z-lab", "zlab"), ("speculators", "spec")):
        loaded = read_draft(str(tmp_path / name), info)
        assert loaded.layout == layout and loaded.draft.cfg == trainer.head.draft.cfg
        loaded.draft.embed_tokens, loaded.draft.lm_head = trainer.head.draft.embed_tokens, trainer.head.draft.lm_head
        with torch.no_grad():
            assert torch.equal(loaded.draft(feats, block), want)
        llm = specdec.LLM(TINY, {"method": "dflash", "num_speculative_tokens": 7,
                                 "speculation_policy": "fixed", "model": str(tmp_path / name)},
                          device="cpu")
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == baseline
        assert llm.proposer.layout == layout and llm.stats.num_draft_tokens > 0


def test_specdec_train_dflash_from_the_command_line(tmp_path, capsys):
    argv = ["train", "--method", "dflash", "--target", TINY, "--online", "--text", *TEXT_FILES[:2], "--seq-len", "64",
            "--out", str(tmp_path), "--steps", "4", "--batch-size", "2", "--eval-every", "2", "--eval-fraction",
            "0.2", "--threads", "1", "--no-progress", "--option", "format=speculators", "--option", "block_size=4",
            "--option", "num_layers=2"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("method: dflash; 4 steps in ")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["block_size"] == 4 and config["transformer_layer_config"]["num_hidden_layers"] == 2
    assert config["aux_hidden_state_layer_ids"] == [2, 2]  # DFlash's default ids for 2 draft layers of 4: (1, 1)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert len(metrics["held_out"]["acceptance_per_position"]) == 3
    assert "specdec train --method dflash" in (tmp_path / "README.md").read_text()
    assert read_draft(str(tmp_path), DraftTarget(H, V, 4)).layout == "speculators"

"""Training Medusa heads on the bundled tiny target (CPU, seconds): options, the loss's targets against a plain
recomputation, the acceptance estimate, both published layouts loading back to the trained heads' logits, a real
run whose held-out loss falls, and `specdec train --method medusa` from the command line."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import specdec
from specdec.cli import main
from specdec_medusa.loader import load_medusa
from specdec_medusa.train import MedusaTrainer, MedusaTrainOptions, frequent_tokens
from specdec_tools.train import LAST, Batch, TargetInfo, build_trainer, train
from specdec_tools.train_data import OnlineData

TINY = specdec.bundled_model("tiny")  # 4 layers, hidden 256, vocabulary 4096
H, V = 256, 4096
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_FILES = [str(STDLIB / n) for n in ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py")]


@pytest.fixture(scope="module")
def tiny():
    return TargetInfo.from_path(TINY)


@pytest.fixture(scope="module")
def online():
    return OnlineData(TINY, TEXT_FILES, seq_len=128)


@pytest.mark.parametrize("kw, message", [
    ({"num_heads": 0}, "num_heads=0 is invalid: it must be an int >= 1 (heads: the most drafts a step can take)."),
    ({"head_weight": 1.5}, "head_weight=1.5 is invalid: it must be a number in (0, 1] (head i's loss weight is "
                           "head_weight**i)."),
    ({"format": "hf"}, "format='hf' is invalid: it must be one of fasterdecoding, vllm."),
    ({"draft_vocab_size": 100}, "draft_vocab_size=100 needs format=vllm: only vLLM's layout has a truncated "
                                "vocabulary (token_map); FasterDecoding's heads project onto the whole vocabulary."),
])
def test_options_are_checked(kw, message):
    with pytest.raises(ValueError) as exc:
        MedusaTrainOptions(**kw)
    assert str(exc.value) == message


def _batch(b=2, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (b, t), generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 9:] = False
    return Batch(ids, valid, valid.clone(), {LAST: torch.randn(b, t, H, generator=g)})


def _random_heads(trainer, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in trainer.head.net.parameters():
            p.add_(torch.randn_like(p) * 0.05)


@pytest.mark.parametrize("soft", [True, False])
def test_loss_scores_head_i_against_the_token_i_plus_2_ahead(tiny, soft):
    trainer = build_trainer(MedusaTrainer, tiny, {"num_heads": 3, "soft_labels": soft})
    _random_heads(trainer)
    batch = _batch()
    x, lm_t = batch.hidden[LAST], trainer.head.target_lm_head
    net = trainer.head.net
    total = 0.0
    for i in range(3):
        h = x + F.silu(x @ net.weight[i, 0].T + net.bias[i, 0])
        logp = F.log_softmax(h @ net.lm_head[i].T, -1)
        losses = []
        for r in range(2):
            for t in range(12):
                if t + 2 + i < 12 and batch.valid[r, t + 2 + i]:
                    if soft:
                        p = F.softmax(x[r, t + 1 + i] @ lm_t.T, -1)
                        losses.append(-(p * logp[r, t]).sum())
                    else:
                        losses.append(-logp[r, t, batch.input_ids[r, t + 2 + i]])
        total = total + 0.8 ** i * torch.stack(losses).mean()
    want = total / (1 + 0.8 + 0.64)
    torch.testing.assert_close(trainer.loss(batch), want, atol=1e-5, rtol=1e-5)


def test_acceptance_compares_head_i_with_the_targets_greedy_token(tiny):
    trainer = build_trainer(MedusaTrainer, tiny, {"num_heads": 2})
    _random_heads(trainer)
    batch = _batch()
    got = trainer.acceptance(batch)
    x = batch.hidden[LAST]
    greedy = (x @ trainer.head.target_lm_head.T).argmax(-1)
    logits = trainer.head.net(x.reshape(-1, H)).view(2, 2, 12, V).argmax(-1)  # [N, B, T]
    rows = [[bool(logits[i, r, t] == greedy[r, t + 1 + i]) for i in range(2)]
            for r in range(2) for t in range(10) if batch.valid[r, t + 2]]
    assert got.tolist() == rows
    # untrained heads start as the target's LM head: head 0 guesses the token after the bonus as the bonus itself
    fresh = build_trainer(MedusaTrainer, tiny, {"num_heads": 2}).acceptance(batch)
    assert fresh[:, 0].tolist() == [bool(greedy[r, t] == greedy[r, t + 1]) for r in range(2) for t in range(10)
                                    if batch.valid[r, t + 2]]


@pytest.mark.parametrize("options", [{"num_heads": 3, "num_layers": 2},
                                     {"num_heads": 2, "format": "vllm", "num_layers": 2},
                                     {"num_heads": 3, "format": "vllm", "draft_vocab_size": 300}])
def test_saved_layouts_load_back_to_the_trained_heads(tiny, tmp_path, options):
    trainer = build_trainer(MedusaTrainer, tiny, options)
    _random_heads(trainer)
    trainer.head.token_counts += torch.randint(0, 50, (V,))
    trainer.save(tmp_path)
    loaded = load_medusa(str(tmp_path), H, V)
    assert loaded.layout == options.get("format", "fasterdecoding")
    x = torch.randn(6, H)
    want = trainer.head.net(x)  # [N, 6, V]
    got = loaded.heads(x)
    if "draft_vocab_size" in options:
        tm = frequent_tokens(trainer.head.token_counts, 300)
        assert torch.equal(loaded.heads.token_map, tm) and tm.tolist() == sorted(tm.tolist())
        counts = trainer.head.token_counts
        kept = torch.zeros(V, dtype=torch.bool)
        kept[tm] = True
        assert counts[tm].min() >= counts[~kept].max()
        want = want[..., tm]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == ({"config.json", "medusa_lm_head.safetensors"} if "format" not in options
                     else {"config.json", "model.safetensors"})
    if "format" not in options:  # FasterDecoding: one shared block per head, written once per layer
        sd = load_file(str(tmp_path / "medusa_lm_head.safetensors"))
        assert torch.equal(sd["1.0.linear.weight"], sd["1.1.linear.weight"]) and sd["1.2.weight"].shape == (V, H)
        assert json.loads((tmp_path / "config.json").read_text())["medusa_num_layers"] == 2


def test_training_lowers_the_held_out_loss_and_the_heads_draft(online, tmp_path):
    trainer = build_trainer(MedusaTrainer, TargetInfo.from_path(TINY), {"num_heads": 3})
    metrics = train(trainer, online, tmp_path, steps=20, batch_size=4, lr=3e-3, eval_every=10, eval_fraction=0.1,
                    progress=False)
    losses = [e["loss"] for e in metrics["eval_history"]]
    assert losses[-1] < losses[0] - 0.2, losses
    held = metrics["held_out"]
    assert len(held["acceptance_per_position"]) == 3 and held["positions"] > 500
    # chance is 1/1024; 20 steps reach ~0.15 (0.148 on the H200, where the matmuls round differently)
    assert held["acceptance_per_position"][0] > 0.1
    assert metrics["head"].startswith("Medusa-1 heads: 3 heads of 1 residual block(s)")
    card = (tmp_path / "README.md").read_text()
    assert "Held-out acceptance estimate" in card
    llm = specdec.LLM(TINY, {"method": "medusa", "num_speculative_tokens": 3,
                             "speculation_policy": "fixed", "model": str(tmp_path)}, device="cpu")
    params = specdec.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompt = "def split(self, text):\n    "
    assert llm.generate([prompt], params)[0].token_ids == specdec.LLM(TINY, device="cpu").generate(
        [prompt], params)[0].token_ids
    assert llm.stats.num_accepted_tokens > 0


def test_specdec_train_medusa_from_the_command_line(tmp_path, capsys):
    argv = ["train", "--method", "medusa", "--target", TINY, "--online", "--text", *TEXT_FILES[:2], "--seq-len", "64",
            "--out", str(tmp_path), "--steps", "4", "--batch-size", "2", "--eval-every", "2", "--eval-fraction",
            "0.2", "--threads", "1", "--no-progress", "--option", "format=vllm", "--option", "num_heads=2",
            "--option", "draft_vocab_size=500"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("method: medusa; 4 steps in ")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_heads"] == 2 and config["truncated_vocab_size"] == 500 and config["vocab_size"] == V
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved["lm_heads.1.weight"].shape == (500, H) and saved["token_map"].shape == (500,)
    assert "specdec train --method medusa" in (tmp_path / "README.md").read_text()
    assert load_medusa(str(tmp_path), H, V).layout == "vllm"

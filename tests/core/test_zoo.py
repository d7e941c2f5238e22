"""Smoke test of the training recipe (`specdec_tools.zoo`, run as `python -m specdec.zoo`): a few steps on a
few stdlib files, on CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specdec_tools import zoo


def test_split_is_a_stable_function_of_the_path():
    assert zoo.split_of("asyncio/base_events.py") == zoo.split_of("asyncio/base_events.py")
    splits = [zoo.split_of(f"pkg/module_{i}.py") for i in range(4000)]
    held, valid = splits.count("held-out") / 40, splits.count("valid") / 40  # percent
    assert abs(held - zoo.HELD_OUT_PERCENT) < 1.5 and abs(valid - zoo.VALID_PERCENT) < 1.5


def test_collect_files_skips_tests_and_generated_tables():
    splits = zoo.collect_files()
    rels = [rel for files in splits.values() for rel, _ in files]
    assert rels and len(rels) == len(set(rels))
    assert not [r for r in rels if "/test/" in f"/{r}" or "/tests/" in f"/{r}"]
    assert "encodings/cp1252.py" not in rels  # a generated charmap table
    assert "encodings/utf_8.py" in rels
    assert all(zoo.split_of(rel) == name for name, files in splits.items() for rel, _ in files)


def test_tiny_presets_fit_the_package():
    class _Tok:  # build_model only needs the size and the EOS id
        eos_token_id = 0

        def __len__(self) -> int:
            return 4096

    sizes = {}
    for name in ("tiny", "tiny-draft"):
        model = zoo.build_model(zoo.PRESETS[name], _Tok())
        sizes[name] = sum(p.numel() for p in model.parameters())
    assert sizes["tiny"] * 2 <= 7 * 2**20  # float16 safetensors
    assert 5 <= sizes["tiny"] / sizes["tiny-draft"] <= 10


def test_recipe_trains_saves_and_reloads(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    argv = ["--preset", "micro", "micro-draft", "--out", str(tmp_path), "--files", "6", "--max-steps", "3",
            "--device", "cpu"]
    assert zoo.main(argv) == 0
    for name in ("micro", "micro-draft"):
        out = tmp_path / name
        info = json.loads((out / "metrics.json").read_text())
        assert info["training"]["steps"] == 3
        assert set(info["metrics"]) == {"train", "valid", "held-out"}
        assert 0.0 <= info["metrics"]["held-out"]["accuracy"] <= 1.0
        assert "python -m specdec.zoo --preset micro micro-draft" in (out / "README.md").read_text()
        tok = AutoTokenizer.from_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out).float().eval()
        ids = tok("def f(x):\n    return x\n", return_tensors="pt").input_ids
        assert tok.decode(ids[0]) == "def f(x):\n    return x\n"
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
        assert torch.isfinite(logits).all()
    # the draft is distilled from the target built before it in the same run
    draft = json.loads((tmp_path / "micro-draft" / "metrics.json").read_text())
    assert draft["training"]["teacher"] == "micro"
    assert 0.0 <= draft["metrics"]["held-out"]["agreement_with_teacher"] <= 1.0
    assert "Distilled from `micro`" in (tmp_path / "micro-draft" / "README.md").read_text()
    micro = AutoModelForCausalLM.from_pretrained(tmp_path / "micro").float().eval()
    tokens = np.arange(200) % 50
    assert zoo.agreement(micro, micro, tokens, seq_len=16) == 1.0
    disagree = zoo.agreement(model, micro, tokens, seq_len=16)  # model: the draft, loaded above
    x = torch.as_tensor(tokens[:16 * 12]).view(12, 16)
    with torch.no_grad():
        want = (model(input_ids=x).logits.argmax(-1) == micro(input_ids=x).logits.argmax(-1)).float().mean().item()
    assert disagree == pytest.approx(want)
    target = json.loads((tmp_path / "micro" / "metrics.json").read_text())
    assert 0.0 <= target["metrics"]["held-out"]["copy_accuracy"] <= 1.0
    assert "50% of each batch copy windows" in (tmp_path / "micro" / "README.md").read_text()
    assert "Copy accuracy (held-out)" in (tmp_path / "micro" / "README.md").read_text()
    assert target["training"]["teacher"] is None and "agreement_with_teacher" not in target["metrics"]["held-out"]
    # the draft reuses the target's tokenizer, trained once per family
    assert (tmp_path / "micro" / "tokenizer.json").read_text() == (
        tmp_path / "micro-draft" / "tokenizer.json"
    ).read_text()
    # a draft rebuilt alone, distilled from the saved target, with its tokenizer
    again = tmp_path / "again"
    argv = ["--preset", "micro-draft", "--out", str(again), "--files", "6", "--max-steps", "2", "--device", "cpu",
            "--teacher", str(tmp_path / "micro")]
    assert zoo.main(argv) == 0
    info = json.loads((again / "metrics.json").read_text())
    assert info["training"]["teacher"] == "micro" and "agreement_with_teacher" in info["metrics"]["held-out"]
    assert (again / "tokenizer.json").read_text() == (tmp_path / "micro" / "tokenizer.json").read_text()
    with pytest.raises(SystemExit):
        zoo.main(["--preset", "micro-draft", "--out", str(again), "--teacher", str(tmp_path / "nothing")])
    assert f"--teacher {tmp_path / 'nothing'}: no saved model there (config.json missing)" in capsys.readouterr().err


def test_copy_windows_repeat_each_window_start():
    batch = torch.arange(20).view(2, 10)
    got = zoo.copy_windows(batch, torch.tensor([3, 5]))
    assert got.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 10, 11, 12, 13, 14]]


def test_copy_accuracy_scores_the_repeat_half():
    class Copier(torch.nn.Module):
        """Predicts, at each position, the token that followed the earlier occurrence of the current one."""

        def __init__(self, vocab: int):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.vocab = vocab

        def forward(self, input_ids):
            b, t = input_ids.shape
            logits = torch.zeros(b, t, self.vocab)
            half = t // 2
            for j in range(half - 1, t - 1):  # the second copy starts at position half
                logits[torch.arange(b), j, input_ids[:, j - half + 1]] = 1.0
            return type("Out", (), {"logits": logits})()

    tokens = np.random.default_rng(0).integers(0, 50, 400)
    assert zoo.copy_accuracy(Copier(50), tokens, seq_len=16, max_windows=8) == 1.0

    class Shifted(Copier):  # copies from one position too late: scores only where tokens repeat by chance
        def forward(self, input_ids):
            return super().forward(input_ids.roll(1, dims=1))

    assert zoo.copy_accuracy(Shifted(50), tokens, seq_len=16, max_windows=8) < 0.2


def test_unknown_preset_is_refused():
    with pytest.raises(SystemExit):
        zoo.main(["--preset", "huge", "--out", "x"])


def test_distill_loss_is_cross_entropy_against_the_teacher():
    """Against itself a model scores the entropy of its own distributions; any other student more."""

    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, input_ids):
            return type("Out", (), {"logits": self.logits})()

    torch.manual_seed(0)
    t_logits = torch.randn(2, 5, 7)
    batch = torch.zeros(2, 6, dtype=torch.long)
    p = torch.softmax(t_logits, -1)
    entropy = -(p * torch.log(p)).sum(-1).mean()
    torch.testing.assert_close(zoo._distill_loss(t_logits, Fixed(t_logits), batch), entropy)
    assert zoo._distill_loss(torch.randn(2, 5, 7), Fixed(t_logits), batch) > entropy + 0.1


@pytest.mark.parametrize("before", [None, "false", "1"])
def test_encoding_runs_on_every_core_and_leaves_the_setting_as_it_was(monkeypatch, before):
    """encode_files turns the tokenizers library's pool on for its batches (TOKENIZERS_PARALLELISM=false made the
    bench corpus a one-core job) and puts the user's setting back; the stream is the same either way."""
    import os

    from transformers import AutoTokenizer

    from specdec import bundled_model

    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    tok = AutoTokenizer.from_pretrained(bundled_model("tiny"))
    seen = []
    backend = tok.backend_tokenizer

    class Probe:  # records the setting each batch call ran under
        def encode_batch_fast(self, texts, add_special_tokens):
            seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
            return backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    texts = ["def f(x):\n    return x\n", "import os\n"] * 3
    want = np.concatenate([np.asarray(tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
                           for t in texts])
    monkeypatch.setattr(type(tok), "backend_tokenizer", property(lambda self: Probe()))
    got = zoo.encode_files(tok, texts, chunk=4)
    assert got.tolist() == want.tolist() and seen == ["true", "true"]
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before

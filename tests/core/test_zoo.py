"""Smoke test of the training recipe (`specdec.zoo`): a few steps on a few stdlib files, on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import zoo


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


def test_recipe_trains_saves_and_reloads(tmp_path):
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
    # the draft reuses the target's tokenizer, trained once per family
    assert (tmp_path / "micro" / "tokenizer.json").read_text() == (
        tmp_path / "micro-draft" / "tokenizer.json"
    ).read_text()


def test_unknown_preset_is_refused():
    with pytest.raises(SystemExit):
        zoo.main(["--preset", "huge", "--out", "x"])

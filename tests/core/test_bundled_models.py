"""The bundled models (`tiny`, `tiny-draft`): they load through the public API, share one tokenizer,
and predict held-out standard-library code above a stated floor, measured here on this Python's files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specdec
import specdec.models
from specdec_tools import zoo

# Greedy next-token accuracy on the first held-out stdlib files of this Python (8192 tokens in 512-token
# windows, float32 on CPU). Measured on Python 3.11.7: tiny 0.471, tiny-draft 0.319 (an untrained model
# scores about 0.00). The floors sit a little below, so another Python version's files or another BLAS
# still pass while a broken or mis-tokenised model does not.
ACCURACY_FLOOR = {"tiny": 0.42, "tiny-draft": 0.27}
EVAL_TOKENS = 8192


@pytest.fixture(scope="module")
def held_out_text() -> list[str]:
    files = zoo.collect_files()["held-out"]
    assert files, "no held-out stdlib files found"
    texts, size = [], 0
    for _, text in files:  # sorted by path, so the same files on every run
        texts.append(text)
        size += len(text)
        if size > 6 * EVAL_TOKENS:  # >= ~2 characters per token
            break
    return texts


@pytest.mark.parametrize("name", specdec.models.BUNDLED_LMS)
def test_bundled_model_is_a_complete_small_folder(name):
    path = Path(specdec.bundled_model(name))
    assert path.is_dir() and path.parent == Path(specdec.models.__file__).resolve().parent
    for f in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "metrics.json"):
        assert (path / f).is_file(), f
    assert sum(f.stat().st_size for f in path.iterdir()) <= 8 * 2**20
    card = (path / "README.md").read_text()
    assert "python -m specdec.zoo --preset tiny tiny-draft" in card


def test_unknown_bundled_model_lists_the_choices():
    with pytest.raises(ValueError, match="tiny, tiny-draft, tiny-eagle3"):
        specdec.bundled_model("huge")


def test_missing_files_say_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(specdec.models, "_REQUIRED_FILES", ("config.json", "not-there.bin"))
    with pytest.raises(FileNotFoundError, match="python -m specdec.zoo --preset tiny tiny-draft"):
        specdec.bundled_model("tiny")


def test_target_and_draft_share_the_tokenizer():
    tiny, draft = (Path(specdec.bundled_model(n)) for n in ("tiny", "tiny-draft"))
    assert (tiny / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
    vocab = [json.loads((p / "config.json").read_text())["vocab_size"] for p in (tiny, draft)]
    assert vocab[0] == vocab[1]


@pytest.mark.parametrize("name", specdec.models.BUNDLED_LMS)
def test_held_out_next_token_accuracy_is_above_the_floor(name, held_out_text):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = specdec.bundled_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).float().eval()
    tokens = zoo.encode_files(tokenizer, held_out_text)[: EVAL_TOKENS + 1]
    assert len(tokens) == EVAL_TOKENS + 1
    with torch.no_grad():
        result = zoo.evaluate(model, tokens, seq_len=512)
    assert result["tokens"] == EVAL_TOKENS
    assert result["accuracy"] > ACCURACY_FLOOR[name], (name, result)


@pytest.mark.parametrize("name", specdec.models.BUNDLED_LMS)
def test_bundled_models_hold_a_file_and_an_edit_of_it(name):
    """Issue 20: a 2048-token context, so a grounded edit of a real file fits (709-token prompts were refused
    at 512): a held-out file of 1400-1800 tokens, then its first lines again, decoded with and without
    ngram drafts to the same tokens. (How well these 3.4M-parameter models copy is on their cards.)"""
    path = str(specdec.bundled_model(name))
    assert json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"] >= 2048
    base = specdec.LLM(path, device="cpu", max_num_seqs=1)
    ids = next(ids for _, t in zoo.collect_files()["held-out"] if 1400 < len(ids := base.tokenizer.encode(t)) < 1800)
    prompt = ids + ids[:64]
    params = specdec.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    want = base.generate([prompt], params, use_tqdm=False)[0].token_ids
    spec = specdec.LLM(path, device="cpu", max_num_seqs=1,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert spec.generate([prompt], params, use_tqdm=False)[0].token_ids == want
    assert len(want) == 32


@pytest.mark.parametrize("name", specdec.models.BUNDLED_HEADS)
def test_bundled_head_is_a_small_complete_folder_with_its_card(name):
    path = Path(specdec.bundled_model(name))
    for f in ("config.json", "model.safetensors", "README.md", "metrics.json"):
        assert (path / f).is_file(), f
    assert sum(f.stat().st_size for f in path.iterdir()) <= 3 * 2**20
    card = (path / "README.md").read_text()
    assert specdec.models.HEAD_REBUILD_COMMANDS[name].split(" --")[0] in card and "Held-out acceptance estimate" in card


def test_bundled_eagle3_head_is_the_tiny_targets_default_and_lossless():
    pytest.importorskip("specdec_eagle", reason="specdec-plugin-eagle is not installed")
    prompt = "    def __new__(mcls, name, bases, namespace, /, **kwargs):\n        abstracts = {name"
    params = specdec.SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    tiny = specdec.bundled_model("tiny")
    want = specdec.LLM(tiny, device="cpu").generate([prompt], params)[0].token_ids
    llm = specdec.LLM(tiny, {"method": "eagle3", "num_speculative_tokens": 3}, device="cpu")
    assert llm.generate([prompt], params)[0].token_ids == want
    # A trained head, not a random one: most steps accept at least one draft (about 2.5 tokens a step on
    # held-out code when this was written; a random head accepts almost none).
    assert llm.stats.mean_acceptance_length > 1.5

"""Data sets of ``specdec extract``: each accepted format, its loss mask, and the errors for the others."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.loading import load_tokenizer
from specdec_extract_hs.data import ACCEPTED, load_data

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(specdec.bundled_model("tiny"))


@pytest.fixture
def chat_tok(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = TEMPLATE
    return t


def _jsonl(path: Path, *objs) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def _learnt(tok, item) -> str:
    return tok.decode(item.token_ids[item.loss_mask == 1].tolist())


def test_text_files_are_windowed_with_mask_one(tok, tmp_path):
    text = "def f(x):\n    return x * 2\n" * 20
    (tmp_path / "b.py").write_text(text)
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / ".hidden").write_text("skipped")
    data = load_data(tmp_path, tok, 50)
    ids = tok.encode(text)
    assert data.num_files == 2
    assert data.items[0].token_ids.tolist() == tok.encode("hello")  # sorted paths: a.txt first
    windows = [it.token_ids.tolist() for it in data.items[1:]]
    assert [len(w) for w in windows[:-1]] == [50] * (len(windows) - 1) and sum(windows, []) == ids
    assert all(it.loss_mask.all() for it in data.items)


def test_prompt_response_masks_the_response(tok, tmp_path):
    f = _jsonl(tmp_path / "d.jsonl", {"prompt": "def add(a, b):", "response": " return a + b"}, {"prompt": "x = 1"})
    data = load_data(f, tok, 512)
    first = data.items[0]
    p, r = tok.encode("def add(a, b):"), tok.encode(" return a + b", add_special_tokens=False)
    assert first.token_ids.tolist() == p + r and first.loss_mask.tolist() == [0] * len(p) + [1] * len(r)
    assert not data.items[1].loss_mask.any() and data.prompt_only == 1
    gen = load_data(f, tok, 512, generate=True)
    assert gen.items[0].token_ids.tolist() == p and not gen.items[0].loss_mask.any() and gen.prompt_only == 0


def test_messages_without_template_join_role_lines(tok, tmp_path):
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure"}]
    f = _jsonl(tmp_path / "c.jsonl", {"messages": conv})
    item = load_data(f, tok, 512).items[0]
    assert tok.decode(item.token_ids.tolist()) == "user: hi\nassistant: hello\nuser: more\nassistant: sure\n"
    assert _learnt(tok, item) == "hello\nsure\n"
    gen = load_data(f, tok, 512, generate=True).items[0]  # the last answer is the target's to write
    assert tok.decode(gen.token_ids.tolist()) == "user: hi\nassistant: hello\nuser: more\nassistant: "
    assert _learnt(tok, gen) == "hello\n"


def test_messages_with_chat_template_mask_assistant_turns(chat_tok, tmp_path):
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]
    f = _jsonl(tmp_path / "c.jsonl", {"messages": conv})
    item = load_data(f, chat_tok, 512).items[0]
    assert chat_tok.decode(item.token_ids.tolist()) == chat_tok.apply_chat_template(conv, tokenize=False)
    assert _learnt(chat_tok, item) == "hello<|end|>"  # the turn's header is the prompt's; content and end are learnt
    gen = load_data(f, chat_tok, 512, generate=True).items[0]
    assert chat_tok.decode(gen.token_ids.tolist()) == "<|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    assert not gen.loss_mask.any()


def test_token_ids_npy_and_jsonl(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(10, dtype=np.int64))
    np.save(tmp_path / "two.npy", np.arange(12, dtype=np.int32).reshape(2, 6))
    _jsonl(tmp_path / "three.jsonl", {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]})
    data = load_data(tmp_path, None, 4)  # no tokenizer needed for ids
    assert [it.token_ids.tolist() for it in data.items] == [  # files in path order: one, three, two
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [5, 6, 7], [0, 1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    assert [it.loss_mask.tolist() for it in data.items[2:4]] == [[1, 1], [0, 1, 1]]
    assert all(it.loss_mask.all() for i, it in enumerate(data.items) if i != 3)


@pytest.mark.parametrize("name,content,message", [
    ("d.json", b"[1, 2]", "has an unknown format (.json files are not read). Accepted: "),
    ("d.bin", b"\x00\x01", "has an unknown format (.bin files are not read). Accepted: "),
    ("d.dat", b"\xff\xfe\xfd", "has an unknown format (not UTF-8 text). Accepted: "),
    ("d.txt", b"a\x00b", "has an unknown format (binary: it holds NUL bytes). Accepted: "),
])
def test_unknown_formats_name_the_file_and_the_accepted_ones(tok, tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError) as exc:
        load_data(tmp_path / name, tok, 64)
    assert str(exc.value) == f"data file {str(tmp_path / name)!r} {message}{ACCEPTED}."


@pytest.mark.parametrize("obj,message", [
    ({"question": "?"}, "has keys ['question']: expected one of \"text\", \"prompt\""),
    ({"messages": [{"role": "user"}]}, "\"messages\" must be a non-empty list of"),
    ({"input_ids": [1, "2"]}, "input_ids must be a list of ints"),
    ({"input_ids": [1, 2], "loss_mask": [1]}, "input_ids must be a list of ints (and loss_mask"),
    ([1, 2], "holds a JSON list, not an object"),
])
def test_bad_jsonl_lines_name_file_and_line(tok, tmp_path, obj, message):
    f = _jsonl(tmp_path / "d.jsonl", {"text": "fine"}, obj)
    with pytest.raises(ValueError) as exc:
        load_data(f, tok, 64)
    assert str(exc.value).startswith(f"data file {str(f)!r} line 2")
    assert message in str(exc.value)


def test_text_without_a_tokenizer_and_bad_arrays(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"holds text, but the target 'm' has no tokenizer: pass token ids"):
        load_data(tmp_path / "a.txt", None, 64, model="m")
    np.save(tmp_path / "f.npy", np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"holds a 1-D float32 array: token ids must be an integer array"):
        load_data(tmp_path / "f.npy", None, 64)
    with pytest.raises(FileNotFoundError, match=r"does not exist"):
        load_data(tmp_path / "missing", None, 64)

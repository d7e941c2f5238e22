"""Data sets for ``specdec extract``: files in, token sequences with loss masks out.

Accepted (a file, or a directory whose files are each read by their suffix, in sorted path order):

- text: any UTF-8 file (``.txt``, ``.md``, ``.py``...): one sequence, tokenised with the tokenizer's
  default special tokens, loss mask 1 everywhere, split into windows of ``max_model_len`` tokens;
- ``.jsonl``, one object per line: ``{"text": ...}`` (as a text file); ``{"prompt": ...}`` or
  ``{"prompt": ..., "response": ...}`` (mask 0 on the prompt, 1 on the response);
  ``{"messages": [{"role": ..., "content": ...}, ...]}`` (mask 1 on assistant turns, rendered with the
  tokenizer's chat template when it has one, else joined as ``"role: content"`` lines);
  ``{"input_ids": [...]}`` with an optional ``"loss_mask": [...]`` (default 1), windowed like text;
- ``.npy``: an integer array, 1-D (one token stream) or 2-D (one sequence per row), mask 1, windowed.

With ``generate`` (``--generate N``) each item is a prompt for the target to answer: a ``response``
and the trailing assistant turns of a conversation are dropped (the target writes its own), a
conversation is rendered with the template's generation prompt, and prompt masks are 0 except on
earlier assistant turns. Items longer than the limit are cut, and counted in :attr:`Data.num_cut`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Item", "Data", "load_data", "ACCEPTED"]

ACCEPTED = ('UTF-8 text files (one sequence each), a directory of such files, JSONL (.jsonl) with one object per '
            'line ({"text"}, {"prompt"}, {"prompt", "response"}, {"messages": [{"role", "content"}, ...]} or '
            '{"input_ids": [...]}), or token ids (.npy integer array, 1-D or 2-D)')
# Structured or binary formats someone may reasonably hand us, refused by name rather than read as text.
_REFUSED = {".json", ".parquet", ".arrow", ".csv", ".tsv", ".npz", ".pt", ".pth", ".bin", ".safetensors", ".pkl",
            ".pickle", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".h5", ".hdf5"}


@dataclass(slots=True)
class Item:
    """One sequence (or, with ``generate``, one prompt): ``token_ids`` ``[T]`` int64, ``loss_mask`` ``[T]`` uint8."""

    token_ids: np.ndarray
    loss_mask: np.ndarray


@dataclass(slots=True)
class Data:
    """The items of a data set, in order, and what loading it did."""

    items: list[Item] = field(default_factory=list)
    num_files: int = 0
    num_cut: int = 0  # structured items cut to the length limit
    num_empty: int = 0  # items with no tokens, left out
    prompt_only: int = 0  # {"prompt"} items without a response and without generate: all-zero masks

    def fingerprint(self) -> str:
        """sha256 over every item's tokens and mask: a resumed run checks it reads the same data."""
        h = hashlib.sha256()
        for it in self.items:
            h.update(len(it.token_ids).to_bytes(8, "little"))
            h.update(it.token_ids.astype("<i8").tobytes())
            h.update(it.loss_mask.astype(np.uint8).tobytes())
        return h.hexdigest()


def _unknown(path: Path, why: str) -> ValueError:
    return ValueError(f"data file {str(path)!r} has an unknown format ({why}). Accepted: {ACCEPTED}.")


def _files(path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"data path {str(path)!r} does not exist: pass a data file or a directory of them.")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise ValueError(f"data directory {str(path)!r} holds no files. Accepted: {ACCEPTED}.")
    return files


class _Loader:
    def __init__(self, tokenizer: Any, max_len: int, generate: bool, model: str) -> None:
        self.tok, self.max_len, self.generate, self.model = tokenizer, max_len, generate, model
        self.data = Data()

    # -- building items -------------------------------------------------------------------------
    def _add(self, ids: Any, mask: Any) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        mask = np.asarray(mask, dtype=np.uint8)
        if len(ids) == 0:
            self.data.num_empty += 1
            return
        if len(ids) > self.max_len:
            self.data.num_cut += 1
            ids, mask = ids[: self.max_len], mask[: self.max_len]
        self.data.items.append(Item(ids, mask))

    def _add_windows(self, ids: Any, mask: Any = None) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        mask = np.ones(len(ids), np.uint8) if mask is None else (np.asarray(mask) != 0).astype(np.uint8)
        if self.generate:
            mask = np.zeros(len(ids), np.uint8)  # a prompt: only the target's answer is learnt
        if len(ids) == 0:
            self.data.num_empty += 1
        for a in range(0, len(ids), self.max_len):
            self.data.items.append(Item(ids[a: a + self.max_len], mask[a: a + self.max_len]))

    def _encode(self, text: str, where: str, specials: bool = True) -> list[int]:
        if self.tok is None:
            raise ValueError(f"{where} holds text, but the target {self.model!r} has no tokenizer: pass token ids "
                             '(.npy, or JSONL {"input_ids": [...]}) or a model directory saved with its tokenizer.')
        return list(self.tok.encode(text, add_special_tokens=specials))

    # -- formats --------------------------------------------------------------------------------
    def file(self, path: Path) -> None:
        self.data.num_files += 1
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return self._jsonl(path)
        if suffix == ".npy":
            return self._npy(path)
        if suffix in _REFUSED:
            raise _unknown(path, f"{suffix} files are not read")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _unknown(path, "not UTF-8 text") from None
        if "\x00" in text:
            raise _unknown(path, "binary: it holds NUL bytes")
        self._add_windows(self._encode(text, f"data file {str(path)!r}"))

    def _npy(self, path: Path) -> None:
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise _unknown(path, f"not a readable .npy array: {exc}") from None
        if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
            raise ValueError(f"data file {str(path)!r} holds a {arr.ndim}-D {arr.dtype} array: token ids must be an "
                             "integer array, 1-D (one stream) or 2-D (one sequence per row).")
        for row in (arr,) if arr.ndim == 1 else arr:
            self._add_windows(row)

    def _jsonl(self, path: Path) -> None:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{str(path)!r} line {n}"
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"data file {where} is not valid JSON ({exc}): JSONL holds one JSON object per "
                                     "line.") from None
                self._object(obj, where)

    def _object(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"data file {where} holds a JSON {type(obj).__name__}, not an object. Accepted: "
                             f"{ACCEPTED}.")
        if "input_ids" in obj:
            ids = obj["input_ids"]
            mask = obj.get("loss_mask")
            if not _int_list(ids) or (mask is not None and (not _int_list(mask) or len(mask) != len(ids))):
                raise ValueError(f"data file {where}: input_ids must be a list of ints (and loss_mask, if given, a "
                                 "list of 0/1 of the same length).")
            return self._add_windows(ids, mask)
        if "messages" in obj:
            return self._messages(obj["messages"], where)
        if "prompt" in obj:
            return self._prompt(obj, where)
        if "text" in obj and isinstance(obj["text"], str):
            return self._add_windows(self._encode(obj["text"], f"data file {where}"))
        raise ValueError(f"data file {where} has keys {sorted(obj)}: expected one of \"text\", \"prompt\" (with an "
                         "optional \"response\"), \"messages\" or \"input_ids\".")

    def _prompt(self, obj: dict[str, Any], where: str) -> None:
        prompt, response = obj["prompt"], obj.get("response")
        if not isinstance(prompt, str) or not (response is None or isinstance(response, str)):
            raise ValueError(f"data file {where}: \"prompt\" and \"response\" must be strings.")
        ids = self._encode(prompt, f"data file {where}")
        if self.generate or response is None:
            if not self.generate:
                self.data.prompt_only += 1
            return self._add(ids, np.zeros(len(ids)))
        resp = self._encode(response, f"data file {where}", specials=False)
        self._add(ids + resp, [0] * len(ids) + [1] * len(resp))

    def _messages(self, messages: Any, where: str) -> None:
        if (not isinstance(messages, list) or not messages
                or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                           for m in messages)):
            raise ValueError(f"data file {where}: \"messages\" must be a non-empty list of {{\"role\": str, "
                             "\"content\": str}} objects.")
        if self.generate:
            while messages and messages[-1]["role"] == "assistant":
                messages = messages[:-1]  # the target writes the answer
            if not messages:
                raise ValueError(f"data file {where}: with --generate a conversation needs a turn before the "
                                 "assistant's to prompt with.")
        ids: list[int] = []
        mask: list[int] = []
        for k, (text, learn) in enumerate(self._chat_segments(messages, where)):
            piece = self._encode(text, f"data file {where}", specials=k == 0 and not self._has_template())
            ids += piece
            mask += [int(learn)] * len(piece)
        self._add(ids, mask)

    def _has_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def _chat_segments(self, messages: list[dict[str, str]], where: str) -> list[tuple[str, bool]]:
        """The conversation as (text, is an assistant turn) pieces whose concatenation is its rendering."""
        if self.tok is None:
            self._encode("", f"data file {where}")  # raises: no tokenizer
        if not self._has_template():
            return _plain_segments(messages, self.generate)

        def render(msgs: list[dict[str, str]], prompt: bool) -> str:
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt)

        text = render(messages, self.generate)
        pieces, cursor = [], 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, upto = render(messages[:i], True), render(messages[: i + 1], False)
            if not (text.startswith(upto) and upto.startswith(before) and len(before) >= cursor):
                raise ValueError(f"data file {where}: the chat template of {self.model!r} does not render this "
                                 "conversation prefix by prefix, so its assistant turns cannot be located for the "
                                 "loss mask; pass the conversation as {\"prompt\", \"response\"} text instead.")
            pieces += [(text[cursor: len(before)], False), (text[len(before): len(upto)], True)]
            cursor = len(upto)
        pieces.append((text[cursor:], False))
        return [(t, learn) for t, learn in pieces if t]


def _plain_segments(messages: list[dict[str, str]], generate: bool) -> list[tuple[str, bool]]:
    """No chat template: ``role: content`` lines; an assistant's content and its newline are learnt."""
    pieces: list[tuple[str, bool]] = []
    for m in messages:
        if m["role"] == "assistant":
            pieces += [("assistant: ", False), (m["content"] + "\n", True)]
        else:
            pieces.append((f"{m['role']}: {m['content']}\n", False))
    if generate:
        pieces.append(("assistant: ", False))
    return pieces


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def load_data(path: str | Path, tokenizer: Any, max_len: int, *, generate: bool = False, model: str = "") -> Data:
    """Read every item of ``path`` (see the module docstring) with sequences of at most ``max_len`` tokens.
    Raises ValueError naming the file (and line) for anything it cannot read."""
    loader = _Loader(tokenizer, max_len, generate, model)
    for f in _files(Path(path)):
        loader.file(f)
    return loader.data

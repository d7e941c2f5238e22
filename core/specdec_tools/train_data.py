"""Where :func:`specdec_tools.train.train` gets its batches: shards written by ``specdec extract``
(:class:`ShardData`), or token windows run through the target inside the loop (:class:`OnlineData`).

Both expose the same small interface: ``len(data)`` sequences; ``check(trainer)`` (the layers it needs are
there); ``batch(indices, keys, device) -> Batch``; ``fingerprint()`` (what a resumed run must match);
``describe()`` (for the model card); ``online`` and ``target_seconds`` (time spent in the target's forward).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from specdec_tools.train import LAST, Batch, Trainer

__all__ = ["OnlineData", "ShardData", "read_texts"]


def _layer_names(keys: list[str]) -> str:
    return ", ".join(f"layer {k}" if k != LAST else "the last hidden state ('last')" for k in keys) or "none"


class ShardData:
    """Sequences from a folder of shards written by ``specdec extract`` (read through
    ``specdec_tools.shards.HiddenStateDataset``); sequences of different lengths are padded on the right."""

    online = False
    target_seconds = 0.0

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        fix = "pass the folder `specdec extract` wrote (it holds manifest.json and the shards), or use --online"
        if not p.is_dir():
            raise ValueError(f"--data {str(path)!r} {'is not a folder' if p.exists() else 'does not exist'}: {fix}.")
        try:
            from specdec_tools.shards import HiddenStateDataset
        except ImportError as exc:
            raise ValueError(f"--data needs specdec_tools.shards, which could not be imported ({exc}): reinstall "
                             "specdec-core, or train with --online.") from None
        self.path = p
        self.dataset = HiddenStateDataset(str(p))
        self.manifest: dict[str, Any] = dict(self.dataset.manifest)

    def __len__(self) -> int:
        return len(self.dataset)

    def keys(self) -> list[str]:
        """The hidden states the shards hold: their layer ids, then ``"last"`` when they have it."""
        return [str(i) for i in self.manifest.get("layer_ids", [])] + ([LAST] if self.manifest.get("last_layer")
                                                                       else [])

    def check(self, trainer: Trainer) -> None:
        have, need = self.keys(), trainer.hidden_keys()
        missing = [k for k in need if k not in have]
        if missing:
            ids = ",".join(str(i) for i in trainer.layer_ids)
            raise ValueError(
                f"--data {str(self.path)!r}: the shards hold {_layer_names(have)}, but method {trainer.method!r} needs "
                f"{_layer_names(need)} ({_layer_names(missing)} missing): extract the shards again with the layers "
                f"it needs ({'layer ids ' + ids if ids else 'no layer ids'}"
                f"{' and the last hidden state' if trainer.last_layer else ''}), or train with --online.")
        self._check_target(trainer)

    def _check_target(self, trainer: Trainer) -> None:
        from specdec.loading import read_json_object
        from specdec_tools.shards import config_sha256

        hidden = self.manifest.get("hidden_size")
        config = Path(trainer.target.path) / "config.json"
        sha = self.manifest.get("target_config_sha256")
        if sha and config.is_file() and config_sha256(read_json_object(config, "target config")) != sha:
            # A warning, not an error: re-saving the same weights (another transformers version) changes the hash.
            warnings.warn(f"--data {str(self.path)!r} was extracted from a target whose config.json differs from "
                          f"--target {trainer.target.path!r}'s ({self.manifest.get('target')!r} there): if it is "
                          "another model, its hidden states do not fit this target; pass the target the shards "
                          "were extracted from.", UserWarning, stacklevel=3)
        if hidden is not None and int(hidden) != trainer.target.hidden_size:
            raise ValueError(f"--data {str(self.path)!r} holds hidden states of size {hidden}, but --target "
                             f"{trainer.target.path!r} has hidden_size {trainer.target.hidden_size}: pass the target "
                             f"the shards were extracted from ({self.manifest.get('target')!r}).")

    def batch(self, indices: list[int], keys: list[str], device: torch.device) -> Batch:
        items = [self.dataset[i] for i in indices]
        lengths = [int(it["input_ids"].shape[0]) for it in items]
        b, t = len(items), max(lengths)
        input_ids = torch.zeros(b, t, dtype=torch.long)
        valid = torch.zeros(b, t, dtype=torch.bool)
        loss_mask = torch.zeros(b, t, dtype=torch.bool)
        hidden = {k: torch.zeros(b, t, items[0]["hidden"][k].shape[-1]) for k in keys}
        for row, (it, n) in enumerate(zip(items, lengths)):
            input_ids[row, :n] = it["input_ids"]
            valid[row, :n] = True
            loss_mask[row, :n] = it["loss_mask"].bool()
            for k in keys:
                hidden[k][row, :n] = it["hidden"][k].float()
        return Batch(input_ids.to(device), valid.to(device), loss_mask.to(device),
                     {k: v.to(device) for k, v in hidden.items()})

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "shards", "path": str(self.path.resolve()), "sequences": len(self)}

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {"kind": "shards", "path": str(self.path), "sequences": len(self), "target": m.get("target"),
                "layer_ids": m.get("layer_ids"), "last_layer": m.get("last_layer"), "dtype": m.get("dtype"),
                "tokens": m.get("num_tokens"), "complete": m.get("complete")}


def _record_text(record: Any) -> str | None:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if isinstance(record.get("text"), str):
            return record["text"]
        if isinstance(record.get("prompt"), str):
            tail = next((record[k] for k in ("response", "completion", "output") if isinstance(record.get(k), str)), "")
            return record["prompt"] + tail
    return None


def read_texts(paths: list[str]) -> list[str]:
    """The documents in ``paths``: a ``.jsonl`` file gives one per line (a JSON string, or an object with
    ``text``, or ``prompt`` plus an optional ``response`` / ``completion`` / ``output``); any other file is one
    UTF-8 document. Raises a ValueError naming the file (and line) and the fix."""
    fix = "pass UTF-8 text files, or .jsonl files of strings or {\"text\": ...} / {\"prompt\": ...} objects"
    docs: list[str] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            what = "is a folder" if p.is_dir() else "does not exist"
            raise ValueError(f"--text {path!r} {what}: {fix} (e.g. --text data/*.txt).")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"--text {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): {fix}.") from None
        if p.suffix != ".jsonl":
            docs.append(text)
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = _record_text(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"--text {path!r} line {lineno} is not JSON ({exc.msg}): {fix}.") from None
            if record is None:
                raise ValueError(f"--text {path!r} line {lineno} is neither a JSON string nor an object with a string "
                                 f"'text' or 'prompt': {fix}.")
            docs.append(record)
    return docs


class OnlineData:
    """Non-overlapping ``seq_len``-token windows of text (every document tokenised with the target's tokenizer and
    followed by its EOS token, all in one stream), whose hidden states come from running the target on each batch
    inside the training loop (plain Hugging Face forward, ``output_hidden_states``, no grad)."""

    online = True

    def __init__(self, target_path: str, texts: list[str], *, seq_len: int = 256, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, trust_remote_code: bool = False) -> None:
        from specdec.errors import check_int
        from specdec.loading import load_causal_lm, load_tokenizer

        check_int("seq_len", seq_len, 2, "(tokens per training window)")
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.files = [str(p) for p in texts]
        docs = read_texts(self.files)
        tokenizer = load_tokenizer(target_path, trust_remote_code=trust_remote_code)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        encode = tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"] if docs else []
        stream = [t for ids in encode for t in ids + eos]
        n = len(stream) // seq_len
        if n < 2:
            raise ValueError(f"--text gives {len(stream)} tokens, {n} window(s) of --seq-len {seq_len}: training needs "
                             "at least 2 (one to train on, one held out); give more text or a smaller --seq-len.")
        self.seq_len, self.tokens = seq_len, len(stream)
        self.windows = torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)  # [n, seq_len]
        self.digest = hashlib.sha256(self.windows.numpy().tobytes()).hexdigest()[:16]
        self.model = load_causal_lm(target_path, self.dtype, trust_remote_code=trust_remote_code).to(self.device)
        self.num_layers = int(self.model.config.get_text_config().num_hidden_layers)
        self.target_seconds = 0.0

    def __len__(self) -> int:
        return len(self.windows)

    def check(self, trainer: Trainer) -> None:
        bad = [i for i in trainer.layer_ids if not 0 <= i <= self.num_layers]
        if bad:
            raise ValueError(f"method {trainer.method!r} asks for layer ids {bad}, which the target does not have: it "
                             f"has {self.num_layers} layers, so ids run from 0 (embeddings) to {self.num_layers}.")

    @torch.no_grad()
    def batch(self, indices: list[int], keys: list[str], device: torch.device) -> Batch:
        input_ids = self.windows[indices].to(self.device)  # [B, T]
        layers = [int(k) for k in keys if k != LAST]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out = self.model.base_model(input_ids=input_ids, output_hidden_states=bool(layers), use_cache=False)
        hidden = {k: (out.last_hidden_state if k == LAST else out.hidden_states[int(k)]).float() for k in keys}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.target_seconds += time.perf_counter() - t0
        ones = torch.ones_like(input_ids, dtype=torch.bool)
        return Batch(input_ids.to(device), ones.to(device), ones.to(device),
                     {k: v.to(device) for k, v in hidden.items()})

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": "online", "windows": len(self), "seq_len": self.seq_len, "digest": self.digest}

    def describe(self) -> dict[str, Any]:
        return {"kind": "online", "files": self.files, "tokens": self.tokens, "seq_len": self.seq_len,
                "sequences": len(self), "target_dtype": str(self.dtype).removeprefix("torch.")}

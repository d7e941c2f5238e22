"""Hidden-state shards: what ``specdec extract`` writes and what head training reads.

A shard directory holds ``manifest.json`` and ``shard-00000.safetensors``, ``shard-00001.safetensors``...
Each shard holds whole sequences, concatenated:

- ``input_ids`` int32 ``[T]``; ``loss_mask`` uint8 ``[T]`` (1: a response token a head should learn);
- ``offsets`` int64 ``[S + 1]``: sequence ``s`` is rows ``offsets[s]:offsets[s + 1]``;
- ``hidden.<layer_id>`` ``[T, H]`` per recorded layer, in Hugging Face ``output_hidden_states``
  indexing (0: embeddings, i: output of decoder layer i; HF's entry ``num_hidden_layers`` is after
  the final norm), and ``hidden.last`` ``[T, H]`` (the final normed state, HF ``last_hidden_state``)
  when the last layer is recorded.

Rows are aligned with tokens: ``hidden.<l>[t]`` is HF's ``hidden_states[l][t]``, the state after
the target read ``input_ids[t]`` (so it predicts ``input_ids[t + 1]``). The manifest says which
target wrote the shards (path and a hash of its config), which layers, the dtype, the counts, and
each shard's sha256.

A writer never leaves a half-written shard: each goes to a temporary name first, then
``os.replace``; the manifest is rewritten the same way after every shard, so it always describes
complete shards only. ``resume=True`` continues a killed run after the sequences already on disk.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "FORMAT", "VERSION", "CONVENTION", "ROWS", "MANIFEST", "DEFAULT_SHARD_TOKENS", "DTYPES",
    "ShardDirError", "IncompatibleShardsError", "DiskBudgetExceeded",
    "ShardWriter", "HiddenStateDataset", "read_manifest", "config_sha256", "check_layer_ids", "num_hidden_layers",
    "shard_layout",
    "hidden_size_of", "shard_file",
]

FORMAT = "specdec-hidden-states"
VERSION = 1
CONVENTION = "hf_output_hidden_states"
# How rows line up with tokens, spelled out in every manifest.
ROWS = "hidden.<id>[t] = hidden_states[id][t]: the target's state after reading input_ids[t] (it predicts t + 1)"
MANIFEST = "manifest.json"
DEFAULT_SHARD_TOKENS = 32768
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SHARD_RE = re.compile(r"^shard-(\d{5,})\.safetensors$")
_TMP_PREFIX = ".tmp-"  # temporary files of this format: ".tmp-<final name>-<pid>"
# Settings that must match for a run to add shards to a directory (checked on open).
_IDENTITY = ("target_config_sha256", "layer_ids", "last_layer", "dtype", "hidden_size")


class ShardDirError(ValueError):
    """An output or input directory that cannot be used as it is (the message says why and the fix)."""


class IncompatibleShardsError(ShardDirError):
    """The output directory holds shards of another target, other layers or another dtype."""


class DiskBudgetExceeded(RuntimeError):
    """Writing the next shard would pass ``max_bytes`` (or the disk is full). Nothing half-written is
    left: the manifest lists the complete shards, and ``resume=True`` continues from them."""


def config_sha256(config: dict[str, Any]) -> str:
    """sha256 of ``config`` (a target's config.json) as canonical JSON: sorted keys, no spaces, UTF-8."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _text_config_int(config: dict[str, Any], key: str) -> int:
    for cfg in (config, config.get("text_config") or {}):
        n = cfg.get(key) if isinstance(cfg, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    raise ValueError(f"the target's config has no {key}: is it a decoder-only causal LM config?")


def num_hidden_layers(config: dict[str, Any]) -> int:
    """``num_hidden_layers`` of a config dict (or of its ``text_config``, as multimodal configs nest it)."""
    return _text_config_int(config, "num_hidden_layers")


def hidden_size_of(config: dict[str, Any]) -> int:
    """``hidden_size`` of a config dict (or of its ``text_config``)."""
    return _text_config_int(config, "hidden_size")


def check_layer_ids(layer_ids: Any, num_layers: int) -> tuple[int, ...]:
    """``layer_ids`` as a sorted tuple of unique ints, each in ``0..num_layers`` (HF indexing: 0 is the
    embeddings, ``num_layers`` the final normed state); a ValueError names the first bad value."""
    if isinstance(layer_ids, (str, bytes)) or not hasattr(layer_ids, "__iter__"):
        raise ValueError(f"layer_ids={layer_ids!r} is invalid: pass a list of ints, e.g. [2, {num_layers // 2}].")
    ids = list(layer_ids)
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"layer id {v!r} is invalid: layer ids are ints in 0..{num_layers}.")
        if not 0 <= v <= num_layers:
            raise ValueError(f"layer id {v} is outside the model: valid ids are 0..{num_layers} (0 = embeddings, "
                             f"i = output of decoder layer i; the model has num_hidden_layers={num_layers}).")
    if len(set(ids)) != len(ids):
        raise ValueError(f"layer_ids={ids} is invalid: each layer id may appear once.")
    return tuple(sorted(ids))


def shard_file(index: int) -> str:
    """File name of shard ``index``."""
    return f"shard-{index:05d}.safetensors"


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.uint8: "U8"}


def shard_layout(pieces: dict[str, list[torch.Tensor]], metadata: dict[str, str]) -> tuple[bytes, list[Any]]:
    """A safetensors file of tensors each given as pieces to concatenate along dim 0 (CPU tensors of one
    dtype and trailing shape): its header (size prefix included) and the pieces' bytes in file order, so a
    writer streams them to disk without building the concatenations. Wider dtypes come first, then by
    name, so every tensor's data starts aligned to its item size."""
    order = sorted(pieces, key=lambda n: (-pieces[n][0].element_size(), n))
    header: dict[str, Any] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name in order:
        parts = [t.contiguous() for t in pieces[name]]
        first = parts[0]
        shape = [sum(t.shape[0] for t in parts), *first.shape[1:]]
        nbytes = sum(t.numel() for t in parts) * first.element_size()
        header[name] = {"dtype": _ST_DTYPES[first.dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        chunks += [memoryview(t.view(-1).view(torch.uint8).numpy()) for t in parts if t.numel()]
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text, chunks


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``: readers see the old file or
    the whole new one. On failure the temporary file is removed and the error re-raised."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2) + "\n").encode("utf-8")


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of shard directory ``directory``, checked to be this format and version."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ShardDirError(f"{str(directory)!r} has no {MANIFEST}: it is not a hidden-state shard directory "
                            "(write one with `specdec extract`).")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ShardDirError(f"{str(path)!r} is not valid JSON ({exc}): the manifest is corrupt; rerun "
                            "`specdec extract` into a new directory.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ShardDirError(f"{str(path)!r} has format={got!r}, expected {FORMAT!r}: not a hidden-state shard "
                            "manifest.")
    if manifest.get("version") != VERSION:
        raise ShardDirError(f"{str(path)!r} has version={manifest.get('version')!r}; this specdec reads version "
                            f"{VERSION}: re-extract with this version.")
    return manifest


class _Dropped(Exception):
    """A background shard not written because an earlier one failed (never raised to callers)."""


class ShardWriter:
    """Appends sequences with their hidden states to a shard directory.

    Args:
        out_dir: the directory (created if absent).
        target_path: the target model's path or name (recorded in the manifest).
        target_config: the target's config.json as a dict; its :func:`config_sha256` identifies the target.
        layer_ids: recorded layers, HF ``output_hidden_states`` indexing (stored sorted).
        last_layer: whether ``hidden.last`` (the final normed state) is recorded.
        dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"``: hidden states are stored in it.
        hidden_size: H, the width of every hidden tensor.
        shard_tokens: a shard is written once this many tokens are pending (whole sequences: a shard
            may hold more, and the last one fewer).
        max_bytes: the most bytes all shards together may take; the shard that would pass it is not
            written and :class:`DiskBudgetExceeded` is raised (None: no budget).
        resume: continue a directory holding shards of the same target and settings; the first
            :attr:`num_sequences_done` sequences of the data are already written, and callers skip
            them. Without it, a directory that already holds shards is refused.
        data: free-form description of the data, stored as the manifest's ``"data"``.
        background: serialise, hash and write shards on writer threads while the caller goes on (the
            target's next forwards). Up to ``writer_threads`` shards are in flight at once, each written to a
            temporary file in parallel and listed in the manifest in shard order, so memory holds about
            ``writer_threads + 1`` shards. An error there (a full disk budget, an OSError) is raised by a
            later :meth:`flush` (which an :meth:`add` that fills a shard calls) or :meth:`close`; that
            shard's sequences and those of the shards after it are dropped, as a killed run's are, and
            ``resume`` redoes them.
        writer_threads: shards in flight with ``background`` (default 3): serialising and hashing a shard
            is CPU work, its write is I/O, and several overlap where one thread would hold the forwards back.

    Raises:
        IncompatibleShardsError: the directory holds shards of another target, layers, dtype or width.
        ShardDirError: it holds shards and ``resume`` is False, or its shards are missing or truncated.
    """

    def __init__(self, out_dir: str | Path, *, target_path: str, target_config: dict[str, Any],
                 layer_ids: Any, last_layer: bool, dtype: str, hidden_size: int,
                 shard_tokens: int = DEFAULT_SHARD_TOKENS, max_bytes: int | None = None, resume: bool = False,
                 data: dict[str, Any] | None = None, background: bool = False, writer_threads: int = 3) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is invalid: use one of {', '.join(map(repr, DTYPES))}.")
        ids = check_layer_ids(layer_ids, num_hidden_layers(target_config))
        if not ids and not last_layer:
            raise ValueError("nothing to record: pass layer ids, last_layer=True, or both.")
        for name, value, low in (("hidden_size", hidden_size, 1), ("shard_tokens", shard_tokens, 1),
                                 ("writer_threads", writer_threads, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} is invalid: it must be an int >= {low}.")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"max_bytes={max_bytes!r} is invalid: it must be an int >= 1 (bytes) or None (no budget).")
        self.out_dir = Path(out_dir)
        self.dtype = DTYPES[dtype]
        self.keys = tuple(str(i) for i in ids) + (("last",) if last_layer else ())
        self.hidden_size = hidden_size
        self.shard_tokens = shard_tokens
        self.max_bytes = max_bytes
        self.manifest: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "target": str(target_path),
            "target_config_sha256": config_sha256(target_config), "layer_ids": list(ids),
            "last_layer": bool(last_layer), "convention": CONVENTION, "rows": ROWS, "dtype": dtype,
            "hidden_size": hidden_size,
            "num_tokens": 0, "num_sequences": 0, "shards": [], "complete": False, "data": dict(data or {}),
        }
        self._pending: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
        self._pending_tokens = 0
        self._open(resume)
        self._closed = False
        self._threads = writer_threads
        self._pool = (ThreadPoolExecutor(max_workers=writer_threads, thread_name_prefix="specdec-shards")
                      if background else None)
        self._inflight: list[tuple[Future, int, int]] = []  # shards being written, in order: sequences, index

    # -- opening ------------------------------------------------------------------------------
    def _open(self, resume: bool) -> None:
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise ShardDirError(f"output {str(out)!r} is a file: pass a directory for the shards.")
        old = read_manifest(out) if (out / MANIFEST).is_file() else None
        strays = sorted(p.name for p in out.glob("shard-*.safetensors")) if out.is_dir() else []
        if old is None and strays:
            raise ShardDirError(f"output directory {str(out)!r} holds shard files ({strays[0]}, ...) but no "
                                f"{MANIFEST}: they cannot be checked or continued; choose an empty directory.")
        if old is not None:
            self._check_same(old)
            if not resume and old["shards"]:
                raise ShardDirError(f"output directory {str(out)!r} already holds {old['num_sequences']} sequences "
                                    f"in {len(old['shards'])} shard(s) of this target: pass resume=True (--resume) "
                                    "to continue them, or choose an empty directory.")
            self._adopt(old)
        out.mkdir(parents=True, exist_ok=True)
        self._remove_leftovers()
        self._write_manifest()

    def _check_same(self, old: dict[str, Any]) -> None:
        diff = [f"{k}={old.get(k)!r} there, {self.manifest[k]!r} here" for k in _IDENTITY
                if old.get(k) != self.manifest[k]]
        if diff:
            what = "another target model" if old.get("target_config_sha256") != self.manifest[
                "target_config_sha256"] else "other settings"
            raise IncompatibleShardsError(
                f"output directory {str(self.out_dir)!r} holds shards of {what} (target {old.get('target')!r}): "
                f"{'; '.join(diff)}. Choose another output directory, or delete that one to start over.")

    def _adopt(self, old: dict[str, Any]) -> None:
        """Continue ``old``'s shards after checking each is on disk at its recorded size."""
        for entry in old["shards"]:
            path = self.out_dir / entry["file"]
            size = path.stat().st_size if path.is_file() else -1
            if size != entry.get("bytes", size) or size < 0:
                raise ShardDirError(f"shard {str(path)!r} listed in the manifest is missing or has {size} bytes, "
                                    f"not {entry.get('bytes')}: the directory was modified; delete it and extract "
                                    "again.")
        for key in ("shards", "num_tokens", "num_sequences"):
            self.manifest[key] = old[key]
        self.manifest["data"] = {**old.get("data", {}), **self.manifest["data"]}

    def _remove_leftovers(self) -> None:
        """Temporary files of a killed run, and shards written but never listed in the manifest (killed
        between the two renames): both are redone."""
        listed = {e["file"] for e in self.manifest["shards"]}
        for p in self.out_dir.iterdir():
            if p.name.startswith(_TMP_PREFIX) or (_SHARD_RE.match(p.name) and p.name not in listed):
                p.unlink()

    # -- writing ------------------------------------------------------------------------------
    @property
    def num_sequences_done(self) -> int:
        """Sequences in complete shards on disk (on opening with ``resume``: those callers skip)."""
        return self.manifest["num_sequences"]

    @property
    def num_sequences(self) -> int:
        """Sequences added so far, on disk, being written or pending."""
        writing = sum(n for _, n, _ in self._inflight)
        return self.manifest["num_sequences"] + writing + len(self._pending)

    @property
    def bytes_written(self) -> int:
        """Bytes of the shards on disk."""
        return sum(e["bytes"] for e in self.manifest["shards"])

    def add(self, input_ids: Any, loss_mask: Any, hidden: dict[str, torch.Tensor]) -> None:
        """Append one sequence: ``input_ids`` ``[T]``, ``loss_mask`` ``[T]`` (nonzero: learn this token) and
        ``hidden[key]`` ``[T, H]`` for every recorded key (``"2"``, ``"last"``...). Writes a shard once
        ``shard_tokens`` tokens are pending."""
        if self._closed:
            raise RuntimeError("ShardWriter.add after close().")
        ids = torch.as_tensor(input_ids)
        mask = torch.as_tensor(loss_mask)
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"input_ids must be a 1-D integer tensor, got {tuple(ids.shape)} {ids.dtype}.")
        t = ids.shape[0]
        if t and (int(ids.min()) < 0 or int(ids.max()) >= 2**31):
            raise ValueError(f"input_ids must lie in [0, 2^31): got values {int(ids.min())}..{int(ids.max())}.")
        if mask.shape != (t,):
            raise ValueError(f"loss_mask has shape {tuple(mask.shape)}, expected ({t},) like input_ids.")
        given = {str(k): v for k, v in hidden.items()}
        if set(given) != set(self.keys):
            raise ValueError(f"hidden has keys {sorted(given)}, expected {list(self.keys)} (the recorded layers).")
        rows = {}
        for k in self.keys:
            h = given[k]
            if tuple(h.shape) != (t, self.hidden_size):
                raise ValueError(f"hidden[{k!r}] has shape {tuple(h.shape)}, expected ({t}, {self.hidden_size}).")
            rows[k] = h.detach().to(device="cpu", dtype=self.dtype).contiguous()
        self._pending.append((ids.to(torch.int32).cpu(), (mask != 0).to(torch.uint8).cpu(), rows))
        self._pending_tokens += t
        if self._pending_tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Write the pending sequences as one shard (nothing when none are pending); with ``background``,
        hand them to a writer thread once fewer than ``writer_threads`` shards are in flight."""
        if self._pool is None:
            if self._pending:
                self._commit(*self._prepare(len(self.manifest["shards"]), self._pending))
                self._pending, self._pending_tokens = [], 0
            return
        while self._inflight and (len(self._inflight) >= self._threads or not self._pending):
            self._wait_oldest()
        if self._pending:
            index = len(self.manifest["shards"]) + len(self._inflight)
            if self._inflight:  # a shard in flight may be listed already: number after the last one's
                index = self._inflight[-1][2] + 1
            before = self._inflight[-1][0] if self._inflight else None
            pending, self._pending, self._pending_tokens = self._pending, [], 0
            future = self._pool.submit(self._background_write, index, pending, before)
            self._inflight.append((future, len(pending), index))

    def _wait_oldest(self) -> None:
        """Wait for the oldest shard in flight; if its write failed, wait for the rest (dropped after it) and
        raise that error."""
        future = self._inflight.pop(0)[0]
        try:
            future.result()
        except BaseException:
            for later, _, _ in self._inflight:
                later.exception()  # each removes its temporary file and lists nothing
            self._inflight = []
            raise

    def _wait(self) -> None:
        """Wait for every shard in flight (background writes), raising the first error."""
        while self._inflight:
            self._wait_oldest()

    def _background_write(self, index: int, pending: list, before: Future | None) -> None:
        """On a writer thread: serialise, hash and write shard ``index`` to its temporary file, then, once the
        shard before it is listed (``before``), rename it and list it. Dropped if that shard failed."""
        done = None
        try:
            done = self._prepare(index, pending)
        finally:
            if before is not None:
                try:
                    before.result()
                except BaseException:
                    if done is not None and isinstance(done[0], Path):
                        done[0].unlink(missing_ok=True)
                    raise _Dropped(f"shard {index} dropped: an earlier shard's write failed") from None
        self._commit(*done)

    def _prepare(self, index: int, pending: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]]
                 ) -> tuple[Path | OSError, dict[str, Any]]:
        """Shard ``index`` of ``pending`` in a synced temporary file (or the OSError that write raised) and
        its manifest entry. Runs on writer threads, several at once."""
        ids, masks, rows = zip(*pending)
        lengths = torch.tensor([0] + [len(i) for i in ids], dtype=torch.int64)
        pieces = {"input_ids": list(ids), "loss_mask": list(masks), "offsets": [lengths.cumsum(0)]}
        for k in self.keys:
            pieces[f"hidden.{k}"] = [r[k] for r in rows]
        header, chunks = shard_layout(pieces, {"format": FORMAT})
        size = len(header) + sum(c.nbytes for c in chunks)
        entry = {"file": shard_file(index), "num_sequences": len(ids), "num_tokens": int(lengths.sum()),
                 "bytes": size}
        if self.max_bytes is not None and self.bytes_written + size > self.max_bytes:
            return OSError(errno.EFBIG, "over budget"), entry  # checked again, in order, by _commit
        try:
            tmp, entry["sha256"] = self._write_shard(self.out_dir / entry["file"], [header, *chunks])
            return tmp, entry
        except OSError as exc:
            return exc, entry

    def _commit(self, written: Path | OSError, entry: dict[str, Any]) -> None:
        """In shard order: list the shard written to ``written`` (rename it to its name, update the manifest),
        or raise why it was not written."""
        index, size, n = len(self.manifest["shards"]), entry["bytes"], entry["num_sequences"]
        if self.max_bytes is not None and self.bytes_written + size > self.max_bytes:
            if isinstance(written, Path):
                written.unlink(missing_ok=True)
            raise DiskBudgetExceeded(self._budget_message(index, size, f"max_bytes={self.max_bytes}", n))
        if isinstance(written, OSError):
            if written.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskBudgetExceeded(self._budget_message(index, size, "the disk is full", n)) from written
            raise written
        os.replace(written, self.out_dir / entry["file"])
        self.manifest["shards"].append(entry)
        self.manifest["num_sequences"] += n
        self.manifest["num_tokens"] += entry["num_tokens"]
        self._write_manifest()

    def _write_shard(self, path: Path, chunks: list[Any]) -> tuple[Path, str]:
        """Write ``chunks`` (bytes-like, in order) to a synced temporary file beside ``path``, hashing them on
        the way; return it (renamed to ``path`` once the shards before it are listed) and the sha256. A
        method of its own: the one place a test interrupts to simulate a run killed mid-shard."""
        tmp = path.with_name(f"{_TMP_PREFIX}{path.name}-{os.getpid()}")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, digest.hexdigest()

    def _budget_message(self, index: int, size: int, why: str, dropped: int) -> str:
        m = self.manifest
        return (f"shard {index} ({size} bytes) was not written: {why} ({self.bytes_written} bytes in "
                f"{len(m['shards'])} shard(s) already). {str(self.out_dir)!r} holds {m['num_sequences']} complete "
                f"sequences; the {dropped} pending were dropped. Free space or raise the budget, then "
                "rerun with resume=True (--resume) to continue.")

    def _write_manifest(self) -> None:
        _atomic_write(self.out_dir / MANIFEST, _manifest_bytes(self.manifest))

    def close(self) -> None:
        """Write the pending sequences and mark the manifest complete."""
        if self._closed:
            return
        try:
            self.flush()
            self._wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        self.manifest["complete"] = True
        self._write_manifest()
        self._closed = True


class HiddenStateDataset:
    """The sequences of a shard directory, read lazily (``safetensors.safe_open``, memory-mapped).

    ``ds[i]`` is ``dict(input_ids=LongTensor[T], loss_mask=BoolTensor[T], hidden={"2": [T, H], ...,
    "last": [T, H]})`` with keys as recorded (``manifest["layer_ids"]`` as strings, then ``"last"``);
    ``len(ds)`` is the number of sequences in the manifest's shards. Picklable (for DataLoader workers):
    open files are not carried over.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.keys = tuple(str(i) for i in self.manifest["layer_ids"]) + (("last",) if self.manifest["last_layer"]
                                                                          else ())
        self._starts = [0]  # first sequence index of each shard
        for entry in self.manifest["shards"]:
            self._starts.append(self._starts[-1] + int(entry["num_sequences"]))
        self._files: dict[int, Any] = {}
        self._offsets: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self._starts[-1]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = {}
        return state

    def _shard(self, index: int) -> Any:
        f = self._files.get(index)
        if f is None:
            from safetensors import safe_open

            path = self.directory / self.manifest["shards"][index]["file"]
            if not path.is_file():
                raise ShardDirError(f"shard {str(path)!r} listed in the manifest is missing.")
            f = self._files[index] = safe_open(str(path), framework="pt")
            self._offsets[index] = f.get_tensor("offsets").tolist()
        return f

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"index must be an int, got {type(i).__name__}.")
        if not -n <= i < n:
            raise IndexError(f"sequence {i} is out of range: the dataset holds {n}.")
        i %= n
        shard = bisect.bisect_right(self._starts, i) - 1
        f = self._shard(shard)
        local = i - self._starts[shard]
        a, b = self._offsets[shard][local], self._offsets[shard][local + 1]
        return {
            "input_ids": f.get_slice("input_ids")[a:b].long(),
            "loss_mask": f.get_slice("loss_mask")[a:b].bool(),
            "hidden": {k: f.get_slice(f"hidden.{k}")[a:b] for k in self.keys},
        }

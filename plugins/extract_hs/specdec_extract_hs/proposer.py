"""Method ``extract_hidden_states``: drafts nothing, records the target's hidden states into shards.

The engine hands a proposer, at the start of each step, the hidden states of every position the
previous target forward processed (the whole prompt after a prefill, the verified positions after a
decode step). This proposer appends them, with the token ids at those positions, to a per-request
record, and when the request leaves (``remove_request``) hands the record to a
:class:`specdec_tools.shards.ShardWriter`.

What a record holds: T tokens and T rows, ``hidden.<l>[t]`` = HF ``hidden_states[l][t]`` (the state
after reading token t). It ends where the engine's hand-over ends: a request's final forward comes in
its last step, after which it leaves without another ``propose``, and its final sampled token is never
forwarded at all. So a request that generated n tokens is recorded with its prompt and its first n - 2
generated tokens (n >= 2; a request that stops at its first token records nothing). Every recorded row
is exact; the end of the response is cut, not approximated. ``specdec extract --generate N`` asks the
engine for N + 2 tokens so that N are recorded (a response that stops early at EOS loses its last two).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec import DraftBatch, Drafts, HiddenStateRequest, Proposer, SpeculativeConfig

__all__ = ["ExtractHiddenStatesOptions", "ExtractHiddenStatesProposer", "Record", "target_config"]

logger = logging.getLogger("specdec.extract_hs")

# specdec_tools.shards' DEFAULT_SHARD_TOKENS and DTYPES, spelled out (a test keeps them equal): registering the
# method (`specdec methods` loads every plugin) must not import specdec_tools; building the proposer does.
DEFAULT_SHARD_TOKENS = 32768
STORE_DTYPES = ("float32", "float16", "bfloat16")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class ExtractHiddenStatesOptions:
    """Options of method ``extract_hidden_states``.

    Attributes:
        output_dir: the shard directory (required).
        layer_ids: layers to record, HF ``output_hidden_states`` indexing (0 = embeddings, i = output of
            decoder layer i); each in 0..num_hidden_layers, checked against the target when the
            proposer is built. A list from a JSON/YAML config is accepted.
        last_layer: also record the final normed hidden state (``hidden.last``, what the LM head reads).
        dtype: storage dtype of the hidden states: ``"auto"`` (the target's), ``"bfloat16"``,
            ``"float16"`` or ``"float32"``.
        shard_tokens: tokens per shard (whole sequences; see :class:`ShardWriter`).
        max_bytes: disk budget of the shards in bytes (None: none); the shard that would pass it is
            not written and :class:`specdec_tools.shards.DiskBudgetExceeded` is raised.
        resume: continue a directory that holds shards of this target and these settings.
    """

    output_dir: str | None = None
    layer_ids: tuple[int, ...] = ()
    last_layer: bool = False
    dtype: str = "auto"
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    max_bytes: int | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.output_dir, (str, Path)) or not str(self.output_dir):
            raise ValueError(f"output_dir={self.output_dir!r} is invalid: method 'extract_hidden_states' needs the "
                             "directory to write shards to, e.g. output_dir=\"hs/\".")
        ids = self.layer_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)) or not all(map(_is_int, ids)):
            raise ValueError(f"layer_ids={ids!r} is invalid: it must be a list of ints (HF output_hidden_states "
                             "indexing), e.g. layer_ids=[2, 6, 9].")
        object.__setattr__(self, "layer_ids", tuple(ids))
        if not ids and not self.last_layer:
            raise ValueError("method 'extract_hidden_states' has nothing to record: pass layer_ids (e.g. [2, 6, 9]), "
                             "last_layer=True, or both.")
        if self.dtype != "auto" and self.dtype not in STORE_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid: use 'auto' (the target's) or one of "
                             f"{', '.join(map(repr, STORE_DTYPES))}.")
        if not _is_int(self.shard_tokens) or self.shard_tokens < 1:
            raise ValueError(f"shard_tokens={self.shard_tokens!r} is invalid: it must be an int >= 1.")
        if self.max_bytes is not None and (not _is_int(self.max_bytes) or self.max_bytes < 1):
            raise ValueError(f"max_bytes={self.max_bytes!r} is invalid: it must be an int >= 1 (bytes) or None.")


@dataclass(slots=True)
class Record:
    """One request's recording: ``prompt_len`` prompt tokens, then generated ones; ``token_ids[t]`` and
    ``rows[key][t]`` for every recorded position t (``rows`` holds per-step pieces until :meth:`hidden`)."""

    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    rows: dict[str, list[torch.Tensor]] = field(default_factory=dict)

    def hidden(self, keys: tuple[str, ...], hidden_size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Each key's rows as one ``[T, H]`` tensor."""
        return {k: torch.cat(self.rows[k]) if self.rows.get(k) else torch.empty(0, hidden_size, dtype=dtype)
                for k in keys}

    def loss_mask(self) -> np.ndarray:
        """1 on generated tokens, 0 on the prompt."""
        return (np.arange(len(self.token_ids)) >= self.prompt_len).astype(np.uint8)


def target_config(target: Any) -> tuple[str, dict[str, Any]]:
    """The target's path (or name) and its config.json as a dict: read from the model directory when there
    is one (so a run of ``specdec extract`` and this method agree on the hash), else from the loaded config."""
    name = str(getattr(target, "model_name", "") or "")
    file = Path(name) / "config.json" if name else None
    if file is not None and file.is_file():
        import json

        return name, json.loads(file.read_text(encoding="utf-8"))
    config = getattr(target, "config", None)
    if config is None or not hasattr(config, "to_diff_dict"):
        raise ValueError(f"target {name or type(target).__name__!r} exposes no Hugging Face config: method "
                         "'extract_hidden_states' needs one (HFTargetModel has it) to check layer ids and name "
                         "the target in the manifest.")
    return name or type(target).__name__, config.to_diff_dict()


class ExtractHiddenStatesProposer(Proposer):
    """Records the target's hidden states of every processed position; proposes no drafts.

    Finished requests are written in the order they were added (whatever order they finish in), so a
    shard directory's sequence i is the i-th prompt submitted. Set :attr:`auto_write` to False to keep
    finished records in :attr:`finished` instead (``specdec extract`` does, to add its own loss masks).
    Call :meth:`close` after the last ``generate`` to write the last shard and mark the directory
    complete; without it, pending sequences are lost as in a killed run.
    """

    method = "extract_hidden_states"
    Options = ExtractHiddenStatesOptions

    @classmethod
    def default_num_speculative_tokens(cls, options: Any) -> int:
        return 1  # nothing is drafted; k only sizes the engine's verify step (vLLM fixes it at 1 too)

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        from specdec_tools.shards import DTYPES, ShardWriter, check_layer_ids, hidden_size_of, num_hidden_layers

        if target is None:
            raise ValueError("method 'extract_hidden_states' records the target's hidden states: build it with the "
                             "target (LLM does), e.g. create_proposer(config, target).")
        opts = self.options
        path, cfg = target_config(target)
        self.layer_ids = check_layer_ids(opts.layer_ids, num_hidden_layers(cfg))
        self.keys = tuple(map(str, self.layer_ids)) + (("last",) if opts.last_layer else ())
        dtype_name = opts.dtype if opts.dtype != "auto" else str(target.dtype).removeprefix("torch.")
        if dtype_name not in DTYPES:
            raise ValueError(f"the target runs in {target.dtype}; shards store {', '.join(DTYPES)}: pass dtype= one "
                             "of them.")
        self.dtype = DTYPES[dtype_name]
        self.hidden_size = hidden_size_of(cfg)
        self.writer = ShardWriter(opts.output_dir, target_path=path, target_config=cfg, layer_ids=self.layer_ids,
                                  last_layer=opts.last_layer, dtype=dtype_name, hidden_size=self.hidden_size,
                                  shard_tokens=opts.shard_tokens, max_bytes=opts.max_bytes, resume=opts.resume,
                                  data={"source": "extract_hidden_states", "recorded": "in flight"},
                                  background=True)
        self.auto_write = True
        self.records: dict[str, Record] = {}
        self.finished: dict[str, Record] = {}
        self._order: deque[str] = deque()  # requests in the order they were added, until written

    def hidden_states_needed(self) -> HiddenStateRequest:
        return HiddenStateRequest(last_layer=self.options.last_layer, aux_layer_ids=self.layer_ids)

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        self.records[req_id] = Record(prompt_len=len(prompt_token_ids))
        self._order.append(req_id)

    def propose(self, batch: DraftBatch) -> Drafts:
        if batch.query_start_loc is not None:
            self._record(batch)
        return Drafts.empty(batch.batch_size)

    def _record(self, batch: DraftBatch) -> None:
        """Append each request's rows (up to its last accepted position) and the tokens at those positions.
        One device-to-host copy per step for all layers and requests."""
        layers = ([batch.aux_hidden_states[j] for j in range(len(self.layer_ids))]
                  + ([batch.hidden_states] if self.options.last_layer else []))
        host = torch.stack([h.to(self.dtype) for h in layers]).cpu()  # [L, T, H]
        starts, last = batch.hidden_offsets()
        for i, req_id in enumerate(batch.req_ids):
            rec = self.records.get(req_id)
            if rec is None:
                continue
            s, e = starts[i], last[i] + 1
            pos = len(rec.token_ids)
            if e <= s or pos + e - s > int(batch.num_tokens[i]):
                continue  # nothing new, or rows past the tokens the engine shows (never expected)
            rec.token_ids.extend(batch.token_ids[i, pos: pos + e - s].tolist())
            for key, h in zip(self.keys, host):
                rec.rows.setdefault(key, []).append(h[s:e])

    def remove_request(self, req_id: str) -> None:
        rec = self.records.pop(req_id, None)
        if rec is None:
            return
        self.finished[req_id] = rec
        if self.auto_write:
            self._write_in_order()

    def _write_in_order(self) -> None:
        while self._order and self._order[0] in self.finished:
            rec = self.finished.pop(self._order.popleft())
            self.writer.add(np.asarray(rec.token_ids, dtype=np.int64), rec.loss_mask(),
                            rec.hidden(self.keys, self.hidden_size, self.dtype))

    def pop_record(self, req_id: str) -> Record:
        """The finished record of ``req_id`` (with :attr:`auto_write` False), taken out of the proposer."""
        if req_id in self._order:
            self._order.remove(req_id)
        return self.finished.pop(req_id)

    def close(self) -> None:
        """Write the finished records still waiting, then the last shard, and mark the directory complete.
        Requests still running are not written (a warning says how many)."""
        if self.auto_write:
            for req_id in [r for r in self._order if r in self.finished]:  # also those behind an unfinished one
                self._order.remove(req_id)
                rec = self.finished.pop(req_id)
                self.writer.add(np.asarray(rec.token_ids, dtype=np.int64), rec.loss_mask(),
                                rec.hidden(self.keys, self.hidden_size, self.dtype))
        if self.records:
            logger.warning("extract_hidden_states: %d request(s) still running at close() were not written.",
                           len(self.records))
        self.writer.close()


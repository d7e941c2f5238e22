"""Every slot's tokens on the host, their device mirror, and the DraftBatch a proposer reads.

The host rows are appended to in place, so a step's ``DraftBatch.token_ids`` is a view of them when
the running slots are 0..B-1 (as they usually are). GPU proposers read ``token_ids_device``: a
mirror started on first read and then updated with only the tokens written since the last read (one
host->device copy); CPU proposers never pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.proposer import DraftBatch

if TYPE_CHECKING:
    from specdec.requests import Request

__all__ = ["TokenBuffer"]


class TokenBuffer:
    """``host``: ``[num_slots, max_model_len]`` int32, each slot's prompt + output so far. ``mirror``:
    the same on ``device`` once a proposer has read it (None before). ``use_mirror``: whether
    DraftBatch offers the mirror (not on a CPU target: the host ids are enough). ``hidden``: whether
    the proposer asked for target hidden states (kept per request, batched into its DraftBatch)."""

    def __init__(self, num_slots: int, max_model_len: int, device: torch.device, hidden: bool) -> None:
        self.host = np.zeros((num_slots, max_model_len), dtype=np.int32)
        self.max_model_len = max_model_len
        self.device = device
        self.use_mirror = device.type != "cpu"
        self.mirror: torch.Tensor | None = None
        self.dirty: list[tuple[int, int, int]] = []  # (slot, start, end) not yet mirrored
        self.hidden = hidden

    def write(self, slot: int, start: int, tokens: list[int]) -> None:
        self.host[slot, start: start + len(tokens)] = tokens
        if self.mirror is not None:
            self.dirty.append((slot, start, start + len(tokens)))

    def device_rows(self, slots: list[int], contiguous: bool, width: int) -> torch.Tensor:
        """Rows of the device mirror for ``slots``: started from the host rows on first use, then
        brought up to date with the tokens written since the last read."""
        if self.mirror is None:
            self.mirror = torch.from_numpy(self.host).to(self.device, copy=True)
            self.dirty.clear()
        self._sync()
        rows = slice(0, len(slots)) if contiguous else torch.tensor(slots, device=self.mirror.device)
        return self.mirror[rows, :width]

    def _sync(self) -> None:
        """Mirror the tokens written since the last read: one host->device copy and one scatter."""
        if not self.dirty:
            return
        rows = np.concatenate([np.full(e - s, slot) for slot, s, e in self.dirty])
        cols = np.concatenate([np.arange(s, e) for _, s, e in self.dirty])
        packed = torch.from_numpy(np.stack([rows, cols, self.host[rows, cols]]).astype(np.int64))
        packed = packed.to(self.mirror.device, non_blocking=True)
        self.mirror[packed[0], packed[1]] = packed[2].to(torch.int32)
        self.dirty.clear()

    def draft_batch(self, reqs: list[Request], num_speculative_tokens: int, hidden: bool = True) -> DraftBatch:
        """What the proposer gets this step for the running ``reqs`` (``hidden`` False: without their hidden
        states, which stay kept for the next batch that has them)."""
        lengths = np.array([r.num_tokens for r in reqs], dtype=np.int64)
        width = int(lengths.max())
        slots = [r.slot for r in reqs]
        contiguous = slots == list(range(len(slots)))
        # A view (no copy, O(1) per step) when the running slots are 0..B-1, as they usually are.
        token_ids = self.host[: len(slots), :width] if contiguous else self.host[slots, :width]
        fields = dict(
            req_ids=[r.req_id for r in reqs], token_ids=token_ids, num_tokens=lengths,
            sampled_token_ids=[list(r.last_sampled) for r in reqs],
            num_speculative_tokens=num_speculative_tokens, max_model_len=self.max_model_len,
            sampling_params=[r.params for r in reqs],
        )
        if self.use_mirror:
            batch = _LazyDeviceTokens(lambda: self.device_rows(slots, contiguous, width), **fields)
        else:
            batch = DraftBatch(**fields)
        if self.hidden and hidden:
            _fill_hidden(batch, reqs, self.device)
        return batch

    def keep_hidden(self, reqs: list[Request], out: Any, last_index: list[int], carry: bool = False) -> None:
        """Keep each request's hidden states from the target forward ``out`` (and the index of its
        last accepted position) for its next DraftBatch. ``carry``: the proposer was not called this step
        (the speculation policy skipped it), so the accepted rows it has not seen are kept in front of the
        new ones: its next DraftBatch hands over every position since its last call, like one long verify.

        Nothing is copied here: a request keeps row ranges of the steps' output tensors (``Request.hidden``:
        ``(chunks, last, rows before the final chunk)``, each chunk ``((hidden_states, aux_hidden_states), start,
        stop)``), joined when the proposer next runs (:func:`_fill_hidden`), so a plain step launches no kernel per
        request (the per-request concatenations this replaces launched one per request and kept layer every step)
        and costs O(1) per request (not the number of plain steps since the proposer's last call)."""
        if not self.hidden:
            return
        if out.hidden_states is None and out.aux_hidden_states is None:  # a bare step: nothing was collected
            if not carry:
                raise RuntimeError("only a plain step that skipped the proposer may run without hidden states")
            for r in reqs:  # its input sat one position before the token it appended
                if r.bare is None:
                    r.bare = [r.num_tokens - 2, 1]
                else:
                    r.bare[1] += 1
            return
        if carry and any(r.bare is not None for r in reqs):
            raise RuntimeError("a plain step collected hidden states after bare ones: recompute those first "
                               "(LLM._recompute_bare)")
        qsl = out.query_start_loc.tolist()
        src = (out.hidden_states, out.aux_hidden_states)
        full = []
        for i, r in enumerate(reqs):
            chunk, last = (src, qsl[i], qsl[i + 1]), last_index[i]
            if carry and r.hidden is not None:
                # (chunks, last accepted row, rows before the final chunk): the list grows in place, O(1) a step
                chunks, plast, before = r.hidden
                keep = plast + 1  # the rows it accepted: every earlier chunk whole, the final one up to keep
                final, s0, _ = chunks[-1]
                chunks[-1] = (final, s0, s0 + keep - before)
                chunks.append(chunk)
                r.hidden = (chunks, last + keep, keep)
                if len(chunks) > MAX_CARRIED_CHUNKS:
                    full.append(r)
            else:
                r.hidden = ([chunk], last, 0)
        if full:  # a long plain run: one tensor again, memory bounded; every carried request's rows in one gather
            carried = [r for r in reqs if len(r.hidden[0]) > 1]
            (joined, _, _), at = _joined([c for r in carried for c in r.hidden[0]]), 0
            for r in carried:
                chunks, last, _ = r.hidden
                n = sum(e - s for _, s, e in chunks)
                r.hidden = ([(joined, at, at + n)], last, 0)
                at += n


    def bare_inputs(self, reqs: list[Request], last: bool = False) -> tuple[list[int], list[list[int]], list[int]]:
        """Slots, token ids and first positions of the bare steps' inputs of ``reqs`` (each with ``bare`` set): what
        :meth:`~specdec.runner.ModelRunner.forward_hidden` recomputes their hidden states from. ``last``: the final
        bare step's input alone (for a proposer that reads only the last position)."""
        spans = [(p + n - 1, 1) if last else (p, n) for p, n in (r.bare for r in reqs)]
        return ([r.slot for r in reqs], [self.host[r.slot, p: p + n].tolist() for r, (p, n) in zip(reqs, spans)],
                [p for p, _ in spans])

    def fill_bare(self, reqs: list[Request], out: Any, last: bool = False) -> None:
        """Keep the recomputed hidden states ``out`` of ``reqs``' bare steps (request by request, in order) as if
        those plain steps had collected them: after the rows kept before, the last one the last accepted row.
        ``last``: ``out`` holds each request's final bare position alone (:meth:`bare_inputs` with ``last``), which
        replaces what was kept: the proposer's next hand-over is that one row a request."""
        counts = [1 if last else r.bare[1] for r in reqs]
        for r in reqs:
            r.bare = None
        self.keep_hidden(reqs, out, [n - 1 for n in counts], carry=not last)


MAX_CARRIED_CHUNKS = 64  # a request's kept hidden-state ranges before they are joined into one tensor


class _LazyDeviceTokens(DraftBatch):
    """A DraftBatch whose ``token_ids_device`` is made on first read (one mirror update), so a
    proposer that never reads it costs no host-to-device copy."""

    def __init__(self, make: Any, **batch_fields: Any) -> None:
        DraftBatch.__init__(self, **batch_fields)  # token_ids_device=None goes through the setter
        self.__dict__["_make"] = make

    @property
    def token_ids_device(self) -> torch.Tensor | None:  # type: ignore[override]
        if self.__dict__.get("_make") is not None:
            self.__dict__["_token_ids_device"] = self.__dict__.pop("_make")()
        return self.__dict__.get("_token_ids_device")

    @token_ids_device.setter
    def token_ids_device(self, value: torch.Tensor | None) -> None:
        self.__dict__.pop("_make", None)
        self.__dict__["_token_ids_device"] = value

    # query_start_loc / last_hidden_indices: device copies of their host arrays, made on first read (most proposers
    # index on the host: DraftBatch.hidden_offsets), so a step that never reads them queues no copy.
    @property
    def query_start_loc(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._lazy("query_start_loc")

    @query_start_loc.setter
    def query_start_loc(self, value: torch.Tensor | None) -> None:
        self.__dict__["query_start_loc"] = value

    @property
    def last_hidden_indices(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._lazy("last_hidden_indices")

    @last_hidden_indices.setter
    def last_hidden_indices(self, value: torch.Tensor | None) -> None:
        self.__dict__["last_hidden_indices"] = value

    def _lazy(self, name: str) -> torch.Tensor | None:
        value = self.__dict__.get(name)
        if isinstance(value, np.ndarray):  # set by _fill_hidden: copied to the device now
            value = self.__dict__[name] = torch.from_numpy(value).to(self.__dict__["_device"], non_blocking=True)
        return value


def _num_rows(src: Any) -> int:
    """Rows of a kept ``(hidden_states, aux_hidden_states)`` pair (either may be None, not both)."""
    h, aux = src
    return (h if h is not None else aux[0]).shape[0]


def _joined(chunks: list[Any]) -> Any:
    """One chunk holding ``chunks``' rows in order: each distinct source (a step's output) concatenated once, then
    one gather of the rows, for each kept tensor; a fixed number of launches however many ranges (a plain run of
    n steps leaves n ranges a request: slicing each range of each layer cost ~2k tensor operations for 8 requests
    every MAX_CARRIED_CHUNKS steps, ~50 us a step on the H200's host)."""
    srcs: list[Any] = []
    offset: dict[int, int] = {}
    rows = 0
    for src, _, _ in chunks:
        if id(src) not in offset:
            offset[id(src)] = rows
            srcs.append(src)
            rows += _num_rows(src)
    starts = np.fromiter((offset[id(src)] + s for src, s, _ in chunks), dtype=np.int64, count=len(chunks))
    lens = np.fromiter((e - s for _, s, e in chunks), dtype=np.int64, count=len(chunks))
    total = int(lens.sum())
    index = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total)
    h0, aux0 = srcs[0]
    device = (h0 if h0 is not None else aux0[0]).device
    whole = index.size == rows and bool((index == np.arange(rows)).all())
    real = None
    if not whole:
        real = torch.from_numpy(index)
        # pinned, so that the copy is queued behind the forwards instead of waiting for them
        real = (real.pin_memory() if device.type == "cuda" else real).to(device, non_blocking=True)

    def gather(parts: list[torch.Tensor]) -> torch.Tensor:
        x = parts[0] if len(parts) == 1 else torch.cat(parts)
        return x if real is None else x.index_select(0, real)

    h = gather([src[0] for src in srcs]) if h0 is not None else None
    aux = [gather([src[1][j] for src in srcs]) for j in range(len(aux0))] if aux0 is not None else None
    return (h, aux), 0, total


def _fill_hidden(batch: DraftBatch, reqs: list[Request], device: torch.device) -> None:
    last, qsl, pieces = [], [0], []
    for r in reqs:
        chunks, li, _ = r.hidden
        last.append(qsl[-1] + li)
        qsl.append(qsl[-1] + sum(e - s for _, s, e in chunks))
        pieces += chunks
    rows = _num_rows(pieces[0][0])
    # The usual step: every request's rows are one range of the same forward's output, in order, and nothing
    # else is in it: hand those tensors over as they are.
    whole = len(pieces) == len(reqs) and qsl[-1] == rows and all(
        src is pieces[0][0] and s == qsl[i] and e == qsl[i + 1] for i, (src, s, e) in enumerate(pieces))
    (h, aux), _, _ = pieces[0] if whole else _joined(pieces)
    if h is not None:
        batch.hidden_states = h
    if aux is not None:
        batch.aux_hidden_states = list(aux)
    # host copies for proposers that index on the host; the device copies queued without a wait (a blocking copy
    # would synchronise the stream)
    batch.query_start_loc_cpu = np.asarray(qsl, dtype=np.int64)
    batch.last_hidden_indices_cpu = np.asarray(last, dtype=np.int64)
    if isinstance(batch, _LazyDeviceTokens):  # copied on first read
        batch.__dict__["_device"] = device
        batch.__dict__["query_start_loc"] = batch.query_start_loc_cpu
        batch.__dict__["last_hidden_indices"] = batch.last_hidden_indices_cpu
        return
    cuda = torch.device(device).type == "cuda"
    batch.query_start_loc = torch.from_numpy(batch.query_start_loc_cpu).to(device, non_blocking=cuda)
    batch.last_hidden_indices = torch.from_numpy(batch.last_hidden_indices_cpu).to(device, non_blocking=cuda)

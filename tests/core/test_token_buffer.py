"""TokenBuffer's hidden-state hand-over: what a proposer's DraftBatch carries after verify steps and after steps
the speculation policy skipped it, against a plain concatenation of the accepted rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

import specdec.token_buffer as tb
from specdec.requests import Request
from specdec.sampling import SamplingParams
from specdec.token_buffer import TokenBuffer


def _reqs(n: int) -> list[Request]:
    out = []
    for i in range(n):
        r = Request(req_id=str(i), prompt=None, prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=8))
        r.slot, r.output, r.last_sampled = i, [4], [4]
        out.append(r)
    return out


def _step(lens: list[int], gen: torch.Generator, last: bool = True, aux: int = 2) -> SimpleNamespace:
    """A target output: ``sum(lens)`` rows of random states (last layer and ``aux`` auxiliary layers)."""
    t = sum(lens)
    qsl = torch.from_numpy(np.concatenate(([0], np.cumsum(lens))))
    return SimpleNamespace(query_start_loc=qsl,
                           hidden_states=torch.randn(t, 4, generator=gen) if last else None,
                           aux_hidden_states=[torch.randn(t, 3, generator=gen) for _ in range(aux)] or None)


def test_verify_steps_hand_over_the_forward_output_without_a_copy():
    buf, reqs, gen = TokenBuffer(2, 32, torch.device("cpu"), hidden=True), _reqs(2), torch.Generator().manual_seed(0)
    out = _step([3, 3], gen)
    buf.keep_hidden(reqs, out, [1, 2])
    batch = buf.draft_batch(reqs, 2)
    assert batch.hidden_states is out.hidden_states  # one forward, every row in order: no concatenation
    assert all(a is b for a, b in zip(batch.aux_hidden_states, out.aux_hidden_states))
    assert batch.query_start_loc.tolist() == [0, 3, 6] and batch.last_hidden_indices.tolist() == [1, 5]
    assert batch.hidden_offsets() == ([0, 3, 6], [1, 5])  # from the host copies
    assert batch.query_start_loc_cpu.tolist() == [0, 3, 6] and batch.last_hidden_indices_cpu.tolist() == [1, 5]
    # one request left the batch: its rows are not handed over
    batch = buf.draft_batch(reqs[1:], 2)
    assert torch.equal(batch.hidden_states, out.hidden_states[3:]) and batch.last_hidden_indices.tolist() == [2]


def test_skipped_steps_carry_the_accepted_rows_in_order(monkeypatch):
    for max_chunks in (64, 2):  # 2: the kept ranges are joined into one tensor along the way
        monkeypatch.setattr(tb, "MAX_CARRIED_CHUNKS", max_chunks)
        buf, reqs = TokenBuffer(2, 64, torch.device("cpu"), hidden=True), _reqs(2)
        gen = torch.Generator().manual_seed(1)
        verify = _step([4, 4], gen)  # a verify step: request 0 accepted 1 draft (last row 1), request 1 all 3
        buf.keep_hidden(reqs, verify, [1, 3])
        want = [[verify.hidden_states[0:2]], [verify.hidden_states[4:8]]]
        want_aux = [[[a[0:2]] for a in verify.aux_hidden_states], [[a[4:8]] for a in verify.aux_hidden_states]]
        for _ in range(5):  # plain steps the proposer missed: one row each
            plain = _step([1, 1], gen)
            buf.keep_hidden(reqs, plain, [0, 0], carry=True)
            for i in range(2):
                want[i].append(plain.hidden_states[i: i + 1])
                for j, a in enumerate(plain.aux_hidden_states):
                    want_aux[i][j].append(a[i: i + 1])
        batch = buf.draft_batch(reqs, 3)
        assert torch.equal(batch.hidden_states, torch.cat([torch.cat(w) for w in want]))
        for j in range(2):
            assert torch.equal(batch.aux_hidden_states[j], torch.cat([torch.cat(w[j]) for w in want_aux]))
        assert batch.query_start_loc.tolist() == [0, 7, 16]
        assert batch.last_hidden_indices.tolist() == [6, 15]  # each request's newest row
        assert batch.query_start_loc_cpu.tolist() == [0, 7, 16] and batch.last_hidden_indices_cpu.tolist() == [6, 15]


def test_a_long_plain_run_joins_every_carried_request_in_one_gather(monkeypatch):
    """Past MAX_CARRIED_CHUNKS kept ranges the carried requests' rows are joined: one concatenation of the steps'
    outputs and one gather per kept tensor for all of them (not one slice per range, request and layer), into one
    tensor they share; a request that joined during the run keeps its own range. The hand-over stays the accepted
    rows in order."""
    monkeypatch.setattr(tb, "MAX_CARRIED_CHUNKS", 3)
    cats = []
    real_cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda xs, *a, **kw: cats.append(len(xs)) or real_cat(xs, *a, **kw))
    buf, reqs = TokenBuffer(3, 64, torch.device("cpu"), hidden=True), _reqs(3)
    gen = torch.Generator().manual_seed(5)
    verify = _step([3, 2], gen)
    buf.keep_hidden(reqs[:2], verify, [2, 0])
    want = [[verify.hidden_states[0:3]], [verify.hidden_states[3:4]], []]
    for t in range(4):
        running = reqs if t >= 2 else reqs[:2]  # request 2 joins at the third plain step (its prefill row)
        plain = _step([1] * len(running), gen)
        buf.keep_hidden(running, plain, [0] * len(running), carry=True)
        for i in range(len(running)):
            want[i].append(plain.hidden_states[i: i + 1])
    assert cats == [4, 4, 4]  # one join (at the 4th range): 4 step outputs concatenated, once per kept tensor
    assert reqs[0].hidden[0][0][0] is reqs[1].hidden[0][0][0]  # the joined tensors, shared
    batch = buf.draft_batch(reqs, 3)
    assert torch.equal(batch.hidden_states, real_cat([real_cat(w) for w in want]))
    assert batch.last_hidden_indices.tolist() == [6, 11, 13]


def test_a_verify_step_after_a_carry_keeps_only_its_own_rows():
    buf, reqs, gen = TokenBuffer(1, 64, torch.device("cpu"), hidden=True), _reqs(1), torch.Generator().manual_seed(2)
    buf.keep_hidden(reqs, _step([3], gen, last=False), [0])
    buf.keep_hidden(reqs, _step([1], gen, last=False), [0], carry=True)
    out = _step([3], gen, last=False)
    buf.keep_hidden(reqs, out, [2])  # the proposer ran and the step verified its drafts
    batch = buf.draft_batch(reqs, 2)
    assert batch.hidden_states is None and batch.aux_hidden_states[0] is out.aux_hidden_states[0]
    assert batch.last_hidden_indices.tolist() == [2]


def test_collected_hidden_states_do_not_alias_the_forward_buffers():
    """The engine keeps row ranges of a step's hidden states across later forwards, and a CUDA graph rewrites its
    output buffers on every replay: what ``collect`` returns must be tensors of their own, on both of its paths
    (the first rows in order: a copy; any other rows: a gather)."""
    from specdec.proposer import HiddenStateRequest
    from specdec.runner import ModelRunner

    runner = SimpleNamespace(device=torch.device("cpu"), compute_logits=lambda x: x[:, :2])
    wanted = HiddenStateRequest(last_layer=True, aux_layer_ids=(1,))
    for rows, q, lens in (([0, 1], 1, [1, 1]), ([1, 0], 2, [2, 1])):  # a plain step; shuffled, uneven rows
        h, aux = torch.randn(4, 3), [torch.randn(4, 3)]
        out = ModelRunner.collect(runner, h, aux, rows, q, lens, [1, 1], wanted)
        kept = (out.hidden_states.clone(), out.aux_hidden_states[0].clone())
        want = torch.cat([h[r * q: r * q + n] for r, n in zip(rows, lens)])
        assert torch.equal(kept[0], want)
        h.fill_(7.0)
        aux[0].fill_(7.0)  # the next replay
        assert torch.equal(out.hidden_states, kept[0]) and torch.equal(out.aux_hidden_states[0], kept[1])


def test_a_step_graphs_side_by_side_layers_are_handed_over_in_one_copy():
    """Step graphs write several aux layers side by side (``side_by_side``): ``collect`` copies them all at once,
    on both of its paths, into column views of one tensor of its own (the graph's buffer is rewritten next
    replay), with the rows a per-layer copy gives."""
    from specdec.cuda_graphs import side_by_side
    from specdec.proposer import HiddenStateRequest
    from specdec.runner import ModelRunner, adjacent_columns

    runner = SimpleNamespace(device=torch.device("cpu"), compute_logits=lambda x: x[:, :2])
    wanted = HiddenStateRequest(last_layer=False, aux_layer_ids=(1, 2, 3))
    for rows, q, lens in (([0, 1], 1, [1, 1]), ([1, 0], 2, [2, 1])):
        layers = [torch.randn(2, q, 3) for _ in range(3)]
        aux = side_by_side(layers)
        assert adjacent_columns([a.reshape(-1, 3) for a in aux]) is not None
        flat = [a.reshape(-1, 3) for a in aux]
        out = ModelRunner.collect(runner, torch.randn(2 * q, 3), flat, rows, q, lens, [1, 1], wanted)
        got = out.aux_hidden_states
        assert adjacent_columns(got) is not None  # one tensor of its own, handed over as column views
        for g, layer in zip(got, layers):
            want = torch.cat([layer.reshape(-1, 3)[r * q: r * q + n] for r, n in zip(rows, lens)])
            assert torch.equal(g, want)
        kept = [g.clone() for g in got]
        for a in flat:
            a.fill_(7.0)  # the next replay
        assert all(torch.equal(g, k) for g, k in zip(got, kept))


def test_mirrored_batches_copy_the_hand_over_offsets_only_when_read():
    """With a device mirror (a GPU target; forced here on the CPU) the DraftBatch's device offsets are made from
    their host arrays on first read: a proposer that indexes on the host queues no copy, one that reads them gets
    the same values as the host arrays, and a value set by hand is kept."""
    buf, reqs, gen = TokenBuffer(2, 32, torch.device("cpu"), hidden=True), _reqs(2), torch.Generator().manual_seed(0)
    buf.use_mirror = True
    buf.keep_hidden(reqs, _step([3, 4], gen), [1, 3])
    batch = buf.draft_batch(reqs, 2)
    assert isinstance(batch, tb._LazyDeviceTokens)
    assert isinstance(batch.__dict__["query_start_loc"], np.ndarray)  # nothing copied yet
    assert batch.hidden_offsets() == ([0, 3, 7], [1, 6])
    assert isinstance(batch.__dict__["last_hidden_indices"], np.ndarray)
    qsl, last = batch.query_start_loc, batch.last_hidden_indices
    assert isinstance(qsl, torch.Tensor) and qsl.dtype == torch.int64 and qsl.tolist() == [0, 3, 7]
    assert isinstance(last, torch.Tensor) and last.tolist() == [1, 6]
    assert batch.query_start_loc is qsl  # copied once
    batch.last_hidden_indices = torch.tensor([0, 0])
    assert batch.last_hidden_indices.tolist() == [0, 0]

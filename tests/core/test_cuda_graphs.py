"""The fixed-shape (graph) forward path: bucketing, idle slots, KV buckets. On the CPU it runs the
same static-buffer code without capturing (``use_graphs=False``); on CUDA it is captured."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from conftest import TINY_VOCAB
from specdec import LLM, HFTargetModel, SamplingParams
from specdec.cuda_graphs import batch_buckets, kv_buckets, row_argmax


def test_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert kv_buckets(200) == [128, 200]
    assert kv_buckets(1024) == [128, 256, 512, 1024]


def test_static_path_matches_eager(tiny_llama_path):
    rng = random.Random(0)
    static = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=200)
    eager = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=200)
    for m in (static, eager):
        m.allocate(5)
    assert static.capture_graphs([1, 4], use_graphs=False, max_prefill_tokens=256)
    assert len(static.graphs.graphs) == len(batch_buckets(5)) * 2 * len(kv_buckets(200))
    assert sorted(static.graphs.prefills) == [(1, 64), (1, 128), (1, 200), (2, 64), (2, 128), (4, 64)]
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(3, 30))] for _ in range(5)]
    # Prefill in two groups on scattered slots (3 of them in a 4-row graph: one idle row).
    for group in ([0, 2, 4], [3, 1]):
        outs = [m.forward(group, [prompts[s] for s in group], [1, 2, 1][: len(group)]) for m in (static, eager)]
        torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=1e-4, rtol=1e-4)
        for m in (static, eager):
            for s in group:
                m.advance(s, len(prompts[s]))
    assert static.graphs.prefill_replays == 2
    previous = older = None
    for _ in range(6):  # non-contiguous active slots, varying query lengths, partial acceptance
        slots = sorted(rng.sample(range(5), 3))
        toks = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 5))] for _ in slots]
        num_logits = [rng.randrange(1, len(t) + 1) for t in toks]  # the last few positions of each
        a = static.forward(slots, toks, num_logits)
        b = eager.forward(slots, toks, num_logits)
        assert a.logits.shape[0] == sum(num_logits)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
        # The step graph's own argmax, read on the host, is the argmax of the gathered logits rows.
        assert a.host_argmax is not None and b.host_argmax is None
        assert a.host_argmax.read() == b.greedy_token_ids() == b.logits.argmax(-1).tolist()
        if previous is not None:  # replays alternate between two host copies: the one before stays readable
            assert previous.host_argmax.read() == previous.logits.argmax(-1).tolist()
        if older is not None:  # two replays later its copy is overwritten: read from its logits
            assert older.host_argmax.read() is None
            assert older.greedy_token_ids() == older.logits.argmax(-1).tolist()
        previous, older = a, previous
        assert a.query_start_loc.tolist() == b.query_start_loc.tolist() == [0, *itertools.accumulate(map(len, toks))]
        for s, t in zip(slots, toks):
            keep = rng.randrange(1, len(t) + 1)
            static.advance(s, keep)
            eager.advance(s, keep)


def test_draft_ids_on_the_device_replace_placeholders(tiny_llama_path):
    """forward(draft_ids=...) writes the drafts' ids into the input on the device (graph path: into
    the first rows, or scattered to non-contiguous slots; eager path: into the packed ids); the
    logits equal a forward of the same tokens packed on the host."""
    rng = random.Random(5)
    static, eager, ref = (HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=200)
                          for _ in range(3))
    for m in (static, eager, ref):
        m.allocate(5)
    assert static.capture_graphs([1, 4], use_graphs=False)
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(3, 30))] for _ in range(5)]
    for m in (static, eager, ref):
        m.forward(list(range(5)), prompts, [1] * 5)
        for s in range(5):
            m.advance(s, len(prompts[s]))
    for slots in ([0, 1, 2], [1, 3, 4], [0, 1, 2, 3, 4], [2, 4]):
        widths = [rng.randrange(0, 4) for _ in slots]
        drafts = torch.full((len(slots), 3), -1, dtype=torch.int64)
        for i, w in enumerate(widths):
            drafts[i, :w] = torch.randint(2, TINY_VOCAB, (w,))
        last = [rng.randrange(2, TINY_VOCAB) for _ in slots]
        real = [[t] + drafts[i, :w].tolist() for i, (t, w) in enumerate(zip(last, widths))]
        placeholders = [[t] + [0] * w for t, w in zip(last, widths)]
        num_logits = [len(t) for t in real]
        want = ref.forward(slots, real, num_logits)
        ids = drafts[:, : max(widths)].clamp(min=0)
        for m in (static, eager):
            got = m.forward(slots, placeholders, num_logits, draft_ids=ids)
            torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        assert static.graphs.replays > 0


def test_draft_ids_out_of_the_vocabulary_are_clamped_by_the_forward(tiny_llama_path):
    """ModelRunner clamps device draft ids itself (``clamps_draft_ids``: the engine hands them over as drafted):
    on the graph path (first rows and scattered slots) and the eager path an id past the vocabulary or below 0 is
    read as the last or the first id, never past the embedding."""
    from specdec.runner import ModelRunner

    assert ModelRunner.clamps_draft_ids is True
    static, eager, ref = (HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64)
                          for _ in range(3))
    for m in (static, eager, ref):
        m.allocate(3)
        m.forward([0, 1, 2], [[5, 6, 7]] * 3, [1] * 3)
        for s in range(3):
            m.advance(s, 3)
    assert static.capture_graphs([4], use_graphs=False)
    for slots in ([0, 1], [0, 2]):
        raw = torch.tensor([[TINY_VOCAB + 7, 9, -3], [11, -1, TINY_VOCAB]])
        clamped = raw.clamp(0, TINY_VOCAB - 1)
        want = ref.forward(slots, [[4] + c for c in clamped.tolist()], [4, 4])
        for m in (static, eager):
            got = m.forward(slots, [[4, 0, 0, 0]] * 2, [4, 4], draft_ids=raw)
            torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)


def test_engine_on_static_path_is_lossless(tiny_llama_path, monkeypatch):
    import specdec.verify

    deferred = []
    real_defer = specdec.verify.defer_drafts
    monkeypatch.setattr(specdec.verify, "defer_drafts", lambda *a: deferred.append(1) or real_defer(*a))
    rng = random.Random(1)
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ref = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=4).generate(prompts, params)]
    copycat = {"method": "copycat", "num_speculative_tokens": 3, "speculation_policy": "fixed"}
    for config, q, defer in ((None, 1, None), (copycat, 4, None), (copycat, 4, True)):
        # On the CPU: copycat's drafts are CPU tensors, deferred only where they sit on the target's device.
        llm = LLM(tiny_llama_path, config, dtype="float32", device="cpu", max_num_seqs=4, max_model_len=128)
        llm._defer_drafts = defer  # True: the drafts reach the verify forward as device ids, on the CPU too
        assert llm.target.capture_graphs([q], use_graphs=False, max_prefill_tokens=512)
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref
        assert llm.target.graphs.prefill_replays > 0
        if config is not None:
            assert llm.stats.num_accepted_tokens > 0
        # Deferred on every decode step of the forced run, on none otherwise (CPU drafts).
        assert len(deferred) == (llm.step_timer.steps if defer else 0)
        deferred.clear()


def test_failed_prefill_capture_keeps_step_graphs(tiny_llama_path, monkeypatch, caplog):
    """A prefill graph that cannot be captured (say, out of memory for the largest group) costs only
    the prefill graphs: the step graphs are still captured and prompts run eager, losslessly."""
    from specdec.cuda_graphs import GraphRunner

    def fail(self, gb, pb):
        raise torch.OutOfMemoryError(f"no room for the {gb} x {pb} prefill graph")

    rng = random.Random(4)
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ref = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=4).generate(prompts, params)]
    llm = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4, max_model_len=128)
    monkeypatch.setattr(GraphRunner, "_capture_prefill", fail)
    with caplog.at_level("WARNING", logger="specdec.cuda_graphs"):
        assert llm.target.capture_graphs([1], use_graphs=False, max_prefill_tokens=512)
    assert "prefill graph capture failed (OutOfMemoryError: no room for the 4 x 128 prefill graph): prefills " \
           "run eager; pass a smaller prefill_graph_tokens to keep them." in caplog.text
    runner = llm.target.graphs
    assert runner.prefills == {} and runner.prefill_shapes == []
    assert len(runner.graphs) == len(batch_buckets(4)) * len(kv_buckets(128))
    assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    assert runner.prefill_replays == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_graph_replay_matches_eager(tiny_llama_path):
    rng = random.Random(2)
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    eager = LLM(tiny_llama_path, dtype="float32", device="cuda", max_num_seqs=4, cuda_graphs=False)
    graphs = LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 3}, dtype="float32",
                 device="cuda", max_num_seqs=4, cuda_graphs=True)
    assert graphs.target.graphs is not None and graphs.target.graphs.use_graphs
    assert graphs.target.graphs.query_lens == [1, 4]  # verify steps, and steps where nothing was drafted
    assert [o.token_ids for o in graphs.generate(prompts, params)] == \
        [o.token_ids for o in eager.generate(prompts, params)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_prefill_graphs(tiny_llama_path, dtype):
    """Prefill graphs (groups of new requests on scattered slots) replay on the GPU; in float32 the
    outputs are the eager engine's."""
    rng = random.Random(3)
    prompts = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 60))] for _ in range(9)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    kw = dict(dtype=dtype, device="cuda", max_num_seqs=4)
    eager = LLM(tiny_llama_path, **kw, cuda_graphs=False)
    graphs = LLM(tiny_llama_path, {"method": "copycat", "num_speculative_tokens": 3}, **kw, cuda_graphs=True,
                 prefill_graph_tokens=1024)
    got = [o.token_ids for o in graphs.generate(prompts, params)]
    assert graphs.target.graphs.prefill_replays > 0
    if dtype == "float32":
        assert got == [o.token_ids for o in eager.generate(prompts, params)]


@pytest.mark.parametrize("vocab", [128256, 32000, 151936, 1000, 97])
def test_row_argmax_is_argmax_ties_included(vocab):
    """The step graphs' two-stage argmax gives torch's argmax (the first maximum of each row) for vocabularies that
    split into chunks and ones that do not: random rows, a row of equal values, a maximum repeated in the first and
    last chunk, rows of many small-integer ties."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g)
    x[1] = 0.0
    x[2, 7] = x[2, vocab - 1] = 100.0
    x[3:] = torch.randint(0, 3, (3, vocab), generator=g).float()
    got = row_argmax(x)
    assert torch.equal(got, x.argmax(-1))
    assert got[1] == 0 and got[2] == 7


@pytest.mark.parametrize("contiguous", [True, False])
def test_static_path_hands_aux_layers_over_side_by_side(tiny_llama_path, contiguous):
    """A step graph's aux hidden states come back as column views of one [T, n * H] copy (one launch for every
    layer; adjacent_columns finds it), equal to the eager forward's, and the copy is the caller's own: the next
    replay does not change it. ``contiguous=False``: slots 1 and 3 of a 4-row graph (the gathered path)."""
    from specdec import HiddenStateRequest
    from specdec.runner import adjacent_columns

    hidden = HiddenStateRequest(last_layer=True, aux_layer_ids=(1, 2, 0))
    static = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64)
    eager = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64)
    for m in (static, eager):
        m.allocate(4)
    assert static.capture_graphs([1, 4], hidden=hidden, use_graphs=False)
    slots = [0, 1] if contiguous else [1, 3]
    toks = [[5, 6, 7, 8], [9, 10, 11, 12]]
    for m in (static, eager):
        for s in slots:
            m.forward([s], [[3, 4]], [1], hidden)
            m.advance(s, 2)
    a = static.forward(slots, toks, [4, 4], hidden)
    b = eager.forward(slots, toks, [4, 4], hidden)
    joined = adjacent_columns(a.aux_hidden_states)
    assert joined is not None and joined.shape == (8, 3 * 64)
    for x, y in zip(a.aux_hidden_states, b.aux_hidden_states):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
    kept = joined.clone()
    static.forward(slots, [[13, 14, 15, 16], [17, 18, 19, 20]], [4, 4], hidden)
    assert torch.equal(joined, kept)


def test_a_captured_graphs_aux_views_are_found_once(tiny_llama_path):
    """A captured step graph's aux outputs (layers side by side) are reshaped and matched to their joined tensor at
    the first replay only (``_flat_aux``: the buffers never move; on the H200 re-deriving them every plain step cost
    ~100 us of host time), and ``collect`` given that tensor hands over what it hands over finding it itself."""
    from specdec import HiddenStateRequest
    from specdec.cuda_graphs import _flat_aux, _Graph, side_by_side

    aux = side_by_side([torch.randn(2, 3, 16) for _ in range(3)])
    g = _Graph(*[torch.empty(0)] * 7, torch.randn(2, 3, 16), aux, None, object(), None, torch.empty(0))
    flat, base = _flat_aux(g)
    assert base is not None and base.shape == (6, 48) and base.data_ptr() == aux[0].data_ptr()
    assert [f.shape for f in flat] == [(6, 16)] * 3
    assert _flat_aux(g)[1] is base and _flat_aux(g)[0] is flat  # kept, not made again
    target = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", max_model_len=64)
    hidden = HiddenStateRequest(last_layer=False, aux_layer_ids=(1, 2, 0))
    h = torch.randn(6, 64)
    for rows, q, lens in (([0, 1], 3, [3, 3]), ([1], 3, [2])):  # the first rows whole; a gather
        got = target.collect(h, flat, rows, q, lens, [1] * len(rows), hidden, aux_base=base)
        want = target.collect(h, flat, rows, q, lens, [1] * len(rows), hidden)
        for x, y in zip(got.aux_hidden_states, want.aux_hidden_states):
            assert torch.equal(x, y)
        assert got.aux_hidden_states[0].data_ptr() != base.data_ptr()  # a copy: the next replay rewrites base

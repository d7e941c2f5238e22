"""Parity of the Triton rejection kernels (specdec.kernels.rejection_triton) with the torch reference
(specdec.rejection_sampler.sample_prepared) and the slow loop reference (specdec.kernels.rejection_naive).

All three read the same SamplerInputs (same probabilities, uniforms and exponential noise), so their
tokens must be identical, not just equally distributed. On CPU the kernels run in the Triton
interpreter: the module fixture loads a private copy of the kernel module with TRITON_INTERPRET=1 set
(only while this module's tests run), so the real ``specdec.kernels.rejection_triton`` stays compiled
for CUDA. Shapes are tiny and odd, with small vocabulary tiles so that every loop runs several times.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import specdec.kernels
from specdec import PLACEHOLDER_TOKEN_ID, SamplingMetadata, SamplingParams, SpecDecodeMetadata, rejection_sample
from specdec.kernels.rejection_naive import sample_prepared_naive
from specdec.rejection_sampler import SamplerInputs, _select_impl, prepare_sampler_inputs, sample_prepared

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (optional dependency: pip install triton); the torch sampler is used without it",
)

GREEDY = SamplingParams(temperature=0.0)
# Random requests cycle through these: plain, filtered (p has exact zeros), seeded.
RANDOM = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8, seed=11),
    SamplingParams(temperature=0.9, seed=5),
]
BAD_IDS = (-1, "V", "V+9")

# (B, k, V, block_v, num_splits): every B in {1, 3, 5}, k in {1, 3, 7}, V in {7, 33, 130} appears;
# tiles smaller than V so the vocabulary loop and the split combine both run.
SHAPES = [
    (1, 1, 7, 4, 2),
    (3, 3, 33, 8, 3),
    (5, 7, 130, 16, 2),
    (3, 7, 7, 8, 1),
    (5, 1, 33, 16, 1),
    (1, 3, 130, 32, 4),
]


@pytest.fixture(scope="module")
def rt(interpreted_copy):
    """A private copy of the kernel module whose kernels run in the Triton interpreter."""
    if torch.cuda.is_available():
        # Seen on an H200 with triton 3.6: its interpreter rejects these launches and leaves the
        # process unable to run compiled kernels afterwards. The interpreter is the CPU stand-in;
        # with a GPU, test_cuda_compiled_kernels_match_reference checks the compiled kernels.
        pytest.skip("CUDA present: the compiled kernels are tested instead of the interpreter")
    with interpreted_copy(Path(specdec.kernels.__file__).with_name("rejection_triton.py")) as module:
        yield module


# ------------------------------------------------------------------------------------------ helpers


def _bad_id(which, vocab: int) -> int:
    return {"V": vocab, "V+9": vocab + 9}.get(which, which)


def _case(batch: int, k: int, vocab: int, mode: str, with_probs: bool, seed: int, bad_rate: float = 0.1):
    """Metadata, draft probs, logits and sampling metadata for one test batch.

    Draft counts vary in [0, k] (one request has exactly k). Greedy drafts equal the target argmax
    3 times in 4, random drafts are sampled from q (or from p when there are no draft probs), so
    acceptance, rejection and the bonus path all occur; ``bad_rate`` of the ids are out of range.
    """
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, k + 1, (batch,), generator=g).tolist()
    counts[int(torch.randint(batch, (1,), generator=g))] = k
    if mode == "mixed":
        greedy = [(i + seed) % 2 == 0 for i in range(batch)]
    else:
        greedy = [mode == "greedy"] * batch
    params = [GREEDY if gr else RANDOM[(i + seed) % len(RANDOM)] for i, gr in enumerate(greedy)]
    n = sum(counts)
    logits = torch.randn(n + batch, vocab, generator=g) * 2.5  # [N + B, V]
    target_rows = [s + i + j for i, s in enumerate(_starts(counts)) for j in range(counts[i])]
    q = torch.softmax(logits[target_rows] + torch.randn(n, vocab, generator=g), -1) if with_probs else None
    drafts, f = [], 0
    for i, count in enumerate(counts):
        row = []
        for _ in range(count):
            r = target_rows[f]
            if float(torch.rand(1, generator=g)) < bad_rate:
                x = _bad_id(BAD_IDS[int(torch.randint(3, (1,), generator=g))], vocab)
            elif greedy[i]:
                take_argmax = float(torch.rand(1, generator=g)) < 0.75
                x = int(logits[r].argmax()) if take_argmax else int(torch.randint(vocab, (1,), generator=g))
            else:
                dist = q[f] if q is not None else torch.softmax(logits[r] / params[i].temperature, -1)
                x = int(torch.multinomial(dist, 1, generator=g))
            row.append(x)
            f += 1
        drafts.append(row)
    meta = SpecDecodeMetadata.from_draft_token_ids(drafts)
    return meta, q, logits, SamplingMetadata.from_params(params)


def _starts(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _assert_same(got: torch.Tensor, want: torch.Tensor, got_name: str, want_name: str, meta) -> None:
    """Exact equality of two ``[B, k + 1]`` outputs; on failure name the part that differs per request."""
    assert got.dtype == want.dtype == torch.int64, f"output dtype: {got_name} {got.dtype}, {want_name} {want.dtype}"
    assert got.shape == want.shape, f"output shape: {got_name} {tuple(got.shape)}, {want_name} {tuple(want.shape)}"
    if torch.equal(got.cpu(), want.cpu()):
        return
    lines = []
    drafts = meta.draft_token_ids.tolist()
    for i, start in enumerate(_starts(meta.num_draft_tokens)):
        a, b = got[i].tolist(), want[i].tolist()
        if a == b:
            continue
        len_a, len_b = sum(t != PLACEHOLDER_TOKEN_ID for t in a), sum(t != PLACEHOLDER_TOKEN_ID for t in b)
        part = ("accept_len (accepted drafts)" if len_a != len_b else
                "emitted token (recovered/bonus)" if a[len_a - 1] != b[len_b - 1] else "accepted drafts / padding")
        lines.append(f"  request {i} [{part}]: {got_name} {a} vs {want_name} {b}; "
                     f"drafts {drafts[start:start + meta.num_draft_tokens[i]]}")
    raise AssertionError(f"tensor 'output' of {got_name} differs from {want_name}:\n" + "\n".join(lines))


def _check_all(rt, meta, q, inputs: SamplerInputs, block_v: int | None = None, num_splits: int | None = None):
    want = sample_prepared(meta, q, inputs)
    _assert_same(sample_prepared_naive(meta, q, inputs), want, "naive loop reference", "torch reference", meta)
    got = rt.sample_prepared_triton(meta, q, inputs, block_v=block_v, num_splits=num_splits)
    _assert_same(got, want, "triton", "torch reference", meta)
    return want


# ------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("with_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
@pytest.mark.parametrize(("batch", "k", "vocab", "block_v", "num_splits"), SHAPES,
                         ids=[f"B{b}-k{k}-V{v}-blk{bv}-s{s}" for b, k, v, bv, s in SHAPES])
def test_parity_same_random_numbers(rt, batch, k, vocab, block_v, num_splits, mode, with_probs):
    seed = 1000 * batch + 100 * k + vocab + 10 * len(mode) + int(with_probs)
    meta, q, logits, sm = _case(batch, k, vocab, mode, with_probs, seed)
    torch.manual_seed(seed)
    inputs = prepare_sampler_inputs(meta, q, logits, sm)
    _check_all(rt, meta, q, inputs, block_v, num_splits)


@pytest.mark.parametrize("with_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_end_to_end_draws_the_same_random_stream(rt, with_probs):
    """rejection_sample_triton and rejection_sample draw through the same function: for the same
    global RNG state and the same seeds, the same tokens, call after call."""
    meta, q, logits, _ = _case(5, 7, 33, "mixed", with_probs, seed=3)
    params = [GREEDY, RANDOM[0], RANDOM[2], GREEDY, RANDOM[3]]
    sm_ref, sm_tri = SamplingMetadata.from_params(params), SamplingMetadata.from_params(params)
    for step in range(3):  # seeded generators advance identically across calls
        torch.manual_seed(100 + step)
        want = rejection_sample(meta, q, logits, sm_ref)
        torch.manual_seed(100 + step)
        got = rt.rejection_sample_triton(meta, q, logits, sm_tri)
        _assert_same(got, want, "rejection_sample_triton", "rejection_sample", meta)


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("with_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_bad_draft_ids_are_rejected(rt, bad, with_probs):
    vocab = 33
    meta, q, logits, sm = _case(5, 3, vocab, "mixed", with_probs, seed=7, bad_rate=0.0)
    ids = meta.draft_token_ids.clone()
    ids[::2] = _bad_id(bad, vocab)  # every other draft, including each request's first where it has one
    meta.draft_token_ids = ids
    torch.manual_seed(0)
    out = _check_all(rt, meta, q, prepare_sampler_inputs(meta, q, logits, sm), block_v=8, num_splits=2)
    assert ((out >= 0) & (out < vocab) | (out == PLACEHOLDER_TOKEN_ID)).all()
    for i, start in enumerate(_starts(meta.num_draft_tokens)):
        if meta.num_draft_tokens[i] and not 0 <= int(ids[start]) < vocab:
            assert out[i, 1:].eq(PLACEHOLDER_TOKEN_ID).all(), f"request {i} accepted a bad first draft"


@pytest.mark.parametrize("mode", ["greedy", "random", "mixed"])
def test_zero_draft_requests(rt, mode):
    batch, vocab = 5, 130
    params = [GREEDY if (mode == "greedy" or (mode == "mixed" and i % 2)) else RANDOM[i % 4] for i in range(batch)]
    meta = SpecDecodeMetadata.from_draft_token_ids([[]] * batch)
    logits = torch.randn(batch, vocab) * 2
    torch.manual_seed(1)
    inputs = prepare_sampler_inputs(meta, None, logits, SamplingMetadata.from_params(params))
    out = _check_all(rt, meta, None, inputs, block_v=32, num_splits=3)
    assert out.shape == (batch, 1)


def test_some_requests_without_drafts(rt):
    meta, q, logits, sm = _case(5, 3, 33, "mixed", True, seed=21)
    drafts = [[], [1, 2, 3], [], [4], []]
    meta = SpecDecodeMetadata.from_draft_token_ids(drafts)
    q = torch.softmax(torch.randn(4, 33), -1)
    logits = torch.randn(9, 33)
    torch.manual_seed(2)
    _check_all(rt, meta, q, prepare_sampler_inputs(meta, q, logits, sm), block_v=8, num_splits=2)


# ------------------------------------------------------------------------------------- edge cases


def _inputs(meta, logits, greedy: list[bool], p, u, noise) -> SamplerInputs:
    is_greedy = torch.tensor(greedy)
    return SamplerInputs(logits, is_greedy, bool(is_greedy.any()), bool((~is_greedy).any()), p, u, noise)


@pytest.mark.parametrize(("block_v", "num_splits"), [(4, 1), (8, 3), (32, 1)])
def test_ties_take_the_first_index_across_tiles_and_splits(rt, block_v, num_splits):
    """Greedy argmax and the race both break ties towards the lowest index, as torch.argmax does."""
    vocab = 33
    meta = SpecDecodeMetadata.from_draft_token_ids([[9, 9], []])  # rows 0, 1, 2 (bonus), 3 (bonus)
    logits = torch.zeros(4, vocab)
    logits[0, [9, 30]] = 5.0  # tie in different tiles: 9 wins, so draft 9 is accepted
    logits[1, [20, 31]] = 5.0  # 20 wins: draft 9 rejected, 20 emitted
    logits[3] = float("-inf")  # all -inf: torch.argmax gives 0
    greedy = _inputs(meta, logits, [True, True], None, torch.rand(2, dtype=torch.float64), torch.ones(2, vocab))
    out = _check_all(rt, meta, None, greedy, block_v, num_splits)
    assert out.tolist() == [[9, 20, -1], [0, -1, -1]]
    # Race: uniform p and constant noise make every ratio equal; the first token wins.
    p = torch.full((4, vocab), 1.0 / vocab)
    u = torch.tensor([0.0, 2.0], dtype=torch.float64)  # accept the first draft, reject the second
    race = _inputs(meta, logits, [False, False], p, u, torch.ones(2, vocab))
    out = _check_all(rt, meta, None, race, block_v, num_splits)
    assert out.tolist() == [[9, 0, -1], [0, -1, -1]]


@pytest.mark.parametrize("with_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_residual_without_mass_falls_back_to_p(rt, with_probs):
    """A draft with q(x) = p(x) = 0 is rejected and max(p - q, 0) is all zero when q == p: the
    emitted token then comes from p itself at that row."""
    vocab = 33
    meta = SpecDecodeMetadata.from_draft_token_ids([[5], [7]])
    p = torch.softmax(torch.randn(4, vocab), -1)
    p[:2, [5, 7]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    q = p[:2].clone() if with_probs else None
    u = torch.tensor([0.5, 0.5], dtype=torch.float64)
    noise = torch.empty(2, vocab).exponential_()
    inputs = _inputs(meta, torch.zeros(4, vocab), [False, False], p, u, noise)
    out = _check_all(rt, meta, q, inputs, block_v=8, num_splits=2)
    assert out[:, 1].tolist() == [-1, -1]
    assert out[:, 0].tolist() == (p[:2] * noise).argmax(-1).tolist()


def test_bf16_logits_and_draft_probs(rt):
    meta, q, logits, sm = _case(3, 3, 33, "mixed", True, seed=8)
    q, logits = q.bfloat16(), logits.bfloat16()
    torch.manual_seed(4)
    _check_all(rt, meta, q, prepare_sampler_inputs(meta, q, logits, sm), block_v=8, num_splits=3)


# ------------------------------------------------------------------------------ launcher and seam


def _launch_args(batch=2, n=3, vocab=7):
    return dict(
        draft_token_ids=torch.zeros(n, dtype=torch.int64),
        cu_num_draft_tokens=torch.tensor([1, n], dtype=torch.int32),
        is_greedy=torch.zeros(batch, dtype=torch.bool),
        logits=None,
        target_rows=torch.zeros(n, dtype=torch.int64),
        bonus_rows=torch.zeros(batch, dtype=torch.int64),
        p=torch.full((n + batch, vocab), 1.0 / vocab),
        draft_probs=None,
        u=torch.zeros(n, dtype=torch.float64),
        noise=torch.ones(batch, vocab),
    )


@pytest.mark.parametrize(("change", "fragment"), [
    ({"p": torch.zeros(5, 7, dtype=torch.float64)}, "p must be a contiguous 2-d float32 tensor"),
    ({"p": torch.zeros(4, 7)}, "p must have shape [N + B, V] = [5, 7], got (4, 7)"),
    ({"noise": torch.ones(7, 2).t()}, "noise must be a contiguous 2-d float32 tensor on cpu, got torch.float32 (2, 7) "
                                      "non-contiguous"),
    ({"u": torch.zeros(3)}, "u must be a contiguous 1-d float64 tensor"),
    ({"u": torch.zeros(2, dtype=torch.float64)}, "u must have 3 entries, got 2"),
    ({"draft_probs": torch.zeros(3, 8)}, "draft_probs must have shape [N, V] = [3, 7], got (3, 8)"),
    ({"is_greedy": torch.zeros(2, dtype=torch.int32)}, "is_greedy must be a contiguous 1-d bool tensor"),
    ({"logits": torch.zeros(7, 5).t()}, "logits must be a [R, V=7] float32/float16/bfloat16 tensor"),
    ({"block_v": 24}, "block_v must be a power of 2, got 24"),
    ({"p": None}, "logits (greedy requests) and p (random requests) are both None"),
])
def test_launcher_rejects_bad_tensors(rt, change, fragment):
    args = _launch_args() | change
    with pytest.raises(ValueError) as err:
        rt.launch_rejection_kernels(torch.empty(2, 3, dtype=torch.int64), **args)
    assert fragment in str(err.value)


def test_launcher_requires_cuda_outside_the_interpreter(rt, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="run on CUDA tensors"):
        rt.launch_rejection_kernels(torch.empty(2, 3, dtype=torch.int64), **_launch_args())


def test_float64_inputs_use_the_torch_reference(rt):
    meta, q, logits, sm = _case(3, 3, 7, "mixed", True, seed=9)
    torch.manual_seed(0)
    inputs = prepare_sampler_inputs(meta, q.double(), logits.double(), sm)
    want = sample_prepared(meta, q.double(), inputs)
    _assert_same(rt.sample_prepared_triton(meta, q.double(), inputs), want, "triton (float64)", "torch reference",
                 meta)


def test_select_impl_picks_triton_on_cuda_only(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the real module must compile for CUDA
    assert _select_impl(torch.device("cpu")) is rejection_sample
    assert _select_impl(torch.device("cuda")).__name__ == "rejection_sample_triton"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for the compiled kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_compiled_kernels_match_reference(monkeypatch, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from specdec.kernels.rejection_triton import rejection_sample_triton

    assert _select_impl(torch.device("cuda")) is rejection_sample_triton
    for seed, (batch, k, vocab) in enumerate([(1, 1, 7), (5, 7, 130), (33, 5, 32_000), (7, 3, 152_064)]):
        meta, q, logits, _ = _case(batch, k, vocab, "mixed", seed % 2 == 0, seed)
        meta = SpecDecodeMetadata.from_draft_token_ids(
            [meta.draft_token_ids[s:s + c].tolist() for s, c in zip(_starts(meta.num_draft_tokens),
                                                                     meta.num_draft_tokens)], device="cuda")
        q = q.to("cuda", dtype) if q is not None else None
        logits = logits.to("cuda", dtype)
        params = [GREEDY if i % 2 else RANDOM[i % 4] for i in range(batch)]
        torch.manual_seed(seed)
        want = rejection_sample(meta, q, logits, SamplingMetadata.from_params(params, "cuda"))
        torch.manual_seed(seed)
        got = rejection_sample_triton(meta, q, logits, SamplingMetadata.from_params(params, "cuda"))
        _assert_same(got, want, "triton (CUDA)", "torch reference (CUDA)", meta)

"""FusedLlama, the draft's fused forward: same hidden states and KV entries as Hugging Face's layers
(torch steps on the CPU; the Triton kernels in the interpreter), and the reasons it refuses a model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specdec.fused as fused_module
from specdec import HFTargetModel, bundled_model
from specdec.fused import FusedLlama, fused_support


@pytest.fixture(scope="module")
def fk(interpreted_copy):
    """A private copy of the fused kernels module, its kernels run by the Triton interpreter."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the compiled kernels are tested by test_cuda_graph_chain_is_lossless instead")
    with interpreted_copy(Path(fused_module.__file__).with_name("fused_kernels.py")) as module:
        yield module


# The interpreter runs kernels only while torch._inductor is not imported (loading a Hugging Face
# model imports it), so the kernel tests come first and use plain tensors.
@pytest.mark.parametrize("dtype,atol,rtol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 5e-2, 2e-2)])
def test_triton_kernels_match_torch_steps(fk, dtype, atol, rtol):
    """Each kernel against its torch step; bfloat16 within one rounding step (the two differ in the
    order of their float32 sums)."""
    _check_kernels(fk, torch.device("cpu"), dtype, atol, rtol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need a CUDA device (none here)")
@pytest.mark.parametrize("dtype,atol,rtol", [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 5e-2, 2e-2)])
def test_cuda_kernels_match_torch_steps(dtype, atol, rtol):
    import specdec.fused_kernels as compiled

    _check_kernels(compiled, torch.device("cuda"), dtype, atol, rtol)


def _check_topk(fk, randn, device):
    """topk (token trees' selection): the indices torch.topk gives and its values (float32), with log_softmax the
    float32 log-probabilities' top k, in one launch (a row in one program) and chunked (rows wider than TOPK_CHUNK,
    merged by a second kernel); ties go to the lower index and -inf entries come last, each index once."""
    for shape, k in (((3, 100), 5), ((2, 4, 300), 8), ((2, fk.TOPK_CHUNK + 1808), 8), ((2, 64), 8)):
        x = randn(*shape)
        for lsm in (False, True):
            vals, idx = fk.topk(x, k, log_softmax=lsm)
            ref = torch.log_softmax(x.float(), -1) if lsm else x.float()
            assert vals.dtype == torch.float32 and idx.dtype == torch.int64
            torch.testing.assert_close(vals, ref.topk(k, -1).values, atol=1e-5, rtol=1e-5)  # the k largest
            torch.testing.assert_close(vals, ref.gather(-1, idx), atol=1e-5, rtol=1e-5)  # at those indices
            assert (idx.sort(-1).values.diff(dim=-1) > 0).all()  # each once
            tie = vals[..., 1:] == vals[..., :-1]
            assert (idx[..., 1:][tie] > idx[..., :-1][tie]).all(), (shape, lsm)  # equal values: the lower index first
    x = torch.tensor([[1.0, 3.0, 3.0, float("-inf"), 2.0, float("-inf")]], device=device)
    vals, idx = fk.topk(x, 6)
    assert idx.tolist() == [[1, 2, 4, 0, 3, 5]] and vals[0, :4].tolist() == [3.0, 3.0, 2.0, 1.0]
    with pytest.raises(ValueError, match=r"topk needs 1 <= k <= min\(64, 6\), got k=7"):
        fk.topk(x, 7)


def _check_kernels(fk, device, dtype, atol, rtol):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    x, res, w = randn(5, 96), randn(5, 96), randn(96)
    for residual in (None, res):
        for got, want in zip(fk.add_rmsnorm(x, residual, w, 1e-6), fused_module.add_rmsnorm(x, residual, w, 1e-6)):
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    gu = randn(7, 2 * 1100)  # more columns than one block
    torch.testing.assert_close(fk.silu_mul(gu), fused_module.silu_mul(gu), atol=atol, rtol=rtol)
    _check_linears(fk, randn, atol, rtol)
    _check_row_linear(fk, randn, atol, rtol)
    _check_topk(fk, randn, device)
    # GQA rope + KV write: 3 rows x 2 query tokens into slots 2, 0, 3; the last position is past the
    # 10-position table (an idle row's), so both clamp it.
    b, q, nh, nk, d = 3, 2, 4, 2, 16
    qkv, cos, sin = randn(b * q, (nh + 2 * nk) * d), randn(10, d), randn(10, d)
    pos = torch.tensor([0, 1, 7, 8, 9, 12], device=device)
    wpos = torch.tensor([0, 1, 7, 8, 9, 10], device=device)
    slot = torch.tensor([2, 2, 0, 0, 3, 3], device=device)
    caches = [[torch.zeros(4, nk, 11, d, dtype=dtype, device=device) for _ in range(2)] for _ in range(2)]
    q_got = fk.rope_store(qkv, cos, sin, pos, wpos, slot, *caches[0], b, q, nh, nk, d)
    q_want = fused_module.rope_store(qkv, cos, sin, pos, wpos, slot, *caches[1], b, q, nh, nk, d)
    assert q_got.shape == (b, nh, q, d)
    torch.testing.assert_close(q_got, q_want, atol=atol, rtol=rtol)
    for got, want in zip(*caches):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    assert caches[0][0][1].abs().sum() == 0  # slot 1 untouched
    # Index views, as FusedLlama passes them: for one row its slot index is row_index.expand(1, q)
    # flattened, a stride-0 view of one element (the kernel once read entries past it: an illegal memory
    # access on the H200), and here the positions are a strided view too.
    b, q = 1, 4
    qkv = randn(b * q, (nh + 2 * nk) * d)
    pos = torch.arange(8, device=device)[::2]
    wpos = torch.arange(4, device=device) + 5
    slot = torch.tensor([[3]], device=device).expand(1, q).reshape(-1)
    assert slot.stride() == (0,) and pos.stride() == (2,)
    caches = [[torch.zeros(4, nk, 11, d, dtype=dtype, device=device) for _ in range(2)] for _ in range(2)]
    q_got = fk.rope_store(qkv, cos, sin, pos, wpos, slot, *caches[0], b, q, nh, nk, d)
    q_want = fused_module.rope_store(qkv, cos, sin, pos, wpos, slot, *caches[1], b, q, nh, nk, d)
    torch.testing.assert_close(q_got, q_want, atol=atol, rtol=rtol)
    for got, want in zip(*caches):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    if device.type == "cpu" and dtype == torch.bfloat16:
        # The Triton interpreter's tl.dot is wrong on bfloat16 operands (triton 3.9: errors of 1e10 on a plain
        # 16x16 product; float16 and float32 are right): the half-precision path is checked in float16 here, and
        # in bfloat16 by test_cuda_kernels_match_torch_steps on a GPU.
        def randn(*shape):  # noqa: F811
            return torch.randn(*shape, generator=g).to(device=device, dtype=torch.float16)
        dtype = torch.float16
    _check_attend(fk, randn, device, dtype, atol, rtol)


def _check_linears(fk, randn, atol, rtol):
    """The one-row projection against F.linear: weights whose rows and columns do not fill the kernel's tiles (n 42,
    k 96 and 1100: one and two column steps of ROW_BLOCK_K when it is 64), with and without a bias, 4 and 8 weight rows
    a program, and a few rows at once (``max_rows``); more rows, a transposed weight or a strided row go to cuBLAS with
    the same result."""
    saved = fk.ROW_BLOCK_K, fk.ROW_WIDE_N
    try:
        for block_k, k in ((1024, 96), (64, 96), (64, 1100)):
            fk.ROW_BLOCK_K = block_k
            for wide in (16384, 40):  # 4 weight rows a program, then 8
                fk.ROW_WIDE_N = wide
                n = 42
                w, bias, x = randn(n, k), randn(n), randn(1, k)
                for b in (None, bias):
                    got = fk.linear(x, w, b)
                    assert got.shape == (1, n)
                    torch.testing.assert_close(got, fused_module.linear(x, w, b), atol=atol * 8, rtol=rtol)
                # a few rows at once (max_rows: the few-row kernel)
                xs = randn(3, k)
                got = fk.linear(xs, w, bias, max_rows=4)
                torch.testing.assert_close(got, fused_module.linear(xs, w, bias), atol=atol * 8, rtol=rtol)
        w = randn(42, 96)
        for x, weight, rows in ((randn(3, 96), w, 1), (randn(5, 96), w, 4), (randn(1, 96), randn(96, 42).t(), 1),
                                (randn(1, 192)[:, ::2], w, 1), (randn(2, 192)[:, ::2], w, 4)):
            torch.testing.assert_close(fk.linear(x, weight, max_rows=rows), fused_module.linear(x, weight),
                                       atol=atol * 8, rtol=rtol)
    finally:
        fk.ROW_BLOCK_K, fk.ROW_WIDE_N = saved


def _check_row_linear(fk, randn, atol, rtol):
    """The one-row kernel with its neighbours (row_linear) against the torch steps: the RMSNorm before (with a bias
    after), SiLU(gate) * up before, the residual add after, alone and together, over one and several column steps;
    a few rows in one launch (``max_rows``); what it does not take (more rows than ``max_rows``, a strided row) goes to
    the torch steps."""
    saved, saved_tile = fk.ROW_BLOCK_K, fk.ROWS_TILE
    try:
        for block_k, k in ((1024, 96), (64, 1100)):
            fk.ROW_BLOCK_K = block_k
            n = 42
            w, bias, nw, res = randn(n, k), randn(n), randn(k), randn(1, n)
            x, gu = randn(1, k) * 3, randn(1, 2 * k)
            for kw in (dict(norm=nw), dict(bias=bias, norm=nw, residual=res), dict(glu=True),
                       dict(glu=True, residual=res), dict(residual=res)):
                inp = gu if kw.get("glu") else x
                got = fk.row_linear(inp, w, eps=1e-5, **kw)
                assert got.shape == (1, n)
                want = fused_module.row_linear(inp, w, eps=1e-5, **kw)
                torch.testing.assert_close(got, want, atol=atol * 8, rtol=rtol, msg=lambda m, kw=kw: f"{kw}: {m}")
                # three rows in one launch (max_rows: the few-row kernel, its tile of products bounded by
                # ROWS_TILE; 256: several column steps)
                rows = torch.cat((inp, randn(2, inp.shape[1])))
                kw3 = {**kw, "residual": torch.cat((res, randn(2, n)))} if "residual" in kw else kw
                want = fused_module.row_linear(rows, w, eps=1e-5, **kw3)
                for tile in (fk.ROWS_TILE, 256):
                    fk.ROWS_TILE = tile
                    got = fk.row_linear(rows, w, eps=1e-5, max_rows=3, **kw3)
                    torch.testing.assert_close(got, want, atol=atol * 8, rtol=rtol,
                                               msg=lambda m, kw=kw: f"rows {kw}: {m}")
                fk.ROWS_TILE = saved_tile
            # float32 logits from a half-precision LM head, written in place
            buf = torch.full((1, n), float("nan"), device=x.device)
            got = fk.row_linear(x, w, out=buf)
            assert got.data_ptr() == buf.data_ptr() and got.dtype == torch.float32
            torch.testing.assert_close(buf, fused_module.linear(x, w).float(), atol=atol * 8, rtol=rtol)
            buf = torch.full((2, n), float("nan"), device=x.device)
            xs = torch.cat((x, randn(1, k)))
            got = fk.row_linear(xs, w, norm=nw, out=buf, max_rows=2)
            assert got.data_ptr() == buf.data_ptr()
            torch.testing.assert_close(buf, fused_module.row_linear(xs, w, norm=nw, eps=1e-6).float(), atol=atol * 8,
                                       rtol=rtol)
        w, nw, res = randn(42, 96), randn(96), randn(2, 42)
        for x in (randn(2, 96), randn(1, 192)[:, ::2]):
            torch.testing.assert_close(fk.row_linear(x, w, norm=nw, residual=res[: x.shape[0]]),
                                       fused_module.row_linear(x, w, norm=nw, residual=res[: x.shape[0]]),
                                       atol=atol * 8, rtol=rtol)
    finally:
        fk.ROW_BLOCK_K, fk.ROWS_TILE = saved, saved_tile


def _check_attend(fk, randn, device, dtype, atol, rtol):
    """Attention over slot caches: GQA (4 query heads on 2 KV heads) and MHA, one and several query tokens, rows
    reading slots out of order, a KV length past one 64-key block, causal (chain) and tree masks, queries as a
    strided view (as the rotary step leaves them). Rows that see no key at all (an idle row of an empty slot) give
    zeros, not NaN; the reference's output there is unspecified (SDPA averages every value)."""
    masked = torch.finfo(dtype).min
    for nh, nk, d in ((4, 2, 16), (2, 2, 32)):
        k_buf, v_buf = randn(4, nk, 90, d), randn(4, nk, 90, d)
        for q_len, starts, ns in ((1, [70, 3, 0], [1, 1, 0]), (3, [66, 0, 9], [3, 2, 1])):
            b, kv_len = len(starts), 80
            row_index = torch.tensor([[2], [0], [3]], device=device)
            heads = randn(b * q_len, nh + 2, d)[:, 1: nh + 1]  # a strided view of [b * q, nh, d]
            q = heads.view(b, q_len, nh, d)
            assert not q.is_contiguous()
            j = torch.arange(q_len, device=device)
            start, n = torch.tensor(starts, device=device), torch.tensor(ns, device=device)
            limit = torch.minimum(start[:, None] + j, (start + n - 1)[:, None])
            keys = torch.arange(kv_len, device=device)
            mask = torch.where(keys <= limit[:, :, None], 0.0, masked).to(dtype)[:, None]
            if q_len == 3:  # row 0 as a tree: token 2 is a sibling of token 1, not its child
                mask[0, 0, 2, 67] = masked
            ends = fused_module.visible_ends(mask)
            assert ends.tolist() == [starts[0] + ns[0], starts[1] + ns[1], starts[2] + ns[2]]
            want = fused_module.attend(q, k_buf, v_buf, mask, row_index[:, 0], row_index, kv_len, d ** -0.5)
            sees = (limit >= 0)  # [b, q]
            # several key splits merged (3 rows x nk heads leave room for them), then one split; rows read up to
            # their visible end, or the whole kv_len
            for programs, row_ends in ((256, ends), (1, ends), (256, None)):
                fk.ATTEND_PROGRAMS = programs
                try:
                    got = fk.attend(q, k_buf, v_buf, mask, row_index[:, 0], row_index, kv_len, d ** -0.5, row_ends)
                finally:
                    fk.ATTEND_PROGRAMS = 256
                assert got.shape == (b, q_len, nh, d) and torch.isfinite(got).all()
                torch.testing.assert_close(got[sees], want[sees], atol=atol, rtol=rtol)
                assert (got[~sees] == 0).all()


def _inputs(model: HFTargetModel, tokens: list[list[int]], q: int):
    """Step tensors for ``tokens`` (padded to ``q``) on slots 0..b-1 at their current lengths."""
    b = len(tokens)
    ids = torch.zeros(b, q, dtype=torch.long)
    for i, t in enumerate(tokens):
        ids[i, : len(t)] = torch.tensor(t)
    start = torch.tensor(model.lengths[:b])
    n = torch.tensor([len(t) for t in tokens])
    kv_len = max(s + len(t) for s, t in zip(model.lengths, tokens))
    return ids, start, n, kv_len


def _two_steps(model: HFTargetModel, run) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """A ragged prefill of three slots, then a 3-token step (one row idle): each step's hidden states
    of real positions and a copy of every layer's written keys."""
    model.allocate(4)
    for buf in model.cache.keys + model.cache.values:  # allocate() keeps entries of an earlier run
        buf.zero_()
    out = []
    for tokens, q in (([[5, 9, 11, 2, 7], [3], [8, 8, 4]], 5), ([[6, 1, 9], [], [2, 5]], 3)):
        ids, start, n, kv_len = _inputs(model, tokens, q)
        h = run(ids, start, n, kv_len)
        real = torch.cat([h[i, : len(t)] for i, t in enumerate(tokens)])
        out.append((real, [k.clone() for k in model.cache.keys] + [v.clone() for v in model.cache.values]))
        for i, t in enumerate(tokens):
            model.advance(i, len(t))
    return out


def _hf_run(model):
    def run(ids, start, n, kv_len):
        rows, row_index = slice(0, ids.shape[0]), torch.arange(ids.shape[0])[:, None]
        return model.run(ids, rows, row_index, kv_len, model.step_tensors(start, n, ids.shape[1], kv_len))[0]
    return run


def _fused_run(model, fused):
    def run(ids, start, n, kv_len):
        rows, row_index = slice(0, ids.shape[0]), torch.arange(ids.shape[0])[:, None]
        positions, write_pos, mask = model.step_tensors(start, n, ids.shape[1], kv_len)
        return fused.forward(ids, positions, write_pos, mask, rows, row_index, kv_len)
    return run


def _assert_same(want, got, atol):
    for (h_want, kv_want), (h_got, kv_got) in zip(want, got):
        torch.testing.assert_close(h_got, h_want, atol=atol, rtol=1e-4)
        for a, b in zip(kv_want, kv_got):
            # Every position but the scratch one (padding writes land there in either order).
            torch.testing.assert_close(b[:, :, :-1], a[:, :, :-1], atol=atol, rtol=1e-4)


@torch.inference_mode()
def test_torch_steps_match_hf_layers(tiny_llama_path):
    """GQA Llama, float32: hidden states and KV entries as Hugging Face's layers compute them."""
    model = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu")
    want = _two_steps(model, _hf_run(model))
    fused = FusedLlama(model)
    assert not fused.use_triton  # CPU: torch steps
    _assert_same(want, _two_steps(model, _fused_run(model, fused)), atol=1e-5)


@torch.inference_mode()
def test_bundled_draft_matches_hf_layers():
    """The bundled tiny-draft (MHA, head_dim 32): the fused forward's greedy next tokens are HF's."""
    model = HFTargetModel(bundled_model("tiny-draft"), dtype="float32", device="cpu")
    want = _two_steps(model, _hf_run(model))
    got = _two_steps(model, _fused_run(model, FusedLlama(model)))
    _assert_same(want, got, atol=1e-4)
    for (h_want, _), (h_got, _) in zip(want, got):
        assert torch.equal(model.lm_head(h_got).argmax(-1), model.lm_head(h_want).argmax(-1))


def test_kernel_choices(fk):
    """With Triton kernels: every step a kernel by default (rotary + KV write, RMSNorm, SiLU, attention, the
    one-row projections); triton_linear=False cuBLAS for those, triton_rope=False keeps the
    torch rotary step (its rows gathered once), triton_attention=False SDPA; without
    Triton (the CPU default) the torch steps."""
    model = HFTargetModel(bundled_model("tiny-draft"), dtype="float32", device="cpu")
    default = FusedLlama(model, use_triton=True, kernels=fk)
    assert default.triton_rope and default.ops.rope_store is fk.rope_store
    assert default.ops.add_rmsnorm is fk.add_rmsnorm and default.ops.silu_mul is fk.silu_mul
    assert default.triton_attention and default.ops.attend is fk.attend
    assert default.triton_linear and default.ops.linear is fk.linear
    assert default.fuse_one_row and default.ops.row_linear is fk.row_linear
    cublas = FusedLlama(model, use_triton=True, kernels=fk, triton_linear=False)
    assert not cublas.triton_linear and cublas.ops.linear is torch.nn.functional.linear
    assert not cublas.fuse_one_row and cublas.ops.row_linear is fused_module.row_linear
    torch_rope = FusedLlama(model, use_triton=True, kernels=fk, triton_rope=False)
    assert not torch_rope.triton_rope and torch_rope.ops.rope_store is None  # the torch step, rows gathered once
    plain = FusedLlama(model, use_triton=True, kernels=fk, triton_attention=False)
    assert not plain.triton_attention and plain.ops.attend is fused_module.attend
    cpu = FusedLlama(model)
    assert not cpu.use_triton and not cpu.triton_rope and cpu.ops.attend is fused_module.attend
    assert not cpu.triton_linear and cpu.ops.linear is torch.nn.functional.linear and not cpu.fuse_one_row
    assert not FusedLlama(model, use_triton=False, triton_rope=True).triton_rope  # torch steps only


def test_narrow_heads_keep_sdpa(fk, tiny_llama_draft_path):
    """head_dim 8 (the 1-layer test draft): the attention kernel's tl.dot needs 16-wide operands, so attention stays
    SDPA while the other kernels run; the kernel itself refuses such heads with the reason."""
    model = HFTargetModel(tiny_llama_draft_path, dtype="float32", device="cpu")
    fused = FusedLlama(model, use_triton=True, kernels=fk)
    assert fused.head_dim == 8 and not fused.triton_attention and fused.ops.attend is fused_module.attend
    assert fused.triton_rope and fused.ops.add_rmsnorm is fk.add_rmsnorm
    q, kv = torch.zeros(1, 1, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"attend needs a head_dim >= 16 \(tl.dot's smallest operand\), got 8"):
        fk.attend(q, kv, kv, torch.zeros(1, 1, 1, 4), slice(0, 1), torch.zeros(1, 1, dtype=torch.long), 4, 1.0)


def test_unsupported_models_are_refused_with_the_reason(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path / "gelu"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=96, hidden_act="gelu")).save_pretrained(path)
    model = HFTargetModel(str(path), dtype="float32", device="cpu")
    reason = "hidden_act 'gelu' is not 'silu'"
    assert fused_support(model) == reason
    with pytest.raises(ValueError, match=r"FusedLlama cannot run .*: hidden_act 'gelu' is not 'silu'"):
        FusedLlama(model)


def test_the_draft_chain_shares_the_draft_runners_fused_forward():
    """Where the draft's runner fuses its own forward (by default, over views of its weights), the greedy chain runs
    through that one instead of a second FusedLlama with its own concatenated copies; without one (``fused_forward
    =False`` on the runner) the chain makes its own."""
    from specdec import LLM

    llm = LLM(bundled_model("tiny"), {"method": "draft_model", "num_speculative_tokens": 3}, device="cpu",
              max_num_seqs=2)
    proposer = llm.proposer
    assert proposer.draft.fused is not None and proposer._chain.fused is proposer.draft.fused
    proposer.draft.fused = None
    own = proposer._build_chain(use_graphs=False).fused
    assert isinstance(own, FusedLlama) and own.model is proposer.draft

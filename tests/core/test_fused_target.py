"""The target's fused forward (issue 28, ``fused_forward``): ModelRunner.run through specdec.fused.FusedLlama gives
Hugging Face's logits and hidden states (float32, within rounding), in steps, tree forwards and the static
(graph) path; greedy output, with and without speculation, equals the unfused baseline; weights are shared,
not copied, for a model loaded from a path; unsupported models and bad values are refused with the reason."""

from __future__ import annotations

import random

import pytest
import torch

from specdec import LLM, HFTargetModel, HiddenStateRequest, SamplingParams

NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels run on CUDA (none here)")
PROMPTS = [[2, 3, 4, 5, 6, 7, 3, 4, 5], [8, 9, 10], [11, 12, 13, 14, 15, 11, 12]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _pair(path, device="cpu", **kw):
    hf = HFTargetModel(path, dtype="float32", device=device, max_model_len=128, fused_forward=False, **kw)
    fused = HFTargetModel(path, dtype="float32", device=device, max_model_len=128, fused_forward=True, **kw)
    assert hf.fused is None and fused.fused is not None
    for m in (hf, fused):
        m.allocate(3)
    return hf, fused


DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]  # on CUDA: the Triton kernels (rotary, attention, norms)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen2_path", "tiny_qwen3_path"])
def test_fused_steps_give_hugging_faces_logits_and_hidden_states(request, fixture, device):
    hf, fused = _pair(request.getfixturevalue(fixture), device)
    assert fused.fused.use_triton == (device == "cuda")
    n = hf.num_layers
    want = HiddenStateRequest(last_layer=True, aux_layer_ids=[0, 1, n - 1, n])
    rng = random.Random(0)
    outs = [m.forward([0, 1, 2], PROMPTS, [1, 1, 1], want) for m in (hf, fused)]
    for step in range(4):
        a, b = outs
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.hidden_states, a.hidden_states, atol=1e-4, rtol=1e-4)
        for x, y in zip(b.aux_hidden_states, a.aux_hidden_states):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
        lens = [len(p) for p in PROMPTS] if step == 0 else [3, 1, 2]
        for m in (hf, fused):
            for s, k in enumerate(lens):
                m.advance(s, k)
        toks = [[rng.randrange(2, 90) for _ in range(q)] for q in (3, 1, 2)]
        outs = [m.forward([0, 1, 2], toks, [3, 1, 2], want) for m in (hf, fused)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen2_path", "tiny_qwen3_path"])
def test_one_row_steps_give_hugging_faces_logits_and_hidden_states(request, fixture, device):
    """Batch-1 decoding: a step of one token runs FusedLlama's one-row path (each projection with its RMSNorm, SiLU *
    up or residual add inside, row_linear; on CUDA by default, on the CPU as its torch steps when switched on), with
    Hugging Face's logits, final and aux hidden states (the residual stream entering a layer) and KV entries."""
    hf, fused = _pair(request.getfixturevalue(fixture), device)
    f = fused.fused
    assert f.fuse_one_row == (device == "cuda")
    f.fuse_one_row = True
    calls = []
    inner = f.ops.row_linear
    f.ops.row_linear = lambda *a, **kw: calls.append(kw) or inner(*a, **kw)
    n = hf.num_layers
    want = HiddenStateRequest(last_layer=True, aux_layer_ids=[0, 1, n - 1, n])
    rng = random.Random(1)
    prompt = PROMPTS[0]
    outs = [m.forward([0], [prompt], [1], want) for m in (hf, fused)]
    assert not calls  # a prompt of several tokens: the rows path
    for m in (hf, fused):
        m.advance(0, len(prompt))
    for _ in range(3):
        tok = [[rng.randrange(2, 90)]]
        outs = [m.forward([0], tok, [1], want) for m in (hf, fused)]
        a, b = outs
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.hidden_states, a.hidden_states, atol=1e-4, rtol=1e-4)
        for x, y in zip(b.aux_hidden_states, a.aux_hidden_states, strict=True):
            torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
        for m in (hf, fused):
            m.advance(0, 1)
    for kv_hf, kv_fused in zip(hf.cache.keys + hf.cache.values, fused.cache.keys + fused.cache.values):
        end = len(prompt) + 3
        torch.testing.assert_close(kv_fused[0, :, :end], kv_hf[0, :, :end], atol=1e-4, rtol=1e-4)
    # the LM head of one row writes its float32 logits into the step graph's buffer itself (one more call)
    with torch.no_grad():  # as the runner calls it (under inference mode)
        h = fused.fused.forward(torch.tensor([[7]], device=device), *fused.step_tensors(
            torch.tensor([end], device=device), torch.ones(1, dtype=torch.long, device=device), 1, end + 1),
            slice(0, 1), torch.zeros(1, 1, dtype=torch.long, device=device), end + 1).reshape(1, -1)
    buf = torch.full((1, fused.lm_head.weight.shape[0]), float("nan"), device=device)
    assert fused.compute_logits(h, out=buf) is not None and calls[-1] == {"out": buf}
    torch.testing.assert_close(buf, fused.lm_head(h).float(), atol=1e-5, rtol=1e-5)
    calls = calls[:-1 - 4 * n]
    # four a layer: q/k/v after the first norm, o with the residual, gate/up after the second norm, down with both
    assert len(calls) == 3 * 4 * n
    assert [sorted(kw) for kw in calls[:4]] == [["eps", "norm"], ["residual"], ["eps", "norm"], ["glu", "residual"]]


@pytest.mark.parametrize("device", DEVICES)
def test_fused_tree_forward_and_static_path(tiny_llama_path, device):
    hf, fused = _pair(tiny_llama_path, device)
    assert fused.capture_graphs([1, 4], use_graphs=False, tree_lens=[8])  # the static path runs fused.run too
    for m in (hf, fused):
        m.forward([0, 1, 2], PROMPTS, [1, 1, 1])
        for s, p in enumerate(PROMPTS):
            m.advance(s, len(p))
    tokens, parents = [[40, 41, 42, 43, 44], [50, 51], [60]], [[0, 0, 1, 1], [0], []]
    a, b = (m.forward_tree([0, 1, 2], tokens, parents) for m in (hf, fused))
    assert fused.graphs.tree_replays == 1
    torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)
    a, b = (m.forward([2, 0], [[7, 8], [9]], [2, 1]) for m in (hf, fused))
    torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("spec", [None, {"method": "ngram", "num_speculative_tokens": 3},
                                  {"method": "eagle3", "num_speculative_tokens": 3}])
def test_greedy_output_equals_the_unfused_baseline(spec):
    import specdec

    tiny = specdec.bundled_model("tiny")
    prompts = ["def add(a, b):\n    return", "import os\nimport sys\n", "for i in range(10):\n    print("]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    base = LLM(tiny, dtype="float32", device="cpu", max_num_seqs=3, fused_forward=False)
    llm = LLM(tiny, spec, dtype="float32", device="cpu", max_num_seqs=3, fused_forward=True)
    assert llm.target.fused is not None
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in base.generate(prompts, params)]


def test_weights_are_shared_for_a_model_loaded_from_a_path(tiny_llama_path):
    _, fused = _pair(tiny_llama_path)
    layer, fl = fused.base.layers[1], fused.fused.layers[1]
    q, g = layer.self_attn.q_proj.weight, layer.mlp.gate_proj.weight
    assert q.data_ptr() == fl.wqkv.data_ptr() and g.data_ptr() == fl.wgu.data_ptr()
    assert layer.self_attn.v_proj.weight.data_ptr() == fl.wqkv[-layer.self_attn.v_proj.weight.shape[0]:].data_ptr()
    # Hugging Face's own forward on the shared weights still gives what the fused forward gives
    fused.forward([0], [PROMPTS[0]], [1])
    with torch.no_grad():
        want = fused.hf_model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    got = fused.forward([1], [PROMPTS[0]], [1]).logits[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_module_passed_in_keeps_its_own_weights(tiny_llama_path):
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    before = module.model.layers[0].self_attn.q_proj.weight.data_ptr()
    runner = HFTargetModel(module, fused_forward=True)
    assert runner.fused is not None and module.model.layers[0].self_attn.q_proj.weight.data_ptr() == before


def test_unsupported_models_and_bad_values_are_refused(tmp_path, tiny_llama_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    gelu = tmp_path / "gelu"
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=96, hidden_act="gelu")).save_pretrained(gelu)
    t = HFTargetModel(str(gelu), dtype="float32", device="cpu")
    assert t.fused is None and t.fused_reason == "hidden_act 'gelu' is not 'silu'"
    with pytest.raises(ValueError, match=r"fused_forward=True cannot run .*gelu.*: hidden_act 'gelu' is not 'silu'; "
                                         r"pass fused_forward=None"):
        HFTargetModel(str(gelu), dtype="float32", device="cpu", fused_forward=True)
    with pytest.raises(TypeError, match=r"fused_forward='yes' is invalid: it must be None \(on CUDA and the CPU "
                                        r"where supported\), True or False"):
        HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", fused_forward="yes")
    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu")  # on by default on the CPU too
    assert t.fused is not None and not t.fused.use_triton and t.fused_reason is None
    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", fused_forward=False)
    assert t.fused is None and t.fused_reason == "fused_forward=False"


@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen3_path"])
def test_cpu_fused_forward_is_lossless(request, fixture):
    """On the CPU the default forward is the fused forward's torch ops (1.3x Hugging Face's layers at batch 1 for the
    bundled tiny model): greedy output with and without speculation equals Hugging Face's layers'."""
    path = request.getfixturevalue(fixture)
    kw = dict(dtype="float32", device="cpu", max_num_seqs=3)
    fused = LLM(path, **kw)
    plain = LLM(path, **kw, fused_forward=False)
    assert fused.target.fused is not None and not fused.target.fused.use_triton and plain.target.fused is None
    spec = LLM(path, {"method": "ngram", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, **kw)
    assert spec.target.fused is not None
    want = [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in fused.generate(PROMPTS, GREEDY)] == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == want


@NO_CUDA
@pytest.mark.parametrize("fixture", ["tiny_llama_path", "tiny_qwen3_path"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_default_is_fused_with_triton_and_lossless(request, fixture, dtype):
    path = request.getfixturevalue(fixture)
    kw = dict(dtype=dtype, device="cuda", max_num_seqs=3)
    fused = LLM(path, **kw)
    plain = LLM(path, **kw, fused_forward=False)
    assert fused.target.fused is not None and fused.target.fused.use_triton and plain.target.fused is None
    spec = LLM(path, {"method": "ngram", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, **kw)
    out = [o.token_ids for o in fused.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == out  # lossless against its own baseline
    if dtype == "float32":  # the unfused target agrees exactly in float32 (rounding order aside)
        assert [o.token_ids for o in plain.generate(PROMPTS, GREEDY)] == out


@NO_CUDA
@pytest.mark.parametrize("pdl,row", [(False, False), (True, True), (True, False)])
def test_cuda_linear_and_pdl_variants_are_lossless(monkeypatch, tiny_llama_path, pdl, row):
    """The one-row projections off (cuBLAS) and programmatic dependent launch on (off by default, so only this test
    keeps it from rotting; it needs compute capability 9, else the kernels launch plainly): greedy output in float32
    equals Hugging Face's layers, in the captured step graphs, with and without speculation, at batch 3 and 1."""
    import specdec.fused as fused_module
    import specdec.fused_kernels as fk

    monkeypatch.setattr(fk, "PDL", pdl)
    monkeypatch.setattr(fused_module, "TRITON_LINEAR", row)
    kw = dict(dtype="float32", device="cuda", max_num_seqs=3)
    fused = LLM(tiny_llama_path, **kw)
    assert fused.target.fused.triton_linear is row
    plain = LLM(tiny_llama_path, **kw, fused_forward=False)
    spec = LLM(tiny_llama_path, {"method": "ngram", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, **kw)
    want = [o.token_ids for o in plain.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in fused.generate(PROMPTS, GREEDY)] == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == want
    single = [o.token_ids for o in fused.generate(PROMPTS[:1], GREEDY)]  # batch 1: the one-row kernel's steps
    assert single == want[:1]
    assert [o.token_ids for o in spec.generate(PROMPTS[:1], GREEDY)] == want[:1]  # batch-1 verify steps: cuBLAS

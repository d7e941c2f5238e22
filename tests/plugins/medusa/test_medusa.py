"""Plugin specdec-plugin-medusa end to end: lossless greedy decoding, drafts equal to the reference heads on a
plain HF forward's last hidden state, sampled output that follows the target, refusals at LLM(...)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from medusa_formats import random_fasterdecoding, random_vllm, reference_logits, write

import specdec
from conftest import TINY_VOCAB, exact_two_token_marginals
from specdec import LLM, SamplingParams
from specdec_medusa.proposer import MedusaProposer

rng = random.Random(23)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(8)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
# The bundled tiny-medusa measured 1.92 tokens a step on the prompt of its test when it was trained (card estimate
# on held-out code: 1.38); random heads accept almost nothing.
MIN_TINY_MEDUSA_ACCEPTANCE = 1.4


def spec(k, model, method="medusa", **options):
    # "fixed": these tests check the drafting itself, so every step drafts (the auto policy soon stops
    # drafting with a random head on the GPU)
    return {"method": method, "num_speculative_tokens": k, "model": model, "speculation_policy": "fixed",
            **options}


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    d = tmp_path_factory.mktemp("medusa")
    fd = random_fasterdecoding(TINY_VOCAB, heads=4, layers=2, seed=1)
    vl = random_vllm(TINY_VOCAB, heads=3, truncated=40, bias=True, seed=2)
    return {"fasterdecoding": (write(d / "fd", *fd), *fd), "vllm": (write(d / "vllm", *vl, "vllm"), *vl)}


@pytest.fixture(scope="module")
def cycle_target(tmp_path_factory):
    """A Llama whose attention and MLP outputs are zero and whose LM head maps token x to ``perm[x]``: its final
    hidden state depends on the current token only and its greedy continuation follows the permutation, so Medusa
    heads can know the tokens 2, 3, ... ahead (see :func:`oracle_heads`)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from conftest import _common

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**_common()))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        e = model.model.embed_tokens.weight
        final = model.model.norm.weight * e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)  # [V, H]
        perm = torch.randperm(TINY_VOCAB)
        model.lm_head.weight[perm] = final
    path = tmp_path_factory.mktemp("cycle")
    model.save_pretrained(path)
    return str(path), perm


def oracle_heads(path, perm, noise):
    """FasterDecoding heads that know the cycle target: zero blocks and head i's rows the target's LM head moved
    i + 1 steps along the permutation (so its argmax is the token i + 2 ahead); ``noise`` on the blocks of heads
    1.. makes some of their drafts wrong."""
    from safetensors.torch import load_file

    lm = next(t for k, t in load_file(f"{path}/model.safetensors").items() if k.endswith("lm_head.weight"))
    cfg, sd = random_fasterdecoding(TINY_VOCAB, heads=4, layers=1, seed=5)
    inv, rows = torch.argsort(perm), torch.arange(TINY_VOCAB)
    for i in range(4):
        rows = inv[rows]
        sd[f"{i}.1.weight"] = lm[rows]
        sd[f"{i}.0.linear.weight"] *= noise * i
        sd[f"{i}.0.linear.bias"] *= noise * i
    return cfg, sd


@pytest.fixture(scope="module")
def baselines(tiny_llama_path, tiny_qwen2_path):
    return {p: [o.token_ids for o in LLM(p, dtype="float32", max_num_seqs=8).generate(PROMPTS, GREEDY)]
            for p in (tiny_llama_path, tiny_qwen2_path)}


def test_discoverable_once_installed():
    info = specdec.available_methods()["medusa"]
    assert info.distribution == "specdec-plugin-medusa" and info.status == "ok"
    assert specdec.get_proposer_class("medusa") is MedusaProposer
    assert "medusa" in specdec.registry.available_trainers()


@pytest.mark.parametrize("target", ["llama", "qwen2"])
@pytest.mark.parametrize("layout, k", [("fasterdecoding", 1), ("fasterdecoding", 4), ("vllm", 2), ("vllm", 3)])
@pytest.mark.parametrize("max_num_seqs", [1, 3, 8])
def test_greedy_identical_to_baseline(request, heads, baselines, target, layout, k, max_num_seqs):
    path = request.getfixturevalue(f"tiny_{target}_path")
    llm = LLM(path, spec(k, heads[layout][0]), dtype="float32", max_num_seqs=max_num_seqs)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baselines[path]
    assert llm.stats.num_draft_tokens > 0


@pytest.mark.parametrize("k", [1, 4])
def test_oracle_heads_draft_the_targets_tokens(tmp_path, cycle_target, k):
    path, perm = cycle_target
    head = write(tmp_path / "oracle", *oracle_heads(path, perm, 0.0))
    base = [o.token_ids for o in LLM(path, dtype="float32", max_num_seqs=8).generate(PROMPTS, GREEDY)]
    assert base[0][1] == int(perm[base[0][0]])
    llm = LLM(path, spec(k, head), dtype="float32", max_num_seqs=8)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == base
    assert llm.stats.num_accepted_tokens == llm.stats.num_draft_tokens > 0


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph-step"])
@pytest.mark.parametrize("case", ["random-fasterdecoding", "random-vllm", "noisy-oracle"])
def test_drafts_are_the_reference_heads_on_the_last_hidden_state(tmp_path, register_proposer, tiny_llama_path, heads,
                                                                  cycle_target, case, graph, monkeypatch):
    """Every step's drafts equal the reference heads' argmax on a plain HF forward's final hidden state at the
    position before the request's last token (draft i from head i): checks the hidden row each request reads
    after prefills and after decode steps with accepted drafts. ``graph-step``: through the capture-ready step
    (:class:`CapturedMedusaHeads`, run eagerly on its static buffers, as a CUDA graph replays it)."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(MedusaProposer, "_eager_graph", graph)
    records, kept = [], []

    class Recorder(MedusaProposer):
        method = f"rec_medusa_{case.replace('-', '_')}"

        def propose(self, batch):
            drafts = super().propose(batch)
            kept.append((drafts.token_ids, drafts.token_ids.tolist()))
            for i, d in enumerate(drafts.to_lists()):
                if d:
                    records.append((batch.token_ids[i, : batch.num_tokens[i]].tolist(), d))
            return drafts

    register_proposer(Recorder)
    if case == "noisy-oracle":
        target, perm = cycle_target
        cfg, sd = oracle_heads(target, perm, 3.0)
        path = write(tmp_path / "noisy", cfg, sd)
    else:
        target, (path, cfg, sd) = tiny_llama_path, heads[case.removeprefix("random-")]
    llm = LLM(target, spec(3, path, Recorder.method), dtype="float32", max_num_seqs=4, device="cpu")
    llm.generate(PROMPTS[:5], GREEDY)
    assert (llm.proposer.graph is not None and llm.proposer.graph.runs > 0) == graph
    assert all(t.tolist() == lists for t, lists in kept)  # a step's drafts are its own: later steps leave them
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assert len(records) > 20
    if case == "noisy-oracle":
        assert 0 < llm.stats.num_accepted_tokens < llm.stats.num_draft_tokens
    for tokens, drafts in records:
        with torch.no_grad():
            last = hf(torch.tensor([tokens[:-1]]), output_hidden_states=True).hidden_states[-1][0, -1]
        want = reference_logits(cfg, sd, last[None])[:, 0].argmax(-1)[: len(drafts)].tolist()
        assert drafts == want, tokens


@pytest.mark.parametrize("layout", ["fasterdecoding", "vllm"])
def test_probabilistic_drafts_follow_target(tiny_llama_path, heads, layout):
    """First two tokens' marginals at temperature 0.8 match the exact target marginals, with medusa's draft
    distributions (vllm: a 40-token head vocabulary scattered into the target's) in the rejection sampler."""
    prompt, n, temperature = PROMPTS[3], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(1)
    llm = LLM(tiny_llama_path, spec(2, heads[layout][0]), dtype="float32", max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert llm.stats.num_accepted_tokens > 0
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_probabilistic_drafts_are_the_heads_softmax_over_the_target_vocabulary(tiny_llama_path, heads,
                                                                                register_proposer):
    seen = []

    class Probe(MedusaProposer):
        method = "probe_medusa"

        def propose(self, batch):
            drafts = super().propose(batch)
            seen.append((batch.hidden_states[batch.last_hidden_indices].clone(), drafts))
            return drafts

    register_proposer(Probe)
    path, cfg, sd = heads["vllm"]
    llm = LLM(tiny_llama_path, spec(3, path, "probe_medusa"), dtype="float32", max_num_seqs=4, device="cpu")
    llm.generate(PROMPTS[:4], SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True, seed=2))
    assert seen and all(d.probs is None for _, d in seen)  # a seeded batch's verifier reads no q: none sent
    seen.clear()
    torch.manual_seed(2)  # unseeded: the min(1, p/q) rule reads the draft distributions
    llm.generate(PROMPTS[:4], SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True))
    steps = [(h, d) for h, d in seen if d.probs is not None and sum(d.num_draft_tokens)]
    assert steps
    for h, d in steps:
        want = torch.softmax(reference_logits(cfg, sd, h) / 0.7, -1).transpose(0, 1)  # [B, k, V], 0 off the map
        torch.testing.assert_close(d.probs, want, atol=1e-6, rtol=1e-5)
        assert torch.all(want.gather(-1, d.token_ids[..., None]) > 0)  # drafts lie in the head vocabulary


def test_refusals_at_llm(tmp_path, tiny_llama_path, heads):
    path = heads["vllm"][0]
    with pytest.raises(ValueError) as info:
        LLM(tiny_llama_path, spec(4, path), dtype="float32")
    assert str(info.value) == (
        f"num_speculative_tokens=4 is more than the 3 Medusa heads of {path!r}: head i drafts the token i + 2 ahead, "
        "so method 'medusa' drafts at most 3 tokens a step; set num_speculative_tokens <= 3 (or train more heads: "
        "--option num_heads=...).")
    wide = write(tmp_path / "wide", *random_fasterdecoding(TINY_VOCAB, heads=2, hidden=32))
    with pytest.raises(ValueError, match=r"its hidden size is 32 \(key '0.1.weight'\) but the target's hidden_size=64"):
        LLM(tiny_llama_path, spec(2, wide), dtype="float32")
    with pytest.raises(ValueError, match="method 'medusa' needs model= a local directory holding Medusa heads"):
        LLM(tiny_llama_path, {"method": "medusa", "num_speculative_tokens": 2}, dtype="float32")


def test_bundled_tiny_medusa_is_the_tiny_targets_default_and_lossless():
    prompt = "    def __new__(mcls, name, bases, namespace, /, **kwargs):\n        abstracts = {name"
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    tiny = specdec.bundled_model("tiny")
    want = LLM(tiny, device="cpu").generate([prompt], params)[0].token_ids
    llm = LLM(tiny, {"method": "medusa", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, device="cpu")
    assert llm.proposer.layout == "vllm" and llm.proposer.heads.cfg.num_heads == 3
    assert llm.generate([prompt], params)[0].token_ids == want
    assert llm.stats.mean_acceptance_length > MIN_TINY_MEDUSA_ACCEPTANCE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_captured_heads_lossless_on_cuda(tiny_llama_path, heads, max_num_seqs):
    """On CUDA greedy chain steps replay the heads' graph (``draft_cuda_graphs``, default on); output equals the
    baseline's and the eager heads' drafts, step for step (the same acceptance)."""
    base = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=max_num_seqs,
                                      device="cuda").generate(PROMPTS, GREEDY)]
    runs = {}
    for graphs in (True, False):
        llm = LLM(tiny_llama_path, spec(3, heads["fasterdecoding"][0], draft_cuda_graphs=graphs), dtype="float32",
                  max_num_seqs=max_num_seqs, device="cuda")
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == base
        assert (llm.proposer.graph is not None and llm.proposer.graph.runs > 0) == graphs
        runs[graphs] = (llm.stats.num_draft_tokens, llm.stats.num_accepted_tokens)
    assert runs[True] == runs[False]


def test_draft_cuda_graphs_must_be_a_bool():
    from specdec_medusa.proposer import MedusaOptions

    with pytest.raises(TypeError, match=r"draft_cuda_graphs='yes' is invalid: it must be True or False\."):
        MedusaOptions(draft_cuda_graphs="yes")

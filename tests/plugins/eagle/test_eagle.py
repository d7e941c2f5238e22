"""Plugin specdec-plugin-eagle end to end: lossless greedy decoding with EAGLE-1 and EAGLE-3 heads, the
drafts equal to a cache-free recomputation, sampled output that follows the target, refusals at LLM(...)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from eagle_formats import H, random_eagle1, random_eagle3, write

import specdec
from conftest import TINY_VOCAB, AlternatingPolicy, exact_two_token_marginals
from specdec import LLM, SamplingParams
from specdec_eagle.proposer import Eagle3Proposer, EagleOptions, EagleProposer

rng = random.Random(11)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(8)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def spec(method, k, model, **options):
    # "fixed": these tests check the drafting itself, so every step drafts (the auto policy soon stops
    # drafting with a random head on the GPU)
    return {"method": method, "num_speculative_tokens": k, "model": model, "speculation_policy": "fixed",
            **options}


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads")
    return {"eagle": write(d / "e1", *random_eagle1(TINY_VOCAB, seed=1), "bin"),
            "eagle3": write(d / "e3", *random_eagle3(TINY_VOCAB, 40, seed=2))}


@pytest.fixture(scope="module")
def bigram_target(tmp_path_factory):
    """A Llama whose attention and MLP outputs are zero: its next token depends on the current one only, so an
    EAGLE-1 head can predict it exactly (see :func:`oracle_head`)."""
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
    path = tmp_path_factory.mktemp("bigram")
    model.save_pretrained(path)
    return str(path), model


def oracle_head(path, model, attention_scale=0.0):
    """An EAGLE-1 head whose output is the target's final hidden state at its input token: its drafts are the
    target's own next tokens (all accepted) while the attention adds nothing (``attention_scale`` > 0 adds a
    little, so some drafts are wrong)."""
    cfg, sd = random_eagle1(TINY_VOCAB, bias=False, embed=True, seed=4)
    e = model.model.embed_tokens.weight.detach()
    rms = torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)
    sd["embed_tokens.weight"] = model.model.norm.weight.detach() * e * rms
    sd["fc.weight"] = torch.cat((torch.eye(H), torch.zeros(H, H)), 1)
    sd["layers.0.self_attn.o_proj.weight"] *= attention_scale
    sd["layers.0.mlp.down_proj.weight"] *= 0.0
    return write(path, cfg, sd)


@pytest.fixture(scope="module")
def baselines(tiny_llama_path, tiny_qwen2_path):
    return {p: [o.token_ids for o in LLM(p, dtype="float32", max_num_seqs=8).generate(PROMPTS, GREEDY)]
            for p in (tiny_llama_path, tiny_qwen2_path)}


def test_discoverable_once_installed():
    for method in ("eagle", "eagle3"):
        info = specdec.available_methods()[method]
        assert info.distribution == "specdec-plugin-eagle" and info.status == "ok"
    assert specdec.get_proposer_class("eagle3") is Eagle3Proposer


@pytest.mark.parametrize("target", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("max_num_seqs", [1, 3, 8])
def test_greedy_identical_to_baseline(request, heads, baselines, target, method, k, max_num_seqs):
    path = request.getfixturevalue(f"tiny_{target}_path")
    llm = LLM(path, spec(method, k, heads[method]), dtype="float32", max_num_seqs=max_num_seqs)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baselines[path]
    assert llm.stats.num_draft_tokens > 0


@pytest.mark.parametrize("k", [1, 4])
def test_oracle_head_accepts_every_draft(tmp_path, bigram_target, k):
    path, model = bigram_target
    head = oracle_head(tmp_path / "oracle", model)
    base = [o.token_ids for o in LLM(path, dtype="float32", max_num_seqs=8).generate(PROMPTS, GREEDY)]
    llm = LLM(path, spec("eagle", k, head), dtype="float32", max_num_seqs=8)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == base
    assert llm.stats.num_accepted_tokens == llm.stats.num_draft_tokens > 0


class _Recording:
    """Mixin: keeps every step's token rows and drafts."""

    def propose(self, batch):
        drafts = super().propose(batch)
        for i, d in enumerate(drafts.to_lists()):
            if d:
                self.records.append((batch.token_ids[i, : batch.num_tokens[i]].tolist(), d))
        return drafts


def _reference_drafts(head, hf, aux_ids, tokens, k):
    """Drafts recomputed without any cache: target features from one HF forward, then the chain by full
    forwards over the whole sequence."""
    n = len(tokens)
    with torch.no_grad():
        out = hf(torch.tensor([tokens[: n - 1]]), output_hidden_states=True)
        hs = out.hidden_states
        feats = hs[-1][0] if aux_ids is None else torch.cat([hs[i][0] for i in aux_ids], -1)
        if aux_ids is not None:
            feats = head.fc(feats)  # project first, so own outputs (width H) can be appended
        ids, drafts = tokens[1:], []
        for _ in range(k):
            hidden = head(torch.tensor([ids]), feats[None])[0]
            d = int(head.draft_to_target(head.draft_logits(hidden[-1]).argmax()))
            drafts.append(d)
            ids, feats = ids + [d], torch.cat((feats, hidden[-1:]), 0)
    return drafts


@pytest.mark.parametrize("skips", [False, True])
@pytest.mark.parametrize("case", ["eagle3-random", "eagle-noisy-oracle"])
def test_drafts_equal_cache_free_recomputation(tmp_path, register_proposer, tiny_llama_path, heads, bigram_target,
                                               case, skips):
    """Every step's drafts equal a recomputation from scratch: checks the catch-up positions, the features'
    alignment and the rollback of the chain's KV, with and without accepted drafts; ``skips``: the proposer
    misses four steps out of six (the speculation policy), so each call catches up over several steps."""
    from transformers import AutoModelForCausalLM

    base = Eagle3Proposer if case.startswith("eagle3") else EagleProposer
    cls = type("Recorder", (_Recording, base), {"method": f"rec_{base.method}", "records": []})
    register_proposer(cls)
    if case == "eagle3-random":
        path, head_dir = tiny_llama_path, heads["eagle3"]
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        path, hf = bigram_target
        head_dir = oracle_head(tmp_path / "noisy", hf, attention_scale=0.3)
    llm = LLM(path, spec(cls.method, 3, head_dir), dtype="float32", max_num_seqs=4, device="cpu")  # as hf
    if skips:
        llm.policy = AlternatingPolicy(3)
    llm.generate(PROMPTS[:5], GREEDY)
    proposer = llm.proposer
    assert len(cls.records) > (8 if skips else 20)
    if skips:
        assert llm.policy.stats.steps_plain > 2 * llm.policy.stats.steps_drafted - 4
    for tokens, drafts in cls.records:
        assert drafts == _reference_drafts(proposer.head, hf, proposer.aux_layer_ids, tokens, len(drafts)), tokens
    if case != "eagle3-random":
        assert 0 < llm.stats.num_accepted_tokens < llm.stats.num_draft_tokens


def test_eagle3_probabilistic_drafts_follow_target(tiny_llama_path, heads):
    """First two tokens' marginals at temperature 0.8 match the exact target marginals, with eagle3's draft
    probabilities (a 40-token draft vocabulary scattered into the target's) in the rejection sampler."""
    prompt, n, temperature = PROMPTS[3], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(1)
    llm = LLM(tiny_llama_path, spec("eagle3", 2, heads["eagle3"], draft_sample_method="probabilistic"),
              dtype="float32", max_num_seqs=64)
    assert llm.proposer.probabilistic
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert llm.stats.num_draft_tokens > 0
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_probabilistic_drafts_are_over_the_target_vocabulary(tiny_llama_path, heads, register_proposer):
    seen = []

    class Probe(Eagle3Proposer):
        method = "probe_eagle3"

        def propose(self, batch):
            drafts = super().propose(batch)
            seen.append(drafts)
            return drafts

    register_proposer(Probe)
    llm = LLM(tiny_llama_path, spec("probe_eagle3", 3, heads["eagle3"], draft_sample_method="probabilistic"),
              dtype="float32", max_num_seqs=4, device="cpu")
    llm.generate(PROMPTS[:4], SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=2))
    assert seen and all(d.probs is None for d in seen)  # a seeded batch's verifier reads no q: none sent
    seen.clear()
    torch.manual_seed(2)  # unseeded: the min(1, p/q) rule reads the draft distributions
    llm.generate(PROMPTS[:4], SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True))
    t2d = llm.proposer.head.t2d
    probs = [d.probs for d in seen if d.probs is not None and sum(d.num_draft_tokens)]
    assert probs
    for p in probs:
        assert p.shape[-1] == TINY_VOCAB
        assert torch.all(p[..., ~t2d] == 0)
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2]))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_draft_sample_method_auto_is_greedy_on_cuda_only(tiny_llama_path, heads, device):
    """The default, ``"auto"``: sampled requests draft from the head's distribution on the CPU (the lean chain
    samples at the cost of an argmax) and take the captured greedy chain on CUDA (verified one-hot there); an
    explicit value holds on either device, and an unknown one is refused naming the values."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert EagleOptions().draft_sample_method == "auto"
    for method, probabilistic in (("auto", device == "cpu"), ("probabilistic", True), ("greedy", False)):
        llm = LLM(tiny_llama_path, spec("eagle3", 2, heads["eagle3"], draft_sample_method=method), dtype="float32",
                  device=device, max_num_seqs=2)
        assert llm.proposer.probabilistic is probabilistic, method
    with pytest.raises(ValueError) as info:
        EagleOptions(draft_sample_method="top")
    assert str(info.value) == ("draft_sample_method='top' is invalid: it must be one of ('greedy', 'probabilistic', "
                               "'auto').")


def test_misfit_head_refused_at_llm(tmp_path, tiny_llama_path):
    cfg, sd = random_eagle3(TINY_VOCAB, 40, "speculators", eagle_aux_hidden_state_layer_ids=[0, 1, 7])
    path = write(tmp_path / "far", cfg, sd)
    with pytest.raises(ValueError) as info:
        LLM(tiny_llama_path, spec("eagle3", 3, path), dtype="float32")
    assert str(info.value) == (
        f"head {path!r} does not fit the target: eagle_aux_hidden_state_layer_ids=[0, 1, 7] but the target has "
        "num_hidden_layers=3 (ids must be 3 distinct layers in 0..2).")
    with pytest.raises(ValueError) as info:
        LLM(tiny_llama_path, {"method": "eagle", "num_speculative_tokens": 2}, dtype="float32")
    assert str(info.value) == (
        "method 'eagle' needs model= a local directory holding an EAGLE-1 head (config.json + weights); only the "
        "bundled 'tiny' target has a default eagle head, 'tiny-eagle'.")


def test_bundled_eagle1_head_is_the_tiny_targets_default_and_lossless():
    """``method="eagle"`` on the bundled tiny target loads the bundled tiny-eagle head (EAGLE-1) by default:
    lossless, and trained (a random head accepts almost nothing)."""
    import specdec

    path = specdec.bundled_model("tiny-eagle")
    assert json.loads((Path(path) / "config.json").read_text())["torch_dtype"] == "float16"
    prompt = "    def __new__(mcls, name, bases, namespace, /, **kwargs):\n        abstracts = {name"
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    tiny = specdec.bundled_model("tiny")
    want = LLM(tiny, device="cpu").generate([prompt], params)[0].token_ids
    llm = LLM(tiny, {"method": "eagle", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, device="cpu")
    from safetensors.torch import load_file

    bundled = load_file(Path(path) / "model.safetensors")["fc.weight"].float()
    torch.testing.assert_close(llm.proposer.head.fc.weight, bundled)
    assert llm.generate([prompt], params)[0].token_ids == want
    assert llm.stats.mean_acceptance_length > 1.5

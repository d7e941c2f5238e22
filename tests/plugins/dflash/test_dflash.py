"""Plugin specdec-plugin-dflash end to end: lossless greedy decoding over Llama, Qwen2 and Qwen3 targets, every
step's drafts equal to a from-scratch recomputation over the whole prefix (through the engine, and through hand-
overs with uneven acceptance, padding rows and slot reuse), sampled output that follows the target, refusals."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from dflash_formats import random_dflash, reference_drafts, reference_logits, write
from specdec_dflash.proposer import DFlashProposer

import specdec
from conftest import TINY_VOCAB, AlternatingPolicy, exact_two_token_marginals
from specdec import LLM, DraftBatch, SamplingParams

rng = random.Random(12)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(8)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
BLOCK, MASK = 8, 5
LAYOUT = {"llama": "z-lab", "qwen2": "speculators", "qwen3": "z-lab"}


def spec(k, model, method="dflash", **options):
    # "fixed": these tests check the drafting itself, so every step drafts (the auto policy soon stops
    # drafting with a random head on the GPU)
    return {"method": method, "num_speculative_tokens": k, "model": model, "speculation_policy": "fixed",
            **options}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    d = tmp_path_factory.mktemp("dflash")
    return {"z-lab": write(d / "zlab", *random_dflash(TINY_VOCAB, seed=1, block_size=BLOCK, mask_token_id=MASK)),
            "speculators": write(d / "spec", *random_dflash(TINY_VOCAB, "speculators", seed=2, block_size=BLOCK,
                                                            mask_token_id=MASK, target_layer_ids=[1, 2])),
            "draft-vocab": write(d / "vocab", *random_dflash(TINY_VOCAB, "speculators", seed=3, block_size=BLOCK,
                                                             mask_token_id=MASK, draft_vocab=40))}


@pytest.fixture(scope="module")
def baselines(tiny_llama_path, tiny_qwen2_path, tiny_qwen3_path):
    return {p: [o.token_ids for o in LLM(p, dtype="float32", max_num_seqs=8).generate(PROMPTS, GREEDY)]
            for p in (tiny_llama_path, tiny_qwen2_path, tiny_qwen3_path)}


def test_discoverable_once_installed():
    info = specdec.available_methods()["dflash"]
    assert info.distribution == "specdec-plugin-dflash" and info.status == "ok"
    assert specdec.get_proposer_class("dflash") is DFlashProposer


@pytest.mark.parametrize("target", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("k", [1, 3, BLOCK - 1])
@pytest.mark.parametrize("max_num_seqs", [1, 3, 8])
def test_greedy_identical_to_baseline(request, drafts, baselines, target, k, max_num_seqs):
    path = request.getfixturevalue(f"tiny_{target}_path")
    llm = LLM(path, spec(k, drafts[LAYOUT[target]]), dtype="float32", max_num_seqs=max_num_seqs)
    assert llm.proposer.layout == LAYOUT[target]
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baselines[path]
    assert llm.stats.num_draft_tokens > 0


def test_greedy_identical_with_draft_vocabulary(tiny_llama_path, drafts, baselines):
    llm = LLM(tiny_llama_path, spec(3, drafts["draft-vocab"]), dtype="float32", max_num_seqs=8)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baselines[tiny_llama_path]


class _Recording(DFlashProposer):
    """Keeps every step's token rows and drafts."""

    method = "rec_dflash"
    records: list = []

    def propose(self, batch):
        out = super().propose(batch)
        for i, d in enumerate(out.to_lists()):
            if d:
                self.records.append((batch.token_ids[i, : batch.num_tokens[i]].tolist(), d))
        return out


@pytest.mark.parametrize("skips", [False, True])
@pytest.mark.parametrize("target", ["llama", "qwen3"])
def test_engine_drafts_equal_from_scratch_recomputation(request, register_proposer, drafts, target, skips):
    """Through the engine (prefill hand-overs of whole prompts, then verify hand-overs; requests that sample, so
    a few random drafts are accepted; argmax drafts): every step's drafts equal the reference over the whole
    prefix, with features from a fresh HF forward. Random drafts are rarely accepted: uneven acceptance is
    :func:`test_handover_with_uneven_acceptance_and_slot_reuse`'s. ``skips``: the proposer misses four steps
    out of six (the speculation policy), so a call appends several steps' context at once."""
    from transformers import AutoModelForCausalLM

    register_proposer(_Recording)
    _Recording.records = []
    path = request.getfixturevalue(f"tiny_{target}_path")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    layout = LAYOUT[target]
    llm = LLM(path, spec(4, drafts[layout], "rec_dflash", draft_sample_method="greedy",
                        speculation_policy="fixed"), dtype="float32",
              max_num_seqs=4, device="cpu")
    if skips:
        llm.policy = AlternatingPolicy(4)
    torch.manual_seed(0)
    llm.generate(PROMPTS[:6], SamplingParams(temperature=0.3, max_tokens=24, ignore_eos=True, seed=5))
    ids = llm.proposer.draft.cfg.target_layer_ids
    sd = _state(drafts[layout])
    assert len(_Recording.records) > (10 if skips else 30)
    assert llm.stats.num_accepted_tokens > 0 or skips  # random drafts: with a third of the steps, maybe none
    for tokens, d in _Recording.records:
        assert d == reference_drafts(sd, hf, ids, tokens, len(d), MASK, BLOCK), tokens


def _state(path):
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def test_handover_with_uneven_acceptance_and_slot_reuse(tiny_llama_path, drafts):
    """The proposer driven by hand: prompts of different lengths, then steps that accept 0..k drafts per request
    (the verify forward's rows past the accepted ones hold noise, which must be ignored), a request leaving and a
    new one taking its slot: every step's drafts equal the reference over the whole prefix."""
    from transformers import AutoModelForCausalLM

    k = 3
    llm = LLM(tiny_llama_path, spec(k, drafts["z-lab"]), dtype="float32", max_num_seqs=4, device="cpu")
    proposer = llm.proposer
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    ids, sd = proposer.draft.cfg.target_layer_ids, _state(drafts["z-lab"])
    gen = np.random.default_rng(0)
    seqs = {f"r{i}": gen.integers(2, TINY_VOCAB, 60).tolist() for i in range(5)}
    with torch.no_grad():
        feats = {r: [h[0] for h in hf(torch.tensor([s]), output_hidden_states=True).hidden_states]
                 for r, s in seqs.items()}
    state = {}  # req -> (n tokens incl. bonus, handed positions (first, count), last accepted index)

    def join(r, prompt_len):
        proposer.add_request(r, np.array(seqs[r][:prompt_len], dtype=np.int32))
        state[r] = (prompt_len + 1, prompt_len, prompt_len - 1)

    for r, length in zip(["r0", "r1", "r2", "r3"], [1, 5, 9, 13]):
        join(r, length)
    checked = 0
    for step in range(7):
        if step == 3:
            proposer.remove_request("r1")
            del state["r1"]
            join("r4", 6)  # takes r1's slot, whose stale context must not show
        reqs = list(state)
        n = np.array([state[r][0] for r in reqs])
        hand, last, qsl = [], [], [0]
        for r in reqs:
            _, count, li = state[r]
            first = state[r][0] - 1 - (li + 1)
            rows = torch.stack([torch.cat([feats[r][i + 1][p] for i in ids]) for p in range(first, first + li + 1)])
            noise = torch.randn(count - li - 1, rows.shape[1])  # the rejected drafts' rows
            hand.append(torch.cat((rows, noise)))
            last.append(qsl[-1] + li)
            qsl.append(qsl[-1] + count)
        flat = torch.cat(hand)
        aux = [flat[:, j * 64: (j + 1) * 64] for j in range(len(ids))]
        tokens = np.zeros((len(reqs), int(n.max())), dtype=np.int32)
        for i, r in enumerate(reqs):
            tokens[i, : n[i]] = seqs[r][: n[i]]
        batch = DraftBatch(req_ids=reqs, token_ids=tokens, num_tokens=n, sampled_token_ids=[[1]] * len(reqs),
                           num_speculative_tokens=k, max_model_len=256, aux_hidden_states=aux,
                           query_start_loc=torch.tensor(qsl), last_hidden_indices=torch.tensor(last))
        out = proposer.propose(batch).to_lists()
        for i, r in enumerate(reqs):
            assert out[i] == reference_drafts(sd, hf, ids, seqs[r][: n[i]], k, MASK, BLOCK), (step, r)
            checked += 1
            a = int(gen.integers(0, k + 1))
            state[r] = (n[i] + a + 1, k + 1, a)
    assert checked == 28


def test_k_larger_than_block_refused(tiny_llama_path, drafts):
    with pytest.raises(ValueError) as info:
        LLM(tiny_llama_path, spec(BLOCK, drafts["z-lab"]), dtype="float32")
    assert str(info.value) == (
        f"num_speculative_tokens={BLOCK} is more than one DFlash block drafts: draft {drafts['z-lab']!r} has "
        f"block_size={BLOCK}, which gives at most block_size - 1 = {BLOCK - 1} drafts; use num_speculative_tokens "
        f"<= {BLOCK - 1}.")
    with pytest.raises(ValueError, match="method 'dflash' needs model= a local directory holding a DFlash draft"):
        LLM(tiny_llama_path, {"method": "dflash", "num_speculative_tokens": 2}, dtype="float32")
    with pytest.raises(ValueError, match="draft_sample_method='top' is invalid"):
        LLM(tiny_llama_path, spec(2, drafts["z-lab"], draft_sample_method="top"), dtype="float32")


def test_probabilistic_drafts_follow_target(tiny_llama_path, drafts):
    """First two tokens' marginals at temperature 0.8 match the exact target marginals with the draft's
    probabilities in the rejection sampler."""
    prompt, n, temperature = PROMPTS[3], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(1)
    llm = LLM(tiny_llama_path, spec(3, drafts["z-lab"]), dtype="float32", max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert llm.stats.num_accepted_tokens > 0
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_draft_probabilities(tiny_llama_path, drafts, register_proposer):
    """Sampling requests get draft distributions over the target vocabulary: softmax(logits / T) of the block
    (checked against the reference), zero outside a draft vocabulary; greedy options give none."""
    from transformers import AutoModelForCausalLM

    seen = []

    class Probe(DFlashProposer):
        method = "probe_dflash"

        def propose(self, batch):
            out = super().propose(batch)
            rows = [batch.token_ids[i, : batch.num_tokens[i]].tolist() for i in range(batch.batch_size)]
            seen.append((rows, out))  # copies: batch.token_ids is a view of the engine's buffer
            return out

    register_proposer(Probe)
    llm = LLM(tiny_llama_path, spec(3, drafts["draft-vocab"], "probe_dflash"), dtype="float32", max_num_seqs=4,
              device="cpu")
    llm.generate(PROMPTS[:4], SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True, seed=2))
    assert seen and all(d.probs is None for _, d in seen)  # a seeded batch's verifier reads no q: none sent
    seen.clear()
    torch.manual_seed(2)  # unseeded: the min(1, p/q) rule reads the draft distributions
    llm.generate(PROMPTS[:4], SamplingParams(temperature=0.7, max_tokens=6, ignore_eos=True))
    t2d = _state(drafts["draft-vocab"])["t2d"]
    probs = [(b, d) for b, d in seen if sum(d.num_draft_tokens)]
    assert probs and all(d.probs is not None for _, d in probs)
    for _, d in probs:
        assert d.probs.shape == (d.token_ids.shape[0], 3, TINY_VOCAB)
        assert torch.all(d.probs[..., ~t2d] == 0)
        torch.testing.assert_close(d.probs.sum(-1), torch.ones(d.probs.shape[:2]))
        drafted = d.probs.gather(-1, d.token_ids.clamp(min=0)[..., None])[..., 0]
        assert torch.all(drafted > 0)
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()
    rows, d = probs[-1]
    sd, ids = _state(drafts["draft-vocab"]), llm.proposer.draft.cfg.target_layer_ids
    for i, tokens in enumerate(rows):
        logits = reference_logits(sd, hf, ids, tokens, MASK, BLOCK)
        n = d.num_draft_tokens[i]
        torch.testing.assert_close(d.probs[i, :n], torch.softmax(logits[1: 1 + n] / 0.7, -1), atol=1e-5, rtol=0)
    seen.clear()
    llm = LLM(tiny_llama_path, spec(3, drafts["z-lab"], "probe_dflash", draft_sample_method="greedy"), dtype="float32",
              max_num_seqs=4, device="cpu")
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0.7, max_tokens=4, ignore_eos=True, seed=2))
    assert seen and all(d.probs is None for _, d in seen)


def test_bundled_tiny_dflash_is_the_tiny_targets_default_and_lossless():
    """``method="dflash"`` on the bundled tiny target loads the bundled tiny-dflash draft by default: lossless,
    and trained (a random draft accepts almost nothing)."""
    import specdec

    path = specdec.bundled_model("tiny-dflash")
    prompt = "    def __new__(mcls, name, bases, namespace, /, **kwargs):\n        abstracts = {name"
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    tiny = specdec.bundled_model("tiny")
    want = LLM(tiny, device="cpu").generate([prompt], params)[0].token_ids
    llm = LLM(tiny, {"method": "dflash", "num_speculative_tokens": 3, "speculation_policy": "fixed"}, device="cpu")
    from safetensors.torch import load_file

    bundled = load_file(f"{path}/model.safetensors")["fc.weight"].float()
    torch.testing.assert_close(llm.proposer.draft.fc.weight, bundled)
    assert llm.generate([prompt], params)[0].token_ids == want
    assert llm.stats.mean_acceptance_length > 1.3

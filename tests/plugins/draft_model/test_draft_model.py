"""Plugin specdec-plugin-draft_model: lossless greedy and sampled decoding with a separate draft model."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from specdec_draft_model.proposer import CATCH_UP_TOKENS

import specdec
from conftest import TINY_VOCAB, exact_two_token_marginals
from specdec import LLM, SamplingParams
from specdec.policy import SpeculationPolicy

rng = random.Random(7)
PROMPTS = [[rng.randrange(2, TINY_VOCAB) for _ in range(rng.randrange(2, 20))] for _ in range(10)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def spec(k, model, **options):
    # "fixed": these tests check the drafting itself (chains, graphs, counts), so every step drafts
    return {"method": "draft_model", "num_speculative_tokens": k, "model": model, "speculation_policy": "fixed",
            **options}


@pytest.fixture(scope="module")
def baseline(tiny_llama_path):
    outs = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4).generate(PROMPTS, GREEDY)
    return [o.token_ids for o in outs]


def test_discoverable_once_installed():
    info = specdec.available_methods()["draft_model"]
    assert info.distribution == "specdec-plugin-draft_model" and info.status == "ok"


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("max_num_seqs", [3, 8])
def test_greedy_identical_to_baseline(tiny_llama_path, tiny_llama_draft_path, baseline, k, max_num_seqs):
    llm = LLM(tiny_llama_path, spec(k, tiny_llama_draft_path), dtype="float32", max_num_seqs=max_num_seqs)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert llm.stats.num_drafts > 0 and len(llm.stats.acceptance_rate_per_pos) == k


def test_target_as_its_own_draft_accepts_everything(tiny_llama_path, baseline):
    """With draft == target every greedy draft is right: this checks the draft's KV bookkeeping
    (catch-up, committing accepted drafts, dropping rejected ones) end to end."""
    llm = LLM(tiny_llama_path, spec(3, tiny_llama_path), dtype="float32", max_num_seqs=4)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    # Every drafted token is accepted (per-position rates dip below 1 only because drafts near
    # max_tokens are cut shorter, which lowers the later positions' counts, not their acceptance).
    assert llm.stats.num_accepted_tokens == llm.stats.num_draft_tokens
    assert llm.stats.acceptance_rate_per_pos[0] == 1.0


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_sampled_output_follows_target(tiny_llama_path, tiny_llama_draft_path, method):
    """First two tokens' marginals at temperature 0.8 match the exact target marginals."""
    prompt, n, temperature = PROMPTS[3], 3000, 0.8
    p1, p2 = exact_two_token_marginals(tiny_llama_path, prompt, temperature)
    torch.manual_seed(1)
    llm = LLM(tiny_llama_path, spec(2, tiny_llama_draft_path, draft_sample_method=method), dtype="float32",
              max_num_seqs=64)
    outs = llm.generate([prompt] * n, SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True))
    toks = np.array([o.token_ids[:2] for o in outs])
    assert llm.stats.num_accepted_tokens > 0
    for position, p in ((0, p1), (1, p2)):
        tv = 0.5 * np.abs(np.bincount(toks[:, position], minlength=TINY_VOCAB) / n - p).sum()
        assert tv < 0.08, (position, tv)


def test_probabilistic_accepts_more_than_greedy_when_sampling(tiny_llama_path):
    """Draft == target: probabilistic drafts have q == p, so every draft is accepted; greedy drafts
    (one-hot at the argmax) are accepted only with probability p(argmax)."""
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=3)
    rates = {}
    for method in ("greedy", "probabilistic"):
        llm = LLM(tiny_llama_path, spec(3, tiny_llama_path, draft_sample_method=method), dtype="float32")
        llm.generate(PROMPTS, params)
        rates[method] = llm.stats.draft_acceptance_rate
    assert rates["probabilistic"] > 0.99
    assert rates["greedy"] < rates["probabilistic"]


def _save(tmp_path, **overrides):
    from transformers import LlamaConfig

    from conftest import _common, _save_model

    return _save_model(LlamaConfig(**{**_common(), "num_hidden_layers": 1, **overrides}), tmp_path, seed=5)


def test_errors(tiny_llama_path, tmp_path):
    with pytest.raises(ValueError, match="draft model vocabulary size 50 differs from the target's 96"):
        LLM(tiny_llama_path, spec(2, _save(tmp_path / "v", vocab_size=50)), dtype="float32")
    with pytest.raises(ValueError, match="draft model max length 64 .* shorter than the target's max_model_len 256"):
        LLM(tiny_llama_path, spec(2, _save(tmp_path / "m", max_position_embeddings=64)), dtype="float32")
    # ... which a shorter max_model_len fixes.
    LLM(tiny_llama_path, spec(2, str(tmp_path / "m")), dtype="float32", max_model_len=64)
    with pytest.raises(FileNotFoundError, match="draft model path '/no/draft' .* does not exist"):
        LLM(tiny_llama_path, spec(2, "/no/draft"), dtype="float32")
    with pytest.raises(ValueError, match="method 'draft_model' needs the draft model path"):
        LLM(tiny_llama_path, {"method": "draft_model", "num_speculative_tokens": 2}, dtype="float32")
    with pytest.raises(ValueError, match="draft_sample_method='beam' is invalid"):
        LLM(tiny_llama_path, spec(2, tiny_llama_path, draft_sample_method="beam"), dtype="float32")
    with pytest.raises(ValueError, match=r"draft_prefill_graph_tokens=-1 is invalid: it must be an int >= 0"):
        LLM(tiny_llama_path, spec(2, tiny_llama_path, draft_prefill_graph_tokens=-1), dtype="float32")


@pytest.mark.parametrize("method,fused", [("greedy", True), ("probabilistic", True), ("greedy", False)])
def test_draft_on_static_graph_path_is_lossless(tiny_llama_path, tiny_llama_draft_path, baseline, method, fused):
    """The draft's fixed-shape forward path and its greedy chain (CUDA graphs on a GPU; here the
    same buffers, eager), through FusedLlama or the draft's own layers, give the same drafts as the
    eager path, in either draft mode when every request is greedy."""
    opts = {"draft_sample_method": method}
    # On the CPU even on a GPU machine: on CUDA the draft's graphs and chain come with draft_cuda_graphs
    # (test_cuda_graph_chain_is_lossless covers them), so draft_chain=False would not mean "eager" there.
    eager = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path, draft_chain=False, **opts), dtype="float32",
                max_num_seqs=4, device="cpu")
    static = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path, draft_fused=fused, **opts), dtype="float32",
                 max_num_seqs=4, device="cpu")
    static.proposer.capture_graphs(use_graphs=False)
    assert static.proposer.draft.graphs is not None
    assert (static.proposer._chain.fused is not None) == fused
    assert [o.token_ids for o in static.generate(PROMPTS, GREEDY)] == baseline
    # Every greedy step drafts through the chain, steps where requests joined (their prompt is caught
    # up in a forward of its own first) included.
    assert static.proposer.chain_steps == static.step_timer.steps
    # New requests' prompts reach the draft through its prefill graphs.
    assert static.proposer.draft.graphs.prefill_replays > 0
    eager.generate(PROMPTS, GREEDY)
    assert eager.proposer.chain_steps == 0
    assert static.stats.num_accepted_tokens == eager.stats.num_accepted_tokens
    assert static.stats.num_draft_tokens == eager.stats.num_draft_tokens


class _Runs(SpeculationPolicy):
    """Runs of plain steps (9, then 40: longer than the draft's widest step graph), each followed by two drafting
    steps, by the bucket's decision count."""

    @staticmethod
    def _decide(b):
        b.since += 1
        return b.since % 53 in (9, 10, 51, 52)


@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_catch_ups_after_plain_runs_replay_the_step_graphs(tiny_llama_path, method):
    """Under the auto policy the draft misses runs of plain steps and catches up at the next drafting step: with the
    draft's step graphs that catch-up goes through them in pieces of up to CATCH_UP_TOKENS, never an eager forward of
    an odd length (on CUDA one compiles kernels for its shape); outputs equal the baseline's, greedy (the chain) and
    seeded at T = 0.8 (probabilistic drafts, one forward a draft). The target as its own draft: a greedy draft is
    wrong only where the catch-up left the draft's cache wrong."""
    prompts = PROMPTS[:4]
    params = [SamplingParams(temperature=0.0 if method == "greedy" else 0.8, seed=i, max_tokens=70, ignore_eos=True)
              for i in range(len(prompts))]
    want = [o.token_ids for o in LLM(tiny_llama_path, dtype="float32", max_num_seqs=4).generate(prompts, params)]
    llm = LLM(tiny_llama_path, {**spec(3, tiny_llama_path, draft_sample_method=method), "speculation_policy": "auto"},
              dtype="float32", max_num_seqs=4, device="cpu")
    p = llm.proposer
    p.capture_graphs(use_graphs=False)
    llm.policy = _Runs(3)
    eager, real = [], p.draft.collect

    def collect(*args, owned=False, **kw):
        eager.append(owned)  # owned: the eager path's own tensors
        return real(*args, owned=owned, **kw)
    p.draft.collect = collect
    widths, forward = [], p.draft.forward

    def recorded(slots, tokens, *args, **kw):
        widths.append(max(map(len, tokens)))
        return forward(slots, tokens, *args, **kw)
    p.draft.forward = recorded
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert CATCH_UP_TOKENS in widths and max(widths) <= 70  # a 40-step run's catch-up: a full piece, then the rest
    assert llm.policy.stats.steps_plain >= 49 and llm.stats.num_accepted_tokens > 0
    if method == "greedy":
        assert llm.stats.num_accepted_tokens == llm.stats.num_draft_tokens
    assert len(eager) > 0 and not any(eager)
    assert (p.chain_steps > 0) == (method == "greedy")


def test_cpu_drafts_greedy_steps_through_an_eager_chain_by_default(tiny_llama_path, tiny_llama_draft_path, baseline):
    """Off CUDA the draft's greedy steps run the chain function eagerly (FusedLlama, all k drafts in
    one call) unless ``draft_chain=False``: the same outputs and the same acceptance as k forwards
    through the draft's own layers. Probabilistic drafts for sampled requests still take one forward
    at a time (greedy drafts use the chain at any temperature)."""
    cpu = {"dtype": "float32", "max_num_seqs": 4, "device": "cpu"}  # the CPU path, also on a GPU machine
    chained = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path), **cpu)
    plain = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path, draft_chain=False), **cpu)
    p = chained.proposer
    assert p._chain is not None and not p._chain.use_graphs and p._chain.fused is not None
    assert p.draft.graphs is None  # the draft's other forwards stay eager
    assert plain.proposer._chain is None
    assert [o.token_ids for o in chained.generate(PROMPTS, GREEDY)] == baseline
    assert [o.token_ids for o in plain.generate(PROMPTS, GREEDY)] == baseline
    assert p.chain_steps == chained.step_timer.steps > 0 and plain.proposer.chain_steps == 0
    assert chained.stats.num_accepted_tokens == plain.stats.num_accepted_tokens > 0
    assert chained.stats.num_draft_tokens == plain.stats.num_draft_tokens
    sampled = SamplingParams(temperature=0.8, max_tokens=8, seed=0)
    steps = p.chain_steps
    chained.generate(PROMPTS[:2], sampled)
    assert p.chain_steps > steps  # greedy drafts, sampled requests: still the chain
    prob = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path, draft_sample_method="probabilistic"), **cpu)
    prob.generate(PROMPTS[:2], sampled)
    assert prob.proposer._chain is not None and prob.proposer.chain_steps == 0


def test_eager_chain_follows_grown_slots(tiny_llama_path, tiny_llama_draft_path):
    """A proposer given more requests than the target's slots grows its own, and its eager chain's
    batch buckets grow with them (else the new slots would fall back to per-token drafting)."""
    llm = LLM(tiny_llama_path, spec(2, tiny_llama_draft_path), dtype="float32", max_num_seqs=2)
    p = llm.proposer
    assert max(p._chain.batches) == 2
    for i in range(3):
        p.add_request(f"r{i}", np.array(PROMPTS[i], dtype=np.int32))
    assert len(p.draft.lengths) == 4 and max(p._chain.batches) >= 4


def test_chain_drafts_reach_the_verify_forward_on_the_device(tiny_llama_path, tiny_llama_draft_path, baseline):
    """The chain's drafts go to the target's fixed-shape forward as device ids (DeferredDrafts; forced
    on the CPU here), scattered to non-contiguous slots as requests come and go, and the chain's
    pending drafts are read from its host copy one step later: outputs equal the baseline's, and
    the draft's bookkeeping is intact (the same acceptance as eager drafting)."""
    eager = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path), dtype="float32", max_num_seqs=4)
    eager.generate(PROMPTS, GREEDY)
    llm = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path), dtype="float32", max_num_seqs=4)
    llm.proposer.capture_graphs(use_graphs=False)
    assert llm.target.capture_graphs([1, 4], use_graphs=False)
    llm._defer_drafts = True
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == baseline
    assert llm.proposer.chain_steps == llm.step_timer.steps
    assert llm.stats.num_accepted_tokens == eager.stats.num_accepted_tokens > 0
    assert llm.stats.num_draft_tokens == eager.stats.num_draft_tokens


def test_chain_near_max_model_len_falls_back_losslessly(tiny_llama_path, tiny_llama_draft_path):
    """Requests within k tokens of max_model_len are drafted one forward at a time (a chain would
    write past the end); outputs still equal the baseline's, which stops at the same length."""
    base = LLM(tiny_llama_path, dtype="float32", max_num_seqs=4, max_model_len=32)
    want = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    assert any(len(p) + len(w) == 32 for p, w in zip(PROMPTS, want))  # some requests hit the limit
    static = LLM(tiny_llama_path, spec(4, tiny_llama_draft_path), dtype="float32", max_num_seqs=4, max_model_len=32)
    static.proposer.capture_graphs(use_graphs=False)
    assert [o.token_ids for o in static.generate(PROMPTS, GREEDY)] == want
    assert static.proposer.chain_steps > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_graph_chain_is_lossless(tiny_llama_path, tiny_llama_draft_path):
    """On a GPU, in float32, the captured draft chain (Hugging Face's layers: draft_fused=False) and
    target graphs give the baseline's tokens."""
    kw = dict(dtype="float32", device="cuda", max_num_seqs=4)
    want = [o.token_ids for o in LLM(tiny_llama_path, **kw).generate(PROMPTS, GREEDY)]
    llm = LLM(tiny_llama_path, spec(3, tiny_llama_draft_path, draft_fused=False), **kw)
    assert llm.proposer._chain is not None and llm.proposer._chain.use_graphs
    assert llm.proposer._chain.fused is None
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == want
    assert llm.proposer.chain_steps > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_bf16_fused_chain_with_bundled_pair():
    """bfloat16, the bundled pair, four slots: the fused chain (Triton RMSNorm, SiLU, rotary + KV-write and
    attention kernels) drafts every greedy step after the first, and its drafts are mostly accepted."""
    rng = random.Random(11)
    prompts = [[rng.randrange(2, 4096) for _ in range(rng.randrange(5, 90))] for _ in range(10)]
    llm = LLM(specdec.bundled_model("tiny"), spec(3, specdec.bundled_model("tiny-draft")), dtype="bfloat16",
              device="cuda", max_num_seqs=4)
    assert llm.proposer._chain is not None and llm.proposer._chain.fused is not None
    fused = llm.proposer._chain.fused
    assert fused.use_triton and fused.triton_rope and fused.triton_attention
    outs = llm.generate(prompts, GREEDY)
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
    assert llm.proposer.chain_steps > 0 and llm.stats.num_accepted_tokens > 0


_GQA_FUSED_CHECK = """
import json, sys
from specdec import LLM, SamplingParams
target, draft, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
kw = dict(dtype="float32", device="cuda", max_num_seqs=4)
params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
want = [o.token_ids for o in LLM(target, **kw).generate(prompts, params)]
llm = LLM(target, {"method": "draft_model", "num_speculative_tokens": 3, "model": draft}, **kw)
assert llm.proposer._chain is not None and llm.proposer._chain.fused is not None, "no fused chain"
assert [o.token_ids for o in llm.generate(prompts, params)] == want, "outputs differ from the baseline"
print("ok", llm.proposer.chain_steps)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_fused_chain_with_grouped_query_draft(tiny_llama_path, tiny_llama_draft_path):
    """The default fused chain on a grouped-query draft of head_dim 8, float32 on CUDA: the baseline's
    tokens. It runs in a subprocess, because the failure once seen here (with the Triton rotary
    kernel) was an illegal memory access, which leaves a process unable to use the GPU."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _GQA_FUSED_CHECK, tiny_llama_path, tiny_llama_draft_path,
                          json.dumps(PROMPTS)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-3000:]

"""Smoke test of the end-to-end benchmark (specdec_tools.bench, benchmarks/e2e.py, `specdec bench`): its
plumbing and its checks, at sizes that run in seconds. Speed itself is never asserted."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdec import Drafts, Proposer, available_methods
from specdec_tools import bench

SMALL = dict(workloads=["completion", "edit", "repeated"], batch=[1], temperature=[0.0], prompts=1, max_tokens=8,
             prompt_tokens=64, repeats=1, progress=False, timing_seconds=0.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, str]:
    """The bundled tiny pair; without it (a checkout whose weights are being rebuilt), a random-init
    Llama pair sharing a small BPE trained here on a few stdlib files."""
    from specdec import bundled_model

    try:
        if os.environ.get("SPECDEC_TEST_RANDOM_BENCH_MODELS"):  # exercise the fallback on purpose
            raise FileNotFoundError
        return bundled_model("tiny"), bundled_model("tiny-draft")
    except FileNotFoundError:
        from transformers import LlamaConfig, LlamaForCausalLM

        from specdec_tools.zoo import train_tokenizer

        tokenizer = train_tokenizer([t for _, t in bench.held_out_files()[:8]], 512)
        paths = []
        for name, layers in (("target", 2), ("draft", 1)):
            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
            model = LlamaForCausalLM(config)
            with torch.no_grad():  # peaked logits: no float32 near-ties (as in conftest._save_model)
                for p in model.parameters():
                    if p.dim() >= 2:
                        p.normal_(0.0, 0.25)
            path = tmp_path_factory.mktemp(name)
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            paths.append(str(path))
        return paths[0], paths[1]


@pytest.fixture(scope="module")
def tokenizer(models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models[0])


class LastTokenLookup(Proposer):
    """A real (lossless) drafter needing no plugin: the k tokens that followed the last earlier
    occurrence of the current token."""

    method = "last_token_lookup"

    def propose(self, batch):
        k, drafts = batch.num_speculative_tokens, []
        for i in range(batch.batch_size):
            ids = batch.token_ids[i, : int(batch.num_tokens[i])]
            hits = np.nonzero(ids[:-1] == ids[-1])[0]
            drafts.append(ids[hits[-1] + 1: hits[-1] + 1 + k].tolist() if len(hits) else [])
        return Drafts.from_lists(drafts, k)


class KVScribbler(Proposer):
    """A deliberately lossy 'method': a buggy plugin that zeroes the target's cached keys (through the
    target it is handed) every step. The engine cannot see this, so greedy output really differs."""

    method = "kv_scribbler"

    def propose(self, batch):
        for keys in self.target.cache.keys:
            keys.zero_()
        return Drafts.from_lists([[] for _ in batch.req_ids], 1)


def test_workloads_are_deterministic_and_shaped(tokenizer):
    a = bench.build_workloads(tokenizer, list(bench.WORKLOADS), 4, 2, 64, seed=0)
    b = bench.build_workloads(tokenizer, list(bench.WORKLOADS), 4, 2, 64, seed=0)
    assert [w.calls for w in a] == [w.calls for w in b]
    completion, edit, repeated = a
    assert len(completion.prompts) == len(edit.prompts) == 4 and all(len(p) <= 64 for p in completion.prompts)
    assert all(len(p) > len(c) for p, c in zip(edit.prompts, completion.prompts))  # a chunk, then its edited head
    assert len(repeated.calls) == 3 and all(len(c) == 2 for c in repeated.calls)  # same, same, near-duplicate
    assert repeated.calls[0] == repeated.calls[1] and repeated.calls[2] != repeated.calls[0]


def test_small_edit_changes_one_line_near_the_top():
    text = "".join(f"value_{i} = compute_{i}(x)\n" for i in range(30))
    edited, line = bench.small_edit(text, random.Random(0))
    old, new = text.splitlines(), edited.splitlines()
    assert line < 8 and [i for i, (x, y) in enumerate(zip(old, new)) if x != y] == [line]
    assert "_v2" in new[line]


def test_check_refuses_float32_and_classifies_near_ties():
    base, other, prompts = [[5, 6, 7], [1, 2, 3]], [[5, 6, 7], [1, 2, 9]], [[0], [0]]
    assert bench.compare_greedy(base, base)["identical"] == 2
    logits = torch.full((1, 3, 16), -5.0)
    logits[0, -1, 2], logits[0, -1, 9], logits[0, -1, 4] = 10.0, 9.9, 2.0  # 9 is a near-tie, 4 is not

    class Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids):
            return SimpleNamespace(logits=logits[:, : input_ids.shape[1]])

    stub = Stub()
    exact = bench.check_method(base, other, prompts, torch.float32, lambda: stub, 0.05)
    assert exact["refused"] and bench.check_label(exact).startswith("REFUSED")
    tie = bench.check_method(base, other, prompts, torch.bfloat16, lambda: stub, 0.05)
    assert not tie["refused"] and not tie["suspect"] and tie["margins"][0]["near_tie"]
    assert tie["margins"][0]["top2_margin"] == pytest.approx(0.1, abs=1e-5)
    far = bench.check_method(base, [[5, 6, 7], [1, 2, 4]], prompts, torch.bfloat16, lambda: stub, 0.05)
    assert far["suspect"] and "BUG?" in bench.check_label(far)


def test_bench_end_to_end_writes_outputs_and_refuses_a_lossy_method(models, tmp_path, register_proposer):
    register_proposer(LastTokenLookup, KVScribbler)
    installed = {n for n, info in available_methods().items() if info.status == "ok"}
    real = ["last_token_lookup"] + [m for m in ("ngram", "draft_model") if m in installed]  # plugins if present
    # On the CPU in float32, where the check refuses any difference (on CUDA the default is bf16, whose
    # divergences are only flagged: this test would then see kv_scribbler flagged, not refused).
    s = bench.Settings(model=models[0], draft_model=models[1], methods=[*real, "kv_scribbler"], out=str(tmp_path),
                       device="cpu", dtype="float32", **SMALL)
    result = bench.run_benchmark(s)
    paths = bench.write_outputs(result, tmp_path, "smoke")
    data = json.loads(Path(paths["json"]).read_text())
    md = Path(paths["markdown"]).read_text()
    try:
        import matplotlib  # noqa: F401

        assert Path(paths["speedup"]).stat().st_size > 0 and Path(paths["acceptance"]).stat().st_size > 0
    except ImportError:
        assert any("matplotlib" in n for n in data["notes"])
    assert "| workload | batch |" in md and "REFUSED" in md
    rows = {(r["workload"], r["method"]): r for r in data["rows"]}
    assert len(rows) == 3 * (2 + len(real))
    for w in bench.WORKLOADS:
        assert rows[(w, "baseline")]["speedup"] == pytest.approx(1.0)
        assert rows[(w, "baseline")]["tokens_per_step"] == pytest.approx(1.0)
        for m in real:  # lossless methods: exact in float32, so a speedup is reported
            assert not rows[(w, m)]["refused"] and rows[(w, m)]["check"].startswith("exact")
            assert rows[(w, m)]["tok_s"] > 0 and rows[(w, m)]["efficiency"] > 0
            r = rows[(w, m)]
            # the profiled pass: every request is prefilled once, in groups; decode steps run <= batch requests
            assert 1 <= r["prefills"] <= r["requests"] and 0 < r["prefill_share"] < 1
            assert 1 <= r["mean_batch"] <= r["batch"]
            if r["batch"] == 1 and r["mean_acceptance_length"] > 1:  # the loop-only efficiency's step model
                f, al = r["drafted_step_share"], r["mean_acceptance_length"]
                assert 0 <= f <= 1 and r["loop_efficiency"] > 0
                if 0 < f < 1:
                    assert r["tokens_per_step"] == pytest.approx(f * al + 1 - f)
                assert r["ideal_step_speedup"] == pytest.approx(
                    r["tokens_per_step"] / (f * r["tk1_ms"] / r["t1_ms"] + 1 - f))
        lossy = rows[(w, "kv_scribbler")]
        assert lossy["refused"] and "speedup" not in lossy and "tok_s" not in lossy
    diverged = [c for c in data["checks"] if c["method"] == "kv_scribbler"]
    assert all(c["refused"] and c["diverged"] for c in diverged)  # the output really differed
    peers = {(p["workload"], p["peer"]) for p in data["peers"] if "tok_s" in p}
    for w in bench.WORKLOADS:
        assert {(w, "hf eager"), (w, "hf prompt_lookup k=4"), (w, "hf assistant")} <= peers
    assert any("hf static: skipped on CPU" in n for n in data["notes"])


def test_cli_bench_small_run(models, tmp_path, capsys, register_proposer):
    from specdec.cli import _build_parser, main

    register_proposer(LastTokenLookup)
    args = _build_parser().parse_args(["bench"])
    assert (args.batch, args.temperature, args.max_tokens, args.prompts) == ([1], [0.0], 48, 3)
    from specdec_tools.bench import settings_from_args
    from specdec_tools.bench.run import _engine_kwargs

    assert _engine_kwargs(settings_from_args(args), 1)["fused_forward"] is None  # LLM's default
    off = settings_from_args(_build_parser().parse_args(["bench", "--no-fused-forward"]))
    assert off.fused_forward is False and _engine_kwargs(off, 1)["fused_forward"] is False
    assert _engine_kwargs(settings_from_args(args), 1)["cpu_threads"] == "auto"
    for flag, want in (("none", None), ("3", 3), ("auto", "auto")):
        parsed = settings_from_args(_build_parser().parse_args(["bench", "--cpu-threads", flag]))
        assert _engine_kwargs(parsed, 1)["cpu_threads"] == want
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["bench", "--cpu-threads", "0"])
    assert "--cpu-threads '0' is invalid: give auto, none or an int >= 1." in capsys.readouterr().err
    code = main(["bench", "--model", models[0], "--draft-model", models[1], "--methods", "last_token_lookup:3",
                 "--workloads", "edit", "--prompts", "1", "--max-tokens", "4", "--prompt-tokens", "48",
                 "--repeats", "1", "--no-peers", "--no-plots", "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "| edit | 1 | 0 | last_token_lookup | 3 |" in out and (tmp_path / "bench.json").is_file()


def test_each_sampled_temperature_is_warmed_up_once_before_timing(models, tmp_path, register_proposer, monkeypatch):
    """What a sampled step compiles or captures on first use must not land in a timed pass: before an
    engine's first timed pass at a temperature above 0 it runs one short untimed pass at it (once per
    batch size, not per workload); temperature 0 is warmed by the greedy check pass."""
    from specdec_tools.bench import run as bench_run

    register_proposer(LastTokenLookup)
    passes = []  # (engine, temperature, max_tokens) in order

    def recording(llm, wl, temperature, max_tokens, seed):
        passes.append((id(llm), temperature, max_tokens))
        return real(llm, wl, temperature, max_tokens, seed)

    real = bench_run.run_pass
    monkeypatch.setattr(bench_run, "run_pass", recording)
    s = bench.Settings(model=models[0], draft_model=models[1], methods=["last_token_lookup"], out=str(tmp_path),
                       **{**SMALL, "workloads": ["completion", "edit"], "temperature": [0.0, 0.8], "max_tokens": 24,
                          "peers": False, "plots": False})
    bench.run_benchmark(s)
    engines = {e for e, _, _ in passes}
    assert len(engines) == 2
    for e in engines:
        mine = [(t, n) for x, t, n in passes if x == e]
        assert mine[0] == (0.0, 24)  # the greedy check comes first
        sampled = [n for t, n in mine if t == 0.8]
        assert sampled[0] == 16 and sampled.count(16) == 1  # one short warm-up, then the full passes
        assert all(n == 24 for n in sampled[1:]) and len(sampled) > 2


def test_a_run_stopped_by_sigterm_keeps_the_cells_it_finished(models, tmp_path, register_proposer, monkeypatch):
    """``timeout`` sends SIGTERM: the run stops where it is, keeps the rows of the cells it finished (a cell is one
    workload at one batch size), says so in its notes and still writes its outputs; the process's own SIGTERM
    handler is back afterwards."""
    import signal

    from specdec_tools.bench import run as bench_run

    register_proposer(LastTokenLookup)
    cells = []

    def second_cell_is_stopped(llms, methods, wl, *args):
        cells.append(wl.name)
        if len(cells) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` does, in the middle of the second cell
        return real(llms, methods, wl, *args)

    real = bench_run.bench_cell
    monkeypatch.setattr(bench_run, "bench_cell", second_cell_is_stopped)
    before = signal.getsignal(signal.SIGTERM)
    s = bench.Settings(model=models[0], draft_model=models[1], methods=["last_token_lookup"], out=str(tmp_path),
                       **{**SMALL, "peers": False, "plots": False})
    result = bench.run_benchmark(s)
    assert signal.getsignal(signal.SIGTERM) is before
    assert result["stopped"] and cells == ["completion", "edit"]
    assert {r["workload"] for r in result["rows"]} == {"completion"} and len(result["rows"]) == 2
    assert any(n.startswith("stopped by SIGTERM after ") for n in result["notes"])
    paths = bench.write_outputs(result, s.out, "stopped", False)
    assert json.loads(Path(paths["json"]).read_text())["stopped"] is True


def test_timed_pass_runs_without_the_garbage_collector_and_restores_it(models, monkeypatch):
    """A pass is timed with the collector off (a full collection walks every engine the benchmark
    process holds), and the collector's state is restored afterwards, also when the pass fails."""
    import gc

    from specdec import LLM
    from specdec_tools.bench.passes import run_pass

    llm = LLM(models[0], dtype="float32", max_num_seqs=2)
    seen, real = [], llm.generate

    def generate(prompts, params):
        seen.append(gc.isenabled())
        return real(prompts, params)

    monkeypatch.setattr(llm, "generate", generate)
    wl = bench.Workload("completion", [[[5, 6, 7]], [[8, 9]]])
    assert gc.isenabled()
    outs, seconds, steps = run_pass(llm, wl, 0.0, 4, 0)
    assert seen == [False, False] and gc.isenabled()
    assert [len(o) for o in outs] == [4, 4] and steps == 6 and seconds > 0  # 4 tokens: 1 from prefill + 3 steps

    def failing(prompts, params):
        raise RuntimeError("boom")

    monkeypatch.setattr(llm, "generate", failing)
    with pytest.raises(RuntimeError, match="boom"):
        run_pass(llm, wl, 0.0, 4, 0)
    assert gc.isenabled()


def test_target_forwards_are_timed_with_the_hidden_states_the_method_asks(models, monkeypatch):
    """T(k+1) is timed as the method's engine runs its target: asking for the proposer's hidden states (on CUDA
    the engine's graphs are captured for that request; a forward without it ran eagerly and read 11x T(1))."""
    from specdec import LLM
    from specdec_tools.bench.passes import time_forwards

    base = LLM(models[0], dtype="float32", max_num_seqs=1)
    eagle = LLM(models[0], {"method": "eagle3", "num_speculative_tokens": 2}, dtype="float32", max_num_seqs=1)
    request = eagle.proposer.hidden_states_needed()
    assert request is not None
    seen = []
    for name, llm in (("base", base), ("eagle", eagle)):
        real = llm.target.forward

        def forward(*a, _real=real, _name=name, **kw):
            seen.append((_name, len(a[1][0]), kw.get("hidden")))
            return _real(*a, **kw)

        monkeypatch.setattr(llm.target, "forward", forward)
    times = time_forwards([base.target, eagle.target], [1, 3], 1, 16, 0.0, hidden=[None, request])
    assert len(times) == 2 and all(t > 0 for t in times)
    assert {(n, q, h is request) for n, q, h in seen} == {("base", 1, False), ("eagle", 3, True)}
    assert {h for n, _, h in seen if n == "base"} == {None}


def test_the_spec_steps_cell_names_the_policys_ratio_and_commonest_plain_reason():
    from specdec_tools.bench.report import _policy

    row = {"policy": "auto", "policy_stats": {"drafted_step_share": 0.37, "steps_plain": 80, "plain_batch_end": 76,
                                              "plain_remeasure": 4, "plain_warmup": 0},
           "policy_cost": {8: {"plain_steps": 10, "spec_steps": 5, "spec_over_plain": 1.09},
                           1: {"plain_steps": 1, "spec_steps": 1, "spec_over_plain": 2.0}}}
    assert _policy(row) == "auto 37% (r 1.09; plain: batch_end 76)"
    row["policy_stats"] = {"drafted_step_share": 1.0, "steps_plain": 0}
    assert _policy(row) == "auto 100% (r 1.09)"
    assert _policy({"policy": "fixed"}) == "fixed" and _policy({}) == "-"

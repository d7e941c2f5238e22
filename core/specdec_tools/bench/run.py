"""The grid: methods, engines, timed and profiled passes per cell, and the whole run (run_benchmark)."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specdec.cli_common import option_value
from specdec.policy import SPECULATION_POLICIES, PolicyStats
from specdec_tools.bench.checks import check_label, check_method
from specdec_tools.bench.passes import profile_pass, run_pass, time_forwards
from specdec_tools.bench.peers import _HF, _peer_variants, run_peers
from specdec_tools.bench.workloads import Settings, Workload, build_workloads, default_methods, parse_method

# ---------------------------------------------------------------- the grid


@dataclass(slots=True)
class Method:
    """A method as benchmarked: its runtime name, k and the flat speculative config."""

    name: str
    k: int
    config: dict[str, Any]


def resolve_methods(s: Settings, draft: str | None) -> tuple[list[Method], list[str]]:
    """The requested methods that are installed and usable here, and a note for each one skipped."""
    from specdec import available_methods

    installed = {n: i for n, i in available_methods().items() if i.status == "ok"}
    specs = default_methods("full") if s.methods is None else s.methods
    methods, notes = [], []
    for spec in specs:
        spec, *extra = spec.split("+")  # name:k@policy+key=value+...: options of this entry alone
        spec, _, policy = spec.partition("@")
        name, k = parse_method(spec, s.k)
        label = (f"{name}@{policy}" if policy else name) + "".join(f"+{e}" for e in extra)
        entry = {}
        for e in extra:
            key, sep, raw = e.partition("=")
            if not sep or not key:
                raise ValueError(f"method {spec}+{e} is invalid: options after + look like key=value, e.g. "
                                 "medusa:3@fixed+tree_choices=default.")
            entry[key] = option_value(raw)
        if policy and policy not in SPECULATION_POLICIES:
            raise ValueError(f"method {spec}@{policy} is invalid: the part after @ is a speculation policy, one of "
                             f"{', '.join(SPECULATION_POLICIES)} (e.g. ngram:4@fixed).")
        if any(m.name == label for m in methods):
            raise ValueError(f"method {label!r} is given twice in {specs}: benchmark one k per method and policy "
                             "per run.")
        if name not in installed:
            notes.append(f"{name}: skipped, not installed (installed: {', '.join(sorted(installed))}).")
            continue
        cls = installed[name].proposer_class
        config = {"method": name, "num_speculative_tokens": k, **cls.bench_options, **s.method_options.get(name, {}),
                  **entry}
        if policy:
            config["speculation_policy"] = policy
        if cls.takes_draft_model:
            if draft is None:
                notes.append(f"{name}: skipped, no --draft-model given for a non-bundled --model.")
                continue
            config["model"] = draft
        methods.append(Method(label, k, config))
    return methods, notes


def _engine_kwargs(s: Settings, batch: int) -> dict[str, Any]:
    return {"dtype": s.dtype, "device": s.device, "max_model_len": s.max_model_len, "max_num_seqs": batch,
            "cuda_graphs": s.cuda_graphs, "prefill_graph_tokens": s.prefill_graph_tokens, "admit_group": s.admit_group,
            "fused_forward": s.fused_forward, "cpu_threads": s.cpu_threads}


def _interleaved(llms: dict[str, Any], wl: Workload, temperature: float, s: Settings, bar: Any
                 ) -> tuple[dict[str, list[float]], dict[str, tuple[int, int]]]:
    """``repeats`` timed passes of every engine, the order rotating each round. Returns the seconds
    of each pass and (tokens, decode steps) summed over passes, per engine."""
    names = list(llms)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    counts = dict.fromkeys(names, (0, 0))
    for llm in llms.values():
        llm.stats.reset()
        if getattr(llm, "policy", None) is not None:
            llm.policy.stats = PolicyStats()  # the timed passes' decisions only
    for r in range(s.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            outs, t, steps = run_pass(llms[name], wl, temperature, s.max_tokens, s.seed)
            seconds[name].append(t)
            counts[name] = (counts[name][0] + sum(len(o) for o in outs), counts[name][1] + steps)
            bar.update(1)
    return seconds, counts


def _timed_row(row: dict[str, Any], llm: Any, m: Method | None, wl: Workload, temp: float, s: Settings,
               seconds: dict[str, list[float]], counts: tuple[int, int], t1: float | None, tk: float | None
               ) -> dict[str, Any]:
    """Fill a row from the timed passes (``seconds``; ``counts``: tokens and decode steps), the
    engine's acceptance counters and one profiled pass (run here, after the counters are read)."""
    name, (tokens, steps) = row["method"], counts
    speedups = [b / t for b, t in zip(seconds["baseline"], seconds[name])]
    # the first token of each request comes from its prefill, not from a decode step
    row.update(refused=False, tokens=tokens, seconds=seconds[name], tok_s=tokens / sum(seconds[name]),
               speedup=sum(seconds["baseline"]) / sum(seconds[name]), speedup_min=min(speedups),
               speedup_max=max(speedups), tokens_per_step=(tokens - len(wl.prompts) * s.repeats) / max(steps, 1))
    if m is not None:
        policy = getattr(llm, "policy", None)
        row.update(policy="fixed" if policy is None else "auto")
        if policy is not None:
            row.update(policy_stats=policy.stats.as_dict(), policy_cost=policy.cost_table(sampled=temp > 0))
        stats = llm.stats
        predicted = stats.mean_acceptance_length * t1 / tk
        row.update(mean_acceptance_length=stats.mean_acceptance_length,
                   acceptance_rate_per_pos=stats.acceptance_rate_per_pos,
                   draft_acceptance_rate=stats.draft_acceptance_rate, t1_ms=t1, tk1_ms=tk,
                   predicted_speedup=predicted, efficiency=row["speedup"] / predicted)
        if row["batch"] == 1 and stats.mean_acceptance_length > 1:
            # The same ideal with steps that found nothing to draft costed at T(1): a drafted share f of
            # the steps makes tokens_per_step = f * accept len + (1 - f). What is left is the loop's own cost.
            f = min(1.0, max(0.0, (row["tokens_per_step"] - 1) / (stats.mean_acceptance_length - 1)))
            ideal = row["tokens_per_step"] / (f * tk / t1 + 1 - f)
            row.update(drafted_step_share=f, ideal_step_speedup=ideal, loop_efficiency=row["speedup"] / ideal)
    ms, extra = profile_pass(llm, wl, temp, s.max_tokens, s.seed)
    step = sum(ms.values()) or 1.0
    row.update(step_ms=ms, draft_share=ms["propose"] / step, verify_share=(ms["forward"] + ms["sample"]) / step,
               **extra)
    return row


def _warm_up(llms: dict[str, Any], wl: Workload, batch: int, temperature: float, s: Settings) -> None:
    """One short untimed pass of every engine at ``temperature``: what a sampled step compiles or
    captures on first use (the sampler's Triton kernels, a draft model's per-token path) is not
    timed. The greedy check pass does the same for temperature 0."""
    short = Workload(wl.name, [wl.calls[0][:batch]])  # one batch of prompts, a few tokens each
    for llm in llms.values():
        run_pass(llm, short, temperature, min(s.max_tokens, 16), s.seed)


def bench_cell(llms: dict[str, Any], methods: list[Method], wl: Workload, batch: int, s: Settings, hf: _HF,
               bar: Any, warmed: set[float] | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Any], list[list[int]]]:
    """Every temperature of one workload at one batch size: the greedy check, T(1) and T(k+1), the
    interleaved timed passes and a profiled pass per engine. Returns rows, checks, baseline outputs.
    ``warmed``: the temperatures these engines have already run at (updated here); each other
    non-zero temperature gets an untimed warm-up pass first (:func:`_warm_up`)."""
    bar.set_postfix_str(f"{wl.name} b={batch} check")
    base_out = run_pass(llms["baseline"], wl, 0.0, s.max_tokens, s.seed)[0]
    bar.update(1)
    checks: dict[str, Any] = {}
    for m in methods:
        outs = run_pass(llms[m.name], wl, 0.0, s.max_tokens, s.seed)[0]
        checks[m.name] = check_method(base_out, outs, wl.prompts, llms["baseline"].target.dtype, hf.get, s.tie_rel)
        bar.update(1)
    active = {n: llm for n, llm in llms.items() if n == "baseline" or not checks[n]["refused"]}
    context = int(statistics.mean(len(p) for p in wl.prompts)) + s.max_tokens // 2
    t1, tk = {}, {}  # T(1) on the baseline's target, T(k+1) on the method's, timed in turns
    for m in methods:
        if m.name in active:
            proposer = llms[m.name].proposer  # its engine's graphs are captured for the hidden states it asks
            request = proposer.hidden_states_needed() if proposer is not None else None
            t1[m.name], tk[m.name] = time_forwards([llms["baseline"].target, llms[m.name].target], [1, m.k + 1],
                                                   batch, context, s.timing_seconds, hidden=[None, request])
    rows = []
    warmed = set() if warmed is None else warmed
    for temp in s.temperature:
        bar.set_postfix_str(f"{wl.name} b={batch} T={temp:g}")
        if temp != 0 and temp not in warmed:
            _warm_up(active, wl, batch, temp, s)
            warmed.add(temp)
        seconds, counts = _interleaved(active, wl, temp, s, bar)
        bar.update((len(llms) - len(active)) * (s.repeats + 1))  # refused engines are not timed
        for name in llms:
            m = next((m for m in methods if m.name == name), None)
            row = {"workload": wl.name, "batch": batch, "temperature": temp, "method": name, "k": m.k if m else 0,
                   "requests": len(wl.prompts), "check": check_label(checks[name]) if m else "-"}
            if name not in active:
                rows.append({**row, "refused": True})
                continue
            rows.append(_timed_row(row, llms[name], m, wl, temp, s, seconds, counts[name], t1.get(name),
                                   tk.get(name)))
            bar.update(1)
    return rows, checks, base_out


# ---------------------------------------------------------------- orchestration


def _prepare(s: Settings) -> dict[str, Any]:
    """Paths, methods, device, dtype and the prompt budget of a run, without loading any model."""
    from specdec import bundled_model
    from specdec.target import read_model_config, resolve_dtype

    model = s.model or bundled_model("tiny")
    draft = s.draft_model or (bundled_model("tiny-draft") if s.model is None else None)
    methods, notes = resolve_methods(s, draft)
    device = torch.device(s.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    max_len = s.max_model_len or int(read_model_config(model).get("max_position_embeddings") or 2048)
    prompt_tokens = min(s.prompt_tokens, int((max_len - s.max_tokens - 8) / 1.4))
    if prompt_tokens < 16:
        raise ValueError(f"max_tokens={s.max_tokens} leaves no room for prompts in max_model_len={max_len}.")
    if prompt_tokens < s.prompt_tokens:
        notes.append(f"prompt_tokens cut from {s.prompt_tokens} to {prompt_tokens} to fit max_model_len={max_len} "
                     f"with {s.max_tokens} new tokens (an edit prompt is up to 1.35x a chunk).")
    return {"model": model, "draft": draft, "methods": methods, "notes": notes, "device": device,
            "dtype": resolve_dtype(s.dtype, device), "max_model_len": max_len, "prompt_tokens": prompt_tokens}


def _meta(s: Settings, run: dict[str, Any]) -> dict[str, Any]:
    import transformers

    device = run["device"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "device": f"{device.type}: {name}",
            "model": run["model"], "draft": run["draft"], "dtype": str(run["dtype"]).removeprefix("torch."),
            "cuda_graphs": None, "max_model_len": run["max_model_len"], "prompt_tokens": run["prompt_tokens"],
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            # methods=None: record the defaults this run resolved to (the plugins' bench_default)
            "settings": {**asdict(s), "methods": s.methods or [f"{m.name}:{m.k}" for m in run["methods"]]}}


def _progress(s: Settings, methods: list[Method], peer_passes: int) -> Any:
    from tqdm.auto import tqdm

    n = 1 + len(methods)  # engines: baseline + methods; per cell a check pass, then repeats + 1 profiled
    total = len(s.batch) * len(s.workloads) * (n + len(s.temperature) * n * (s.repeats + 1)) + peer_passes
    return tqdm(total=total, desc="specdec bench", unit="pass", dynamic_ncols=True, disable=not s.progress)


def run_benchmark(s: Settings) -> dict[str, Any]:
    """Run the whole grid (and the peers at batch 1); returns the results as one JSON-able dict."""
    from transformers import AutoTokenizer

    if s.threads:
        torch.set_num_threads(s.threads)
    run = _prepare(s)
    methods, notes = run["methods"], run["notes"]
    tokenizer = AutoTokenizer.from_pretrained(run["model"], trust_remote_code=False)
    hf = _HF(run["model"], run["draft"], run["dtype"], run["device"])
    result: dict[str, Any] = {"meta": _meta(s, run), "workloads": [], "rows": [], "checks": [], "peers": [],
                              "notes": notes}
    started = time.perf_counter()
    peer_k = s.k  # HF prompt lookup drafts -k tokens, as every method given without :k does
    variants = _peer_variants(s, hf, peer_k)[0] if s.peers and 1 in s.batch else []
    bar = _progress(s, methods, len(s.workloads) * len(variants) * s.peer_repeats)
    try:
        with _stop_on_sigterm():
            _run_grid(s, run, tokenizer, hf, bar, result, variants, peer_k)
    except BenchStopped as stop:
        result["stopped"] = True
        notes.append(f"stopped by {stop} after {time.perf_counter() - started:.0f} s: the rows of the cells "
                     "finished before it only (a cell is one workload at one batch size, every engine and "
                     "temperature); later cells, and the HF peers, were not run.")
    finally:
        bar.close()
    return result


class BenchStopped(Exception):
    """The run was asked to stop (SIGTERM, as ``timeout`` sends it): the cells finished so far are kept."""


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises :class:`BenchStopped` instead of ending the
    process, so a run cut by ``timeout`` still writes the rows it has (on the H100 a batch-1 grid given too little
    time by its script came back with nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise BenchStopped(signal.Signals(signum).name)

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _run_grid(s: Settings, run: dict[str, Any], tokenizer: Any, hf: Any, bar: Any, result: dict[str, Any],
              variants: list[Any], peer_k: int) -> None:
    """The batch sizes' cells, then the HF peers at batch 1, appending to ``result`` as each cell finishes."""
    from specdec import LLM

    methods, notes = run["methods"], result["notes"]
    ours: dict[str, dict[str, Any]] = {}
    batch1: list[Workload] = []
    for batch in s.batch:
        wls = build_workloads(tokenizer, s.workloads, s.prompts, batch, run["prompt_tokens"], s.seed)
        result["workloads"] += [{"workload": wl.name, "batch": batch, "requests": len(wl.prompts),
                                 "calls": len(wl.calls), "prompt_tokens": [len(p) for p in wl.prompts]}
                                for wl in wls]
        kw = _engine_kwargs(s, batch)
        llms = {"baseline": LLM(run["model"], None, **kw), **{m.name: LLM(run["model"], m.config, **kw)
                                                              for m in methods}}
        result["meta"]["cuda_graphs"] = getattr(llms["baseline"].target, "graphs", None) is not None
        warmed: set[float] = set()  # temperatures these engines have run at
        for wl in wls:
            rows, checks, base_out = bench_cell(llms, methods, wl, batch, s, hf, bar, warmed)
            result["rows"] += rows
            result["checks"] += [{"workload": wl.name, "batch": batch, "method": n, **c} for n, c in checks.items()]
            if batch == 1:
                greedy = next((r for r in rows if r["method"] == "baseline" and r["temperature"] == 0), None)
                ours[wl.name] = {"outputs": base_out, "tok_s": greedy["tok_s"] if greedy else None}
        batch1 = wls if batch == 1 else batch1
        del llms  # free the engines (and their KV caches) before the next batch size
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if variants:
        result["peers"], peer_notes = run_peers(s, hf, batch1, ours, peer_k, bar)
        notes += peer_notes
    elif s.peers:
        notes.append("HF peers: skipped, they run at batch 1 and --batch has no 1.")

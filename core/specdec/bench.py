"""End-to-end benchmark: every installed method against the baseline and Hugging Face peers, in one run.

Workloads come from held-out standard-library files (the split of :mod:`specdec.zoo`, so a bundled
model never trained on them), with a fixed seed and sizes:

- ``completion``: the first part of a file; the model continues it.
- ``edit``: a part of a file, then the same part again with a small change near the top, cut a few
  lines after the change; the model continues the second copy (grounded editing: prompt lookup).
- ``repeated``: the same prompt twice, then a near-duplicate, in successive ``generate()`` calls on
  the same engine (requests that resemble earlier ones: suffix decoding's global tree).

Per workload x batch size x temperature x method: tokens/s, speedup over the baseline (timed passes
interleaved with the baseline's, so machine noise hits both), mean acceptance length, per-position
acceptance, the draft and verify shares of a step (from a separate profiled pass: ``profile_steps``
synchronises the device after each forward, so no throughput is read from it), and the efficiency
``speedup / (acceptance length x T(1 token) / T(k+1 tokens))`` with both target forward times measured
in the same run. Before any timing, greedy outputs are checked against the baseline's: in float32 a
method whose output differs on any prompt gets no speedup reported (the row says REFUSED); in
bfloat16/float16 every divergence must sit at a near-tie of the baseline's logits (see ``tie_bound``).

    specdec bench                                    # small CPU version on the bundled models
    python benchmarks/e2e.py --batch 1 8 --prompts 8 # the full grid (see benchmarks/e2e.py)
"""

from __future__ import annotations

import argparse
import gc
import json
import keyword
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["Settings", "Workload", "build_workloads", "compare_greedy", "tie_bound", "run_benchmark",
           "markdown_report", "write_outputs", "add_arguments", "settings_from_args", "main"]

WORKLOADS = ("completion", "edit", "repeated")
DEFAULT_METHODS = ("ngram", "ngram_gpu", "suffix", "draft_model")  # copycat is a test fixture
# Method knobs used unless --method-option overrides them. n-grams of 2..5 tokens: code repeats
# short identifiers, so allowing 2-grams finds more of the copies than vLLM's default of 5..5.
# ngram num_threads=1: below 2^20 batch tokens the scan is single-threaded anyway, and asking for
# one thread also skips its parallel warm-up, whose OpenMP workers otherwise spin against torch's
# threads on a small CPU (measured: the whole process, baseline included, ran ~10x slower).
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 5, "num_threads": 1},
    "ngram_gpu": {"prompt_lookup_min": 2, "prompt_lookup_max": 5},
}
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")


# ---------------------------------------------------------------- settings


@dataclass(slots=True)
class Settings:
    """One benchmark run. ``methods`` entries are ``name`` or ``name:k``; ``tie_rel`` is the near-tie
    bound of the bfloat16 check (see :func:`tie_bound`)."""

    model: str | None = None
    draft_model: str | None = None
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    batch: list[int] = field(default_factory=lambda: [1, 8])
    temperature: list[float] = field(default_factory=lambda: [0.0, 0.8])
    k: int = 4
    prompts: int = 8
    prompt_tokens: int = 256
    max_tokens: int = 64
    repeats: int = 3
    peer_repeats: int = 1
    seed: int = 0
    dtype: str = "auto"
    device: str | None = None
    max_model_len: int | None = None
    cuda_graphs: bool | None = None
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    peers: bool = True
    plots: bool = True
    tie_rel: float = 0.05
    out: str = "benchmarks/results/e2e"
    name: str = "e2e"
    progress: bool = True
    threads: int | None = None
    timing_seconds: float = 0.3  # least wall time spent timing T(1) / T(k+1) per method and workload

    def __post_init__(self) -> None:
        for key in ("k", "prompts", "prompt_tokens", "max_tokens", "repeats", "peer_repeats"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} is invalid: it must be an int >= 1.")
        if not self.batch or any(b < 1 for b in self.batch):
            raise ValueError(f"batch={self.batch!r} is invalid: give batch sizes >= 1.")
        if not self.temperature or any(t < 0 for t in self.temperature):
            raise ValueError(f"temperature={self.temperature!r} is invalid: give temperatures >= 0 (0 = greedy).")
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if bad or not self.workloads:
            raise ValueError(f"workloads={self.workloads!r} is invalid: choose from {', '.join(WORKLOADS)}.")
        if not 0 < self.tie_rel < 1:
            raise ValueError(f"tie_rel={self.tie_rel!r} is invalid: it must be in (0, 1), e.g. 0.05.")


def parse_method(spec: str, default_k: int) -> tuple[str, int]:
    """``"ngram"`` -> ("ngram", default_k); ``"suffix:8"`` -> ("suffix", 8)."""
    name, _, k = spec.partition(":")
    if k and not k.isdigit():
        raise ValueError(f"method {spec!r} is invalid: write name or name:k with k an int >= 1, e.g. suffix:8.")
    return name, int(k) if k else default_k


# ---------------------------------------------------------------- workloads


@dataclass(slots=True)
class Workload:
    """Prompts (token ids) grouped into the ``generate()`` calls that carry them, in order."""

    name: str
    calls: list[list[list[int]]]

    @property
    def prompts(self) -> list[list[int]]:
        return [p for call in self.calls for p in call]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def line_chunks(tokenizer: Any, text: str, max_tokens: int) -> list[str]:
    """Consecutive whole-line chunks of ``text`` of at most ``max_tokens`` tokens and at least half
    that (shorter tails are dropped; a single over-long line is skipped)."""
    lines = text.splitlines(keepends=True)
    counts = [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]] if lines else []
    chunks, cur, n = [], [], 0
    for line, c in zip(lines, counts):
        if cur and n + c > max_tokens:
            chunks.append("".join(cur))
            cur, n = [], 0
        if c <= max_tokens:
            cur.append(line)
            n += c
    if cur:
        chunks.append("".join(cur))
    return [c for c in chunks if max_tokens // 2 <= len(_encode(tokenizer, c)) <= max_tokens]


def small_edit(text: str, rng: random.Random, top_lines: int = 8) -> tuple[str, int]:
    """``text`` with one identifier in its first ``top_lines`` lines renamed (``name`` ->
    ``name_v2``), or a comment line inserted where there is none; returns it and the changed line."""
    lines = text.splitlines(keepends=True)
    top = max(1, min(top_lines, len(lines) // 3))
    cands = [(i, m.end()) for i, line in enumerate(lines[:top]) for m in _IDENT.finditer(line)
             if not keyword.iskeyword(m.group())]
    if cands:
        i, end = rng.choice(cands)
        lines[i] = lines[i][:end] + "_v2" + lines[i][end:]
    else:
        i = rng.randrange(top)
        lines.insert(i, "# edited\n")
    return "".join(lines), i


def held_out_files() -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's held-out split (never trained on)."""
    from specdec.zoo import collect_files

    return collect_files(site_packages=False)["held-out"]


def build_workloads(tokenizer: Any, names: list[str], num_prompts: int, batch: int, prompt_tokens: int,
                    seed: int = 0, files: list[tuple[str, str]] | None = None) -> list[Workload]:
    """The workloads for one batch size: ``max(num_prompts, batch)`` requests each (``repeated``: three
    calls per group of ``batch`` base prompts: same, same, near-duplicate)."""
    files = held_out_files() if files is None else files
    chunked = [line_chunks(tokenizer, text, prompt_tokens) for _, text in sorted(files)]
    chunked = [c for c in chunked if len(c) >= 2]
    if not chunked:
        raise ValueError(f"no held-out file has two chunks of {prompt_tokens // 2}-{prompt_tokens} tokens; "
                         "lower --prompt-tokens.")
    random.Random(seed).shuffle(chunked)

    def chunk(i: int, first: int = 0) -> str:  # request i: file i mod F, its chunks from `first` on in turn
        chunks = chunked[i % len(chunked)][first:]
        return chunks[(i // len(chunked)) % len(chunks)]

    n = max(num_prompts, batch)
    out = []
    for name in names:
        rng = random.Random(f"{seed}:{name}")  # a workload's prompts do not depend on which others run
        if name == "completion":  # chunk 0 of each file first: a file's opening
            out.append(Workload(name, [[_encode(tokenizer, chunk(i)) for i in range(n)]]))
        elif name == "edit":
            prompts = []
            for i in range(n):
                text = chunk(i)
                edited, line = small_edit(text, rng)
                head = "".join(edited.splitlines(keepends=True)[: line + 3])
                # capped, so the prompt budget of run_benchmark (1.4 x prompt_tokens) always holds
                prompts.append(_encode(tokenizer, text + "\n" + head)[: int(1.35 * prompt_tokens)])
            out.append(Workload(name, [prompts]))
        else:  # other chunks than completion's; per group of `batch`: same, same, near-duplicate
            calls = []
            for g in range(-(-max(1, -(-num_prompts // 3)) // batch)):  # ceil(ceil(num_prompts / 3) / batch)
                texts = [chunk(j, first=1) for j in range(g * batch, (g + 1) * batch)]
                same = [_encode(tokenizer, t) for t in texts]
                calls += [same, [list(p) for p in same], [_encode(tokenizer, small_edit(t, rng)[0]) for t in texts]]
            out.append(Workload(name, calls))
    return out


# ---------------------------------------------------------------- running the engine


def _params(wl: Workload, temperature: float, max_tokens: int, seed: int) -> list[list[Any]]:
    from specdec import SamplingParams

    out, i = [], 0
    for call in wl.calls:
        row = []
        for _ in call:  # per-request seeds: the same stream for every method, reproducible runs
            row.append(SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                      seed=seed + i if temperature > 0 else None))
            i += 1
        out.append(row)
    return out


# Methods whose state is per request only (freed in remove_request): their proposer is kept between
# passes (a compiled ngram_gpu kernel or a loaded draft model stays warm). Any other method gets a
# fresh proposer before every pass.
PER_REQUEST_STATE = frozenset({"ngram", "ngram_gpu", "draft_model"})


def fresh_proposer(llm: Any) -> None:
    """Give ``llm`` a new proposer, so state a method keeps across requests (suffix decoding's global
    tree of earlier responses) never carries over from one timed pass to the next."""
    config = llm.speculative_config
    if config is not None and config.method not in PER_REQUEST_STATE:
        from specdec import create_proposer

        llm.proposer = create_proposer(llm.speculative_config, llm.target)


def run_pass(llm: Any, wl: Workload, temperature: float, max_tokens: int, seed: int
             ) -> tuple[list[list[int]], float, int]:
    """One pass over ``wl`` (a fresh proposer first): generated ids per prompt, the wall seconds and
    the number of decode steps summed over requests."""
    fresh_proposer(llm)
    outs = []
    start = time.perf_counter()
    for call, params in zip(wl.calls, _params(wl, temperature, max_tokens, seed)):
        outs += llm.generate(call, params)  # returns host lists: synchronised
    seconds = time.perf_counter() - start
    return [o.token_ids for o in outs], seconds, sum(o.metrics.num_steps for o in outs)


def profile_pass(llm: Any, wl: Workload, temperature: float, max_tokens: int, seed: int) -> dict[str, float]:
    """Per-step ms of propose / forward / sample / bookkeeping from one profiled pass."""
    llm.step_timer.enabled = True
    llm.step_timer.reset()
    try:
        run_pass(llm, wl, temperature, max_tokens, seed)
        return llm.step_timer.per_step_ms()
    finally:
        llm.step_timer.enabled = False


@torch.inference_mode()
def time_forwards(targets: list[Any], query_lens: list[int], batch: int, context: int, min_seconds: float = 0.3
                  ) -> list[float]:
    """Median ms of one forward of ``targets[i]`` over ``query_lens[i]`` tokens for each of ``batch``
    slots at ``context`` committed tokens (stale cache entries: the values do not matter, the shapes
    do). The targets take turns, so machine noise hits every measurement alike."""

    def once(target: Any, q: int) -> float:
        ctx = max(1, min(context, target.max_model_len - q))
        for s in range(batch):
            target.reset_slot(s)
            target.advance(s, ctx)
        start = time.perf_counter()
        target.forward(list(range(batch)), [[1] * q] * batch, [q] * batch)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        return time.perf_counter() - start

    pairs = list(zip(targets, query_lens))
    for _ in range(2):
        for target, q in pairs:
            once(target, q)
    times: list[list[float]] = [[] for _ in pairs]
    t0 = time.perf_counter()
    while len(times[0]) < 5 or (time.perf_counter() - t0 < min_seconds and len(times[0]) < 50):
        for i, (target, q) in enumerate(pairs):
            times[i].append(once(target, q))
    for target in targets:
        for s in range(batch):
            target.reset_slot(s)
    return [1000 * statistics.median(t) for t in times]


# ---------------------------------------------------------------- checks


def compare_greedy(base: list[list[int]], other: list[list[int]]) -> dict[str, Any]:
    """Prompts whose output equals the baseline's, the first divergent position of the others, and
    the token agreement (tokens before the first divergence / tokens generated)."""
    if len(base) != len(other):
        raise ValueError(f"{len(other)} outputs to compare with {len(base)} baseline outputs: expected equal counts.")
    diverged, agree, total = [], 0, 0
    for i, (b, o) in enumerate(zip(base, other)):
        j = next((j for j, (x, y) in enumerate(zip(b, o)) if x != y), min(len(b), len(o)))
        if b != o:
            diverged.append({"prompt": i, "position": j})
        agree += j
        total += max(len(b), len(o))
    return {"prompts": len(base), "identical": len(base) - len(diverged), "diverged": diverged,
            "token_agreement": agree / total if total else 1.0}


def tie_bound(top1_logit: float, rel: float) -> float:
    """Largest baseline logit gap that bfloat16 rounding may flip: ``rel x max(1, |top-1 logit|)``.

    A one-token step and a (k+1)-token verify pass round each layer's bfloat16 output differently
    (relative spacing 2^-8..2^-7), and the differences accumulate through the layers. Measured on the
    bundled tiny (4 layers, top-1 logits 8-21): two bfloat16 computation orders differ by <= 0.07 in
    any logit and bfloat16 differs from float32 by <= 0.11, so a gap between two logits moves by
    ~0.2 at most. ``rel=0.05`` (0.4-1.0 there) leaves room for a deeper model's larger accumulated
    error; every gap is kept in the JSON so the bound can be judged against the data (``--tie-rel``)."""
    return rel * max(1.0, abs(top1_logit))


@torch.inference_mode()
def divergence_margins(hf_model: Any, prompts: list[list[int]], base: list[list[int]], other: list[list[int]],
                       diverged: list[dict[str, Any]], rel: float) -> list[dict[str, Any]]:
    """For each divergence: a plain HF forward of prompt + baseline prefix, the baseline's top-2 logit
    margin there, the gap between its top-1 and the token the method chose, and whether that gap is
    within :func:`tie_bound`."""
    out = []
    device = next(hf_model.parameters()).device
    for d in diverged:
        i, j = d["prompt"], d["position"]
        if j >= min(len(base[i]), len(other[i])):
            out.append({**d, "near_tie": False, "note": "lengths differ"})
            continue
        ids = torch.tensor([prompts[i] + base[i][:j]], device=device)
        logits = hf_model(input_ids=ids).logits[0, -1].float()
        top = torch.topk(logits, 2)
        top1 = float(top.values[0])
        gap = top1 - float(logits[other[i][j]])
        bound = tie_bound(top1, rel)
        out.append({**d, "top2_margin": top1 - float(top.values[1]), "chosen_gap": gap, "bound": bound,
                    "near_tie": gap <= bound})
    return out


def check_method(base: list[list[int]], other: list[list[int]], prompts: list[list[int]], dtype: torch.dtype,
                 hf_model_fn: Any, rel: float) -> dict[str, Any]:
    """The greedy check of one method: float32 must match exactly (else ``refused``); lower precision
    must diverge only at near-ties (else ``suspect``)."""
    cmp = compare_greedy(base, other)
    exact = dtype == torch.float32
    result = {**cmp, "dtype": str(dtype).removeprefix("torch."), "refused": exact and bool(cmp["diverged"]),
              "suspect": False, "margins": []}
    if cmp["diverged"]:
        result["margins"] = divergence_margins(hf_model_fn(), prompts, base, other, cmp["diverged"], rel)
        result["suspect"] = not exact and not all(m["near_tie"] for m in result["margins"])
    return result


def check_label(check: dict[str, Any]) -> str:
    n, same = check["prompts"], check["identical"]
    if check["refused"]:
        return f"REFUSED: {n - same}/{n} differ in float32"
    if not check["diverged"]:
        return f"exact {same}/{n}"
    ties = sum(m["near_tie"] for m in check["margins"])
    label = f"agree {check['token_agreement']:.1%}, {ties}/{len(check['margins'])} div at near-ties"
    return label + (" (BUG?)" if check["suspect"] else "")


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
    methods, notes = [], []
    for spec in s.methods:
        name, k = parse_method(spec, s.k)
        if any(m.name == name for m in methods):
            raise ValueError(f"method {name!r} is given twice in {s.methods}: benchmark one k per method per run.")
        if name not in installed:
            notes.append(f"{name}: skipped, not installed (installed: {', '.join(sorted(installed))}).")
            continue
        config = {"method": name, "num_speculative_tokens": k, **METHOD_DEFAULTS.get(name, {}),
                  **s.method_options.get(name, {})}
        if name == "draft_model":
            if draft is None:
                notes.append("draft_model: skipped, no --draft-model given for a non-bundled --model.")
                continue
            config["model"] = draft
        methods.append(Method(name, k, config))
    return methods, notes


class _HF:
    """Hugging Face copies of the target and draft (same dtype and device), loaded on first use."""

    def __init__(self, model: str, draft: str | None, dtype: torch.dtype, device: torch.device) -> None:
        self.paths, self.dtype, self.device = {"target": model, "draft": draft}, dtype, device
        self.models: dict[str, Any] = {}

    def get(self, which: str = "target") -> Any:
        if which not in self.models:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.paths[which], dtype=self.dtype)
            self.models[which] = model.to(self.device).eval()
        return self.models[which]


def _engine_kwargs(s: Settings, batch: int) -> dict[str, Any]:
    return {"dtype": s.dtype, "device": s.device, "max_model_len": s.max_model_len, "max_num_seqs": batch,
            "cuda_graphs": s.cuda_graphs}


def _interleaved(llms: dict[str, Any], wl: Workload, temperature: float, s: Settings, bar: Any
                 ) -> tuple[dict[str, list[float]], dict[str, tuple[int, int]]]:
    """``repeats`` timed passes of every engine, the order rotating each round. Returns the seconds
    of each pass and (tokens, decode steps) summed over passes, per engine."""
    names = list(llms)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    counts = dict.fromkeys(names, (0, 0))
    for llm in llms.values():
        llm.stats.reset()
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
        stats = llm.stats
        predicted = stats.mean_acceptance_length * t1 / tk
        row.update(mean_acceptance_length=stats.mean_acceptance_length,
                   acceptance_rate_per_pos=stats.acceptance_rate_per_pos,
                   draft_acceptance_rate=stats.draft_acceptance_rate, t1_ms=t1, tk1_ms=tk,
                   predicted_speedup=predicted, efficiency=row["speedup"] / predicted)
    ms = profile_pass(llm, wl, temp, s.max_tokens, s.seed)
    step = sum(ms.values()) or 1.0
    row.update(step_ms=ms, draft_share=ms["propose"] / step, verify_share=(ms["forward"] + ms["sample"]) / step)
    return row


def bench_cell(llms: dict[str, Any], methods: list[Method], wl: Workload, batch: int, s: Settings, hf: _HF,
               bar: Any) -> tuple[list[dict[str, Any]], dict[str, Any], list[list[int]]]:
    """Every temperature of one workload at one batch size: the greedy check, T(1) and T(k+1), the
    interleaved timed passes and a profiled pass per engine. Returns rows, checks, baseline outputs."""
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
            t1[m.name], tk[m.name] = time_forwards([llms["baseline"].target, llms[m.name].target], [1, m.k + 1],
                                                   batch, context, s.timing_seconds)
    rows = []
    for temp in s.temperature:
        bar.set_postfix_str(f"{wl.name} b={batch} T={temp:g}")
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


# ---------------------------------------------------------------- Hugging Face peers


def _hf_generate(model: Any, prompt: list[int], max_tokens: int, **kw: Any) -> list[int]:
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    pad = model.generation_config.pad_token_id
    # eos_token_id=None: no early stop, so every peer generates exactly max_tokens (as ignore_eos does).
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0 if pad is None else pad, **kw)
    return out[0, len(prompt):].tolist()


def _peer_variants(s: Settings, hf: _HF, k: int) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    variants, notes = [("hf eager", {})], []
    if hf.device.type == "cuda":
        variants.append(("hf static", {"cache_implementation": "static"}))
    else:
        notes.append("hf static: skipped on CPU (cache_implementation='static' compiles and replays CUDA graphs; "
                     "it is a GPU peer).")
    variants.append((f"hf prompt_lookup k={k}", {"prompt_lookup_num_tokens": k}))
    if hf.paths["draft"] is not None:
        variants.append(("hf assistant", {"assistant_model": "draft"}))
    else:
        notes.append("hf assistant: skipped, no draft model.")
    return variants, notes


def run_peers(s: Settings, hf: _HF, workloads: list[Workload], ours: dict[str, dict[str, Any]], k: int,
              bar: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """HF ``generate()`` at batch 1, greedy, on the same prompts and token budget as our batch-1 runs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    variants, notes = _peer_variants(s, hf, k)
    rows = []
    for wl in workloads:
        prompts = wl.prompts
        for label, kw in variants:
            bar.set_postfix_str(f"{wl.name} {label}")
            kw = {**kw, "assistant_model": hf.get("draft")} if "assistant_model" in kw else kw
            model = hf.get()
            row = {"workload": wl.name, "peer": label, "requests": len(prompts)}
            try:
                # warm-up; the static cache keeps the longest length seen, so warm up on the longest prompt
                # first and every timed call reuses one cache shape (one compiled graph).
                order = sorted(prompts, key=len, reverse=True) if "cache_implementation" in kw else prompts[:1]
                for p in order:
                    _hf_generate(model, p, s.max_tokens, **kw)
                seconds, outs = [], []
                for _ in range(s.peer_repeats):
                    start = time.perf_counter()
                    outs = [_hf_generate(model, p, s.max_tokens, **kw) for p in prompts]
                    if hf.device.type == "cuda":
                        torch.cuda.synchronize(hf.device)
                    seconds.append(time.perf_counter() - start)
                    bar.update(1)
            except Exception as exc:  # a peer failing is a row, not an aborted benchmark
                rows.append({**row, "error": f"{type(exc).__name__}: {exc}"[:300]})
                bar.update(s.peer_repeats)
                continue
            tokens = sum(len(o) for o in outs) * s.peer_repeats
            base = ours.get(wl.name, {})
            matched = sum(o == b for o, b in zip(outs, base.get("outputs", [])))
            row.update(tok_s=tokens / sum(seconds), seconds=seconds, matched=matched,
                       full_length=all(len(o) == s.max_tokens for o in outs),
                       ours_over_peer=base["tok_s"] / (tokens / sum(seconds)) if base.get("tok_s") else None)
            rows.append(row)
    return rows, notes


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
            "model": run["model"], "draft_model": run["draft"], "dtype": str(run["dtype"]).removeprefix("torch."),
            "cuda_graphs": None, "max_model_len": run["max_model_len"], "prompt_tokens": run["prompt_tokens"],
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "settings": asdict(s)}


def _progress(s: Settings, methods: list[Method], peer_passes: int) -> Any:
    from tqdm.auto import tqdm

    n = 1 + len(methods)  # engines: baseline + methods; per cell a check pass, then repeats + 1 profiled
    total = len(s.batch) * len(s.workloads) * (n + len(s.temperature) * n * (s.repeats + 1)) + peer_passes
    return tqdm(total=total, desc="specdec bench", unit="pass", dynamic_ncols=True, disable=not s.progress)


def run_benchmark(s: Settings) -> dict[str, Any]:
    """Run the whole grid (and the peers at batch 1); returns the results as one JSON-able dict."""
    from transformers import AutoTokenizer

    from specdec import LLM

    if s.threads:
        torch.set_num_threads(s.threads)
    run = _prepare(s)
    methods, notes = run["methods"], run["notes"]
    tokenizer = AutoTokenizer.from_pretrained(run["model"])
    hf = _HF(run["model"], run["draft"], run["dtype"], run["device"])
    result: dict[str, Any] = {"meta": _meta(s, run), "workloads": [], "rows": [], "checks": [], "peers": [],
                              "notes": notes}
    peer_k = next((m.k for m in methods if m.name == "ngram"), s.k)
    variants = _peer_variants(s, hf, peer_k)[0] if s.peers and 1 in s.batch else []
    bar = _progress(s, methods, len(s.workloads) * len(variants) * s.peer_repeats)
    ours: dict[str, dict[str, Any]] = {}
    batch1: list[Workload] = []
    try:
        for batch in s.batch:
            wls = build_workloads(tokenizer, s.workloads, s.prompts, batch, run["prompt_tokens"], s.seed)
            result["workloads"] += [{"workload": wl.name, "batch": batch, "requests": len(wl.prompts),
                                     "calls": len(wl.calls), "prompt_tokens": [len(p) for p in wl.prompts]}
                                    for wl in wls]
            kw = _engine_kwargs(s, batch)
            llms = {"baseline": LLM(run["model"], None, **kw), **{m.name: LLM(run["model"], m.config, **kw)
                                                                  for m in methods}}
            result["meta"]["cuda_graphs"] = getattr(llms["baseline"].target, "graphs", None) is not None
            for wl in wls:
                rows, checks, base_out = bench_cell(llms, methods, wl, batch, s, hf, bar)
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
    finally:
        bar.close()
    return result


# ---------------------------------------------------------------- reports


def _f(x: Any, fmt: str = ".2f", none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown_report(result: dict[str, Any]) -> str:
    """The results as markdown: a header, the main table, the peers table and the notes."""
    meta = result["meta"]
    lines = [f"{meta['device']}; model `{meta['model']}` ({meta['dtype']}, CUDA graphs {meta['cuda_graphs']}); "
             f"draft `{meta['draft_model']}`; {meta['settings']['max_tokens']} new tokens per request, prompts of "
             f"<= {meta['prompt_tokens']} tokens; {meta['settings']['repeats']} interleaved timed passes; torch "
             f"{meta['torch']}, transformers {meta['transformers']}, {meta['torch_threads']} torch threads.",
             "", f"Command: `{meta['command']}`", "",
             "| workload | batch | T | method | k | tok/s | speedup | accept len | accept/pos | tok/step | draft % "
             "| verify % | T(k+1)/T(1) | efficiency | greedy check |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        head = f"| {r['workload']} | {r['batch']} | {r['temperature']:g} | {r['method']} | {r['k'] or '-'} |"
        if r.get("refused"):
            lines.append(f"{head} REFUSED | REFUSED | - | - | - | - | - | - | - | {r['check']} |")
            continue
        per_pos = "/".join(f"{a:.2f}" for a in r.get("acceptance_rate_per_pos", [])) or "-"
        ratio = r["tk1_ms"] / r["t1_ms"] if r.get("tk1_ms") else None
        speed = f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        lines.append(f"{head} {r['tok_s']:.1f} | {speed} | {_f(r.get('mean_acceptance_length'))} | {per_pos} | "
                     f"{r['tokens_per_step']:.2f} | {r['draft_share']:.0%} | {r['verify_share']:.0%} | {_f(ratio)} | "
                     f"{_f(r.get('efficiency'))} | {r['check']} |")
    if result["peers"]:
        lines += ["", "Hugging Face `generate()` at batch 1, greedy, same prompts and token budget (EOS off):", "",
                  "| workload | peer | tok/s | our baseline / peer | output = our baseline | note |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for p in result["peers"]:
            if "error" in p:
                lines.append(f"| {p['workload']} | {p['peer']} | - | - | - | {p['error']} |")
                continue
            note = "" if p["full_length"] else "stopped before max_tokens"
            lines.append(f"| {p['workload']} | {p['peer']} | {p['tok_s']:.1f} | {_f(p['ours_over_peer'])}x | "
                         f"{p['matched']}/{p['requests']} | {note} |")
    lines += ["", "tok/s and speedup come from un-profiled passes (speedup: total baseline time / total method "
              "time; min-max over passes in brackets); draft % and verify % (target forward + sampling) come from "
              "one separate profiled pass, which synchronises the device per step. accept len = 1 + accepted / "
              "drafts, over steps that drafted; tok/step = tokens per decode step over all steps (steps where a "
              "method found nothing to draft make it lower). efficiency = speedup / (accept len x T(1)/T(k+1)), "
              "T = median target forward time at that batch, measured in this run. "
              "greedy check: each method's greedy outputs against the baseline's on every prompt of that workload "
              "and batch, before timing; rows at T > 0 show the same check (float32: exact, or REFUSED and not "
              f"timed; lower precision: token agreement, and whether each divergence is at a near-tie: baseline "
              f"top-1 logit minus the chosen token's logit <= {result['meta']['settings']['tie_rel']:g} x "
              "max(1, |top-1 logit|) in a plain HF forward of the baseline's prefix)."]
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _plot_speedup(plt: Any, rows: list[dict[str, Any]], methods: list[str], workloads: list[str], path: str) -> None:
    cells = sorted({(r["batch"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.5 * len(cells), 3.6), squeeze=False)
    width = 0.8 / len(methods)
    labeled: set[str] = set()
    for ax, (batch, temp) in zip(axes[0], cells):
        for j, m in enumerate(methods):
            for i, w in enumerate(workloads):
                r = next((r for r in rows if (r["workload"], r["method"], r["batch"], r["temperature"])
                          == (w, m, batch, temp)), None)
                x = i + j * width
                if r is None or r.get("refused"):
                    ax.text(x, 0.05, "refused" if r else "-", rotation=90, ha="center", va="bottom", fontsize=7)
                    continue
                err = [[r["speedup"] - r["speedup_min"]], [r["speedup_max"] - r["speedup"]]]
                ax.bar(x, r["speedup"], width, yerr=err, capsize=2, color=f"C{j}", label=None if m in labeled else m)
                labeled.add(m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
        ax.set_title(f"batch {batch}, T={temp:g}")
        ax.set_ylabel("speedup over baseline")
    fig.legend(loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_acceptance(plt: Any, rows: list[dict[str, Any]], methods: list[str], workloads: list[str],
                     path: str) -> None:
    batch = min(r["batch"] for r in rows)
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for r in rows:
            rates = r.get("acceptance_rate_per_pos")
            if r["workload"] == w and r["batch"] == batch and rates:
                ax.plot(range(1, len(rates) + 1), rates, marker="o", color=f"C{methods.index(r['method'])}",
                        linestyle=("-", "--", ":", "-.")[temps.index(r["temperature"]) % 4],
                        label=f"{r['method']} T={r['temperature']:g}")
        ax.set_title(f"{w} (batch {batch})")
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(result: dict[str, Any], out: Path, stem: str) -> list[str]:
    """Speedup per method and workload (bars, min-max over passes), acceptance rate per position
    (lines). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["method"] != "baseline"]
    if not rows:
        return []
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    files = [str(out / f"{stem}_speedup.png"), str(out / f"{stem}_acceptance.png")]
    _plot_speedup(plt, rows, methods, workloads, files[0])
    _plot_acceptance(plt, rows, methods, workloads, files[1])
    return files


def write_outputs(result: dict[str, Any], out: str | Path, stem: str, plots: bool = True) -> dict[str, str]:
    """``<stem>.json``, ``<stem>.md`` and the PNG plots under ``out`` (plots skipped, with a note, when
    matplotlib is missing). Returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    if plots:
        try:
            files = write_plots(result, out, stem)
            paths.update({Path(f).stem.rsplit("_", 1)[-1]: f for f in files})
        except ImportError:
            result["notes"].append("plots: skipped, matplotlib is not installed (pip install 'specdec-core[bench]').")
    paths["markdown"] = str(out / f"{stem}.md")
    Path(paths["markdown"]).write_text(markdown_report(result))
    paths["json"] = str(out / f"{stem}.json")
    Path(paths["json"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return paths


# ---------------------------------------------------------------- command line


def _method_option(text: str) -> tuple[str, str, Any]:
    key, sep, raw = text.partition("=")
    method, dot, opt = key.partition(".")
    if not sep or not dot:
        raise argparse.ArgumentTypeError(f"--method-option {text!r} must look like method.key=value, "
                                         "e.g. ngram.prompt_lookup_min=3")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return method.strip(), opt.strip(), value


def add_arguments(parser: argparse.ArgumentParser, small: bool = False) -> None:
    """The benchmark's flags; ``small`` gives the defaults of ``specdec bench`` (a CPU run of minutes)."""
    d = Settings()
    default_out = os.environ.get("OUT") or d.out
    parser.add_argument("--model", help="target model directory (default: the bundled 'tiny')")
    parser.add_argument("--draft-model", help="draft for draft_model and HF assisted generation "
                        "(default: the bundled 'tiny-draft' when --model is not given)")
    parser.add_argument("--methods", nargs="+", default=["ngram", "suffix", "draft_model"] if small else d.methods,
                        help="methods, each name or name:k (default: the installed ones of %(default)s)")
    parser.add_argument("-k", type=int, default=d.k, help="drafts per step for methods given without :k")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=d.workloads)
    parser.add_argument("--batch", type=int, nargs="+", default=[1] if small else d.batch)
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0] if small else d.temperature)
    parser.add_argument("--prompts", type=int, default=3 if small else d.prompts,
                        help="requests per workload (at least the batch size)")
    parser.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="longest prompt chunk")
    parser.add_argument("--max-tokens", type=int, default=48 if small else d.max_tokens, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=2 if small else d.repeats, help="timed passes per engine")
    parser.add_argument("--peer-repeats", type=int, default=d.peer_repeats, help="timed passes per HF peer")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--dtype", default=d.dtype, help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: CUDA when available)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="eager target forwards on CUDA")
    parser.add_argument("--method-option", action="append", type=_method_option, default=[],
                        metavar="METHOD.KEY=VALUE", help="a method option, repeatable")
    parser.add_argument("--tie-rel", type=float, default=d.tie_rel, help="bfloat16 near-tie bound, relative")
    parser.add_argument("--no-peers", action="store_true", help="skip the Hugging Face generate() rows")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", default=default_out, help="output folder (default: $OUT or %(default)s)")
    parser.add_argument("--name", default="bench" if small else d.name, help="output file stem")
    parser.add_argument("--threads", type=int, default=1 if small else None,
                        help="torch CPU threads (default: %(default)s; None leaves torch's choice)")
    parser.add_argument("--no-progress", action="store_true")


def settings_from_args(args: argparse.Namespace) -> Settings:
    options: dict[str, dict[str, Any]] = {}
    for method, key, value in args.method_option:
        options.setdefault(method, {})[key] = value
    return Settings(model=args.model, draft_model=args.draft_model, methods=args.methods, workloads=args.workloads,
                    batch=args.batch, temperature=args.temperature, k=args.k, prompts=args.prompts,
                    prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, repeats=args.repeats,
                    peer_repeats=args.peer_repeats,
                    seed=args.seed, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                    cuda_graphs=False if args.no_cuda_graphs else None, method_options=options,
                    peers=not args.no_peers, plots=not args.no_plots, tie_rel=args.tie_rel, out=args.out,
                    name=args.name, progress=not args.no_progress, threads=args.threads)


def main(argv: list[str] | None = None, small: bool = False) -> int:
    """Run from parsed command-line flags; prints the markdown report and the files written."""
    parser = argparse.ArgumentParser(prog="specdec bench" if small else "e2e.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser, small)
    s = settings_from_args(parser.parse_args(argv))
    result = run_benchmark(s)
    paths = write_outputs(result, s.out, s.name, s.plots)
    print(markdown_report(result))
    print("wrote " + ", ".join(paths.values()))
    return 0

"""Running the engine: one (profiled) pass over a workload, and timed target forwards."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

from specdec_tools.bench.workloads import Workload

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


def fresh_proposer(llm: Any) -> None:
    """Give ``llm`` a new proposer, so state a method keeps across requests (suffix decoding's global
    tree of earlier responses) never carries over from one timed pass to the next. A proposer whose
    class sets ``per_request_state`` is kept (a compiled kernel or a loaded draft model stays warm)."""
    config = llm.speculative_config
    if config is not None and not type(llm.proposer).per_request_state:
        from specdec import create_proposer

        llm.proposer = create_proposer(llm.speculative_config, llm.target)


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    """Python's garbage collector off for the block, after a full collection (as ``timeit`` times): a full
    collection walks every engine of the process (a benchmark's several; a user's process holds one), 35-190 ms
    on the CPU with three engines alive, and where it falls is luck (and a step time the policy learns)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_pass(llm: Any, wl: Workload, temperature: float, max_tokens: int, seed: int
             ) -> tuple[list[list[int]], float, int]:
    """One pass over ``wl`` (a fresh proposer first): generated ids per prompt, the wall seconds and
    the number of decode steps summed over requests."""
    fresh_proposer(llm)
    outs = []
    with gc_off():
        start = time.perf_counter()
        for call, params in zip(wl.calls, _params(wl, temperature, max_tokens, seed)):
            outs += llm.generate(call, params)  # returns host lists: synchronised
        seconds = time.perf_counter() - start
    return [o.token_ids for o in outs], seconds, sum(o.metrics.num_steps for o in outs)


def profile_pass(llm: Any, wl: Workload, temperature: float, max_tokens: int, seed: int
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """From one profiled pass: per-step ms of propose / forward / sample / bookkeeping, and the pass's
    ``prefill_share`` (prefill time over prefill + decode-step time), ``prefills`` (forwards) and
    ``mean_batch`` (running requests per decode step)."""
    timer = llm.step_timer
    timer.enabled = True
    timer.reset()
    try:
        run_pass(llm, wl, temperature, max_tokens, seed)
        decode = sum(timer.totals.values())
        extra = {"prefill_share": timer.prefill_seconds / max(timer.prefill_seconds + decode, 1e-12),
                 "prefills": timer.prefills, "mean_batch": timer.rows / max(timer.steps, 1)}
        return timer.per_step_ms(), extra
    finally:
        timer.enabled = False


@torch.inference_mode()
def time_forwards(targets: list[Any], query_lens: list[int], batch: int, context: int, min_seconds: float = 0.3,
                  hidden: list[Any] | None = None) -> list[float]:
    """Median ms of one forward of ``targets[i]`` over ``query_lens[i]`` tokens for each of ``batch``
    slots at ``context`` committed tokens (stale cache entries: the values do not matter, the shapes
    do), asking for the hidden states ``hidden[i]`` (a HiddenStateRequest or None, as the engine
    asks: its CUDA graphs are captured for that request). The targets take turns, so machine noise
    hits every measurement alike."""
    requests = hidden or [None] * len(targets)

    def once(target: Any, q: int, request: Any) -> float:
        ctx = max(1, min(context, target.max_model_len - q))
        for s in range(batch):
            target.reset_slot(s)
            target.advance(s, ctx)
        start = time.perf_counter()
        target.forward(list(range(batch)), [[1] * q] * batch, [q] * batch, hidden=request)
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        return time.perf_counter() - start

    pairs = list(zip(targets, query_lens, requests))
    for _ in range(2):
        for target, q, request in pairs:
            once(target, q, request)
    times: list[list[float]] = [[] for _ in pairs]
    t0 = time.perf_counter()
    while len(times[0]) < 5 or (time.perf_counter() - t0 < min_seconds and len(times[0]) < 50):
        for i, (target, q, request) in enumerate(pairs):
            times[i].append(once(target, q, request))
    for target in targets:
        for s in range(batch):
            target.reset_slot(s)
    return [1000 * statistics.median(t) for t in times]

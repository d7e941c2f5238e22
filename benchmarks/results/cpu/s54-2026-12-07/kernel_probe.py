"""s54: what a drafting step's per-request loop of ``SpeculationPolicy.observe`` would cost inside a running engine as
one compiled call over arrays indexed by the engine's slot, against the Python loop it would replace (a prototype
for sizing, not the policy: the kernel below does the loop's arithmetic on arrays, with the same updates per request
and position, and is not checked against the policy's values).

ngram:4 on the bundled tiny model as ``policy_parts.py`` runs it (auto's rule forced to draft); after each observe of
a full batch, the step's outcome (slots, drafts asked, drafts made, accepted) goes to the kernel, timed with its
conversion from the engine's lists; then the same kernel calls replayed in a loop.

    python benchmarks/results/cpu/s54-2026-12-07/kernel_probe.py --batch 8 32
    python benchmarks/results/cpu/s54-2026-12-07/kernel_probe.py --dispatch

``--dispatch``: a numba call's own cost by its number of arguments (15 arrays and a scalar, as ``observe_rows``
takes, against 4), in a loop and with the caches flushed before each call (a 24 MB array summed and 40k dicts read).
"""
import argparse
import statistics
import time

import numpy as np
import torch
from numba import njit

import specdec.policy as P
from specdec import LLM, SamplingParams, bundled_model
from specdec_tools.bench import build_workloads

ALPHA, ALPHA_GLOBAL, RECOVER, KEEP = P.ALPHA, P.ALPHA_GLOBAL, P.RECOVER, P._KEEP


@njit(cache=True, nogil=True)
def observe_rows(slots, want, made, ok, kind, step, acc, made_est, end, lag, found, prior, made_glob, found_after,
                 gains):
    """One drafting step's outcome, request by request (the loop of ``observe``), on slot-indexed arrays."""
    k = acc.shape[1]
    drafted = 0
    for j in range(slots.shape[0]):
        s, kd = slots[j], kind[j]
        if not want[j]:
            g = 0.0
            p = 1.0
            for i in range(k):
                acc[s, i] += RECOVER * (prior[kd, i] - acc[s, i])
                p *= acc[s, i]
                g += p
            made_est[s] += RECOVER * (made_glob[kd] - made_est[s])
            gains[s] = made_est[s] * g
            continue
        drafted += 1
        a = ok[j]
        end[s, 0] = KEEP * end[s, 0] + 1.0
        end[s, 1] = KEEP * end[s, 1] + a
        end[s, 2] = KEEP * end[s, 2] + a * a
        lag[s, 0] = KEEP * lag[s, 0] + 1.0
        lag[s, 1] = KEEP * lag[s, 1] + a * lag[s, 2]
        lag[s, 2] = a
        got = 1.0 if made[j] > 0 else 0.0
        made_est[s] += ALPHA * (got - made_est[s])
        if found[s, 1] == step - 1:
            f = found[s, 0]
            found_after[kd, f] += ALPHA_GLOBAL * (got - found_after[kd, f])
        found[s, 0] = 1 if got > 0 else 0
        found[s, 1] = step
        made_glob[kd] += ALPHA_GLOBAL * (got - made_glob[kd])
        g = 0.0
        p = 1.0
        for i in range(k):
            if i < a + 1 and i < made[j]:
                hit = 1.0 if i < a else 0.0
                acc[s, i] += ALPHA * (hit - acc[s, i])
                prior[kd, i] += ALPHA_GLOBAL * (hit - prior[kd, i])
            p *= acc[s, i]
            g += p
        gains[s] = made_est[s] * g
    return drafted


def measure(batch: int, device: str) -> None:
    def _always(b):
        b.exploring = False
        b.decided, b.winner = True, 1
        return True

    P.SpeculationPolicy._decide = staticmethod(_always)
    llm = LLM(bundled_model("tiny"), {"method": "ngram", "num_speculative_tokens": 4}, device=device,
              max_num_seqs=batch)
    k = llm.num_speculative_tokens
    calls = build_workloads(llm.tokenizer, ["completion"], 2 * batch, batch, 256)[0].calls
    params = [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in range(2 * batch)]
    S = batch
    state = dict(acc=np.full((S, k), 0.6), made_est=np.ones(S), end=np.zeros((S, 3)), lag=np.zeros((S, 3)),
                 found=np.full((S, 2), -9, dtype=np.int64), prior=np.full((2, k), 0.6), made_glob=np.ones(2),
                 found_after=np.ones((2, 2)), gains=np.zeros(S))
    pol = llm.policy
    observe = pol.observe
    slot_of = {}
    engine_py, engine_convert, engine_kernel, replay = [], [], [], []

    def logged(ids, drafted, accepted, seconds, **kw):
        t0 = time.perf_counter()
        out = observe(ids, drafted, accepted, seconds, **kw)
        t1 = time.perf_counter()
        if len(ids) == batch and any(drafted):
            for r in ids:
                slot_of.setdefault(r, len(slot_of) % S)
            t2 = time.perf_counter()
            args = (np.array([slot_of[r] for r in ids], dtype=np.int64),
                    np.array([pol._planned.get(r, 0) for r in ids], dtype=np.int64),
                    np.array(drafted, dtype=np.int64), np.array(accepted, dtype=np.int64),
                    np.zeros(len(ids), dtype=np.int64), pol._steps)
            t3 = time.perf_counter()
            observe_rows(*args, **state)
            t4 = time.perf_counter()
            engine_py.append(t1 - t0)
            engine_convert.append(t3 - t2)
            engine_kernel.append(t4 - t3)
            replay.append(args)
        return out

    def one():
        i = 0
        for c in calls:
            llm.generate(c, params[i:i + len(c)])
            i += len(c)

    one()
    pol.observe = logged
    one()
    for _ in range(3):
        for args in replay:
            observe_rows(*args, **state)
    hot = []
    for args in replay:
        t0 = time.perf_counter()
        observe_rows(*args, **state)
        hot.append(time.perf_counter() - t0)
    print(f"| {batch} | {statistics.median(engine_py) * 1e6:.1f} | {statistics.median(engine_convert) * 1e6:.1f} | "
          f"{statistics.median(engine_kernel) * 1e6:.1f} | "
          f"{statistics.median(hot) * 1e6:.1f} | {len(engine_py)} |")


@njit(nogil=True)
def _sixteen(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q):
    return a.shape[0]


@njit(nogil=True)
def _four(rows, step, fs, ints):
    return rows.shape[1]


def dispatch() -> None:
    arrays = [np.zeros(8) for _ in range(15)]
    rows, fs, ints = np.zeros((4, 32), dtype=np.int64), np.zeros(1000), np.zeros(100, dtype=np.int64)
    junk, big = [dict(a=i) for i in range(200000)], np.ones(3_000_000)

    def flush() -> None:
        big.sum()
        sum(d["a"] for d in junk[::5])

    for name, call in (("16 arguments", lambda: _sixteen(*arrays[:5], 3, *arrays[5:])),
                       ("4 arguments", lambda: _four(rows, 3, fs, ints))):
        call()
        hot, cold = [], []
        for _ in range(200):
            t0 = time.perf_counter()
            call()
            hot.append(time.perf_counter() - t0)
        for _ in range(50):
            flush()
            t0 = time.perf_counter()
            call()
            cold.append(time.perf_counter() - t0)
        print(f"{name}: in a loop {statistics.median(hot) * 1e6:.2f} us, caches flushed "
              f"{statistics.median(cold) * 1e6:.2f} us")


ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
ap.add_argument("--device", default="cpu")
ap.add_argument("--dispatch", action="store_true", help="a numba call's own cost by its number of arguments")
cli = ap.parse_args()
torch.set_num_threads(1)
if cli.dispatch:
    dispatch()
    raise SystemExit
print("| batch | observe in the engine, us | the step's lists to arrays, us | kernel call in the engine, us | "
      "kernel call in a loop, us | steps |")
print("| --- | --- | --- | --- | --- | --- |")
for b in cli.batch:
    measure(b, cli.device)

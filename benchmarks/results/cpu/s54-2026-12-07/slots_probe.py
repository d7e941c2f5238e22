"""s54: observe's per-request loop (a drafting step, batch 32, k = 4) as the policy keeps its estimates, in eight dicts
keyed by request, against the same arithmetic on one object with slots a request; each call timed after the caches
were flushed (a 24 MB array summed and 20k dicts read), the mean of 2000 calls.

    python benchmarks/results/cpu/s54-2026-12-07/slots_probe.py
"""
import random
import time

import numpy as np

ALPHA, AG, KEEP, K = 0.3, 0.05, 1.0 - 1.0 / 32, 4
ids = [f"req-{i}-abcdef" for i in range(32)]
rng = random.Random(0)
outcomes = [[rng.choice((0, 1, 2, 3, 4)) for _ in ids] for _ in range(64)]
acc_of = {r: [0.5] * K for r in ids}
made_of = {r: 1.0 for r in ids}
end, lags, found_last, sampled_of, gains = {}, {}, {}, {}, {}
glob, made_glob, found_after = {False: [0.5] * K}, {False: 1.0}, {False: [1.0, 1.0]}


def dict_loop(step: int, accepted: list[int]) -> None:
    for r, ok in zip(ids, accepted):
        kind = sampled_of.get(r, False)
        prior, made_prior = glob[kind], made_glob[kind]
        acc = acc_of.get(r)
        st = end.get(r)
        end[r] = ((1.0, 0.0 + ok, 0.0 + ok * ok) if st is None
                  else (KEEP * st[0] + 1.0, KEEP * st[1] + ok, KEEP * st[2] + ok * ok))
        lag = lags.get(r)
        lags[r] = (0.0, 0.0, ok) if lag is None else (KEEP * lag[0] + 1.0, KEEP * lag[1] + ok * lag[2], ok)
        got = 1.0
        m = made_of.get(r, made_prior)
        m = made_of[r] = m + ALPHA * (got - m)
        last = found_last.get(r)
        if last is not None and last[1] == step - 1:
            after = found_after[kind]
            after[last[0]] += AG * (got - after[last[0]])
        found_last[r] = (int(got), step)
        made_glob[kind] += AG * (got - made_prior)
        gain, p = 0.0, 1.0
        for i in range(K):
            a = acc[i]
            if i < ok + 1:
                hit = 1.0 if i < ok else 0.0
                a = acc[i] = a + ALPHA * (hit - a)
                prior[i] += AG * (hit - prior[i])
            p *= a
            gain += p
        gains[r] = m * gain


class Req:
    __slots__ = ("acc", "made", "en", "es", "eq", "ln", "ls", "lo", "fg", "fs", "sampled", "gain")

    def __init__(self) -> None:
        self.acc, self.made, self.en, self.es, self.eq = [0.5] * K, 1.0, None, 0.0, 0.0
        self.ln = self.ls = self.lo = 0.0
        self.fg, self.fs, self.sampled, self.gain = 0, -9, False, 0.0


state = {r: Req() for r in ids}


def slots_loop(step: int, accepted: list[int]) -> None:
    for r, ok in zip(ids, accepted):
        s = state[r]
        kind = s.sampled
        prior, made_prior = glob[kind], made_glob[kind]
        acc = s.acc
        if s.en is None:
            s.en, s.es, s.eq, s.ln, s.ls, s.lo = 1.0, 0.0 + ok, 0.0 + ok * ok, 0.0, 0.0, ok
        else:
            s.en, s.es, s.eq = KEEP * s.en + 1.0, KEEP * s.es + ok, KEEP * s.eq + ok * ok
            s.ln, s.ls, s.lo = KEEP * s.ln + 1.0, KEEP * s.ls + ok * s.lo, ok
        got = 1.0
        m = s.made = s.made + ALPHA * (got - s.made)
        if s.fs == step - 1:
            after = found_after[kind]
            after[s.fg] += AG * (got - after[s.fg])
        s.fg, s.fs = 1, step
        made_glob[kind] += AG * (got - made_prior)
        gain, p = 0.0, 1.0
        for i in range(K):
            a = acc[i]
            if i < ok + 1:
                hit = 1.0 if i < ok else 0.0
                a = acc[i] = a + ALPHA * (hit - a)
                prior[i] += AG * (hit - prior[i])
            p *= a
            gain += p
        s.gain = m * gain


big = np.ones(3_000_000)
junk = [dict(a=i, b=[i]) for i in range(100000)]


def flush() -> None:
    big.sum()
    sum(d["a"] for d in junk[::5])


for f in (dict_loop, slots_loop, dict_loop, slots_loop):
    total = 0.0
    for step in range(2000):
        flush()
        t0 = time.perf_counter()
        f(step, outcomes[step % 64])
        total += time.perf_counter() - t0
    print(f"{f.__name__}: {total / 2000 * 1e6:.1f} us a call, caches flushed")

"""s54: the auto policy's host time inside a running engine against the same calls replayed in a tight loop.

``benchmarks/policy_host.py`` times ``plan`` + ``observe`` in a loop of their own, where every object they touch stays
in the CPU's caches. In an engine the model's forward and the engine's own Python run between two policy calls. This
runs ngram:4 on the bundled tiny model (e2e's completion prompts, T = 0, auto's rule forced to draft as in
``../s53-2026-12-07/draft_host.py --always``), times each ``plan`` and ``observe`` of a full batch in the engine, splits
``observe`` of a drafting step into its parts (the bucket's bookkeeping before the per-request loop, the catch-up of
pending drift, the loop over the requests) with timers added to a copy of its source, records every call, and
replays the recorded calls on a fresh policy in a loop (hot caches).

    python benchmarks/results/cpu/s54-2026-12-07/policy_parts.py --batch 8 32
    python benchmarks/results/cpu/s54-2026-12-07/policy_parts.py --batch 8 32 --plain-wins

``--plain-wins``: the rule runs (not forced), every drafting step's time tripled as the policy sees it, so that plain
wins and its plain run's fast paths are taken; the plain steps ("slower") of a full batch are timed (the parts'
columns are a drafting step's: 0 here).
"""
import argparse
import copy
import inspect
import statistics
import time

import torch

import specdec.policy as P
from specdec import LLM, SamplingParams, bundled_model
from specdec_tools.bench import build_workloads

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
ap.add_argument("--device", default="cpu")
ap.add_argument("--plain-wins", action="store_true",
                help="let the rule run, with every drafting step's time tripled as the policy sees it, so that plain "
                     "wins and its run's fast paths are taken; time the plain steps (reason 'slower') of a full batch")
args = ap.parse_args()
torch.set_num_threads(1)


def _always(b):
    b.exploring = False
    b.decided, b.winner = True, 1
    return True


if not args.plain_wins:
    P.SpeculationPolicy._decide = staticmethod(_always)

# observe with checkpoints: compiled from its own source in the policy module's namespace
src = inspect.getsource(P.SpeculationPolicy.observe)  # (a method: indented as in its class)
FIRST = "        self._gains.clear()\n        self._gains_kept = False\n        b = self._planned_bucket"
marks = [(FIRST, "        _T = [_pc()]\n" + FIRST),
         ("        acc_of, made_of, sampled_of, drift = self._acc",
          "        _T.append(_pc())\n        acc_of, made_of, sampled_of, drift = self._acc"),
         ("        step, k, rows_drafted = self._steps, self.k, 0",
          "        _T.append(_pc())\n        step, k, rows_drafted = self._steps, self.k, 0"),
         ("        self._gains_kept = self._fast\n",
          "        self._gains_kept = self._fast\n        _PARTS.append((len(req_ids), _T + [_pc()]))\n")]
for old, new in marks:
    if old not in src:
        raise SystemExit(f"observe's source changed: {old.strip()[:60]!r} not found")
    src = src.replace(old, new, 1)
ns = dict(vars(P), _pc=time.perf_counter, _PARTS=[])
exec("class _Timed:\n" + src, ns)
timed_observe = ns["_Timed"].observe
PARTS = ns["_PARTS"]


def measure(B: int) -> None:
    """One batch size: the engine's timings, then the replayed ones (a table row each)."""
    llm = LLM(bundled_model("tiny"), {"method": "ngram", "num_speculative_tokens": 4}, device=args.device,
              max_num_seqs=B)
    calls = build_workloads(llm.tokenizer, ["completion"], 2 * B, B, 256)[0].calls
    params = [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in range(2 * B)]
    pol = llm.policy
    rec, times = [], {"p": [], "o": []}
    plan, forget = pol.plan, pol.forget

    timing = [False]  # the first pass is recorded (the replay starts where the engine did), not timed

    def counted(ids) -> bool:  # a full batch's step of the kind this run times, in the timed pass
        return timing[0] and len(ids) == B and (pol.plain_reason == "slower") == args.plain_wins

    def logged_plan(ids, sampled=False, remaining=None):
        rec.append(("p", (list(ids), sampled, None if remaining is None else list(remaining)), {}))
        t0 = time.perf_counter()
        out = plan(ids, sampled, remaining)
        if counted(ids):
            times["p"].append(time.perf_counter() - t0)
        return out

    def logged_observe(ids, drafted, accepted, seconds, **kw):
        if args.plain_wins and any(drafted):
            seconds *= 3.0
        rec.append(("o", copy.deepcopy((ids, drafted, accepted, seconds)), dict(kw)))
        t0 = time.perf_counter()
        out = timed_observe(pol, ids, drafted, accepted, seconds, **kw)
        if counted(ids):
            times["o"].append(time.perf_counter() - t0)
        return out

    def logged_forget(r):
        rec.append(("f", (r,), {}))
        return forget(r)

    def one():
        i = 0
        for c in calls:
            llm.generate(c, params[i:i + len(c)])
            i += len(c)

    pol.plan, pol.observe, pol.forget = logged_plan, logged_observe, logged_forget
    one()
    PARTS.clear()
    timing[0] = True
    first = len(rec)  # the timed pass's calls start here
    one()
    parts = [t for n, t in PARTS if n == B] or [[0.0] * 4]
    med = [statistics.median(t[i + 1] - t[i] for t in parts) * 1e6 for i in range(3)]
    print(f"| {B} | engine | {statistics.median(times['p']) * 1e6:.1f} | {statistics.median(times['o']) * 1e6:.1f} | "
          + " | ".join(f"{m:.1f}" for m in med) + " |")
    for _ in range(3):  # the same calls on a fresh policy, in a loop
        q = P.SpeculationPolicy(k=4)
        hot = {"p": [], "o": []}
        PARTS.clear()
        for n, (kind, a, kw) in enumerate(rec):
            if n == first:
                PARTS.clear()
            if kind == "f":
                q.forget(*a)
                continue
            t0 = time.perf_counter()
            if kind == "p":
                q.plan(*a, **kw)
            else:
                timed_observe(q, *a, **kw)
            if n >= first and len(a[0]) == B and (q.plain_reason == "slower") == args.plain_wins:
                hot[kind].append(time.perf_counter() - t0)
    parts = [t for n, t in PARTS if n == B] or [[0.0] * 4]
    med = [statistics.median(t[i + 1] - t[i] for t in parts) * 1e6 for i in range(3)]
    print(f"| {B} | replayed in a loop | {statistics.median(hot['p']) * 1e6:.1f} | "
          f"{statistics.median(hot['o']) * 1e6:.1f} | " + " | ".join(f"{m:.1f}" for m in med) + " |")


print("| batch | where | plan us | observe us | observe: bookkeeping | catch-up | per-request loop |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for B in args.batch:
    measure(B)

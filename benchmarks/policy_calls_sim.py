"""The speculation policy (``specdec.policy``) in a closed loop on a simulated engine, no model: requests come in
calls of ``--per-call`` (a call's batch only shrinks: the policy's end rule, ``pays_at_end``, decides) or all in one
call (``--per-call`` at least ``--calls`` x the batch: requests wait to join), each request accepts draft j with
probability ``--acc[j]`` given the ones before it (times a factor of its own drawn from ``1 - --spread .. 1``:
requests that differ; ``--dud``: a share of them accepting nothing), a plain step takes ``--plain-ms``, a drafting
step ``--spec-ms``, and the first drafting step after plain steps of a running request pays a switch (the skipped
proposer's catch-up): ``--switch-ms`` after a run of at least ``--bare-after`` plain steps (the engine's bare steps,
recomputed), else ``--short-switch-ms``. ``--acc-repeat``: the second and third of every three calls accept at
those rates instead (e2e's repeated workload, whose repeats suffix drafts from the first call's responses).
``--first-acc``: a request's first ``--first-tokens`` tokens are drafted at those rates (a lookup method's first
drafts of a response, with no text of its own to match yet); ``--acc-later``: from call ``--later-calls`` on, those
rates (a workload that changes). Prints, per policy, the total simulated time, the share of steps that drafted and
the switches, beside every step plain and every step drafting k (fixed). ``--old FILE``: another version of
``policy.py`` (say ``git show REV:core/specdec/policy.py > /tmp/old_policy.py``) run on the same draws.

s41 added ``--acc-repeat`` for the end rule's probe of fresh batches (``SpeculationPolicy._probe``): on calls of
repeated prompts at spec 1.2 ms (``--acc 0.5 0.4 0.3 0.2 --acc-repeat 0.98 0.97 0.96 0.95 --spec-ms 1.2``) one seed
in five (0) kept the repeats mostly plain, 3.70 s against 3.21 s with the probe (plain 4.51 s, fixed k 3.55 s).

s35 used it to drop a change to the end rule that the H100 could not measure (the switch owed only for requests
that had plain steps): on calls of 8 at acceptance 0.95 / 0.9 / 0.85 and a 20 ms switch it made 351 switches
against 75 and took 5.42 s against 4.80 s, where every step plain took 4.51 s and fixed k less.

    python benchmarks/policy_calls_sim.py --old /tmp/old_policy.py --acc 0.95 0.9 0.85 --switch-ms 20
    python benchmarks/policy_calls_sim.py --old /tmp/old_policy.py --acc 0.5 0.4 0.3 0.2 \
        --acc-repeat 0.98 0.97 0.96 0.95 --spec-ms 1.2 --seed 0
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import sys
from types import ModuleType


def load(path: str) -> ModuleType:
    """``policy.py`` of another version as a module of its own."""
    spec = importlib.util.spec_from_file_location("other_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["other_policy"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def simulate(policy_cls: type | None, args: argparse.Namespace) -> tuple[float, float, int]:
    """(seconds, share of steps drafting, switches) of one closed-loop run; ``policy_cls`` None: fixed k."""
    rng = random.Random(args.seed)
    policy = policy_cls(k=len(args.acc)) if policy_cls is not None else None
    total, steps, drafting, switches, plain_run, next_id = 0.0, 0, 0, 0, 0, 0
    timed_bare = went_bare = False  # the plain run went bare at a step the policy times (--timed-bare); has bare steps
    reasons = getattr(getattr(policy, "stats", None), "plain_reasons", None)  # the policy's count of plain reasons
    behind: set[str] = set()  # requests the proposer missed steps of since its last call
    factor: dict[str, float] = {}  # each request's acceptance factor
    load, load_until = 1.0, 0.0  # the machine's slowdown now (--load), and until when (simulated seconds)
    load_rng, noise_rng = random.Random(args.seed + 1), random.Random(args.seed + 2)  # the same for every policy
    episode, next_episode = -1.0, 0.0  # the last stall's start (--episodes), the next one's (simulated seconds)
    if args.episodes:
        next_episode = load_rng.expovariate(args.episodes / (args.plain_ms * 1e-3))
    for call in range(args.calls):
        acc = args.acc_repeat if args.acc_repeat and call % 3 else args.acc  # e2e's repeated: new, same, near-same
        if args.acc_later and call >= args.later_calls:  # the workload changes: from then on these rates
            acc = args.acc_later
        waiting = [f"r{next_id + i}" for i in range(args.per_call)]
        next_id += args.per_call
        left: dict[str, int] = {}
        while waiting or left:
            while waiting and len(left) < args.batch:
                r = waiting.pop(0)
                left[r], factor[r] = args.tokens, 1.0 - args.spread * rng.random()
                if args.dud and rng.random() < args.dud:
                    factor[r] = 0.0  # a request the proposer never drafts right for (a lookup without matches)
            ids = list(left)
            remaining = None if waiting else [left[r] for r in ids]
            before = dict(reasons) if reasons is not None else None
            widths = policy.plan(ids, False, remaining) if policy is not None else [len(args.acc)] * len(ids)
            mode = int(any(widths))
            timed = bool(before is not None and not mode and any(
                reasons.get(w, 0) > before.get(w, 0) for w in ("warmup", "remeasure")))  # timed against drafting
            while args.load > 1.0 and total >= load_until:  # periods of another process's load, in time: every
                load = args.load if load == 1.0 else 1.0  # step slower by the same factor
                load_until += load_rng.expovariate(1.0 / (args.load_steps * args.plain_ms * 1e-3))
            while args.episodes and total >= next_episode:  # a stall of the machine's, fading (the H100's, s42)
                episode = next_episode
                next_episode += load_rng.expovariate(args.episodes / (args.plain_ms * 1e-3))
            slow = load
            if args.episodes and episode >= 0:
                slow *= 1.0 + (args.episode_peak - 1.0) * math.exp(-(total - episode) / (args.episode_ms * 1e-3))
            timed_bare = not mode and (timed_bare or (args.timed_bare and timed))
            bare = mode == 0 and (plain_run + 1 > args.bare_after or timed_bare)
            step_ms = args.spec_ms if mode else args.plain_ms + (0.0 if bare else args.collect_ms)
            rows = 1.0 - args.row_share + args.row_share * len(ids) / args.batch  # a step of fewer rows: cheaper
            seconds = step_ms * 1e-3 * slow * rows
            if args.noise:
                seconds *= noise_rng.lognormvariate(0.0, args.noise)
            if mode and behind & set(ids):
                long_run = plain_run >= args.bare_after or went_bare
                seconds += (args.switch_ms if long_run else args.short_switch_ms) * 1e-3
                switches += 1
            went_bare = bare if not mode else False  # this run has bare steps: the switch out recomputes them
            plain_run = 0 if mode else plain_run + 1
            if mode:
                behind.clear()
            else:
                behind.update(ids)
            accepted = []
            for r, w in zip(ids, widths):
                a = 0
                rates = args.first_acc if args.first_acc and args.tokens - left[r] < args.first_tokens else acc
                while a < w and rng.random() < rates[a] * factor[r]:
                    a += 1
                accepted.append(a)
            if policy is not None:
                policy.observe(ids, widths, accepted, seconds)
            total += seconds
            steps += 1
            drafting += mode
            for r, a in zip(ids, accepted):
                left[r] -= 1 + a
                if left[r] <= 0:
                    del left[r]
                    behind.discard(r)
                    if policy is not None:
                        policy.forget(r)
    return total, drafting / steps, switches


class EveryStepPlain:
    """A policy that never drafts: plain decoding under the same simulated load and noise."""

    def __init__(self, k: int) -> None:
        pass

    def plan(self, ids: list[str], sampled: bool = False, remaining: list[int] | None = None) -> list[int]:
        return [0] * len(ids)

    def observe(self, *args, **kwargs) -> None:
        pass

    def forget(self, req_id: str) -> None:
        pass


def plain_seconds(args: argparse.Namespace) -> float:
    """The simulated time of every step plain, batches full."""
    return args.calls * args.per_call * args.tokens / args.batch * args.plain_ms * 1e-3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (``argv``: a test's, else the command line's)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", help="another policy.py to run beside this checkout's")
    ap.add_argument("--acc", type=float, nargs="+", default=[0.95, 0.9, 0.85], help="acceptance per position (k)")
    ap.add_argument("--acc-repeat", type=float, nargs="+", default=None,
                    help="acceptance per position of the second and third call of every three (e2e's repeated "
                         "workload: prompts seen before, drafted from the earlier responses); default --acc")
    ap.add_argument("--first-acc", type=float, nargs="+", default=None,
                    help="acceptance per position while a request has made fewer than --first-tokens tokens (a "
                         "lookup method's first steps of a response, before its text matches the earlier ones)")
    ap.add_argument("--first-tokens", type=int, default=4)
    ap.add_argument("--acc-later", type=float, nargs="+", default=None,
                    help="acceptance per position from call --later-calls on (a workload that changes)")
    ap.add_argument("--later-calls", type=int, default=32)
    ap.add_argument("--spread", type=float, default=0.0, help="requests' acceptance factors 1 - spread .. 1")
    ap.add_argument("--dud", type=float, default=0.0, help="share of requests that accept no draft at all")
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--per-call", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--plain-ms", type=float, default=0.55)
    ap.add_argument("--spec-ms", type=float, default=1.6)
    ap.add_argument("--switch-ms", type=float, default=20.0)
    ap.add_argument("--short-switch-ms", type=float, default=0.5)
    ap.add_argument("--bare-after", type=int, default=16)
    ap.add_argument("--collect-ms", type=float, default=0.0,
                    help="extra time of a plain step that collects the proposer's hidden states (the first "
                         "--bare-after of a run; s51, H100, medusa at batch 32: ~0.3 ms over a 0.62 ms step)")
    ap.add_argument("--timed-bare", action="store_true",
                    help="the engine runs the plain steps the policy times against drafting (its warm-up and "
                         "re-measurement bursts) bare from their first step, the switch back then paying "
                         "--switch-ms (s51's timed-plain-bare patch)")
    ap.add_argument("--row-share", type=float, default=0.0,
                    help="the share of a full batch's step time that scales with its rows: a step of r rows takes "
                         "1 - S + S r / batch of a full one (0: any rows, the same time, as a GPU's small batches "
                         "nearly do; CPU, tiny pair, batch 8: ~0.6, 10.7 ms a plain step against 4.4 at one row)")
    ap.add_argument("--noise", type=float, default=0.0, help="sd in log of each step's time (a noisy machine)")
    ap.add_argument("--load", type=float, default=1.0,
                    help="periods in which every step is this factor slower (another process's load), alternating "
                         "with unloaded ones")
    ap.add_argument("--load-steps", type=float, default=200.0,
                    help="mean length of a loaded or unloaded period, in plain steps' time")
    ap.add_argument("--episodes", type=float, default=0.0,
                    help="stalls of the machine a plain step's time (the H100 in s42: ~1 in 800 steps), each "
                         "making every step --episode-peak times slower at first, fading over --episode-ms")
    ap.add_argument("--episode-peak", type=float, default=10.0)
    ap.add_argument("--episode-ms", type=float, default=8.0, help="time constant of a stall's fading")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    from specdec.policy import SpeculationPolicy

    runs: list[tuple[str, type | None]] = [("this checkout", SpeculationPolicy)]
    if args.old:
        runs.append((args.old, load(args.old).SpeculationPolicy))
    runs.append(("fixed k", None))
    for name, cls in runs:
        seconds, share, switches = simulate(cls, args)
        print(f"{name:24s} {seconds:8.3f} s  drafting {share:5.1%} of steps  {switches:4d} switches")
    if args.load > 1.0 or args.noise or args.episodes:
        print(f"{'every step plain':24s} {simulate(EveryStepPlain, args)[0]:8.3f} s  (under the same load and noise)")
    else:
        print(f"{'every step plain':24s} {plain_seconds(args):8.3f} s")


if __name__ == "__main__":
    main()

"""Where an auto engine's plain steps spend host time that the baseline's do not: both engines run the same
workload of ``e2e.py`` under ``cProfile``, and the functions are listed by how much more time a decode step spends
in them in the auto engine (``tottime`` per decode step, microseconds), beside each engine's time per step.

Under ``speculation_policy="auto"`` a step the policy keeps plain should cost what the baseline's step costs; on
the H200 (random bench-shaped target, ngram:4, T = 0.8, where ngram finds no match and every step stays plain) auto's
steps took 0.60 ms against 0.54 at batch 1 and 0.83 against 0.69 at batch 32 (s29). A GPU step is host-bound at
these sizes, so the host's profile is where the difference shows.

``--policy plain``: the method's engine under the auto policy's bookkeeping with every step kept plain (its
proposer loaded, its hidden states collected and kept, no drafting step): what a plain step costs that engine and
nothing else. ``--passes N``: before the profile, N timed passes of each engine, in alternating order (the first
engine of a pair runs on a machine the other left warm), each engine's median milliseconds a decode step and their
ratio (on the CPU a head method's auto rows differ from the baseline by 5-10% a pass; this tells its plain steps'
own cost apart from that noise and from its drafting steps).

    python benchmarks/plain_profile.py --device cpu --batch 8 --method ngram:4 --temperature 0.8
    python benchmarks/plain_profile.py --device cuda --model M --batch 32 --prompts 64 --method ngram:4
    python benchmarks/plain_profile.py --device cpu --batch 1 --method medusa:2 --temperature 0 --policy plain \
        --passes 8 --threads 1
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from policy_steps import add_workload_arguments, first_call

from specdec import LLM
from specdec.policy import SpeculationPolicy


class NeverDrafts(SpeculationPolicy):
    """The auto policy, its plans and their bookkeeping as they are, with every step then kept plain."""

    def plan(self, req_ids: list[str], sampled: bool = False, remaining: list[int] | None = None) -> list[int]:
        super().plan(req_ids, sampled, remaining)
        self._planned = self._plain_plan = dict.fromkeys(req_ids, 0)  # observe's shortcut, as after a plain plan
        return [0] * len(req_ids)


def timed_passes(engines: dict[str, LLM], steps: dict[str, int], prompts: list, params: list, passes: int) -> None:
    """``passes`` timed calls of each engine, alternating which goes first; prints each one's median milliseconds a
    decode step (``steps`` counts them) and the ratio of the medians."""
    per: dict[str, list[float]] = {key: [] for key in engines}
    for i in range(passes):
        for key in (list(engines) if i % 2 else list(engines)[::-1]):
            steps[key] = 0
            t0 = time.perf_counter()
            engines[key].generate(prompts, params)
            per[key].append((time.perf_counter() - t0) / max(steps[key], 1) * 1e3)
    med = {key: statistics.median(v) for key, v in per.items()}
    base, other = list(engines)
    print(f"{passes} timed passes each, alternating: " + ", ".join(f"{key} {m:.3f} ms a step (median; "
          f"{min(per[key]):.3f}-{max(per[key]):.3f})" for key, m in med.items())
          + f"; {other} / baseline {med[other] / med[base]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(ap, prompts=16, max_tokens=64, repeats=2)
    ap.add_argument("--policy", default="auto", choices=["auto", "fixed", "plain"])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--passes", type=int, default=0, help="timed passes of each engine before the profile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, prompts, params = first_call(args)
    name, k = args.method.split(":")
    spec = {"method": name, "num_speculative_tokens": int(k),
            "speculation_policy": "fixed" if args.policy == "fixed" else "auto",
            **({"model": args.draft_model} if args.draft_model else {})}
    common = dict(device=args.device, max_num_seqs=args.batch)
    engines = {"baseline": LLM(model, **common), args.policy: LLM(model, spec, **common)}
    if args.policy == "plain":
        engines["plain"].policy.__class__ = NeverDrafts
    steps = {key: 0 for key in engines}
    for key, llm in engines.items():
        def counted(reqs, _step=llm._decode_step, _key=key):
            steps[_key] += 1
            _step(reqs)
        llm._decode_step = counted
        llm.generate(prompts, params)  # warm-up
    if args.passes:
        timed_passes(engines, steps, prompts, params, args.passes)
    stats, wall = {}, {}
    for key, llm in engines.items():
        steps[key] = 0
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            prof.runcall(llm.generate, prompts, params)
        wall[key] = time.perf_counter() - t0
        stats[key] = {f"{f[0].split('/')[-1]}:{f[1]}({f[2]})": v[2] for f, v in pstats.Stats(prof).stats.items()}
    per = {key: {f: t / max(steps[key], 1) * 1e6 for f, t in s.items()} for key, s in stats.items()}
    other = args.policy
    print(f"{args.workload}, batch {args.batch}, T = {args.temperature}, {args.method}@{other} (profiled): "
          + ", ".join(f"{key} {wall[key] / max(steps[key], 1) * 1e3:.3f} ms a step over {steps[key]} steps"
                      for key in engines))
    st = engines[other].policy.stats if engines[other].policy is not None else None
    if st is not None:
        print(f"{other}'s decode steps that drafted: {st.steps_drafted} of {st.steps_drafted + st.steps_plain}")
    names = set(per["baseline"]) | set(per[other])
    diff = sorted(names, key=lambda f: per[other].get(f, 0.0) - per["baseline"].get(f, 0.0), reverse=True)
    print(f"| function | baseline us a step | {other} us a step | difference |")
    print("| --- | --- | --- | --- |")
    for f in diff[:args.top]:
        a, b = per["baseline"].get(f, 0.0), per[other].get(f, 0.0)
        print(f"| {f} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")


if __name__ == "__main__":
    main()

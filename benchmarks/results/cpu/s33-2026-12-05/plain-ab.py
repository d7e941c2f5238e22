"""A head method's plain steps against the baseline's on the CPU (s33): one process, the engines in rotating order,
each pass's milliseconds a decode step over the baseline's of the same round (geometric mean, standard error).

Engines: the baseline, a second baseline (the spread between two identical engines), the method's engine with every
step kept plain by the auto policy's bookkeeping (``plain_profile.NeverDrafts``: hidden states collected), and the
method's engine under a policy that does nothing, with bare steps (no hidden states collected) on the CPU too.

    cd benchmarks && python results/cpu/s33-2026-12-05/plain-ab.py --device cpu --batch 8 --method eagle3:3 \
        --temperature 0 --passes 12
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

sys.path.insert(0, ".")  # benchmarks/

import torch  # noqa: E402
from plain_profile import NeverDrafts  # noqa: E402
from policy_steps import add_workload_arguments, first_call  # noqa: E402

import specdec.engine as engine_module  # noqa: E402
from specdec import LLM  # noqa: E402
from specdec_tools.bench.passes import gc_off  # noqa: E402


class Trivial:
    """A policy that keeps every step plain and does nothing else."""

    trees = False
    tree_step = True

    def plan(self, ids: list[str], sampled: bool = False, remaining: list[int] | None = None) -> list[int]:
        return [0] * len(ids)

    def would_draft(self, *args: object, **kwargs: object) -> bool:
        return False

    def observe(self, *args: object, **kwargs: object) -> None:
        pass

    def forget(self, req_id: str) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(ap, prompts=16, max_tokens=64, repeats=1)
    ap.add_argument("--passes", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, prompts, params = first_call(args)
    name, k = args.method.split(":")
    spec = {"method": name, "num_speculative_tokens": int(k)}
    common = dict(device=args.device, max_num_seqs=args.batch)
    eng = {"base": LLM(model, **common), "base2": LLM(model, **common), "plain": LLM(model, spec, **common)}
    eng["plain"].policy.__class__ = NeverDrafts
    devices = engine_module.BARE_DEVICES
    engine_module.BARE_DEVICES = ("cuda", "cpu")
    eng["trivial-bare"] = LLM(model, spec, **common)
    eng["trivial-bare"].policy = Trivial()
    engine_module.BARE_DEVICES = devices
    steps = dict.fromkeys(eng, 0)
    for key, llm in eng.items():
        def counted(reqs: list, _step=llm._decode_step, _key=key) -> None:
            steps[_key] += 1
            _step(reqs)
        llm._decode_step = counted
        llm.generate(prompts, params)  # warm-up
    per: dict[str, list[float]] = {key: [] for key in eng}
    keys = list(eng)
    for i in range(args.passes):
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            steps[key] = 0
            with gc_off():  # as e2e.py times
                t0 = time.perf_counter()
                eng[key].generate(prompts, params)
                dt = time.perf_counter() - t0
            per[key].append(dt / steps[key] * 1e3)
    for key in keys:
        r = [math.log(a / b) for a, b in zip(per[key], per["base"])]
        se = statistics.stdev(r) / len(r) ** 0.5 if len(r) > 1 else 0.0
        ratio = math.exp(statistics.mean(r))
        print(f"{key}: median {statistics.median(per[key]):.3f} ms a step, paired ratio {ratio:.3f} (se {se:.3f}), "
              f"{steps[key]} steps a pass")


if __name__ == "__main__":
    main()

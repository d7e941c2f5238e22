"""What a plain step costs in a hidden-state method's engine against the baseline's: the floor of
``speculation_policy="auto"`` where drafting does not pay (issue 24: no row below 0.97x).

Each method's engine runs its real policy in the state of a long plain run (every decision plain; its plan,
would_draft and observe still run: that bookkeeping is part of the cost), beside a baseline engine, in interleaved
timed passes of the same seeded prompts (identical tokens: the script checks), each engine's fastest pass kept. A
plain step of a head method's engine still collects the target's hidden states and keeps them for the proposer's
next call.

    python benchmarks/plain_overhead.py                                   # CPU: the bundled tiny pair
    python benchmarks/plain_overhead.py --device cuda --random-bench /tmp/rb --batch 1 8 --temperature 0 0.8
    python benchmarks/plain_overhead.py --device cuda --random-bench /tmp/rb --batch 8 --workload repeated \
        --prompts 24 --host-timers      # e2e's prompts and calls; then one pass per engine with host timers
    python benchmarks/plain_overhead.py --device cuda --random-bench /tmp/rb --methods medusa:2 --batch 32 \
        --workload completion --prompts 64 --collect    # also each head method's engine collecting every plain step

``--workload`` takes e2e's prompts (``specdec_tools.bench.build_workloads``: long prompts, more requests than the
batch, so requests join as others finish) instead of eight short ones. ``--host-timers``: after the timed passes,
one more pass of each engine with wall-clock timers around the step's host functions
(``gpu_step_trace.HOST_TIMED``), printed side by side in microseconds a decode step. ``--collect``: beside each head
method's engine, one whose plain steps all collect the proposer's hidden states, as the auto policy's short plain
runs did before s52 (its warm-up, re-measurement bursts: on the H100 at batch 32 they timed 0.86-1.32 ms against the
baseline's 0.62-0.65; a long run goes bare past ``specdec.engine.BARE_AFTER`` steps), labelled "METHOD collecting".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_tools.bench.passes import gc_off

COUNTED = ("LLM._queue_ahead", "LLM._take_ahead", "LLM._prefill", "LLM._propose")  # host_report: their calls too
PROMPTS = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Stack:\n    def push(self, x):\n",
           "The quick brown fox jumps over", "Once upon a time, in a land", "for i in range(10):\n",
           "SELECT name FROM users WHERE", "# A list of prime numbers:\n"]


def _head(method: str) -> bool:
    """A head method (a bundled tiny head of that name exists), not a lookup one without a model (ngram, suffix)."""
    from specdec.models import BUNDLED_HEADS

    return f"tiny-{method}" in BUNDLED_HEADS


def forced_plain(llm) -> None:
    """``llm``'s policy in the state of a long plain run: every batch-size bucket (greedy and sampled) past its
    warm-up, plain the winner by far, no re-measurement burst due; the policy otherwise runs as usual (what it
    costs a plain step is part of what this measures)."""
    from specdec.policy import GAP_MAX, WARMUP

    p = llm.policy
    for table in (p.cost, p.cost_sampled):
        size = 1
        while size <= 2 * llm.max_num_seqs:
            b = p._bucket_for(size, table)
            b.tokens, b.seconds, b.count = [float(size), float(size)], [1e-3, 1.0], [WARMUP, WARMUP]
            b.decided, b.winner, b.gap, b.since = True, 0, GAP_MAX, -10 ** 9
            size *= 2


def timed(llm, calls: list[list], params: list) -> tuple[list[list[int]], float]:
    """One pass: each ``generate`` call of ``calls`` (prompts) in turn, with ``params`` (one per prompt, in order)."""
    with gc_off():
        out, at = [], 0
        t = time.perf_counter()
        for call in calls:
            out += llm.generate(call, params[at: at + len(call)])
            at += len(call)
        return [o.token_ids for o in out], time.perf_counter() - t


def host_report(engines: dict, calls: list[list], params: list) -> str:
    """One pass of each engine with host timers on: microseconds a decode step per timed function, side by side."""
    from gpu_step_trace import host_timers

    secs, counts = host_timers()
    per: dict[str, dict[str, float]] = {}
    for name, llm in engines.items():
        secs.clear()
        counts.clear()
        timed(llm, calls, params)
        n = counts["LLM._decode_step"] or 1
        per[name] = {k: v / n * 1e6 for k, v in secs.items()}
        per[name]["(decode steps)"] = n
        for key in COUNTED:
            per[name][f"({key} calls)"] = counts[key]
    keys = sorted({k for p in per.values() for k in p}, key=lambda k: -max(p.get(k, 0.0) for p in per.values()))
    lines = ["host us a decode step | " + " | ".join(per)]
    lines += [f"{k} | " + " | ".join(f"{p.get(k, 0.0):.1f}" for p in per.values()) for k in keys]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target (default: the bundled tiny model)")
    ap.add_argument("--head", action="append", default=[], help="METHOD=DIR (default: the bundled tiny heads)")
    ap.add_argument("--random-bench", metavar="DIR", help="random bench-shaped target and heads built in DIR")
    ap.add_argument("--methods", nargs="+", default=["eagle3:3", "medusa:3", "dflash:4"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.8], help="> 0: seeded sampling")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved passes; each engine's fastest is kept")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--workload", default="short", choices=["short", "completion", "edit", "repeated"],
                    help="short: eight short prompts; else e2e's workload of that name")
    ap.add_argument("--prompts", type=int, default=0, help="with --workload: requests (at least the batch)")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="with --workload: tokens a prompt, at most")
    ap.add_argument("--host-timers", action="store_true", help="then one pass per engine with host timers")
    ap.add_argument("--natural", action="store_true",
                    help="leave each policy as its warm-up pass left it (drafting bursts, switches, its own "
                         "decisions) instead of forcing a long plain run")
    ap.add_argument("--collect", action="store_true",
                    help="also each head method's engine with every plain step collecting its hidden states")
    args = ap.parse_args()
    from specdec import LLM, SamplingParams, bundled_model

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    names = [m.split(":")[0] for m in args.methods]
    heads = dict(h.split("=", 1) for h in args.head)
    if args.random_bench:
        from gpu_eagle_profile import random_bench

        for m in {m for m in names if _head(m)}:
            args.model, heads[m] = random_bench(args.random_bench, m)
        if args.model is None:
            args.model = random_bench(args.random_bench)[0]
    model = args.model or bundled_model("tiny")
    for m in names:
        if _head(m):
            heads.setdefault(m, bundled_model(f"tiny-{m}"))
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    rows = []
    for batch in args.batch:
        kw = dict(dtype=dtype, device=args.device, max_num_seqs=batch)
        engines = {"baseline": LLM(model, **kw)}
        for spec in args.methods:
            name, k = spec.split(":")
            config = {"method": name, "num_speculative_tokens": int(k), "speculation_policy": "auto"}
            if _head(name):
                config["model"] = heads[name]
            variants = [False, True] if args.collect and _head(name) else [False]
            for collect in variants:
                llm = LLM(model, config, **kw)
                if not args.natural:
                    forced_plain(llm)
                if collect:  # every plain step collects, however long its run (never a bare step)
                    llm._collects = lambda plain_run, llm=llm: llm._hidden_request
                engines[f"{spec} collecting" if collect else spec] = llm
        if args.workload == "short":
            calls = [[PROMPTS[i % len(PROMPTS)] for i in range(batch)]]
        else:
            from specdec_tools.bench import build_workloads

            calls = build_workloads(engines["baseline"].tokenizer, [args.workload], args.prompts, batch,
                                    args.prompt_tokens)[0].calls
        requests = sum(len(c) for c in calls)
        for temp in args.temperature:
            params = [SamplingParams(temperature=temp, seed=i if temp else None, max_tokens=args.max_tokens,
                                     ignore_eos=True) for i in range(requests)]
            for llm in engines.values():
                timed(llm, calls, params)  # warm-up: graphs, kernels, the policy's buckets
            seconds: dict[str, list[float]] = {n: [] for n in engines}
            want = None
            for r in range(args.repeats):
                order = list(engines)[r % len(engines):] + list(engines)[: r % len(engines)]
                for n in order:
                    out, t = timed(engines[n], calls, params)
                    seconds[n].append(t)
                    if n == "baseline":
                        want = out
                    elif want is not None and out != want:
                        message = f"{n}: output differs from the baseline's at batch {batch}, T = {temp}"
                        if not args.natural:  # drafting steps in bf16 may move a near tie
                            raise SystemExit(message)
                        print(message, "(drafting steps: near ties in low precision)", flush=True)
            # the fastest pass of each engine: what another process's bursts on a shared machine added is not its
            tokens = requests * args.max_tokens
            seconds = {n: min(t) for n, t in seconds.items()}
            base = seconds["baseline"]
            for n in engines:
                if n == "baseline":
                    continue
                stats = engines[n].policy.stats
                row = dict(method=n, batch=batch, temperature=temp, speed=round(base / seconds[n], 4),
                           extra_us_per_step=round((seconds[n] - base) / (tokens / batch) * 1e6, 1),
                           baseline_us_per_step=round(base / (tokens / batch) * 1e6, 1),
                           steps_drafted=stats.steps_drafted)
                rows.append(row)
                print(f"batch {batch} T={temp} {n:10s} {'auto' if args.natural else 'plain-only'} {row['speed']:.3f}x "
                      f"of the baseline ({row['extra_us_per_step']:+.1f} us a step over "
                      f"{row['baseline_us_per_step']:.1f}; {stats.as_dict()})", flush=True)
            if args.host_timers:
                print(host_report(engines, calls, params), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

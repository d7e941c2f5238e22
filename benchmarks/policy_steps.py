"""Where a speculative run's time goes, step by step: each decode step's mode (drafting or plain), rows, tokens and
wall time under the auto policy, beside the baseline's and fixed k's total time, one workload of ``e2e.py``.

The policy (``specdec.policy``) compares the two modes' tokens per second per batch-size bucket. This prints the
same steps grouped by mode and row count, so a run where every group favours drafting and the whole run is still
slower than the baseline shows where the difference lies (the rows of the late steps, the steps outside the groups).
Timed passes run with Python's garbage collector off, as ``e2e.py``'s (before 2026-12-05 they did not: a full
collection over the three engines, up to 0.2 s on the CPU, fell inside a plain step now and then).

    python benchmarks/policy_steps.py --device cpu --batch 8 --temperature 0.8 --method ngram:4
    python benchmarks/policy_steps.py --device cuda --model M --draft-model D --method draft_model:3 --temperature 0
    python benchmarks/policy_steps.py --device cpu --step-graphs --batch 32 --prompts 64 --method ngram:4

``--step-graphs`` (CPU): every engine runs the step graphs' static-buffer path without capturing them (as
``tests/core/test_overlap_steps.py`` does), so plain steps are queued ahead (``overlap_steps``) as on a GPU. Each
engine's steps queued ahead, and of those served (the rest were dropped and ran again), are printed with its steps.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from specdec import LLM, SamplingParams, bundled_model
from specdec.policy import SpeculationPolicy
from specdec_tools.bench.passes import fresh_proposer, gc_off


class NoEndRule(SpeculationPolicy):
    """The auto policy without its end-of-batch rule: every step decided by the bucket's throughput alone."""

    def pays_at_end(self, b, req_ids, remaining) -> bool:
        return True


def add_workload_arguments(ap: argparse.ArgumentParser, prompts: int, max_tokens: int, repeats: int) -> None:
    """The options of one workload's first call run by a method's engines (this tool's and ``plain_profile.py``'s)."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="target folder (default: the bundled tiny model)")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--method", default="ngram:4", help="NAME:K")
    ap.add_argument("--workload", default="completion", choices=["completion", "edit", "repeated"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--threads", type=int, default=1)


def first_call(args: argparse.Namespace) -> tuple[str, list, list[SamplingParams]]:
    """The target folder, and the prompts and sampling parameters of the workload's first call (``e2e.py``'s
    prompts; seeded requests at T > 0)."""
    prompts, params = workload_calls(args, 1)[0]
    return args.model or bundled_model("tiny"), prompts, params


def workload_calls(args: argparse.Namespace, count: int) -> list[tuple[list, list[SamplingParams]]]:
    """The first ``count`` calls of the workload as ``e2e.py`` sends them (each call's prompts and sampling
    parameters, seeded at T > 0 by the prompt's index in the workload), so that a pass is e2e's pass."""
    from transformers import AutoTokenizer

    from specdec_tools.bench import build_workloads

    model = args.model or bundled_model("tiny")
    calls = build_workloads(AutoTokenizer.from_pretrained(model), [args.workload], args.prompts, args.batch,
                            256)[0].calls[:count]
    out, seen = [], 0
    for prompts in calls:
        out.append((prompts, [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                                             ignore_eos=True, seed=seen + i if args.temperature > 0 else None)
                              for i in range(len(prompts))]))
        seen += len(prompts)
    return out


def trace_records(trace: list[tuple], start: tuple[dict, dict] = ({}, {})) -> list[dict]:
    """``--trace``'s JSON records from the raw values taken at each auto step: why the step was decided as it was
    (the decision counts that moved since the step before; ``start``: the plain and drafting counts before the
    first), its mode, rows, tokens, seconds and whether it ran unpiped, and its bucket's estimates after it."""
    def counts_of(plain: dict, draft: dict) -> dict:
        return {**{f"plain {k}": v for k, v in plain.items()}, **{f"draft {k}": v for k, v in draft.items()}}

    records, seen = [], counts_of(*start)
    for (mode, rows, tokens, seconds), unpiped, plain, draft, b in trace:
        counts = counts_of(plain, draft)
        why = [k for k, v in counts.items() if v != seen.get(k, 0)]
        seen = counts
        rec = {"why": why, "mode": mode, "rows": rows, "tokens": tokens, "ms": seconds * 1e3, "unpiped": unpiped}
        if b is not None:
            plain_s, spec_s, spec_tokens, winner, settling, clipped, switch, switch_long = b
            rec.update(plain_ms=plain_s * 1e3, spec_ms=spec_s * 1e3, spec_tokens=spec_tokens, winner=winner,
                       settling=settling, clipped=clipped, switch_ms=[x * 1e3 for x in switch],
                       switch_long_ms=switch_long * 1e3)
        records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(ap, prompts=8, max_tokens=96, repeats=3)
    ap.add_argument("--calls", type=int, default=1,
                    help="calls of the workload a pass (default 1: its first); e2e.py sends all of them "
                         "(--prompts / --batch calls)")
    ap.add_argument("--step-graphs", action="store_true",
                    help="CPU: the step graphs' path uncaptured, so that plain steps are queued ahead as on a GPU")
    ap.add_argument("--trace", metavar="FILE", help="write the auto engine's timed passes step by step (JSON lines: "
                    "mode, rows, tokens, seconds, unpiped, and the step's bucket estimates after it)")
    ap.add_argument("--policy-file", metavar="FILE",
                    help="also an auto engine whose policy is FILE's SpeculationPolicy (another version of "
                         "specdec/policy.py: git show REV:core/specdec/policy.py > FILE), timed in the same passes")
    ap.add_argument("--no-end-rule", action="store_true",
                    help="also an auto engine without the end-of-batch rule (SpeculationPolicy.pays_at_end)")
    ap.add_argument("--timed-bare", action="store_true",
                    help="also an auto engine whose timed plain steps go bare (specdec.engine.TIMED_BARE)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or bundled_model("tiny")
    calls = workload_calls(args, args.calls)
    name, k = args.method.split(":")
    spec = {"method": name, "num_speculative_tokens": int(k),
            **({"model": args.draft_model} if args.draft_model else {})}
    common = dict(device=args.device, max_num_seqs=args.batch)
    engines = {"baseline": LLM(model, **common), "fixed": LLM(model, {**spec, "speculation_policy": "fixed"}, **common),
               "auto": LLM(model, spec, **common)}
    if args.no_end_rule:
        engines["auto, no end rule"] = LLM(model, spec, **common)
        engines["auto, no end rule"].policy = NoEndRule(int(k))
    if args.timed_bare:
        engines["auto, timed bare"] = LLM(model, spec, **common)
        engines["auto, timed bare"]._timed_bare_on = True
    if args.policy_file:
        from policy_calls_sim import load

        other = engines["auto, " + args.policy_file] = LLM(model, spec, **common)
        other.policy = load(args.policy_file).SpeculationPolicy(int(k), trees=other.policy.trees)
    if args.step_graphs:
        for llm in engines.values():
            k = llm.num_speculative_tokens
            if not llm.target.capture_graphs(sorted({1, k + 1}), hidden=llm._hidden_request, use_graphs=False):
                raise SystemExit("--step-graphs: this target cannot take the step graphs' path")
    steps = []
    trace = []  # with --trace: each auto step and its bucket's estimates after it
    unpiped = [0]  # the auto engine's plain steps that could have queued the next one, but the next one drafted
    policy = engines["auto"].policy
    observe = policy.observe

    def logged(req_ids, drafted, accepted, seconds, **kw):  # the auto engine's steps, as seen
        mode = int(any(policy._planned.get(r, 0) for r in req_ids))
        steps.append((mode, len(req_ids), len(req_ids) + sum(accepted), seconds))
        unpiped[0] += int(kw.get("unpiped", False))
        out = observe(req_ids, drafted, accepted, seconds, **kw)
        if args.trace:  # raw values only: this runs inside the timed step (the records are built after the passes;
            # building them here, s50, made the auto engine's plain steps at batch 32 on the H100 0.74 ms against the
            # baseline's 0.68, and 0.68 without --trace)
            b = policy._tables(bool(kw.get("sampled")))[0].get(policy.bucket(len(req_ids)))
            trace.append((steps[-1], bool(kw.get("unpiped", False)), dict(policy.stats.plain_reasons),
                          dict(policy.stats.draft_reasons),
                          None if b is None else (b.seconds[0], b.seconds[1], b.tokens[1], b.winner, b.settling,
                                                  b.clipped, tuple(b.switch), b.switch_long)))
        return out

    policy.observe = logged
    recomputes = []  # the auto engine's bare-run recomputes: (rows, positions, seconds)
    if hasattr(engines["auto"], "_recompute_bare"):
        def recompute(reqs, _r=engines["auto"]._recompute_bare):
            bare = [r.bare[1] for r in reqs if r.bare is not None]
            t0 = time.perf_counter()
            _r(reqs)
            if bare:
                recomputes.append((len(bare), sum(bare), time.perf_counter() - t0))
        engines["auto"]._recompute_bare = recompute
    proposes = []  # the auto engine's proposer calls: seconds (a catch-up after plain steps shows here)

    def propose(*args, _p=engines["auto"]._propose):
        t0 = time.perf_counter()
        try:
            return _p(*args)
        finally:
            proposes.append(time.perf_counter() - t0)
    engines["auto"]._propose = propose
    decode = {key: [] for key in engines}  # every engine's decode steps: (rows, seconds)
    for key, llm in engines.items():
        def timed(reqs, _step=llm._decode_step, _log=decode[key]):
            t0 = time.perf_counter()
            _step(reqs)
            _log.append((len(reqs), time.perf_counter() - t0))
        llm._decode_step = timed
    def one_pass(llm: LLM) -> None:
        for prompts, params in calls:
            llm.generate(prompts, params)

    for llm in engines.values():
        one_pass(llm)  # warm-up
    steps.clear()
    trace.clear()
    start = (dict(policy.stats.plain_reasons), dict(policy.stats.draft_reasons))  # the decisions before the passes
    unpiped[0] = 0
    queued = {key: (llm.steps_queued, llm.steps_ahead) for key, llm in engines.items()}
    recomputes.clear()
    proposes.clear()
    for log in decode.values():
        log.clear()
    best = collections.defaultdict(lambda: float("inf"))
    whole = collections.defaultdict(float)  # every pass's time, summed
    names = list(engines)
    for r in range(args.repeats):  # the order rotating each round, as e2e.py's passes
        for key in names[r % len(names):] + names[: r % len(names)]:
            llm = engines[key]
            fresh_proposer(llm)  # as e2e.py: suffix's global tree does not keep the last pass's responses
            with gc_off():  # as e2e.py times: a full collection walks all three engines (up to 0.2 s on the CPU)
                t0 = time.perf_counter()
                one_pass(llm)
                dt = time.perf_counter() - t0
            best[key], whole[key] = min(best[key], dt), whole[key] + dt
    base = best["baseline"]
    print(f"{args.workload} ({len(calls)} call(s) a pass), batch {args.batch}, T = {args.temperature}, "
          f"{args.method}: baseline {base:.3f} s, "
          + ", ".join(f"{key} {best[key]:.3f} s ({base / best[key]:.2f}x)" for key in engines if key != "baseline"))
    groups = collections.defaultdict(lambda: [0, 0, 0.0])
    for mode, rows, tokens, seconds in steps:
        g = groups[(mode, rows)]
        g[0], g[1], g[2] = g[0] + 1, g[1] + tokens, g[2] + seconds
    passes = args.repeats
    print("| mode | rows | steps a pass | ms a step | tokens a step | tok/s | share of the steps' time |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    total = sum(g[2] for g in groups.values())
    for (mode, rows), (n, tokens, seconds) in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {'draft' if mode else 'plain'} | {rows} | {n / passes:.1f} | {1e3 * seconds / n:.2f} | "
              f"{tokens / n:.2f} | {tokens / seconds:.0f} | {seconds / total:.0%} |")
    print(f"decode steps {total / passes:.3f} s a pass of the auto engine's {best['auto']:.3f} s (best pass)")
    print("\n| engine | best pass s | mean pass s | decode steps a pass | their s a pass | outside them s a pass | "
          "mean rows | ms a step | queued ahead a pass | served |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, log in decode.items():  # where the passes differ: how many steps, at how many rows, how long each
        n, secs = len(log), sum(t for _, t in log)
        print(f"| {key} | {best[key]:.3f} | {whole[key] / passes:.3f} | {n / passes:.1f} | {secs / passes:.3f} | "
              f"{(whole[key] - secs) / passes:.3f} | {sum(r for r, _ in log) / max(n, 1):.2f} | "
              f"{1e3 * secs / max(n, 1):.3f} | {(engines[key].steps_queued - queued[key][0]) / passes:.1f} | "
              f"{(engines[key].steps_ahead - queued[key][1]) / passes:.1f} |")
    # every engine's decode steps by their rows, side by side (auto's drafting steps against fixed k's: on the H100,
    # s53, ngram on the tiny model at batch 32, auto's decode steps took 0.79 ms against fixed's 0.51)
    edges = sorted({max(1, args.batch * i // 4) for i in range(1, 5)})
    print("\nms a decode step by rows (steps a pass)\n\n| rows | " + " | ".join(decode) + " |")
    print("| --- |" + " --- |" * len(decode))
    lo = 1
    for hi in edges:
        cells = []
        for log in decode.values():
            ts = [t for r, t in log if lo <= r <= hi]
            cells.append(f"{1e3 * sum(ts) / len(ts):.3f} ({len(ts) / passes:.1f})" if ts else "-")
        print(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
        lo = hi + 1
    print("\nsteps over 4x the engine's median step (stalls: their count and seconds a pass, the longest runs of them "
          "in a row):")
    for key, log in decode.items():
        ts = [t for _, t in log]
        med = sorted(ts)[len(ts) // 2] if ts else 0.0
        slow = [i for i, t in enumerate(ts) if t > 4 * med]
        runs, run = [], 1
        for a, b in zip(slow, slow[1:]):
            if b == a + 1:
                run += 1
            else:
                runs.append(run)
                run = 1
        if slow:
            runs.append(run)
        print(f"  {key}: median {med * 1e3:.3f} ms, {len(slow) / passes:.1f} slow a pass, "
              f"{sum(ts[i] for i in slow) / passes * 1e3:.1f} ms a pass; runs {sorted(runs)[::-1][:8]}")
    print(f"\nauto's plain steps by reason (all passes): {dict(policy.stats.plain_reasons)}; unpiped (the next step "
          f"drafted): {unpiped[0] / passes:.1f} a pass")
    if recomputes:
        print(f"auto's bare-run recomputes: {len(recomputes) / passes:.1f} a pass, "
              f"{sum(t for *_, t in recomputes) / passes * 1e3:.1f} ms a pass; (rows, positions, ms): "
              + ", ".join(f"({r}, {n}, {t * 1e3:.1f})" for r, n, t in recomputes[:24]))
    if proposes:
        top = sorted(proposes)[::-1][:12]
        print(f"auto's proposer calls: {len(proposes) / passes:.1f} a pass, {sum(proposes) / passes * 1e3:.1f} ms a "
              f"pass, median {sorted(proposes)[len(proposes) // 2] * 1e3:.2f} ms, longest "
              + ", ".join(f"{t * 1e3:.1f}" for t in top))
    slow = sorted(range(len(steps)), key=lambda i: -steps[i][3])[:16]
    print("auto's longest decode steps (index, mode, rows, ms): "
          + ", ".join(f"({i}, {'draft' if steps[i][0] else 'plain'}, {steps[i][1]}, {steps[i][3] * 1e3:.1f})"
                      for i in sorted(slow)))
    print("auto's cost table:", policy.cost_table(args.temperature > 0))
    if args.trace:
        import json
        with open(args.trace, "w") as f:
            f.writelines(json.dumps(t) + "\n" for t in trace_records(trace, start))


if __name__ == "__main__":
    main()

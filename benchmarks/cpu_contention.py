"""CPU contention (issue 24): every method against its own baseline while another process keeps one core busy, with
torch's own thread count (``cpu_threads=None``) and with ``LLM``'s default ``cpu_threads="auto"``, one process.

A child process spins on core 0 (pinned) for the whole run (``--quiet``: no child, the reference). Each setting
runs the end-to-end harness (:mod:`specdec_tools.bench`: bundled tiny pair, held-out workloads, greedy checks,
interleaved timed passes). Prints, per workload and method, tokens/s and the speedup over the baseline measured
under the same load and setting (with the share of steps the auto speculation policy drafted), and writes
``<out>/cpu-contention.json`` / ``.md``.

    python benchmarks/cpu_contention.py --batch 1 --prompts 4 --max-tokens 64 --methods ngram:4 suffix:4 \\
        draft_model:3 eagle3:3 medusa:2 dflash:3

``--settings auto`` runs only ``LLM``'s default (torch's own thread count runs every engine ~20x slower under the
load, and takes most of the time).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
from pathlib import Path

from specdec_tools.bench import Settings, run_benchmark


def _spin() -> None:
    os.sched_setaffinity(0, {0})
    while True:
        pass


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _share(drafted: float | None) -> str:
    return "" if drafted is None else f" ({drafted:.0%} drafted)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=["completion", "edit", "repeated"])
    ap.add_argument("--methods", nargs="+", default=["ngram:4", "suffix:4", "draft_model:3"])
    ap.add_argument("--quiet", action="store_true", help="no busy child: the same grid on a quiet machine")
    ap.add_argument("--no-fused-forward", action="store_true",
                    help="Hugging Face's layers in the target forward (LLM's fused_forward=False), as before s44")
    ap.add_argument("--settings", nargs="+", choices=["torch", "auto"], default=["torch", "auto"],
                    help="thread settings to run: torch's own count (cpu_threads=None), LLM's default 'auto'")
    ap.add_argument("--out", default="benchmarks/results/cpu-contention")
    args = ap.parse_args()
    child = None
    if not args.quiet:
        child = mp.get_context("spawn").Process(target=_spin, daemon=True)
        child.start()
    rows = []
    try:
        for setting in [None if x == "torch" else "auto" for x in args.settings]:
            s = Settings(methods=args.methods, workloads=args.workloads, batch=args.batch, temperature=[0.0],
                         prompts=args.prompts, max_tokens=args.max_tokens, repeats=args.repeats, device="cpu",
                         dtype="float32", peers=False, plots=False, progress=False, cpu_threads=setting,
                         fused_forward=False if args.no_fused_forward else None, out=args.out,
                         name=f"cpu-threads-{setting}")
            result = run_benchmark(s)
            for r in result["rows"]:
                drafted = r.get("policy_stats", {}).get("drafted_step_share")  # auto policy: share of steps drafted
                rows.append({"cpu_threads": str(setting), "workload": r["workload"], "batch": r["batch"],
                             "method": r["method"], "tok_s": round(r.get("tok_s", 0.0), 1),
                             "speedup": r.get("speedup"), "drafted": drafted, "refused": r.get("refused", False)})
    finally:
        if child is not None:
            child.kill()
    load = "quiet machine" if args.quiet else "one core busy (a spinning process pinned to core 0)"
    forward = "Hugging Face's layers" if args.no_fused_forward else "the fused forward"
    lines = [f"{load}; {os.cpu_count()} cores; bundled tiny pair, float32, greedy, {forward}", "",
             "| workload | batch | method | tok/s, torch's threads | speedup | tok/s, cpu_threads=auto | speedup |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    by = {(r["cpu_threads"], r["workload"], r["batch"], r["method"]): r for r in rows}
    for key in dict.fromkeys(k[1:] for k in by):  # each (workload, batch, method) once, in run order
        t, a = by.get(("None", *key), {}), by.get(("auto", *key), {})
        wl, b, m = key
        lines.append(f"| {wl} | {b} | {m} | {t.get('tok_s', '-')} | {_ratio(t.get('speedup'))}"
                     f"{_share(t.get('drafted'))} | {a.get('tok_s', '-')} | {_ratio(a.get('speedup'))}"
                     f"{_share(a.get('drafted'))} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-contention.json").write_text(json.dumps({"load": load, "rows": rows}, indent=1))
    (out / "cpu-contention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

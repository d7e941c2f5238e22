"""Reports: the markdown table, the PNG plots and the files written (JSON, markdown, plots)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from specdec.policy import DRAFT_REASONS, PLAIN_REASONS

# ---------------------------------------------------------------- reports


def _f(x: Any, fmt: str = ".2f", none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def markdown_report(result: dict[str, Any]) -> str:
    """The results as markdown: a header, the main table, the peers table and the notes."""
    meta = result["meta"]
    lines = [f"{meta['device']}; model `{meta['model']}` ({meta['dtype']}, CUDA graphs {meta['cuda_graphs']}); "
             f"draft `{meta['draft']}`; {meta['settings']['max_tokens']} new tokens per request, prompts of "
             f"<= {meta['prompt_tokens']} tokens; {meta['settings']['repeats']} interleaved timed passes; torch "
             f"{meta['torch']}, transformers {meta['transformers']}, {meta['torch_threads']} torch threads.",
             "", f"Command: `{meta['command']}`", "",
             "| workload | batch | T | method | k | tok/s | speedup | accept len | accept/pos | tok/step | draft % "
             "| verify % | prefill % | mean batch | T(k+1)/T(1) | efficiency | loop eff. | spec steps | greedy check |",
             "|" + " --- |" * 19]
    for r in result["rows"]:
        head = f"| {r['workload']} | {r['batch']} | {r['temperature']:g} | {r['method']} | {r['k'] or '-'} |"
        if r.get("refused"):
            lines.append(f"{head} REFUSED | REFUSED | - | - | - | - | - | - | - | - | - | - | - | {r['check']} |")
            continue
        per_pos = "/".join(f"{a:.2f}" for a in r.get("acceptance_rate_per_pos", [])) or "-"
        ratio = r["tk1_ms"] / r["t1_ms"] if r.get("tk1_ms") else None
        speed = f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        lines.append(f"{head} {r['tok_s']:.1f} | {speed} | {_f(r.get('mean_acceptance_length'))} | {per_pos} | "
                     f"{r['tokens_per_step']:.2f} | {r['draft_share']:.0%} | {r['verify_share']:.0%} | "
                     f"{r.get('prefill_share', 0):.0%} | {r.get('mean_batch', 0):.1f} | {_f(ratio)} | "
                     f"{_f(r.get('efficiency'))} | {_f(r.get('loop_efficiency'))} | {_policy(r)} | {r['check']} |")
    if result["peers"]:
        lines += ["", "Hugging Face `generate()` at batch 1, greedy, same prompts and token budget (EOS off):", "",
                  "| workload | peer | tok/s | our baseline / peer | output = our baseline | note |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for p in result["peers"]:
            if "error" in p:
                lines.append(f"| {p['workload']} | {p['peer']} | - | - | - | {p['error']} |")
                continue
            note = "" if p["full_length"] else "stopped before max_tokens"
            lines.append(f"| {p['workload']} | {p['peer']} | {p['tok_s']:.1f} | {_f(p['ours_over_peer'])}x | "
                         f"{p['matched']}/{p['requests']} | {note} |")
    lines += ["", "tok/s and speedup come from un-profiled passes (speedup: total baseline time / total method "
              "time; min-max over passes in brackets; every engine has run untimed at that temperature first: the "
              "greedy check, or a short warm-up pass; the garbage collector is off while a pass is timed); "
              "draft % and verify % (target forward + sampling) come from "
              "one separate profiled pass, which synchronises the device per step, as do prefill % (the time in "
              "prefill forwards, share of prefill + decode steps) and mean batch (running requests per decode step). "
              "accept len = 1 + accepted / "
              "drafts, over steps that drafted; tok/step = tokens per decode step over all steps (steps where a "
              "method found nothing to draft make it lower). efficiency = speedup / (accept len x T(1)/T(k+1)), "
              "T = median target forward time at that batch, measured in this run. loop eff. (batch 1) = speedup "
              "over the same ideal with the steps that drafted nothing costed at T(1): what the loop itself costs. "
              "spec steps: the speculation policy (speculation_policy, specdec.policy) and the share of decode "
              "steps it let draft in the timed passes ('fixed': every step); r = the drafting mode's tokens per "
              "second over the plain mode's, as the policy estimated them at the end, in its busiest batch bucket "
              "(above 1: it judged drafting faster); plain: the most common reason of its plain steps in the timed "
              "passes (warmup, slower: plain won, remeasure: a burst of plain steps, no_gain: no request expected "
              "a gain, batch_end: drafting did not pay for the batch's longest request) and their count. "
              "greedy check: each method's greedy outputs against the baseline's on every prompt of that workload "
              "and batch, before timing; rows at T > 0 show the same check (float32: exact, or REFUSED and not "
              f"timed; lower precision: token agreement, and whether each divergence is at a near-tie: baseline "
              f"top-1 logit minus the chosen token's logit <= {result['meta']['settings']['tie_rel']:g} x "
              "max(1, |top-1 logit|) in a plain HF forward of the baseline's prefix)."]
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def _policy(row: dict[str, Any]) -> str:
    """The spec-steps cell: ``auto 83%`` (share of decode steps that drafted), with the policy's ratio and the most
    common reason of its plain steps (``auto 37% (r 1.09; plain: batch_end 76)``), ``fixed`` or ``-``."""
    policy = row.get("policy")
    if policy is None:
        return "-"
    if policy == "fixed":
        return "fixed"
    cell = f"auto {row['policy_stats']['drafted_step_share']:.0%}"
    table = row.get("policy_cost") or {}
    busiest = max(table.values(), key=lambda c: c["plain_steps"] + c["spec_steps"], default=None)
    notes = []
    if busiest is not None and busiest["spec_over_plain"]:
        notes.append(f"r {busiest['spec_over_plain']:.2f}")
    stats = row["policy_stats"]
    for kind, names in (("plain", PLAIN_REASONS), ("drafted", DRAFT_REASONS)):  # each kind's main reason
        reasons = {k: stats[f"{kind}_{k}"] for k in names if stats.get(f"{kind}_{k}")}
        if reasons:
            why, n = max(reasons.items(), key=lambda kv: kv[1])
            notes.append(f"{kind}: {why} {n}")
    return cell + (f" ({'; '.join(notes)})" if notes else "")


def _plot_speedup(plt: Any, rows: list[dict[str, Any]], methods: list[str], workloads: list[str], path: str) -> None:
    cells = sorted({(r["batch"], r["temperature"]) for r in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(4.5 * len(cells), 3.6), squeeze=False)
    width = 0.8 / len(methods)
    labeled: set[str] = set()
    for ax, (batch, temp) in zip(axes[0], cells):
        for j, m in enumerate(methods):
            for i, w in enumerate(workloads):
                r = next((r for r in rows if (r["workload"], r["method"], r["batch"], r["temperature"])
                          == (w, m, batch, temp)), None)
                x = i + j * width
                if r is None or r.get("refused"):
                    ax.text(x, 0.05, "refused" if r else "-", rotation=90, ha="center", va="bottom", fontsize=7)
                    continue
                err = [[r["speedup"] - r["speedup_min"]], [r["speedup_max"] - r["speedup"]]]
                ax.bar(x, r["speedup"], width, yerr=err, capsize=2, color=f"C{j}", label=None if m in labeled else m)
                labeled.add(m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
        ax.set_title(f"batch {batch}, T={temp:g}")
        ax.set_ylabel("speedup over baseline")
    fig.legend(loc="upper right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_acceptance(plt: Any, rows: list[dict[str, Any]], methods: list[str], workloads: list[str],
                     path: str) -> None:
    batch = min(r["batch"] for r in rows)
    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for r in rows:
            rates = r.get("acceptance_rate_per_pos")
            if r["workload"] == w and r["batch"] == batch and rates:
                ax.plot(range(1, len(rates) + 1), rates, marker="o", color=f"C{methods.index(r['method'])}",
                        linestyle=("-", "--", ":", "-.")[temps.index(r["temperature"]) % 4],
                        label=f"{r['method']} T={r['temperature']:g}")
        ax.set_title(f"{w} (batch {batch})")
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(result: dict[str, Any], out: Path, stem: str) -> list[str]:
    """Speedup per method and workload (bars, min-max over passes), acceptance rate per position
    (lines). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["method"] != "baseline"]
    if not rows:
        return []
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    files = [str(out / f"{stem}_speedup.png"), str(out / f"{stem}_acceptance.png")]
    _plot_speedup(plt, rows, methods, workloads, files[0])
    _plot_acceptance(plt, rows, methods, workloads, files[1])
    return files


def write_outputs(result: dict[str, Any], out: str | Path, stem: str, plots: bool = True) -> dict[str, str]:
    """``<stem>.json``, ``<stem>.md`` and the PNG plots under ``out`` (plots skipped, with a note, when
    matplotlib is missing). Returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    if plots:
        try:
            files = write_plots(result, out, stem)
            paths.update({Path(f).stem.rsplit("_", 1)[-1]: f for f in files})
        except ImportError:
            result["notes"].append("plots: skipped, matplotlib is not installed (pip install 'specdec-core[bench]').")
    paths["markdown"] = str(out / f"{stem}.md")
    Path(paths["markdown"]).write_text(markdown_report(result))
    paths["json"] = str(out / f"{stem}.json")
    Path(paths["json"]).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return paths

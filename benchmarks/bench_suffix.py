"""SuffixDecoding (method ``suffix``): proposal cost per step, its share of a decoding step, and
acceptance on a repeated-requests workload against ``ngram``.

Part 1, proposal cost (no model): at each batch size, ``--cached`` earlier requests (prompt of
``--context`` tokens, response of ``--response-len``) first fill the global tree; then a batch of
requests decodes ``--steps`` steps over synthetic documents (Zipf tokens with copies of earlier
spans; with probability ``--repeat`` a request repeats an earlier one). Each step appends what a
perfect verifier keeps (drafts matching the document, plus one). The full ``propose(DraftBatch)``
call is timed: appending the step's tokens to the trees and speculating, Python included. Three ways
of calling the backend run side by side on the same histories (``--paths``): ``wrapper`` (through
``SuffixDecodingCache``'s methods), ``direct`` (its trees called directly, both trees updated before
drafting, the default) and ``deferred`` (option ``defer_global_updates=True``: the global tree's update
in ``while_verifying``, timed apart, as the engine runs it while the target verifies). The drafts are
the same in the first two.

Part 2, bundled model (``specdec.bundled_model("tiny")``, greedy, CPU): prompts are windows of the
running Python's standard-library sources; the same prompts are generated twice through one
``LLM`` (pass 1, then pass 2, "repeated"). Reported per method and pass: mean acceptance length
(1 + accepted / drafting steps), tokens per request per step, propose ms per step and its share
of the whole decoding step (``profile_steps``), and throughput; the baseline (no speculation) runs
once per batch. ``ngram`` is included when its plugin is installed.

    python benchmarks/bench_suffix.py --quick
    python benchmarks/bench_suffix.py                 # batch {1, 32, 256}
    python benchmarks/bench_suffix.py --cost-only --out benchmarks/results/suffix-paths.json

Prints markdown tables; writes JSON (and the tables) under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import random
import statistics
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

import specdec
from specdec import DraftBatch, SamplingParams


# -- part 1: proposal cost on synthetic histories ----------------------------------------------------
def make_document(rng: np.random.Generator, length: int, vocab: int, copy_prob: float = 0.3) -> np.ndarray:
    """``[length]`` int32 tokens: Zipf(1.1) tokens and copies of earlier spans of the same document."""
    p = np.arange(1, vocab + 1, dtype=np.float64) ** -1.1
    p /= p.sum()
    doc = rng.choice(vocab, size=length, p=p).astype(np.int32)
    pos = 64
    while pos < length:
        span = min(int(rng.geometric(1 / 16)), length - pos)
        if rng.random() < copy_prob:
            src = int(rng.integers(0, pos - span)) if pos > span else 0
            doc[pos: pos + span] = doc[src: src + span]
        pos += span
    return doc


PATHS = ("wrapper", "direct", "deferred")


class _Run:
    """One way of calling the backend (see ``PATHS``) on the batch's documents, with its own state."""

    def __init__(self, path: str, args, old: list[np.ndarray], docs: np.ndarray) -> None:
        self.path, self.docs, self.length = path, docs, args.context + args.response_len
        self.proposer = specdec.create_proposer({"method": "suffix", "num_speculative_tokens": args.k})
        if path == "wrapper":
            self.proposer._native = None
        self.proposer.defer_global_updates = path == "deferred"
        for j, doc in enumerate(old):  # earlier requests: their responses fill the global tree
            self.proposer.add_request(f"old{j}", doc[: args.context])
            self.proposer.cache.add_active_response(f"old{j}", doc[args.context:])
            self.proposer.remove_request(f"old{j}")
        batch = len(docs)
        self.rids = [f"r{i}" for i in range(batch)]
        t = time.perf_counter()
        for i, rid in enumerate(self.rids):
            self.proposer.add_request(rid, docs[i, : args.context])
        self.add_us = (time.perf_counter() - t) * 1e6 / batch
        self.num = np.full(batch, args.context + 1, np.int64)  # the prefill's token is the first one sampled
        self.sampled = [[int(docs[i, args.context])] for i in range(batch)]
        self.times, self.hook_times, self.appended, self.drafted = [], [], [], []

    def step(self, k: int) -> None:
        docs, num = self.docs, self.num
        b = DraftBatch(req_ids=self.rids, token_ids=docs, num_tokens=num.copy(), sampled_token_ids=self.sampled,
                       num_speculative_tokens=k, max_model_len=self.length)
        t = time.perf_counter()
        drafts = self.proposer.propose(b)
        t1 = time.perf_counter()
        self.proposer.while_verifying()
        self.times.append(t1 - t)
        self.hook_times.append(time.perf_counter() - t1)
        self.sampled = []
        for i, d in enumerate(drafts.to_lists()):
            truth = docs[i, num[i]: num[i] + len(d)]
            accepted = int(np.argmin(np.append(truth == np.asarray(d, np.int32)[: len(truth)], False)))
            new = docs[i, num[i]: min(num[i] + accepted + 1, self.length - 1)].tolist()
            num[i] += len(new)
            self.sampled.append(new)
            self.drafted.append(len(d))
        self.appended.append(float(np.mean([len(s) for s in self.sampled])))

    def row(self) -> dict:
        batch, times = len(self.docs), self.times
        return {"batch": batch, "path": self.path, "median_ms": statistics.median(times) * 1e3,
                "mean_ms": statistics.fmean(times) * 1e3, "us_per_request": statistics.median(times) * 1e6 / batch,
                "hook_us_per_request": statistics.median(self.hook_times) * 1e6 / batch, "add_request_us": self.add_us,
                "tokens_per_step": statistics.fmean(self.appended), "mean_draft_len": statistics.fmean(self.drafted)}


def proposal_cost(batch: int, args, paths: list[str]) -> list[dict]:
    """One row per path; the paths step in turn (interleaved) over the same documents."""
    rng = np.random.default_rng(args.seed)
    length = args.context + args.response_len
    old = [make_document(rng, length, args.vocab) for _ in range(args.cached)]
    docs = np.stack([old[int(rng.integers(len(old)))] if old and rng.random() < args.repeat
                     else make_document(rng, length, args.vocab) for _ in range(batch)])  # [B, L]
    runs = [_Run(path, args, old, docs.copy()) for path in paths]
    for _ in range(args.steps):
        for run in runs:
            run.step(args.k)
    return [run.row() for run in runs]


# -- part 2: bundled model, repeated requests --------------------------------------------------------
def stdlib_prompts(tokenizer, n: int, prompt_len: int, seed: int) -> list[list[int]]:
    """``n`` windows of ``prompt_len`` tokens, each from a different standard-library file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4096)
    random.Random(seed).shuffle(files)
    prompts = []
    for path in files:
        ids = tokenizer.encode(path.read_text(errors="replace"))
        if len(ids) >= 2 * prompt_len:
            start = random.Random(f"{seed}{path.name}").randrange(len(ids) - prompt_len)
            prompts.append(ids[start: start + prompt_len])
        if len(prompts) == n:
            return prompts
    return [prompts[i % len(prompts)] for i in range(n)]  # fewer files than requests: reuse windows


def run_passes(model: str, config: dict | None, prompts: list[list[int]], args) -> list[dict]:
    llm = specdec.LLM(model, config, dtype="float32", max_num_seqs=len(prompts), profile_steps=True)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    # Warm-up on an unrelated prompt (its short response joins suffix's global tree, as any would).
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    rows, outputs = [], []
    for pass_no in range(1, 2 if config is None else 3):
        llm.step_timer.reset()
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t
        ms = llm.step_timer.per_step_ms()
        step_ms = sum(ms.values())
        drafts = sum(o.metrics.num_drafts for o in outs)
        accepted = sum(o.metrics.num_accepted_tokens for o in outs)
        steps = sum(o.metrics.num_steps for o in outs)
        rows.append({"method": config["method"] if config else "baseline", "pass": pass_no,
                     "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
                     "tokens_per_step": sum(len(o.token_ids) - 1 for o in outs) / max(steps, 1),
                     "propose_ms": ms["propose"], "step_ms": step_ms,
                     "propose_share": ms["propose"] / step_ms if step_ms else 0.0,
                     "tok_s": sum(len(o.token_ids) for o in outs) / wall})
        outputs.append([o.token_ids for o in outs])
    return rows, outputs


def model_rows(batch: int, args, methods: list[str]) -> list[dict]:
    model = specdec.bundled_model("tiny")
    from transformers import AutoTokenizer

    prompts = stdlib_prompts(AutoTokenizer.from_pretrained(model), batch, args.prompt_len, args.seed)
    rows, reference = [], None
    for method in [None, *methods]:
        config = None if method is None else {"method": method, "num_speculative_tokens": args.k}
        got, outputs = run_passes(model, config, prompts, args)
        reference = reference or outputs[0]
        assert all(o == reference for o in outputs), f"{method} changed the greedy output"
        rows += [{"batch": batch, **r, "speedup": r["tok_s"] / (rows[0]["tok_s"] if rows else r["tok_s"])}
                 for r in got]
    return rows


# -- report --------------------------------------------------------------------------------------------
def cost_table(rows: list[dict], args) -> str:
    lines = ["| batch | path | propose ms/step | us/request | + while_verifying us/request | add_request us | "
             "draft len | tokens/step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['path']} | {r['median_ms']:.3f} | {r['us_per_request']:.1f} | "
                     f"{r['hook_us_per_request']:.1f} | {r['add_request_us']:.1f} | {r['mean_draft_len']:.2f} | "
                     f"{r['tokens_per_step']:.2f} |")
    lines.append(f"\nSynthetic histories: prompt {args.context} tokens, vocab {args.vocab}, {args.cached} earlier "
                 f"responses of {args.response_len} tokens in the global tree, {args.repeat:.0%} repeated requests, "
                 f"k={args.k}, default suffix options; median over {args.steps} steps, the paths' steps interleaved.")
    return "\n".join(lines)


def model_table(rows: list[dict], args) -> str:
    lines = ["| batch | method | pass | mean acceptance length | tokens/step | propose ms | step ms | "
             "propose share | tok/s | speedup |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['method']} | {r['pass']} | {r['mean_acceptance_length']:.2f} | "
                     f"{r['tokens_per_step']:.2f} | {r['propose_ms']:.3f} | {r['step_ms']:.2f} | "
                     f"{r['propose_share']:.1%} | {r['tok_s']:.0f} | {r['speedup']:.2f}x |")
    lines.append(f"\nBundled `tiny` model (float32, CPU, {torch.get_num_threads()} threads), greedy, k={args.k}, "
                 f"prompts of {args.prompt_len} tokens from the Python standard library, {args.max_tokens} new "
                 "tokens; pass 2 repeats pass 1's prompts through the same LLM. Outputs are identical to the "
                 "baseline's. step ms: the whole decoding step (propose, target forward, verify, bookkeeping); "
                 "speedup: tok/s over the baseline's at the same batch (prefill included).")
    return "\n".join(lines)


def add_workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The synthetic histories' and the bundled model's workload flags (benchmarks/suffix_deferral.py
    takes the same)."""
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--response-len", type=int, default=512)
    ap.add_argument("--cached", type=int, default=1000)
    ap.add_argument("--repeat", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--model-batch", type=int, nargs="+", default=None, help="batches of part 2 (default --batch)")
    add_workload_arguments(ap)
    ap.add_argument("--quick", action="store_true", help="batch {1, 32}, 200 cached responses, 32 new tokens")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/suffix-<tag>.json)")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS),
                    help="ways of calling the backend to time in part 1 (see above)")
    ap.add_argument("--cost-only", action="store_true", help="part 1 only (no model)")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.cached, args.max_tokens = [1, 32], 200, 32
    methods = ["suffix"]
    infos = specdec.available_methods()
    if "ngram" in infos and infos["ngram"].status == "ok":
        methods.append("ngram")
    else:
        print("ngram is not installed: its column is skipped (pip install -e plugins/ngram)")
    cost = []
    for batch in args.batch:
        cost += proposal_cost(batch, args, args.paths)
        print(json.dumps(cost[-len(args.paths):]), flush=True)
    model = []
    for batch in [] if args.cost_only else args.model_batch or args.batch:
        model += model_rows(batch, args, methods)
        print(json.dumps(model[-len(methods) * 2 - 1:]), flush=True)
    tables = "## Proposal cost\n\n" + cost_table(cost, args)
    if not args.cost_only:
        tables += "\n\n## Repeated requests\n\n" + model_table(model, args)
    print("\n" + tables)
    out = Path(args.out or Path(__file__).parent / "results" / f"suffix-{'quick' if args.quick else 'full'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "arctic_inference": importlib.metadata.version("arctic-inference"),
            "methods": methods}
    out.write_text(json.dumps({"meta": meta, "proposal_cost": cost, "repeated_requests": model}, indent=1))
    out.with_suffix(".md").write_text(tables + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()

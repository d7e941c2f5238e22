"""Per-step proposal latency of the n-gram drafters, side by side in one run.

For each batch size x context length, every request starts from a synthetic document of that
length and decodes ``--steps`` steps. Each step appends what a perfect verifier would keep: the
drafted tokens that match the document's true continuation, plus one. The documents mix
Zipf-distributed tokens with copies of earlier spans (``--copy-prob``), as in RAG, code editing
or summarisation, so drafts are found and accepted at realistic rates. The append schedule is
computed once and replayed for every method, so they all see the same batches (``--check``
also asserts they all propose the same drafts).

Methods (the full ``propose(DraftBatch) -> Drafts`` call is timed, Python included):
    lps          vLLM's algorithm (KMP failure function on the reversed tokens), Numba, 1 thread
    scan         ngram, index="scan", 1 thread
    scan_auto    ngram, index="scan", default threads: all Numba threads once the batch holds >= 2^20
                 tokens, else one
    gpu          ngram_gpu on --device (CPU tensors by default: eager torch, --torch-threads threads;
                 torch.compile on CUDA)
    index        ngram, index="incremental" (update for the appended tokens included)

    python benchmarks/bench_ngram.py --quick
    python benchmarks/bench_ngram.py                  # batch {1,32,256} x context {1k,8k,32k}

Prints a markdown table; writes JSON (and the table) under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import specdec
from specdec import DraftBatch

METHODS = ("lps", "scan", "scan_auto", "gpu", "index")


def make_documents(batch: int, length: int, vocab: int, copy_prob: float, seed: int) -> np.ndarray:
    """``[batch, length]`` int32 token documents: Zipf(1.1) tokens and copies of earlier spans."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    perm = rng.permutation(vocab)
    docs = np.empty((batch, length), np.int32)
    for b in range(batch):
        pos = 0
        fresh = perm[rng.choice(vocab, size=length, p=p)].astype(np.int32)
        while pos < length:
            if pos > 64 and rng.random() < copy_prob:
                span = min(int(rng.geometric(1 / 24)), length - pos)
                src = int(rng.integers(0, pos - span)) if pos > span else 0
                docs[b, pos: pos + span] = docs[b, src: src + span]
                pos += span
            else:
                span = min(int(rng.integers(8, 64)), length - pos)
                docs[b, pos: pos + span] = fresh[pos: pos + span]
                pos += span
    return docs


def make_proposer(method: str, args) -> specdec.Proposer:
    opts = {"num_speculative_tokens": args.k, "prompt_lookup_max": args.max_n}
    if args.min_n is not None:
        opts["prompt_lookup_min"] = args.min_n
    if method == "gpu":
        return specdec.create_proposer({"method": "ngram_gpu", **opts})
    if method == "index":
        return specdec.create_proposer({"method": "ngram", "index": "incremental", **opts})
    threads = {"scan": 1, "lps": 1, "scan_auto": None}[method]
    proposer = specdec.create_proposer({"method": "ngram", "num_threads": threads, **opts})
    if method == "lps":
        min_n, max_n = proposer.min_n, proposer.max_n
        from specdec_ngram import scan

        class _LPS:  # the same proposer surface over vLLM's algorithm
            def add_request(self, *a):
                pass

            def remove_request(self, *a):
                pass

            def propose(self, b):
                active = np.fromiter(map(bool, b.sampled_token_ids), np.bool_, b.batch_size)
                out, num = scan.lps_propose(b.token_ids, b.num_tokens, min_n, max_n, b.num_speculative_tokens,
                                            b.max_model_len, active=active)
                return specdec.Drafts(token_ids=torch.from_numpy(out), num_draft_tokens=num.tolist())

        proposer = _LPS()
    return proposer


def warm_up(proposer, args) -> None:
    """One untimed call on a throwaway batch: compiles whatever the proposer compiles lazily."""
    docs = (np.arange(2 * 300, dtype=np.int32) % 7).reshape(2, 300)
    b = DraftBatch(req_ids=["warm-0", "warm-1"], token_ids=docs, num_tokens=np.array([300, 200]),
                   sampled_token_ids=[[1], [1]], num_speculative_tokens=args.k, max_model_len=400,
                   token_ids_device=torch.from_numpy(docs).to(args.device) if args.device != "cpu" else None)
    for _ in range(2):
        proposer.propose(b)
    for rid in b.req_ids:
        proposer.remove_request(rid)


def schedule(docs: np.ndarray, context: int, steps: int, args) -> list[np.ndarray]:
    """num_tokens before each step: what a perfect verifier accepts, following the scan's drafts."""
    proposer = make_proposer("scan", args)
    batch = docs.shape[0]
    num = np.full(batch, context, np.int64)
    out = [num.copy()]
    for _ in range(steps):
        drafts = proposer.propose(_batch(docs, num, [[1]] * batch, args)).to_lists()
        for i, d in enumerate(drafts):
            truth = docs[i, num[i]: num[i] + len(d)]
            accepted = int(np.argmin(np.append(truth == np.asarray(d, np.int32), False)))
            num[i] += accepted + 1
        out.append(num.copy())
    return out


def _batch(docs, num, sampled, args, device_ids=None) -> DraftBatch:
    return DraftBatch(req_ids=[f"r{i}" for i in range(docs.shape[0])], token_ids=docs, num_tokens=num,
                      sampled_token_ids=sampled, num_speculative_tokens=args.k,
                      max_model_len=docs.shape[1] + 1, token_ids_device=device_ids)


def run_cell(method: str, docs: np.ndarray, sched: list[np.ndarray], args, reference=None) -> dict:
    proposer = make_proposer(method, args)
    warm_up(proposer, args)
    batch = docs.shape[0]
    rids = [f"r{i}" for i in range(batch)]
    t0 = time.perf_counter()
    for i in range(batch):
        proposer.add_request(rids[i], docs[i, : sched[0][i]])
    add_s = time.perf_counter() - t0
    device_ids = torch.from_numpy(docs).to(args.device) if method == "gpu" and args.device != "cpu" else None
    times, drafts = [], []
    deadline = time.perf_counter() + args.max_seconds
    stateless = method != "index"
    for step in range(1, len(sched)):
        num = sched[step]
        sampled = [docs[i, sched[step - 1][i]: num[i]].tolist() for i in range(batch)]
        b = _batch(docs, num, sampled, args, device_ids)
        t = time.perf_counter()
        d = proposer.propose(b)
        times.append(time.perf_counter() - t)
        if args.check:
            drafts.append(d.to_lists())
        if stateless and step >= 3 and time.perf_counter() > deadline:
            break
    if args.check and reference is not None:
        n = min(len(drafts), len(reference))
        assert drafts[:n] == reference[:n], f"{method} proposed different drafts"
    res = {"median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3,
           "steps": len(times), "add_ms_per_request": add_s * 1e3 / batch}
    index = getattr(proposer, "_index", None)
    if index is not None:
        res["index_mb"] = index.nbytes() / 2**20
    return res, drafts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 32768])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-n", type=int, default=4)
    ap.add_argument("--min-n", type=int, default=None, help="default: vLLM's rule, equal to --max-n")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=3.0, help="time budget per stateless cell")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--copy-prob", type=float, default=0.3)
    ap.add_argument("--device", default="cpu", help="device of ngram_gpu's token ids")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch intra-op threads for ngram_gpu on the CPU (default 1: on a small shared "
                         "machine, waiting for a busy core to run the second thread costs milliseconds)")
    ap.add_argument("--check", action="store_true", help="assert every method drafts the same tokens")
    ap.add_argument("--quick", action="store_true", help="batch {1,32} x context {1k,8k}, 16 steps")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ngram-<tag>.json)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.batch, args.context, args.steps = [1, 32], [1024, 8192], 16
    if args.device == "cpu":
        torch.set_num_threads(args.torch_threads)
    rows = []
    for context in args.context:
        for batch in args.batch:
            docs_ctx = make_documents(batch, context + args.steps * (args.k + 1), args.vocab, args.copy_prob,
                                      args.seed)
            sched = schedule(docs_ctx, context, args.steps, args)
            appended = float(np.mean((sched[-1] - sched[0]) / args.steps))
            row = {"batch": batch, "context": context, "tokens_per_step": appended}
            reference = None
            for method in args.methods:
                row[method], drafts = run_cell(method, docs_ctx, sched, args, reference)
                if reference is None or len(drafts) > len(reference):
                    reference = drafts
            rows.append(row)
            print(_line(row, args.methods), flush=True)
    table = _table(rows, args.methods, args)
    print("\n" + table)
    tag = "quick" if args.quick else "full"
    out = Path(args.out or Path(__file__).parent / "results" / f"ngram-{tag}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(table + "\n")
    print(f"\nwrote {out} and {out.with_suffix('.md')}")


def _fmt(cell: dict) -> str:
    spiky = cell["mean_ms"] > 1.5 * cell["median_ms"]
    return f"{cell['median_ms']:.3f}" + (f" ({cell['mean_ms']:.3f})" if spiky else "")


def _line(row: dict, methods) -> str:
    return f"B={row['batch']} ctx={row['context']}: " + ", ".join(f"{m} {_fmt(row[m])}" for m in methods)


def _table(rows: list[dict], methods, args) -> str:
    min_n = args.min_n if args.min_n is not None else args.max_n
    head = [f"ms/step, k={args.k}, n in [{min_n}, {args.max_n}]", "tokens/step", *methods]
    if "lps" in methods and "index" in methods:
        head.append("lps / index")
    lines = ["| batch x context | " + " | ".join(head[1:]) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r['batch']} x {r['context'] // 1024}k", f"{r['tokens_per_step']:.2f}"]
        cells += [_fmt(r[m]) for m in methods]
        if "lps" in methods and "index" in methods:
            cells.append(f"{r['lps']['median_ms'] / r['index']['median_ms']:.0f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\n{head[0]}; median over steps (mean in parentheses when > 1.5x the median: it "
                 "includes the index's occasional table growth). tokens/step: tokens appended per request "
                 "per step (accepted drafts + 1).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

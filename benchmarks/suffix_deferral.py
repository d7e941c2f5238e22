"""What the option ``defer_global_updates`` of method ``suffix`` costs and saves (issue 18).

Part 1, synthetic histories (``benchmarks/bench_suffix.py``'s documents, earlier responses in the
global tree, half the requests repeating one): the default proposer drives the histories, each
step keeping what a perfect verifier keeps (the draft's prefix matching the document, plus one); a
proposer with the option is fed the same histories. Per request and step: whether the two drafts
differ, and how many tokens each would have had accepted. Both ``propose`` calls are timed,
interleaved; the deferred proposer's ``while_verifying`` apart (it runs while the target verifies).

Part 2, bundled ``tiny`` model (greedy, CPU): standard-library prompts generated twice through one
``LLM`` with and without the option. Per pass: mean acceptance length (1 + accepted / drafts) and,
for the option, how many of the engine's drafts differ from arctic-inference's own
``SuffixDecodingCache.speculate`` on the same tokens (replayed by hand, vLLM's order).

    .venv/bin/python benchmarks/suffix_deferral.py --out benchmarks/results/suffix-defer.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import numpy as np

import specdec
from specdec import DraftBatch, SamplingParams
from specdec_suffix.reference import record_events, reference_drafts

ROOT = Path(__file__).resolve().parents[1]


def _bench_suffix():
    """benchmarks/bench_suffix.py as a module: its documents and prompts, not copies of them."""
    spec = importlib.util.spec_from_file_location("bench_suffix", ROOT / "benchmarks" / "bench_suffix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _proposer(args, old: list[np.ndarray], defer: bool):
    proposer = specdec.create_proposer({"method": "suffix", "num_speculative_tokens": args.k,
                                        "defer_global_updates": defer})
    for j, doc in enumerate(old):  # earlier requests: their responses fill the global tree
        proposer.add_request(f"old{j}", doc[: args.context])
        proposer.cache.add_active_response(f"old{j}", doc[args.context:])
        proposer.remove_request(f"old{j}")
    return proposer


def _accepted(doc: np.ndarray, start: int, draft: list[int]) -> int:
    truth = doc[start: start + len(draft)]
    return int(np.argmin(np.append(truth == np.asarray(draft, np.int32)[: len(truth)], False)))


def synthetic(batch: int, args, bench) -> dict:
    rng = np.random.default_rng(args.seed)
    length = args.context + args.response_len
    old = [bench.make_document(rng, length, args.vocab) for _ in range(args.cached)]
    docs = np.stack([old[int(rng.integers(len(old)))] if rng.random() < args.repeat
                     else bench.make_document(rng, length, args.vocab) for _ in range(batch)])  # [B, L]
    exact, deferred = _proposer(args, old, False), _proposer(args, old, True)
    rids = [f"r{i}" for i in range(batch)]
    for i, rid in enumerate(rids):
        exact.add_request(rid, docs[i, : args.context])
        deferred.add_request(rid, docs[i, : args.context])
    num = np.full(batch, args.context + 1, np.int64)  # the prefill's token is the first one sampled
    sampled = [[int(docs[i, args.context])] for i in range(batch)]
    t_exact, t_deferred, t_hook = [], [], []
    n = differ = acc_exact = acc_deferred = 0
    for step in range(args.steps):
        b = DraftBatch(req_ids=rids, token_ids=docs, num_tokens=num.copy(), sampled_token_ids=sampled,
                       num_speculative_tokens=args.k, max_model_len=length)
        runs = [(exact, t_exact), (deferred, t_deferred)][:: 1 if step % 2 else -1]  # alternate who goes first
        out = {}
        for proposer, times in runs:
            t = time.perf_counter()
            out[id(proposer)] = proposer.propose(b).to_lists()
            times.append(time.perf_counter() - t)
            if proposer is deferred:
                t = time.perf_counter()
                proposer.while_verifying()
                t_hook.append(time.perf_counter() - t)
        sampled = []
        for i, (d, e) in enumerate(zip(out[id(exact)], out[id(deferred)])):
            a = _accepted(docs[i], num[i], d)
            n, differ = n + 1, differ + (d != e)
            acc_exact, acc_deferred = acc_exact + a, acc_deferred + _accepted(docs[i], num[i], e)
            new = docs[i, num[i]: min(num[i] + a + 1, length - 1)].tolist()
            num[i] += len(new)
            sampled.append(new)
    us = 1e6 / batch
    return {"batch": batch, "drafts": n, "drafts_differing": differ,
            "accepted_per_step_exact": acc_exact / n, "accepted_per_step_deferred": acc_deferred / n,
            "propose_us_per_request_exact": statistics.median(t_exact) * us,
            "propose_us_per_request_deferred": statistics.median(t_deferred) * us,
            "hook_us_per_request_deferred": statistics.median(t_hook) * us}


def _differing(events: list[tuple]) -> dict[int, tuple[int, int]]:
    """Pass -> (drafts, drafts differing from SuffixDecodingCache.speculate on the same tokens), counting
    the rows where the reference drafts (see :func:`specdec_suffix.reference.reference_drafts`)."""
    counts = {}
    for pass_no, _, drafts, expected in reference_drafts(events):
        for d, e in zip(drafts, expected):
            if e is not None:
                n, differ = counts.get(pass_no, (0, 0))
                counts[pass_no] = (n + 1, differ + (d != e))
    return counts


def bundled(batch: int, args, bench) -> list[dict]:
    from transformers import AutoTokenizer

    model = specdec.bundled_model("tiny")
    prompts = bench.stdlib_prompts(AutoTokenizer.from_pretrained(model), batch, args.prompt_len, args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rows, reference = [], {}
    for defer in (False, True):
        llm = specdec.LLM(model, {"method": "suffix", "num_speculative_tokens": args.k, "defer_global_updates": defer},
                          dtype="float32", max_num_seqs=batch)
        events, got = record_events(llm), []
        for pass_no in (1, 2):
            events.append(("pass", pass_no))
            outs = llm.generate(prompts, params)
            tokens = [o.token_ids for o in outs]
            assert reference.setdefault(pass_no, tokens) == tokens, "the option changed the greedy output"
            drafts = sum(o.metrics.num_drafts for o in outs)
            accepted = sum(o.metrics.num_accepted_tokens for o in outs)
            got.append({"batch": batch, "defer_global_updates": defer, "pass": pass_no,
                        "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
                        "steps": sum(o.metrics.num_steps for o in outs)})
        counts = _differing(events)
        for row in got:
            row["drafts"], row["drafts_differing"] = counts.get(row["pass"], (0, 0))
        rows += got
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--model-batch", type=int, nargs="*", default=[1, 8],
                    help="bundled-model batches (none: part 1 only)")
    bench = _bench_suffix()
    bench.add_workload_arguments(ap)
    ap.add_argument("--out", default=None, help="JSON path (a .md with the tables beside it)")
    args = ap.parse_args()
    result = {"args": vars(args), "synthetic": [], "bundled": []}
    for batch in args.batch:
        result["synthetic"].append(synthetic(batch, args, bench))
        print(json.dumps(result["synthetic"][-1]), flush=True)
    for batch in args.model_batch:
        result["bundled"] += bundled(batch, args, bench)
        print(json.dumps(result["bundled"][-4:]), flush=True)
    md = _tables(result)
    print("\n" + md)
    if args.out:
        out = Path(args.out)
        out.write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(md + "\n")


def _tables(result: dict) -> str:
    a = result["args"]
    lines = ["## Synthetic histories", "", "| batch | drafts differing | accepted/draft, default | accepted/draft, "
             "deferred | propose us/request, default | propose us/request, deferred | + while_verifying us/request |",
             "|---|---|---|---|---|---|---|"]
    for r in result["synthetic"]:
        lines.append(f"| {r['batch']} | {r['drafts_differing']}/{r['drafts']} "
                     f"({r['drafts_differing'] / r['drafts']:.1%}) | {r['accepted_per_step_exact']:.3f} | "
                     f"{r['accepted_per_step_deferred']:.3f} | {r['propose_us_per_request_exact']:.1f} | "
                     f"{r['propose_us_per_request_deferred']:.1f} | {r['hook_us_per_request_deferred']:.1f} |")
    lines += ["", f"Prompt {a['context']} tokens, vocab {a['vocab']}, {a['cached']} earlier responses of "
              f"{a['response_len']} tokens in the global tree, {a['repeat']:.0%} repeated requests, k={a['k']}, "
              f"{a['steps']} steps; the default proposer's drafts drive the histories (perfect verifier), the "
              "deferred one drafts on the same histories; accepted/draft: the draft's prefix matching the "
              "document; times are medians over the steps, the two proposers interleaved.", "",
              "## Bundled tiny model (greedy, CPU)", "",
              "| batch | defer_global_updates | pass | mean acceptance length | decode steps | drafts differing "
              "from arctic-inference's |", "|---|---|---|---|---|---|"]
    for r in result["bundled"]:
        lines.append(f"| {r['batch']} | {r['defer_global_updates']} | {r['pass']} | {r['mean_acceptance_length']:.3f} "
                     f"| {r['steps']} | {r['drafts_differing']}/{r['drafts']} |")
    lines += ["", f"Prompts of {a['prompt_len']} tokens from the Python standard library, {a['max_tokens']} new "
              f"tokens, k={a['k']}; pass 2 repeats pass 1's prompts through the same LLM. Greedy outputs are "
              "identical with and without the option."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""The target's fused forward on the CPU (issue 28 there): every engine twice, with ``fused_forward=True``
(:class:`specdec.fused.FusedLlama`'s torch ops, the CPU's default since s44) and ``fused_forward=False`` (Hugging
Face's layers), over e2e's workloads, in interleaved timed passes of one process (the order rotating each round, each
engine's fastest pass kept). Prints the baseline's tok/s each way, each method's speedup over the baseline of its own
forward, and checks that the two forwards give the same tokens (greedy, float32).

    python benchmarks/cpu_forward.py --batch 1 --methods ngram:4 suffix:4 draft_model:3 eagle3:3
    python benchmarks/cpu_forward.py --batch 8 --prompts 16 --temperature 0.8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec import LLM, bundled_model
from specdec_tools.bench import build_workloads
from specdec_tools.bench.passes import run_pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8, help="requests a workload (at least the batch)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded sampling")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timed passes an engine")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--workloads", nargs="+", default=["completion", "edit", "repeated"])
    ap.add_argument("--methods", nargs="*", default=[], help="NAME:K, each under speculation_policy='fixed'")
    ap.add_argument("--policy", default="fixed", choices=["fixed", "auto"])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = bundled_model("tiny")
    kw = dict(device="cpu", dtype="float32", max_num_seqs=args.batch, cpu_threads=None)
    engines: dict[tuple[str, bool], LLM] = {}
    for fused in (True, False):
        engines[("baseline", fused)] = LLM(model, fused_forward=fused, **kw)
        for m in args.methods:
            name, k = m.split(":")
            config = {"method": name, "num_speculative_tokens": int(k), "speculation_policy": args.policy}
            engines[(m, fused)] = LLM(model, config, fused_forward=fused, **kw)
    if not all(e.target.fused is not None for (_, fused), e in engines.items() if fused):
        raise SystemExit("fused_forward=True did not fuse the bundled tiny target's forward")
    tokenizer = engines[("baseline", True)].tokenizer
    rows = []
    for wl in build_workloads(tokenizer, args.workloads, args.prompts, args.batch, args.prompt_tokens):
        outs = {key: run_pass(e, wl, args.temperature, args.max_tokens, 0)[0] for key, e in engines.items()}
        if args.temperature == 0 and outs[("baseline", True)] != outs[("baseline", False)]:
            differ = sum(a != b for a, b in zip(outs[("baseline", True)], outs[("baseline", False)]))
            print(f"{wl.name}: {differ} of {len(outs[('baseline', True)])} requests differ between the forwards")
        best = dict.fromkeys(engines, float("inf"))
        keys = list(engines)
        for r in range(args.repeats):
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                best[key] = min(best[key], run_pass(engines[key], wl, args.temperature, args.max_tokens, 0)[1])
        tokens = sum(len(o) for o in outs[("baseline", True)])
        row = {"workload": wl.name, "batch": args.batch, "temperature": args.temperature,
               "baseline_tok_s": {"fused": tokens / best[("baseline", True)],
                                  "hf_layers": tokens / best[("baseline", False)]},
               "fused_over_hf": best[("baseline", False)] / best[("baseline", True)],
               "speedup": {m: {"fused": best[("baseline", True)] / best[(m, True)],
                               "hf_layers": best[("baseline", False)] / best[(m, False)]} for m in args.methods}}
        rows.append(row)
        methods = ", ".join(f"{m} {s['fused']:.2f}x / {s['hf_layers']:.2f}x" for m, s in row["speedup"].items())
        print(f"{wl.name}, batch {args.batch}, T = {args.temperature}: baseline {row['baseline_tok_s']['fused']:.0f} "
              f"tok/s fused / {row['baseline_tok_s']['hf_layers']:.0f} HF layers ({row['fused_over_hf']:.2f}x)"
              + (f"; over the baseline of the same forward (fused / HF layers): {methods}" if methods else ""),
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

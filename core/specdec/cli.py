"""Command line: ``specdec generate``, ``specdec methods`` and ``specdec bench``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["main"]


def _parse_option(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--option {text!r} must look like key=value, e.g. prompt_lookup_max=4")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding for Hugging Face models.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, with or without speculative decoding")
    gen.add_argument("prompts", nargs="*", help="prompt strings (or use --file)")
    gen.add_argument("--file", help="read prompts from this file, one per line ('-' for stdin)")
    gen.add_argument("--model", help="local model directory (default: the bundled 'tiny' model)")
    gen.add_argument("--method", help="speculative method, e.g. ngram (see `specdec methods`); none = baseline")
    gen.add_argument("-k", "--num-speculative-tokens", type=int, dest="k", help="drafts per step")
    gen.add_argument("--config", help="speculative config file (JSON or YAML, flat dict in vLLM's style)")
    gen.add_argument("--option", action="append", type=_parse_option, default=[], metavar="KEY=VALUE",
                     help="a method option, repeatable (values parsed as JSON when possible)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--device", default=None)
    gen.add_argument("--max-model-len", type=int, default=None)
    gen.add_argument("--max-num-seqs", type=int, default=8)
    gen.add_argument("--threads", type=int, default=None,
                     help="torch intra-op threads on CPU (default: torch's; 1 is often fastest for small models)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per output")
    gen.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    sub.add_parser("methods", help="list installed methods and plugin status")

    from specdec.bench import add_arguments

    bench = sub.add_parser("bench", help="tokens/s and acceptance of each method against the baseline and "
                           "Hugging Face generate() (small CPU run on the bundled models by default)",
                           description="A small version of benchmarks/e2e.py: held-out stdlib workloads, "
                           "greedy outputs checked against the baseline, then timed; prints a markdown table.")
    add_arguments(bench, small=True)
    return parser


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompts)
    if args.file:
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
        prompts += [line for line in text.splitlines() if line.strip()]
    elif not prompts and not sys.stdin.isatty():
        prompts = [line for line in sys.stdin.read().splitlines() if line.strip()]
    if not prompts:
        raise SystemExit("specdec generate: no prompt given; pass prompts as arguments, --file FILE, or on stdin.")
    return prompts


def _speculative_config(args: argparse.Namespace) -> dict[str, Any] | None:
    config: dict[str, Any] = {}
    if args.config:
        from specdec.config import SpeculativeConfig

        config = SpeculativeConfig.from_file(args.config).to_dict()
        config = {k: v for k, v in config.items() if v is not None}
    if args.method:
        config["method"] = args.method
    if args.k is not None:
        config["num_speculative_tokens"] = args.k
    config.update(dict(args.option))
    if not config:
        return None
    if "method" not in config:
        raise SystemExit("specdec generate: -k/--option need --method (or a --config with a method).")
    return config


def _generate(args: argparse.Namespace) -> int:
    from specdec import LLM, SamplingParams, bundled_model

    prompts = _read_prompts(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    model = args.model or bundled_model("tiny")
    llm = LLM(model, _speculative_config(args), dtype=args.dtype, device=args.device,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                            max_tokens=args.max_tokens)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.no_progress)
    elapsed = time.perf_counter() - start
    for out in outputs:
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason,
                              "acceptance_length": round(out.metrics.acceptance_length, 3)}))
        else:
            print(f"--- prompt: {out.prompt!r}")
            print(f"{out.prompt}{out.text}")
            print(f"--- finish_reason={out.finish_reason}, tokens={len(out.token_ids)}, "
                  f"acceptance_length={out.metrics.acceptance_length:.2f}")
    total = sum(len(o.token_ids) for o in outputs)
    stats = llm.stats
    method = llm.speculative_config.method if llm.speculative_config else "none (baseline)"
    print(f"method: {method}; generated {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tokens/s)",
          file=sys.stderr if args.json else sys.stdout)
    if llm.speculative_config is not None:
        rates = ", ".join(f"{r:.2f}" for r in stats.acceptance_rate_per_pos)
        print(f"mean acceptance length: {stats.mean_acceptance_length:.2f}; draft acceptance rate: "
              f"{stats.draft_acceptance_rate:.1%}; per-position acceptance: [{rates}]; drafts: {stats.num_drafts}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _methods() -> int:
    from specdec import available_methods

    methods = available_methods()
    if not methods:
        print("No specdec methods installed. Install one with: pip install specdec-plugin-<name>")
        return 0
    rows = [("method", "plugin", "distribution", "version", "status")]
    for name, info in methods.items():
        status = info.status if info.status == "ok" else f"error: {info.error}"
        rows.append((name, info.plugin, info.distribution or "-", info.version or "-", status))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    return 0


def _bench(args: argparse.Namespace) -> int:
    from specdec.bench import markdown_report, run_benchmark, settings_from_args, write_outputs

    settings = settings_from_args(args)
    result = run_benchmark(settings)
    paths = write_outputs(result, settings.out, settings.name, settings.plots)
    print(markdown_report(result))
    print("wrote " + ", ".join(paths.values()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``specdec`` command."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "methods":
            return _methods()
        if args.command == "bench":
            return _bench(args)
        return _generate(args)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Command line: ``specdec generate``, ``specdec methods``, ``specdec bench``, ``specdec train`` and
``specdec extract`` (the last from the extract_hs plugin, imported only when that command runs). The train and
extract commands live in :mod:`specdec.cli_train`; what the commands share, in :mod:`specdec.cli_common`.

Every mistake a user can make on the command line ends in one line on stderr,
``specdec <command>: error: <what, the rule, the fix>``, and exit status 2; ``--debug`` shows the
traceback instead. Ctrl-C exits with 130 and no traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from specdec.cli_common import (
    CliError,
    Parser,
    add_debug,
    check_device,
    check_min,
    loading_bars,
    option_value,
    prepare_out,
)
from specdec.cli_train import add_extract, add_train, run_train

__all__ = ["main"]

# Config keys that have their own flag: --option refuses them, so one value cannot silently win over another.
_CORE_KEY_FLAGS = {"method": "--method", "num_speculative_tokens": "-k/--num-speculative-tokens",
                   "model": "--draft-model", "on_bad_drafts": "--on-bad-drafts"}
# Below this many parameters one CPU thread beats several: the matmuls are too small to split, and
# with other work on the machine extra threads mostly wait (bundled tiny model: 25 tok/s default, 68 with 1).
_ONE_THREAD_PARAMS = 50_000_000
# Exceptions that are the user's input being wrong: their message is the whole story.
_INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, OSError, LookupError, MemoryError,
                                                  RuntimeError)


# ---------------------------------------------------------------- parser


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--option {text!r} is invalid: it must look like key=value with key a "
                                         "method option name, e.g. --option prompt_lookup_max=4")
    value = option_value(raw)
    if key in _CORE_KEY_FLAGS:
        raise argparse.ArgumentTypeError(f"--option {text!r} is refused: {key} is a core key with its own flag; "
                                         f"use {_CORE_KEY_FLAGS[key].split('/')[-1]} {raw}")
    return key, value


def _add_generate(sub: Any) -> None:
    gen = sub.add_parser(
        "generate", help="generate text, with or without speculative decoding",
        description="Generate text with a local Hugging Face model. Config precedence: --config FILE gives "
        "the keys it sets; --method, -k, --draft-model, --on-bad-drafts and --option override them; defaults fill "
        "the rest. Core keys (method, num_speculative_tokens, model, on_bad_drafts) only come from their flags "
        "or the file, never from --option. When --method changes the file's method, the file may not set "
        "options the new method lacks (an error names them). On CPU, the default --threads is 1 for models under "
        "50M parameters (faster for the bundled ones) and torch's default for larger ones.")
    add_debug(gen, argparse.SUPPRESS)
    gen.add_argument("prompts", nargs="*", help="prompt strings (or use --file, or stdin)")
    gen.add_argument("--file", help="read prompts from this text file, one per line ('-' for stdin)")
    gen.add_argument("--model", help="local model directory (default: the bundled 'tiny' model)")
    gen.add_argument("--trust-remote-code", action="store_true",
                     help="let transformers run Python files shipped in the model directory (off: such models "
                     "are refused)")
    gen.add_argument("--ignore-draft-probs", action="store_true",
                     help="verify every draft as one-hot, ignoring the probs a plugin reports (lossless whatever "
                     "the plugin does; less acceptance for plugins that sample honestly)")
    gen.add_argument("--method", help="speculative method, e.g. ngram (see `specdec methods`); overrides "
                     "--config's; omit (or 'none', without --config/-k/--option) for the baseline")
    gen.add_argument("-k", "--num-speculative-tokens", type=int, dest="k", help="drafts per step (int >= 1)")
    gen.add_argument("--draft-model", help="draft model / head checkpoint directory (the config key 'model')")
    gen.add_argument("--on-bad-drafts", choices=("error", "drop"), help="what a malformed draft does "
                     "(default: error)")
    gen.add_argument("--config", help="speculative config file (.json, .yaml or .yml; a flat dict in vLLM's "
                     "style); --method, -k, --draft-model, --on-bad-drafts and --option override the keys it sets")
    gen.add_argument("--option", action="append", type=_parse_option, default=[], metavar="KEY=VALUE",
                     help="a method option, repeatable (values parsed as JSON when possible: true, 4, 0.5); "
                     "core keys are refused, use their flags")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, help="0 or -1 = off (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off (default)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-tokens", type=int, default=64, help="new tokens per prompt (int >= 1)")
    gen.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, "
                     "bfloat16, float16")
    gen.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    gen.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (int >= 2)")
    gen.add_argument("--max-num-seqs", type=int, default=8, help="requests decoded together (int >= 1)")
    gen.add_argument("--threads", type=int, default=None,
                     help="torch intra-op threads on CPU (int >= 1; default: 1 for models under 50M "
                     "parameters, torch's default for larger ones)")
    gen.add_argument("--tensor-parallel-size", type=int, default=1,
                     help="shard the target over N ranks (run under `torchrun --nproc-per-node N -m specdec.cli "
                     "generate ...`; needs accelerate); rank 0 prints")
    gen.add_argument("--json", action="store_true", help="print one JSON object per output")
    gen.add_argument("--no-progress", action="store_true",
                     help="hide the progress bars (generation and transformers' weight loading)")


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Speculative decoding for Hugging Face models.")
    add_debug(parser, False)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    methods = sub.add_parser("methods", help="list installed methods and plugin status")
    add_debug(methods, argparse.SUPPRESS)
    bench = sub.add_parser("bench", help="tokens/s and acceptance of each method against the baseline and "
                           "Hugging Face generate() (small CPU run on the bundled models by default)",
                           description="A small version of benchmarks/e2e.py: held-out stdlib workloads, "
                           "greedy outputs checked against the baseline, then timed; prints a markdown table. "
                           "Methods named in --methods must be installed.", populate=_add_bench_arguments)
    add_debug(bench, argparse.SUPPRESS)
    add_train(sub)
    add_extract(sub)
    return parser


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's flags, from specdec_tools: imported only when `specdec bench` is parsed or helped."""
    from specdec_tools.bench import add_arguments

    add_arguments(parser, small=True)


# ---------------------------------------------------------------- checks


def _check_generate_flags(args: argparse.Namespace) -> None:
    """The numeric flags, before anything is loaded."""
    check_min("--threads", args.threads, 1, " (torch CPU threads); leave it out for the default")
    check_min("--max-tokens", args.max_tokens, 1, " (new tokens per prompt)")
    check_min("--max-num-seqs", args.max_num_seqs, 1, " (requests decoded together)")
    check_min("--max-model-len", args.max_model_len, 2, " (prompt + output tokens); leave it out for the model's")
    check_min("-k", args.k, 1, " (drafts per step); leave out --method for no speculation")
    check_min("--top-k", args.top_k, -1, "; 0 or -1 turn it off")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise CliError(f"--temperature {args.temperature} is invalid: it must be a finite number >= 0 (0 = greedy), "
                       "e.g. --temperature 0.8.")
    if not 0 < args.top_p <= 1:
        raise CliError(f"--top-p {args.top_p} is invalid: it must be in (0, 1]; --top-p 1 turns it off.")
    check_device(args.device)


# ---------------------------------------------------------------- generate


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    p = Path(path)
    fix = "pass a UTF-8 text file with one prompt per line, or --file - for stdin"
    if p.is_dir():
        raise CliError(f"--file {path!r} is a directory: {fix}.")
    if not p.exists():
        raise CliError(f"--file {path!r} does not exist: {fix}.")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"--file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): {fix}.") from None
    except OSError as exc:
        raise CliError(f"--file {path!r} cannot be read ({exc.strerror or exc}): {fix}.") from None


def _read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompts)
    if args.file:
        prompts += [line for line in _read_text(args.file).splitlines() if line.strip()]
    elif not prompts and not sys.stdin.isatty():
        prompts = [line for line in sys.stdin.read().splitlines() if line.strip()]
    if not prompts:
        raise CliError("no prompt given; pass prompts as arguments, --file FILE, or on stdin.")
    return prompts


def _flag_keys(args: argparse.Namespace) -> dict[str, Any]:
    """The core keys given by their own flags (only the flags given: a default never counts as set)."""
    given = {"method": args.method, "num_speculative_tokens": args.k, "model": args.draft_model,
             "on_bad_drafts": args.on_bad_drafts}
    return {k: v for k, v in given.items() if v is not None}


def _check_method_switch(path: str, file_keys: dict[str, Any], method: str) -> None:
    """--method replacing the file's method: the file's own options must exist for the new method."""
    from specdec.config import CORE_KEYS, option_names

    valid = option_names(method)
    stale = sorted(k for k in file_keys if k not in CORE_KEYS and k not in valid)
    if stale:
        raise CliError(f"--method {method} replaces method {file_keys['method']!r} of --config {path!r}, which also "
                       f"sets {stale}: option(s) {method} does not have (its options: {', '.join(valid) or 'none'}). "
                       "Remove them from the file, or leave out --method.")


def _speculative_config(args: argparse.Namespace) -> Any:
    """The SpeculativeConfig the flags ask for (None: the baseline): the file's keys, then the flags."""
    from specdec.config import SpeculativeConfig, read_config_file

    flags = _flag_keys(args)
    options = dict(args.option)
    if flags.get("method") == "none":
        if args.config or options or len(flags) > 1:
            raise CliError("--method none is the baseline: it takes no --config, -k, --draft-model, "
                           "--on-bad-drafts or --option; drop them, or name a method.")
        return None
    file_keys = read_config_file(args.config) if args.config else {}
    if not (file_keys or flags or options):
        return None
    method = flags.get("method", file_keys.get("method"))
    if method is None:
        raise CliError("-k, --draft-model, --on-bad-drafts and --option need --method (or a --config that sets "
                       "method), e.g. --method ngram.")
    if args.config and file_keys.get("method") not in (None, method):
        _check_method_switch(args.config, file_keys, method)
    return SpeculativeConfig.from_dict({**file_keys, **flags, **options})


def _model_params(llm: Any) -> int | None:
    module = getattr(llm.target, "hf_model", None)
    return sum(p.numel() for p in module.parameters()) if module is not None else None


def _default_threads(args: argparse.Namespace, llm: Any) -> None:
    """Without --threads, one thread on CPU for a model under _ONE_THREAD_PARAMS parameters."""
    if args.threads is not None or llm.target.device.type != "cpu":
        return
    params = _model_params(llm)
    if params is not None and params < _ONE_THREAD_PARAMS:
        import torch

        torch.set_num_threads(1)


def _print_outputs(args: argparse.Namespace, llm: Any, outputs: list[Any], elapsed: float) -> None:
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
    summary = sys.stderr if args.json else sys.stdout
    print(f"method: {method}; generated {total} tokens in {elapsed:.2f} s ({total / elapsed:.1f} tokens/s)",
          file=summary)
    if llm.speculative_config is not None:
        per_pos = stats.acceptance_rate_per_pos
        rates = ", ".join(f"{r:.2f}" for r in per_pos[:16]) + (f", ... ({len(per_pos)} positions)"
                                                                  if len(per_pos) > 16 else "")
        print(f"mean acceptance length: {stats.mean_acceptance_length:.2f}; draft acceptance rate: "
              f"{stats.draft_acceptance_rate:.1%}; per-position acceptance: [{rates}]; drafts: {stats.num_drafts}",
              file=summary)


def _generate(args: argparse.Namespace) -> int:
    _check_generate_flags(args)
    prompts = _read_prompts(args)
    config = _speculative_config(args)  # a wrong method or option fails here, before the model loads
    from specdec import LLM, SamplingParams, bundled_model

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                            max_tokens=args.max_tokens)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    with loading_bars(not args.no_progress):
        llm = LLM(args.model or bundled_model("tiny"), config, dtype=args.dtype, device=args.device,
                  max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  trust_remote_code=args.trust_remote_code, trust_draft_probs=not args.ignore_draft_probs,
                  tensor_parallel_size=args.tensor_parallel_size)
    _default_threads(args, llm)
    from specdec.tp import tp_rank

    first = tp_rank() == 0  # under tensor parallelism every rank generates the same tokens: rank 0 prints
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.no_progress and first)
    if first:
        _print_outputs(args, llm, outputs, time.perf_counter() - start)
    if args.tensor_parallel_size > 1:
        from specdec.tp import shutdown

        shutdown()
    return 0


# ---------------------------------------------------------------- methods, bench


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
    from specdec_tools.bench import markdown_report, run_benchmark, settings_from_args, write_outputs

    check_device(args.device)
    settings = settings_from_args(args)
    prepare_out(settings.out)
    with loading_bars(settings.progress):
        result = run_benchmark(settings)
    paths = write_outputs(result, settings.out, settings.name, settings.plots)
    print(markdown_report(result))
    print("wrote " + ", ".join(paths.values()))
    return 0


# ---------------------------------------------------------------- entry point


def _error_line(exc: BaseException) -> str:
    """``exc`` as one line; exceptions that are not plain input errors keep their type name."""
    text = " ".join(str(exc).split())
    if isinstance(exc, MemoryError):
        return f"out of memory ({text or 'MemoryError'}): lower --max-num-seqs or --max-model-len."
    if isinstance(exc, CliError) or (isinstance(exc, _INPUT_ERRORS) and text):
        return text
    return f"{type(exc).__name__}: {text or 'no message'} (rerun with --debug for the traceback)"


def _run(args: argparse.Namespace) -> int:
    if args.command == "methods":
        return _methods()
    if args.command == "bench":
        return _bench(args)
    if args.command == "train":
        return run_train(args)
    if args.command == "extract":
        return int(args.extract_run(args))
    return _generate(args)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    """Warnings as one line, ``specdec: warning: ...``, like the CLI's errors (no source line)."""
    print(f"specdec: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``specdec`` command: 0 on success, 2 on an error (one line on stderr;
    ``--debug`` raises it instead), 130 on Ctrl-C."""
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (already printed on one line), or --help
        return exc.code if isinstance(exc.code, int) else 2
    try:
        with warnings.catch_warnings():  # restores the caller's warning display afterwards
            if not args.debug:
                warnings.showwarning = _one_line_warning
            return _run(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        return 130
    except Exception as exc:  # the CLI boundary: the user gets one line, --debug gets the traceback
        if args.debug:
            raise
        print(f"specdec {args.command}: error: {_error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

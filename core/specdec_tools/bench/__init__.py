"""End-to-end benchmark: every installed method against the baseline and Hugging Face peers, in one run.

Workloads come from held-out standard-library files (the split of :mod:`specdec_tools.zoo`, so a bundled
model never trained on them), with a fixed seed and sizes:

- ``completion``: the first part of a file; the model continues it.
- ``edit``: a part of a file, then the same part again with a small change near the top, cut a few
  lines after the change; the model continues the second copy (grounded editing: prompt lookup).
- ``repeated``: the same prompt twice, then a near-duplicate, in successive ``generate()`` calls on
  the same engine (requests that resemble earlier ones: suffix decoding's global tree).

Per workload x batch size x temperature x method: tokens/s, speedup over the baseline (timed passes
interleaved with the baseline's, so machine noise hits both), mean acceptance length, per-position
acceptance, the draft and verify shares of a step (from a separate profiled pass: ``profile_steps``
synchronises the device after each forward, so no throughput is read from it), and the efficiency
``speedup / (acceptance length x T(1 token) / T(k+1 tokens))`` with both target forward times measured
in the same run. Before any timing, greedy outputs are checked against the baseline's: in float32 a
method whose output differs on any prompt gets no speedup reported (the row says REFUSED); in
bfloat16/float16 every divergence must sit at a near-tie of the baseline's logits (see ``tie_bound``).

    specdec bench                                    # small CPU version on the bundled models
    python benchmarks/e2e.py --batch 1 8 --prompts 8 # the full grid (see benchmarks/e2e.py)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from specdec.cli_common import option_value
from specdec_tools.bench.checks import (  # noqa: F401  (importable from specdec_tools.bench, as before the split)
    check_label,
    check_method,
    compare_greedy,
    divergence_margins,
    tie_bound,
)
from specdec_tools.bench.passes import fresh_proposer, profile_pass, run_pass, time_forwards  # noqa: F401
from specdec_tools.bench.peers import run_peers  # noqa: F401
from specdec_tools.bench.report import markdown_report, write_outputs, write_plots  # noqa: F401
from specdec_tools.bench.run import Method, bench_cell, resolve_methods, run_benchmark  # noqa: F401
from specdec_tools.bench.workloads import (  # noqa: F401
    DEFAULT_RUNS,
    WORKLOADS,
    Settings,
    Workload,
    build_workloads,
    default_methods,
    held_out_files,
    line_chunks,
    parse_method,
    small_edit,
)

__all__ = ["Settings", "Workload", "build_workloads", "compare_greedy", "tie_bound", "run_benchmark",
           "markdown_report", "write_outputs", "add_arguments", "settings_from_args", "default_methods", "main"]


# ---------------------------------------------------------------- command line


def _method_option(text: str) -> tuple[str, str, Any]:
    key, sep, raw = text.partition("=")
    method, dot, opt = key.partition(".")
    if not sep or not dot:
        raise argparse.ArgumentTypeError(f"--method-option {text!r} must look like method.key=value, "
                                         "e.g. ngram.prompt_lookup_min=3")
    return method.strip(), opt.strip(), option_value(raw)


def _cpu_threads(text: str) -> str | int | None:
    if text in ("auto", "none"):
        return None if text == "none" else text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--cpu-threads {text!r} is invalid: give auto, none or an int >= 1.")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser, small: bool = False) -> None:
    """The benchmark's flags; ``small`` gives the defaults of ``specdec bench`` (a CPU run of minutes)."""
    d = Settings()
    default_out = os.environ.get("OUT") or d.out
    parser.add_argument("--model", help="target model directory (default: the bundled 'tiny')")
    parser.add_argument("--draft-model", help="draft for draft_model and HF assisted generation "
                        "(default: the bundled 'tiny-draft' when --model is not given)")
    run = "quick" if small else "full"
    parser.add_argument("--methods", nargs="+", default=None,
                        help="methods, each name or name:k, optionally @auto or @fixed (the speculation policy; "
                        "e.g. ngram:4@fixed ngram:4@auto side by side) and +key=value options of that entry alone "
                        "(e.g. medusa:3@fixed medusa:3@fixed+tree_choices=default: chain and tree in one run); "
                        "each one given must be installed (default: the "
                        f"installed methods whose plugin includes them in the {run!r} run, its proposer's "
                        "bench_default; `specdec methods` lists what is installed)")
    parser.set_defaults(default_run=run)
    parser.add_argument("-k", type=int, default=d.k, help="drafts per step for methods given without :k")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=d.workloads)
    parser.add_argument("--batch", type=int, nargs="+", default=[1] if small else d.batch)
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0] if small else d.temperature)
    parser.add_argument("--prompts", type=int, default=3 if small else d.prompts,
                        help="requests per workload (at least the batch size)")
    parser.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="longest prompt chunk")
    parser.add_argument("--max-tokens", type=int, default=48 if small else d.max_tokens, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=2 if small else d.repeats, help="timed passes per engine")
    parser.add_argument("--peer-repeats", type=int, default=d.peer_repeats, help="timed passes per HF peer")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--dtype", default=d.dtype, help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: CUDA when available)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="eager target forwards on CUDA")
    parser.add_argument("--no-fused-forward", action="store_true",
                        help="Hugging Face's layers in the target forward instead of the fused one "
                        "(LLM's fused_forward=False; the default fuses on CUDA and the CPU where supported)")
    parser.add_argument("--cpu-threads", type=_cpu_threads, default="auto", metavar="auto|N|none",
                        help="LLM's cpu_threads: torch threads while a CPU engine steps ('auto': the cores other "
                        "processes leave free; none: torch's own setting; default: %(default)s)")
    parser.add_argument("--prefill-graph-tokens", type=int, default=None, metavar="N",
                        help="prefill graphs of up to N tokens with CUDA graphs (default: LLM's, 8192; 0: off)")
    parser.add_argument("--admit-group", type=int, default=None, metavar="N",
                        help="waiting requests join once N slots are free (default: LLM's, batch // 4)")
    parser.add_argument("--method-option", action="append", type=_method_option, default=[],
                        metavar="METHOD.KEY=VALUE", help="a method option, repeatable")
    parser.add_argument("--tie-rel", type=float, default=d.tie_rel, help="bfloat16 near-tie bound, relative")
    parser.add_argument("--no-peers", action="store_true", help="skip the Hugging Face generate() rows")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", default=default_out, help="output folder (default: $OUT or %(default)s)")
    parser.add_argument("--name", default="bench" if small else d.name, help="output file stem")
    parser.add_argument("--threads", type=int, default=1 if small else None,
                        help="torch CPU threads (default: %(default)s; None leaves torch's choice)")
    parser.add_argument("--no-progress", action="store_true")


def _check_methods(specs: list[str], k: int) -> None:
    """Every method named on the command line is installed (a ValueError names the others)."""
    from specdec import available_methods

    installed = sorted(n for n, info in available_methods().items() if info.status == "ok")
    unknown = [name for name, _ in (parse_method(spec, k) for spec in specs) if name not in installed]
    if unknown:
        raise ValueError(f"--methods names {', '.join(map(repr, unknown))}, not installed. Installed: "
                         f"{', '.join(installed) or 'none'} (`specdec methods` lists them with their plugins); "
                         "install a plugin with: pip install specdec-plugin-<name>.")


def _check_args(args: argparse.Namespace) -> None:
    """What Settings cannot see: unknown methods, thread counts, NaN temperatures, missing model folders."""
    if args.methods is not None:
        _check_methods(args.methods, args.k)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads} is invalid: it must be an int >= 1 (torch CPU threads).")
    bad = [t for t in args.temperature if not math.isfinite(t)]
    if bad:
        raise ValueError(f"--temperature {bad[0]} is invalid: give finite temperatures >= 0 (0 = greedy).")
    for flag, path in (("--model", args.model), ("--draft-model", args.draft_model)):
        if path is not None and not Path(path).is_dir():
            raise ValueError(f"{flag} {path!r} is not a directory: pass a local model folder saved with "
                             "save_pretrained (config.json + weights).")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags, after the checks Settings cannot make (see _check_args)."""
    _check_args(args)
    options: dict[str, dict[str, Any]] = {}
    for method, key, value in args.method_option:
        options.setdefault(method, {})[key] = value
    methods = args.methods if args.methods is not None else default_methods(getattr(args, "default_run", "full"))
    return Settings(model=args.model, draft_model=args.draft_model, methods=methods, workloads=args.workloads,
                    batch=args.batch, temperature=args.temperature, k=args.k, prompts=args.prompts,
                    prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, repeats=args.repeats,
                    peer_repeats=args.peer_repeats,
                    seed=args.seed, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                    cuda_graphs=False if args.no_cuda_graphs else None, method_options=options,
                    fused_forward=False if args.no_fused_forward else None, cpu_threads=args.cpu_threads,
                    prefill_graph_tokens=args.prefill_graph_tokens, admit_group=args.admit_group,
                    peers=not args.no_peers, plots=not args.no_plots, tie_rel=args.tie_rel, out=args.out,
                    name=args.name, progress=not args.no_progress, threads=args.threads)


def main(argv: list[str] | None = None, small: bool = False) -> int:
    """Run from parsed command-line flags; prints the markdown report and the files written."""
    parser = argparse.ArgumentParser(prog="specdec bench" if small else "e2e.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser, small)
    s = settings_from_args(parser.parse_args(argv))
    result = run_benchmark(s)
    paths = write_outputs(result, s.out, s.name, s.plots)
    print(markdown_report(result))
    print("wrote " + ", ".join(paths.values()))
    return 0

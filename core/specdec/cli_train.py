"""``specdec train`` (a method's head, from shards or text run through the target) and ``specdec extract`` (the
shards: the extract_hs plugin's command, imported only when that command is parsed or helped).

:mod:`specdec.cli` adds these subcommands to its parser and dispatches to :func:`run_train` and the extract
plugin's ``run``; torch, specdec_tools and the plugin are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from specdec.cli_common import CliError, add_debug, check_device, check_min, loading_bars, option_value, prepare_out

__all__ = ["add_extract", "add_train", "run_train"]


# ---------------------------------------------------------------- parsers


def _parse_train_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--option {text!r} is invalid: it must look like key=value with key a "
                                         "training option of the method, e.g. --option num_heads=3")
    return key, option_value(raw)


def add_train(sub: Any) -> None:
    tr = sub.add_parser(
        "train", help="train the head of a method that offers training (see docs/training.md)",
        description="Train a drafting method's head for a target model, from hidden-state shards written by "
        "`specdec extract` (--data DIR) or from text run through the target inside the loop (--online --text "
        "FILE...). Writes the head in the method's published format, a model card (README.md) and metrics.json "
        "(held-out loss curve, acceptance estimate per draft position) into --out, and a checkpoint every "
        "--save-every steps that --resume continues from.")
    add_debug(tr, argparse.SUPPRESS)
    tr.add_argument("--method", required=True, help="the method whose head to train (one a plugin registers a "
                    "trainer for)")
    tr.add_argument("--target", required=True, help="local directory of the target model the head drafts for")
    tr.add_argument("--data", metavar="DIR", help="hidden-state shards written by `specdec extract`")
    tr.add_argument("--online", action="store_true", help="run the target on --text inside the loop instead of "
                    "reading shards")
    tr.add_argument("--text", nargs="+", action="extend", metavar="FILE", help="with --online: text files (each one "
                    "document) or .jsonl files (a string, or an object with 'text' or 'prompt' per line)")
    tr.add_argument("--seq-len", type=int, default=256, help="with --online: tokens per training window (int >= 2; "
                    "default 256)")
    tr.add_argument("--out", required=True, help="output folder: the head, README.md, metrics.json, the checkpoint")
    tr.add_argument("--steps", type=int, default=1000, help="optimizer steps (int >= 1; default 1000)")
    tr.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    tr.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    tr.add_argument("--warmup", type=int, default=None, help="linear warm-up steps before the cosine decay "
                    "(default: min(100, steps // 10))")
    tr.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay on matrices (default 0)")
    tr.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip (0 = off; default 1)")
    tr.add_argument("--seed", type=int, default=0, help="seed of the head's init and the batch order (default 0)")
    tr.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations (default 100)")
    tr.add_argument("--eval-fraction", type=float, default=0.05, help="share of sequences held out, chosen by a "
                    "fixed hash (default 0.05)")
    tr.add_argument("--max-eval-sequences", type=int, default=256, help="held-out sequences per evaluation "
                    "(default 256)")
    tr.add_argument("--save-every", type=int, default=None, help="steps between checkpoints (default: "
                    "--eval-every)")
    tr.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    tr.add_argument("--keep-checkpoint", action="store_true", help="keep checkpoint.pt in --out after the run")
    tr.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    tr.add_argument("--option", action="append", type=_parse_train_option, default=[], metavar="KEY=VALUE",
                    help="a training option of the method, repeatable (values parsed as JSON when possible)")
    tr.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU (int >= 1)")
    tr.add_argument("--trust-remote-code", action="store_true",
                    help="let transformers run Python files shipped in the target directory (--online)")
    tr.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _add_extract_arguments(parser: argparse.ArgumentParser) -> None:
    """The extract command's flags, from the extract_hs plugin: imported only when `specdec extract` is parsed or
    helped. Without the plugin, the command ends here with one line saying how to install it."""
    fix = "pip install specdec-plugin-extract_hs"
    try:
        import specdec_extract_hs.command as command
    except ModuleNotFoundError as exc:
        if exc.name not in ("specdec_extract_hs", "specdec_extract_hs.command"):
            raise
        why = ("is not installed" if exc.name == "specdec_extract_hs" else
               "is installed without its `command` module (an older version)")
        parser.exit(2, f"{parser.prog}: error: `specdec extract` comes from the plugin specdec-plugin-extract_hs, "
                    f"which {why}: {fix}\n")
    except Exception as exc:  # a broken plugin: one line, like every other error
        parser.exit(2, f"{parser.prog}: error: the plugin specdec-plugin-extract_hs failed to import "
                    f"({type(exc).__name__}: {' '.join(str(exc).split())}): reinstall it with {fix}\n")
    command.add_arguments(parser)
    parser.set_defaults(extract_run=command.run)


def add_extract(sub: Any) -> None:
    extract = sub.add_parser("extract", help="record a target's hidden states over a data set as shards for "
                             "`specdec train` (plugin specdec-plugin-extract_hs)", populate=_add_extract_arguments)
    add_debug(extract, argparse.SUPPRESS)


# ---------------------------------------------------------------- train


def _check_train_flags(args: argparse.Namespace) -> None:
    """Flags and the choice of data, before anything is imported or loaded."""
    check_min("--steps", args.steps, 1, " (optimizer steps)")
    check_min("--batch-size", args.batch_size, 1, " (sequences per step)")
    check_min("--eval-every", args.eval_every, 1, " (steps between held-out evaluations)")
    check_min("--save-every", args.save_every, 1, " (steps between checkpoints); leave it out for --eval-every")
    check_min("--max-eval-sequences", args.max_eval_sequences, 1, " (held-out sequences per evaluation)")
    check_min("--seq-len", args.seq_len, 2, " (tokens per --online window)")
    check_min("--warmup", args.warmup, 0, " (warm-up steps); leave it out for min(100, steps // 10)")
    check_min("--seed", args.seed, 0)
    check_min("--threads", args.threads, 1, " (torch CPU threads); leave it out for the default")
    for flag, value, ok, rule in (("--lr", args.lr, args.lr > 0, "> 0, e.g. --lr 1e-3"),
                                  ("--weight-decay", args.weight_decay, args.weight_decay >= 0, ">= 0"),
                                  ("--grad-clip", args.grad_clip, args.grad_clip >= 0, ">= 0 (0 turns it off)")):
        if not (math.isfinite(value) and ok):
            raise CliError(f"{flag} {value} is invalid: it must be a finite number {rule}.")
    if not 0 < args.eval_fraction < 1:
        raise CliError(f"--eval-fraction {args.eval_fraction} is invalid: it must be in (0, 1), e.g. 0.05.")
    if args.data and args.online:
        raise CliError("--data and --online exclude each other: train from shards (--data DIR) or from text run "
                       "through the target (--online --text FILE...), not both.")
    if args.text and not args.online:
        raise CliError("--text is the text of --online training: add --online, or train from shards with --data DIR "
                       "alone.")
    if not args.data and not args.online:
        raise CliError("no training data: pass --data DIR (hidden-state shards written by `specdec extract`) or "
                       "--online --text FILE... (text run through the target while training).")
    if args.online and not args.text:
        raise CliError("--online needs text to run through the target: add --text FILE... (text or .jsonl files).")
    check_device(args.device)


def _train_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (for the model card)."""
    import shlex

    parts = ["specdec", "train", "--method", args.method, "--target", args.target]
    parts += ["--data", args.data] if args.data else ["--online", "--text", *args.text, "--seq-len", str(args.seq_len)]
    parts += ["--out", args.out, "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr",
              f"{args.lr:g}", "--seed", str(args.seed), "--eval-every", str(args.eval_every)]
    for flag, value in (("--warmup", args.warmup), ("--weight-decay", args.weight_decay or None),
                        ("--grad-clip", None if args.grad_clip == 1.0 else args.grad_clip),
                        ("--eval-fraction", None if args.eval_fraction == 0.05 else args.eval_fraction)):
        if value is not None:
            parts += [flag, f"{value:g}"]
    for key, value in args.option:
        parts += ["--option", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return shlex.join(parts)


def run_train(args: argparse.Namespace) -> int:
    _check_train_flags(args)
    import torch

    from specdec.registry import get_trainer_class
    from specdec_tools.train import TargetInfo, build_trainer, train
    from specdec_tools.train_data import OnlineData, ShardData

    cls = get_trainer_class(args.method)  # an unknown method fails here, before the target loads
    options = dict(args.option)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    trainer = build_trainer(cls, TargetInfo.from_path(args.target, args.trust_remote_code), options)
    prepare_out(args.out)
    with loading_bars(not args.no_progress):
        data = (ShardData(args.data) if args.data else
                OnlineData(args.target, args.text, seq_len=args.seq_len, device=device,
                           trust_remote_code=args.trust_remote_code))
    metrics = train(trainer, data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                    warmup=args.warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip, seed=args.seed,
                    eval_every=args.eval_every, eval_fraction=args.eval_fraction, device=device, resume=args.resume,
                    progress=not args.no_progress, save_every=args.save_every,
                    max_eval_sequences=args.max_eval_sequences, keep_checkpoint=args.keep_checkpoint,
                    command=_train_command(args))
    history, held = metrics["eval_history"], metrics["held_out"]
    print(f"method: {args.method}; {args.steps} steps in {metrics['training']['seconds']} s; held-out loss "
          f"{history[0]['loss']:.4f} (step {history[0]['step']}) -> {held['loss']:.4f} (step {history[-1]['step']})")
    print(f"held-out acceptance per draft position: {held['acceptance_per_position']}; estimated mean acceptance "
          f"length {held['mean_acceptance_length']:.3f}")
    print(f"wrote {args.out} (the head, README.md, metrics.json)")
    return 0

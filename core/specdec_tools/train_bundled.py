"""What the plugins' bundled-head recipes share (``python -m specdec_<plugin>.train_bundled``): their common
flags, ``--option KEY=VALUE``, a hash sample of the standard library's training split (``specdec_tools.zoo``: the
corpus ``tiny`` was trained on; optionally site-packages' too) run through the target inside the loop, the
float16 copy the repository bundles, and the held-out line they print. Each recipe keeps its own head options."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["recipe_parser", "parse_options", "train_online", "to_fp16", "print_held_out"]


def recipe_parser(prog: str, description: str, *, what: str, steps: int, lr: float) -> argparse.ArgumentParser:
    """A parser with the flags every recipe takes: ``--out`` (``what`` is written there), ``--target``,
    ``--megabytes``, ``--steps``, ``--batch-size``, ``--seq-len``, ``--lr``, ``--threads``, ``--device``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", required=True, help=f"where to write the {what}")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled 'tiny')")
    p.add_argument("--megabytes", type=float, default=2.0, help="text sampled from the stdlib's training split")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    return p


def parse_options(parser: argparse.ArgumentParser, items: list[str], options: dict[str, Any], example: str
                  ) -> dict[str, Any]:
    """``options`` updated with each ``--option KEY=VALUE`` of ``items`` (values as ``specdec train`` reads
    them); a malformed item is a usage error naming ``example``."""
    from specdec.cli_common import option_value

    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--option {item!r} is not KEY=VALUE (e.g. --option {example})")
        options[key.strip()] = option_value(value)
    return options


def train_online(trainer_cls: type, options: dict[str, Any], args: argparse.Namespace, module: str,
                 argv: list[str] | None, *, site_packages: bool = False, **train_kwargs: Any) -> dict[str, Any]:
    """Build ``trainer_cls`` for ``args.target`` (default: the bundled ``tiny``) with ``options`` and train it
    online on ``args.megabytes`` of the stdlib's training split into ``args.out``; ``module`` and ``argv`` make
    the command the card records. ``train_kwargs`` go to :func:`specdec_tools.train.train`. Returns its metrics."""
    import specdec
    from specdec_tools.train import TargetInfo, build_trainer, train
    from specdec_tools.train_data import OnlineData
    from specdec_tools.zoo import collect_files, hash_sample

    if args.threads:
        torch.set_num_threads(args.threads)
    target = args.target or specdec.bundled_model("tiny")
    files = hash_sample(collect_files(site_packages=site_packages)["train"], args.megabytes)
    trainer = build_trainer(trainer_cls, TargetInfo.from_path(target), options)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (_, text) in enumerate(files):
            paths.append(str(Path(tmp) / f"{i:05d}.py"))
            Path(paths[-1]).write_text(text, encoding="utf-8")
        data = OnlineData(target, paths, seq_len=args.seq_len, device=args.device)
        print(f"{len(files)} files, {data.tokens} tokens, {len(data)} windows of {args.seq_len}", file=sys.stderr)
        return train(trainer, data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                     eval_every=max(1, args.steps // 4), eval_fraction=0.05, device=args.device,
                     command=shlex.join(["python", "-m", module, *(argv or sys.argv[1:])]), **train_kwargs)


def to_fp16(path: Path, names: tuple[str, ...] = ("model.safetensors",)) -> None:
    """Rewrite each of ``names`` present in ``path`` with float16 weights (integer tensors kept)."""
    from safetensors.torch import load_file, save_file

    for name in names:
        f = Path(path) / name
        if f.is_file():
            state = load_file(str(f))
            save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(f),
                      metadata={"format": "pt"})


def print_held_out(metrics: dict[str, Any], per: str = "position") -> None:
    """The held-out line a recipe ends with: loss, acceptance per draft ``per`` (position, head), accepted
    prefix and the mean acceptance length."""
    held = metrics["held_out"]
    print(f"held-out loss {held['loss']:.4f}; acceptance per {per} {held['acceptance_per_position']}; accepted "
          f"prefix {held['accepted_prefix_per_position']}; mean acceptance length {held['mean_acceptance_length']}")

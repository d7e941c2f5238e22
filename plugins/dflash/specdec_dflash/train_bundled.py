"""Train the bundled ``tiny-dflash`` draft for the bundled ``tiny`` target on the CPU::

    python -m specdec_dflash.train_bundled --out core/specdec/models/tiny-dflash --steps 1200 --threads 1

Data: the training split of the running Python's standard library ``.py`` files (``specdec_tools.zoo``: the
corpus ``tiny`` itself was trained on), a hash-ordered sample of ``--megabytes``, run through the target in the
loop (``--online``); the loop holds out 5% of the windows and its model card reports the acceptance estimate per
draft position on them. The draft: one decoder layer over target layers 1 and 2 (``--target-layer-ids``), blocks of
8, the z-lab layout, stored in float16 (``--fp16``). The same run is ``specdec train --method dflash --target
<tiny> --online --text <files> --seq-len 256 --steps 1200 --batch-size 8 --lr 2e-3 --option target_layer_ids=1,2``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

import torch


def to_fp16(path: Path) -> None:
    """Rewrite ``path/model.safetensors`` with float16 weights."""
    from safetensors.torch import load_file, save_file

    f = path / "model.safetensors"
    state = load_file(str(f))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(f),
              metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    """Train and write the draft; print the held-out numbers. Returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m specdec_dflash.train_bundled", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the draft (config.json, model.safetensors, card)")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled 'tiny')")
    p.add_argument("--megabytes", type=float, default=2.0, help="text sampled from the stdlib's training split")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--target-layer-ids", default="1,2", help="target decoder layers read ('' = DFlash's default)")
    p.add_argument("--max-eval-sequences", type=int, default=64, help="held-out windows per evaluation")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another trainer option (e.g. num_layers=2), as specdec train's --option")
    p.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                   help="store the weights in float16 (default: yes)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import specdec
    from specdec.cli_common import option_value
    from specdec_dflash.train import DFlashTrainer
    from specdec_tools.train import TargetInfo, build_trainer, train
    from specdec_tools.train_data import OnlineData
    from specdec_tools.zoo import collect_files, hash_sample

    tiny = args.target or specdec.bundled_model("tiny")
    files = hash_sample(collect_files()["train"], args.megabytes)
    options = {"target_layer_ids": args.target_layer_ids}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--option {item!r} is not KEY=VALUE (e.g. --option num_layers=2)")
        options[key.strip()] = option_value(value)
    trainer = build_trainer(DFlashTrainer, TargetInfo.from_path(tiny), options)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (_, text) in enumerate(files):
            paths.append(str(Path(tmp) / f"{i:05d}.py"))
            Path(paths[-1]).write_text(text, encoding="utf-8")
        data = OnlineData(tiny, paths, seq_len=args.seq_len, device=args.device)
        print(f"{len(files)} files, {data.tokens} tokens, {len(data)} windows of {args.seq_len}", file=sys.stderr)
        metrics = train(trainer, data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                        eval_every=max(1, args.steps // 4), eval_fraction=0.05, device=args.device,
                        max_eval_sequences=args.max_eval_sequences, progress=False,
                        command=shlex.join(["python", "-m", "specdec_dflash.train_bundled", *(argv or sys.argv[1:])]))
    if args.fp16:
        to_fp16(Path(args.out))
    held = metrics["held_out"]
    print(f"held-out loss {held['loss']:.4f}; acceptance per position {held['acceptance_per_position']}; accepted "
          f"prefix {held['accepted_prefix_per_position']}; mean acceptance length {held['mean_acceptance_length']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

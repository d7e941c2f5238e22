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
from pathlib import Path

from specdec_tools.train_bundled import parse_options, print_held_out, recipe_parser, to_fp16, train_online


def main(argv: list[str] | None = None) -> int:
    """Train and write the draft; print the held-out numbers. Returns the exit status."""
    p = recipe_parser("python -m specdec_dflash.train_bundled", __doc__.splitlines()[0],
                      what="draft (config.json, model.safetensors, card)", steps=1200, lr=2e-3)
    p.add_argument("--target-layer-ids", default="1,2", help="target decoder layers read ('' = DFlash's default)")
    p.add_argument("--max-eval-sequences", type=int, default=64, help="held-out windows per evaluation")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another trainer option (e.g. num_layers=2), as specdec train's --option")
    p.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                   help="store the weights in float16 (default: yes)")
    args = p.parse_args(argv)

    from specdec_dflash.train import DFlashTrainer

    options = parse_options(p, args.option, {"target_layer_ids": args.target_layer_ids}, "num_layers=2")
    metrics = train_online(DFlashTrainer, options, args, "specdec_dflash.train_bundled", argv,
                           max_eval_sequences=args.max_eval_sequences, progress=False)
    if args.fp16:
        to_fp16(Path(args.out))
    print_held_out(metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train the bundled ``tiny-medusa`` heads for the bundled ``tiny`` target on the CPU in a few minutes::

    python -m specdec_medusa.train_bundled --out core/specdec/models/tiny-medusa --steps 240 --threads 2

Data: the training split of the running Python's standard library ``.py`` files (``specdec_tools.zoo``: the
corpus ``tiny`` itself was trained on), a hash-ordered sample of ``--megabytes``, run through the target in the
loop (``--online``); the loop holds out 5% of the windows and its model card reports the acceptance estimate per
head on them. The bundled copy is vLLM's layout with a truncated vocabulary (``--draft-vocab-size``, the most
frequent tokens) and float16 weights (``--fp16``), which keeps it near 2 MB: FasterDecoding's layout projects
every head onto the whole vocabulary. The same run is ``specdec train --method medusa --target <tiny> --online
--text <files> --seq-len 256 --steps 240 --batch-size 8 --lr 3e-3 --option num_heads=3 --option format=vllm
--option draft_vocab_size=1024``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec_tools.train_bundled import print_held_out, recipe_parser, to_fp16, train_online


def main(argv: list[str] | None = None) -> int:
    p = recipe_parser("python -m specdec_medusa.train_bundled", __doc__.splitlines()[0],
                      what="heads (config.json, weights, card)", steps=240, lr=3e-3)
    p.add_argument("--num-heads", type=int, default=3)
    p.add_argument("--format", choices=("fasterdecoding", "vllm"), default="vllm")
    p.add_argument("--draft-vocab-size", type=int, default=1024, help="vllm: truncated vocabulary (0 = the target's)")
    p.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                   help="store the weights in float16 (default: yes)")
    args = p.parse_args(argv)

    from specdec_medusa.train import MedusaTrainer

    options = {"num_heads": args.num_heads, "format": args.format}
    if args.format == "vllm":
        options["draft_vocab_size"] = args.draft_vocab_size
    metrics = train_online(MedusaTrainer, options, args, "specdec_medusa.train_bundled", argv)
    if args.fp16:
        to_fp16(Path(args.out), ("model.safetensors", "medusa_lm_head.safetensors"))
    print_held_out(metrics, "head")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Train the bundled heads for the bundled ``tiny`` target on the CPU in a few minutes::

    python -m specdec_eagle.train_bundled --out /tmp/tiny-eagle3                  # EAGLE-3 (tiny-eagle3)
    python -m specdec_eagle.train_bundled --method eagle --out /tmp/tiny-eagle    # EAGLE-1 (tiny-eagle)

The same recipe trains a head for another target: ``--target .bench-models/bench --site-packages --device cuda``
(the benchmark target, trained on site-packages by ``python -m specdec.zoo --preset bench``).

Data: the training split of the running Python's standard library ``.py`` files (``specdec_tools.zoo``: the
corpus ``tiny`` itself was trained on), a hash-ordered sample of ``--megabytes``, run through the target in the
loop (``--online``). The loop holds out 5% of the windows; its model card reports the acceptance estimate per draft
position on them. The same run is ``specdec train --method eagle3 --target <tiny> --online --text <files>
--seq-len 256 --steps 300 --batch-size 8 --lr 2e-3 --option draft_vocab_size=1024``.
"""

from __future__ import annotations

from specdec_tools.train_bundled import parse_options, print_held_out, recipe_parser, train_online


def main(argv: list[str] | None = None) -> int:
    p = recipe_parser("python -m specdec_eagle.train_bundled", __doc__.splitlines()[0],
                      what="head (config.json, model.safetensors, card)", steps=300, lr=2e-3)
    p.add_argument("--method", choices=("eagle3", "eagle"), default="eagle3")
    p.add_argument("--site-packages", action="store_true",
                   help="sample site-packages' training split too (the corpus of the zoo's bench preset)")
    p.add_argument("--draft-vocab-size", type=int, default=1024, help="eagle3: draft vocabulary (0 = the target's)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another trainer option (e.g. ttt_steps=3), as specdec train's --option")
    args = p.parse_args(argv)

    from specdec_eagle.train import Eagle3Trainer, EagleTrainer

    options = {"draft_vocab_size": args.draft_vocab_size} if args.method == "eagle3" else {}
    parse_options(p, args.option, options, "ttt_steps=3")
    metrics = train_online(Eagle3Trainer if args.method == "eagle3" else EagleTrainer, options, args,
                           "specdec_eagle.train_bundled", argv, site_packages=args.site_packages)
    print_held_out(metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

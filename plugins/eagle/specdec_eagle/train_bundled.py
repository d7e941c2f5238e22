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

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec_eagle.train_bundled", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the head (config.json, model.safetensors, card)")
    p.add_argument("--method", choices=("eagle3", "eagle"), default="eagle3")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled 'tiny')")
    p.add_argument("--site-packages", action="store_true",
                   help="sample site-packages' training split too (the corpus of the zoo's bench preset)")
    p.add_argument("--megabytes", type=float, default=2.0, help="text sampled from the stdlib's training split")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--draft-vocab-size", type=int, default=1024, help="eagle3: draft vocabulary (0 = the target's)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another trainer option (e.g. ttt_steps=3), as specdec train's --option")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import specdec
    from specdec.cli_common import option_value
    from specdec_eagle.train import Eagle3Trainer, EagleTrainer
    from specdec_tools.train import TargetInfo, build_trainer, train
    from specdec_tools.train_data import OnlineData
    from specdec_tools.zoo import collect_files, hash_sample

    tiny = args.target or specdec.bundled_model("tiny")
    files = hash_sample(collect_files(site_packages=args.site_packages)["train"], args.megabytes)
    options = {"draft_vocab_size": args.draft_vocab_size} if args.method == "eagle3" else {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--option {item!r} is not KEY=VALUE (e.g. --option ttt_steps=3)")
        options[key.strip()] = option_value(value)
    trainer = build_trainer(Eagle3Trainer if args.method == "eagle3" else EagleTrainer, TargetInfo.from_path(tiny),
                            options)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (_, text) in enumerate(files):
            paths.append(str(Path(tmp) / f"{i:05d}.py"))
            Path(paths[-1]).write_text(text, encoding="utf-8")
        data = OnlineData(tiny, paths, seq_len=args.seq_len, device=args.device)
        print(f"{len(files)} files, {data.tokens} tokens, {len(data)} windows of {args.seq_len}", file=sys.stderr)
        metrics = train(trainer, data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                        eval_every=max(1, args.steps // 4), eval_fraction=0.05, device=args.device,
                        command=shlex.join(["python", "-m", "specdec_eagle.train_bundled", *(argv or sys.argv[1:])]))
    held = metrics["held_out"]
    print(f"held-out loss {held['loss']:.4f}; acceptance per position {held['acceptance_per_position']}; accepted "
          f"prefix {held['accepted_prefix_per_position']}; mean acceptance length {held['mean_acceptance_length']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

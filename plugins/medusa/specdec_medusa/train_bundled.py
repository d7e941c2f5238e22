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
import shlex
import sys
import tempfile
from pathlib import Path

import torch


def to_fp16(path: Path) -> None:
    """Rewrite ``path/model.safetensors`` (or ``medusa_lm_head.safetensors``) with float16 weights (ids kept)."""
    from safetensors.torch import load_file, save_file

    for name in ("model.safetensors", "medusa_lm_head.safetensors"):
        f = path / name
        if f.is_file():
            state = load_file(str(f))
            save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(f),
                      metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec_medusa.train_bundled", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the heads (config.json, weights, card)")
    p.add_argument("--target", default=None, help="target model directory (default: the bundled 'tiny')")
    p.add_argument("--megabytes", type=float, default=2.0, help="text sampled from the stdlib's training split")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--num-heads", type=int, default=3)
    p.add_argument("--format", choices=("fasterdecoding", "vllm"), default="vllm")
    p.add_argument("--draft-vocab-size", type=int, default=1024, help="vllm: truncated vocabulary (0 = the target's)")
    p.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                   help="store the weights in float16 (default: yes)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import specdec
    from specdec_medusa.train import MedusaTrainer
    from specdec_tools.train import TargetInfo, build_trainer, train
    from specdec_tools.train_data import OnlineData
    from specdec_tools.zoo import collect_files, hash_sample

    tiny = args.target or specdec.bundled_model("tiny")
    files = hash_sample(collect_files()["train"], args.megabytes)
    options = {"num_heads": args.num_heads, "format": args.format}
    if args.format == "vllm":
        options["draft_vocab_size"] = args.draft_vocab_size
    trainer = build_trainer(MedusaTrainer, TargetInfo.from_path(tiny), options)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, (_, text) in enumerate(files):
            paths.append(str(Path(tmp) / f"{i:05d}.py"))
            Path(paths[-1]).write_text(text, encoding="utf-8")
        data = OnlineData(tiny, paths, seq_len=args.seq_len, device=args.device)
        print(f"{len(files)} files, {data.tokens} tokens, {len(data)} windows of {args.seq_len}", file=sys.stderr)
        metrics = train(trainer, data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                        eval_every=max(1, args.steps // 4), eval_fraction=0.05, device=args.device,
                        command=shlex.join(["python", "-m", "specdec_medusa.train_bundled", *(argv or sys.argv[1:])]))
    if args.fp16:
        to_fp16(Path(args.out))
    held = metrics["held_out"]
    print(f"held-out loss {held['loss']:.4f}; acceptance per head {held['acceptance_per_position']}; accepted "
          f"prefix {held['accepted_prefix_per_position']}; mean acceptance length {held['mean_acceptance_length']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

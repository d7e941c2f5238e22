"""The shard writer alone (no model): ``ShardWriter`` throughput in GB/s for synthetic bf16 hidden states,
synchronous and with 1 and 3 background writer threads, in one process (the first configuration is run twice:
its first pass warms the page cache).

    python benchmarks/bench_shard_writer.py --sequences 96 --seq-len 1024 --hidden 768 --root /tmp
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import torch

from specdec_tools.shards import ShardWriter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--root", default=None, help="where the shards go (default: a temporary folder)")
    args = ap.parse_args()
    keys = ("2", "6", "9", "last")
    seqs = [(torch.arange(args.seq_len), torch.ones(args.seq_len),
             {k: torch.randn(args.seq_len, args.hidden).to(torch.bfloat16) for k in keys})
            for _ in range(args.sequences)]
    gb = args.sequences * args.seq_len * len(keys) * args.hidden * 2 / 1e9
    config = {"num_hidden_layers": 12, "hidden_size": args.hidden}
    for background, threads in ((True, 3), (False, 1), (True, 1), (True, 3)):
        root = tempfile.mkdtemp(dir=args.root)
        w = ShardWriter(f"{root}/out", target_path="synthetic", target_config=config, layer_ids=[2, 6, 9],
                        last_layer=True, dtype="bfloat16", hidden_size=args.hidden, background=background,
                        writer_threads=threads)
        t0 = time.perf_counter()
        for s in seqs:
            w.add(*s)
        w.close()
        dt = time.perf_counter() - t0
        print(f"background={background} writer_threads={threads}: {gb:.2f} GB in {dt:.2f} s = {gb / dt:.2f} GB/s")
        shutil.rmtree(root)


if __name__ == "__main__":
    main()

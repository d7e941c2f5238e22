"""Hidden-state extraction throughput: ``specdec extract``'s forward path against a plain Hugging Face
forward with ``output_hidden_states=True`` over the same batches, in one process (issue 20).

Three rows per batch size, tokens per second over the same sequences:

- ``hf forward``: ``model(input_ids, output_hidden_states=True)`` (inference mode), nothing copied out;
- ``hf + copy``: the same, plus the requested layers gathered and copied to the host in the shard dtype;
- ``specdec no writes``: :func:`specdec_extract_hs.extract.extract_forward` on the public runner with a writer
  that drops what it gets (the runner's forward and the host copy, no shards);
- ``specdec extract``: the same writing safetensors shards as ``specdec extract`` does (background writer
  threads: serialise, hash, write and fsync each shard; the whole job).

Last, the disk under ``--shard-root`` alone: one 1 GB file written and synced (GB/s), the ceiling of any
extraction that keeps what it extracts.

Sequences are random token ids of one length (no padding in the HF rows), so the model's weights do not
matter: without ``--model`` a random-init Llama of the bench target's shape is built in a temporary folder.

    python benchmarks/bench_extract.py --device cuda --batch 4 16 --seq-len 1024 --layers 2 6 9 --last
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import torch


def _random_model(root: str, seq_len: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = os.path.join(root, "target")
    LlamaForCausalLM(LlamaConfig(vocab_size=16384, hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
                                 num_attention_heads=12, max_position_embeddings=max(2048, seq_len))
                     ).to(torch.bfloat16).save_pretrained(path)
    return path


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="target directory (default: a random-init bench-shaped Llama)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--sequences", type=int, default=64, help="sequences per pass")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 6, 9])
    ap.add_argument("--last", action="store_true", help="also the last layer (final norm)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--shard-root", default=None, help="where the shards go (default: a temporary folder)")
    ap.add_argument("--writer-threads", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from specdec import HFTargetModel
    from specdec_extract_hs.data import Item
    from specdec_extract_hs.extract import extract_forward
    from specdec_tools.shards import ShardWriter

    root = tempfile.mkdtemp(prefix="specdec-bench-extract-", dir=args.shard_root)
    path = args.model or _random_model(root, args.seq_len)
    target = HFTargetModel(path, dtype=args.dtype, device=args.device, max_model_len=args.seq_len)
    device, dtype = target.device, target.dtype
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    rng = np.random.default_rng(0)
    seqs = rng.integers(2, target.vocab_size, size=(args.sequences, args.seq_len), dtype=np.int64)
    items = [Item(s, np.ones(len(s), dtype=np.uint8)) for s in seqs]
    keys = [str(i) for i in sorted(args.layers)] + (["last"] if args.last else [])
    picks = sorted(args.layers) + ([target.num_layers] if args.last else [])
    tokens = args.sequences * args.seq_len
    rows = []

    class _Bar:
        def update(self, n: int) -> None:
            pass

    def _drop() -> SimpleNamespace:  # a writer that keeps nothing: the forward and host-copy cost alone
        return SimpleNamespace(keys=tuple(keys), dtype=dtype, add=lambda *a: None)

    for b in args.batch:
        batches = [torch.from_numpy(seqs[a: a + b]).to(device) for a in range(0, args.sequences, b)]

        @torch.inference_mode()
        def hf_forward(copy: bool, batches: list[torch.Tensor] = batches) -> None:
            for ids in batches:
                out = hf.model(input_ids=ids, output_hidden_states=True)
                if copy:  # the rows a shard stores, [L, b * T, H], one host copy per batch
                    torch.stack([out.hidden_states[i] for i in picks]).flatten(1, 2).cpu()

        def specdec_extract(b: int = b) -> None:
            out_dir = tempfile.mkdtemp(dir=root)
            writer = ShardWriter(out_dir, target_path=path, target_config=target.config.to_dict(),
                                 layer_ids=sorted(args.layers), last_layer=args.last,
                                 dtype=str(dtype).removeprefix("torch."),
                                 hidden_size=int(target.config.hidden_size), background=True,
                                 writer_threads=args.writer_threads)
            extract_forward(target, items, writer, b, _Bar())
            writer.close()
            shutil.rmtree(out_dir)

        t_hf = _timed(lambda: hf_forward(False), device, args.repeats)
        t_copy = _timed(lambda: hf_forward(True), device, args.repeats)
        t_drop = _timed(lambda b=b: extract_forward(target, items, _drop(), b, _Bar()), device, args.repeats)
        t_ours = _timed(specdec_extract, device, args.repeats)
        for name, t in (("hf forward", t_hf), ("hf + copy", t_copy), ("specdec no writes", t_drop),
                        ("specdec extract", t_ours)):
            rows.append({"batch": b, "path": name, "tok_s": tokens / t, "vs_hf_forward": t_hf / t})
    block = os.urandom(1 << 26)
    disk = os.path.join(root, "probe")
    t0 = time.perf_counter()
    with open(disk, "wb") as f:
        for _ in range(16):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    disk_gbs = (16 << 26) / (time.perf_counter() - t0) / 1e9
    os.remove(disk)
    shard_gb = tokens * len(keys) * int(target.config.hidden_size) * torch.finfo(dtype).bits / 8 / 1e9
    print(f"{args.sequences} sequences x {args.seq_len} tokens, layers {keys}, {dtype} on {device}; "
          f"{shard_gb:.2f} GB of shards a pass; disk under {root}: {disk_gbs:.2f} GB/s written and synced, "
          f"so at most {tokens / (shard_gb / disk_gbs):.0f} tok/s")
    print("| batch | path | tok/s | vs hf forward |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['batch']} | {r['path']} | {r['tok_s']:.0f} | {r['vs_hf_forward']:.2f}x |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "disk_gb_s": disk_gbs, "shard_gb": shard_gb}, f, indent=1)


if __name__ == "__main__":
    main()

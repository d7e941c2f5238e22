"""What a seeded sampled decode step costs next to a greedy one, with keyed sampling's Triton kernel and without.

Seeded requests at T > 0 draw each token by keyed sampling (:mod:`specdec.keyed`). Its torch form hashes
(seed, position, token id) over the whole vocabulary with some fifty elementwise tensor operations per step; on a
GPU each is a kernel launch, and at batch 8 the H200 ran the bench model's sampled baseline at 2382-3135 tok/s
against 10695-13764 greedy (benchmarks/results/h200/s18-2026-12-03/call2). ``specdec.kernels.keyed_triton`` does it
in one launch. Same process, same prompts, one random-init Llama (the bench model's layers, a Llama-3-sized
vocabulary by default): greedy, seeded T = 0.8 with the kernel (``specdec.keyed.KEYED_KERNEL``), the same without
``overlap_steps`` (a second engine: the next step is not queued on the device's samples), and without the kernel.

    python benchmarks/keyed_speed.py --device cuda --batch 1 8 32
    python benchmarks/keyed_speed.py --device cpu --batch 8 --vocab 16384 --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from specdec import LLM, SamplingParams, keyed


def random_llama(vocab: int, layers: int) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=768, intermediate_size=2304, num_hidden_layers=layers, num_attention_heads=12,
                         num_key_value_heads=12, vocab_size=vocab, max_position_embeddings=2048)
    path = tempfile.mkdtemp(prefix="specdec-keyed-speed-")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[8])
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per mode (best kept)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "keyed-speed.json"))
    args = ap.parse_args()
    model = random_llama(args.vocab, args.layers)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    engines = {overlap: LLM(model, dtype=dtype, device=args.device, max_num_seqs=max(args.batch), max_model_len=1024,
                            overlap_steps=overlap) for overlap in (True, False)}
    rows = []
    for batch in args.batch:
        prompts = [[(7 * i + 3 * j) % (args.vocab - 10) + 5 for j in range(64)] for i in range(batch)]
        modes = {"greedy": (0.0, True, True), "seeded T=0.8, kernel": (0.8, True, True),
                 "seeded T=0.8, kernel, no overlap": (0.8, True, False), "seeded T=0.8, torch": (0.8, False, True)}
        for name, (temp, kernel, overlap) in modes.items():
            keyed.KEYED_KERNEL = kernel
            llm = engines[overlap]
            params = [SamplingParams(temperature=temp, max_tokens=args.max_tokens, ignore_eos=True,
                                     seed=100 + i if temp > 0 else None) for i in range(batch)]
            llm.generate(prompts, params)  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs = llm.generate(prompts, params)
                best = min(best, time.perf_counter() - t0)
            tokens = sum(len(o.token_ids) for o in outs)
            rows.append({"batch": batch, "mode": name, "tok_s": tokens / best, "tokens": [o.token_ids for o in outs]})
            print(f"batch {batch} {name}: {tokens / best:.1f} tok/s", flush=True)
        keyed.KEYED_KERNEL = True
        by = {r["mode"]: r for r in rows if r["batch"] == batch}
        fast, slow = by["seeded T=0.8, kernel"], by["seeded T=0.8, torch"]
        serial = by["seeded T=0.8, kernel, no overlap"]
        print(f"batch {batch}: kernel / torch {fast['tok_s'] / slow['tok_s']:.2f}x; overlap "
              f"{fast['tok_s'] / serial['tok_s']:.2f}x; same tokens: "
              f"{fast['tokens'] == slow['tokens'] == serial['tokens']}", flush=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"\n{name}; vocab {args.vocab}; {args.layers} layers; {args.max_tokens} new tokens; dtype {dtype}")
    print("| batch | greedy tok/s | seeded T=0.8, kernel | kernel, no overlap | torch | kernel / torch | overlap |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in args.batch:
        by = {r["mode"]: r["tok_s"] for r in rows if r["batch"] == batch}
        k, t, n = by["seeded T=0.8, kernel"], by["seeded T=0.8, torch"], by["seeded T=0.8, kernel, no overlap"]
        g = by["greedy"]
        print(f"| {batch} | {g:.0f} | {k:.0f} ({k / g:.2f}x greedy) | {n:.0f} ({n / g:.2f}x) | {t:.0f} ({t / g:.2f}x) "
              f"| {k / t:.2f}x | {k / n:.2f}x |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"device": name, "vocab": args.vocab, "layers": args.layers,
                   "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()

"""Host time of each part of a seeded sampled step's queued launch (``LLM._queue_ahead``), one at a time, on the
device: s34 (H100, batch 8, bench-shaped random target) timed ~530 us of host time a step in it beyond what a
greedy step's queued launch takes, with the device kept busy behind it. Each part runs ``--iters`` times in a row
while a long kernel keeps the device busy (as the step's forward does), and the host wall time per call is
printed; a part that waits for the device shows as the busy kernel's length.

    python benchmarks/keyed_launch.py --batch 8 --vocab 4096
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--busy", type=int, default=4096, help="matmul size that keeps the device busy meanwhile")
    args = ap.parse_args()
    from specdec.kernels.keyed_triton import keyed_argmax
    from specdec.keyed import _kernel_samples, inverse_temperatures, keyed_plain_samples, rows_keys

    dev = torch.device("cuda")
    b = args.batch
    logits = torch.randn(b, args.vocab, device=dev, dtype=torch.bfloat16)
    rows, positions, temps, seeds = list(range(b)), [100 + i for i in range(b)], [0.8] * b, list(range(b))
    keys = rows_keys(seeds, positions)
    meta = torch.tensor(np.stack([rows, keys[:, 0], keys[:, 1]]), device=dev)
    inv = torch.from_numpy(inverse_temperatures(temps)).to(dev)
    host = torch.empty(b, dtype=torch.long, pin_memory=True)
    big = torch.randn(args.busy, args.busy, device=dev, dtype=torch.bfloat16)

    parts = {
        "rows_keys (numpy)": lambda: rows_keys(seeds, positions),
        "torch.empty(pin_memory=True)": lambda: torch.empty((4, b), dtype=torch.long, pin_memory=True),
        "torch.tensor(list).pin_memory()": lambda: torch.tensor(rows).pin_memory(),
        "pinned .to(device, non_blocking)": lambda: host.to(dev, non_blocking=True),
        "keyed_argmax launch": lambda: keyed_argmax(logits, meta, inv),
        "_kernel_samples": lambda: _kernel_samples(logits, rows, temps, keys),
        "keyed_plain_samples": lambda: keyed_plain_samples(logits, rows, positions, temps, seeds),
        "Event() + record": lambda: torch.cuda.Event().record(),
        "D2H copy into pinned, non_blocking": lambda: host.copy_(meta[0], non_blocking=True),
    }
    for name, fn in parts.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        spent = 0.0
        for _ in range(args.iters):
            big @ big  # the device busy for a while: a part that waits for it takes that long
            t = time.perf_counter()
            fn()
            spent += time.perf_counter() - t
        torch.cuda.synchronize()
        t = time.perf_counter()
        big @ big
        torch.cuda.synchronize()
        busy = time.perf_counter() - t
        print(f"{name:40s} {spent / args.iters * 1e6:9.1f} us a call (busy kernel {busy * 1e6:.0f} us)", flush=True)


if __name__ == "__main__":
    main()

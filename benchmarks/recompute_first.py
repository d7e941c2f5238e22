"""Is a bare run's recompute (``ModelRunner.forward_hidden``) slow on its first call in a process, or on every new
shape? On a random bench-shaped target (step graphs captured, as an engine has them), times a sequence of
recomputes of different (rows, width) shapes, each once, in a fresh process; with ``--warm``, after one
one-token recompute (what the engine runs once before its first decode step, ``LLM._warm_recompute``).

    python benchmarks/recompute_first.py --random-bench /tmp/rb [--warm]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = [(8, 64), (8, 64), (8, 65), (8, 97), (4, 64), (2, 30), (8, 200), (1, 17), (8, 64)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-bench", default="/tmp/rb")
    ap.add_argument("--warm", action="store_true", help="one one-token recompute first")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from recompute_profile import prefilled_target

    n = 400
    t, hidden, prompts = prefilled_target(a.random_bench, a.device, 8, n)
    dev = t.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda d=None: None)

    def once(b: int, w: int) -> float:
        sync()
        t0 = time.perf_counter()
        t.forward_hidden(list(range(b)), [p[n - w:] for p in prompts[:b]], [n - w] * b, hidden)
        sync()
        return (time.perf_counter() - t0) * 1e3

    if a.warm:
        print(f"warm-up (1, 1): {once(1, 1):.1f} ms")
    print("  ".join(f"({b}, {w}) {once(b, w):.1f}" for b, w in SHAPES) + "  [rows, width) ms]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

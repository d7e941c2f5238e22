"""What stalls a timed pass: runs ``e2e.py`` with wall-clock watches on the engine's step functions, Triton's
kernel launches and CUDA graph captures, and reports every call that took longer than a threshold (a Triton compile
of a new shape, a graph captured mid-run, a recompute), innermost first, with where it was called from.

    python benchmarks/stall_watch.py --threshold-ms 15 -- --device cuda --model /tmp/bm/bench --no-peers \
        --method-option eagle3.model=/tmp/bm/bench-eagle3 --batch 8 --methods eagle3:3@auto ...

Host time only (no device syncs added): a step that waits for the device shows its wait too, so read the
innermost watched call of each stall.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WATCHED = [
    "specdec.engine:LLM._decode_step", "specdec.engine:LLM._prefill", "specdec.engine:LLM._recompute_bare",
    "specdec.engine:LLM._propose", "specdec.engine:LLM._tree_step", "specdec.runner:ModelRunner.forward_hidden",
    "specdec.runner:ModelRunner.forward", "specdec.verify:Verifier.sample",
    "specdec_eagle.proposer:EagleProposer.propose", "specdec_eagle.chain:GreedyHeadChain.store_kv",
    "triton.runtime.jit:JITFunction.run", "torch.cuda:CUDAGraph.capture_begin",
]
EVENTS: list[dict] = []
DEPTH = [0]


def _where() -> str:
    """The innermost specdec frames of the current stack."""
    frames = [f for f in traceback.extract_stack()[:-3]
              if ("specdec" in f.filename or "benchmarks" in f.filename) and "stall_watch" not in f.filename]
    return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-4:][::-1])


def _watch(owner: object, attr: str, name: str, threshold: float) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def watched(*args, **kwargs):
        DEPTH[0] += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            DEPTH[0] -= 1  # 0: the outermost watched call
            dt = time.perf_counter() - t0
            if dt > threshold:
                what = name
                if name.endswith("JITFunction.run"):
                    what += f" [{getattr(args[0], '__name__', '?')}]"
                EVENTS.append({"call": what, "ms": round(dt * 1e3, 2), "depth": DEPTH[0], "t": time.perf_counter(),
                               "where": _where()})

    setattr(owner, attr, watched)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threshold-ms", type=float, default=15.0)
    ap.add_argument("--out", default=None, help="write the events here (JSON)")
    ap.add_argument("e2e", nargs=argparse.REMAINDER, help="e2e.py's arguments, after --")
    a = ap.parse_args()
    argv = a.e2e[1:] if a.e2e[:1] == ["--"] else a.e2e
    for spec in WATCHED:
        module, path = spec.split(":")
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        _watch(owner, attr, path, a.threshold_ms / 1e3)
    import e2e

    t0 = time.perf_counter()
    rc = e2e.main(argv)
    for e in EVENTS:
        e["t"] = round(e["t"] - t0, 3)
    print(f"\n{len(EVENTS)} watched calls over {a.threshold_ms} ms (t: seconds into the run; d0: outermost):")
    for e in EVENTS:
        print(f"  t={e['t']:8.3f}  {e['ms']:8.2f} ms  d{e['depth']}  {e['call']}  @ {e['where']}")
    if a.out:
        Path(a.out).write_text(json.dumps(EVENTS, indent=1))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

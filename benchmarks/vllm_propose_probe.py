"""Host time of ``propose`` inside a running vLLM engine (CPU build), vLLM's ngram against specdec's through the
adapter (issue 26): one engine per process, the batch-B completion pass of ``vllm_adapter.py`` (8 prompts, 96
new tokens, greedy; B from the second argument, default 1), every ``propose`` call timed by wrapping the
drafter's class after the engine started (numba, which both drafters load, must not be imported before vLLM's CPU
worker starts). Prints one JSON line per engine:
wall seconds of the pass, propose calls, their total and mean time. Run in ``.venv-vllm``; alternate the configs
and repeat, since process starts on a shared machine differ by more than the drafters do:

    for c in "vllm ngram" "vllm + specdec ngram" "vllm ngram" "vllm + specdec ngram"; do
        .venv-vllm/bin/python benchmarks/vllm_propose_probe.py "$c" 1; done
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vllm_adapter as va  # noqa: E402


def main(name: str, batch: int = 1) -> None:
    engine, spec, env = va.CONFIGS[name]
    if engine != "vllm" or spec is None or "ngram" not in name:
        raise SystemExit(f"config {name!r}: pass 'vllm ngram' or 'vllm + specdec ngram'")
    os.environ.update({**va.VLLM_ENV, **env})
    from transformers import AutoTokenizer

    import specdec
    from specdec_tools.bench.workloads import build_workloads

    model = str(specdec.bundled_model("tiny"))
    generate, reset, _ = va._vllm_engine(spec, model, 2048)
    if "specdec" in name:
        from specdec_vllm.proposer import SpecdecProposer as cls
    else:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer as cls
    timed = {"calls": 0, "seconds": 0.0}
    inner = cls.propose

    def propose(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            timed["seconds"] += time.perf_counter() - t0
            timed["calls"] += 1

    cls.propose = propose
    tok = AutoTokenizer.from_pretrained(model)
    calls = build_workloads(tok, ["completion"], 8, batch, 256)[0].calls  # vllm_adapter.py's batch-B pass
    generate([[1, 2, 3, 4, 1, 2, 3, 4]], 8)  # warm-up
    reset()
    timed.update(calls=0, seconds=0.0)
    t0 = time.perf_counter()
    for call in calls:
        if batch == 1:
            for q in call:
                generate([q], 96)
        else:
            generate(call, 96)
    wall = time.perf_counter() - t0
    print(json.dumps({"config": name, "batch": batch, "pass_s": round(wall, 3), "propose_calls": timed["calls"],
                      "propose_ms": round(timed["seconds"] * 1e3, 1),
                      "us_per_call": round(timed["seconds"] / max(timed["calls"], 1) * 1e6, 1)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "vllm + specdec ngram", int(sys.argv[2]) if len(sys.argv) > 2 else 1)

"""s54: Python's garbage collections during timed passes (collector on) of the baseline, fixed k and auto, ngram:4 on
the bundled tiny model at batch 32 (e2e's completion prompts, T = 0): per pass and generation, the collections'
count, total and longest milliseconds (gc.callbacks).

    python benchmarks/results/cpu/s54-2026-12-07/gc_probe.py
"""
import gc
import time

import torch

from specdec import LLM, SamplingParams, bundled_model
from specdec_tools.bench import build_workloads

torch.set_num_threads(1)
B = 32
model = bundled_model("tiny")
engines = {"baseline": LLM(model, device="cpu", max_num_seqs=B)}
for p in ("fixed", "auto"):
    engines[p] = LLM(model, {"method": "ngram", "num_speculative_tokens": 4, "speculation_policy": p}, device="cpu",
                     max_num_seqs=B)
calls = build_workloads(engines["fixed"].tokenizer, ["completion"], 2 * B, B, 256)[0].calls
params = [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in range(2 * B)]
stats: dict[int, list[float]] = {}
start = [0.0]


def callback(phase: str, info: dict) -> None:
    if phase == "start":
        start[0] = time.perf_counter()
        return
    s = stats.setdefault(info["generation"], [0, 0.0, 0.0])
    d = time.perf_counter() - start[0]
    s[0], s[1], s[2] = s[0] + 1, s[1] + d, max(s[2], d)


gc.callbacks.append(callback)
print("objects the collector tracks:", len(gc.get_objects()), "thresholds:", gc.get_threshold())
for rep in range(3):
    for name, llm in engines.items():
        stats.clear()
        t0 = time.perf_counter()
        i = 0
        for c in calls:
            llm.generate(c, params[i:i + len(c)])
            i += len(c)
        print(f"pass {rep} {name}: {time.perf_counter() - t0:.3f} s; generation: (collections, ms, longest ms) "
              + str({g: (s[0], round(s[1] * 1e3, 2), round(s[2] * 1e3, 2)) for g, s in sorted(stats.items())}))

"""torch.compile against our kernels for the target's decode step (issue 28), inside CUDA graphs, one process.

One decode step of a random-init Llama (``target_sweep``'s shapes: batch rows of one new token each, a KV bucket of
``--kv`` positions with ``--context`` of them filled) is captured in a CUDA graph three ways and replayed:

- ``fused``: :class:`specdec.fused.FusedLlama` with its Triton kernels (what ``LLM`` runs on CUDA);
- ``fused+compile``: the same forward under ``torch.compile`` (inductor, no CUDA graphs of its own: ours capture it),
  which fuses the elementwise work between the matmuls by itself and calls our Triton kernels where they remain;
- ``torch+compile``: the fused forward with torch ops only (``FusedLlama(use_triton=False)``: SDPA, torch norms and
  rotary) under ``torch.compile``, so inductor writes every elementwise kernel itself;
- ``hf_layers``: Hugging Face's layers (``fused_forward=False``), the reference.

Prints the replay time of each (median of ``--replays``) and the ratios.

    python benchmarks/target_compile.py --size 1b --batch 1 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from target_sweep import SIZES, build

from specdec import LLM
from specdec.cuda_graphs import capture_graph


def replay_ms(fn, replays: int) -> float:
    """Median milliseconds of a CUDA-graph replay of ``fn`` (captured after two warm-up calls)."""
    graph, _ = capture_graph(fn, None)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / 10 * 1e3)
    return statistics.median(times)


def step_fn(model: torch.nn.Module, name: str, b: int, kv: int, context: int, q: int = 1
            ) -> Callable[[], torch.Tensor]:
    """One step of ``b`` rows of ``q`` tokens (a decode step, or a verify step of k + 1 with the logits of every one)
    over ``context`` committed tokens each, run ``name`` (see ``main``), as a function of no arguments: the target
    forward and the LM head into a float32 buffer, as the step graphs pass it."""
    llm = LLM(model, max_num_seqs=b, max_model_len=kv, fused_forward=name != "hf_layers", cuda_graphs=False)
    t = llm.target
    t.allocate(b)
    for s in range(b):
        t.advance(s, context)
    dev = t.device
    ids = torch.randint(10, 1000, (b, q), device=dev)
    start = torch.full((b,), context, device=dev)
    n = torch.full((b,), q, dtype=torch.long, device=dev)
    row_index = torch.arange(b, device=dev)[:, None]
    logits = torch.empty(b * q, t.lm_head.weight.shape[0], device=dev)
    if name == "torch+compile":
        from specdec.fused import FusedLlama

        t.fused = FusedLlama(t, use_triton=False)
    if name.endswith("+compile"):
        t.fused.forward = torch.compile(t.fused.forward, dynamic=False)

    def step() -> torch.Tensor:
        h, _ = t.run(ids, slice(0, b), row_index, kv, t.step_tensors(start, n, q, kv))
        return t.compute_logits(h.reshape(b * q, -1), out=logits).argmax(-1)

    return step


def measure(model: torch.nn.Module, name: str, b: int, kv: int, context: int, replays: int, q: int = 1
            ) -> tuple[float, float]:
    """(replay ms, setup s) of one step of ``b`` rows of ``q`` tokens (:func:`step_fn`)."""
    step = step_fn(model, name, b, kv, context, q)
    dev = next(model.parameters()).device
    t0 = time.perf_counter()
    ms = replay_ms(step, replays) if dev.type == "cuda" else step() is not None and 0.0
    return ms, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1b", choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--kv", type=int, default=512)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    torch._dynamo.config.recompile_limit = 64
    model = build(args.size)
    for b in args.batch:
        row = {"size": args.size, "batch": b, "kv": args.kv, "context": args.context}
        for name in ("fused", "fused+compile", "torch+compile", "hf_layers"):
            ms, setup = measure(model, name, b, args.kv, args.context, args.replays)
            row[name], row[name + "_setup_s"] = round(ms, 4), round(setup, 1)
            torch.cuda.empty_cache()
        row["compile_over_fused"] = round(row["fused"] / row["fused+compile"], 3)
        row["torch_compile_over_fused"] = round(row["fused"] / row["torch+compile"], 3)
        row["fused_over_hf_layers"] = round(row["hf_layers"] / row["fused"], 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""Where the time of a bare run's recompute goes (``ModelRunner.forward_hidden``, issue 24): on a random
bench-shaped target with its step graphs captured (the fused forward on, as an engine has it), batch-8 recomputes
of growing widths, each timed three ways side by side: ``forward_hidden`` as the engine calls it (the Hugging Face
modules, KV writes to scratch), the same eager forward writing its KV (``_eager``), and the fused forward with
scratch writes; then one ``forward_hidden`` call under the torch profiler (the top ops by host and device time).

    python benchmarks/recompute_profile.py --random-bench /tmp/rb [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _timed(fn, device, *args) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        fn(*args)
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random-bench", default="/tmp/rb")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--widths", type=int, nargs="+", default=[17, 40, 97, 200, 333])
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    b, prompt_len = a.batch, 200 + max(a.widths)
    t, hidden, prompts = prefilled_target(a.random_bench, a.device, b, prompt_len)
    dev, slots = t.device, list(range(b))
    rows = []
    for w in a.widths:
        starts = [prompt_len - w] * b
        tokens = [p[prompt_len - w:] for p in prompts]
        times = {}
        calls = {"forward_hidden": lambda x, s: t.forward_hidden(slots, x, s, hidden),
                 "eager_writing": lambda x, s: t._eager(slots, x, s, [0] * b, hidden, write_kv=True),
                 "fused_scratch": lambda x, s: _fused_scratch(t, slots, x, s, hidden),
                 "fused_bucketed": lambda x, s: _fused_scratch(t, slots, x, s, hidden, buckets=True)}
        for name, fn in calls.items():
            times[name] = [round(_timed(fn, dev, tokens, starts), 2) for _ in range(3)]
        rows.append({"width": w, **times})
        print(f"batch {b} width {w}: " + "  ".join(f"{k} {v} ms" for k, v in times.items()), flush=True)
    w = a.widths[len(a.widths) // 2]
    starts, tokens = [prompt_len - w] * b, [p[prompt_len - w:] for p in prompts]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t.forward_hidden(slots, tokens, starts, hidden)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60)
    print(table)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "recompute.json").write_text(json.dumps(rows, indent=1))
        (Path(a.out) / "recompute-profile.txt").write_text(table)
    return 0


def prefilled_target(root: str, device: str, batch: int, prompt_len: int):
    """A random bench-shaped target under ``root`` (:func:`gpu_eagle_profile.random_bench`) with its step graphs
    captured, as an engine has it, and ``batch`` slots each holding a committed random prompt of ``prompt_len``
    tokens: ``(target, the eagle3 head's HiddenStateRequest, prompts)``."""
    from gpu_eagle_profile import random_bench

    from specdec import HFTargetModel, HiddenStateRequest

    target, _ = random_bench(root, "eagle3")
    cuda = torch.device(device).type == "cuda"
    t = HFTargetModel(target, dtype="bfloat16" if cuda else "float32", device=device, max_model_len=2048)
    t.allocate(batch)
    hidden = HiddenStateRequest(last_layer=False, aux_layer_ids=(2, 6, 10))
    t.capture_graphs([1, 4], hidden=hidden, use_graphs=cuda)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 4000, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    t.forward(list(range(batch)), prompts, [1] * batch)
    for s in range(batch):
        t.advance(s, prompt_len)
    return t, hidden, prompts


def _fused_scratch(t, slots, tokens, starts, hidden, buckets=False):
    """The fused forward with every KV write at scratch (what forward_hidden ran before b7214ed); ``buckets``: its
    width padded to a power of two >= 64 and its KV length to a power of two >= 128 (the prefill graphs' and KV
    buckets' shapes, whose Triton kernels the capture compiled)."""
    from specdec.cuda_graphs import kv_buckets

    lens = [len(x) for x in tokens]
    b, q = len(slots), max(lens)
    kv = max(a + n for a, n in zip(starts, lens))
    if buckets:
        q = next(x for x in kv_buckets(t.max_model_len, 64) if x >= q)
        kv = next(x for x in kv_buckets(t.max_model_len) if x >= kv)
    dev = t.device
    from specdec.layout import pack_tokens
    ids = torch.from_numpy(pack_tokens(list(range(b)), tokens, lens, b, q)).to(dev)
    slot_t = torch.tensor(slots, device=dev)
    pos, _, mask = t.step_tensors(torch.tensor(starts, device=dev), torch.tensor(lens, device=dev), q, kv)
    with torch.inference_mode():
        return t.run(ids, slice(0, b), slot_t[:, None], kv, (pos, torch.full_like(pos, t.cache.scratch), mask),
                     tuple(hidden.aux_layer_ids))


if __name__ == "__main__":
    raise SystemExit(main())

"""Rejection sampler: Triton kernels vs the torch reference, side by side in one run.

Times the verification proper on prepared inputs (float32 target probs, the same random numbers for
both: ``sample_prepared`` vs ``sample_prepared_triton``), and the whole call from logits
(``rejection_sample`` vs ``rejection_sample_triton``), for B x k x V. The same run measures the
device's copy bandwidth (a large device-to-device copy, bytes read + written) and reports the bytes
the kernels must move over their time as a fraction of it. Every timed configuration is also a
parity check: both implementations must return the same tokens.

    python benchmarks/bench_sampler.py             # CUDA: full table; JSON to $OUT or benchmarks/results/
    python benchmarks/bench_sampler.py --check     # CUDA: parity at V=152064 and a distribution test
    python benchmarks/bench_sampler.py --quick     # tiny shapes; on CPU the torch path only (smoke test)
    TRITON_INTERPRET=1 python benchmarks/bench_sampler.py --quick --check   # CPU, kernels interpreted
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specdec import PLACEHOLDER_TOKEN_ID, SamplingMetadata, SamplingParams, SpecDecodeMetadata, rejection_sample
from specdec.kernels import triton_available
from specdec.rejection_sampler import prepare_sampler_inputs, sample_prepared

FULL = {"batch": [1, 64, 256], "k": [1, 5, 8], "vocab": [32_000, 128_256]}
QUICK = {"batch": [1, 4], "k": [1, 3], "vocab": [1_000]}
CHECK_VOCAB = 152_064  # Qwen2 / Qwen2.5


# ------------------------------------------------------------------------------------------- inputs


def make_batch(batch: int, k: int, vocab: int, mode: str, device: torch.device, seed: int, bad_rate: float = 0.0):
    """(metadata, draft_probs, logits, sampling_metadata) with every request drafting k tokens.

    ``random``: drafts sampled from q, a perturbed softmax of the target logits (draft probs given);
    ``onehot``: the same drafts without draft probs; ``greedy``: the target argmax 3 times in 4;
    ``mixed``: alternate greedy / random (seeded every third) requests with draft probs.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    n = batch * k
    logits = torch.randn(n + batch, vocab, device=device, generator=g)  # [N + B, V]
    rows = torch.arange(n + batch, device=device).view(batch, k + 1)[:, :k].reshape(-1)  # target rows
    q = torch.softmax(logits[rows] + 0.5 * torch.randn(n, vocab, device=device, generator=g), -1)  # [N, V]
    if mode == "greedy":
        drafts = logits[rows].argmax(-1)
        noise = torch.randint(vocab, (n,), device=device, generator=g)
        drafts = torch.where(torch.rand(n, device=device, generator=g) < 0.75, drafts, noise)
    else:
        drafts = torch.multinomial(q, 1, generator=g).view(-1)
    if bad_rate:
        bad = torch.tensor([-1, vocab, vocab + 9], device=device)
        pick = bad[torch.randint(3, (n,), device=device, generator=g)]
        drafts = torch.where(torch.rand(n, device=device, generator=g) < bad_rate, pick, drafts)
    meta = SpecDecodeMetadata.from_draft_token_ids(drafts.view(batch, k).tolist(), device=device)
    if mode == "greedy":
        params = [SamplingParams(temperature=0.0)] * batch
    elif mode == "mixed":
        params = [SamplingParams(temperature=0.0) if i % 2 else SamplingParams(temperature=0.9, seed=i)
                  if i % 3 == 0 else SamplingParams(temperature=1.1, top_k=50, top_p=0.9) for i in range(batch)]
    else:
        params = [SamplingParams(temperature=1.0)] * batch
    draft_probs = q if mode in ("random", "mixed") else None
    return meta, draft_probs, logits, SamplingMetadata.from_params(params, device)


# ------------------------------------------------------------------------------------------- timing


class Timer:
    """Median time of ``fn`` in microseconds: CUDA events around each call after warm-up, with the L2
    cache flushed before each call (so small batches are not served from cache); wall clock on CPU."""

    def __init__(self, device: torch.device, warmup: int, rep: int) -> None:
        self.device, self.warmup, self.rep = device, warmup, rep
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        if self.device.type != "cuda":
            times = []
            for _ in range(self.rep):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e6)
            return statistics.median(times)
        torch.cuda.synchronize(self.device)
        events = []
        for _ in range(self.rep):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    """Bytes read + written per second by a device-to-device copy of ``nbytes``."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (timer(lambda: dst.copy_(src)) * 1e-6)


def kernel_bytes(out: torch.Tensor, meta, inputs, draft_probs) -> int:
    """Bytes the kernels cannot avoid for this outcome: a greedy request reads every one of its
    logits rows; a random request reads one row of p and of noise, plus the rejected draft's q row."""
    vocab = inputs.logits.shape[1]
    num = torch.tensor(meta.num_draft_tokens, device=out.device)
    accept_len = (out != PLACEHOLDER_TOKEN_ID).sum(1) - 1
    greedy = inputs.is_greedy
    rows_logits = int(((num + 1) * greedy).sum()) * inputs.logits.element_size()
    random = ~greedy
    rows_pe = int(random.sum()) * 8  # p and noise, float32
    rows_q = int((random & (accept_len < num)).sum()) * draft_probs.element_size() if draft_probs is not None else 0
    return (rows_logits + rows_pe + rows_q) * vocab


# ---------------------------------------------------------------------------------------- benchmark


def run_bench(args, device: torch.device, impl) -> dict:
    timer = Timer(device, args.warmup, args.rep)
    copy_bw = copy_bandwidth(device, timer, (1 << 30) if device.type == "cuda" else (64 << 20))
    shapes = QUICK if args.quick else FULL
    rows = []
    for mode in args.modes:
        for vocab in args.vocab or shapes["vocab"]:
            for batch in args.batch or shapes["batch"]:
                for k in args.k or shapes["k"]:
                    rows.append(bench_one(mode, batch, k, vocab, device, timer, impl, args, copy_bw))
                    print(_row_line(rows[-1]), flush=True)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return {"copy_bandwidth_GBps": copy_bw / 1e9, "rows": rows}


def bench_one(mode, batch, k, vocab, device, timer, impl, args, copy_bw) -> dict:
    meta, draft_probs, logits, sm = make_batch(batch, k, vocab, mode, device, seed=batch * 7 + k)
    torch.manual_seed(0)
    inputs = prepare_sampler_inputs(meta, draft_probs, logits, sm)
    out = sample_prepared(meta, draft_probs, inputs)
    ref = lambda: sample_prepared(meta, draft_probs, inputs)  # noqa: E731
    row = {"mode": mode, "B": batch, "k": k, "V": vocab,
           "mean_accept_len": float(((out != PLACEHOLDER_TOKEN_ID).sum(1) - 1).float().mean()),
           "torch_us": timer(ref), "torch_graph_us": graph_time(timer, ref, args.graphs),
           "torch_e2e_us": timer(lambda: rejection_sample(meta, draft_probs, logits, sm))}
    if impl is None:
        return row
    row["bytes"] = kernel_bytes(out, meta, inputs, draft_probs)
    row["match"] = True
    sweep = {}
    for block_v in args.block_v:
        for splits in args.splits:
            def fn(bv=block_v, ns=splits or None):
                return impl.sample_prepared_triton(meta, draft_probs, inputs, block_v=bv, num_splits=ns)

            row["match"] &= bool(torch.equal(fn(), out))
            key = f"{block_v or 'default'}" + (f"/s{splits}" if splits else "")
            sweep[key] = {"eager_us": timer(fn), "graph_us": graph_time(timer, fn, args.graphs)}
    # The fastest tile by GPU time (graph replay) where capture worked, else by eager time.
    best = min(sweep, key=lambda bv: sweep[bv]["graph_us"] or sweep[bv]["eager_us"])
    eager, graph = sweep[best]["eager_us"], sweep[best]["graph_us"]
    row |= {"block_v": best, "triton_by_block_v": sweep, "triton_us": eager, "triton_graph_us": graph,
            "speedup": row["torch_us"] / eager, "frac_copy_bw": row["bytes"] / (eager * 1e-6) / copy_bw,
            "triton_e2e_us": timer(lambda: impl.rejection_sample_triton(meta, draft_probs, logits, sm))}
    if graph and row["torch_graph_us"]:
        row["graph_speedup"] = row["torch_graph_us"] / graph
    if graph:
        row["frac_copy_bw_graph"] = row["bytes"] / (graph * 1e-6) / copy_bw
    row["e2e_speedup"] = row["torch_e2e_us"] / row["triton_e2e_us"]
    if not row["match"]:
        print(f"MISMATCH: triton and torch tokens differ for {mode} B={batch} k={k} V={vocab}", file=sys.stderr)
    return row


def graph_time(timer: Timer, fn, enabled: bool) -> float | None:
    """Median replay time of ``fn`` captured in a CUDA graph: GPU time without Python launch overhead.
    ``None`` off CUDA, when disabled, or when capture fails (reported, the run goes on)."""
    if not enabled or timer.device.type != "cuda":
        return None
    try:
        stream = torch.cuda.Stream(timer.device)
        stream.wait_stream(torch.cuda.current_stream(timer.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(timer.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return timer(graph.replay)
    except Exception as exc:  # a benchmark column, not a reason to abort the table
        print(f"  graph capture failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        torch.cuda.synchronize(timer.device)
        return None


HEADER = ("| mode | B | k | V | mean accepted | torch µs | triton µs | speedup | torch graph µs | triton graph µs "
          "| graph speedup | block_v | MB moved | % copy BW | % copy BW (graph) | e2e torch µs | e2e triton µs "
          "| e2e speedup | same tokens |")


def _row_line(r: dict) -> str:
    def f(key, fmt, suffix=""):
        return format(r[key], fmt) + suffix if r.get(key) is not None else "-"

    def pct(key):
        return f"{100 * r[key]:.0f}%" if r.get(key) is not None else "-"

    mb = f"{r['bytes'] / 1e6:.1f}" if "bytes" in r else "-"
    return (f"| {r['mode']} | {r['B']} | {r['k']} | {r['V']} | {r['mean_accept_len']:.2f} | {f('torch_us', '.1f')} "
            f"| {f('triton_us', '.1f')} | {f('speedup', '.2f', 'x')} | {f('torch_graph_us', '.1f')} "
            f"| {f('triton_graph_us', '.1f')} | {f('graph_speedup', '.2f', 'x')} | {r.get('block_v', '-')} | {mb} "
            f"| {pct('frac_copy_bw')} | {pct('frac_copy_bw_graph')} | {f('torch_e2e_us', '.1f')} "
            f"| {f('triton_e2e_us', '.1f')} | {f('e2e_speedup', '.2f', 'x')} | {r.get('match', '-')} |")


# -------------------------------------------------------------------------------------------- check


def run_check(args, device: torch.device, impl) -> dict:
    vocab = 1_000 if args.quick else CHECK_VOCAB
    result = {"vocab": vocab, "parity": [], "distribution": []}
    cases = [(1, 1), (7, 5)] if args.quick else [(1, 1), (7, 5), (64, 8), (256, 5)]
    for (batch, k) in cases:
        for mode in ("mixed", "onehot", "greedy"):
            for dtype in (torch.float32, torch.bfloat16):
                meta, q, logits, _ = make_batch(batch, k, vocab, mode, device, seed=batch + k, bad_rate=0.05)
                q, logits = (q.to(dtype) if q is not None else None), logits.to(dtype)
                params = _mixed_params(batch) if mode != "greedy" else [SamplingParams(temperature=0.0)] * batch
                sm_ref, sm_tri = (SamplingMetadata.from_params(params, device) for _ in range(2))
                ok = True
                for step in range(2):  # two calls: seeded generators must advance alike
                    torch.manual_seed(step)
                    want = rejection_sample(meta, q, logits, sm_ref)
                    torch.manual_seed(step)
                    ok &= bool(torch.equal(impl.rejection_sample_triton(meta, q, logits, sm_tri), want))
                torch.manual_seed(5)
                inputs = prepare_sampler_inputs(meta, q, logits, sm_ref)
                want = sample_prepared(meta, q, inputs)
                for block_v, splits in ((1024, 1), (4096, None), (None, 3)):
                    got = impl.sample_prepared_triton(meta, q, inputs, block_v=block_v, num_splits=splits)
                    ok &= bool(torch.equal(got, want))
                case = {"B": batch, "k": k, "mode": mode, "dtype": str(dtype), "same_tokens": ok}
                result["parity"].append(case)
                print(f"parity V={vocab} B={batch} k={k} {mode} {dtype}: {'OK' if ok else 'MISMATCH'}", flush=True)
    samples = 6_000 if args.quick else 200_000
    for one_hot in (False, True):
        result["distribution"].append(distribution_check(impl, device, vocab, samples, one_hot))
    result["ok"] = all(c["same_tokens"] for c in result["parity"]) and all(d["ok"] for d in result["distribution"])
    return result


def _mixed_params(batch: int) -> list[SamplingParams]:
    choices = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=3),
               SamplingParams(temperature=1.0, top_k=40), SamplingParams(temperature=1.2, top_p=0.85, seed=9),
               SamplingParams(temperature=1.0)]
    return [choices[i % len(choices)] for i in range(batch)]


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty chi-square quantile; z = 3.719 is the normal 1 - 1e-4 quantile."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _follows(tokens: np.ndarray, p: np.ndarray, hot: np.ndarray, what: str) -> dict:
    """Chi-square of ``tokens`` against ``p`` over the hot tokens plus one bucket for all others."""
    n = len(tokens)
    counts = np.bincount(tokens, minlength=len(p)).astype(np.float64)
    obs = np.append(counts[hot], n - counts[hot].sum())
    exp = np.append(p[hot], 1.0 - p[hot].sum()) * n
    keep = exp > 5  # chi-square needs non-tiny expected counts; the rest are merged
    obs = np.append(obs[keep], obs[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    chi2 = float(((obs - exp) ** 2 / np.maximum(exp, 1e-12)).sum())
    df = len(obs) - 1
    tv = 0.5 * float(np.abs(counts / n - p).sum())
    if df < 1:
        print(f"  {what}: n={n}, too few samples for a chi-square test (skipped)")
        return {"what": what, "n": n, "skipped": True, "ok": True}
    ok = chi2 < _chi2_critical(df)
    print(f"  {what}: n={n} chi2={chi2:.1f} (< {_chi2_critical(df):.1f}, df {df}) TV={tv:.4f} -> "
          f"{'OK' if ok else 'FAIL'}")
    return {"what": what, "n": n, "chi2": chi2, "df": df, "tv": tv, "ok": ok}


def distribution_check(impl, device, vocab: int, samples: int, one_hot: bool, k: int = 3) -> dict:
    """Tokens emitted by the kernels follow the target distribution (lossless), and acceptance
    rates match theory, on a vocabulary whose mass sits on 24 tokens spread over every tile."""
    temperature = 0.8
    g = torch.Generator().manual_seed(1)
    hot = np.unique(np.append(np.linspace(0, vocab - 1, 23).round().astype(np.int64), vocab // 2 + 1))
    base = torch.full((k + 1, vocab), -20.0, dtype=torch.float64)
    base[:, hot] = torch.randn(k + 1, len(hot), generator=g, dtype=torch.float64) * 2.5
    p = torch.softmax(base / temperature, -1)  # [k+1, V] exact float64 target
    q = torch.softmax(base + torch.randn(k + 1, vocab, generator=g, dtype=torch.float64), -1)[:k]
    q[torch.arange(k), p[:k].argsort(-1, descending=True)[:, 1]] = 0.0  # q misses p's second token
    q = (q / q.sum(-1, keepdim=True)).float()  # [k, V]
    base_d, q_d = base.float().to(device), q.to(device)
    chunk = 2_000 if vocab <= 10_000 else 2_048
    outs = []
    for start in range(0, samples, chunk):
        b = min(chunk, samples - start)
        drafts = torch.multinomial(q_d, b, replacement=True).T  # [b, k]
        meta = SpecDecodeMetadata.from_draft_token_ids(drafts.tolist(), device=device)
        logits = base_d.unsqueeze(0).expand(b, k + 1, vocab).reshape(b * (k + 1), vocab)
        draft_probs = None if one_hot else q_d.repeat(b, 1)
        sm = SamplingMetadata(temperature=torch.full((b,), temperature, device=device),
                              top_k=torch.zeros(b, dtype=torch.int64, device=device),
                              top_p=torch.ones(b, device=device))
        outs.append(impl.rejection_sample_triton(meta, draft_probs, logits, sm).cpu())
    out = torch.cat(outs).numpy()  # [samples, k+1]
    p_np, q_np = p.numpy(), q.double().numpy()
    name = "one-hot drafts" if one_hot else "draft probs"
    print(f"distribution V={vocab} ({name}):")
    checks = [_follows(out[:, 0], p_np[0], hot, "first token")]
    for j in range(1, k + 1):
        reached = out[:, j] != PLACEHOLDER_TOKEN_ID
        checks.append(_follows(out[reached, j], p_np[j], hot, f"token {j} given {j} accepted"))
        prev = out[:, j - 1] != PLACEHOLDER_TOKEN_ID
        rate = reached.sum() / prev.sum()
        theory = float((q_np[j - 1] * p_np[j - 1]).sum() if one_hot else np.minimum(p_np[j - 1], q_np[j - 1]).sum())
        tol = 4 * math.sqrt(theory * (1 - theory) / prev.sum()) + 0.002
        ok = abs(rate - theory) < tol
        print(f"  acceptance at position {j - 1}: {rate:.4f} vs theory {theory:.4f} (tol {tol:.4f}) -> "
              f"{'OK' if ok else 'FAIL'}")
        checks.append({"what": f"acceptance {j - 1}", "rate": float(rate), "theory": theory, "ok": ok})
    return {"draft": name, "samples": samples, "checks": checks, "ok": all(c["ok"] for c in checks)}


# --------------------------------------------------------------------------------------------- main


def _environment(device: torch.device) -> dict:
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "python": platform.python_version(), "device": str(device),
           "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1"}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    if triton_available():
        import triton

        env["triton"] = triton.__version__
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test)")
    ap.add_argument("--check", action="store_true", help="parity at V=152064 and a distribution test, no timing")
    ap.add_argument("--modes", nargs="+", default=["random", "greedy"],
                    choices=["random", "onehot", "greedy", "mixed"])
    ap.add_argument("--batch", type=int, nargs="+")
    ap.add_argument("-k", type=int, nargs="+")
    ap.add_argument("--vocab", type=int, nargs="+")
    ap.add_argument("--block-v", type=int, nargs="+", default=None,
                    help="vocabulary tiles to time (the fastest is reported); default 1024 2048 4096 on CUDA")
    ap.add_argument("--splits", type=int, nargs="+", default=[0],
                    help="programs per vocabulary row to sweep (0: the kernels' default)")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false",
                    help="skip the CUDA-graph replay timings (GPU time without launch overhead)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--rep", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/bench_sampler*.json or benchmarks/results/)")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    impl = None
    if triton_available() and (device.type == "cuda" or interpret):
        from specdec.kernels import rejection_triton as impl
    elif device.type != "cuda" and not args.quick:
        print("No CUDA device: use --quick (torch path only, or kernels interpreted with TRITON_INTERPRET=1).")
        return 2
    if args.check and impl is None:
        print("--check needs the kernels: a CUDA device with triton, or TRITON_INTERPRET=1 on CPU.")
        return 2
    if args.block_v is None:
        args.block_v = [1024, 2048, 4096] if device.type == "cuda" else [None]
    args.warmup = args.warmup if args.warmup is not None else (10 if device.type == "cuda" else 1)
    args.rep = args.rep if args.rep is not None else (50 if device.type == "cuda" else 3)
    env = _environment(device)
    print(f"device {env.get('gpu', device)}; torch {env['torch']}; triton {env.get('triton', 'absent')}"
          f"{' (interpreter)' if interpret else ''}; kernels {'on' if impl else 'off (torch only)'}")

    if args.check:
        result = {"environment": env, "check": run_check(args, device, impl)}
        ok = result["check"]["ok"]
        print(f"check: {'PASSED' if ok else 'FAILED'}")
        name = "bench_sampler_check"
    else:
        print(HEADER)
        print("|" + " --- |" * (HEADER.count("|") - 1))
        result = {"environment": env, "bench": run_bench(args, device, impl)}
        bw = result["bench"]["copy_bandwidth_GBps"]
        print(f"\ndevice-to-device copy bandwidth (read + write): {bw:.0f} GB/s")
        ok = all(r.get("match", True) for r in result["bench"]["rows"])
        name = "bench_sampler"
    if args.quick:
        name += "_quick"
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                                           Path(__file__).resolve().parent / "results") / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

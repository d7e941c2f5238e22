"""The target forward at production sizes (issue 28): our baseline decode (CUDA graphs) with the fused forward
(``fused_forward=True``) against Hugging Face's layers in the same graphs (``fused_forward=False``), and optionally
Hugging Face's own ``generate`` (eager, and static cache compiled), on random-init Llama targets, in one process.
Reports tok/s, the ratios, and the step's share of the weight-bandwidth floor (the bytes of every weight read once
per step, at the copy bandwidth measured in the same run), over the whole generate call and for one captured decode
step alone (``target_compile``'s measure: without sampling, the host loop or the prefill).

    python benchmarks/target_sweep.py --sizes 1b 3b --batch 1 8 --out benchmarks/results/h200/target-sweep
    python benchmarks/target_sweep.py --sizes 1b --batch 1 --hf     # + HF eager and HF static-cache compiled

Random weights give random tokens; greedy decoding of a random model still runs every kernel a trained one does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec import LLM, SamplingParams

SIZES = {  # Llama-3.2-1B/3B and Llama-3-8B shapes (vocabulary 128256, GQA 8 KV heads), plus the bench model's
    "bench": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=12, vocab_size=32000, tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


def build(size: str) -> torch.nn.Module:
    """A random-init Llama of ``size`` in bfloat16 on the GPU (initialised there: seconds, not minutes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=4096, rope_theta=500000.0, **SIZES[size])
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads: every parameter once (a tied embedding once, as the LM head), except the
    embedding table when it is not the LM head (a step reads only its rows)."""
    seen, total = set(), 0
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    for p in model.parameters():
        if p.data_ptr() in seen or (p is embed and embed.data_ptr() != head.data_ptr()):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (read + write of a 2 GiB buffer, best of 5)."""
    x = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * x.numel() * x.element_size() / best


def time_llm(llm: LLM, prompts: list[list[int]], new: int, repeats: int) -> float:
    """tok/s of ``llm`` over ``prompts`` (greedy, ``new`` tokens each), best of ``repeats`` after a warm-up."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompts, params)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return len(prompts) * new / best


def time_hf(model: torch.nn.Module, prompts: list[list[int]], new: int, static: bool) -> float:
    """tok/s of Hugging Face ``generate``: eager with its dynamic cache, or with a static cache, which ``generate``
    compiles by itself on CUDA (``torch.compile`` of the decoding forward, its default ``CompileConfig``:
    fullgraph, ``reduce-overhead``, i.e. CUDA graphs), after two warm-up calls (compile, graph capture)."""
    ids = torch.tensor(prompts, device="cuda")
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    if static:
        kw["cache_implementation"] = "static"
    for _ in range(2 if static else 1):
        model.generate(ids, **kw)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, **kw)
    torch.cuda.synchronize()
    return len(prompts) * new / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1b", "3b"], choices=sorted(SIZES))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hf", action="store_true", help="also Hugging Face generate: eager and static compiled")
    ap.add_argument("--out", default="benchmarks/results/target-sweep")
    args = ap.parse_args()
    from target_compile import measure  # it imports this module's SIZES and build

    bw = copy_bandwidth()
    rows = []
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}; torch {torch.__version__}")
    for size in args.sizes:
        model = build(size)
        wb = weight_bytes(model)
        floor_ms = wb / bw * 1e3
        g = torch.Generator().manual_seed(1)
        for b in args.batch:
            prompts = torch.randint(10, SIZES[size]["vocab_size"], (b, args.prompt_len), generator=g).tolist()
            row = {"size": size, "batch": b, "weight_gb": round(wb / 1e9, 3), "floor_ms": round(floor_ms, 3)}
            for name, fused in (("fused", True), ("hf_layers", False)):
                llm = LLM(model, max_num_seqs=b, max_model_len=args.prompt_len + args.new + 8, fused_forward=fused)
                row[name] = round(time_llm(llm, prompts, args.new, args.repeats), 1)
                del llm
                torch.cuda.empty_cache()
            if args.hf:
                row["hf_eager"] = round(time_hf(model, prompts, args.new, static=False), 1)
                row["hf_static_compiled"] = round(time_hf(model, prompts, args.new, static=True), 1)
                row["fused_over_hf_static_compiled"] = round(row["fused"] / row["hf_static_compiled"], 3)
            step_ms = b / row["fused"] * 1e3
            row["fused_floor_share"] = round(floor_ms / step_ms, 3)
            # one captured decode step alone (no sampling, host loop or prefill), halfway through the context
            row["step_ms"] = round(measure(model, "fused", b, 512, args.prompt_len + args.new // 2, 30)[0], 4)
            row["step_floor_share"] = round(floor_ms / row["step_ms"], 3) if row["step_ms"] else 0.0
            torch.cuda.empty_cache()
            row["fused_over_hf_layers"] = round(row["fused"] / row["hf_layers"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "target-sweep.json").write_text(json.dumps({"bandwidth_tb_s": bw / 1e12, "rows": rows}, indent=1))
    lines = ["| size | batch | ours fused tok/s | ours HF layers tok/s | fused / HF layers | share of floor | captured "
             "step ms (share) |" + (" HF eager | HF static compiled | fused / HF static compiled |" if args.hf else ""),
             "| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- | --- |" if args.hf else "")]
    for r in rows:
        extra = (f" {r['hf_eager']} | {r['hf_static_compiled']} | {r['fused_over_hf_static_compiled']}x |"
                 if args.hf else "")
        lines.append(f"| {r['size']} | {r['batch']} | {r['fused']} | {r['hf_layers']} | {r['fused_over_hf_layers']}x "
                     f"| {r['fused_floor_share']:.0%} | {r['step_ms']} ({r['step_floor_share']:.0%}) |{extra}")
    (out / "target-sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

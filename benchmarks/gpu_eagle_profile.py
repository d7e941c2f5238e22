"""Where a hidden-state method's decode step time goes (issues 21-23; eagle3 unless ``--method medusa`` or
``dflash``): one request, greedy, the proposer's ``propose`` timed with device syncs around it, how many steps
the captured graphs drafted, and a cProfile of the whole loop (host functions by cumulative time).

    python benchmarks/gpu_eagle_profile.py --model .bench-models/bench --head .bench-models/bench-eagle3 -k 5
    python benchmarks/gpu_eagle_profile.py --device cpu            # bundled tiny + tiny-eagle3
    python benchmarks/gpu_eagle_profile.py --random-bench /tmp/rb  # random-init bench-shaped target and head
    python benchmarks/gpu_eagle_profile.py --random-bench /tmp/rb --method dflash -k 7 --option draft_cuda_graphs=false

A random head drafts garbage, so acceptance is near zero, but each step still drafts k tokens: the cost of a
step's drafting is what it measures.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import pstats
import shutil
import time
from pathlib import Path

import torch


def random_bench(root: str, method: str = "eagle3", draft_vocab: int = 8192) -> tuple[str, str]:
    """A random-init Llama of the bench target's shape (the bundled tokenizer) and an untrained head of
    ``method`` (eagle3, medusa: 4 heads, dflash: one layer, blocks of 8) for it, written under ``root``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec import bundled_model
    from specdec_tools.train import TargetInfo, build_trainer

    torch.manual_seed(0)
    target = str(Path(root) / "target")
    if not (Path(target) / "config.json").exists():
        LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=768, intermediate_size=2304, num_hidden_layers=12,
                                     num_attention_heads=12, max_position_embeddings=2048)
                         ).to(torch.bfloat16).save_pretrained(target)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(bundled_model("tiny")) / f, target)
    head = Path(root) / method
    head.mkdir(parents=True, exist_ok=True)
    if method == "medusa":
        from specdec_medusa.train import MedusaTrainer as trainer
        options = {"num_heads": 4}
    elif method == "dflash":
        from specdec_dflash.train import DFlashTrainer as trainer
        options = {}
    else:
        from specdec_eagle.train import Eagle3Trainer as trainer
        options = {"draft_vocab_size": min(draft_vocab, 4096)}
    build_trainer(trainer, TargetInfo.from_path(target), options).save(head)
    return target, str(head)


def chain_buckets(chain) -> None:
    """Replay time of the batch-1 chain in each KV bucket (idle inputs: the same kernels, writes to scratch),
    then the CUDA kernels of the largest one run eagerly."""
    from torch.profiler import ProfilerActivity, profile

    bb = chain.batches[0]
    for kb in chain.kvs:
        c = chain.chains[(bb, kb)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            c.graph.replay()
        start.record()
        for _ in range(50):
            c.graph.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"chain k={chain.k} batch {bb} kv bucket {kb}: {start.elapsed_time(end) / 50 * 1000:.0f} us a replay")
    c = chain.chains[(bb, chain.kvs[-1])]
    with torch.inference_mode():
        c.fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            c.fn()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--head")
    ap.add_argument("-k", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--option", action="append", default=[], help="KEY=JSON, e.g. draft_cuda_graphs=false")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--random-bench", metavar="DIR", help="build a random bench-shaped target and head in DIR")
    ap.add_argument("--chain-buckets", action="store_true",
                    help="CUDA: time one replay of the captured chain per KV bucket (batch 1) and list the kernels "
                         "of the largest bucket's chain run eagerly")
    ap.add_argument("--cudnn-sdpa", action="store_true",
                    help="let the heads' attention use cuDNN's SDPA kernel again (specdec.head_layers.SDPA_BACKENDS)")
    args = ap.parse_args()
    if args.cudnn_sdpa:
        from torch.nn.attention import SDPBackend

        import specdec.head_layers as head_layers

        head_layers.SDPA_BACKENDS = [SDPBackend.CUDNN_ATTENTION, *head_layers.SDPA_BACKENDS]
    if args.random_bench:
        args.model, args.head = random_bench(args.random_bench, args.method)

    from specdec import LLM, SamplingParams, bundled_model

    model = args.model or bundled_model("tiny")
    spec = {"method": args.method, "num_speculative_tokens": args.k}
    if args.head:
        spec["model"] = args.head
    for o in args.option:
        key, _, value = o.partition("=")
        spec[key] = json.loads(value)
    llm = LLM(model, spec, device=args.device, max_num_seqs=1)
    base = LLM(model, device=args.device, max_num_seqs=1)
    prompt = llm.tokenizer(inspect.getsource(json.decoder)[:3000])["input_ids"][:400]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    p = llm.proposer
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    timings: list[float] = []
    real = p.propose

    def timed(batch):
        sync()
        t0 = time.perf_counter()
        out = real(batch)
        sync()
        timings.append(time.perf_counter() - t0)
        return out

    for engine in (base, llm):  # warm-up
        engine.generate([prompt], params)
    passes = {}
    for name, engine in (("baseline", base), (args.method, llm)):
        sync()
        t0 = time.perf_counter()
        out = engine.generate([prompt], params)[0]
        sync()
        passes[name] = (time.perf_counter() - t0, len(out.token_ids))
    graph = getattr(p, "graph_chain", None) or getattr(p, "graph_block", None)  # eagle's, dflash's
    runs0 = graph.runs if graph is not None else 0
    p.propose = timed
    llm.generate([prompt], params)
    p.propose = real
    runs = (graph.runs - runs0) if graph is not None else 0
    ms = sorted(t * 1000 for t in timings)
    print(f"{args.method} k={args.k} on {args.device}: {len(ms)} propose calls, the captured graphs drafted {runs}; "
          f"propose (synced) median {ms[len(ms) // 2]:.3f} ms, min {ms[0]:.3f}, max {ms[-1]:.3f}")
    for name, (sec, n) in passes.items():
        print(f"{name}: {n} tokens in {sec * 1000:.1f} ms ({n / sec:.0f} tok/s)")
    prof = cProfile.Profile()
    prof.enable()
    llm.generate([prompt], params)
    sync()
    prof.disable()
    if args.chain_buckets and getattr(p, "graph_chain", None) is not None:
        chain_buckets(p.graph_chain)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.top)
    print("\n".join(line[:160] for line in buf.getvalue().splitlines()[4:]))
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    print("\n".join(line[:160] for line in buf.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()

"""Why the Triton rotary + KV-write kernel faults in draft-chain capture (issue 19): a diagnosis aid.

Builds a random draft of the bench-draft's shape on the public runner, captures every greedy chain
bucket (``GreedyChain.build``) with the Triton rotary kernel on, and records every Triton compile:
which kernel, whether a CUDA-graph capture was in progress (the suspect: a specialisation seen first
during capture compiles and loads a module there), and its specialisation. Then it replays chains of
several batch and KV buckets on random catch-ups and compares their drafts with the eager chain
(torch rotary step). Each mode runs in its own process with CUDA_LAUNCH_BLOCKING=1 (a fault poisons
the context):

    python benchmarks/gpu_rope_capture.py                  # modes: torch-rope, triton-rope, triton-rope-prewarm
    python benchmarks/gpu_rope_capture.py --one triton-rope
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import traceback

MODES = ("torch-rope", "triton-rope", "triton-rope-prewarm")


def _instrument(events: list) -> None:
    import torch
    from triton.runtime.jit import JITFunction

    original = JITFunction._do_compile

    def recorded(self, key, signature, device, constexprs, options, attrs, warmup):
        events.append((self.fn.__name__, torch.cuda.is_current_stream_capturing(), str(signature)[:160],
                       str(attrs)[:200]))
        return original(self, key, signature, device, constexprs, options, attrs, warmup)

    JITFunction._do_compile = recorded


def one(mode: str, root: str, device: str = "cuda") -> None:
    import torch

    with torch.inference_mode():  # as the proposer runs its chains
        _one(mode, root, device)


def _one(mode: str, root: str, device: str) -> None:
    import torch
    from specdec_draft_model.chain import GreedyChain

    from specdec import ModelRunner
    from specdec.fused import FusedLlama

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    events: list = []
    if device == "cuda":
        _instrument(events)
    draft = ModelRunner(os.path.join(root, "draft"), dtype="bfloat16", device=device, max_model_len=1024)
    draft.allocate(8)
    k = 3
    fused = FusedLlama(draft, triton_rope=mode != "torch-rope")
    if mode == "triton-rope-prewarm":  # every chain bucket once, eagerly, before any capture
        eager = GreedyChain.build(draft, k, use_graphs=False, fused=fused)
        for c in eager.chains.values():
            c.fn()
        print(f"PREWARM compiled {len(events)} kernels", flush=True)
    before = len(events)
    chain = GreedyChain.build(draft, k, use_graphs=device == "cuda", fused=fused)
    if device == "cuda":
        torch.cuda.synchronize()
    during = [e for e in events[before:] if e[1]]
    print(f"RESULT {mode}: chain {'built' if chain is not None else 'FAILED (see the warning above)'}; "
          f"compiles during build {len(events) - before}, of which inside a capture {len(during)}", flush=True)
    for e in events:
        print("COMPILE", e, flush=True)
    if chain is None:
        return
    reference = GreedyChain.build(draft, k, use_graphs=False, fused=FusedLlama(draft, triton_rope=False))
    gen = torch.Generator().manual_seed(0)
    agree = total = 0
    for bb in (1, 2, 5, 8):
        for start in (0, 100, 700):
            slots = list(range(bb))
            tokens = [torch.randint(2, 16000, (k + 1,), generator=gen).tolist() for _ in slots]
            drafts = []
            for c in (reference, chain):
                for s in slots:
                    draft.lengths[s] = start
                drafts.append(c.run(slots, tokens).clone())
            agree += int((drafts[0] == drafts[1]).sum())
            total += drafts[0].numel()
    print(f"RESULT {mode}: replays ok, drafts equal to the eager torch-rope chain {agree}/{total} "
          f"(bf16: near-ties may differ)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", choices=MODES)
    ap.add_argument("--root")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the torch-rope mode's logic eagerly (a check)")
    ap.add_argument("--timeout", type=float, default=200.0)
    args = ap.parse_args()
    if args.one:
        try:
            one(args.one, args.root, args.device)
        except Exception as exc:
            print(f"RESULT {args.one}: FAILED {type(exc).__name__}: {str(exc)[:200]!r}", flush=True)
            traceback.print_exc()
            sys.exit(1)
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tempfile.mkdtemp(prefix="specdec-rope-")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(max_position_embeddings=1024, vocab_size=16384, hidden_size=512,
                                 intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
                                 num_key_value_heads=8)).to(torch.bfloat16).save_pretrained(os.path.join(root, "draft"))
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for mode in MODES:
        try:
            p = subprocess.run([sys.executable, __file__, "--one", mode, "--root", root], env=env, capture_output=True,
                               text=True, timeout=args.timeout)
            out = (p.stdout + p.stderr).splitlines()
            keep = [x for x in out if x.startswith(("RESULT", "COMPILE", "PREWARM")) or "Error" in x or "failed" in x]
            print(f"--- {mode} (rc {p.returncode})\n" + "\n".join(keep[-40:]), flush=True)
        except subprocess.TimeoutExpired:
            print(f"--- {mode}: timed out", flush=True)


if __name__ == "__main__":
    main()

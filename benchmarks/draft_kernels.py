"""Count the kernels one greedy draft-chain step launches, on the CPU (a proxy for its GPU cost).

A small draft's chain step on a GPU costs kernel launches, not arithmetic, so the number of kernels
in the captured chain is what its replay time follows. This runs one chain step of the bundled
``tiny-draft`` (two layers, like ``bench-draft``) through :class:`FusedLlama` on the CPU under the
torch profiler and counts the top-level aten ops that launch a kernel on a GPU: views and no-op
casts are left out, and the RMSNorm and SiLU steps count as one kernel each (their Triton kernels on
CUDA). An op that launches more than one kernel still counts once, so the count is a lower bound.

    python benchmarks/draft_kernels.py            # k=3, batch bucket 4
    python benchmarks/draft_kernels.py -k 5 --batch 8
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile, record_function

NO_KERNEL = {
    "aten::view", "aten::reshape", "aten::slice", "aten::chunk", "aten::split", "aten::transpose", "aten::expand",
    "aten::select", "aten::unsqueeze", "aten::as_strided", "aten::t", "aten::_unsafe_view", "aten::narrow",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::empty", "aten::empty_like", "aten::permute",
    "aten::squeeze", "aten::result_type", "aten::_reshape_alias", "aten::empty_strided",
}
ONE_KERNEL = ("add_rmsnorm", "silu_mul")  # a Triton kernel each on CUDA, several aten ops on the CPU


def _as_one_kernel(name: str, fn):
    def one(*args):
        with record_function("kernel::" + name):
            return fn(*args)
    return one


def count(k: int, batch: int) -> collections.Counter:
    from specdec import LLM, bundled_model

    llm = LLM(bundled_model("tiny"), {"method": "draft_model", "model": bundled_model("tiny-draft"),
                                      "num_speculative_tokens": k}, dtype="float32", max_num_seqs=batch)
    llm.proposer.capture_graphs(use_graphs=False)  # the chain's static buffers, run eagerly
    chain = llm.proposer._chain
    ops = chain.fused.ops
    for name in ONE_KERNEL:
        setattr(ops, name, _as_one_kernel(name, getattr(ops, name)))
    step = chain.chains[(chain.batches[-1], chain.kvs[0])]
    with torch.inference_mode():
        step.fn()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step.fn()
    found = collections.Counter()
    for e in prof.events():
        parent = e.cpu_parent.name if e.cpu_parent is not None else ""
        if e.name.startswith("kernel::"):
            found[e.name.removeprefix("kernel::")] += 1
        elif (e.name.startswith("aten::") and e.name not in NO_KERNEL
              and not parent.startswith(("aten::", "kernel::"))
              and (e.name != "aten::to" or e.cpu_children)):  # a cast that copies, not a no-op one
            found[e.name.removeprefix("aten::")] += 1
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", type=int, default=3, help="draft tokens per step")
    ap.add_argument("--batch", type=int, default=4, help="max_num_seqs (the chain of the largest batch bucket)")
    args = ap.parse_args()
    found = count(args.k, args.batch)
    print(f"draft chain step, k={args.k}, two-layer tiny-draft through FusedLlama: {sum(found.values())} kernels")
    for name, n in found.most_common():
        print(f"  {n:4d}  {name}")


if __name__ == "__main__":
    main()

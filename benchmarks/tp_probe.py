"""Issue 27 (CPU part): can a Hugging Face Llama target run tensor-parallel over 2 CPU processes (gloo)
through transformers' own TP plan, and can specdec's SlotKVCache sit under it with one cache per rank?

Run (no GPU, no internet; every rank writes the same seeded tiny checkpoint to its own temp dir and
transformers initialises the gloo process group itself from torchrun's RANK/WORLD_SIZE/MASTER_* env):

    .venv/bin/torchrun --nproc-per-node 2 --standalone benchmarks/tp_probe.py

transformers' TP loading needs ``accelerate`` (not in specdec's venv). To try it without touching the venv:
``.venv/bin/python -m pip install --no-deps --target /tmp/tp_probe_deps accelerate psutil`` and prefix the
command with ``PYTHONPATH=/tmp/tp_probe_deps``.

Checks, each rank against a single-process (unsharded) copy of the same checkpoint, float32:
  A. ``from_pretrained(path, tp_plan="auto")`` loads and a plain forward gives the same logits;
  B. an explicit ``tp_plan={...}`` dict and ``distributed_config=DistributedConfig(tp_size=2)`` do too;
  C. what the sharded model looks like per rank (config heads, DTensor weights, k_proj output width);
  D. specdec's calling convention (ModelRunner.run): base model + a SlotKVCache built for the LOCAL
     KV heads (num_key_value_heads // tp), an explicit 4-D additive mask and explicit position_ids,
     a 5-token prefill then a 3-token verify step, logits compared with a full-sequence reference;
  E. the same with a SlotKVCache built for the GLOBAL KV heads (config.num_key_value_heads);
  F. specdec's ModelRunner itself around the TP model (2 slots, uneven lengths), as is and with its
     cache replaced by one of the local KV heads.

Found with transformers 5.24.0 / torch 2.13.0+cpu (benchmarks/results/tp-probe-cpu.txt):
  * without accelerate every TP load fails in ``check_and_set_device_map`` ("Using a `device_map`,
    `tp_plan`, ... requires `accelerate`"): the TP path sets device_map=torch.device("cpu") itself.
  * with accelerate, CPU + gloo is supported as is (DISTRIBUTED_BACKEND_MAP cpu -> gloo): A, B, C, D
    and F-with-local-cache all match the single-process model (max abs logit diff 1.2e-7 to 1.5e-7).
  * per rank: config.num_key_value_heads stays 2 (global), k_proj.weight is a DTensor Shard(0) with a
    local (16, 64) block, k_proj's output is the plain local tensor [.., 16] = KV head ``rank``; the
    attention layers hand ``cache.update`` key/value states of the local heads ([b, 1, q, 16]).
  * E and F-as-is fail: "The size of tensor a (2) must match the size of tensor b (4) at non-singleton
    dimension 1" (in SDPA: SlotKVCache.update silently broadcasts the 1 local head into both heads).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import traceback
import warnings

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.distributed import DistributedConfig

from specdec.kv_cache import SlotKVCache
from specdec.runner import ModelRunner

warnings.filterwarnings("ignore", category=FutureWarning)  # tp_plan= kwarg is deprecated in favour of DistributedConfig
torch.set_num_threads(1)
RANK = int(os.environ.get("RANK", 0))
WORLD = int(os.environ.get("WORLD_SIZE", 1))


def say(*a):
    sys.stdout.write(" ".join([f"[rank {RANK}]", *map(str, a)]) + "\n")  # one write: ranks don't interleave
    sys.stdout.flush()


def make_checkpoint() -> str:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=64, tie_word_embeddings=False)
    path = tempfile.mkdtemp(prefix=f"tp_probe_r{RANK}_")
    atexit.register(shutil.rmtree, path, True)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(path)
    return path


def attempt(name, fn):
    try:
        out = fn()
        say(f"{name}: OK", out if out is not None else "(no output)")
        return True
    except Exception as e:  # report the exact error, keep probing
        say(f"{name}: FAILED {type(e).__name__}: {e}")
        if RANK == 0:
            traceback.print_exc(limit=-3, file=sys.stdout)
        return False


def max_diff(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def slot_cache_logits(model, kv_heads, ids, split):
    """ModelRunner.run's convention on one slot: prefill ids[:, :split], then verify ids[:, split:];
    returns the verify step's logits and the key shapes the attention layers handed to cache.update."""
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = SlotKVCache(cfg.num_hidden_layers, 1, kv_heads, head_dim, 32, torch.float32, torch.device("cpu"))
    seen, orig = [], cache.update

    def spy(k, v, layer_idx, *a, **kw):
        seen.append(tuple(k.shape))
        return orig(k, v, layer_idx, *a, **kw)

    cache.update = spy
    base, head = model.base_model, model.get_output_embeddings()
    kwarg = "cache" if "cache" in base.forward.__code__.co_varnames else "past_key_values"
    out, start = None, 0
    for chunk in (ids[:, :split], ids[:, split:]):
        q = chunk.shape[1]
        pos = torch.arange(start, start + q)[None]
        kv_len = start + q
        mask = torch.where(torch.arange(kv_len)[None, :] <= pos[0, :, None], 0.0, torch.finfo(torch.float32).min)
        cache.prepare(slice(0, 1), torch.zeros(1, 1, dtype=torch.long), pos, kv_len)
        h = base(input_ids=chunk, attention_mask=mask[None, None], position_ids=pos, use_cache=True,
                 **{kwarg: cache}).last_hidden_state
        out, start = head(h).float(), kv_len
    return out, sorted(set(seen))


@torch.inference_mode()
def main():
    path = make_checkpoint()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(1))
    ref_logits = ref(input_ids=ids).logits
    say(f"torch {torch.__version__}; distributed initialised before load: {dist.is_initialized()}")

    # A. tp_plan="auto"
    tp = {}
    ok = attempt('A load tp_plan="auto"', lambda: tp.setdefault(
        "m", AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.float32).eval()) and None)
    if not ok:
        return
    m = tp["m"]
    say(f"backend={dist.get_backend()} world={dist.get_world_size()} tp_size={m.tp_size} "
        f"device={m.device} plan={m.tp_plan}")
    attempt("A forward vs single-process", lambda: f"max abs diff {max_diff(m(input_ids=ids).logits, ref_logits):.3e}")
    with torch.enable_grad():  # grad-enabled forward takes the DTensor path instead of the local fast path
        attempt("A forward (grad enabled, DTensor path)",
                lambda: f"max abs diff {max_diff(m(input_ids=ids).logits.detach(), ref_logits):.3e}")

    # B. explicit plan dict, and DistributedConfig
    plan = {f"model.layers.*.self_attn.{p}_proj": "colwise" for p in "qkv"} | {
        "model.layers.*.self_attn.o_proj": "rowwise", "model.layers.*.mlp.gate_proj": "colwise",
        "model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}
    for label, kw in (("B explicit tp_plan dict", dict(tp_plan=plan)),
                      ("B DistributedConfig(tp_size=2)", dict(distributed_config=DistributedConfig(tp_size=WORLD)))):
        def load_and_run(kw=kw):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()
            return f"max abs diff {max_diff(model(input_ids=ids).logits, ref_logits):.3e}"
        attempt(label, load_and_run)

    # C. what a rank holds
    attn = m.model.layers[0].self_attn
    kw_ = attn.k_proj.weight
    k_out = attn.k_proj(torch.zeros(1, 1, 64))
    say(f"config.num_attention_heads={m.config.num_attention_heads} config.num_key_value_heads="
        f"{m.config.num_key_value_heads} attn.head_dim={attn.head_dim} "
        f"attn.num_key_value_groups={attn.num_key_value_groups}")
    say(f"k_proj.weight: {type(kw_).__name__} global {tuple(kw_.shape)} local "
        f"{tuple(kw_.to_local().shape) if hasattr(kw_, 'to_local') else '-'} placements "
        f"{getattr(kw_, 'placements', '-')}; k_proj output {type(k_out).__name__} {tuple(k_out.shape)}; "
        f"q_proj output {tuple(attn.q_proj(torch.zeros(1, 1, 64)).shape)}; "
        f"lm_head output {tuple(m.lm_head(torch.zeros(1, 1, 64)).shape)}")
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(2))
    local_ok = torch.allclose(attn.k_proj(x), ref.model.layers[0].self_attn.k_proj(x)[..., 16 * RANK: 16 * (RANK + 1)])
    say(f"k_proj output == columns [{16 * RANK}:{16 * (RANK + 1)}] of the full k_proj (KV head {RANK}): {local_ok}")

    # D. specdec's convention: SlotKVCache for the local KV heads, 4-D additive mask, explicit positions
    want = ref_logits[:, 5:]
    ref_slot, ref_seen = slot_cache_logits(ref, 2, ids[:1], 5)
    say(f"D reference (unsharded, SlotKVCache 2 KV heads): update() got {ref_seen}; "
        f"verify-step max abs diff vs full forward {max_diff(ref_slot, want[:1]):.3e}")
    local = m.config.num_key_value_heads // m.tp_size

    def d():
        logits, seen = slot_cache_logits(m, local, ids[:1], 5)
        return (f"SlotKVCache({local} KV head per rank): update() got {seen}; verify-step max abs diff vs "
                f"single-process full forward {max_diff(logits, want[:1]):.3e}")
    attempt("D TP + local-head SlotKVCache", d)

    # E. cache sized from config (global heads) under TP
    attempt("E TP + SlotKVCache(config.num_key_value_heads=2)",
            lambda: f"max abs diff {max_diff(slot_cache_logits(m, 2, ids[:1], 5)[0], want[:1]):.3e}")

    # F. specdec's ModelRunner itself around the TP model: 2 slots, prefill 5 / 3 tokens, then verify 3 / 4
    def runner_step(local_heads: bool):
        r = ModelRunner(m, fused_forward=False, max_model_len=32)
        r.allocate(2)
        if local_heads:  # the one change: a cache of the rank's own KV heads
            c = r.cache
            r.cache = SlotKVCache(c.keys.__len__(), 2, local, c.keys[0].shape[-1], c.capacity, r.dtype, r.device)
        split = (5, 3)
        r.forward([0, 1], [ids[i, :split[i]].tolist() for i in range(2)], [1, 1])
        r.advance(0, 5), r.advance(1, 3)
        out = r.forward([0, 1], [ids[0, 5:].tolist(), ids[1, 3:7].tolist()], [3, 4]).logits
        want_f = torch.cat([ref_logits[0, 5:], ref_logits[1, 3:7]])
        return f"verify logits {tuple(out.shape)}, max abs diff vs single-process {max_diff(out, want_f):.3e}"
    attempt("F ModelRunner(tp model) as is (cache from config: 2 KV heads)", lambda: runner_step(False))
    attempt(f"F ModelRunner(tp model), cache replaced by SlotKVCache({local} KV head)", lambda: runner_step(True))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

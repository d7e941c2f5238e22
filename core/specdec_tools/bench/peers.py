"""Hugging Face peers: ``generate()`` (eager, static cache, prompt lookup, assisted) on the same prompts."""

from __future__ import annotations

import time
from typing import Any

import torch

from specdec_tools.bench.workloads import Settings, Workload


class _HF:
    """Hugging Face copies of the target and draft (same dtype and device), loaded on first use."""

    def __init__(self, model: str, draft: str | None, dtype: torch.dtype, device: torch.device) -> None:
        self.paths, self.dtype, self.device = {"target": model, "draft": draft}, dtype, device
        self.models: dict[str, Any] = {}

    def get(self, which: str = "target") -> Any:
        if which not in self.models:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.paths[which], dtype=self.dtype,
                                                         trust_remote_code=False)
            self.models[which] = model.to(self.device).eval()
        return self.models[which]


# ---------------------------------------------------------------- Hugging Face peers


def _hf_generate(model: Any, prompt: list[int], max_tokens: int, **kw: Any) -> list[int]:
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    pad = model.generation_config.pad_token_id
    # eos_token_id=None: no early stop, so every peer generates exactly max_tokens (as ignore_eos does).
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=None, pad_token_id=0 if pad is None else pad, **kw)
    return out[0, len(prompt):].tolist()


def _peer_variants(s: Settings, hf: _HF, k: int) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    variants, notes = [("hf eager", {})], []
    if hf.device.type == "cuda":
        variants.append(("hf static", {"cache_implementation": "static"}))
    else:
        notes.append("hf static: skipped on CPU (cache_implementation='static' compiles and replays CUDA graphs; "
                     "it is a GPU peer).")
    variants.append((f"hf prompt_lookup k={k}", {"prompt_lookup_num_tokens": k}))
    if hf.paths["draft"] is not None:
        variants.append(("hf assistant", {"assistant_model": "draft"}))
    else:
        notes.append("hf assistant: skipped, no draft model.")
    return variants, notes


def run_peers(s: Settings, hf: _HF, workloads: list[Workload], ours: dict[str, dict[str, Any]], k: int,
              bar: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """HF ``generate()`` at batch 1, greedy, on the same prompts and token budget as our batch-1 runs."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    variants, notes = _peer_variants(s, hf, k)
    rows = []
    for wl in workloads:
        prompts = wl.prompts
        for label, kw in variants:
            bar.set_postfix_str(f"{wl.name} {label}")
            kw = {**kw, "assistant_model": hf.get("draft")} if "assistant_model" in kw else kw
            model = hf.get()
            row = {"workload": wl.name, "peer": label, "requests": len(prompts)}
            try:
                # warm-up; the static cache keeps the longest length seen, so warm up on the longest prompt
                # first and every timed call reuses one cache shape (one compiled graph).
                order = sorted(prompts, key=len, reverse=True) if "cache_implementation" in kw else prompts[:1]
                for p in order:
                    _hf_generate(model, p, s.max_tokens, **kw)
                seconds, outs = [], []
                for _ in range(s.peer_repeats):
                    start = time.perf_counter()
                    outs = [_hf_generate(model, p, s.max_tokens, **kw) for p in prompts]
                    if hf.device.type == "cuda":
                        torch.cuda.synchronize(hf.device)
                    seconds.append(time.perf_counter() - start)
                    bar.update(1)
            except Exception as exc:  # a peer failing is a row, not an aborted benchmark
                rows.append({**row, "error": f"{type(exc).__name__}: {exc}"[:300]})
                bar.update(s.peer_repeats)
                continue
            tokens = sum(len(o) for o in outs) * s.peer_repeats
            base = ours.get(wl.name, {})
            matched = sum(o == b for o, b in zip(outs, base.get("outputs", [])))
            row.update(tok_s=tokens / sum(seconds), seconds=seconds, matched=matched,
                       full_length=all(len(o) == s.max_tokens for o in outs),
                       ours_over_peer=base["tok_s"] / (tokens / sum(seconds)) if base.get("tok_s") else None)
            rows.append(row)
    return rows, notes

"""The two ways ``specdec extract`` fills a shard directory, as functions over an open writer.

- :func:`extract_forward`: the sequences are given; batched forwards of the target (no decoding)
  return the requested hidden states of every position. Every token gets its row.
- :func:`extract_generate`: the target answers each prompt (greedy, through :class:`specdec.LLM`
  with method ``extract_hidden_states``, which records the hidden states as the engine hands them
  over); see :mod:`specdec_extract_hs.proposer` for where such a record ends.

Both write the items in data order, one sequence per item, so a resumed run skips the first
``writer.num_sequences_done`` items; for the same tokens both write the same rows.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from specdec import HiddenStateRequest, SamplingParams
from specdec_extract_hs.data import Item
from specdec_tools.shards import ShardWriter

__all__ = ["extract_forward", "extract_generate", "GENERATE_EXTRA_TOKENS"]

# The engine hands a proposer a step's hidden states at the next step, and never forwards the last
# sampled token: a request decoded for N + 2 tokens is recorded with its first N.
GENERATE_EXTRA_TOKENS = 2


def _keys_request(writer: ShardWriter) -> tuple[tuple[int, ...], HiddenStateRequest]:
    ids = tuple(int(k) for k in writer.keys if k != "last")
    return ids, HiddenStateRequest(last_layer="last" in writer.keys, aux_layer_ids=ids)


def extract_forward(target: Any, items: list[Item], writer: ShardWriter, batch_size: int, bar: Any) -> None:
    """Run ``items`` through ``target`` (a :class:`specdec.HFTargetModel`), ``batch_size`` sequences per
    forward, and add each with its rows to ``writer``. ``bar`` is a tqdm bar counting tokens."""
    ids, request = _keys_request(writer)
    target.allocate(min(batch_size, max(len(items), 1)))
    for a in range(0, len(items), batch_size):
        chunk = items[a: a + batch_size]
        slots = list(range(len(chunk)))
        for s in slots:
            target.reset_slot(s)
        out = target.forward(slots, [it.token_ids.tolist() for it in chunk], [1] * len(chunk), hidden=request)
        layers = list(out.aux_hidden_states or []) + ([out.hidden_states] if request.last_layer else [])
        stacked = torch.stack([h.to(writer.dtype) for h in layers])  # [L, T, H], one copy per batch
        if stacked.is_cuda:  # pinned: a direct DMA, several times a pageable copy's speed (torch caches the blocks)
            host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            host.copy_(stacked)
        else:
            host = stacked
        qsl = out.query_start_loc.tolist()
        for i, it in enumerate(chunk):
            writer.add(it.token_ids, it.loss_mask, {k: host[j, qsl[i]: qsl[i + 1]] for j, k in enumerate(writer.keys)})
        bar.update(sum(len(it.token_ids) for it in chunk))


def extract_generate(llm: Any, items: list[Item], max_tokens: int, batch_size: int, bar: Any) -> None:
    """Let ``llm`` (an :class:`specdec.LLM` whose method is ``extract_hidden_states``) answer each prompt with
    up to ``max_tokens`` greedy tokens and add prompt + recorded answer to its proposer's writer, the
    prompt with its own mask and the answer with mask 1. ``bar`` counts sequences."""
    proposer = llm.proposer
    proposer.auto_write = False  # written here, in data order, with the data's prompt masks
    writer = proposer.writer
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens + GENERATE_EXTRA_TOKENS)
    chunk_size = batch_size * 8  # enough waiting prompts that finished requests are replaced at once
    start, tokens = time.perf_counter(), 0
    for a in range(0, len(items), chunk_size):
        chunk = items[a: a + chunk_size]
        outs = llm.generate([it.token_ids.tolist() for it in chunk], params)
        for it, out in zip(chunk, outs):
            rec = proposer.pop_record(out.request_id)
            t = min(len(rec.token_ids), len(it.token_ids) + max_tokens)
            mask = np.concatenate([it.loss_mask, np.ones(max(t - len(it.loss_mask), 0), np.uint8)])[:t]
            hidden = {k: v[:t] for k, v in rec.hidden(writer.keys, writer.hidden_size, writer.dtype).items()}
            writer.add(np.asarray(rec.token_ids[:t], dtype=np.int64), mask, hidden)
            tokens += t
        bar.update(len(chunk))
        bar.set_postfix_str(f"{tokens / max(time.perf_counter() - start, 1e-9):.0f} tok/s", refresh=False)

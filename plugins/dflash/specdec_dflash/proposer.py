"""The DFlash proposer: one non-causal block forward drafts k tokens at once from the target's layer outputs.

When a request holds ``n`` tokens, its last one (the bonus, at position ``p = n - 1``) has not been through the
target yet, and the target has produced features for positions ``0 .. n - 2``. Each step, for the whole batch:

1. **context**: the features the engine hands over (``DraftBatch.aux_hidden_states``: every position of the
   last target forward, valid up to ``last_hidden_indices``: the whole prompt after a prefill, the previous
   bonus plus the accepted drafts after a verify step) go through ``fc`` + ``hidden_norm`` and every layer's
   ``k_proj``/``v_proj``; their K/V are appended to the request's slot of the :class:`ContextKVCache` at
   positions ``committed .. n - 2``. Only verified positions are handed over, so the cache always holds the
   accepted prefix: nothing to crop.
2. **block**: ``[bonus, mask x (block_size - 1)]`` at positions ``p .. p + block_size - 1``, one batched forward
   over each row's cached context (per-row lengths masked); logits at block indices ``1..k`` are the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from specdec import DraftBatch, Drafts, HiddenStateRequest, Proposer, SpeculativeConfig
from specdec.draft_sampling import (
    check_draft_sample_method,
    draft_probs_needed,
    draft_temperatures,
    sample_at_temperatures,
)
from specdec.keyed import DraftKeys, keyed_draft_keys
from specdec.models import bundled_default
from specdec_dflash.graph_block import CapturedBlock
from specdec_dflash.heads import ContextKVCache
from specdec_dflash.loader import TargetInfo, load_draft

__all__ = ["DFlashOptions", "DFlashProposer"]


@dataclass(frozen=True)
class DFlashOptions:
    """Options of method ``dflash`` (the draft directory is the core key ``model``).

    Attributes:
        draft_sample_method: ``"probabilistic"`` (default): requests with temperature > 0 sample draft ``i``
            from ``softmax(logits_i / T)`` and hand those distributions (over the target vocabulary) to the
            rejection sampler; greedy requests draft the argmax either way. ``"greedy"``: argmax drafts for
            every request, verified as one-hot.
        draft_cuda_graphs: on CUDA, greedy steps draft through :class:`CapturedBlock` (the context append and
            the block forward replayed from one CUDA graph per (batch, KV) bucket); False drafts eagerly.
            Ignored off CUDA.
    """

    draft_sample_method: str = "probabilistic"
    draft_cuda_graphs: bool = True

    def __post_init__(self) -> None:
        check_draft_sample_method(self.draft_sample_method)


class DFlashProposer(Proposer):
    """Method ``dflash``: a DFlash block-diffusion draft (z-lab or speculators layout) over the outputs of the
    target layers it names; up to ``block_size - 1`` drafts per step from one forward."""

    method = "dflash"
    Options = DFlashOptions
    per_request_state = True
    skippable = True  # missed steps' hidden states come at the next call, appended as one longer context
    # Tests only: run CapturedBlock eagerly (use_graphs=False) on any device.
    _eager_graph_block: ClassVar[bool] = False

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        if target is None:
            raise ValueError("method 'dflash' drafts from the target's hidden states: it needs the target.")
        model = config.model or bundled_default(target, "tiny-dflash")
        if not model:
            raise ValueError("method 'dflash' needs model= a local directory holding a DFlash draft (config.json + "
                             "model.safetensors, z-lab or speculators layout); only the bundled 'tiny' target has a "
                             "default draft, 'tiny-dflash'.")
        hf = target.config
        info = TargetInfo(int(hf.hidden_size), int(target.vocab_size), int(hf.num_hidden_layers))
        loaded = load_draft(str(model), info, target.get_input_embeddings(), target.get_output_embeddings())
        self.layout = loaded.layout
        self.draft = loaded.draft.to(device=target.device, dtype=target.dtype).eval()
        cfg = self.draft.cfg
        k = self.num_speculative_tokens
        if k > cfg.block_size - 1:
            raise ValueError(f"num_speculative_tokens={k} is more than one DFlash block drafts: draft "
                             f"{str(model)!r} has block_size={cfg.block_size}, which gives at most "
                             f"block_size - 1 = {cfg.block_size - 1} drafts; use num_speculative_tokens <= "
                             f"{cfg.block_size - 1}.")
        self.aux_layer_ids = cfg.aux_layer_ids
        self.device, self.vocab_size = target.device, int(target.vocab_size)
        self.cache = ContextKVCache(cfg, max(1, len(target.lengths)), int(target.max_model_len), target.dtype,
                                    target.device)
        self.free = list(range(self.cache.num_slots))[::-1]
        self.slot: dict[str, int] = {}
        self.committed: dict[str, int] = {}  # context positions whose K/V the slot holds
        self.probabilistic = self.options.draft_sample_method == "probabilistic"
        self.graph_block = self._build_graph_block()

    def _build_graph_block(self) -> CapturedBlock | None:
        """The capture-ready greedy step over the current cache: captured on CUDA with ``draft_cuda_graphs``,
        eager where a test asks (``_eager_graph_block``), else None."""
        eager = self._eager_graph_block
        if not eager and not (self.options.draft_cuda_graphs and self.device.type == "cuda"):
            return None
        return CapturedBlock.build(self.draft, self.cache, self.num_speculative_tokens, use_graphs=not eager)

    def hidden_states_needed(self) -> HiddenStateRequest:
        """The outputs of the draft's target layers (Hugging Face indexing: ``target_layer_ids + 1``)."""
        return HiddenStateRequest(last_layer=False, aux_layer_ids=self.aux_layer_ids)

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        """Give the request a cache slot (growing the cache when every slot is taken)."""
        if not self.free:
            n = self.cache.num_slots
            self.cache.grow(2 * n)
            self.free = list(range(n, 2 * n))[::-1]
            if self.graph_block is not None:  # it holds the old cache tensors and batch buckets
                self.graph_block = self._build_graph_block()
        self.slot[req_id] = self.free.pop()
        self.committed[req_id] = 0

    def remove_request(self, req_id: str) -> None:
        """Free the request's slot."""
        self.free.append(self.slot.pop(req_id))
        self.committed.pop(req_id, None)

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        """Append the handed-over context to each request's cache, then draft up to k tokens per request from
        one batched block forward (``-1`` past each request's drafts; probabilities for sampling requests)."""
        k, b, dev = batch.num_speculative_tokens, batch.batch_size, self.device
        if b == 0 or batch.aux_hidden_states is None:
            return Drafts.empty(b)
        n = batch.num_tokens.astype(np.int64)
        budget = [max(0, min(k, batch.max_model_len - int(n[i]))) if batch.sampled_token_ids[i] else 0
                  for i in range(b)]
        steps = max(budget, default=0)
        temps = draft_temperatures(batch, self.device, self.probabilistic) if steps else None
        slot_ids = [self.slot[r] for r in batch.req_ids]
        ids = None
        if self.graph_block is not None and steps and temps is None and k == self.graph_block.k:
            ids = self._captured(batch, n, slot_ids)
        probs = None
        if ids is None:
            slots = torch.tensor(slot_ids, device=dev)
            self._append_context(batch, n, slots)
            if steps == 0:
                return Drafts.empty(b)
            cfg = self.draft.cfg
            block = np.full((b, cfg.block_size), cfg.mask_token_id, dtype=np.int64)
            block[:, 0] = batch.token_ids[np.arange(b), n - 1]
            block_t = torch.from_numpy(block).to(dev)
            ctx_len = torch.from_numpy(n - 1).to(dev)
            hidden = self.draft.cached_block_hidden(self.cache, slots, self.draft.embed_tokens(block_t), ctx_len,
                                                    int(n.max()) - 1)
            logits = self.draft.logits(hidden[:, 1: 1 + steps])  # [B, steps, V] float32
            keyed = None if temps is None else keyed_draft_keys(batch.sampling_params, n, logits.shape[-1])
            ids, probs = self._sample(logits, temps, keyed, draft_probs_needed(batch))
            if steps < k:
                ids = torch.cat((ids, ids.new_full((b, k - steps), -1)), 1)
                if probs is not None:
                    probs = torch.cat((probs, probs.new_zeros(b, k - steps, probs.shape[-1])), 1)
        return Drafts.within_budget(ids, budget, probs)

    def _captured(self, batch: DraftBatch, n: np.ndarray, slot_ids: list[int]) -> torch.Tensor | None:
        """Greedy drafts ``[B, k]`` from :class:`CapturedBlock` (context append and block in one replay), or None
        when no bucket fits. A hand-over wider than the graph's (a prompt) is appended eagerly first."""
        b = batch.batch_size
        committed, q, pos, valid, rows = self._new_context(batch, n)
        gb = self.graph_block
        feats = None
        if int(q.max()) > gb.q:
            self._append_context(batch, n, torch.tensor(slot_ids, device=self.device))
            committed, q = n - 1, np.zeros(b, dtype=np.int64)
        elif int(q.max()) > 0:
            feats = torch.cat([a[rows] for a in batch.aux_hidden_states], dim=-1)  # [B, W, n_ids * Ht]
        bonus = batch.token_ids[np.arange(b), n - 1]
        ids = gb.run(slot_ids, bonus, n - 1, committed, q, feats)
        if ids is not None:
            for r, c in zip(batch.req_ids, n - 1):
                self.committed[r] = int(c)
        return ids

    def _new_context(self, batch: DraftBatch, n: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, torch.Tensor | None]:
        """Which context positions each request still needs: ``committed [B]`` (its first new position), ``q [B]``
        (how many: up to ``n - 2``), and over ``W = max(q)`` columns their positions ``[B, W]`` (padding repeats
        the last one), ``valid [B, W]`` and the hand-over rows holding their features (``[B, W]`` on the device;
        None when nothing is new)."""
        b = batch.batch_size
        qsl, last = batch.hidden_offsets()
        first = np.array([n[i] - 1 - (last[i] - qsl[i] + 1) for i in range(b)])  # position of the first handed row
        committed = np.array([self.committed[r] for r in batch.req_ids], dtype=np.int64)
        if (committed < first).any():
            i = int(np.argmax(committed < first))
            raise RuntimeError(f"dflash: request {batch.req_ids[i]!r} has context K/V up to position {committed[i]} "
                               f"but the target's features start at {first[i]}: the engine skipped a hand-over.")
        q = np.maximum(n - 1 - committed, 0)  # [B] new context positions per request
        width = int(q.max())
        if width <= 0:
            return committed, q, np.zeros((b, 0), np.int64), np.zeros((b, 0), bool), None
        j = np.arange(width)[None, :]
        valid = j < q[:, None]
        pos = np.maximum(committed[:, None] + np.minimum(j, q[:, None] - 1), first[:, None])  # padding: a real row
        rows = torch.from_numpy(np.array(qsl[:-1])[:, None] + (pos - first[:, None])).to(self.device, non_blocking=True)
        return committed, q, pos, valid, rows

    def _append_context(self, batch: DraftBatch, n: np.ndarray, slots: torch.Tensor) -> None:
        """Context K/V of positions ``committed .. n - 2`` of every request, from the handed-over features."""
        _, q, pos, valid, rows = self._new_context(batch, n)
        if rows is not None:
            feats = torch.cat([a[rows] for a in batch.aux_hidden_states], dim=-1)  # [B, W, n_ids * Ht]
            self.draft.append_context(self.cache, slots, feats, torch.from_numpy(pos).to(self.device),
                                      torch.from_numpy(valid).to(self.device))
        for r, c in zip(batch.req_ids, n - 1):
            self.committed[r] = int(c)

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor | None, keyed: DraftKeys | None = None,
                probs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts ``[B, s]`` from block logits ``[B, s, V]``: argmax, or with ``temps`` a sample from
        ``softmax(logits / T)`` for rows with T > 0, returned with those distributions ``[B, s, V]`` (None with
        ``probs=False``, for a batch whose verifier reads none)."""
        if temps is None:
            return logits.argmax(-1), None
        return sample_at_temperatures(logits, temps, keyed, probs)

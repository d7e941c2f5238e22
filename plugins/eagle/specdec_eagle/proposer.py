"""EAGLE-1 and EAGLE-3 proposers: a head drafts a chain of k tokens from the target's hidden states.

Head positions: head position ``t`` reads the token at ``t + 1`` and the target's feature at ``t`` and
predicts the token at ``t + 2``. When a request holds ``n`` tokens, the target has produced features for
positions ``0..n-2`` (its last token, the bonus, has not been through the target yet), so each step:

1. **catch-up**: one batched head forward over the positions from the slot's committed length up to
   ``n - 2``, with the features the engine hands over (``DraftBatch.hidden_states`` /
   ``aux_hidden_states``: every position of the last target forward, valid up to
   ``last_hidden_indices``: the whole prompt after a prefill, the bonus position plus the accepted drafts
   after a decode step). Their KV is committed: the slot's length becomes ``n - 1``.
2. **chain**: the output at ``n - 2`` gives draft 1; draft ``j + 1`` comes from a one-token forward at
   position ``n - 2 + j`` fed with draft ``j`` and the head's own previous output as the feature. These
   KV entries are never committed: the next catch-up overwrites them with the target's real features
   (rollback without copies).

With option ``tree_top_k`` > 0, step 2 grows an EAGLE-2 token tree instead (:mod:`specdec_eagle.tree`), whose
K/V stay out of the slot cache.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
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
from specdec.kernels import triton_available
from specdec.keyed import DraftKeys, keyed_draft_keys
from specdec.models import bundled_default
from specdec.runner import adjacent_columns
from specdec.validation import MAX_TREE_NODES
from specdec_eagle.chain import GreedyHeadChain, PickDraft
from specdec_eagle.graph_chain import CapturedHeadChain, FeatureCopier
from specdec_eagle.graph_tree import CapturedHeadTree
from specdec_eagle.heads import HeadKVCache
from specdec_eagle.loader import TargetInfo, load_head
from specdec_eagle.tree import draft_tree

SMALL_CATCH_UP = 2  # up to this batch the catch-up is laid out row by row in Python (_catch_up_small)
DIRECT_FEATURES = 2  # up to this batch the captured chain's features are copied slice by slice (_feature_copier)

__all__ = ["EagleOptions", "EagleProposer", "Eagle3Proposer"]



@dataclass(frozen=True)
class EagleOptions:
    """Options of methods ``eagle`` and ``eagle3`` (the head directory is the core key ``model``).

    Attributes:
        draft_sample_method: ``"probabilistic"``: requests with temperature > 0 sample each draft from the
            head at the request's temperature and hand the draft probabilities (over the target vocabulary) to
            the rejection sampler; greedy requests draft the argmax either way. ``"greedy"``: argmax drafts for
            every request, verified as one-hot (accepted with the target's probability of the draft).
            ``"auto"`` (default): greedy on CUDA, probabilistic elsewhere. On CUDA greedy steps replay the
            captured chain while sampled drafts run the head's modules op by op with a vocabulary-wide
            distribution per draft (on the H200 at batch 8, T = 0.8: 8.4 ms a drafting step against ~2 ms
            greedy); on the CPU both run the same lean chain and sampled drafts are accepted more often.
        draft_cuda_graphs: on CUDA, draft greedy steps through :class:`CapturedHeadChain` (the catch-up
            and the k - 1 head steps replayed from one CUDA graph per (batch, KV) bucket). On by default
            (lossless on the H200: ``tests/plugins/eagle/test_eagle_graph_chain.py``); False keeps one head
            forward at a time. Ignored off CUDA.
        draft_fused: on CUDA with Triton, each greedy head step of the chains runs through the fused kernels
            of :mod:`specdec.fused_kernels` (one-row projections with the norm and residual adds inside them,
            rotary + KV write in one kernel, split-key attention reading each slot up to its own length; see
            :mod:`specdec_eagle.chain`). On by default; False keeps torch ops and SDPA over the whole KV bucket.
            Heads with a head_dim below 16 keep the torch ops. Ignored off CUDA.
        tree_top_k: 0 (default): each request drafts a chain of k tokens. > 0: an EAGLE-2 dynamic token tree
            per request (:mod:`specdec_eagle.tree`), verified whole by the engine: the head's top ``tree_top_k``
            tokens at depth 1, then at each depth down to k the top ``tree_top_k`` nodes by cumulative
            log-probability each get their ``tree_top_k`` best children; the best ``tree_total_tokens`` nodes
            are kept. Every request drafts a tree (sampled ones too: trees are verified one-hot, so
            ``draft_sample_method`` and ``draft_cuda_graphs`` do not apply). At most ``MAX_TREE_NODES``.
        tree_total_tokens: nodes of a request's tree (root excluded) when ``tree_top_k`` > 0, 1 to
            ``MAX_TREE_NODES`` (64); fewer near ``max_model_len``. Another value than the default with
            ``tree_top_k`` = 0 is refused (it would be ignored).
    """

    draft_sample_method: str = "auto"
    draft_cuda_graphs: bool = True
    draft_fused: bool = True
    tree_top_k: int = 0
    tree_total_tokens: int = 32

    def __post_init__(self) -> None:
        check_draft_sample_method(self.draft_sample_method, extra=("auto",))
        for name, low, fix in (("tree_top_k", 0, "0 drafts chains; 4 to 10 is EAGLE-2's range"),
                               ("tree_total_tokens", 1, "the nodes of one request's tree, e.g. 32")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TREE_NODES:
                raise ValueError(f"{name}={value!r} is invalid: it must be an int from {low} to MAX_TREE_NODES="
                                 f"{MAX_TREE_NODES} ({fix}).")
        default = type(self).tree_total_tokens  # the class attribute keeps the field's default
        if not self.tree_top_k and self.tree_total_tokens != default:  # set for a tree that would never be drafted
            raise ValueError(f"tree_total_tokens={self.tree_total_tokens} has no effect while tree_top_k=0 (chains): "
                             f"set tree_top_k > 0 (4 to 10 is EAGLE-2's range) to draft trees of that many nodes, or "
                             f"leave tree_total_tokens at its default ({default}).")


class EagleProposer(Proposer):
    """Method ``eagle``: an EAGLE-1 head over the target's last hidden state."""

    method = "eagle"
    kind: ClassVar[str] = "eagle"  # the head architecture; subclasses under other method names keep it
    Options = EagleOptions
    per_request_state = True
    skippable = True  # missed steps' hidden states come at the next call, as one long catch-up
    # Tests only: run CapturedHeadChain eagerly (use_graphs=False) on any device, ahead of the lean chain.
    _eager_graph_chain: ClassVar[bool] = False
    # Tests only: run CapturedHeadTree eagerly (use_graphs=False) on any device, ahead of the eager tree path.
    _eager_graph_tree: ClassVar[bool] = False
    # Tests only: the fused kernels' module for the chains' head steps on any device (an interpreted copy).
    _chain_kernels: ClassVar[ModuleType | None] = None

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        if target is None:
            raise ValueError(f"method {self.method!r} drafts from the target's hidden states: it needs the target.")
        default = "tiny-eagle3" if self.kind == "eagle3" else "tiny-eagle"
        model = config.model or bundled_default(target, default)
        if not model:
            raise ValueError(f"method {self.method!r} needs model= a local directory holding an "
                             f"{'EAGLE-1' if self.kind == 'eagle' else 'EAGLE-3'} head (config.json + weights); only "
                             f"the bundled 'tiny' target has a default {self.kind} head, {default!r}.")
        hf = target.config
        info = TargetInfo(int(hf.hidden_size), int(target.vocab_size), int(hf.num_hidden_layers))
        lm_head = target.get_output_embeddings() if self.kind == "eagle" else None
        loaded = load_head(str(model), self.kind, info, target.get_input_embeddings(), lm_head)
        self.layout = loaded.layout
        self.aux_layer_ids = loaded.aux_layer_ids
        self.head = loaded.head.to(device=target.device, dtype=target.dtype).eval()
        self.device, self.vocab_size = target.device, int(target.vocab_size)
        self.capacity = int(target.max_model_len)
        self.cache = HeadKVCache(self.head.cfg, max(1, len(target.lengths)), self.capacity, target.dtype, target.device)
        self.free = list(range(self.cache.num_slots))[::-1]
        self.slot: dict[str, int] = {}
        self.committed: dict[str, int] = {}  # head positions whose KV holds the target's real features
        method = self.options.draft_sample_method
        self.probabilistic = method == "probabilistic" or (method == "auto" and self.device.type != "cuda")
        self.tree_top_k = self.options.tree_top_k  # > 0: every step drafts trees (the chains below are not built)
        # Chains on the CPU draft through the lean chain (greedy and sampled steps); on CUDA the captured chain
        # takes greedy steps, the module path sampled ones.
        lean = self.device.type == "cpu" and not self.tree_top_k
        self.kernels = self._fused_kernels()
        self.chain = GreedyHeadChain(self.head, self.capacity, self.kernels) if lean else None
        self.graph_chain = self._build_graph_chain()
        self.graph_tree = self._build_graph_tree()

    def _build_graph_chain(self) -> CapturedHeadChain | None:
        """The capture-ready greedy chain over the current cache: captured on CUDA with
        ``draft_cuda_graphs``, eager where a test asks (``_eager_graph_chain``), else (and with trees) None."""
        eager = self._eager_graph_chain
        if self.tree_top_k or not (eager or self.options.draft_cuda_graphs and self.device.type == "cuda"):
            return None
        return CapturedHeadChain.build(self.head, self.cache, self.num_speculative_tokens, use_graphs=not eager,
                                       lean=self.chain, kernels=self.kernels)

    def _fused_kernels(self) -> ModuleType | None:
        """The kernels module of the chains' head steps: :mod:`specdec.fused_kernels` on CUDA with ``draft_fused``
        and Triton installed (a test's ``_chain_kernels`` anywhere), else None (torch ops)."""
        if self._chain_kernels is not None:
            return self._chain_kernels
        if not self.options.draft_fused or self.device.type != "cuda" or not triton_available():
            return None
        return importlib.import_module("specdec.fused_kernels")

    def _build_graph_tree(self) -> CapturedHeadTree | None:
        """With trees, the capture-ready tree step (catch-up, growth and selection in one function, like the
        captured chain): captured on CUDA with ``draft_cuda_graphs``, eager where a test asks
        (``_eager_graph_tree``), else None (the eager tree path, :func:`specdec_eagle.tree.draft_tree`)."""
        eager = self._eager_graph_tree
        if not self.tree_top_k or not (eager or self.options.draft_cuda_graphs and self.device.type == "cuda"):
            return None
        return CapturedHeadTree.build(self.head, self.cache, self.num_speculative_tokens, self.tree_top_k,
                                      self.options.tree_total_tokens, use_graphs=not eager,
                                      lean=GreedyHeadChain(self.head, self.capacity, self.kernels))

    def max_tree_nodes(self) -> int:
        return self.options.tree_total_tokens if self.tree_top_k else 0

    def hidden_states_needed(self) -> HiddenStateRequest:
        if self.aux_layer_ids is None:
            return HiddenStateRequest(last_layer=True)
        return HiddenStateRequest(last_layer=False, aux_layer_ids=self.aux_layer_ids)

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        if not self.free:  # more requests than the target's slots: grow (keeps every entry)
            n = self.cache.num_slots
            grow = torch.zeros_like(self.cache.keys)
            self.cache.keys = torch.cat((self.cache.keys, grow))
            self.cache.values = torch.cat((self.cache.values, grow))
            self.free = list(range(n, 2 * n))[::-1]
            if self.graph_chain is not None:  # it holds the old cache tensors and batch buckets
                self.graph_chain = self._build_graph_chain()
            if self.graph_tree is not None:
                self.graph_tree = self._build_graph_tree()
        self.slot[req_id] = self.free.pop()
        self.committed[req_id] = 0

    def remove_request(self, req_id: str) -> None:
        self.free.append(self.slot.pop(req_id))
        self.committed.pop(req_id, None)

    def _features(self, batch: DraftBatch, rows: torch.Tensor) -> torch.Tensor:
        """Target features at rows ``rows [B, Q]`` of the hand-over -> ``[B, Q, F]``."""
        if self.aux_layer_ids is None:
            return batch.hidden_states[rows]
        return torch.cat([a[rows] for a in batch.aux_hidden_states], dim=-1)

    def _feature_copier(self, batch: DraftBatch, rows: np.ndarray, q: np.ndarray) -> FeatureCopier:
        """What the captured chain's ``launch`` calls to fill its feature buffer ``[bb, W, F]`` for the requests
        at rows ``order``: request i's ``q[i]`` catch-up rows of the hand-over are consecutive (from ``rows[i,
        0]``), so each layer's slice is copied straight into its columns (one copy per request and layer, no
        index upload, gather or concatenation: host time is what a batch-1 step is short of)."""
        srcs = [batch.hidden_states] if self.aux_layer_ids is None else list(batch.aux_hidden_states)
        joined = adjacent_columns(srcs)  # the engine hands the layers over side by side: one copy for all
        srcs = srcs if joined is None else [joined]
        spans = [(int(rows[i, 0]), int(q[i])) for i in range(len(q))]

        def copy(buf: torch.Tensor, order: list[int]) -> None:
            for slot, (r0, m) in zip(order, spans):
                dst, c0 = buf[slot], 0
                for a in srcs:
                    c1 = c0 + a.shape[-1]
                    dst[:m, c0:c1].copy_(a[r0: r0 + m])
                    c0 = c1

        return copy

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        k, b, dev = batch.num_speculative_tokens, batch.batch_size, self.device
        if b == 0 or (batch.hidden_states is None and batch.aux_hidden_states is None):
            return Drafts.empty(b)
        n, start, q, pos, valid, rows, tokens = self._catch_up(batch)
        budget = [max(0, min(k, batch.max_model_len - int(n[i]))) if batch.sampled_token_ids[i] else 0
                  for i in range(b)]
        steps = max(budget, default=0)
        if self.tree_top_k:
            return self._tree(batch, n, start, q, pos, valid, rows, tokens, budget)
        temps = draft_temperatures(batch, self.device, self.probabilistic)
        slot_ids = [self.slot[r] for r in batch.req_ids]
        chain = self.graph_chain if temps is None and steps and k == getattr(self.graph_chain, "k", -1) else None
        if chain is not None and b <= DIRECT_FEATURES and tokens.shape[1] <= chain.q:
            ids = chain.run(slot_ids, tokens, self._feature_copier(batch, rows, q), start, q)
            if ids is not None:
                self._commit(batch.req_ids, n)
                return Drafts.within_budget(ids, budget)
        feats = self._features(batch, torch.from_numpy(rows).to(dev, non_blocking=True))
        if chain is not None:
            ids = self._graph_chain_run(slot_ids, tokens, feats, pos, start, q)
            if ids is not None:
                self._commit(batch.req_ids, n)
                return Drafts.within_budget(ids, budget)
        tokens_t = torch.from_numpy(tokens).to(dev)
        if self.chain is not None and steps:  # greedy, or sampled through the proposer's own sampler
            pick = None if temps is None else self._picker(batch, n, steps, temps)
            ids, probs = self.chain.draft(self.cache, slot_ids, tokens_t, feats, pos, valid, steps, pick)
            self._commit(batch.req_ids, n)
            if steps < k:
                ids = torch.cat((ids, ids.new_full((b, k - steps), -1)), 1)
                probs = None if probs is None else torch.cat((probs, probs.new_zeros(b, k - steps, probs.shape[-1])), 1)
            return Drafts.within_budget(ids, budget, probs)
        slots = torch.tensor(slot_ids, device=dev)
        hidden = self.head.decode(self.cache, slots, tokens_t, feats, torch.from_numpy(pos).to(dev),
                                  torch.from_numpy(valid).to(dev))
        self._commit(batch.req_ids, n)
        h = hidden[torch.arange(b, device=dev), torch.from_numpy(q - 1).to(dev)][:, None]  # [B, 1, H]
        if steps == 0:
            return Drafts.empty(b)
        ids = torch.full((b, k), -1, dtype=torch.long, device=dev)
        sampled = temps is not None and draft_probs_needed(batch)
        probs = torch.zeros(b, k, self.vocab_size, device=dev) if sampled else None
        pos_t = torch.from_numpy(n - 2).to(dev)[:, None]  # [B, 1]
        pick = None if temps is None else self._picker(batch, n, steps, temps)
        for step in range(steps):
            if step:
                pos_t = pos_t + 1
                ok = pos_t < self.capacity
                hidden = self.head.decode(self.cache, slots, ids[:, step - 1: step].clamp(min=0), h,
                                          pos_t.clamp(max=self.capacity - 1), ok)
                h = hidden
            if pick is None:
                ids[:, step] = self.head.draft_to_target(self.head.draft_logits(h[:, 0]).argmax(-1))
            else:
                ids[:, step], q = pick(h[:, 0], step)
                if probs is not None:
                    probs[:, step] = q
        return Drafts.within_budget(ids, budget, probs)

    def _graph_chain_run(self, slot_ids: list[int], tokens: np.ndarray, feats: torch.Tensor, pos: np.ndarray,
                         start: np.ndarray, q: np.ndarray) -> torch.Tensor | None:
        """The captured chain's drafts, or None where it does not fit. A catch-up wider than the chain's (a prompt,
        or the steps the speculation policy kept plain) writes the keys and values of each row's positions before
        its last (:meth:`GreedyHeadChain.store_kv`, one projection) and the chain starts from the last one: the
        chain's k - 1 head steps stay in its graph instead of running one module forward each."""
        chain = self.graph_chain
        if tokens.shape[1] <= chain.q:
            return chain.run(slot_ids, tokens, feats, start, q)
        dev, b = self.device, len(slot_ids)
        head = q - 1  # positions before each row's last (0 for a row whose catch-up is one position)
        if head.max() > 0:  # their keys and values alone, through torch ops (not Triton's: a compile per new width)
            w = int(head.max())
            chain.lean.store_kv(self.cache, slot_ids, torch.from_numpy(tokens[:, :w]).to(dev), feats[:, :w],
                                pos[:, :w], np.arange(w)[None, :] < head[:, None])
        last = feats[torch.arange(b, device=dev), torch.from_numpy(head).to(dev)][:, None]  # [B, 1, F]
        return chain.run(slot_ids, tokens[np.arange(b), head][:, None], last, start + head, np.ones(b, dtype=np.int64))

    def _tree(self, batch: DraftBatch, n: np.ndarray, start: np.ndarray, q: np.ndarray, pos: np.ndarray,
              valid: np.ndarray, rows: np.ndarray, tokens: np.ndarray, budget: list[int]) -> Drafts:
        """A token tree per request from the head's output at ``n - 2``: through the tree step
        (:class:`CapturedHeadTree`) when every drafting request has room for a full tree, else the catch-up through
        the module path and :func:`specdec_eagle.tree.draft_tree`: depth at most the request's budget, nodes at
        most ``tree_total_tokens`` and the KV positions left before ``max_model_len``."""
        b, dev = batch.batch_size, self.device
        slot_ids = [self.slot[r] for r in batch.req_ids]
        room = [max(0, batch.max_model_len - int(x)) for x in n]
        g = self.graph_tree
        feats = None  # the gathered features, made once, for whichever path needs them
        if g is not None and all(d in (0, self.num_speculative_tokens) and (not d or r >= max(g.nodes, g.tree_keys))
                                 for d, r in zip(budget, room)):
            # every drafting request gets a full tree; features copied slice by slice as the chain's
            if b > DIRECT_FEATURES:
                feats = self._features(batch, torch.from_numpy(rows).to(dev, non_blocking=True))
            out = g.run(slot_ids, tokens, self._feature_copier(batch, rows, q) if feats is None else feats, start, q)
            if out is not None:
                self._commit(batch.req_ids, n)
                return Drafts(out[0], [g.nodes if d else 0 for d in budget], parents=out[1])
        if feats is None:
            feats = self._features(batch, torch.from_numpy(rows).to(dev, non_blocking=True))
        slots = torch.tensor(slot_ids, device=dev)
        hidden = self.head.decode(self.cache, slots, torch.from_numpy(tokens).to(dev), feats,
                                  torch.from_numpy(pos).to(dev), torch.from_numpy(valid).to(dev))
        self._commit(batch.req_ids, n)
        h0 = hidden[torch.arange(b, device=dev), torch.from_numpy(q - 1).to(dev)]  # [B, H]
        return draft_tree(self.head, self.cache, slots, h0, n, budget, room, self.tree_top_k,
                          self.options.tree_total_tokens)

    def _catch_up(self, batch: DraftBatch) -> tuple[np.ndarray, ...]:
        """The catch-up of every request: positions ``start .. n - 2`` (always at least ``n - 2``, whose output
        starts the chain). Returns ``n``, ``start``, ``q`` (positions per request, >= 1) and over ``max(q)``
        columns the positions, ``valid``, the hand-over rows of their features and the tokens at them (padding
        repeats a row's last position)."""
        b = batch.batch_size
        qsl, last = batch.hidden_offsets()
        if b <= SMALL_CATCH_UP:
            return self._catch_up_small(batch, qsl, last)
        n = batch.num_tokens.astype(np.int64)
        first = np.array([n[i] - 1 - (last[i] - qsl[i] + 1) for i in range(b)])  # position of the first handed row
        committed = np.array([self.committed[r] for r in batch.req_ids])
        if (committed < first).any():
            i = int(np.argmax(committed < first))
            raise RuntimeError(f"eagle: request {batch.req_ids[i]!r} has head KV up to position {committed[i]} but "
                               f"the target's features start at {first[i]}: the engine skipped a hand-over.")
        start = np.minimum(committed, n - 2)
        q = n - 1 - start  # [B] >= 1
        j = np.arange(int(q.max()))[None, :]
        valid = j < q[:, None]
        pos = start[:, None] + np.minimum(j, q[:, None] - 1)
        rows = np.array(qsl[:-1])[:, None] + (pos - first[:, None])
        tokens = np.take_along_axis(batch.token_ids, pos + 1, axis=1).astype(np.int64)
        return n, start, q, pos, valid, rows, tokens

    def _catch_up_small(self, batch: DraftBatch, qsl: list[int], last: list[int]) -> tuple[np.ndarray, ...]:
        """:meth:`_catch_up` for a few requests, row by row in Python (the vectorised version's ~20 numpy calls
        cost more host time than the rows: ~80 us a batch-1 step on the H200's host)."""
        n, ids = batch.num_tokens.tolist(), batch.token_ids
        start, q, pos, valid, rows, tokens = [], [], [], [], [], []
        for i, r in enumerate(batch.req_ids):
            first = n[i] - 1 - (last[i] - qsl[i] + 1)  # position of the first handed row
            committed = self.committed[r]
            if committed < first:
                raise RuntimeError(f"eagle: request {r!r} has head KV up to position {committed} but the target's "
                                   f"features start at {first}: the engine skipped a hand-over.")
            s = min(committed, n[i] - 2)
            start.append(s)
            q.append(n[i] - 1 - s)
        width = max(q)
        for i in range(len(n)):
            p = [start[i] + min(j, q[i] - 1) for j in range(width)]
            pos.append(p)
            valid.append([j < q[i] for j in range(width)])
            rows.append([qsl[i] + x - (n[i] - 1 - (last[i] - qsl[i] + 1)) for x in p])
            tokens.append(ids[i, [x + 1 for x in p]])
        i64 = np.int64
        return (np.array(n, dtype=i64), np.array(start, dtype=i64), np.array(q, dtype=i64), np.array(pos, dtype=i64),
                np.array(valid), np.array(rows, dtype=i64), np.array(tokens, dtype=i64))

    def _commit(self, req_ids: list[str], n: np.ndarray) -> None:
        """The catch-up's KV holds the target's features up to position ``n - 2``."""
        for r, c in zip(req_ids, n - 1):
            self.committed[r] = int(c)


    def _picker(self, batch: DraftBatch, n: np.ndarray, steps: int, temps: torch.Tensor) -> PickDraft:
        """The sampler of a batch with sampled requests: ``pick(h, j)`` -> draft j's target ids and distributions
        (:meth:`_sample`), keyed (seeded) requests drawing with the target's keyed noise at their position."""
        vocab = self.head.draft_to_target(torch.arange(self.head.cfg.draft_vocab_size, device=self.device))
        keyed = keyed_draft_keys(batch.sampling_params, n, vocab, self.vocab_size)
        probs = draft_probs_needed(batch)

        def pick(h: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self._sample(h, temps, vocab, None if keyed is None else keyed.step(j), probs)

        return pick

    def _sample(self, h: torch.Tensor, temps: torch.Tensor, vocab: torch.Tensor, keyed: DraftKeys | None = None,
                probs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft ids (target vocabulary) from head outputs ``h [B, H]`` sampled at ``temps`` (argmax where 0) and
        their distributions ``[B, V]`` over the target vocabulary (zero outside the draft vocabulary; None with
        ``probs=False``, for a batch whose verifier reads none); ``vocab``: the target id of each draft id."""
        logits = self.head.draft_logits(h)  # [B, Vd] float32
        draft, q = sample_at_temperatures(logits[:, None], temps, keyed, probs)
        if q is None:
            return vocab[draft[:, 0]], None
        draft, q = draft[:, 0], q[:, 0]  # [B], [B, Vd]
        full = q.new_zeros(q.shape[0], self.vocab_size).index_copy_(-1, vocab, q)
        return vocab[draft], full


class Eagle3Proposer(EagleProposer):
    """Method ``eagle3``: an EAGLE-3 head over three target layers (SafeAILab, SpecForge or speculators)."""

    method = "eagle3"
    kind = "eagle3"

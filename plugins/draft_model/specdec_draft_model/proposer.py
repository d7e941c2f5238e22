"""DraftModelProposer: draft-then-verify with a separate small model sharing the target's vocabulary.

The draft runs on the core's :class:`specdec.ModelRunner` with its own slot KV cache. Each step,
per request, it first catches up on the tokens appended since its last step (accepted drafts and
the bonus token), then drafts k tokens autoregressively for the whole batch at once. Draft KV for
drafts the target rejected is never committed (same slot mechanism as the target: no copies);
draft KV for drafts the target accepted is committed instead of being recomputed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specdec import DraftBatch, Drafts, ModelRunner, Proposer, SpeculativeConfig
from specdec.cuda_graphs import DEFAULT_PREFILL_GRAPH_TOKENS
from specdec.draft_sampling import check_draft_sample_method
from specdec.errors import check_int
from specdec.fused import FusedLlama, fused_support
from specdec.keyed import keyed_draft_noise
from specdec_draft_model.chain import GreedyChain

__all__ = ["DraftModelProposer", "DraftModelOptions"]

logger = logging.getLogger("specdec.draft_model")

CATCH_UP_TOKENS = 32  # the widest step graph of the draft: catch-ups after a plain run go in pieces this long



@dataclass(frozen=True)
class DraftModelOptions:
    """Options of method ``draft_model`` (the draft checkpoint itself is the core key ``model``).

    Attributes:
        draft_sample_method: ``"greedy"`` drafts the argmax (no probs); ``"probabilistic"`` samples
            each draft at the request's temperature and returns the draft probs, so the rejection
            sampler accepts with min(1, p/q): more acceptance on sampled requests, still lossless.
        draft_dtype: dtype of the draft model; default follows the target.
        draft_device: device of the draft model; default follows the target.
        draft_cuda_graphs: replay the draft's forwards from CUDA graphs when it runs on CUDA.
        draft_prefill_graph_tokens: with ``draft_cuda_graphs``, also replay the draft's prefill of new
            requests (their prompts) from prefill graphs of up to this many padded tokens per group,
            as :class:`specdec.LLM`'s ``prefill_graph_tokens`` does for the target; 0 turns them off.
        draft_fused: run greedy draft chains through :class:`FusedLlama` (about ten kernels a layer
            instead of Hugging Face's ~36) when the draft is Llama-family (see
            :func:`specdec.fused.fused_support`); other drafts keep their own layers.
        draft_chain: off CUDA, draft greedy steps through the same fixed-shape chain function as
            the CUDA graphs (:class:`GreedyChain`, run eagerly; :class:`FusedLlama` where
            ``draft_fused``): one call drafts all k tokens for the batch, with far fewer torch ops
            than k forwards through the model's own layers. On CUDA the chain comes with
            ``draft_cuda_graphs``.
    """

    draft_sample_method: str = "greedy"
    draft_dtype: str | None = None
    draft_device: str | None = None
    draft_cuda_graphs: bool = True
    draft_prefill_graph_tokens: int = DEFAULT_PREFILL_GRAPH_TOKENS
    draft_fused: bool = True
    draft_chain: bool = True

    def __post_init__(self) -> None:
        check_int("draft_prefill_graph_tokens", self.draft_prefill_graph_tokens, 0,
                  "(0 turns the draft's prefill graphs off)")
        check_draft_sample_method(self.draft_sample_method)


@dataclass(slots=True)
class _Slot:
    slot: int
    committed: int = 0  # tokens whose draft KV is committed
    pending: list[int] | None = None  # drafts whose KV was written last step, uncommitted


class DraftModelProposer(Proposer):
    """Method ``draft_model``: a separate small causal LM drafts autoregressively."""

    method = "draft_model"
    Options = DraftModelOptions
    per_request_state = True  # per-request KV slots; the loaded draft stays warm between passes
    takes_draft_model = True
    skippable = True  # it catches up from the token history (_catch_up), however many steps it missed
    bench_default = frozenset({"quick", "full"})

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        path = _draft_path(config.model, target)
        opts = self.options
        device = opts.draft_device or (str(target.device) if target is not None else None)
        dtype = opts.draft_dtype or (target.dtype if target is not None else "auto")
        max_len = target.max_model_len if target is not None else None
        self.draft = _load_draft(path, dtype, device, max_len, target)
        self.slots: dict[str, _Slot] = {}
        # As many draft slots as the engine gave the target (grown on demand otherwise).
        self.draft.allocate(max(len(getattr(target, "lengths", ())), 1))
        self.free = list(range(len(self.draft.lengths)))
        self.probabilistic = opts.draft_sample_method == "probabilistic"
        self._graphs: bool | None = None  # None: none; True: CUDA graphs; False: static path, eager
        self._chain: GreedyChain | None = None
        self.chain_steps = 0  # steps drafted by a greedy chain (for tests and profiles)
        self._unread: tuple[GreedyChain, list[_Slot]] | None = None  # the last chain's drafts, not read yet
        if opts.draft_cuda_graphs and self.draft.device.type == "cuda":
            self.capture_graphs()
        elif opts.draft_chain and self.draft.device.type != "cuda":
            self._chain = self._build_chain(use_graphs=False)

    def capture_graphs(self, use_graphs: bool = True) -> None:
        """Put the draft's forwards on fixed-shape buffers: one-token steps and catch-ups of up to
        k + 1 tokens replay CUDA graphs (``use_graphs=False``: the same static path, eager, for CPU
        tests), longer catch-ups (after plain steps the proposer missed) pieces of up to
        :data:`CATCH_UP_TOKENS`; a request's first catch-up (its prompt) replays a prefill graph where one fits
        (``draft_prefill_graph_tokens``), else runs eager. Greedy steps replay a whole draft chain
        instead (:class:`GreedyChain`: k forwards, one read of the drafts)."""
        k = self.num_speculative_tokens
        if self.draft.capture_graphs(sorted({1, k + 1, max(k + 1, CATCH_UP_TOKENS)}), use_graphs=use_graphs,
                                     max_prefill_tokens=self.options.draft_prefill_graph_tokens):
            self._graphs = use_graphs
        self._chain = self._build_chain(use_graphs)

    def _build_chain(self, use_graphs: bool) -> GreedyChain | None:
        """The greedy chain for the current slots (None where it cannot be built; see
        :meth:`GreedyChain.build`), through :class:`FusedLlama` when ``draft_fused`` allows."""
        fused = None
        if self.options.draft_fused:
            reason = fused_support(self.draft)
            if reason is None:  # the draft runner's own fused forward where it has one (no second weight copy)
                fused = self.draft.fused or FusedLlama(self.draft)
            else:
                logger.info("draft %s keeps its own layers (no fused forward): %s.", self.draft.model_name, reason)
        return GreedyChain.build(self.draft, self.num_speculative_tokens, use_graphs=use_graphs, fused=fused)

    # -- request lifecycle -------------------------------------------------------------------------
    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        if not self.free:  # more requests than the target's slots: grow, then capture again
            n = len(self.draft.lengths)
            self.draft.ensure_slots(2 * n)
            self.free = list(range(n, len(self.draft.lengths)))
            if self._graphs is not None:
                self.capture_graphs(self._graphs)
            elif self._chain is not None:  # an eager chain (off CUDA): its batch buckets follow the slots
                self._chain = self._build_chain(use_graphs=False)
        slot = self.free.pop(0)
        self.draft.reset_slot(slot)
        self.slots[req_id] = _Slot(slot)

    def remove_request(self, req_id: str) -> None:
        s = self.slots.pop(req_id, None)
        if s is not None:
            self.free.append(s.slot)
            self.free.sort()

    # -- drafting ----------------------------------------------------------------------------------
    def _read_chained(self) -> None:
        """The last chain's drafts 1..k-1 become its requests' pending drafts (see :meth:`_catch_up`)."""
        if self._unread is None:
            return
        chain, states = self._unread
        self._unread = None
        host = chain.host_drafts()
        for s in states:
            s.pending = host[s.slot, : chain.k - 1].tolist()

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        self._read_chained()
        k, max_len = batch.num_speculative_tokens, self.draft.max_model_len
        # One pass over the batch (a host-side prelude the device waits for: kept to plain Python ints).
        rows, states, budget, catch_up = [], [], [], []
        token_ids, sampled, slots = batch.token_ids, batch.sampled_token_ids, self.slots
        for i, (req_id, n) in enumerate(zip(batch.req_ids, batch.num_tokens.tolist())):
            s = slots.get(req_id)
            if s is None or not sampled[i] or n >= max_len:
                continue
            rows.append(i)
            states.append(s)
            budget.append(min(k, max_len - n))
            catch_up.append(self._catch_up(s, token_ids[i, :n]))
        drafts = torch.full((batch.batch_size, k), -1, dtype=torch.int64)
        num = [0] * batch.batch_size
        if not rows:
            return Drafts(drafts, num)
        # Decided from the host's sampling params: reading a device tensor here would wait for the GPU.
        all_greedy = not self.probabilistic or batch.sampling_params is None or all(
            batch.sampling_params[i].temperature == 0 for i in rows)
        if self._chain is not None and min(budget) == k and all_greedy:
            self._prefill_long_catch_ups(states, catch_up, self._chain.q)
            chained = self._chain.run([s.slot for s in states], catch_up)
            if chained is not None:
                self.chain_steps += 1
                for a, s in enumerate(states):
                    self.draft.advance(s.slot, len(catch_up[a]))  # drafts 1..k-1 stay uncommitted
                    s.committed += len(catch_up[a])
                # Their ids are read at the next step (the chain's host copy; the verify forward has
                # been waited for by then), so nothing here waits for the device.
                self._unread = (self._chain, states)
                if len(rows) == batch.batch_size:  # every request drafts: the chain's device tensor
                    return Drafts(chained, [k] * len(rows))
                drafts[rows] = chained.cpu()
                for i in rows:
                    num[i] = k
                # Every request is greedy here, so the verifier ignores draft probs: none are sent.
                return Drafts(drafts, num)
        temps = self._temperatures(batch, rows)
        keyed = None
        if self.probabilistic and batch.sampling_params is not None:  # coupled drafting for seeded requests
            keyed = keyed_draft_noise([batch.sampling_params[i] for i in rows], batch.num_tokens[rows], k,
                                      self.draft.vocab_size, self.draft.device)
        probs = (torch.zeros(batch.batch_size, k, self.draft.vocab_size, device=self.draft.device)
                 if self.probabilistic else None)
        if self._graphs is not None:  # the first forward below then fits the (k + 1)-token step graphs
            self._prefill_long_catch_ups(states, catch_up, k + 1)
        inputs, active = catch_up, list(range(len(rows)))
        for j in range(k):
            out = self.draft.forward([states[a].slot for a in active], [inputs[a] for a in active],
                                     [1] * len(active))
            for a in active:  # advance over what was just written so the next token attends to it
                self.draft.advance(states[a].slot, len(inputs[a]))
            tokens, step_probs = self._sample(out.logits, temps[active], None if keyed is None else
                                              (keyed[0][active, j], keyed[1][active]))
            for n_, a in enumerate(active):
                drafts[rows[a], j] = tokens[n_]
                num[rows[a]] = j + 1
                if probs is not None:
                    probs[rows[a], j] = step_probs[n_]
            active = [a for a in active if budget[a] > j + 1]
            inputs = [[int(drafts[rows[a], j])] for a in range(len(rows))]
            if not active:
                break
        for a, i in enumerate(rows):
            s = states[a]
            s.committed += len(catch_up[a])
            # Drafts d1..d(n-1) were written after the committed prefix; keep their KV uncommitted
            # until the target accepts them (see _catch_up).
            s.pending = drafts[i, : num[i] - 1].tolist()
            self.draft.advance(s.slot, -len(s.pending))
        return Drafts(drafts, num, probs)

    def _prefill_long_catch_ups(self, states: list[_Slot], catch_up: list[list[int]], width: int) -> None:
        """Catch-ups longer than ``width`` tokens (what a chain or a step graph takes) are committed first, so
        that the chain still drafts for the whole batch on a step where requests joined (the per-forward path
        would take every request). A request's first catch-up (its prompt) runs in one forward, all but its
        last token (a prefill graph where one fits). A later one (the steps a speculation policy's plain run
        did not show the proposer) runs, with the draft's step graphs, in forwards of up to the widest graph's
        tokens (:data:`CATCH_UP_TOKENS`) until at most ``width`` are left: replays of graphs already captured,
        where one forward of an odd length would run eagerly (on an H200 a timed pass with such catch-ups ran at
        0.13x of the baseline, likely kernels compiled for shapes not seen before); without step graphs in one
        forward, all but its last token."""
        long = [a for a, tokens in enumerate(catch_up) if len(tokens) > width]
        chunked = [a for a in long if states[a].committed > 0] if self._graphs is not None else []
        whole = [a for a in long if a not in chunked]
        if whole:
            self.draft.forward([states[a].slot for a in whole], [catch_up[a][:-1] for a in whole], [1] * len(whole))
            for a in whole:
                self._commit_fed(states[a], catch_up, a, len(catch_up[a]) - 1)
        graphs = self.draft.graphs
        piece = max(width, graphs.query_lens[-1]) if graphs is not None else width
        while chunked:
            chunks = [catch_up[a][: min(piece, len(catch_up[a]) - 1)] for a in chunked]
            self.draft.forward([states[a].slot for a in chunked], chunks, [1] * len(chunked))
            for a, c in zip(chunked, chunks):
                self._commit_fed(states[a], catch_up, a, len(c))
            chunked = [a for a in chunked if len(catch_up[a]) > width]

    def _commit_fed(self, s: _Slot, catch_up: list[list[int]], a: int, n: int) -> None:
        """The first ``n`` tokens of catch-up ``a`` went through the draft: committed, and off the catch-up."""
        self.draft.advance(s.slot, n)
        s.committed += n
        catch_up[a] = catch_up[a][n:]

    def _catch_up(self, s: _Slot, history: np.ndarray) -> list[int]:
        """Tokens the draft has not committed yet; commits last step's drafts that were accepted."""
        if s.pending:
            new = history[s.committed:].tolist()
            keep = 0
            while keep < len(s.pending) and keep < len(new) - 1 and new[keep] == s.pending[keep]:
                keep += 1
            self.draft.advance(s.slot, keep)
            s.committed += keep
        s.pending = None
        return history[s.committed:].tolist()

    def _temperatures(self, batch: DraftBatch, rows: list[int]) -> torch.Tensor:
        if not self.probabilistic or batch.sampling_params is None:
            return torch.zeros(len(rows), device=self.draft.device)
        return torch.tensor([float(batch.sampling_params[i].temperature) for i in rows], device=self.draft.device)

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor,
                keyed: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Argmax (greedy) or a sample at each request's temperature (keyed rows: ``argmax probs * noise``, the
        target's keyed race, :mod:`specdec.keyed`); tokens come back on the host."""
        if not self.probabilistic:
            return logits.argmax(-1).cpu(), None
        greedy = temps == 0
        probs = torch.softmax(logits.float() / torch.where(greedy, 1.0, temps)[:, None], -1)  # [b, V]
        sampled = torch.multinomial(probs, 1)[:, 0]
        if keyed is not None:
            sampled = torch.where(keyed[1], (probs * keyed[0]).argmax(-1), sampled)
        tokens = torch.where(greedy, logits.argmax(-1), sampled)
        return tokens.cpu(), probs


def _draft_path(model: str | None, target: Any) -> str:
    if model:
        return model
    from specdec.models import bundled_default

    default = bundled_default(target, "tiny-draft")
    if default is not None:
        return default
    raise ValueError("method 'draft_model' needs the draft model path: pass model='/path/to/draft' in the "
                     "speculative config (only the bundled 'tiny' target has a default draft, 'tiny-draft').")


def _load_draft(path: str, dtype: Any, device: str | None, max_len: int | None, target: Any) -> ModelRunner:
    if not Path(path).exists():
        raise FileNotFoundError(f"draft model path {path!r} (speculative config key 'model') does not exist; pass "
                                "a local directory saved with save_pretrained.")
    # The draft follows the user's choice for the target: its directory's own code runs only when they
    # passed LLM(..., trust_remote_code=True).
    draft = ModelRunner(path, dtype=dtype, device=device,
                          trust_remote_code=getattr(target, "trust_remote_code", False))
    if target is not None:
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft model vocabulary size {draft.vocab_size} differs from the target's "
                             f"{target.vocab_size}: the draft must share the target's tokenizer/vocabulary.")
        if draft.max_model_len < target.max_model_len:
            raise ValueError(f"draft model max length {draft.max_model_len} (max_position_embeddings) is shorter "
                             f"than the target's max_model_len {target.max_model_len}: pass a smaller "
                             "max_model_len to LLM or use a draft with a longer context.")
        draft.max_model_len = target.max_model_len
    return draft

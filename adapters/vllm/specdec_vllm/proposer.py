"""The class vLLM builds through its custom-class hook: a specdec proposer behind vLLM's ``propose`` signature.

vLLM (>= 0.32) builds ``Class(vllm_config)``, calls ``load_model(target)``, then every step
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` and verifies the lists it
gets back. This module turns those arrays into a :class:`specdec.DraftBatch` (views, no copy), keeps the
proposer's per-request state in step with vLLM's reused rows (:class:`specdec_vllm.rows.RowTracker`) and checks the
drafts with the engine's own validation before vLLM sees them. Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from specdec import DraftBatch
from specdec.validation import check_drafts, check_tree_drafts, first_chains
from specdec_vllm.rows import RowTracker
from specdec_vllm.settings import build_proposer, read_settings

__all__ = ["SpecdecProposer", "Ngram", "Suffix"]

logger = logging.getLogger("specdec.vllm")


class SpecdecProposer:
    """Any installed token-only specdec method as a vLLM custom proposer.

    ``speculative_config={"model": "specdec_vllm.SpecdecProposer", "num_speculative_tokens": k}`` runs the method
    named by ``SPECDEC_VLLM_METHOD`` (options: ``SPECDEC_VLLM_OPTIONS`` / ``SPECDEC_VLLM_CONFIG``, see
    :mod:`specdec_vllm.settings`); ``specdec_vllm.methods.<name>``, :class:`Ngram` and :class:`Suffix` fix the method
    in the class path.

    Args:
        vllm_config: vLLM's ``VllmConfig``; read: ``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len`` and ``model_config.get_vocab_size()``.
        settings: the flat specdec config (method and options) instead of the environment's (tests, embedders).

    Attributes:
        proposer: the specdec :class:`~specdec.Proposer` doing the drafting.
        config: its :class:`~specdec.SpeculativeConfig`.
        rows: the :class:`~specdec_vllm.rows.RowTracker` mapping vLLM's rows to request ids.
    """

    method: ClassVar[str | None] = None  # fixed by the per-method subclasses; None: from the environment

    def __init__(self, vllm_config: Any, settings: dict[str, Any] | None = None) -> None:
        spec = vllm_config.speculative_config
        model = vllm_config.model_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(model.max_model_len)
        self.vocab_size = int(model.get_vocab_size())
        if settings is None:
            settings = read_settings(self.method)
        elif self.method is not None:
            settings = {**settings, "method": self.method}
        self.proposer, self.config = build_proposer(settings, self.k)
        self.on_bad_drafts = self.config.on_bad_drafts
        self.rows = RowTracker()
        self._warm_up()
        logger.info("specdec method %r drafts inside vLLM (k=%d): %r", self.config.method, self.k, self.config)

    def load_model(self, target: Any = None) -> None:
        """vLLM hands its target model here; token-only methods never read it."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """Drafts for each running row ``i < len(sampled_token_ids)``: at most k tokens, none past
        ``max_model_len``, every id in the vocabulary, ``[]`` for rows that sampled nothing this step (prefill).

        ``num_tokens_no_spec`` (``[max_num_seqs]``) counts each row's tokens, this step's sampled ones included;
        ``token_ids_cpu`` (``[max_num_seqs, max_model_len]``) holds them. Neither is copied or written.
        """
        b = len(sampled_token_ids)
        if b == 0:
            return []
        changes = self.rows.update(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        # Views of vLLM's arrays, not copies. Writable, as vLLM's are: arctic-inference (suffix) refuses read-only
        # arrays. A proposer must not write into them (DraftBatch's contract): it would change vLLM's batch.
        num_tokens = num_tokens_no_spec[:b]  # [B]
        token_ids = token_ids_cpu[:b]  # [B, max_model_len], C-contiguous: no copy downstream either
        proposer = self.proposer
        for req_id in changes.left:
            proposer.remove_request(req_id)
        for row, req_id in changes.joined:
            before = int(num_tokens[row]) - len(sampled_token_ids[row])
            proposer.add_request(req_id, token_ids[row, :before])
        batch = DraftBatch(req_ids=changes.req_ids, token_ids=token_ids, num_tokens=num_tokens,
                           sampled_token_ids=sampled_token_ids, num_speculative_tokens=self.k,
                           max_model_len=self.max_model_len)
        drafts = proposer.propose(batch)
        k, max_len = self.k, self.max_model_len
        limits = [min(k, max_len - n) if s else 0 for n, s in zip(changes.num_tokens, sampled_token_ids)]
        if getattr(drafts, "parents", None) is not None:  # a token tree: vLLM verifies chains, the first-child one
            trees = check_tree_drafts(drafts, batch, limits, self.vocab_size, proposer, self.on_bad_drafts)
            return [chain[:limit] for chain, limit in zip(first_chains(trees), limits)]
        out, _ = check_drafts(drafts, batch, limits, self.vocab_size, proposer, self.on_bad_drafts)
        return out

    def reset(self) -> None:
        """Forget every row's request (the proposer removes them all) and, when the proposer has a ``reset()``
        (suffix: its global tree of earlier responses), reset it: the next requests draft as in a fresh engine.
        Call it between runs with no request in flight, e.g. ``llm.collective_rpc(reset_drafter)`` where
        ``reset_drafter(worker)`` calls ``worker.model_runner.drafter.reset()``."""
        for req_id in self.rows.reset():
            self.proposer.remove_request(req_id)
        reset = getattr(self.proposer, "reset", None)
        if callable(reset):
            reset()

    def _warm_up(self) -> None:
        """One draft on a small batch of vLLM's dtypes (int32) before vLLM's first step, so a jitted proposer
        compiles here rather than in the first request's latency. A proposer whose state outlives requests
        (``per_request_state`` False: suffix's global tree) is warmed on a throwaway instance."""
        proposer = self.proposer
        if not type(proposer).per_request_state:
            settings = {key: v for key, v in self.config.to_dict().items() if key != "speculation_policy"}
            proposer, _ = build_proposer(settings, self.k)
        n = min(16, self.max_model_len)
        ids = (np.arange(2 * self.max_model_len, dtype=np.int32) % 3).reshape(2, -1)
        num = np.array([n, n], np.int32)
        proposer.add_request("warmup-0", ids[0, : n - 1])
        proposer.add_request("warmup-1", ids[1, :n])  # a row still prefilling: it sampled nothing
        batch = DraftBatch(req_ids=["warmup-0", "warmup-1"], token_ids=ids, num_tokens=num,
                           sampled_token_ids=[[int(ids[0, n - 1])], []], num_speculative_tokens=self.k,
                           max_model_len=self.max_model_len)
        proposer.propose(batch)
        RowTracker().update(batch.sampled_token_ids, num, ids)  # compiles (or loads) its kernel for int32 ids
        proposer.remove_request("warmup-0")
        proposer.remove_request("warmup-1")


class Ngram(SpecdecProposer):
    """specdec's ``ngram`` (options such as ``index="incremental"`` from ``SPECDEC_VLLM_OPTIONS``)."""

    method = "ngram"


class Suffix(SpecdecProposer):
    """specdec's ``suffix`` (SuffixDecoding; needs arctic-inference)."""

    method = "suffix"

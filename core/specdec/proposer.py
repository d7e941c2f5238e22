"""The proposer contract: what a plugin implements and what it is handed each step."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from specdec.options import NoOptions

if TYPE_CHECKING:
    from specdec.config import SpeculativeConfig
    from specdec.sampling import SamplingParams
    from specdec.target import TargetModel

__all__ = ["Proposer", "DraftBatch", "Drafts", "HiddenStateRequest"]


@dataclass(frozen=True, slots=True)
class HiddenStateRequest:
    """Which target hidden states a proposer wants each step.

    Layer ids use HF ``output_hidden_states`` indexing: 0 is the embeddings, ``i`` the output of
    decoder layer ``i``. ``last_layer`` asks for the final hidden state (the one the LM head reads).
    ``all_positions=False`` says the proposer reads each request's last accepted position alone
    (``DraftBatch.last_hidden_indices``, as Medusa's heads do): after a run of plain steps that collected no
    states (on CUDA, past ``specdec.engine.BARE_AFTER`` in a row) the engine then recomputes that one position
    and hands it over alone, not every position of the run (at batch 32 on the H100 such a recompute cost
    Medusa 14-17 ms at a switch back into drafting). Other steps hand over every position either way.
    """

    last_layer: bool = True
    aux_layer_ids: tuple[int, ...] = ()
    all_positions: bool = True


@dataclass(slots=True)
class DraftBatch:
    """What the engine hands a proposer each step (built by keyword; absent fields are None).

    Attributes:
        req_ids: request ids, one per row.
        token_ids: ``[B, L]`` int32, each request's prompt and output so far, including this step's
            bonus token; row ``i`` is valid up to ``num_tokens[i]``.
        num_tokens: ``[B]`` valid length of each row.
        sampled_token_ids: tokens appended this step per request (accepted drafts + bonus); empty
            while a request is still prefilling.
        num_speculative_tokens: k, the most drafts a request may get.
        max_model_len: the longest sequence the target accepts; drafts past it are cut.
        token_ids_device: the same ids on the target's device, for GPU proposers (None on a CPU
            target); made on first read, so proposers that never read it cost no copy.
        hidden_states: ``[T, H]`` target final hidden states of every position processed in the last
            target forward, request by request (``query_start_loc`` delimits them).
        aux_hidden_states: the requested auxiliary layers, each ``[T, H]``, in the order asked.
        query_start_loc: ``[B + 1]`` offsets of each request's positions in ``hidden_states``.
        last_hidden_indices: ``[B]`` row of ``hidden_states`` at each request's last accepted position.
        sampling_params: each request's :class:`specdec.SamplingParams`, for drafters that sample at
            the request's temperature.
        query_start_loc_cpu, last_hidden_indices_cpu: the same two as int64 arrays on the host (the engine
            sets them; None where whoever built the batch did not): read them, or :meth:`hidden_offsets`,
            instead of reading the device tensors back (each read waits for the device).
    """

    req_ids: list[str]
    token_ids: np.ndarray
    num_tokens: np.ndarray
    sampled_token_ids: list[list[int]]
    num_speculative_tokens: int
    max_model_len: int
    token_ids_device: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    aux_hidden_states: list[torch.Tensor] | None = None
    query_start_loc: torch.Tensor | None = None
    last_hidden_indices: torch.Tensor | None = None
    sampling_params: list[SamplingParams] | None = None
    query_start_loc_cpu: np.ndarray | None = None
    last_hidden_indices_cpu: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        """Number of requests in this step (B)."""
        return len(self.req_ids)

    def hidden_offsets(self) -> tuple[list[int], list[int]]:
        """``query_start_loc`` and ``last_hidden_indices`` as host lists: from their host copies when present, else
        read back from the tensors."""
        if self.query_start_loc_cpu is not None and self.last_hidden_indices_cpu is not None:
            return self.query_start_loc_cpu.tolist(), self.last_hidden_indices_cpu.tolist()
        return self.query_start_loc.tolist(), self.last_hidden_indices.tolist()


@dataclass(slots=True)
class Drafts:
    """A proposer's answer for one step.

    Attributes:
        token_ids: ``[B, k]`` int64, padded with -1 past each request's drafts. On the CPU, or on the
            target's device: there, in an all-greedy step, the engine hands them to the verify
            forward as they are (no host round trip between drafting and verifying) and reads and
            checks them on the host after it.
        num_draft_tokens: drafts per request (0 to k; may differ per request).
        probs: optional ``[B, k, V]`` draft distributions for drafters that sample; the rejection
            sampler then accepts with min(1, p/q). None means the drafts are treated as one-hot.
        parents: optional ``[B, N]`` int64, a token tree per request instead of a chain (issue 25):
            ``parents[i, j]`` is the index of draft j's parent among request i's drafts, or -1 for the root
            (the request's last accepted token), always smaller than j (so trees have no cycles); ``token_ids``
            is then ``[B, N]`` with N up to :data:`specdec.validation.MAX_TREE_NODES` and depth at most k.
            Every request's tree is verified whole in one target forward with a tree attention mask: the longest
            path whose every token is the target's argmax (greedy) or keyed sample (seeded), or recursive
            rejection over siblings (unseeded sampled requests; trees are verified one-hot, ``probs`` unused).
    """

    token_ids: torch.Tensor
    num_draft_tokens: list[int]
    probs: torch.Tensor | None = None
    parents: torch.Tensor | None = None

    @classmethod
    def from_lists(cls, drafts: list[list[int]], k: int | None = None,
                   parents: list[list[int]] | None = None) -> Drafts:
        """Pad per-request lists (CPU drafters) into a ``[B, k]`` tensor; with ``parents`` (each request's
        parent indices, a token tree per request), :attr:`parents` padded alike with -1."""
        width = max((len(d) for d in drafts if d is not None), default=0) if k is None else k
        # Filled in numpy and wrapped once: a torch slice assignment per row costs ~10 us, which at
        # batch 32 was a quarter of a suffix-decoding step's drafting (CPU profile, bundled tiny).
        ids = np.full((len(drafts), width), -1, dtype=np.int64)
        par = None if parents is None else np.full((len(drafts), width), -1, dtype=np.int64)
        num = [0] * len(drafts)
        for i, d in enumerate(drafts):
            n = min(len(d), width) if d is not None else 0
            if n:
                ids[i, :n] = d[:n]
                num[i] = n
                if par is not None:
                    par[i, :n] = parents[i][:n]
        return cls(token_ids=torch.from_numpy(ids), num_draft_tokens=num,
                   parents=None if par is None else torch.from_numpy(par))

    @classmethod
    def within_budget(cls, token_ids: torch.Tensor, num_draft_tokens: list[int],
                      probs: torch.Tensor | None = None) -> Drafts:
        """Drafts from ``token_ids [B, k]`` (on any device) of which request ``i`` keeps its first
        ``num_draft_tokens[i]``: the rest become -1. Nothing is launched when every request keeps k, and the
        mask reaches the device without a blocking copy, so a proposer whose drafts are still being computed
        on the GPU returns at once (a blocking ``torch.tensor(..., device=cuda)`` here cost eagle3 the
        overlap of its draft chain with the engine's host work on the H200)."""
        k = token_ids.shape[1]
        if min(num_draft_tokens, default=k) < k:
            budget = torch.tensor(num_draft_tokens, dtype=torch.long)
            if token_ids.device.type != "cpu":
                budget = budget.to(token_ids.device, non_blocking=True)
            keep = torch.arange(k, device=token_ids.device)[None, :] < budget[:, None]
            token_ids = torch.where(keep, token_ids, -1)
        return cls(token_ids=token_ids, num_draft_tokens=list(num_draft_tokens), probs=probs)

    @classmethod
    def empty(cls, batch_size: int) -> Drafts:
        """No drafts for any request."""
        return cls(token_ids=torch.full((batch_size, 0), -1, dtype=torch.int64), num_draft_tokens=[0] * batch_size)

    def to_lists(self) -> list[list[int]]:
        """Each request's drafts as a list, padding removed."""
        rows = self.token_ids.tolist()
        return [row[:n] for row, n in zip(rows, self.num_draft_tokens)]


class Proposer(abc.ABC):
    """Base class of every drafting method. Only :meth:`propose` is abstract.

    Class attributes:
        method: the runtime name (``method="ngram"``); must be a Python identifier.
        Options: a dataclass of this method's knobs, all with defaults; the config validates the
            method's keys against it and hands an instance as ``self.options``.
        per_request_state: True when all the proposer keeps is per request (made in
            :meth:`add_request`, freed in :meth:`remove_request`), so one instance serves any number
            of ``generate`` calls exactly as fresh ones would; tools may then reuse it (the benchmark
            keeps it, warm, between timed passes). False (the default, always safe) when state
            outlives requests, such as a tree of earlier responses: the benchmark then creates a
            fresh proposer before every pass, so no pass drafts from another's outputs.
        takes_draft_model: True when the config key ``model`` is a small causal LM sharing the
            target's tokenizer (not a head checkpoint): tools that pair a target with a draft LM
            pass theirs (the benchmark: ``--draft-model``, else the bundled ``tiny-draft``) and
            skip the method when they have none.
        bench_options: config keys the benchmark (``specdec bench``, ``benchmarks/e2e.py``) sets for
            this method unless ``--method-option`` overrides them: settings that suit the
            benchmark's workloads (source code) rather than the method's general defaults.
        skippable: True when :meth:`propose` may be left out on steps where the speculation policy
            (``speculation_policy="auto"``, :mod:`specdec.policy`) drafts for no request: the proposer
            catches up from ``DraftBatch.token_ids`` on every token it has not seen, and takes the hidden
            states of the steps it missed at its next call (the engine then hands over every accepted
            position since the last call, as after one long verify step); requests that leave right after
            steps it missed come to :meth:`observe` (a batch of them without hidden states) before their
            :meth:`remove_request`. False (the default, always safe): the engine calls :meth:`observe`,
            else :meth:`propose` with its drafts dropped.
        bench_default: which of the benchmark's default runs include this method when
            ``--methods`` is not given: ``"quick"`` (``specdec bench``, minutes on a CPU) and/or
            ``"full"`` (``benchmarks/e2e.py``). Default: neither (benchmarked only when named).
    """

    method: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    per_request_state: ClassVar[bool] = False
    takes_draft_model: ClassVar[bool] = False
    skippable: ClassVar[bool] = False
    bench_options: ClassVar[dict[str, Any]] = {}
    bench_default: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: SpeculativeConfig, target: TargetModel | None = None) -> None:
        self.config = config
        self.target = target
        self.options = config.options
        self.num_speculative_tokens = config.num_speculative_tokens

    @classmethod
    def default_num_speculative_tokens(cls, options: Any) -> int | None:
        """k to use when the config leaves ``num_speculative_tokens`` out; None means required."""
        return None

    def hidden_states_needed(self) -> HiddenStateRequest | None:
        """Which target hidden states :meth:`propose` needs; None (the default) for none."""
        return None

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        """A request entered the batch with this prompt."""

    def remove_request(self, req_id: str) -> None:
        """A request finished or was aborted; free what was kept for it."""

    @abc.abstractmethod
    def propose(self, batch: DraftBatch) -> Drafts:
        """Draft up to ``batch.num_speculative_tokens`` tokens for every request in ``batch``."""

    def max_tree_nodes(self) -> int:
        """The most drafts (root excluded) one request's token tree (:attr:`Drafts.parents`) from this proposer can
        hold, at most :data:`~specdec.validation.MAX_TREE_NODES`; 0 (the default) for a proposer that drafts
        chains only. On CUDA the engine captures tree-verification graphs for trees up to this size when the
        target is built (larger trees, or a proposer that returns trees while declaring 0, verify eagerly)."""
        return 0

    def observe(self, batch: DraftBatch) -> bool:
        """A step on which the speculation policy (:mod:`specdec.policy`) drafts for no request, for a proposer
        that is not :attr:`skippable`: take in what the step hands over (tokens, hidden states) without
        drafting, cheaper than :meth:`propose`, and return True. The default returns False: the engine then
        calls :meth:`propose` and drops its drafts unverified (always correct). A skippable proposer gets it
        for requests that leave right after steps it missed (their tokens, no hidden states), before their
        :meth:`remove_request`; the return value is then ignored."""
        return False

    def while_verifying(self) -> None:
        """Called once a step after the target's verify forward is queued and before its result is
        read: on an accelerator the host would wait here anyway, so host work that the next
        :meth:`propose` does not need first (bookkeeping, index updates) costs no step time. It must
        not depend on this step's verification, which is not known yet. Default: nothing."""

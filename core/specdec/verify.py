"""Verification: a proposer's drafts through the checks (specdec.validation), then the target's
logits through the rejection sampler, or, for an all-greedy batch, a prefix match on the host."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specdec.keyed import keyed_accept, keyed_row_tensor, verify_rows
from specdec.metadata import SpecDecodeMetadata
from specdec.proposer import DraftBatch, Drafts
from specdec.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
from specdec.rejection_torch import compute_target_probs
from specdec.runner import TargetOutput
from specdec.sampling import SamplingMetadata
from specdec.validation import DeferredDrafts, DeferredTrees, check_drafts, check_tree_drafts, defer_drafts, defer_trees

if TYPE_CHECKING:
    from specdec.config import SpeculativeConfig
    from specdec.proposer import Proposer
    from specdec.requests import Request
    from specdec.target import TargetModel

__all__ = ["DrawnSamples", "Verifier", "greedy_accept", "greedy_tree_accept", "tree_children", "tree_depths"]


@dataclasses.dataclass
class DrawnSamples:
    """Keyed samples a plain decode step drew on the device before the next step was queued behind it
    (``overlap_steps``): requests ``indices`` of the batch, their ids copied into ``host`` (pinned memory on a GPU)
    ahead of the queued step, ``event`` recorded after that copy (None on the CPU, where the copy is done)."""

    indices: list[int]
    host: torch.Tensor
    event: Any = None

    def read(self) -> list[int]:
        """The samples, once their copy is done (not waiting for the step queued after it)."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


class Verifier:
    """Checks the drafts of ``proposer`` (at most ``num_speculative_tokens`` a request;
    ``config.on_bad_drafts`` says what a bad one costs) and verifies them against ``target``'s
    logits. Keeps the batch's sampling tensors between steps."""

    def __init__(self, target: TargetModel, proposer: Proposer | None, config: SpeculativeConfig | None,
                 num_speculative_tokens: int) -> None:
        self.target = target
        self.num_speculative_tokens = num_speculative_tokens
        self.proposer = proposer
        self.config = config
        self._sampler = RejectionSampler()
        self._sm_cache: tuple[tuple[int, ...], SamplingMetadata, list[Request]] | None = None

    def checked_drafts(self, result: Any, batch: DraftBatch, reqs: list[Request], trust_probs: bool,
                       defer: bool | None, caps: list[int] | None = None
                       ) -> tuple[list[list[int]], torch.Tensor | None, DeferredDrafts | None]:
        """The proposer's ``result`` for ``batch``, checked: draft lists and their probs (on the
        target's device), or (greedy batches whose drafts sit on the target's device)
        :class:`DeferredDrafts` for the verify forward to read there. ``trust_probs=False`` drops a
        plugin's probs (one-hot verification); ``defer`` as ``LLM._defer_drafts``; ``caps``: at most that many
        drafts per request (the speculation policy's plan; the rest are dropped unverified)."""
        if not trust_probs and isinstance(result, Drafts) and result.probs is not None:
            result = Drafts(result.token_ids, result.num_draft_tokens)  # one-hot: q is never read
        limits = self._limits(reqs, caps)
        policy = self.config.on_bad_drafts
        if can_defer(result, reqs, self.target, defer):
            deferred = defer_drafts(result, batch, limits, self.target.vocab_size, self.proposer, policy)
            if deferred is None:
                return [[] for _ in reqs], None, None
            return [], None, deferred
        drafts, probs = check_drafts(result, batch, limits, self.target.vocab_size, self.proposer, policy)
        if probs is not None and probs.device != self.target.device:  # the verifier reads them beside the logits
            probs = probs.to(self.target.device)
        return drafts, probs, None

    def checked_trees(self, result: Drafts, batch: DraftBatch, reqs: list[Request], caps: list[int] | None = None
                      ) -> list[tuple[list[int], list[int]]]:
        """The token trees of ``result`` (:attr:`Drafts.parents`) checked by
        :func:`~specdec.validation.check_tree_drafts`: depth within what ``checked_drafts`` allows a chain
        (k, ``max_model_len``, ``max_tokens``, ``caps``), nodes within the KV positions left."""
        room = [max(0, self.target.max_model_len - r.num_tokens) for r in reqs]
        return check_tree_drafts(result, batch, self._limits(reqs, caps), self.target.vocab_size, self.proposer,
                                 self.config.on_bad_drafts, room)

    def deferred_trees(self, result: Drafts, batch: DraftBatch, reqs: list[Request], caps: list[int] | None,
                       defer: bool | None) -> DeferredTrees | None:
        """``result``'s token trees left on the device for the tree forward to read
        (:class:`~specdec.validation.DeferredTrees`), when that is possible: the trees on the target's device (an
        accelerator, or any with ``defer=True``), a target with ``forward_tree_ids``, and every tree within the KV
        positions its request has left (no node needs dropping for room); else None (the caller checks them on the
        host: :meth:`checked_trees`). Any temperature: the trees are verified on the host after the forward."""
        ids, parents = result.token_ids, result.parents
        if (not hasattr(self.target, "forward_tree_ids") or not isinstance(parents, torch.Tensor)
                or not on_target_device(ids, self.target, defer) or ids.dim() != 2 or ids.device != parents.device):
            return None
        nums = result.num_draft_tokens
        if not isinstance(nums, (list, tuple)) or len(nums) != len(reqs) or any(
                not isinstance(n, (int, np.integer)) or n > self.target.max_model_len - r.num_tokens
                for n, r in zip(nums, reqs)):
            return None  # counts the host checks report, or trees that need cutting to fit
        return defer_trees(result, batch, self._limits(reqs, caps), self.target.vocab_size, self.proposer,
                           self.config.on_bad_drafts)

    def _limits(self, reqs: list[Request], caps: list[int] | None) -> list[int]:
        """Drafts (a tree: depth) each request may have this step: k, what fits before ``max_model_len`` and
        ``max_tokens`` (the bonus token included), and the policy's ``caps``."""
        k, max_model_len = self.num_speculative_tokens, self.target.max_model_len
        limits = [max(0, min(k, max_model_len - r.num_tokens, r.params.max_tokens - len(r.output) - 1)) for r in reqs]
        if caps is not None:
            limits = [min(lim, cap) for lim, cap in zip(limits, caps)]
        return limits

    def sample(self, reqs: list[Request], drafts: list[list[int]], probs: torch.Tensor | None,
               out: TargetOutput, drawn: DrawnSamples | None = None) -> list[list[int]]:
        """Verify ``drafts`` against ``out.logits`` (the layout of :class:`SpecDecodeMetadata`); returns
        each request's accepted drafts plus its recovered/bonus token. Contains the step's one
        device->host read. An all-greedy batch takes a shortcut with the same result as the rejection
        sampler's greedy rule: the argmax of every row on the host (computed inside the target's CUDA
        graph when it replayed one), the prefix match on the host. ``drawn``: on a step without drafts whose
        other requests are greedy, those requests' keyed samples as the engine drew them
        (:func:`~specdec.keyed.keyed_plain_samples`, what the keyed rule gives them here)."""
        if drawn is not None:
            at = drawn.indices
            sampled = ([[] for _ in reqs] if len(at) == len(reqs) else
                       greedy_accept(drafts, out.greedy_token_ids(), [len(d) for d in drafts]))
            for i, x in zip(at, drawn.read()):
                sampled[i] = [x]
            return sampled
        if all(r.params.temperature == 0 for r in reqs):
            return greedy_accept(drafts, out.greedy_token_ids(), [len(d) for d in drafts])
        keyed = [i for i, r in enumerate(reqs) if r.params.keyed]
        metadata = None
        unseeded = len(keyed) < sum(r.params.temperature > 0 for r in reqs)  # unseeded sampling requests
        if unseeded and not any(drafts):
            sampled = [[t] for t in self._plain_samples(reqs, out.logits)]  # a plain step: no drafts to verify
        elif unseeded:
            metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, self.target.device)
            # RejectionSampler picks the Triton kernels on CUDA (torch reference elsewhere).
            rows = self._sampler(metadata, probs, out.logits, self._sampling_metadata(reqs)).tolist()
            sampled = [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in rows]
        elif len(keyed) < len(reqs):  # greedy and keyed requests only
            sampled = greedy_accept(drafts, out.greedy_token_ids(), [len(d) for d in drafts])
        else:
            sampled = [[] for _ in reqs]
        if keyed:  # seeded requests: the keyed rule, whatever the drafts (specdec.keyed)
            ps = [reqs[i].params for i in keyed]
            rows = keyed_accept(drafts, out.logits, metadata, keyed, [p.temperature for p in ps],
                                [p.top_k for p in ps], [p.top_p for p in ps], [p.seed for p in ps],
                                [reqs[i].num_tokens for i in keyed])
            for i, row in zip(keyed, rows):
                sampled[i] = row
        return sampled

    def _plain_samples(self, reqs: list[Request], logits: torch.Tensor) -> list[int]:
        """Each request's token from ``logits [B, V]`` (one row a request: nobody drafted): the argmax for greedy
        requests, an exponential race over ``softmax(filter(logits / T))`` for sampled ones, the distribution the
        rejection sampler's bonus row draws from (:func:`~specdec.rejection_torch.compute_target_probs`, the same
        1 / Exp(1) weights) without its draft layout, acceptance uniforms and kernels: about a tenth of its host
        time (0.9 ms of host work a step at batch 8 on the H200's host). Seeded rows are overwritten by the
        keyed rule."""
        md = self._sampling_metadata(reqs)
        any_greedy, _, need_top_k, need_top_p = md.host_flags
        p = compute_target_probs(logits, md.temperature, md.top_k if need_top_k else None,
                                 md.top_p if need_top_p else None)
        weights = torch.empty_like(p).exponential_().clamp_min_(torch.finfo(torch.float32).tiny).reciprocal_()
        token = p.mul_(weights).argmax(dim=-1)
        if any_greedy:
            token = torch.where(md.temperature == 0, logits.argmax(dim=-1), token)
        return token.tolist()

    def _sampling_metadata(self, reqs: list[Request]) -> SamplingMetadata:
        """Batched sampling tensors, rebuilt only when the running set changes (their host->device
        copies would otherwise run every step)."""
        key = tuple(id(r) for r in reqs)
        if self._sm_cache is None or self._sm_cache[0] != key:
            # No generators: seeded sampling requests take the keyed rule (their rows here are overwritten), so
            # SamplingMetadata.from_params must not make any either (seed=None below).
            params = [dataclasses.replace(r.params, seed=None) if r.params.seed is not None else r.params
                      for r in reqs]
            md = SamplingMetadata.from_params(params, self.target.device)
            self._sm_cache = (key, md, list(reqs))  # holding the requests keeps their ids unique
        return self._sm_cache[1]


def accept_deferred(deferred: DeferredDrafts, out: TargetOutput, reqs: list[Request] | None = None
                    ) -> tuple[list[list[int]], list[list[int]]]:
    """The drafts a verify forward read on the device, and each request's accepted drafts plus
    bonus token: the step's one wait for the device (the argmax), then the drafts' host copy.
    ``reqs``: the batch's requests, where some sample with a seed (the rest greedy, as :func:`can_defer`
    allows): their rows' keyed samples (:func:`~specdec.keyed.keyed_row_tensor`, queued on the device
    before the wait) take the argmax's place, so a keyed draft is kept iff it equals the target's keyed
    sample there, as :func:`~specdec.keyed.keyed_accept` rules."""
    keyed = keyed_rows(reqs, deferred.widths) if reqs is not None else None
    x = keyed_row_tensor(out.logits, *keyed) if keyed else None
    argmax = out.greedy_token_ids()  # ours waits for the verify forward, queued after the drafts' host copy
    drafts = deferred.lists(after_stream=type(out) is TargetOutput)
    if keyed:
        for row, token in zip(keyed[0], x.tolist()):
            argmax[row] = token
    return drafts, greedy_accept(drafts, argmax, deferred.widths)


def keyed_rows(reqs: list[Request], widths: list[int]
               ) -> tuple[list[int], list[int], list[int], list[float], list[int], list[float], list[int]] | None:
    """The verify rows of ``reqs``' seeded sampling requests, request i owning ``widths[i] + 1`` consecutive rows
    (its drafts', then its bonus row), as :func:`~specdec.keyed.keyed_row_tensor` takes them: ``(rows, owner,
    positions, temperature, top_k, top_p, seeds)``; None when no request samples with a seed."""
    keyed = [i for i, r in enumerate(reqs) if r.params.keyed]
    if not keyed:
        return None
    ps = [reqs[i].params for i in keyed]
    rows, positions, owner = verify_rows(widths, keyed, [reqs[i].num_tokens for i in keyed])
    return (rows, owner, positions, [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps],
            [p.seed for p in ps])


def greedy_accept(drafts: list[list[int]], argmax: list[int], widths: list[int]) -> list[list[int]]:
    """Greedy verification on the host: each request keeps its drafts up to the first that differs
    from the target's argmax there, plus the argmax after them. Request i's rows start after the
    ``widths[j] + 1`` rows of each earlier request j (its drafts as verified; a dropped request's
    list is empty but its rows are still there)."""
    accepted, row = [], 0
    for d, w in zip(drafts, widths):
        a = 0
        while a < len(d) and d[a] == argmax[row + a]:
            a += 1
        accepted.append(d[:a] + [argmax[row + a]])
        row += w + 1
    return accepted


def tree_children(parents: list[int]) -> dict[int, list[int]]:
    """Node -> its children in node order, for a tree whose node ``j`` (``j >= 1``) has parent ``parents[j - 1]``
    (node 0 is the root)."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents, start=1):
        children.setdefault(p, []).append(j)
    return children


def tree_depths(parents: list[int]) -> list[int]:
    """Each node's depth (the root's is 0) in a tree laid out as for :func:`tree_children`."""
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return depth


def greedy_tree_accept(tokens: list[int], parents: list[int], argmax: list[int]) -> tuple[list[int], list[int]]:
    """Greedy verification of one request's token tree (see ``ModelRunner.forward_tree``): from the root (node 0),
    step to the child whose token is the target's argmax at the current node (the first such child in node
    order), until none is. Returns the accepted path's node indices (root first; for ``ModelRunner.keep_path``)
    and the tokens to append: the accepted nodes' tokens, then the argmax at the path's last node. ``argmax[j]``
    is the target's argmax at node j; ``parents[j - 1]`` is node j's parent."""
    children = tree_children(parents)
    path = [0]
    while True:
        want = argmax[path[-1]]
        nxt = next((c for c in children.get(path[-1], ()) if tokens[c] == want), None)
        if nxt is None:
            return path, [tokens[n] for n in path[1:]] + [want]
        path.append(nxt)


def can_defer(result: Any, reqs: list[Request], target: TargetModel, defer: bool | None) -> bool:
    """Whether this step's drafts can stay on the device until the verify forward has read them:
    a batch of greedy and seeded requests (each draft kept iff it equals the target's argmax or keyed
    sample there; no draft probs read), drafts on the target's device (an accelerator, or any with
    ``defer=True``) and a target whose forward takes device ids. ``defer=False`` never defers."""
    if not isinstance(result, Drafts) or not getattr(target, "accepts_draft_ids", False):
        return False
    return on_target_device(result.token_ids, target, defer) and not any(r.params.free for r in reqs)


def on_target_device(ids: Any, target: TargetModel, defer: bool | None) -> bool:
    """Whether drafted ``ids`` may stay where they are for the target's forward to read (chains and trees): a
    tensor on the target's device, an accelerator, or any device with ``defer=True``; ``defer=False``: never."""
    if not isinstance(ids, torch.Tensor) or defer is False:
        return False
    dev = target.device
    if ids.device.type != dev.type or dev.index not in (None, ids.device.index):
        return False
    return ids.device.type != "cpu" or bool(defer)

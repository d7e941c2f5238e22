"""Checks on what users and plugins hand the engine. Every error names value, rule and fix."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from specdec.config import SpeculativeConfig, as_speculative_config
from specdec.errors import DraftValidationError, check_int
from specdec.proposer import DraftBatch, Drafts, Proposer
from specdec.sampling import SamplingParams, short_repr

__all__ = ["validate_prompts", "check_sampling_params", "check_drafts", "defer_drafts", "DeferredDrafts",
           "DRAFT_PROBS_SUM_ATOL", "check_llm_args", "prometheus_registry", "check_tree_drafts", "defer_trees",
           "DeferredTrees", "first_chains", "MAX_TREE_NODES"]

logger = logging.getLogger("specdec.engine")

# Nodes a proposer's token tree may have per request (Drafts.parents): the verify forward's rows per request.
MAX_TREE_NODES = 64

# How far a row of draft probs may sum from 1 (float32 softmax over 150k tokens sums within ~1e-5).
DRAFT_PROBS_SUM_ATOL = 1e-3


def validate_prompts(prompts: list[Any], tokenizer: Any, vocab_size: int, max_model_len: int) -> list[list[int]]:
    """Tokenise and check every prompt before any work starts; returns the token id lists."""
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is a string but the model has no tokenizer: pass token ids "
                                 "(a list of ints), or tokenizer= to LLM.")
            ids = list(tokenizer.encode(prompt, add_special_tokens=False))
            if not prompt:
                ids = []
        elif isinstance(prompt, (np.ndarray, torch.Tensor)):
            ids = _array_ids(i, prompt)
        elif isinstance(prompt, (list, tuple)):
            ids = _list_ids(i, prompt)
        else:
            raise TypeError(f"prompt {i} has type {type(prompt).__name__}: pass a string or a list of token ids.")
        if not ids:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token.")
        j = next((j for j, t in enumerate(ids) if not 0 <= t < vocab_size), None)
        if j is not None:
            raise ValueError(f"prompt {i} has token id {short_repr(ids[j])} outside the vocabulary [0, {vocab_size}) "
                             f"at position {j}: use ids produced by this model's tokenizer.")
        if len(ids) >= max_model_len:
            raise ValueError(f"prompt {i} has {len(ids)} tokens but max_model_len={max_model_len} leaves no room "
                             f"to generate: shorten it below {max_model_len} tokens or raise max_model_len.")
        out.append(ids)
    return out


def _is_int_dtype(dtype: Any) -> bool:
    """An integer numpy or torch dtype (bool is not one)."""
    if isinstance(dtype, torch.dtype):
        return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    return np.issubdtype(dtype, np.integer)


def _list_ids(i: int, prompt: list[Any] | tuple[Any, ...]) -> list[int]:
    """Prompt ``i`` given as a list or tuple: its token ids as Python ints. Python, numpy and torch
    integer scalars are ids; a bool or a float (even 2.0) is not, so a mistake is not run silently
    truncated."""
    ids = []
    for j, t in enumerate(prompt):
        if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
            ids.append(int(t))
        elif isinstance(t, (np.ndarray, torch.Tensor)) and t.ndim == 0 and _is_int_dtype(t.dtype):
            ids.append(int(t))
        else:
            if isinstance(t, (list, tuple, np.ndarray, torch.Tensor)):
                fix = "a prompt is a flat list of ints; pass several prompts as a list of lists, e.g. [[1, 2], [3]]"
            elif isinstance(t, (str, bytes)):
                fix = "pass a text prompt as one string, or token ids as ints"
            elif isinstance(t, (float, np.floating)):
                fix = "pass ints (int(t), if the floats hold whole token ids)"
            else:
                fix = "pass a list of ints, e.g. [1, 2, 3]"
            raise TypeError(f"prompt {i} has {short_repr(t)} ({type(t).__name__}) at position {j}: token ids must "
                            f"be ints (a bool or a float is not one); {fix}.")
    return ids


def _array_ids(i: int, prompt: np.ndarray | torch.Tensor) -> list[int]:
    """Prompt ``i`` given as a numpy array or a torch tensor: 1-D, of an integer dtype."""
    kind = "numpy array" if isinstance(prompt, np.ndarray) else "tensor"
    if prompt.ndim != 1:
        fix = "wrap the id in a list, e.g. [5]" if prompt.ndim == 0 else "pass each row as its own prompt: list(x)"
        raise ValueError(f"prompt {i} is a {kind} of shape {tuple(prompt.shape)}: a prompt must be 1-D (one token "
                         f"id per position); {fix}.")
    if _is_int_dtype(prompt.dtype):
        return prompt.tolist()
    if prompt.dtype == object:  # a numpy array of Python objects: checked one by one
        return _list_ids(i, prompt.tolist())
    cast = "x.astype(np.int64)" if isinstance(prompt, np.ndarray) else "x.long()"
    raise TypeError(f"prompt {i} is a {kind} of dtype {prompt.dtype}: token ids must be ints; pass {cast} if it "
                    "holds whole token ids.")


def check_sampling_params(params: list[Any], vocab_size: int) -> None:
    """Check the sampling params ``LLM.generate`` got, one per prompt, before anything reads them:
    each must be a :class:`SamplingParams` (checked again, in case a field was set after it was
    built) whose stop token ids are in the vocabulary ``[0, vocab_size)``."""
    seen = set()  # one SamplingParams given for every prompt is checked once
    for i, p in enumerate(params):
        if id(p) in seen:
            continue
        if not isinstance(p, SamplingParams):
            fix = ("SamplingParams(**d) instead of the dict d" if isinstance(p, dict)
                   else "one SamplingParams, or a list with one per prompt")
            raise TypeError(f"sampling params for prompt {i} are a {type(p).__name__} ({short_repr(p)}), not a "
                            f"specdec.SamplingParams: pass {fix}.")
        try:
            p.validate()
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"sampling params for prompt {i}: {exc}") from None
        bad = next((t for t in p.stop_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"sampling params for prompt {i}: stop_token_ids holds {bad}, outside the vocabulary "
                             f"[0, {vocab_size}): use ids produced by this model's tokenizer.")
        seen.add(id(p))


def _malformed(proposer: Proposer, policy: str) -> Any:
    """The failure handler of one step's checks: raise (``policy="error"``), or warn and return (the
    caller then drops the drafts concerned)."""
    def fail(problem: str) -> None:
        who = f"proposer {type(proposer).__name__} (method {getattr(proposer, 'method', '?')!r})"
        msg = (f"{who} returned malformed drafts: {problem}. Fix the plugin, or pass "
               "on_bad_drafts='drop' in the speculative config to discard such drafts.")
        if policy == "error":
            raise DraftValidationError(msg)
        # A broken plugin is broken every step: warn once per proposer, then log at DEBUG.
        if getattr(proposer, "_specdec_warned_bad_drafts", False):
            logger.debug("%s; dropping them.", msg)
            return
        logger.warning("%s; dropping them (further drops from this proposer are logged at DEBUG).", msg)
        try:
            proposer._specdec_warned_bad_drafts = True
        except AttributeError:  # a slotted proposer: it warns every time
            pass

    return fail


def _counts_fit(nums: Any, b: int, width: int, fail: Any) -> bool:
    """``num_draft_tokens`` is ``b`` ints in ``[0, width]``; else ``fail`` says so and False."""
    if type(nums) is list and len(nums) == b and set(map(type, nums)) <= {int} and (
            not nums or (min(nums) >= 0 and max(nums) <= width)):  # the common case, without a loop in Python
        return True
    if isinstance(nums, (list, tuple)) and len(nums) == b and all(
            isinstance(n, (int, np.integer)) and 0 <= n <= width for n in nums):
        return True
    fail(f"num_draft_tokens={nums!r} must be {b} ints in [0, {width}]")
    return False


def _check_structure(drafts: Any, batch: DraftBatch, vocab_size: int, fail: Any
                     ) -> tuple[torch.Tensor, list[int], torch.Tensor | None] | None:
    """Type, shape and count checks (no draft value is read): ``(ids, nums, probs)``, or None when
    they failed and every request's drafts are dropped."""
    b, k = batch.batch_size, batch.num_speculative_tokens
    if not isinstance(drafts, Drafts):
        fail(f"propose() returned {type(drafts).__name__}, expected specdec.Drafts")
        return None
    ids, nums = drafts.token_ids, drafts.num_draft_tokens
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2:
        got = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        fail(f"token_ids is a {got}; expected an int64 tensor [B={b}, <=k={k}] (use .long())")
        return None
    if ids.shape[0] != b or ids.shape[1] > k:
        fail(f"token_ids has shape {tuple(ids.shape)}; expected [B={b}, <=k={k}]")
        return None
    if not _counts_fit(nums, b, ids.shape[1], fail):
        return None
    probs = drafts.probs
    if probs is not None and (not isinstance(probs, torch.Tensor) or not probs.is_floating_point()
                              or tuple(probs.shape) != (b, ids.shape[1], vocab_size)):
        shape = tuple(probs.shape) if isinstance(probs, torch.Tensor) else type(probs).__name__
        fail(f"probs has shape {shape}; expected a float tensor [{b}, {ids.shape[1]}, {vocab_size}]")
        return None
    return ids, [int(n) for n in nums], probs


def _checked_lists(host_ids: list[list[int]], nums: list[int], caps: list[int], req_ids: list[str], vocab_size: int,
                   fail: Any) -> list[list[int]]:
    """Each request's ``nums[i]`` drafts from the host rows, cut to ``caps[i]``; a request holding a
    draft id outside the vocabulary (any of its ``nums[i]``, not only those within the cap) gets
    none, or ``fail`` raises."""
    out = []
    for i, (row, n, cap) in enumerate(zip(host_ids, nums, caps)):
        d = row[:n]
        if d and (min(d) < 0 or max(d) >= vocab_size):  # builtins: the common, clean row costs no Python loop
            bad = next(t for t in d if not 0 <= t < vocab_size)
            fail(f"request {req_ids[i]!r} has draft id {bad} outside the vocabulary [0, {vocab_size})")
            d = []
        out.append(d if n <= cap else d[:cap])
    return out


def check_drafts(drafts: Any, batch: DraftBatch, limits: list[int], vocab_size: int, proposer: Proposer,
                 policy: str) -> tuple[list[list[int]], torch.Tensor | None]:
    """Validate a proposer's :class:`Drafts` and cut each request to ``limits[i]`` tokens.

    Returns the per-request draft lists and the matching ``[N, V]`` draft probs (or None: none given, or no
    request that reads them, one sampling without a seed). Malformed drafts raise :class:`DraftValidationError`
    naming the plugin (``policy="error"``) or are dropped for the requests concerned with a warning
    (``policy="drop"``); output stays exact either way.

    Draft probs of requests sampling without a seed are checked too (docs/design.md section 8): finite, >= 0, each
    row summing to 1 within :data:`DRAFT_PROBS_SUM_ATOL`, and q > 0 for every drafted token; rows that pass are
    renormalised to sum to 1 exactly. Greedy and seeded requests never read them (the argmax, the keyed rule).
    """
    fail = _malformed(proposer, policy)
    checked = _check_structure(drafts, batch, vocab_size, fail)
    if checked is None:
        return [[] for _ in range(batch.batch_size)], None
    ids, nums, probs = checked
    out = _checked_lists(ids.tolist(), nums, limits, batch.req_ids, vocab_size, fail)
    if probs is None or not any(out):
        return out, None
    rows = _sampled_rows(out, batch)
    if not any(rows):  # greedy and seeded requests only: the verifier never reads q
        return out, None
    flat_probs = _gather_probs(probs, out)
    sampled = torch.tensor(rows, device=flat_probs.device)  # [N]
    bad, sums = _bad_prob_requests(flat_probs, out, rows, sampled)
    if bad:
        for i, problem in bad.items():
            fail(f"request {batch.req_ids[i]!r} has draft probs that {problem}")
            out[i] = []
        if not any(out):
            return out, None
        flat_probs = _gather_probs(probs, out)
        sampled = torch.tensor(_sampled_rows(out, batch), device=flat_probs.device)
        sums = flat_probs.sum(-1)
    # Sampled rows divided by their sums, in place (flat_probs is our own copy): torch.multinomial draws
    # from q / sum(q), so the verifier should reason with that distribution (within the tolerance the
    # difference is tiny, but it costs one pass).
    flat_probs.div_(torch.where(sampled, sums, torch.ones_like(sums))[:, None])
    return out, flat_probs


def _tree_structure(drafts: Any, b: int, fail: Any) -> tuple[torch.Tensor, list[int], torch.Tensor] | None:
    """A token tree's type, shape and count checks (no value read): ``(ids, nums, parents)``, or None when they
    failed (``fail`` said so)."""
    ids, nums, parents = drafts.token_ids, drafts.num_draft_tokens, drafts.parents
    if (not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.dim() != 2 or ids.shape[0] != b
            or not isinstance(parents, torch.Tensor) or parents.dtype != torch.int64
            or tuple(parents.shape) != tuple(ids.shape)):
        shapes = [tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in (ids, parents)]
        fail(f"a token tree needs token_ids and parents as int64 tensors of one shape [B={b}, N]; got {shapes[0]} "
             f"and {shapes[1]}")
        return None
    if ids.shape[1] > MAX_TREE_NODES:
        fail(f"token trees of {ids.shape[1]} nodes; at most MAX_TREE_NODES={MAX_TREE_NODES} a request")
        return None
    if not _counts_fit(nums, b, ids.shape[1], fail):
        return None
    return ids, [int(n) for n in nums], parents


def _tree_kept(row: list[int], prow: list[int], n: int, limit: int, space: int, vocab_size: int
               ) -> tuple[list[int], str | None]:
    """The nodes (draft indices, in order) that one request's tree keeps: within depth ``limit``, the first
    ``space`` of them, none under a dropped node; or a problem that drops the whole tree (a parent that is not an
    earlier node, an id outside the vocabulary)."""
    kept, depth = [], {-1: 0}  # depth: draft j -> its depth, for the kept nodes (and the root)
    for j in range(n):
        p, t = prow[j], row[j]
        if not -1 <= p < j:
            return [], f"draft {j} has parent {p}; a parent must be an earlier draft (-1 .. {j - 1}, -1: the root)"
        if not 0 <= t < vocab_size:
            return [], f"draft id {t} outside the vocabulary [0, {vocab_size})"
        if p not in depth:  # under a dropped (too deep) node
            continue
        d = depth[p] + 1
        if d > limit or len(kept) >= space:
            continue
        depth[j] = d
        kept.append(j)
    return kept, None


def check_tree_drafts(drafts: Any, batch: DraftBatch, limits: list[int], vocab_size: int, proposer: Proposer,
                      policy: str, room: list[int] | None = None) -> list[tuple[list[int], list[int]]]:
    """Validate a proposer's token trees (:attr:`Drafts.parents`): per request ``(tokens, parents)`` of its nodes
    within depth ``limits[i]`` (deeper nodes are dropped, as a chain is cut) and, given ``room``, its first
    ``room[i]`` kept nodes (the KV positions left before ``max_model_len``), parents as indices among the kept
    nodes (-1: the root). A parent that is not an earlier node (a cycle or a dangling reference), a shape or
    count that does not fit, more than :data:`MAX_TREE_NODES` nodes or an id outside the vocabulary raises
    :class:`DraftValidationError` naming the plugin (``policy="error"``) or drops that request's tree."""
    fail = _malformed(proposer, policy)
    b = batch.batch_size
    empty: list[tuple[list[int], list[int]]] = [([], []) for _ in range(b)]
    checked = _tree_structure(drafts, b, fail)
    if checked is None:
        return empty
    ids, nums, parents = checked
    out = []
    room = room if room is not None else [MAX_TREE_NODES] * b
    for i, (row, prow, n, limit, space) in enumerate(zip(ids.tolist(), parents.tolist(), nums, limits, room)):
        kept, problem = _tree_kept(row, prow, n, limit, space, vocab_size)
        if problem is not None:
            fail(f"request {batch.req_ids[i]!r}'s token tree: {problem}")
        index = {-1: -1, **{j: at for at, j in enumerate(kept)}}
        out.append(([row[j] for j in kept], [index[prow[j]] for j in kept]))
    return out


class DeferredTrees:
    """Token trees left on the device: the tree forward reads them there
    (:meth:`~specdec.runner.ModelRunner.forward_tree_ids`), queued right behind the drafting, and the host reads
    them only after it, with the step's logits (as :class:`DeferredDrafts` does for chains). Built by
    :func:`defer_trees` once their type, shape and counts (``nums``) are checked; :meth:`nodes` then checks the
    values as :func:`check_tree_drafts` does (the same errors) and says which nodes count.

    ``lens``: each request's nodes in the forward, its root included (1 where its limit is 0); ``ids`` /
    ``parents``: the proposer's tensors, as drafted (the forward clamps them into range on the device)."""

    def __init__(self, ids: torch.Tensor, parents: torch.Tensor, nums: list[int], limits: list[int],
                 req_ids: list[str], vocab_size: int, fail: Any) -> None:
        self.nums, self.limits = nums, limits
        self.lens = [1 + (n if lim > 0 else 0) for n, lim in zip(nums, limits)]
        width = max(self.lens) - 1
        self.ids, self.parents = ids[:, :width], parents[:, :width]
        self._host = _host_copy(torch.cat((ids, parents), 1))  # every node is checked, as check_tree_drafts does
        self._width = ids.shape[1]
        self._req_ids, self._vocab_size, self._fail = req_ids, vocab_size, fail

    def nodes(self, roots: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        """Each request's tree as the forward ran it, from the host copy (read after the forward's logits: the
        copy was queued before it): tokens (``roots[i]`` first) and parents (indices into the tokens, 0 the root,
        bad ones clamped as the forward clamped them), ``lens[i]`` nodes; a node the checks drop (too deep, under a
        dropped node, or in a tree that fails them) gets token -1, which no verification accepts."""
        w = self._width
        tokens, parents = [], []
        for i, (row, n, lim, m) in enumerate(zip(self._host.tolist(), self.nums, self.limits, self.lens)):
            ids, prow = row[:w], row[w:]
            kept, problem = _tree_kept(ids, prow, n, lim, MAX_TREE_NODES, self._vocab_size)
            if problem is not None:
                self._fail(f"request {self._req_ids[i]!r}'s token tree: {problem}")
            tk = [roots[i]] + [-1] * (m - 1)
            for j in kept:
                tk[j + 1] = ids[j]
            tokens.append(tk)
            parents.append([min(max(p + 1, 0), j) for j, p in enumerate(prow[: m - 1])])
        return tokens, parents


def defer_trees(drafts: Any, batch: DraftBatch, limits: list[int], vocab_size: int, proposer: Proposer,
                policy: str) -> DeferredTrees | None:
    """Trees that stay on the device (:class:`DeferredTrees`; the value checks come after the forward) once
    :func:`check_tree_drafts`' type, shape and count checks pass; None where they do not (silently: the caller's
    host checks, :func:`check_tree_drafts`, then report it, once)."""
    checked = _tree_structure(drafts, batch.batch_size, lambda problem: None)
    if checked is None:
        return None
    ids, nums, parents = checked
    return DeferredTrees(ids, parents, nums, limits, batch.req_ids, vocab_size, _malformed(proposer, policy))


def first_chains(trees: list[tuple[list[int], list[int]]]) -> list[list[int]]:
    """Each tree's first-child chain: from the root, the first node whose parent is the last one taken."""
    chains = []
    for tokens, parents in trees:
        chain, last = [], -1
        for j, p in enumerate(parents):
            if p == last:
                chain.append(tokens[j])
                last = j
        chains.append(chain)
    return chains


def _gather_probs(probs: torch.Tensor, out: list[list[int]]) -> torch.Tensor:
    """The ``[N, V]`` float32 rows of ``probs`` for the drafts kept in ``out``, request by request."""
    sel = [(i, j) for i, d in enumerate(out) for j in range(len(d))]
    ii = torch.tensor([s[0] for s in sel], device=probs.device)
    jj = torch.tensor([s[1] for s in sel], device=probs.device)
    return probs[ii, jj].to(torch.float32)  # [N, V], a copy (advanced indexing)


def _sampled_rows(out: list[list[int]], batch: DraftBatch) -> list[bool]:
    """For each flat draft row: whether its request samples without a seed (temperature > 0, ``seed=None``).
    Only those rows' q is read by the verifier: greedy requests verify against the argmax and seeded ones by the
    keyed rule (:mod:`specdec.keyed`), whatever q says."""
    params = batch.sampling_params
    return [bool(params is not None and params[i].free) for i, d in enumerate(out) for _ in d]


def _bad_prob_requests(q: torch.Tensor, out: list[list[int]], rows: list[bool], sampled: torch.Tensor
                       ) -> tuple[dict[int, str], torch.Tensor]:
    """Requests whose draft probs the verifier must not trust, with what is wrong: a row of a sampled
    request that is not finite, has a negative entry, does not sum to 1 within
    :data:`DRAFT_PROBS_SUM_ATOL`, or gives its own drafted token q(x) = 0 (then min(1, p/q) would
    accept any draft); and the row sums. ``rows`` / ``sampled`` (host / device): which flat rows
    belong to sampled requests. Two reductions over ``[N, V]`` (a NaN shows in the minimum, an inf in
    the minimum or the sum) and one device read per step, only for steps whose drafts carry probs."""
    sums = q.sum(-1)  # [N]
    x = torch.tensor([t for d in out for t in d], device=q.device)  # [N]
    lowest = q.amin(-1)  # [N]; NaN where the row holds one
    q_x = q.gather(1, x[:, None])[:, 0]
    ok = (lowest >= 0) & ((sums - 1).abs() <= DRAFT_PROBS_SUM_ATOL) & (q_x > 0)
    if bool((ok | ~sampled).all()):  # the step's one read
        return {}, sums
    finite = torch.isfinite(q).all(-1).tolist()  # only when something is wrong
    ok, lowest, sums_host, q_x = (t.tolist() for t in (ok, lowest, sums, q_x))
    bad: dict[int, str] = {}
    row = 0
    for i, d in enumerate(out):
        for j, t in enumerate(d):
            if rows[row] and not ok[row] and i not in bad:
                if not finite[row]:
                    problem = "are not finite (NaN or inf)"
                elif lowest[row] < 0:
                    problem = "hold a negative probability"
                elif abs(sums_host[row] - 1) > DRAFT_PROBS_SUM_ATOL:
                    problem = f"sum to {sums_host[row]:.6g}, not 1 (tolerance {DRAFT_PROBS_SUM_ATOL})"
                else:
                    problem = f"give q={q_x[row]:.3g} to its own draft {t} (it must be > 0)"
                bad[i] = f"at draft position {j} {problem}"
            row += 1
    return bad, sums


class DeferredDrafts:
    """Greedy drafts left on the device: the verify forward reads them there, queued right behind the
    drafting, and the host reads them only after it (with the step's greedy tokens), so drafting
    and verifying run back to back with no host round trip in between.

    Built by :func:`defer_drafts` once the drafts' type, shape and counts (``nums``) are checked.
    ``widths``: each request's draft count, cut to its limit (what the forward verifies); ``device_ids``:
    ``[B, max(widths)]`` ids clamped into the vocabulary, so an out-of-vocabulary draft cannot
    index past the embedding. :meth:`lists` checks the values once they are on the host: a request
    with an out-of-vocabulary draft is dropped (accepts nothing: its first logits row never saw
    its drafts) or raises, as ``on_bad_drafts`` says.
    """

    def __init__(self, ids: torch.Tensor, nums: list[int], widths: list[int], req_ids: list[str], vocab_size: int,
                 fail: Any) -> None:
        self.widths = widths
        self.raw_ids = ids[:, : max(widths, default=0)]  # as drafted: a target that clamps them itself takes these
        self._clamped: torch.Tensor | None = None
        # Every draft is checked, as check_drafts does, not only those within the limits.
        self._host = _host_copy(ids[:, : max(nums, default=0)])
        self._nums = nums
        self._req_ids, self._vocab_size, self._fail = req_ids, vocab_size, fail

    @property
    def device_ids(self) -> torch.Tensor:
        """``[B, max(widths)]`` the drafts clamped into the vocabulary (made on first read: a target with
        ``clamps_draft_ids`` reads :attr:`raw_ids` and clamps them in its own copy)."""
        if self._clamped is None:
            self._clamped = self.raw_ids.clamp(0, self._vocab_size - 1)
        return self._clamped

    def lists(self, after_stream: bool = False) -> list[list[int]]:
        """Each request's drafts on the host, out-of-vocabulary rows dropped. The host copy was queued on the
        device's stream when the drafts were deferred: ``after_stream=True`` says the caller has already waited for
        work queued after it (the verify forward's argmax: :func:`~specdec.verify.accept_deferred`); otherwise this
        waits for the stream."""
        device = self.raw_ids.device
        if device.type == "cuda" and not after_stream:
            torch.cuda.current_stream(device).synchronize()
        return _checked_lists(self._host.tolist(), self._nums, self.widths, self._req_ids, self._vocab_size,
                              self._fail)


_HOST_COPIES: dict[torch.device, list[Any]] = {}  # device -> [turn, pinned buffer, pinned buffer]


def _host_copy(ids: torch.Tensor) -> torch.Tensor:
    """``ids`` copied to the host; on CUDA the copy is queued (read it once the stream is past it) into one of two
    pinned buffers kept per device, in turns (a fresh pinned tensor and an event each step cost ~0.1 ms of host
    time on the H200's host): a step's drafts are read before the step after next copies its own."""
    if ids.device.type != "cuda":
        return ids.clone()
    pool = _HOST_COPIES.setdefault(ids.device, [0, None, None])
    turn = pool[0] = 1 - pool[0]
    buf = pool[1 + turn]
    if buf is None or buf.numel() < ids.numel():
        buf = pool[1 + turn] = torch.empty(max(ids.numel(), 1024), dtype=torch.long, pin_memory=True)
    host = buf[: ids.numel()].view(ids.shape)
    host.copy_(ids, non_blocking=True)
    return host


def defer_drafts(drafts: Any, batch: DraftBatch, limits: list[int], vocab_size: int, proposer: Proposer,
                 policy: str) -> DeferredDrafts | None:
    """:func:`check_drafts` for drafts that stay on the device (:class:`DeferredDrafts`): the same
    checks and errors, the value check after the verify forward. None: malformed, every request's
    drafts dropped (``policy="drop"``)."""
    fail = _malformed(proposer, policy)
    checked = _check_structure(drafts, batch, vocab_size, fail)
    if checked is None:
        return None
    ids, nums, _ = checked
    return DeferredDrafts(ids, nums, [min(n, lim) for n, lim in zip(nums, limits)], batch.req_ids, vocab_size, fail)


def check_llm_args(max_num_seqs: Any, cuda_graphs: Any, log_interval_s: Any, prometheus: Any, speculative_config: Any,
                   admit_group: Any, prefill_graph_tokens: Any, **flags: Any) -> tuple[Any, SpeculativeConfig | None]:
    """``LLM``'s arguments, checked before the model loads (``flags``: the boolean ones); returns the
    Prometheus registry and the :class:`SpeculativeConfig` they name (a bad config fails here too)."""
    check_int("max_num_seqs", max_num_seqs, 1)
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name}={flag!r} is invalid: it must be True or False.")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs={cuda_graphs!r} is invalid: it must be True, False or None (on when the "
                        "model runs on CUDA).")
    if isinstance(log_interval_s, bool) or not isinstance(log_interval_s, (int, float)) or not (
            0 < log_interval_s < float("inf")):
        raise ValueError(f"log_interval_s={log_interval_s!r} is invalid: it must be a number of seconds > 0.")
    registry = prometheus_registry(prometheus)
    speculative_config = as_speculative_config(speculative_config)
    if admit_group is not None:
        check_int("admit_group", admit_group, 1, "(the free slots that let waiting requests join) or None "
                  "(max_num_seqs // 4)")
    if prefill_graph_tokens is not None:
        check_int("prefill_graph_tokens", prefill_graph_tokens, 0,
                  "(0 turns prefill graphs off) or None (the default size)")
    return registry, speculative_config


def prometheus_registry(prometheus: Any) -> Any:
    """The registry ``LLM(prometheus=...)`` names: None/False (off), True (the global one) or a
    ``CollectorRegistry``."""
    if prometheus is None or prometheus is False:
        return None
    import prometheus_client

    if prometheus is True:
        return prometheus_client.REGISTRY
    if isinstance(prometheus, prometheus_client.CollectorRegistry):
        return prometheus
    raise TypeError(f"prometheus={prometheus!r} is invalid: pass a prometheus_client.CollectorRegistry, True for "
                    "the default registry, or None to turn the counters off.")

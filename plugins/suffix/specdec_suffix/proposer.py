"""SuffixProposer: SuffixDecoding (Oliaro et al., 2024) through arctic-inference's SuffixDecodingCache.

The cache keeps one suffix tree per active request (its prompt and output) and one global tree over
the responses of earlier and running requests. Each step, per request, the tokens appended last
step are added to both, and the last ``max_tree_depth`` tokens are matched against both trees; the
better-scoring continuation is the draft. Its length follows the match (``max_spec_factor`` times
the matched length, cut where the estimated token probability drops below ``min_token_prob``), so
requests get different numbers of drafts, often zero.

Request lifecycle: ``add_request`` starts the request with its prompt (and allocates its slot in
the global tree, evicting the oldest cached response, FIFO, past ``max_cached_requests``; on the native
path its own tree takes the prompt at the request's first draft, so requests never drafted for build none);
``propose`` appends the tokens the trees have not seen (each step's sampled tokens when called every step;
every token since its last call after steps the speculation policy left it out of: the proposer is
``skippable``) and speculates; ``remove_request`` stops it (its response stays in the global tree,
helping later requests, until evicted). The trees' state depends only on each request's token sequence,
not on how it came in (a token at a time or a run of them), so drafts after a skipped run equal those of
a proposer that had seen every step, except that other rows' tokens of the skipped steps reach the global
tree when those rows are next called. Requests that leave after skipped steps get their last tokens in
through ``observe``, which the engine calls for them before ``remove_request``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdec import DraftBatch, Drafts, Proposer, SpeculativeConfig
from specdec.validation import MAX_TREE_NODES

__all__ = ["SuffixProposer", "SuffixOptions", "ARCTIC_INFERENCE_VERSION", "install_instructions"]

logger = logging.getLogger("specdec.suffix")

ARCTIC_INFERENCE_VERSION = "0.3.0"


@dataclass(frozen=True, slots=True)
class SuffixOptions:
    """Options of method ``suffix`` (vLLM's names and defaults, and one of specdec's own).

    Attributes:
        suffix_decoding_max_tree_depth: depth of the suffix trees: the longest context matched and
            the longest draft. Also the default ``num_speculative_tokens``.
        suffix_decoding_max_cached_requests: responses kept in the global tree (FIFO eviction);
            0 disables the global tree (each request drafts from its own prompt and output only).
        suffix_decoding_max_spec_factor: a draft is at most this factor times the matched context
            length (short matches give short drafts).
        suffix_decoding_min_token_prob: drafting stops at the first token whose estimated
            probability (its frequency among the match's continuations) is below this.
        defer_global_updates: specdec's own, not vLLM's. False (default): each request's new tokens
            enter the global tree just before it is matched, in arctic-inference's own order, so
            every draft equals ``SuffixDecodingCache.speculate``'s (vLLM's). True: they enter it in
            ``Proposer.while_verifying``, while the target verifies on the device, so at propose
            time the global tree lacks every running request's last tokens, its own included. That
            cannot be made exact: a request's own last tokens change the counts (the estimated
            probabilities) of the very nodes its context matches. Measured on the CPU
            (``benchmarks/results/suffix-defer.md``): propose 35-60% faster (batch 32, long
            synthetic histories: 50 -> 29 us a request, plus 16 us in the hook, which only an
            accelerator hides); 3-11% of the drafts differ from the reference's (5% there, 8% on
            the bundled model at batch 8); acceptance was not lower (accepted tokens a draft 4.67
            -> 4.83 there; bundled model, batch 8, repeated prompts: mean acceptance length 6.81 ->
            7.28), but the drafts are no longer vLLM's.
        use_tree_spec: arctic-inference's tree speculation (vLLM's ``suffix_decoding`` option of that name):
            False (default) drafts a chain; True drafts a token tree of up to k nodes per request (the
            continuations of the matched suffix, best first), verified whole (issue 25, eager): greedy requests
            by the argmax, seeded ones by their keyed samples, unseeded sampled ones by recursive rejection over
            siblings.
        tree_nodes: specdec's own, with ``use_tree_spec``: the nodes arctic-inference may grow per tree
            (``max_spec_tokens``). 0 (default): k, as vLLM (a tree then never holds more tokens than the chain
            of k). More: a wider tree, whose nodes deeper than k the engine cuts before verification (their
            subtrees with them, as for any proposer's tree), so it holds the best continuation to depth k and
            alternatives beside it.

    Seeded sampling is not reproducible across calls to one ``LLM`` by default: the global tree
    keeps every earlier response, so the same request drafts differently the second time, which
    changes how its random draws are consumed (greedy output is unaffected). For repeatable seeded
    output, call ``llm.proposer.reset()`` between calls (forgets the cached responses) or set
    ``suffix_decoding_max_cached_requests=0`` (no global tree at all).
    """

    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    defer_global_updates: bool = False
    use_tree_spec: bool = False
    tree_nodes: int = 0

    def __post_init__(self) -> None:
        depth = self.suffix_decoding_max_tree_depth
        if not _is_int(depth) or depth < 1:
            raise ValueError(f"suffix_decoding_max_tree_depth={depth!r} is invalid: it must be an int >= 1 "
                             "(the deepest context matched and the longest draft), e.g. 24.")
        cached = self.suffix_decoding_max_cached_requests
        if not _is_int(cached) or cached < 0 or cached > 0x7FFFFFFF:
            raise ValueError(f"suffix_decoding_max_cached_requests={cached!r} is invalid: it must be an int "
                             ">= 0 and < 2**31 (0 disables the global tree of earlier responses), e.g. 10000.")
        factor = self.suffix_decoding_max_spec_factor
        if not _is_real(factor) or factor < 0:
            raise ValueError(f"suffix_decoding_max_spec_factor={factor!r} is invalid: it must be a number >= 0 "
                             "(drafts are at most this factor times the matched length), e.g. 1.0.")
        prob = self.suffix_decoding_min_token_prob
        if not _is_real(prob) or not 0.0 <= prob <= 1.0:
            raise ValueError(f"suffix_decoding_min_token_prob={prob!r} is invalid: it must be a number in "
                             "[0, 1] (drafting stops below this estimated token probability), e.g. 0.1.")
        if not isinstance(self.use_tree_spec, (bool, np.bool_)):
            raise ValueError(f"use_tree_spec={self.use_tree_spec!r} is invalid: it must be True (token trees) or "
                             "False (chains, the default).")
        nodes = self.tree_nodes
        if not _is_int(nodes) or not 0 <= nodes <= MAX_TREE_NODES:
            raise ValueError(f"tree_nodes={nodes!r} is invalid: it must be an int from 0 (trees of k nodes) to "
                             f"{MAX_TREE_NODES} (specdec.validation.MAX_TREE_NODES), e.g. 16.")
        if nodes and not self.use_tree_spec:
            raise ValueError(f"tree_nodes={nodes!r} needs use_tree_spec=True (chains have k drafts).")
        if not isinstance(self.defer_global_updates, (bool, np.bool_)):
            raise ValueError(f"defer_global_updates={self.defer_global_updates!r} is invalid: it must be True "
                             "(update the global tree while the target verifies; faster, drafts can differ from "
                             "arctic-inference's) or False (the default: drafts equal arctic-inference's).")


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def install_instructions() -> str:
    """The commands that build arctic-inference into the running environment."""
    py = sys.executable or "python"
    bin_dir = os.path.dirname(py) or "."
    return (
        "In the specdec repository run `make install`. Elsewhere, run (a C++20 compiler is needed; "
        "PATH makes the build use this environment's cmake and python, and --no-build-isolation "
        "builds against its torch):\n"
        f"  {py} -m pip install cmake ninja nanobind==2.9.2 protobuf==5.29.6 grpcio-tools\n"
        f'  PATH="{bin_dir}:$PATH" {py} -m pip install --no-build-isolation '
        f"arctic-inference=={ARCTIC_INFERENCE_VERSION}"
    )


def _import_cache_class() -> type:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise ImportError(
            f"method 'suffix' needs arctic-inference=={ARCTIC_INFERENCE_VERSION} (Snowflake's SuffixDecoding "
            f"backend), which could not be imported ({exc}). It is published only as a source distribution "
            "with a C++ extension, so it is not installed with specdec-plugin-suffix. "
            f"{install_instructions()}\nThe other methods work without it."
        ) from exc
    return SuffixDecodingCache


class SuffixProposer(Proposer):
    """Method ``suffix``: model-free drafting from per-request and global suffix trees.

    With arctic-inference 0.3.0's layout the trees are called directly (every draft still equals
    ``SuffixDecodingCache.speculate``'s). With the option ``defer_global_updates`` each step's new
    tokens reach the global tree in :meth:`while_verifying` (while the target verifies on the
    device) rather than before drafting: faster, but the drafts can differ from the reference's.
    """

    method = "suffix"
    Options = SuffixOptions
    # per_request_state stays False: the global tree keeps earlier responses across requests.
    skippable = True  # it catches up on every token it has not seen (_seen); on plain steps nothing is called:
    # s35 (H100, batch 8, T = 0.8) its per-step observe kept suffix@auto at 0.66-0.85x of the baseline with 3-29%
    # of steps drafting
    bench_default = frozenset({"quick", "full"})

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        self._cache_cls = _import_cache_class()
        opts = self.options
        self.max_tree_depth = opts.suffix_decoding_max_tree_depth
        self.max_spec_factor = float(opts.suffix_decoding_max_spec_factor)
        self.min_token_prob = float(opts.suffix_decoding_min_token_prob)
        self.defer_global_updates = bool(opts.defer_global_updates)
        self.use_tree_spec = bool(opts.use_tree_spec)
        self._empty_cache()

    def max_tree_nodes(self) -> int:
        """With ``use_tree_spec``, trees of up to ``tree_nodes`` (default k) nodes (the engine captures tree graphs
        of that size on CUDA); else 0 (chains)."""
        return (self.options.tree_nodes or self.num_speculative_tokens) if self.use_tree_spec else 0

    def reset(self) -> None:
        """Forget every cached response: the global tree starts empty, as in a new proposer.

        Call it between ``LLM.generate`` calls (``llm.proposer.reset()``) to make seeded sampling
        repeatable: otherwise the responses of earlier calls change the drafts, and with them how a
        seeded request's random draws are consumed. Only possible with no request running.
        """
        running = list(self.cache.active_requests)
        if running:
            shown = ", ".join(map(str, running[:5])) + (", ..." if len(running) > 5 else "")
            raise RuntimeError(f"SuffixProposer.reset() needs no running requests, got {len(running)} ({shown}); "
                               "call it between generate calls.")
        self._empty_cache()

    def _empty_cache(self) -> None:
        self.cache = self._cache_cls(max_tree_depth=self.max_tree_depth,
                                     max_cached_requests=self.options.suffix_decoding_max_cached_requests)
        self._native = _native_trees(self.cache)
        self._global_pending: list[tuple[str, np.ndarray]] = []  # (request, tokens) not in the global tree yet
        self._seen: dict[str, int] = {}  # request -> how many of its tokens its trees hold (its own: _own)
        self._own: dict[str, int] = {}  # request -> how many of its tokens its own tree holds (native path: the
        # tree is extended only when the request is drafted for, prompt included; observe feeds the global tree)

    @classmethod
    def default_num_speculative_tokens(cls, options: SuffixOptions) -> int:
        depth = options.suffix_decoding_max_tree_depth
        logger.info("method 'suffix': num_speculative_tokens not given, using suffix_decoding_max_tree_depth=%d "
                    "(drafts are at most that long; their length varies per request and step).", depth)
        return depth

    # -- request lifecycle -------------------------------------------------------------------------
    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        self._flush_global()  # before start_request can evict a response that still has tokens pending
        if req_id in self.cache.active_requests:  # a re-added id is a new request (e.g. after preemption)
            self.cache.stop_request(req_id)
        # start_request also evicts an earlier cached response under the same id, and the oldest
        # cached response once more than max_cached_requests are kept.
        self._start(req_id, _int32(prompt_token_ids))

    def _start(self, req_id: str, prompt: np.ndarray) -> None:
        """Start ``req_id`` in the cache after ``prompt`` (int32). On the native path its own tree waits for its
        first draft (:meth:`_ingest`): a request never drafted for never builds one."""
        if self._native is None:
            self.cache.start_request(req_id, prompt)
        else:
            self.cache.start_request(req_id, prompt[:0])
            self._own[req_id] = 0
        self._seen[req_id] = len(prompt)

    def remove_request(self, req_id: str) -> None:
        # Only the prompt tree is freed; the response stays in the global tree until evicted.
        self._flush_global()
        self._seen.pop(req_id, None)
        self._own.pop(req_id, None)
        if req_id in self.cache.active_requests:
            self.cache.stop_request(req_id)

    # -- drafting ----------------------------------------------------------------------------------
    def propose(self, batch: DraftBatch) -> Drafts:
        self._flush_global()  # an embedder that never calls while_verifying still gets every token in
        k = batch.num_speculative_tokens
        token_ids = batch.token_ids  # [B, L]: each row's slices converted (_int32) as taken, not the whole array
        native, tree = self._native, self.use_tree_spec
        width = (self.options.tree_nodes or k) if tree else k  # nodes a tree may grow; a chain's k drafts
        drafts: list[list[int]] = []
        parents: list[list[int]] = []
        for i, req_id in enumerate(batch.req_ids):
            # Row by row, as vLLM does: a row's draft sees the earlier rows' new tokens in the global tree.
            if not self._ingest(batch, token_ids, i, own=True):  # still prefilling: no draft (as in vLLM)
                drafts.append([])
                parents.append([])
                continue
            n = int(batch.num_tokens[i])
            # Pass max_spec_tokens always: None fails in arctic-inference 0.3.0 and 0 means "tree depth".
            max_spec = min(width, batch.max_model_len - n)
            if max_spec <= 0:  # at max_model_len: no room for drafts
                drafts.append([])
                parents.append([])
                continue
            context = _int32(token_ids[i, max(0, n - self.max_tree_depth): n])  # [<=depth] contiguous int32
            if native is None:
                d = self.cache.speculate(req_id, context, max_spec_tokens=max_spec,
                                         max_spec_factor=self.max_spec_factor, min_token_prob=self.min_token_prob,
                                         use_tree_spec=tree)
            else:
                d = native.speculate(req_id, context, max_spec, self.max_spec_factor, self.min_token_prob, tree)
            drafts.append(d.token_ids)  # a wider tree's nodes deeper than k: the engine's tree checks cut them
            parents.append(d.parents)
        return Drafts.from_lists(drafts, width, parents if tree else None)

    def observe(self, batch: DraftBatch) -> bool:
        """Tokens without drafting: the rows' unseen tokens go into the trees as in :meth:`propose`, nothing is
        speculated (the costly part). The engine calls it for requests that leave after steps it skipped (their
        responses' last tokens, for the global tree), and an embedder may on steps without drafts."""
        self._flush_global()
        token_ids = batch.token_ids
        for i in range(len(batch.req_ids)):
            self._ingest(batch, token_ids, i, own=False)
        return True

    def _ingest(self, batch: DraftBatch, token_ids: np.ndarray, i: int, own: bool) -> bool:
        """Add row ``i``'s tokens its trees have not seen (this step's, or every one since the proposer's last
        call) to the global tree (now or, with ``defer_global_updates``, at :meth:`while_verifying`) and, with
        ``own`` (a draft follows) or through the cache's methods, to its request's own tree. On the native path a
        request's own tree takes its tokens, prompt included, only when it is drafted for: a request the
        speculation policy never drafts for never builds one (H100, batch 8, T = 0.8, every step plain: the prompt
        trees and the leaving responses' own trees cost 0.924x of the baseline's step). A tree's state depends only
        on its token sequence, so the drafts are the same. False: the row sampled nothing (prefilling)."""
        req_id, sampled = batch.req_ids[i], batch.sampled_token_ids[i]
        if not sampled:
            return False
        n = int(batch.num_tokens[i])
        native = self._native
        if req_id not in self.cache.active_requests:  # never added (an embedder skipping add_request): start it
            self._start(req_id, _int32(token_ids[i, : n - len(sampled)]))
        seen = self._seen.get(req_id, n - len(sampled))
        self._seen[req_id] = n
        new = _int32(token_ids[i, seen:n])  # a view of int32 rows (the engine's and vLLM's): no copy
        if native is None:
            if len(new):
                self.cache.add_active_response(req_id, new)
            return True
        if own and (have := self._own.get(req_id, 0)) < n:
            native.extend(native.local[req_id], 0, _int32(token_ids[i, have:n]))
            self._own[req_id] = n
        if not len(new):
            return True
        if self.defer_global_updates:  # the global tree while the target verifies (a copy: the batch's
            self._global_pending.append((req_id, new.copy()))  # rows may change before then)
        elif (seq := native.seq_ids.get(req_id)) is not None:  # None: no global tree
            native.extend(native.global_tree, seq, new)
        return True

    def while_verifying(self) -> None:
        """With ``defer_global_updates``: add the tokens :meth:`propose` appended to the requests' own
        trees to the global tree as well, while the target's verify forward runs on the device.
        Until then the global tree lacks every running request's last tokens, its own included
        (they change the counts, and so the probabilities, of the nodes its context matches), so
        the drafts can differ from arctic-inference's; verification keeps the output exact either
        way. Without it, nothing is pending here."""
        self._flush_global()

    def _flush_global(self) -> None:
        if not self._global_pending:
            return
        native, seq_ids = self._native, self._native.seq_ids
        for req_id, new in self._global_pending:
            seq = seq_ids.get(req_id)
            if seq is not None:  # None: the global tree is off (max_cached_requests 0)
                native.extend(native.global_tree, seq, new)
        self._global_pending.clear()


@dataclass(frozen=True, slots=True)
class _NativeTrees:
    """arctic-inference 0.3.0's suffix trees under its SuffixDecodingCache, called directly: its
    Python wrapper checks and copies every array and draft (a few microseconds a call; 3-10% of the
    drafting on long histories, ``bench_suffix.py --cost-only``), and applies both trees' updates at
    once, where the global one can wait for :meth:`SuffixProposer.while_verifying`."""

    local: dict  # request id -> its prompt-and-response tree
    global_tree: Any
    seq_ids: dict  # request id -> its response's id in the global tree
    extend: Any  # SuffixTree.extend_ndarray(tree, seq_id, int32 tokens)
    spec: Any  # SuffixTree.speculate_ndarray(tree, context, max_spec, factor, offset, min_prob, tree_spec)

    def speculate(self, req_id: str, context: np.ndarray, max_spec: int, factor: float, min_prob: float,
                  tree: bool = False) -> Any:
        """What SuffixDecodingCache.speculate returns: the better-scoring draft of the request's own
        tree and the global tree (the request's own on a tie); ``.token_ids`` and ``.parents``."""
        own = self.spec(self.local[req_id], context, max_spec, factor, 0.0, min_prob, tree)
        other = self.spec(self.global_tree, context, max_spec, factor, 0.0, min_prob, tree)
        return own if own.score >= other.score else other


def _native_trees(cache: Any) -> _NativeTrees | None:
    """The cache's trees for direct calls, or None (use the cache's own methods) when this is not the
    arctic-inference layout they were written against."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError:
        return None
    names = ("_local_trees", "_global_tree", "_req_to_seq_id")
    if not all(hasattr(cache, n) for n in names) or not all(
            hasattr(SuffixTree, f) for f in ("extend_ndarray", "speculate_ndarray")):
        logger.info("arctic-inference's SuffixDecodingCache has another layout: drafting through its methods.")
        return None
    return _NativeTrees(cache._local_trees, cache._global_tree, cache._req_to_seq_id, SuffixTree.extend_ndarray,
                        SuffixTree.speculate_ndarray)


def _int32(a: Any) -> np.ndarray:
    """A C-contiguous int32 view (a copy only when needed): the native calls reject anything else."""
    return np.ascontiguousarray(a, dtype=np.int32)

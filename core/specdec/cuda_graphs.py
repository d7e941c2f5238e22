"""CUDA graphs for the target forward: fixed-shape buffers, bucketed shapes, replay per step.

A graph covers slots ``0 .. bb-1`` (bb a batch bucket), ``qb`` query tokens per slot (1 for the
baseline's one-token step, k+1 for a verify step) and the first ``kb`` KV positions (a KV-length
bucket). Per step the host copies three small tensors (token ids, committed lengths, real token
counts) into the graph's static inputs and replays it; positions, KV write positions and the
attention mask are recomputed inside the graph from them. Slots in the bucket that are idle this
step get zero real tokens: their padding writes go to the cache's scratch position.

A step graph also runs the LM head over all of its ``bb * qb`` rows (into one logits buffer shared by
every step graph) and their argmax: after the replay the host copies that argmax into pinned memory,
so a greedy step reads its tokens without launching another kernel
(:meth:`specdec.runner.TargetOutput.greedy_token_ids`). The buffer holds ``max_num_seqs x (k + 1)``
float32 rows of the vocabulary, allocated once (256 x 9 rows of a 152k vocabulary: 1.4 GB), the size
of the largest verify step's logits.

Prefill graphs cover the other frequent forward: a group of new requests, each starting from an
empty slot. One graph per (group bucket ``gb``, prompt bucket ``pb``) takes the group's slots as an
input (they are wherever slots were free), reads and writes only those rows, and sees ``pb`` KV
positions. An eager Hugging Face forward costs its kernel launches (about 10 ms for a 12-layer model
on an H200, whatever the prompt), which a replay does not pay; groups or prompts larger than every
bucket (``max_prefill_tokens`` in all) stay eager.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from specdec.layout import adjacent_columns, logit_rows, pack_tokens

if TYPE_CHECKING:
    from specdec.proposer import HiddenStateRequest
    from specdec.runner import ModelRunner, TargetOutput  # annotations only: the runner imports this module

__all__ = ["DEFAULT_PREFILL_GRAPH_TOKENS", "GraphRunner", "HostArgmax", "SlotStepGraphs", "StaticStep",
           "batch_buckets", "capture_buckets", "capture_graph", "kv_buckets", "prefill_buckets", "row_argmax",
           "tree_buckets"]

logger = logging.getLogger("specdec.cuda_graphs")
K = TypeVar("K", bound=tuple)
V = TypeVar("V")

# Step graphs compute the logits and their argmax inside the graph (see the module docstring); False
# keeps the LM head outside, eager after the replay (for debugging).
GRAPH_LOGITS = True

# Padded tokens of the largest prefill graph ``LLM`` captures by default: a full wave of 32 prompts
# of 256 tokens, or 8 of 1024. The graphs share one memory pool, sized by the largest.
DEFAULT_PREFILL_GRAPH_TOKENS = 8192


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of ``[R, V]`` logits, the same indices (the first maximum of each row), in two stages when
    ``V`` splits into 64-128 equal chunks: the maximum of each chunk, then the best chunk. A single-stage argmax of a
    few 128k-entry rows runs one thread block per row (28 us on an H200 for one row, inside every step graph); the
    chunks spread it over the GPU."""
    r, v = logits.shape
    chunks = next((c for c in range(128, 63, -1) if v % c == 0 and v // c >= 256), None)
    if chunks is None:
        return logits.argmax(-1)
    best, at = logits.view(r, chunks, v // chunks).max(-1)  # [R, C] each: the first maximum within each chunk
    chunk = best.argmax(-1, keepdim=True)  # the first chunk holding the row's maximum
    return (chunk * (v // chunks) + at.gather(1, chunk))[:, 0]


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8 up to ``max_batch`` (always included)."""
    out = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8))
    return sorted(set(out + [max_batch]))


def kv_buckets(capacity: int, smallest: int = 128) -> list[int]:
    """Powers of two from ``smallest`` up to ``capacity`` (always included)."""
    out, b = [], smallest
    while b < capacity:
        out.append(b)
        b *= 2
    return out + [capacity]


def tree_buckets(max_nodes: int) -> list[int]:
    """Node-count buckets (root included) of tree-verification graphs for trees of up to ``max_nodes`` drafts:
    8, 16, 32 where a tree of ``max_nodes`` is at least twice as large, then ``max_nodes + 1``; none for 0."""
    if max_nodes <= 0:
        return []
    return [x for x in (8, 16, 32) if 2 * x <= max_nodes + 1] + [max_nodes + 1]


def prefill_buckets(max_batch: int, max_model_len: int, max_tokens: int, smallest: int = 64) -> list[tuple[int, int]]:
    """(group, prompt length) buckets of the prefill graphs: batch buckets x powers of two from
    ``smallest`` up to ``max_model_len``, keeping those of at most ``max_tokens`` tokens."""
    return [(g, p) for g in batch_buckets(max_batch) for p in kv_buckets(max_model_len, smallest)
            if g * p <= max_tokens]


def capture_graph(fn: Any, pool: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``fn()`` in a CUDA graph drawing on memory ``pool``: two warm-up calls on a side
    stream (lazy initialisation, autotuning), then the capture. Returns the graph and what the
    captured call returned (its static outputs, refreshed by every replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # No garbage collection while capturing: a collection could run the finaliser of an unrelated object
    # (an earlier engine's graph, event or pinned buffer) whose CUDA call is illegal during a capture, which
    # aborts the process (seen on the H200 suite). torch.cuda.graph collects once before capture begins.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    finally:
        if collecting:
            gc.enable()
    return graph, out


def capture_buckets(keys: Iterable[K], capture_one: Callable[..., V], *, desc: str, use_graphs: bool = True,
                    size: Callable[[K], int] | None = None) -> dict[K, V]:
    """``{key: capture_one(*key)}`` for every bucket key (a tuple of sizes), built largest first (by
    ``size(key)``, default the product of the key's numbers) so that graphs sharing one memory pool
    size it with the first capture and the smaller ones reuse it; with a progress bar while capturing.
    The one capture loop of the core's step and prefill graphs and of plugins' draft chains;
    ``capture_one`` usually ends in :func:`capture_graph`. Exceptions propagate (the caller decides
    whether to run eager)."""
    from tqdm.auto import tqdm

    size = size or math.prod
    ordered = sorted(keys, key=lambda key: (size(key), key), reverse=True)
    out: dict[K, V] = {}
    for key in tqdm(ordered, desc=desc, unit="graph", disable=not use_graphs, leave=False):
        out[key] = capture_one(*key)
    return out


@dataclass
class StaticStep:
    """One (batch, KV) bucket of a :class:`SlotStepGraphs`: ``inputs`` (a device int64 buffer) and ``host``, its
    host twin (pinned on CUDA); ``feats``, a device buffer of target features ``[bb, q, F]``; ``drafts``, the
    output ``[bb, k]``; ``graph`` (None when the step runs eagerly) and ``fn``, the captured function."""

    inputs: torch.Tensor
    host: torch.Tensor
    feats: torch.Tensor
    drafts: torch.Tensor
    graph: torch.cuda.CUDAGraph | None
    fn: Any


class SlotStepGraphs:
    """A plugin's greedy draft step over a slot cache, one :class:`StaticStep` per (batch, KV) bucket: rows are
    the cache's slots ``0 .. bb - 1``, so the host hands over one static integer buffer and a device copy of the
    step's features. What eagle's captured chain and dflash's captured block share: the buckets, the capture
    loop with its fallback, the buffers, the bucket choice and the launch. A subclass defines ``_capture(bb,
    kb)`` (usually :meth:`buffers`, a function over them, then :meth:`finish`) and a ``run`` that fills the host
    buffer and calls :meth:`launch`. With ``use_graphs=False`` the same functions run eagerly (CPU tests)."""

    def __init__(self, num_slots: int, capacity: int, k: int, width: int, use_graphs: bool) -> None:
        self.k, self.q, self.cap, self.width = k, k + 1, capacity, width
        self.use_graphs = use_graphs
        self.batches = batch_buckets(num_slots)
        self.kvs = kv_buckets(capacity)
        self.steps: dict[tuple[int, int], StaticStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self.runs = 0  # steps drafted (for tests and profiles)
        self.last: tuple[int, int] | None = None  # the (batch, KV) bucket of the last run

    def _capture(self, bb: int, kb: int) -> StaticStep:
        raise NotImplementedError

    def capture_all(self, name: str, fallback: str, log: logging.Logger) -> bool:
        """Prepare (``use_graphs=False``) or capture every bucket; False (with a warning naming ``fallback``, what
        the caller does instead) where that fails. ``name``: what the steps are, for the progress bar and logs."""
        t0 = time.perf_counter()
        try:
            shapes = [(b, kv) for b in self.batches for kv in self.kvs]
            self.steps = capture_buckets(shapes, self._capture, desc=f"Capturing {name}", use_graphs=self.use_graphs)
        except Exception as exc:  # a step that cannot be captured: the caller's eager path stays
            log.warning("%s capture failed (%s: %s): %s.", name, type(exc).__name__, exc, fallback)
            return False
        log.info("%s %s (k=%d) for batch %s x kv %s in %.1f s.", "Captured" if self.use_graphs else "Prepared",
                 name, self.k, self.batches, self.kvs, time.perf_counter() - t0)
        return True

    def buffers(self, bb: int, num_inputs: int, dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Zeroed ``inputs [num_inputs]`` (device), its ``host`` twin, ``feats [bb, q, width]`` of ``dtype`` and
        ``drafts [bb, k]`` for one bucket."""
        inputs = torch.zeros(num_inputs, dtype=torch.long, device=device)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        feats = torch.zeros(bb, self.q, self.width, dtype=dtype, device=device)
        return inputs, host, feats, torch.zeros(bb, self.k, dtype=torch.long, device=device)

    def finish(self, inputs: torch.Tensor, host: torch.Tensor, feats: torch.Tensor, drafts: torch.Tensor,
               fn: Any) -> StaticStep:
        """The bucket's step: ``fn`` captured (its inputs are zeros: every row idle, so the warm-ups write only
        scratch positions) or, without graphs, kept to run eagerly."""
        graph = capture_graph(fn, self.pool)[0] if self.use_graphs else None
        return StaticStep(inputs, host, feats, drafts, graph, fn)

    def bucket(self, slots: list[int], kv_need: int) -> tuple[int, int] | None:
        """The smallest (batch, KV) bucket holding slot ``max(slots)`` and ``kv_need`` positions, or None."""
        bb = next((x for x in self.batches if x > max(slots)), None)
        kb = next((x for x in self.kvs if x >= kv_need), None)
        return None if bb is None or kb is None else (bb, kb)

    def launch(self, key: tuple[int, int], order_at: int, size: int,
               feats: torch.Tensor | Callable[[torch.Tensor, list[int]], None] | None) -> torch.Tensor:
        """Run bucket ``key`` after its ``host`` buffer was filled: copy it to the device, put ``feats [size, W,
        F]`` into the feature rows of the slots at ``inputs[order_at: order_at + size]`` (request order; or call
        ``feats(buffer [bb, W, F], those slots as a list)`` to write them), replay
        (or run the function) and return those slots' drafts ``[size, k]`` in request order."""
        c = self.steps[key]
        c.inputs.copy_(c.host, non_blocking=c.inputs.device.type == "cuda")
        order = c.inputs[order_at: order_at + size]
        slots = c.host[order_at: order_at + size].tolist()
        if callable(feats):  # it writes the rows itself (given the slots in request order)
            feats(c.feats, slots)
        elif feats is not None:
            c.feats[order, : feats.shape[1]] = feats.to(c.feats.dtype)
        if c.graph is not None:
            c.graph.replay()
        else:
            c.fn()
        self.runs += 1
        self.last = key
        return c.drafts.index_select(0, order)  # a tensor of its own: a caller may keep a step's drafts


@dataclass
class _Graph:
    inputs: torch.Tensor  # [2 * bb * qb + 3 * bb] on the device: ids, start, n, logits rows, slots (one copy per step)
    host: torch.Tensor  # the same layout on the host (pinned on CUDA), refilled each step
    input_ids: torch.Tensor  # [bb, qb] view of inputs
    start: torch.Tensor  # [bb] view
    n: torch.Tensor  # [bb] view
    logit_rows: torch.Tensor  # [bb * qb] view: the flat rows whose logits are wanted (a prefix is used)
    slots: torch.Tensor  # [bb] view: the step's slots in request order (where device draft ids go)
    hidden: torch.Tensor  # [bb, qb, H] output
    aux: list[torch.Tensor] | None
    argmax: torch.Tensor | None  # [bb * qb] output: argmax of each flat row's logits (in GraphRunner.logits)
    graph: torch.cuda.CUDAGraph | None
    fn: Any
    host_alt: torch.Tensor  # a second host buffer: step replays alternate (GraphRunner._host)


@dataclass
class _Prefill:
    inputs: torch.Tensor  # [2 * gb * pb + 2 * gb] on the device: ids, n, slots, logits rows
    host: torch.Tensor
    hidden: torch.Tensor  # [gb, pb, H] output
    aux: list[torch.Tensor] | None
    graph: torch.cuda.CUDAGraph | None
    fn: Any  # returns (hidden, aux, None): a prefill's few logits rows are computed after it
    argmax: None = None


@dataclass
class _Tree:
    inputs: torch.Tensor  # [3 * bb * qb + 2 * bb] on the device: ids, parents, start, n, logits rows, slots
    host: torch.Tensor
    nodes: torch.Tensor  # [2, bb, qb] view of inputs: the ids, then the parents as drafted (forward_tree_ids' overlay)
    slots: torch.Tensor  # [bb] view of inputs: the requests' rows (forward_tree_ids' overlay when not 0 .. b - 1)
    hidden: torch.Tensor
    aux: list[torch.Tensor] | None
    argmax: torch.Tensor | None
    graph: torch.cuda.CUDAGraph | None
    fn: Any


class GraphRunner:
    """Captured forwards of one :class:`ModelRunner`, looked up by (batch, query, KV) bucket, prefill forwards
    by (group, prompt) bucket and tree-verification forwards by (batch, node count, KV) bucket."""

    def __init__(self, target: ModelRunner, query_lens: list[int], hidden: HiddenStateRequest | None,
                 use_graphs: bool, max_prefill_tokens: int = 0, tree_lens: list[int] | None = None) -> None:
        self.target = target
        self.query_lens = sorted(set(query_lens))
        self.tree_lens = sorted(set(tree_lens or ()))
        self.trees: dict[tuple[int, int, int], _Tree] = {}
        self.tree_replays = 0  # tree forwards served by a tree graph (for tests and logs)
        self.hidden = hidden
        self.aux_ids = tuple(hidden.aux_layer_ids) if hidden is not None else ()
        self.use_graphs = use_graphs
        self.batches = batch_buckets(len(target.lengths))
        self.kvs = kv_buckets(target.max_model_len)
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.prefill_shapes = prefill_buckets(len(target.lengths), target.max_model_len, max_prefill_tokens) \
            if max_prefill_tokens else []
        self.prefills: dict[tuple[int, int], _Prefill] = {}
        self.prefill_replays = 0  # prefill forwards served by a prefill graph (for tests and logs)
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        # Logits of the step graphs' rows (one buffer: a step replays one graph) and two host copies of
        # their argmax, which step replays alternate (with an event each), so a step queued ahead
        # (:meth:`ahead`) leaves the one before it readable; `replays` tells a TargetOutput whether a later
        # replay overwrote its copy.
        rows = self.batches[-1] * max([self.query_lens[-1], *self.tree_lens])
        head = target.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if getattr(head, "weight", None) is not None else target.vocab_size
        self.logits = torch.empty(rows, vocab, dtype=torch.float32, device=target.device)
        self.argmax_host = [torch.zeros(rows, dtype=torch.long, pin_memory=use_graphs) for _ in range(2)]
        self._argmax_np = [a.numpy() for a in self.argmax_host]
        self.events = [torch.cuda.Event() for _ in range(2)] if use_graphs else None
        self.replays = 0
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # the last step replay's argmax and logits rows

    @classmethod
    def build(cls, target: ModelRunner, query_lens: list[int], hidden: HiddenStateRequest | None,
              use_graphs: bool = True, max_prefill_tokens: int = 0, tree_lens: list[int] | None = None
              ) -> GraphRunner | None:
        """Capture every shape, or return None (with a log line) where that is not possible.
        ``max_prefill_tokens`` > 0 also captures prefill graphs of up to that many tokens; ``tree_lens``, tree
        graphs of up to each of those node counts."""
        if use_graphs and target.device.type != "cuda":
            logger.info("CUDA graphs need a CUDA device (target is on %s): running eager.", target.device)
            return None
        runner = cls(target, query_lens, hidden, use_graphs, max_prefill_tokens, tree_lens)
        try:
            runner.capture_all()
        except Exception as exc:  # any model code that cannot be captured: stay correct, run eager
            logger.warning("CUDA graph capture failed (%s: %s): running eager.", type(exc).__name__, exc)
            return None
        return runner

    def capture_all(self) -> None:
        """Capture (or prepare, without graphs) every prefill and (batch, query, KV) bucket."""
        shapes = [(b, q, k) for b in self.batches for q in self.query_lens for k in self.kvs]
        t0 = time.perf_counter()
        # Largest first (capture_buckets), so the shared memory pool is sized once: the prefill graphs
        # (up to max_prefill_tokens tokens), then the step graphs (at most max_batch x (k + 1) tokens).
        try:
            self.prefills = capture_buckets(self.prefill_shapes, self._capture_prefill, desc="Capturing prefill graphs",
                                            use_graphs=self.use_graphs)
        except Exception as exc:  # e.g. out of memory for the largest group: prompts run eager, steps replay
            logger.warning("prefill graph capture failed (%s: %s): prefills run eager; pass a smaller "
                           "prefill_graph_tokens to keep them.", type(exc).__name__, exc)
            self.prefills.clear()
            self.prefill_shapes = []
        self.graphs = capture_buckets(shapes, self._capture, desc="Capturing CUDA graphs", use_graphs=self.use_graphs)
        tree_shapes = [(b, q, k) for b in self.batches for q in self.tree_lens for k in self.kvs]
        try:
            self.trees = capture_buckets(tree_shapes, self._capture_tree, desc="Capturing tree graphs",
                                         use_graphs=self.use_graphs)
        except Exception as exc:  # e.g. out of memory: trees verify eagerly, chains still replay
            logger.warning("tree graph capture failed (%s: %s): token trees verify eagerly.", type(exc).__name__, exc)
            self.trees.clear()
            self.tree_lens = []
        what = "Captured CUDA graphs" if self.use_graphs else "Prepared static forward buffers"
        logger.info("%s for %d shapes (batch %s x query %s x kv %s), %d prefill shapes and %d tree shapes (nodes %s) "
                    "in %.1f s.", what, len(shapes), self.batches, self.query_lens, self.kvs, len(self.prefill_shapes),
                    len(self.trees), self.tree_lens, time.perf_counter() - t0)

    @torch.inference_mode()
    def _capture(self, bb: int, qb: int, kb: int) -> _Graph:
        t, dev = self.target, self.target.device
        inputs = torch.zeros(2 * bb * qb + 3 * bb, dtype=torch.long, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        input_ids = inputs[: bb * qb].view(bb, qb)
        start = inputs[bb * qb: bb * qb + bb]
        n = inputs[bb * qb + bb: bb * qb + 2 * bb]  # zero real tokens: capture writes only scratch
        logit_rows = inputs[bb * qb + 2 * bb: 2 * bb * qb + 2 * bb]  # read after the replay, outside the graph
        slots = inputs[2 * bb * qb + 2 * bb:]  # read before the replay, outside the graph
        row_index = torch.arange(bb, device=dev)[:, None]
        rows = slice(0, bb)
        logits = self.logits[: bb * qb]

        def fn() -> tuple[torch.Tensor, list[torch.Tensor] | None, torch.Tensor | None]:
            h, aux = t.run(input_ids, rows, row_index, kb, t.step_tensors(start, n, qb, kb), self.aux_ids)
            aux = side_by_side(aux)
            if not GRAPH_LOGITS:
                return h, aux, None
            t.compute_logits(h.reshape(bb * qb, -1), out=logits)
            return h, aux, row_argmax(logits)

        alt = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        if not self.use_graphs:
            return _Graph(inputs, host, input_ids, start, n, logit_rows, slots, torch.empty(0), None, None, None, fn,
                          alt)
        graph, (hidden, aux, argmax) = capture_graph(fn, self.pool)
        return _Graph(inputs, host, input_ids, start, n, logit_rows, slots, hidden, aux, argmax, graph, fn, alt)

    @torch.inference_mode()
    def _capture_prefill(self, gb: int, pb: int) -> _Prefill:
        t, dev = self.target, self.target.device
        inputs = torch.zeros(2 * gb * pb + 2 * gb, dtype=torch.long, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        input_ids = inputs[: gb * pb].view(gb, pb)
        n = inputs[gb * pb: gb * pb + gb]  # zero real tokens: capture writes only scratch
        slots = inputs[gb * pb + gb: gb * pb + 2 * gb]  # the group's cache rows (idle rows: any row)
        start = torch.zeros(gb, dtype=torch.long, device=dev)  # prefills start from an empty slot

        def fn() -> tuple[torch.Tensor, list[torch.Tensor] | None, None]:
            return *t.run(input_ids, slots, slots[:, None], pb, t.step_tensors(start, n, pb, pb), self.aux_ids), None

        if not self.use_graphs:
            return _Prefill(inputs, host, torch.empty(0), None, None, fn)
        graph, (hidden, aux, _) = capture_graph(fn, self.pool)
        return _Prefill(inputs, host, hidden, aux, graph, fn)

    @torch.inference_mode()
    def _capture_tree(self, bb: int, qb: int, kb: int) -> _Tree:
        t, dev = self.target, self.target.device
        inputs = torch.zeros(3 * bb * qb + 3 * bb, dtype=torch.long, device=dev)
        host = torch.zeros(inputs.shape, dtype=torch.long, pin_memory=self.use_graphs)
        nodes = inputs[: 2 * bb * qb].view(2, bb, qb)
        start = inputs[2 * bb * qb: 2 * bb * qb + bb]
        n = inputs[2 * bb * qb + bb: 2 * bb * qb + 2 * bb]  # zero real nodes: capture writes only scratch
        slots = inputs[3 * bb * qb + 2 * bb:]
        row_index = torch.arange(bb, device=dev)[:, None]
        rows = slice(0, bb)
        logits = self.logits[: bb * qb]
        top = (torch.arange(qb, device=dev) - 1).clamp(min=0)  # the last node a node's parent may be

        def fn() -> tuple[torch.Tensor, list[torch.Tensor] | None, torch.Tensor | None]:
            # the nodes as drafted, brought into range here (tree_node_inputs' rule: ids into the vocabulary; draft
            # j's parent, -1 the root, as a node index in 0 .. j; the root's and padding's -1 give node 0)
            input_ids = nodes[0].clamp(0, t.vocab_size - 1)
            parents = torch.minimum((nodes[1] + 1).clamp(min=0), top)
            h, aux = t.run(input_ids, rows, row_index, kb, t.tree_step_tensors(start, n, parents, qb, kb),
                           self.aux_ids)
            if not GRAPH_LOGITS:
                return h, aux, None
            t.compute_logits(h.reshape(bb * qb, -1), out=logits)
            return h, aux, row_argmax(logits)

        if not self.use_graphs:
            return _Tree(inputs, host, nodes, slots, torch.empty(0), None, None, None, fn)
        graph, (hidden, aux, argmax) = capture_graph(fn, self.pool)
        return _Tree(inputs, host, nodes, slots, hidden, aux, argmax, graph, fn)

    def forward_tree(self, slots: list[int], tokens: list[list[int]], parents: list[list[int]], starts: list[int],
                     lens: list[int], hidden: HiddenStateRequest | None) -> TargetOutput | None:
        """Replay the tree graph that fits (see :meth:`specdec.runner.ModelRunner.forward_tree`), or return None
        (the caller runs eager). Requests sit in the rows of their slots."""
        key = self._step_key(self.tree_lens, slots, starts, lens) if self._serves(hidden) else None
        if key is None:
            return None
        bb, qb, _ = key
        g = self.trees[key]
        # the previous step's copies are complete: the host read its logits since
        host = g.host.numpy()
        at = 2 * bb * qb  # ids, then parents, then the step's start, counts and logits rows
        area = host[bb * qb: at]
        pack_tokens(slots, [[0] + p for p in parents], lens, bb, qb, out=area.reshape(bb, qb))
        area -= 1  # in the drafted convention the graph reads (node p's parent p - 1, the root's and padding's -1)
        wanted = self._pack_step(host, at, bb, qb, slots, tokens, lens, lens)
        self.tree_replays += 1
        index = g.inputs[at + 2 * bb: at + 2 * bb + len(wanted)]
        return self._replay(g, slots, qb, lens, lens, hidden, index, wanted)

    def forward_tree_ids(self, slots: list[int], roots: list[int], ids: torch.Tensor, parents: torch.Tensor,
                         starts: list[int], lens: list[int], hidden: HiddenStateRequest | None) -> TargetOutput | None:
        """Replay the tree graph that fits trees on the device (see
        :meth:`specdec.runner.ModelRunner.forward_tree_ids`): the roots go up with the packed inputs, the nodes'
        ids and parents are written into the graph's inputs on the device after that copy; or return None."""
        key = self._step_key(self.tree_lens, slots, starts, lens) if self._serves(hidden) else None
        if key is None:
            return None
        bb, qb, _ = key
        g = self.trees[key]
        host = g.host.numpy()
        at = 2 * bb * qb
        host[bb * qb: at] = -1  # parents as drafted: the root's (and padding's) -1 is node 0 in the graph
        n = len(slots)
        padded = [[r] + [0] * (m - 1) for r, m in zip(roots, lens)]  # the nodes' ids come on the device
        wanted = self._pack_step(host, at, bb, qb, slots, padded, lens, lens)
        w = min(qb - 1, ids.shape[1])
        vals = torch.stack((ids[:, :w], parents[:, :w]))  # [2, n, w], as drafted: the graph brings them into range
        cols = g.nodes[:, :, 1: 1 + w]
        if slots == list(range(n)):
            overlay = (cols[:, :n], None, vals)
        else:
            host[3 * bb * qb + 2 * bb: 3 * bb * qb + 2 * bb + n] = slots
            overlay = (cols, g.slots[:n], vals)
        self.tree_replays += 1
        index = g.inputs[at + 2 * bb: at + 2 * bb + len(wanted)]
        return self._replay(g, slots, qb, lens, lens, hidden, index, wanted, overlay, dim=1, clamp=False)

    def prefill(self, slots: list[int], tokens: list[list[int]], lens: list[int], num_logits: list[int],
                hidden: HiddenStateRequest | None) -> TargetOutput | None:
        """Replay the prefill graph that fits a group of requests starting from empty slots, or return
        None (the caller runs eager)."""
        if not self._serves(hidden) or not self.prefill_shapes:
            return None
        need = max(lens)
        key = next(((g, p) for g, p in self.prefill_shapes if g >= len(slots) and p >= need), None)
        if key is None:
            return None
        gb, pb = key
        g = self.prefills[key]
        host = g.host.numpy()
        rows = list(range(len(slots)))
        pack_tokens(rows, tokens, lens, gb, pb, out=host[: gb * pb].reshape(gb, pb))
        host[gb * pb: gb * pb + gb] = 0
        host[gb * pb: gb * pb + len(lens)] = lens
        host[gb * pb + gb: gb * pb + 2 * gb] = slots[0]  # idle rows write scratch of a real row, read nothing
        host[gb * pb + gb: gb * pb + gb + len(slots)] = slots
        wanted = logit_rows(rows, pb, lens, num_logits)
        base = gb * pb + 2 * gb
        host[base: base + len(wanted)] = wanted
        self.prefill_replays += 1
        return self._replay(g, rows, pb, lens, num_logits, hidden, g.inputs[base: base + len(wanted)])

    def _bucket(self, buckets: list[int], value: int) -> int | None:
        return next((b for b in buckets if b >= value), None)

    def _step_key(self, query_buckets: list[int], slots: list[int], starts: list[int], lens: list[int]
                  ) -> tuple[int, int, int] | None:
        """The (batch, query, KV) bucket of a step over ``slots`` (rows of a graph are slots) with ``lens`` new
        tokens after ``starts`` committed ones, among ``query_buckets``; None where one of them does not fit."""
        bb = self._bucket(self.batches, max(slots) + 1)
        qb = self._bucket(query_buckets, max(lens))
        kb = self._bucket(self.kvs, max(s + n for s, n in zip(starts, lens)))
        return None if bb is None or qb is None or kb is None else (bb, qb, kb)

    def _pack_step(self, host: Any, at: int, bb: int, qb: int, slots: list[int], tokens: list[list[int]],
                   lens: list[int], num_logits: list[int], starts: list[int] | None = None) -> Any:
        """Fill a step graph's host inputs: the ids ``[bb, qb]`` first, then from ``at`` each row's committed
        length (``starts`` for ``slots`` when given), its new-token count (0: idle) and the flat logits rows
        wanted; returns those rows."""
        pack_tokens(slots, tokens, lens, bb, qb, out=host[: bb * qb].reshape(bb, qb))
        host[at: at + bb] = self.target.lengths[:bb]
        if starts is not None:
            host[at: at + bb][slots] = starts
        counts = host[at + bb: at + 2 * bb]
        counts[:] = 0
        counts[slots] = lens
        wanted = logit_rows(slots, qb, lens, num_logits)
        host[at + 2 * bb: at + 2 * bb + len(wanted)] = wanted
        return wanted

    def forward(self, slots: list[int], tokens: list[list[int]], starts: list[int], lens: list[int],
                num_logits: list[int], hidden: HiddenStateRequest | None,
                draft_ids: torch.Tensor | None = None) -> TargetOutput | None:
        """Replay the graph that fits, or return None (the caller runs eager). ``draft_ids``: see
        :meth:`specdec.runner.ModelRunner.forward`."""
        key = self._step_key(self.query_lens, slots, starts, lens) if self._serves(hidden) else None
        if key is None:
            return None
        bb, qb, _ = key
        g = self.graphs[key]
        # Step replays alternate between two host buffers: the copy from this one (two replays ago) is
        # complete, since the host has read that step's tokens.
        host_t = self._host(g)
        host = host_t.numpy()
        wanted = self._pack_step(host, bb * qb, bb, qb, slots, tokens, lens, num_logits)
        num_rows = len(wanted)
        overlay = None
        if draft_ids is not None:
            overlay = self._overlay(g, host, bb, qb, slots, g.input_ids[:, 1: 1 + draft_ids.shape[1]], draft_ids)
        return self._replay(g, slots, qb, lens, num_logits, hidden, g.logit_rows[:num_rows], wanted, overlay, host_t)

    def _serves(self, hidden: HiddenStateRequest | None) -> bool:
        """The graphs return the aux hidden states ``hidden`` asks for (they were captured for one set); any of them
        serves a step that asks for none (its outputs go unread)."""
        return hidden is None or tuple(hidden.aux_layer_ids) == self.aux_ids

    def _host(self, g: _Graph) -> torch.Tensor:
        return g.host if self.replays % 2 == 0 else g.host_alt

    def ahead(self, prev: TargetOutput, slots: list[int], starts: list[int], hidden: HiddenStateRequest | None = None,
              sampled: tuple[torch.Tensor, torch.Tensor] | None = None) -> TargetOutput | None:
        """Queue the plain decode step that follows ``prev`` (the last step replay, one logits row per request of
        ``slots``, in that order) before anyone reads ``prev``'s tokens: one token per slot at committed lengths
        ``starts``, its ids ``prev``'s argmax taken on the device. What a greedy request decodes next whenever it
        goes on; the caller uses the result only if it does (and its length is ``starts``), else drops it: its
        cache writes sit past the committed lengths, where nothing reads them. ``hidden``: the hidden states to
        return, as :meth:`forward`. ``sampled``: ``(indices, ids)``, device tensors: the requests at those
        indices of ``slots`` go on with those ids instead of their argmax (their keyed samples). None where no
        graph fits (or the graphs hold other aux layers than ``hidden``'s) or ``prev`` is not the last replay."""
        ha = prev.host_argmax
        if ha is None or ha.runner is not self or ha.replay != self.replays or self._last is None:
            return None
        if not self._serves(hidden):
            return None
        n = len(slots)
        lens = [1] * n
        key = self._step_key(self.query_lens, slots, starts, lens)
        if key is None:
            return None
        argmax_prev, rows_prev = self._last
        if rows_prev.numel() != n:
            return None
        ids = argmax_prev.index_select(0, rows_prev)  # queued before anything below rewrites them
        if sampled is not None:
            ids = ids.index_copy(0, *sampled)
        ids = ids[:, None]
        bb, qb, _ = key
        g = self.graphs[key]
        host_t = self._host(g)
        host = host_t.numpy()
        wanted = self._pack_step(host, bb * qb, bb, qb, slots, [[0]] * n, lens, lens, starts)
        overlay = self._overlay(g, host, bb, qb, slots, g.input_ids[:, :1], ids)
        return self._replay(g, slots, qb, lens, lens, hidden, g.logit_rows[:n], wanted, overlay, host_t)

    @staticmethod
    def _overlay(g: _Graph, host: Any, bb: int, qb: int, slots: list[int], cols: torch.Tensor, ids: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The ``overlay`` of :meth:`_replay` writing device ``ids`` ``[len(slots), W]`` into the input ids' columns
        ``cols`` at the slots' rows: the first rows, or scattered by the slots' index (packed into ``host`` here,
        shipped with the inputs)."""
        n = len(slots)
        if slots == list(range(n)):
            return cols[:n], None, ids
        host[2 * bb * qb + 2 * bb: 2 * bb * qb + 2 * bb + n] = slots
        return cols, g.slots[:n], ids

    def _replay(self, g: _Graph | _Prefill | _Tree, rows: list[int], width: int, lens: list[int], num_logits: list[int],
                hidden: HiddenStateRequest | None, logit_index: torch.Tensor, wanted: Any = None,
                overlay: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None,
                host: torch.Tensor | None = None, dim: int = 0, clamp: bool = True) -> TargetOutput:
        """Copy ``g``'s packed host inputs up, replay it (or run it, without graphs) and gather the
        logits rows and requested states of requests sitting in ``rows`` of its ``[*, width]`` output.
        A step graph's argmax rows are then copied to ``argmax_host`` (asynchronously on CUDA), for the
        output's ``host_argmax`` (rows ``wanted``, the host copy of ``logit_index``). ``overlay``:
        ``(columns, row index or None, ids)``, device ids written into the input ids' ``columns``
        (at ``row index`` along ``dim``, or the first rows) after the copy, clamped into the vocabulary unless
        ``clamp`` is False (a tree graph does that itself). ``host``: the host buffer to copy (``g.host``)."""
        cuda = g.inputs.device.type == "cuda"
        g.inputs.copy_(g.host if host is None else host, non_blocking=cuda)
        if overlay is not None:  # draft ids as drafted: clamped into the vocabulary in the same launch
            cols, index, ids = overlay
            top = self.target.vocab_size - 1
            if index is None:
                torch.clamp(ids, 0, top, out=cols) if clamp else cols.copy_(ids)
            else:
                cols.index_copy_(dim, index, ids.clamp(0, top) if clamp else ids)
        if g.graph is not None:
            g.graph.replay()
            h, argmax = g.hidden, g.argmax
            flat_aux, aux_base = _flat_aux(g)
        else:
            h, aux, argmax = g.fn()
            flat_aux, aux_base = [a.reshape(-1, a.shape[-1]) for a in aux] if aux else None, None
        all_logits = None
        if argmax is not None:
            all_logits = self.logits[: argmax.numel()]
            k = self.replays % 2
            self.argmax_host[k][: argmax.numel()].copy_(argmax, non_blocking=cuda)
            if self.events is not None:
                self.events[k].record()
            self.replays += 1
            self._last = (argmax, logit_index)
        out = self.target.collect(h.reshape(-1, h.shape[-1]), flat_aux, rows, width, lens, num_logits, hidden,
                                   logit_index=logit_index, all_logits=all_logits, aux_base=aux_base)
        if argmax is not None:
            out.host_argmax = HostArgmax(self, wanted)
        return out


def _flat_aux(g: _Graph | _Prefill | _Tree) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
    """A captured graph's aux outputs as ``[rows, H]`` views and, when they sit side by side (:func:`side_by_side`),
    the one ``[rows, n * H]`` tensor whose columns they are; made at the first replay and kept (the buffers never
    move): a head method's plain step otherwise spent ~100 us of host time on the H200 re-deriving them (reshapes,
    storage checks) in a step the host, not the device, bounds (batch 8, e2e's prompts: 0.71-0.75x of the
    baseline with every step plain)."""
    cached = g.__dict__.get("_flat_aux")
    if cached is None:
        flat = [a.reshape(-1, a.shape[-1]) for a in g.aux] if g.aux else None
        cached = g.__dict__["_flat_aux"] = (flat, adjacent_columns(flat) if flat and len(flat) > 1 else None)
    return cached


def side_by_side(aux: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """Several aux hidden states ``[b, q, H]`` of one dtype as column views of one ``[b, q, n * H]`` tensor, written
    inside the step graph (one small kernel there): the step's hand-over then copies them all at once
    (:meth:`~specdec.runner.ModelRunner.collect` finds them with :func:`~specdec.layout.adjacent_columns`) instead of
    slicing and joining them on the host every step."""
    if not aux or len(aux) < 2 or len({(a.shape, a.dtype) for a in aux}) != 1:
        return aux
    return list(torch.cat(aux, dim=-1).split(aux[0].shape[-1], dim=-1))


class HostArgmax:
    """The greedy tokens of one step-graph replay, read from the runner's pinned host copy of the
    graph's argmax (the rows ``wanted`` of it, request by request)."""

    __slots__ = ("runner", "replay", "wanted")

    def __init__(self, runner: GraphRunner, wanted: Any) -> None:
        self.runner, self.replay, self.wanted = runner, runner.replays, wanted

    def read(self) -> list[int] | None:
        """The argmax of each wanted row (waits for the copy), or None when later replays have
        overwritten its buffer (two of them: replays alternate between two; the caller then takes the
        argmax of the logits)."""
        runner = self.runner
        if runner.replays - self.replay > 1:
            return None
        k = (self.replay - 1) % 2
        if runner.events is not None:
            runner.events[k].synchronize()
        return runner._argmax_np[k][self.wanted].tolist()

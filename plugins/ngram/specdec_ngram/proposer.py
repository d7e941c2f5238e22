"""The ``ngram`` (CPU, Numba) and ``ngram_gpu`` (torch) proposers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

import specdec
from specdec.validation import MAX_TREE_NODES
from specdec_ngram.options import NgramGPUOptions, NgramOptions

if TYPE_CHECKING:
    from specdec import DraftBatch, Drafts, SpeculativeConfig

__all__ = ["NgramProposer", "NgramGPUProposer", "branches", "merge_branches"]


def _active_rows(batch: DraftBatch) -> np.ndarray:
    """Rows that get drafts: they sampled this step (not prefilling) and have room left."""
    size = batch.batch_size
    active = np.fromiter(map(bool, batch.sampled_token_ids), dtype=np.bool_, count=size)
    return active & (np.asarray(batch.num_tokens) < batch.max_model_len)


class NgramProposer(specdec.Proposer):
    """Prompt lookup on the CPU: draft what followed the earlier occurrence of the longest suffix
    n-gram (n in [prompt_lookup_min, prompt_lookup_max]). See :class:`NgramOptions` for the knobs;
    with the defaults it proposes exactly what vLLM's ``ngram`` method proposes.

    Construction compiles the Numba kernels (or loads them from Numba's on-disk cache).
    """

    method = "ngram"
    Options = NgramOptions
    per_request_state = True  # the token ids are the engine's; an incremental index is per request
    skippable = True  # the scan reads the whole history each call; the incremental index syncs every row to it
    # n-grams of 2..5 tokens in the benchmark: code repeats short identifiers, so allowing 2-grams finds
    # more of the copies than vLLM's default of 5..5. num_threads=1: below 2^20 batch tokens the scan is
    # single-threaded anyway, and asking for one thread also skips its parallel warm-up, whose OpenMP
    # workers otherwise spin against torch's threads on a small CPU (measured: the whole process,
    # baseline included, ran ~10x slower).
    bench_options = {"prompt_lookup_min": 2, "prompt_lookup_max": 5, "num_threads": 1}
    bench_default = frozenset({"quick", "full"})

    def __init__(self, config: SpeculativeConfig, target=None) -> None:
        super().__init__(config, target)
        from specdec_ngram import scan

        opts = self.options
        self.min_n, self.max_n = opts.prompt_lookup_min, opts.prompt_lookup_max
        self._index = None
        if opts.index == "incremental":
            from specdec_ngram import index

            index.warmup(self.min_n, self.max_n, opts.match)
            self._index = index.NgramIndex(self.min_n, self.max_n, opts.match)
        else:
            scan.warmup(opts.num_threads)
        self._scan = scan
        self.branches = opts.tree_branches
        nodes = self.branches * self.num_speculative_tokens
        if self.branches > 1 and nodes > MAX_TREE_NODES:
            raise ValueError(
                f"tree_branches={self.branches} with num_speculative_tokens={self.num_speculative_tokens} is "
                f"invalid: a tree of {nodes} nodes is past MAX_TREE_NODES={MAX_TREE_NODES} (the rule: "
                f"tree_branches * num_speculative_tokens <= {MAX_TREE_NODES}); lower either."
            )

    def max_tree_nodes(self) -> int:
        """With ``tree_branches`` >= 2, trees of up to ``tree_branches * k`` nodes; else 0 (chains)."""
        return self.branches * self.num_speculative_tokens if self.branches > 1 else 0

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        if self._index is not None:
            self._index.add(req_id, prompt_token_ids)

    def remove_request(self, req_id: str) -> None:
        if self._index is not None:
            self._index.remove(req_id)

    def propose(self, batch: DraftBatch) -> Drafts:
        chains = self._chains(batch)
        return chains if self.branches < 2 else self._trees(batch, chains)

    def _trees(self, batch: DraftBatch, chains: Drafts) -> Drafts:
        """Token trees: each request's chain, then the continuations of its other matches (:func:`branches`)."""
        k = batch.num_speculative_tokens
        ids, parents = [], []
        first = chains.token_ids.numpy()
        for i, n in enumerate(chains.num_draft_tokens):
            if not n:
                ids.append([])
                parents.append([])
                continue
            length = int(batch.num_tokens[i])
            room = min(k, batch.max_model_len - length)
            conts = branches(np.asarray(batch.token_ids[i, :length]), first[i, :n].tolist(), self.branches,
                             room, self.min_n, self.max_n)
            tree_ids, tree_parents = merge_branches(conts)
            ids.append(tree_ids)
            parents.append(tree_parents)
        return specdec.Drafts.from_lists(ids, self.branches * k, parents)

    def _chains(self, batch: DraftBatch) -> Drafts:
        k = batch.num_speculative_tokens
        opts = self.options
        if self._index is None and (opts.num_threads == 1 or np.size(batch.token_ids) < opts.parallel_threshold):
            fast = self._scan.scan_sampled(batch.token_ids, batch.num_tokens, batch.sampled_token_ids, self.min_n,
                                           self.max_n, k, batch.max_model_len, opts.match == "recent")
            if fast is not None:
                return specdec.Drafts(token_ids=torch.from_numpy(fast[0]), num_draft_tokens=fast[1].tolist())
        token_ids, num_tokens, active = self._scan.check_batch(batch.token_ids, batch.num_tokens,
                                                               _active_rows(batch))
        if self._index is not None:
            out, num = self._index.step(batch.req_ids, token_ids, num_tokens, active, k, batch.max_model_len)
        else:
            out, num = self._scan.scan_propose(
                token_ids, num_tokens, self.min_n, self.max_n, k, batch.max_model_len, active=active,
                match=opts.match, num_threads=opts.num_threads, parallel_threshold=opts.parallel_threshold,
                checked=True,
            )
        return specdec.Drafts(token_ids=torch.from_numpy(out), num_draft_tokens=num.tolist())


def branches(tokens: np.ndarray, chain: list[int], most: int, k: int, min_n: int, max_n: int) -> list[list[int]]:
    """Up to ``most`` distinct continuations (each at most ``k`` tokens) of the suffix n-grams of ``tokens``:
    ``chain`` (the chain's draft) first, then what followed the other earlier occurrences of the suffix n-gram,
    from n = ``max_n`` down to ``min_n`` and, within one n, the most recent occurrence first. A continuation
    stops at the end of ``tokens``; one equal to an earlier one, or a prefix of one, adds nothing."""
    out = [list(chain[:k])]
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # starts 0 .. length - 1 - n
        for p in np.flatnonzero((windows == tokens[length - n:]).all(1))[::-1]:
            cont = tokens[p + n: p + n + k].tolist()
            if not any(c[: len(cont)] == cont for c in out):
                out.append(cont)
                if len(out) == most:
                    return out
    return out


def merge_branches(conts: list[list[int]]) -> tuple[list[int], list[int]]:
    """The token tree (ids, parent indices: -1 the root) of ``conts``, merged where they share a prefix; nodes in
    the order they are first reached, so the first continuation is the first nodes, in order."""
    ids: list[int] = []
    parents: list[int] = []
    node: dict[tuple[int, int], int] = {}
    for cont in conts:
        at = -1
        for tok in cont:
            key = (at, tok)
            if key not in node:
                node[key] = len(ids)
                ids.append(tok)
                parents.append(at)
            at = node[key]
    return ids, parents


class NgramGPUProposer(specdec.Proposer):
    """The same lookup in torch for the whole batch on the target's device (``ngram_gpu``).

    Reads ``batch.token_ids_device`` when the engine provides it (no host round trip), else the
    numpy ids on the CPU. On CUDA the kernel runs under ``torch.compile`` (``compile="auto"``).
    Drafts stay on that device; the one host read per step is the per-request draft counts the
    ``Drafts`` contract asks for.
    """

    method = "ngram_gpu"
    Options = NgramGPUOptions
    per_request_state = True  # a compiled kernel stays warm between benchmark passes
    skippable = True  # it reads the whole history each call
    bench_options = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}  # as NgramProposer's
    bench_default = frozenset({"full"})  # a GPU method: not in the quick CPU run

    def __init__(self, config: SpeculativeConfig, target=None) -> None:
        super().__init__(config, target)
        opts = self.options
        self.min_n, self.max_n = opts.prompt_lookup_min, opts.prompt_lookup_max

    def _compile_on(self, device: torch.device) -> bool:
        mode = self.options.compile
        return mode == "always" or (mode == "auto" and device.type == "cuda")

    def propose(self, batch: DraftBatch) -> Drafts:
        from specdec_ngram.gpu import ngram_match_torch

        ids = batch.token_ids_device
        if ids is None:
            ids = torch.from_numpy(np.ascontiguousarray(batch.token_ids))
        num_tokens = torch.from_numpy(np.ascontiguousarray(batch.num_tokens, dtype=np.int64))
        active = torch.from_numpy(_active_rows(batch))
        drafts, num = ngram_match_torch(
            ids, num_tokens, self.min_n, self.max_n, batch.num_speculative_tokens, batch.max_model_len,
            active=active, match=self.options.match, compile=self._compile_on(ids.device),
        )
        return specdec.Drafts(token_ids=drafts, num_draft_tokens=num.tolist())

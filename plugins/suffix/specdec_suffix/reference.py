"""Checking suffix's drafts against arctic-inference's own: record what the engine asks of the proposer,
then replay it through a hand-driven ``SuffixDecodingCache``. Used by the tests and by
``benchmarks/suffix_deferral.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["record_events", "reference_drafts"]


def record_events(llm: Any) -> list[tuple]:
    """Wrap ``llm.proposer`` so every add_request, propose (each row's history and new tokens, and the
    drafts), observe (a step the speculation policy did not draft: each row's new tokens) and
    remove_request the engine makes is kept, in order, in the returned list (callers may
    append their own markers, e.g. ``("pass", n)``)."""
    proposer, events = llm.proposer, []
    add, remove, propose, observe = proposer.add_request, proposer.remove_request, proposer.propose, proposer.observe

    def recording_add(req_id, prompt_token_ids):
        events.append(("add", req_id, np.asarray(prompt_token_ids).tolist()))
        add(req_id, prompt_token_ids)

    def recording_remove(req_id):
        events.append(("remove", req_id))
        remove(req_id)

    def recording_propose(batch):
        drafts = propose(batch)
        rows = [(r, batch.token_ids[i, : batch.num_tokens[i]].tolist(), list(batch.sampled_token_ids[i]))
                for i, r in enumerate(batch.req_ids)]
        events.append(("propose", rows, batch.num_speculative_tokens, batch.max_model_len, drafts.to_lists()))
        return drafts

    def recording_observe(batch):
        events.append(("observe", [(r, list(batch.sampled_token_ids[i])) for i, r in enumerate(batch.req_ids)]))
        return observe(batch)

    proposer.add_request, proposer.remove_request = recording_add, recording_remove
    proposer.propose, proposer.observe = recording_propose, recording_observe
    return events


def reference_drafts(events: list[tuple], max_tree_depth: int = 24, max_cached_requests: int = 10000,
                     min_token_prob: float = 0.1) -> Iterator[tuple[Any, tuple, list[list[int]], list]]:
    """Replay recorded ``events`` through a fresh ``SuffixDecodingCache`` driven vLLM's way (each
    request's new tokens added, then its draft taken), with suffix's default options. Yields, per
    propose event, ``(marker, rows, drafts, expected)``: the last ``("pass", ...)``-style marker's
    value (None before any), the recorded rows and drafts, and for each row the reference's draft, or
    None where the reference takes none (nothing sampled yet, or no room left)."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    ref, marker = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests), None
    for event in events:
        if event[0] == "add":
            ref.start_request(event[1], event[2])
        elif event[0] == "remove":
            ref.stop_request(event[1])
        elif event[0] == "observe":
            for rid, sampled in event[1]:
                if sampled:
                    ref.add_active_response(rid, sampled)
        elif event[0] == "propose":
            _, rows, k, max_model_len, drafts = event
            expected = []
            for rid, history, sampled in rows:
                limit = min(k, max_model_len - len(history))
                if sampled:
                    ref.add_active_response(rid, sampled)
                expected.append(ref.speculate(rid, history[-max_tree_depth:], max_spec_tokens=limit,
                                              min_token_prob=min_token_prob).token_ids
                                if sampled and limit > 0 else None)
            yield marker, rows, drafts, expected
        else:
            marker = event[1]

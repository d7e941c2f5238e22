"""A stand-in for vLLM's persistent batch as its custom-class speculative hook sees it (no vLLM needed).

It follows vLLM 0.32's ``InputBatch``: a request joins the lowest free row (else row ``num_reqs``), its whole
prompt written and counted at once; a request leaving empties its row, then ``condense`` moves the last rows
down into the holes; ``swap`` reorders two rows (the attention backends' decode-first reordering). A prefill may
take several steps (chunked): the row then samples nothing. A decode step verifies the last drafts greedily
against a fixed toy target (the next token is a function of the last two) and appends the accepted drafts and
the bonus token, as vLLM does before calling ``propose``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimRequest:
    """One request: its true id, prompt, how many more prefill steps it needs and how many tokens it generates."""

    req_id: str
    prompt: list[int]
    max_tokens: int
    prefill_steps: int = 1
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)


class SimBatch:
    """vLLM's ``token_ids_cpu [max_num_seqs, max_model_len]`` / ``num_tokens_no_spec [max_num_seqs]`` (int32) and
    the ``sampled_token_ids`` of each step, for the requests it runs."""

    def __init__(self, max_num_seqs: int, max_model_len: int, vocab: int = 16, seed: int = 0) -> None:
        self.token_ids_cpu = np.zeros((max_num_seqs, max_model_len), np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_seqs, np.int32)
        self.rows: list[SimRequest | None] = []
        self.max_model_len = max_model_len
        self.vocab = vocab
        # The toy target: the next token after (a, b). A small table makes histories repeat, so drafts hit.
        self.table = np.random.default_rng(seed).integers(0, vocab, size=(vocab, vocab))

    @property
    def num_reqs(self) -> int:
        return len(self.rows)

    def next_token(self, history: np.ndarray) -> int:
        return int(self.table[history[-2], history[-1]]) if history.shape[0] >= 2 else int(history[-1])

    def add(self, req: SimRequest) -> int:
        """The request joins the lowest free row (vLLM reuses removed rows), else a new last row."""
        free = [i for i, r in enumerate(self.rows) if r is None]
        row = free[0] if free else len(self.rows)
        if row == len(self.rows):
            self.rows.append(None)
        self.rows[row] = req
        n = len(req.prompt)
        self.token_ids_cpu[row, :n] = req.prompt
        self.token_ids_cpu[row, n:] = -7  # stale tokens of whoever held the row before are overwritten by vLLM
        self.num_tokens_no_spec[row] = n
        return row

    def remove(self, req: SimRequest) -> None:
        """The request leaves; its row stays empty until :meth:`condense`."""
        self.rows[self.rows.index(req)] = None

    def condense(self) -> None:
        """vLLM's ``InputBatch.condense``: the last requests move down into the empty rows, lowest first."""
        while None in self.rows:
            hole = self.rows.index(None)
            last = max(i for i, r in enumerate(self.rows) if r is not None) if any(self.rows) else -1
            if last < hole:
                del self.rows[hole:]
                break
            n = int(self.num_tokens_no_spec[last])
            self.token_ids_cpu[hole, :n] = self.token_ids_cpu[last, :n]
            self.num_tokens_no_spec[hole] = n
            self.rows[hole], self.rows[last] = self.rows[last], None

    def swap(self, i: int, j: int) -> None:
        """vLLM's ``swap_states`` (the batch reordered, e.g. decodes before prefills)."""
        width = int(max(self.num_tokens_no_spec[i], self.num_tokens_no_spec[j]))
        tmp = self.token_ids_cpu[i, :width].copy()
        self.token_ids_cpu[i, :width] = self.token_ids_cpu[j, :width]
        self.token_ids_cpu[j, :width] = tmp
        self.num_tokens_no_spec[[i, j]] = self.num_tokens_no_spec[[j, i]]
        self.rows[i], self.rows[j] = self.rows[j], self.rows[i]

    def step(self) -> list[list[int]]:
        """One target step for every row: a prefill chunk (samples nothing until the last chunk, which samples the
        first token) or a greedy verification of the row's drafts. Returns ``sampled_token_ids``."""
        sampled = []
        for i, req in enumerate(self.rows):
            assert req is not None, "condense() before stepping"
            n = int(self.num_tokens_no_spec[i])
            if req.prefill_steps > 1:
                req.prefill_steps -= 1
                sampled.append([])
                continue
            req.prefill_steps = 0
            history = list(self.token_ids_cpu[i, :n])
            out = []
            for d in [*req.drafts, None]:  # accept drafts while they equal the target's token, then the bonus
                t = self.next_token(np.array(history))
                out.append(t)
                history.append(t)
                if d != t or len(req.output) + len(out) >= req.max_tokens or n + len(out) >= self.max_model_len:
                    break
            req.drafts = []
            self.token_ids_cpu[i, n: n + len(out)] = out
            self.num_tokens_no_spec[i] = n + len(out)
            req.output += out
            sampled.append(out)
        return sampled

    def finished(self) -> list[SimRequest]:
        return [r for r in self.rows if r is not None and (len(r.output) >= r.max_tokens or
                                                          self.num_tokens_no_spec[self.rows.index(r)]
                                                          >= self.max_model_len)]

"""A proposer that runs its own small model on the core's public runner (docs/runner.md).

Method ``small_lm``: a draft causal LM (config key ``model``) drafts k tokens greedily, one forward
per token for the whole batch. Each request owns a slot of the draft's KV cache; drafts the target
rejects are rolled back by moving the slot's length back, never copied. Register it with
``specdec.register_plugin`` (as tests/core/test_runner_example.py does) or from a plugin's
``specdec_register_proposers`` hook.
"""

from __future__ import annotations

import numpy as np
import torch

from specdec import DraftBatch, Drafts, ModelRunner, Proposer, SpeculativeConfig


class SmallLMProposer(Proposer):
    method = "small_lm"

    def __init__(self, config: SpeculativeConfig, target=None) -> None:
        super().__init__(config, target)
        self.draft = ModelRunner(config.model, dtype=target.dtype, device=target.device,
                                 max_model_len=target.max_model_len)
        self.draft.allocate(len(target.lengths))  # one slot per target slot
        self.free = list(range(len(target.lengths)))
        self.slot: dict[str, int] = {}

    def add_request(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        self.slot[req_id] = self.free.pop()
        self.draft.reset_slot(self.slot[req_id])

    def remove_request(self, req_id: str) -> None:
        self.free.append(self.slot.pop(req_id))

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        k, d = batch.num_speculative_tokens, self.draft
        slots = [self.slot[r] for r in batch.req_ids]
        # Catch up on every token the draft has not committed (the prompt, then accepted drafts + bonus).
        inputs = [batch.token_ids[i, d.lengths[s]: n].tolist() for i, (s, n) in enumerate(zip(slots, batch.num_tokens))]
        # No drafts for a request still prefilling (nothing sampled yet) or at the end of its context.
        budget = [min(k, batch.max_model_len - int(n)) if batch.sampled_token_ids[i] else 0
                  for i, n in enumerate(batch.num_tokens)]
        drafts: list[list[int]] = [[] for _ in slots]
        for _ in range(k):
            live = [i for i in range(len(slots)) if len(drafts[i]) < budget[i]]
            if not live:
                break
            out = d.forward([slots[i] for i in live], [inputs[i] for i in live], [1] * len(live))
            for i, token in zip(live, out.greedy_token_ids()):
                d.advance(slots[i], len(inputs[i]))  # commit what was just run...
                drafts[i].append(token)
                inputs[i] = [token]
        for i, s in enumerate(slots):  # ...and roll the drafts' own KV back: next step re-runs what was accepted
            d.advance(s, -(len(drafts[i]) - 1) if drafts[i] else 0)
        return Drafts.from_lists(drafts)

"""Method ``medusa``: k drafts from one batched pass of Medusa heads over each request's last hidden state.

When a request holds ``n`` tokens, its last token (the bonus) has not been through the target yet; the target's
final hidden state at position ``n - 2`` (``DraftBatch.last_hidden_indices``, from the verify forward the engine
ran anyway) is what predicted it. Head ``i`` at that position guesses the token at ``n + i``: draft ``i + 1``. No
target forward and no per-request state: every draft of a step comes from that one hidden state per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdec import DraftBatch, Drafts, HiddenStateRequest, Proposer, SpeculativeConfig
from specdec.draft_sampling import check_draft_sample_method, draft_temperatures, sample_at_temperatures
from specdec.keyed import keyed_draft_noise
from specdec.models import bundled_default
from specdec_medusa.loader import load_medusa

__all__ = ["MedusaOptions", "MedusaProposer"]



@dataclass(frozen=True)
class MedusaOptions:
    """Options of method ``medusa`` (the head directory is the core key ``model``).

    Attributes:
        draft_sample_method: ``"probabilistic"`` (default): requests with temperature > 0 sample draft ``i`` from
            head ``i``'s softmax at the request's temperature and hand those distributions (over the target
            vocabulary) to the rejection sampler; greedy requests draft the argmax either way. ``"greedy"``:
            argmax drafts for every request, verified as one-hot.
    """

    draft_sample_method: str = "probabilistic"

    def __post_init__(self) -> None:
        check_draft_sample_method(self.draft_sample_method)


class MedusaProposer(Proposer):
    """Method ``medusa``: Medusa heads (FasterDecoding or vLLM layout) over the target's last hidden state."""

    method = "medusa"
    Options = MedusaOptions
    per_request_state = True  # it keeps nothing per request at all
    skippable = True  # it reads only the last hidden state, which every step hands over

    def __init__(self, config: SpeculativeConfig, target: Any = None) -> None:
        super().__init__(config, target)
        if target is None:
            raise ValueError("method 'medusa' drafts from the target's hidden states: it needs the target.")
        model = config.model or bundled_default(target, "tiny-medusa")
        if not model:
            raise ValueError("method 'medusa' needs model= a local directory holding Medusa heads (config.json + "
                             "medusa_lm_head.safetensors, or the vLLM layout); only the bundled 'tiny' target has a "
                             "default, 'tiny-medusa'.")
        loaded = load_medusa(str(model), int(target.config.hidden_size), int(target.vocab_size))
        n, k = loaded.heads.cfg.num_heads, self.num_speculative_tokens
        if k > n:
            raise ValueError(f"num_speculative_tokens={k} is more than the {n} Medusa heads of {str(model)!r}: head i "
                             f"drafts the token i + 2 ahead, so method 'medusa' drafts at most {n} tokens a step; set "
                             f"num_speculative_tokens <= {n} (or train more heads: --option num_heads=...).")
        self.layout = loaded.layout
        self.heads = loaded.heads.to(device=target.device, dtype=target.dtype).eval()
        self.device, self.vocab_size = target.device, int(target.vocab_size)
        self.probabilistic = self.options.draft_sample_method == "probabilistic"

    def hidden_states_needed(self) -> HiddenStateRequest:
        return HiddenStateRequest(last_layer=True)

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        k, b = batch.num_speculative_tokens, batch.batch_size
        if b == 0 or batch.hidden_states is None:
            return Drafts.empty(b)
        budget = [max(0, min(k, batch.max_model_len - int(n))) if s else 0
                  for n, s in zip(batch.num_tokens.tolist(), batch.sampled_token_ids)]
        if not any(budget):
            return Drafts.empty(b)
        h = batch.hidden_states[batch.last_hidden_indices.to(self.device)]  # [B, H]
        logits = self.heads(h, k)  # [k, B, Vd]
        temps = draft_temperatures(batch, self.device, self.probabilistic)
        if temps is None:
            ids, probs = self.heads.to_target(logits.argmax(-1)).T, None  # [B, k], on the device
        else:
            vocab = self.heads.token_map if self.heads.token_map is not None else logits.shape[-1]
            keyed = keyed_draft_noise(batch.sampling_params, batch.num_tokens, k, vocab, self.device)
            ids, probs = self._sample(logits.float().transpose(0, 1), temps, keyed)
        return Drafts.within_budget(ids, budget, probs)


    def _sample(self, logits: torch.Tensor, temps: torch.Tensor,
                keyed: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts ``[B, k]`` (target ids) and their distributions ``[B, k, V]`` over the target vocabulary (zero
        outside a truncated head vocabulary) from float32 logits ``[B, k, Vd]``: sampled at each request's
        temperature, the argmax where it is 0 (the sampler compares greedy requests with the target's argmax)."""
        b, k, vd = logits.shape
        draft, q = sample_at_temperatures(logits, temps, keyed)  # [B, k], [B, k, Vd]
        if self.heads.token_map is None and vd == self.vocab_size:
            return draft, q
        full = q.new_zeros(b, k, self.vocab_size).index_copy_(-1, self.heads.token_map, q)
        return self.heads.to_target(draft), full

"""Method ``medusa``: k drafts from one batched pass of Medusa heads over each request's last hidden state.

When a request holds ``n`` tokens, its last token (the bonus) has not been through the target yet; the target's
final hidden state at position ``n - 2`` (``DraftBatch.last_hidden_indices``, from the verify forward the engine
ran anyway) is what predicted it. Head ``i`` at that position guesses the token at ``n + i``: draft ``i + 1``. No
target forward and no per-request state: every draft of a step comes from that one hidden state per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specdec import DraftBatch, Drafts, HiddenStateRequest, Proposer, SpeculativeConfig
from specdec.draft_sampling import (
    check_draft_sample_method,
    draft_probs_needed,
    draft_temperatures,
    sample_at_temperatures,
)
from specdec.keyed import DraftKeys, keyed_draft_keys
from specdec.models import bundled_default
from specdec.validation import MAX_TREE_NODES
from specdec_medusa.graph import CapturedMedusaHeads, check_tree_ranks, tree_indices
from specdec_medusa.loader import load_medusa

__all__ = ["MedusaOptions", "MedusaProposer", "DEFAULT_TREE_CHOICES", "tree_from_choices"]



@dataclass(frozen=True)
class MedusaOptions:
    """Options of method ``medusa`` (the head directory is the core key ``model``).

    Attributes:
        draft_sample_method: ``"probabilistic"`` (default): requests with temperature > 0 sample draft ``i`` from
            head ``i``'s softmax at the request's temperature and hand those distributions (over the target
            vocabulary) to the rejection sampler; greedy requests draft the argmax either way. ``"greedy"``:
            argmax drafts for every request, verified as one-hot.
        tree_choices: None (default): a chain of the heads' best tokens. ``"default"``
            (:data:`DEFAULT_TREE_CHOICES`) or a list of rank paths (``[0, 1]``: head 1's second-best token under
            head 0's best): a static token tree per request, verified whole in greedy steps (issue 25; in steps
            with sampled requests medusa drafts the chain, with its draft probabilities). Depth at most k.
        draft_cuda_graphs: on CUDA, greedy chain steps run the heads in a CUDA graph per batch bucket
            (:class:`specdec_medusa.graph.CapturedMedusaHeads`: one replay instead of ~10 launches, ~0.27 ms less
            host time a step on the H200); False runs them eagerly. Drafts are the same either way.
    """

    draft_sample_method: str = "probabilistic"
    tree_choices: Any = None
    draft_cuda_graphs: bool = True

    def __post_init__(self) -> None:
        check_draft_sample_method(self.draft_sample_method)
        if not isinstance(self.draft_cuda_graphs, bool):
            raise TypeError(f"draft_cuda_graphs={self.draft_cuda_graphs!r} is invalid: it must be True or False.")
        if self.tree_choices is not None:
            object.__setattr__(self, "tree_choices", tree_from_choices(self.tree_choices))


# A small static tree (Medusa's choices: a path of top-k ranks, one per head): the three best first tokens, the
# three best second tokens under the best first, the best under the second, and deeper along the best path.
DEFAULT_TREE_CHOICES = ((0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0))


def tree_from_choices(choices: Any) -> tuple[tuple[int, ...], ...]:
    """Medusa tree choices (``"default"``: :data:`DEFAULT_TREE_CHOICES`), checked and ordered so every node
    comes after its parent (shorter paths first). A choice is a non-empty sequence of ranks (0: a head's best
    token); its parent, the choice without its last rank, must be a choice too."""
    if choices == "default":
        choices = DEFAULT_TREE_CHOICES
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices:
        raise ValueError(f"tree_choices={choices!r} is invalid: pass 'default' or a list of rank paths such as "
                         "[[0], [1], [0, 0]].")
    out = []
    for c in choices:
        if (not isinstance(c, (list, tuple)) or not c
                or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in c)):
            raise ValueError(f"tree_choices entry {c!r} is invalid: each is a non-empty list of ranks >= 0.")
        out.append(tuple(c))
    if len(set(out)) != len(out):
        raise ValueError("tree_choices has a repeated entry: each path once.")
    missing = [c for c in out if len(c) > 1 and c[:-1] not in set(out)]
    if missing:
        raise ValueError(f"tree_choices entry {list(missing[0])} has no parent {list(missing[0][:-1])} in the list: "
                         "add every prefix of a path.")
    return tuple(sorted(out, key=lambda c: (len(c), c)))


def _check_tree_fits(choices: tuple[tuple[int, ...], ...], cfg: Any, k: int) -> None:
    """Refuse, when the proposer is built, tree choices these heads cannot draft: a rank past a head's vocabulary,
    or more nodes within depth ``k`` than a verified tree may hold (:data:`specdec.validation.MAX_TREE_NODES`)."""
    check_tree_ranks(choices, cfg)
    nodes = sum(1 for c in choices if len(c) <= k)
    if nodes > MAX_TREE_NODES:
        raise ValueError(f"tree_choices has {nodes} paths within depth num_speculative_tokens={k}: a token tree holds "
                         f"at most MAX_TREE_NODES={MAX_TREE_NODES} nodes; pass fewer paths (the default tree has "
                         f"{len(DEFAULT_TREE_CHOICES)}).")


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
        if self.options.tree_choices is not None:
            _check_tree_fits(self.options.tree_choices, loaded.heads.cfg, k)
        self.layout = loaded.layout
        self.heads = loaded.heads.to(device=target.device, dtype=target.dtype).eval()
        self.device, self.vocab_size = target.device, int(target.vocab_size)
        self.probabilistic = self.options.draft_sample_method == "probabilistic"
        self.tree = self.options.tree_choices  # None: chains
        self.graph = None  # greedy drafting in CUDA graphs (CapturedMedusaHeads), or eagerly where a test asks
        eager = self._eager_graph
        self._trees: dict[int, tuple] = {}  # k -> the tree within depth k (_tree_within)
        if eager or self.options.draft_cuda_graphs and self.device.type == "cuda":
            self.graph = CapturedMedusaHeads.build(self.heads, k, max(1, len(getattr(target, "lengths", ()))),
                                                   self.device, target.dtype, use_graphs=not eager,
                                                   tree=None if self.tree is None else tuple(self._tree_within(k)[0]))

    _eager_graph: ClassVar[bool] = False  # tests: run the captured step's function eagerly (on the CPU too)

    def hidden_states_needed(self) -> HiddenStateRequest:
        return HiddenStateRequest(last_layer=True, all_positions=False)  # the heads read the last position alone

    def max_tree_nodes(self) -> int:
        """The static tree's nodes within depth k (``tree_choices``), 0 for chains: the engine captures tree
        graphs of that size on CUDA."""
        if self.tree is None:
            return 0
        return sum(1 for c in self.tree if len(c) <= self.num_speculative_tokens)

    @torch.inference_mode()
    def propose(self, batch: DraftBatch) -> Drafts:
        k, b = batch.num_speculative_tokens, batch.batch_size
        if b == 0 or batch.hidden_states is None:
            return Drafts.empty(b)
        budget = [max(0, min(k, batch.max_model_len - int(n))) if s else 0
                  for n, s in zip(batch.num_tokens.tolist(), batch.sampled_token_ids)]
        if not any(budget):
            return Drafts.empty(b)
        temps = draft_temperatures(batch, self.device, self.probabilistic)
        if temps is None and self.graph is not None and k == self.graph.k:
            last = batch.hidden_offsets()[1]
            ids = self.graph.run(batch.hidden_states, last)
            if ids is not None and self.tree is not None:
                return self._tree_drafts(ids, k, budget)
            if ids is not None:
                return Drafts.within_budget(ids, budget)
        h = batch.hidden_states[batch.last_hidden_indices.to(self.device)]  # [B, H]
        logits = self.heads(h, k)  # [k, B, Vd]
        if temps is None and self.tree is not None:
            return self._tree(logits, budget)
        if temps is None:
            ids, probs = self.heads.to_target(logits.argmax(-1)).T, None  # [B, k], on the device
        else:
            vocab = self.heads.token_map if self.heads.token_map is not None else logits.shape[-1]
            keyed = keyed_draft_keys(batch.sampling_params, batch.num_tokens, vocab, self.vocab_size)
            ids, probs = self._sample(logits.float().transpose(0, 1), temps, keyed, draft_probs_needed(batch))
        return Drafts.within_budget(ids, budget, probs)


    def _tree(self, logits: torch.Tensor, budget: list[int]) -> Drafts:
        """The static tree of :attr:`tree` over ``logits [k, B, Vd]``: node ``c`` is head ``len(c) - 1``'s
        token of rank ``c[-1]`` (every head reads the same hidden state, so a node's token depends on its depth
        and rank only); nodes deeper than k are left out."""
        k = logits.shape[0]
        choices, _, heads, ranks = self._tree_within(k)
        top = logits.topk(min(1 + max(c[-1] for c in choices), logits.shape[-1]), dim=-1).indices  # [k, B, r]
        return self._tree_drafts(self.heads.to_target(top[heads, :, ranks]).T, k, budget)  # [B, N]

    def _tree_within(self, k: int) -> tuple[list[tuple[int, ...]], torch.Tensor, torch.Tensor, torch.Tensor]:
        """The choices of :attr:`tree` within depth ``k``, and on the device (made once per k) each one's parent
        among them (-1: the root), head (``len(c) - 1``) and rank (``c[-1]``)."""
        if k not in self._trees:
            choices = [c for c in self.tree if len(c) <= k]
            self._trees[k] = choices, *tree_indices(choices, self.device)
        return self._trees[k]

    def _tree_drafts(self, ids: torch.Tensor, k: int, budget: list[int]) -> Drafts:
        """The nodes ``ids [B, N]`` (target ids) of the tree within depth ``k`` as drafts: whole trees for requests
        with room to draft."""
        choices, parents, _, _ = self._tree_within(k)
        return Drafts(ids, [len(choices) if n else 0 for n in budget], parents=parents.expand(ids.shape[0], -1))

    def _sample(self, logits: torch.Tensor, temps: torch.Tensor, keyed: DraftKeys | None = None,
                probs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts ``[B, k]`` (target ids) and their distributions ``[B, k, V]`` over the target vocabulary (zero
        outside a truncated head vocabulary) from float32 logits ``[B, k, Vd]``: sampled at each request's
        temperature, the argmax where it is 0 (the sampler compares greedy requests with the target's argmax).
        ``probs=False``: no distributions (None), for a batch whose verifier reads none."""
        b, k, vd = logits.shape
        draft, q = sample_at_temperatures(logits, temps, keyed, probs)  # [B, k], [B, k, Vd]
        if self.heads.token_map is None and vd == self.vocab_size:
            return draft, q
        if q is None:
            return self.heads.to_target(draft), None
        full = q.new_zeros(b, k, self.vocab_size).index_copy_(-1, self.heads.token_map, q)
        return self.heads.to_target(draft), full

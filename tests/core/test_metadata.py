"""Tests for SpecDecodeMetadata (the logits layout, docs/design.md section 3) and the proposer-side
objects of section 4: Drafts, DraftBatch and the Proposer defaults."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import specdec
from specdec import DraftBatch, Drafts, HiddenStateRequest, Proposer, SpecDecodeMetadata

INDEX_FIELDS = ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
                "bonus_logits_indices", "logits_indices")


def _assert_tensor(actual: torch.Tensor, expected: list[int], dtype: torch.dtype, name: str) -> None:
    assert actual.dtype == dtype, f"{name}: dtype {actual.dtype}, expected {dtype}"
    assert actual.device.type == "cpu", name
    assert actual.tolist() == expected, f"{name}: {actual.tolist()} != {expected}"


# --- SpecDecodeMetadata.from_draft_token_ids ------------------------------------------------------


def test_from_draft_token_ids_mixed_lengths():
    # rows: req0 = [0, 1, 2 | bonus 3], req1 = [bonus 4], req2 = [5, 6 | bonus 7]
    md = SpecDecodeMetadata.from_draft_token_ids([[5, 6, 7], [], [8, 9]], device="cpu")
    assert md.num_draft_tokens == [3, 0, 2]
    assert md.max_spec_len == 3
    assert md.batch_size == 3
    _assert_tensor(md.draft_token_ids, [5, 6, 7, 8, 9], torch.int64, "draft_token_ids")
    _assert_tensor(md.cu_num_draft_tokens, [3, 3, 5], torch.int32, "cu_num_draft_tokens")
    _assert_tensor(md.cu_num_sampled_tokens, [4, 5, 8], torch.int32, "cu_num_sampled_tokens")
    _assert_tensor(md.target_logits_indices, [0, 1, 2, 5, 6], torch.int64, "target_logits_indices")
    _assert_tensor(md.bonus_logits_indices, [3, 4, 7], torch.int64, "bonus_logits_indices")
    _assert_tensor(md.logits_indices, list(range(8)), torch.int64, "logits_indices")


def test_from_draft_token_ids_all_empty():
    md = SpecDecodeMetadata.from_draft_token_ids([[], [], []])
    assert md.num_draft_tokens == [0, 0, 0]
    assert md.max_spec_len == 0
    _assert_tensor(md.draft_token_ids, [], torch.int64, "draft_token_ids")
    _assert_tensor(md.cu_num_draft_tokens, [0, 0, 0], torch.int32, "cu_num_draft_tokens")
    _assert_tensor(md.cu_num_sampled_tokens, [1, 2, 3], torch.int32, "cu_num_sampled_tokens")
    _assert_tensor(md.target_logits_indices, [], torch.int64, "target_logits_indices")
    _assert_tensor(md.bonus_logits_indices, [0, 1, 2], torch.int64, "bonus_logits_indices")
    _assert_tensor(md.logits_indices, [0, 1, 2], torch.int64, "logits_indices")


def test_from_draft_token_ids_empty_batch():
    md = SpecDecodeMetadata.from_draft_token_ids([])
    assert md.num_draft_tokens == [] and md.max_spec_len == 0 and md.batch_size == 0
    for name in INDEX_FIELDS:
        assert getattr(md, name).shape == (0,), name


def test_from_draft_token_ids_single_request():
    md = SpecDecodeMetadata.from_draft_token_ids([[11, 12]])
    _assert_tensor(md.target_logits_indices, [0, 1], torch.int64, "target_logits_indices")
    _assert_tensor(md.bonus_logits_indices, [2], torch.int64, "bonus_logits_indices")
    _assert_tensor(md.logits_indices, [0, 1, 2], torch.int64, "logits_indices")


@pytest.mark.parametrize("drafts", [[[5, 6, 7], [], [8, 9]], [[1], [2, 3, 4, 5], [], [6]], [[], []]])
def test_layout_invariants(drafts):
    """Each draft is verified by the row just before its bonus; the bonus follows its last draft."""
    md = SpecDecodeMetadata.from_draft_token_ids(drafts)
    n, b = sum(map(len, drafts)), len(drafts)
    assert md.logits_indices.shape == (n + b,)
    assert sorted(md.target_logits_indices.tolist() + md.bonus_logits_indices.tolist()) == list(range(n + b))
    ends = md.cu_num_draft_tokens.long()
    assert torch.equal(md.bonus_logits_indices, md.cu_num_sampled_tokens.long() - 1)
    assert torch.equal(ends + torch.arange(b), md.bonus_logits_indices)


@pytest.mark.parametrize("drafts", [[[5, 6, 7], [], [8, 9]], [[], [], []], [[1, 2, 3, 4]], []])
def test_make_dummy_shapes_equal_real_shapes(drafts):
    real = SpecDecodeMetadata.from_draft_token_ids(drafts)
    dummy = SpecDecodeMetadata.make_dummy(drafts)
    assert dummy.num_draft_tokens == real.num_draft_tokens
    assert dummy.max_spec_len == real.max_spec_len
    for name in INDEX_FIELDS:
        r, d = getattr(real, name), getattr(dummy, name)
        assert (d.shape, d.dtype, d.device) == (r.shape, r.dtype, r.device), name
    # the placeholder index buffers are all zeros: safe to read before real metadata is copied in
    for name in ("target_logits_indices", "bonus_logits_indices", "logits_indices"):
        assert not getattr(dummy, name).any(), name
    # a captured buffer can take the real values in place
    for name in INDEX_FIELDS:
        getattr(dummy, name).copy_(getattr(real, name))


def test_metadata_is_a_dataclass_with_derived_max_spec_len():
    md = SpecDecodeMetadata.from_draft_token_ids([[1, 2], [3]])
    assert "max_spec_len" not in {f.name for f in dataclasses.fields(SpecDecodeMetadata) if f.init}
    assert dataclasses.replace(md, num_draft_tokens=[2, 1]).max_spec_len == 2


# --- Drafts ---------------------------------------------------------------------------------------


def test_drafts_from_lists_pads_with_minus_one():
    drafts = Drafts.from_lists([[4, 5, 6], [], [7]])
    assert drafts.token_ids.dtype == torch.int64
    assert drafts.token_ids.tolist() == [[4, 5, 6], [-1, -1, -1], [7, -1, -1]]
    assert drafts.num_draft_tokens == [3, 0, 1]
    assert drafts.probs is None
    assert drafts.to_lists() == [[4, 5, 6], [], [7]]


def test_drafts_from_lists_with_k_pads_and_truncates():
    drafts = Drafts.from_lists([[1, 2, 3, 4, 5], [6], []], k=3)
    assert drafts.token_ids.tolist() == [[1, 2, 3], [6, -1, -1], [-1, -1, -1]]
    assert drafts.num_draft_tokens == [3, 1, 0]
    assert drafts.to_lists() == [[1, 2, 3], [6], []]


def test_drafts_from_lists_accepts_numpy_rows_and_k_zero():
    drafts = Drafts.from_lists([np.array([9, 8], dtype=np.int32), np.array([], dtype=np.int64)])
    assert drafts.token_ids.dtype == torch.int64
    assert drafts.to_lists() == [[9, 8], []]
    none_row = Drafts.from_lists([None, [3, 4, 5]])  # a row with nothing drafted may be None
    assert none_row.token_ids.tolist() == [[-1, -1, -1], [3, 4, 5]] and none_row.num_draft_tokens == [0, 3]
    zero = Drafts.from_lists([[1, 2], []], k=0)
    assert zero.token_ids.shape == (2, 0)
    assert zero.num_draft_tokens == [0, 0]
    assert zero.to_lists() == [[], []]


@pytest.mark.parametrize("lists", [[[1, 2], [3]], [[], []], [[7]], []])
def test_drafts_round_trip(lists):
    drafts = Drafts.from_lists(lists)
    assert drafts.token_ids.shape == (len(lists), max(map(len, lists), default=0))
    assert drafts.to_lists() == lists
    assert Drafts.from_lists(drafts.to_lists()).token_ids.tolist() == drafts.token_ids.tolist()


@pytest.mark.parametrize("batch_size", [0, 1, 3])
def test_drafts_empty(batch_size):
    drafts = Drafts.empty(batch_size)
    assert drafts.token_ids.shape == (batch_size, 0)
    assert drafts.token_ids.dtype == torch.int64
    assert drafts.num_draft_tokens == [0] * batch_size
    assert drafts.probs is None
    assert drafts.to_lists() == [[]] * batch_size


def test_drafts_within_budget_masks_past_each_requests_budget():
    ids = torch.arange(12).view(3, 4)
    d = Drafts.within_budget(ids, [4, 1, 0])
    assert d.token_ids.tolist() == [[0, 1, 2, 3], [4, -1, -1, -1], [-1, -1, -1, -1]]
    assert d.num_draft_tokens == [4, 1, 0] and d.probs is None and d.to_lists() == [[0, 1, 2, 3], [4], []]
    full = Drafts.within_budget(ids, [4, 4, 4], probs=torch.ones(3, 4, 2))
    assert full.token_ids is ids and full.probs.shape == (3, 4, 2)  # nothing to mask: the same tensor


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_drafts_within_budget_on_cuda():
    ids = torch.arange(8, device="cuda").view(2, 4)
    d = Drafts.within_budget(ids, [2, 3])
    assert d.token_ids.device.type == "cuda" and d.token_ids.tolist() == [[0, 1, -1, -1], [4, 5, 6, -1]]


def test_drafts_feed_metadata():
    drafts = Drafts.from_lists([[5, 6, 7], [], [8, 9]], k=3)
    md = SpecDecodeMetadata.from_draft_token_ids(drafts.to_lists())
    assert md.draft_token_ids.tolist() == [5, 6, 7, 8, 9]


# --- DraftBatch -----------------------------------------------------------------------------------


def _batch(**extra) -> DraftBatch:
    return DraftBatch(
        req_ids=["a", "b"],
        token_ids=np.array([[1, 2, 3], [4, 5, 0]], dtype=np.int32),
        num_tokens=np.array([3, 2]),
        sampled_token_ids=[[3], []],
        num_speculative_tokens=4,
        max_model_len=64,
        **extra,
    )


def test_draft_batch_by_keyword_optional_fields_default_to_none():
    batch = _batch()
    assert batch.batch_size == 2
    assert batch.req_ids == ["a", "b"]
    assert batch.num_speculative_tokens == 4 and batch.max_model_len == 64
    optional = ("token_ids_device", "hidden_states", "aux_hidden_states", "query_start_loc", "last_hidden_indices",
                "sampling_params", "query_start_loc_cpu", "last_hidden_indices_cpu")
    for name in optional:
        assert getattr(batch, name) is None, name
    defaults = {f.name for f in dataclasses.fields(DraftBatch) if f.default is None}
    assert defaults == set(optional)


def test_draft_batch_takes_hidden_states():
    hidden = torch.zeros(5, 8)
    batch = _batch(hidden_states=hidden, aux_hidden_states=[hidden], query_start_loc=torch.tensor([0, 3, 5]),
                   last_hidden_indices=torch.tensor([2, 4]))
    assert batch.hidden_states is hidden
    assert batch.query_start_loc.tolist() == [0, 3, 5]


# --- Proposer defaults ----------------------------------------------------------------------------


class MinimalProposer(Proposer):
    """A minimal plugin: one class with ``method`` and ``propose``."""

    method = "minimal_meta"

    def propose(self, batch):
        return Drafts.from_lists([[7]] * batch.batch_size, k=batch.num_speculative_tokens)


def test_proposer_only_propose_is_abstract():
    assert Proposer.__abstractmethods__ == frozenset({"propose"})
    with pytest.raises(TypeError):
        Proposer(None)  # type: ignore[abstract]


def test_minimal_proposer_defaults(register_proposer):
    register_proposer(MinimalProposer)
    config = specdec.SpeculativeConfig(method="minimal_meta", num_speculative_tokens=2)
    proposer = specdec.create_proposer(config)
    assert isinstance(proposer, MinimalProposer)
    assert MinimalProposer.Options is specdec.NoOptions
    assert proposer.options == specdec.NoOptions()
    assert proposer.config is config and proposer.target is None
    assert proposer.num_speculative_tokens == 2
    assert MinimalProposer.default_num_speculative_tokens(proposer.options) is None
    assert proposer.hidden_states_needed() is None
    assert proposer.add_request("r0", np.array([1, 2, 3], dtype=np.int32)) is None
    assert proposer.remove_request("r0") is None
    assert proposer.remove_request("never-added") is None
    drafts = proposer.propose(_batch())
    assert drafts.to_lists() == [[7], [7]]


def test_hidden_state_request_defaults():
    request = HiddenStateRequest()
    assert request.last_layer is True and request.aux_layer_ids == ()
    assert HiddenStateRequest(last_layer=False, aux_layer_ids=(2, 5)).aux_layer_ids == (2, 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.last_layer = False  # type: ignore[misc]


def test_hidden_offsets_read_the_host_copies_when_present():
    """``DraftBatch.hidden_offsets``: the host copies the engine sets (no read of the device tensors), else the
    tensors' values."""
    batch = _batch(query_start_loc=torch.tensor([0, 3, 5]), last_hidden_indices=torch.tensor([2, 4]))
    assert batch.hidden_offsets() == ([0, 3, 5], [2, 4])
    batch.query_start_loc_cpu, batch.last_hidden_indices_cpu = np.array([0, 1, 2]), np.array([0, 1])
    assert batch.hidden_offsets() == ([0, 1, 2], [0, 1])  # the host copies win (here they differ on purpose)

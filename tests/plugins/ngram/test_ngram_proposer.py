"""The ngram / ngram_gpu proposers through specdec's plugin surface: discovery, options, propose()."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import numpy as np
import pytest
import torch

import specdec
from specdec import DraftBatch, Drafts, SpeculativeConfig
from specdec_ngram import NgramGPUProposer, NgramProposer
from specdec_ngram.naive import ngram_propose_ref

CONFIGS = {
    "scan": {"method": "ngram"},
    "scan-threads": {"method": "ngram", "num_threads": 2, "parallel_threshold": 0},
    "incremental": {"method": "ngram", "index": "incremental"},
    "gpu": {"method": "ngram_gpu"},
}


def test_plugin_is_discoverable_once_installed():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="specdec")}
    assert eps.get("ngram") == "specdec_ngram"
    methods = specdec.available_methods()
    for name, cls in (("ngram", NgramProposer), ("ngram_gpu", NgramGPUProposer)):
        info = methods[name]
        assert info.status == "ok" and info.proposer_class is cls
        assert info.distribution == "specdec-plugin-ngram" and info.version == specdec.__version__
        assert specdec.get_proposer_class(name) is cls


def test_import_is_light():
    code = "import sys, specdec_ngram; print('numba' in sys.modules, 'specdec_ngram.scan' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], "importing the plugin must not import numba"


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu"])
@pytest.mark.parametrize(
    "given, expected",
    [({}, (5, 5)), ({"prompt_lookup_max": 4}, (4, 4)), ({"prompt_lookup_min": 2}, (2, 2)),
     ({"prompt_lookup_min": 1, "prompt_lookup_max": 3}, (1, 3))],
)
def test_prompt_lookup_defaults_follow_vllm(method, given, expected):
    config = SpeculativeConfig(method=method, num_speculative_tokens=3, **given)
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == expected
    assert SpeculativeConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "method, key, value, rule",
    [
        ("ngram", "prompt_lookup_min", 0, ">= 1"),
        ("ngram", "prompt_lookup_max", -2, ">= 1"),
        ("ngram", "prompt_lookup_max", "4", "int >= 1"),
        ("ngram", "prompt_lookup_min", True, "int >= 1"),
        ("ngram", "index", "trie", "'scan', 'incremental'"),
        ("ngram", "match", "latest", "'leftmost', 'recent'"),
        ("ngram", "num_threads", 0, "int >= 1"),
        ("ngram", "parallel_threshold", -1, "int >= 0"),
        ("ngram_gpu", "prompt_lookup_min", 0, ">= 1"),
        ("ngram_gpu", "match", "first", "'leftmost', 'recent'"),
        ("ngram_gpu", "compile", "yes", "'auto', 'always', 'never'"),
    ],
)
def test_every_option_is_validated(method, key, value, rule):
    with pytest.raises(ValueError) as err:
        SpeculativeConfig(method=method, num_speculative_tokens=3, **{key: value})
    msg = str(err.value)
    assert f"{key}={value!r}" in msg and rule in msg


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu"])
def test_min_above_max_is_rejected(method):
    rule = "prompt_lookup_min=4 and prompt_lookup_max=2.*min <= prompt_lookup_max"
    with pytest.raises(ValueError, match=rule):
        SpeculativeConfig(method=method, num_speculative_tokens=3, prompt_lookup_min=4, prompt_lookup_max=2)


def test_gpu_method_has_no_index_option():
    with pytest.raises(ValueError, match=r"Unknown option\(s\) \['index'\].*prompt_lookup_min"):
        SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=3, index="incremental")


def _batch(ids, num, sampled, k, max_model_len, **extra) -> DraftBatch:
    return DraftBatch(req_ids=[f"r{i}" for i in range(len(num))], token_ids=ids, num_tokens=np.asarray(num),
                      sampled_token_ids=sampled, num_speculative_tokens=k, max_model_len=max_model_len,
                      **extra)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_propose_skips_prefilling_and_full_rows_and_cuts_at_max_model_len(name):
    proposer = specdec.create_proposer({**CONFIGS[name], "num_speculative_tokens": 4,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    row = [1, 2, 3, 4, 5, 6, 1, 2]  # suffix "1 2" -> drafts 3 4 5 6
    ids = np.array([row, row, row, row], np.int32)
    num = [8, 8, 8, 8]
    sampled = [[2], [], [2], [2]]  # row 1 is still prefilling
    drafts = proposer.propose(_batch(ids, num, sampled, 4, 10))
    assert isinstance(drafts, Drafts)
    assert drafts.token_ids.dtype == torch.int64 and tuple(drafts.token_ids.shape) == (4, 4)
    assert drafts.to_lists() == [[3, 4], [], [3, 4], [3, 4]]  # max_model_len 10 leaves room for 2
    assert drafts.token_ids[1].tolist() == [-1] * 4 and drafts.token_ids[0, 2:].tolist() == [-1, -1]
    full = proposer.propose(_batch(ids, num, sampled, 4, 8))
    assert full.num_draft_tokens == [0, 0, 0, 0]  # rows at max_model_len get nothing


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("match", ["leftmost", "recent"])
def test_propose_matches_reference_on_random_batches(name, match):
    rng = np.random.default_rng(3)
    proposer = specdec.create_proposer({**CONFIGS[name], "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                        "prompt_lookup_max": 3, "match": match})
    for _ in range(4):
        ids = rng.integers(0, 4, (6, 40)).astype(np.int32)
        num = rng.integers(0, 41, 6)
        sampled = [[1] if rng.random() < 0.8 else [] for _ in range(6)]
        expected = ngram_propose_ref(ids, num, 1, 3, 3, 60, match)
        expected = [e if s else [] for e, s in zip(expected, sampled)]
        assert proposer.propose(_batch(ids, num, sampled, 3, 60)).to_lists() == expected


def test_gpu_proposer_reads_token_ids_device():
    proposer = specdec.create_proposer({"method": "ngram_gpu", "num_speculative_tokens": 2,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    real = np.array([[5, 6, 7, 5, 6]], np.int32)
    batch = _batch(np.zeros_like(real), [5], [[6]], 2, 50, token_ids_device=torch.from_numpy(real))
    assert proposer.propose(batch).to_lists() == [[7, 5]]

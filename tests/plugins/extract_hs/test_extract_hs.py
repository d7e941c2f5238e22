"""Method extract_hidden_states and ``specdec extract``: shards hold exactly HF's hidden states.

The reference is Hugging Face ``model(ids, output_hidden_states=True).hidden_states[layer]`` of each
sequence alone; the engine and the forward path run batches of requests with different lengths.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from extract_hs_util import DEVICES, assert_rows_close, dir_listing, extract, hf_hidden, random_seqs, write_ids_jsonl

import specdec
from specdec_tools.shards import HiddenStateDataset, read_manifest

LAYERS = [0, 1, 3]  # embeddings, a middle layer, HF's last entry (after the final norm); the models have 3 layers
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34]]


def _check_against_hf(path: str, ds: HiddenStateDataset, expected_ids: list[list[int]], device: str) -> None:
    assert len(ds) == len(expected_ids)
    for i, ids in enumerate(expected_ids):
        item = ds[i]
        assert item["input_ids"].tolist() == ids
        ref = hf_hidden(path, ids)
        for key, rows in item["hidden"].items():
            want = ref[-1] if key == "last" else ref[int(key)]
            assert rows.dtype == torch.float32
            assert_rows_close(rows, want, f"sequence {i}, hidden.{key}", device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["tiny_llama_path", "tiny_qwen2_path"])
def test_in_flight_shards_equal_hf_hidden_states(model, device, request, tmp_path):
    path = request.getfixturevalue(model)
    out = tmp_path / "hs"
    llm = specdec.LLM(path, {"method": "extract_hidden_states", "output_dir": str(out), "layer_ids": LAYERS,
                             "last_layer": True}, dtype="float32", device=device, max_num_seqs=4)
    n = 7
    outs = llm.generate(PROMPTS, specdec.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    llm.proposer.close()
    ds = HiddenStateDataset(out)
    # The record ends where the engine's hand-over ends: prompt + the first n - 2 generated tokens.
    expected = [o.prompt_token_ids + o.token_ids[: n - 2] for o in outs]
    _check_against_hf(path, ds, expected, device)
    for i, p in enumerate(PROMPTS):
        assert ds[i]["loss_mask"].tolist() == [False] * len(p) + [True] * (n - 2)
    m = ds.manifest
    assert (m["complete"], m["layer_ids"], m["last_layer"], m["dtype"], m["hidden_size"]) == (True, LAYERS, True,
                                                                                             "float32", 64)
    assert (m["num_sequences"], m["num_tokens"]) == (4, sum(map(len, expected)))
    assert m["convention"] == "hf_output_hidden_states"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["tiny_llama_path", "tiny_qwen2_path"])
def test_forward_path_equals_hf_hidden_states(model, device, request, tmp_path):
    path = request.getfixturevalue(model)
    seqs = random_seqs(5, 96, 3, 30, seed=1)
    data = write_ids_jsonl(tmp_path / "ids.jsonl", seqs)
    assert extract("--model", path, "--layers", "0,1,3", "--last", "--data", data, "--out", str(tmp_path / "hs"),
                   "--batch-size", "3", "--dtype", "float32", "--device", device) == 0
    ds = HiddenStateDataset(tmp_path / "hs")
    _check_against_hf(path, ds, seqs, device)
    assert all(ds[i]["loss_mask"].all() for i in range(len(ds)))


def test_generate_and_forward_paths_write_the_same_shards(tiny_llama_path, tmp_path):
    data = write_ids_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    assert extract("--model", tiny_llama_path, "--layers", "1,2", "--last", "--data", data, "--out",
                   str(tmp_path / "gen"), "--generate", "6", "--batch-size", "3", "--dtype", "float32") == 0
    gen = HiddenStateDataset(tmp_path / "gen")
    assert [len(gen[i]["input_ids"]) for i in range(len(gen))] == [len(p) + 6 for p in PROMPTS]
    seqs = [gen[i]["input_ids"].tolist() for i in range(len(gen))]
    masks = [gen[i]["loss_mask"].int().tolist() for i in range(len(gen))]
    assert masks == [[0] * len(p) + [1] * 6 for p in PROMPTS]
    again = write_ids_jsonl(tmp_path / "recorded.jsonl", seqs, masks)
    assert extract("--model", tiny_llama_path, "--layers", "1,2", "--last", "--data", again, "--out",
                   str(tmp_path / "fwd"), "--batch-size", "2", "--dtype", "float32") == 0
    fwd = HiddenStateDataset(tmp_path / "fwd")
    assert len(fwd) == len(gen)
    for i in range(len(gen)):
        a, b = gen[i], fwd[i]
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])
        for k in a["hidden"]:
            assert_rows_close(a["hidden"][k], b["hidden"][k], f"sequence {i}, hidden.{k}")
    keys = ("target_config_sha256", "layer_ids", "last_layer", "dtype", "hidden_size", "num_tokens", "num_sequences")
    assert {k: gen.manifest[k] for k in keys} == {k: fwd.manifest[k] for k in keys}


def test_plugin_is_discoverable():
    info = specdec.available_methods()["extract_hidden_states"]
    assert (info.status, info.plugin) == ("ok", "extract_hs")
    assert specdec.get_proposer_class("extract_hidden_states").__module__ == "specdec_extract_hs.proposer"


def test_drafts_nothing_and_output_equals_the_baseline(tiny_qwen2_path, tmp_path):
    params = specdec.SamplingParams(temperature=0.0, max_tokens=5)
    base = specdec.LLM(tiny_qwen2_path, dtype="float32").generate(PROMPTS, params)
    llm = specdec.LLM(tiny_qwen2_path, {"method": "extract_hidden_states", "output_dir": str(tmp_path / "o"),
                                        "last_layer": True}, dtype="float32")
    outs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert llm.stats.num_draft_tokens == 0


def test_layer_ids_outside_the_model_are_refused_before_any_file(tiny_llama_path, tmp_path):
    out = tmp_path / "hs"
    msg = ("layer id 4 is outside the model: valid ids are 0..3 (0 = embeddings, i = output of decoder layer i; "
           "the model has num_hidden_layers=3).")
    with pytest.raises(ValueError) as exc:
        specdec.LLM(tiny_llama_path, {"method": "extract_hidden_states", "output_dir": str(out), "layer_ids": [1, 4]})
    assert str(exc.value) == msg
    data = write_ids_jsonl(tmp_path / "ids.jsonl", [[3, 4, 5]])
    with pytest.raises(ValueError) as exc:
        extract("--model", tiny_llama_path, "--layers", "1,4", "--data", data, "--out", str(out))
    assert str(exc.value) == msg
    with pytest.raises(ValueError, match=r"^layer id -1 is outside the model: valid ids are 0\.\.3"):
        extract("--model", tiny_llama_path, "--layers=-1", "--data", data, "--out", str(out))
    assert not out.exists()


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="nothing to record"):
        specdec.SpeculativeConfig(method="extract_hidden_states", output_dir="x")
    with pytest.raises(ValueError, match=r"^output_dir=None is invalid"):
        specdec.SpeculativeConfig(method="extract_hidden_states", last_layer=True)
    with pytest.raises(ValueError, match=r"^dtype='int8' is invalid"):
        specdec.SpeculativeConfig(method="extract_hidden_states", output_dir="x", last_layer=True, dtype="int8")
    cfg = specdec.SpeculativeConfig(method="extract_hidden_states", output_dir="x", layer_ids=[2, 1])
    assert cfg.options.layer_ids == (2, 1) and cfg.num_speculative_tokens == 1


def test_not_a_causal_lm_is_refused(tmp_path):
    from transformers import BertConfig, BertModel

    path = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(path)
    data = write_ids_jsonl(tmp_path / "ids.jsonl", [[3, 4, 5]])
    with pytest.raises(ValueError) as exc:
        extract("--model", str(path), "--layers", "1", "--data", data, "--out", str(tmp_path / "hs"))
    assert str(exc.value) == (f"model {str(path)!r} is BertModel, not a causal language model: specdec extract needs "
                              "a decoder-only *ForCausalLM model (Llama, Qwen2/3, ...).")
    assert not (tmp_path / "hs").exists()


def test_unknown_data_format_is_refused(tiny_llama_path, tmp_path):
    bad = tmp_path / "data.parquet"
    bad.write_bytes(b"PAR1\x00\x01")
    out = tmp_path / "hs"
    with pytest.raises(ValueError) as exc:
        extract("--model", tiny_llama_path, "--layers", "1", "--data", str(bad), "--out", str(out))
    assert str(exc.value).startswith(f"data file {str(bad)!r} has an unknown format (.parquet files are not read). "
                                     "Accepted: UTF-8 text files")
    binary = tmp_path / "blob.dat"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ValueError, match=r"has an unknown format \(not UTF-8 text\)"):
        extract("--model", tiny_llama_path, "--layers", "1", "--data", str(binary), "--out", str(out))
    assert not out.exists()


def test_output_dir_of_another_model_is_refused(tiny_llama_path, tiny_qwen2_path, tmp_path):
    data = write_ids_jsonl(tmp_path / "ids.jsonl", random_seqs(3, 96, 3, 8))
    out = tmp_path / "hs"
    assert extract("--model", tiny_llama_path, "--layers", "1", "--data", data, "--out", str(out)) == 0
    before = {p: (out / p).read_bytes() for p in dir_listing(out)}
    from specdec_tools.shards import IncompatibleShardsError

    with pytest.raises(IncompatibleShardsError, match=r"holds shards of another target model"):
        extract("--model", tiny_qwen2_path, "--layers", "1", "--data", data, "--out", str(out), "--resume")
    with pytest.raises(IncompatibleShardsError, match=r"holds shards of other settings .*layer_ids=\[1\] there, "
                                                      r"\[2\] here"):
        extract("--model", tiny_llama_path, "--layers", "2", "--data", data, "--out", str(out), "--resume")
    assert {p: (out / p).read_bytes() for p in dir_listing(out)} == before


def test_resume_with_other_data_is_refused(tiny_llama_path, tmp_path):
    out = tmp_path / "hs"
    a = write_ids_jsonl(tmp_path / "a.jsonl", random_seqs(3, 96, 3, 8, seed=1))
    b = write_ids_jsonl(tmp_path / "b.jsonl", random_seqs(4, 96, 3, 8, seed=2))
    assert extract("--model", tiny_llama_path, "--last", "--data", a, "--out", str(out)) == 0
    with pytest.raises(ValueError, match=r"^--resume: .* was written from other data \(path, num_items differ"):
        extract("--model", tiny_llama_path, "--last", "--data", b, "--out", str(out), "--resume")


def test_npy_token_ids_and_manifest(tiny_llama_path, tmp_path):
    arr = np.arange(2, 52, dtype=np.int32)
    np.save(tmp_path / "ids.npy", arr)
    out = tmp_path / "hs"
    assert extract("--model", tiny_llama_path, "--layers", "2", "--data", str(tmp_path / "ids.npy"), "--out", str(out),
                   "--max-model-len", "20", "--dtype", "float32", "--store-dtype", "bfloat16") == 0
    m = read_manifest(out)
    assert m["dtype"] == "bfloat16" and m["num_sequences"] == 3 and m["num_tokens"] == 50
    assert m["data"]["max_model_len"] == 20 and m["data"]["num_items"] == 3
    ds = HiddenStateDataset(out)
    assert torch.cat([ds[i]["input_ids"] for i in range(3)]).tolist() == arr.tolist()
    assert ds[0]["hidden"]["2"].dtype == torch.bfloat16
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_requests_are_written_in_submission_order_and_a_one_token_request_is_empty(tiny_llama_path, tmp_path):
    out = tmp_path / "hs"
    llm = specdec.LLM(tiny_llama_path, {"method": "extract_hidden_states", "output_dir": str(out), "last_layer": True},
                      dtype="float32", max_num_seqs=2)
    params = [specdec.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (9, 1, 3, 4)]
    outs = llm.generate(PROMPTS, params)  # finish out of order: the second first, the first last
    llm.proposer.close()
    ds = HiddenStateDataset(out)
    assert [ds[i]["input_ids"].tolist() for i in range(4)] == [
        outs[0].prompt_token_ids + outs[0].token_ids[:7], [], PROMPTS[2] + outs[2].token_ids[:1],
        PROMPTS[3] + outs[3].token_ids[:2]]
    assert ds[1]["hidden"]["last"].shape == (0, 64)


def test_cli_prints_one_line_for_bad_input(tiny_llama_path, tmp_path, capsys):
    from specdec.cli import main

    data = write_ids_jsonl(tmp_path / "ids.jsonl", [[3, 4, 5]])
    argv = ["extract", "--model", tiny_llama_path, "--data", data, "--out", str(tmp_path / "hs"), "--no-progress"]
    assert main([*argv, "--layers", "7"]) == 2
    assert capsys.readouterr().err == ("specdec extract: error: layer id 7 is outside the model: valid ids are 0..3 "
                                       "(0 = embeddings, i = output of decoder layer i; the model has "
                                       "num_hidden_layers=3).\n")
    assert main([*argv, "--last", "--max-bytes", "ten"]) == 2
    assert "--max-bytes 'ten' is invalid: pass bytes, or a number with K, M, G or T" in capsys.readouterr().err
    assert main([*argv, "--last", "--max-bytes", "100"]) == 2  # smaller than one shard: stops before writing it
    assert capsys.readouterr().err.startswith("specdec extract: error: shard 0 (")
    assert dir_listing(tmp_path / "hs") == ["manifest.json"]
    assert main([*argv, "--last", "--resume"]) == 0
    assert read_manifest(tmp_path / "hs")["complete"] is True


def test_registering_the_method_does_not_load_specdec_tools():
    import subprocess
    import sys

    from specdec_extract_hs import proposer
    from specdec_tools import shards

    assert proposer.DEFAULT_SHARD_TOKENS == shards.DEFAULT_SHARD_TOKENS
    assert sorted(proposer.STORE_DTYPES) == sorted(shards.DTYPES)
    code = ("import sys, specdec\nspecdec.get_proposer_class('extract_hidden_states')\n"
            "print('specdec_tools' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "False", proc.stderr

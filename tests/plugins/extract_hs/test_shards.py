"""specdec_tools.shards: the on-disk format, read back; what the writer refuses; leftovers of a killed run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from specdec_tools.shards import (
    DiskBudgetExceeded,
    HiddenStateDataset,
    IncompatibleShardsError,
    ShardDirError,
    ShardWriter,
    config_sha256,
    read_manifest,
)

CONFIG = {"num_hidden_layers": 4, "hidden_size": 8, "model_type": "llama"}


def _writer(out: Path, **kw) -> ShardWriter:
    args = dict(target_path="/m", target_config=CONFIG, layer_ids=[3, 1], last_layer=True, dtype="float32",
                hidden_size=8, shard_tokens=10)
    return ShardWriter(out, **{**args, **kw})


def _seq(t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    hidden = {k: torch.randn(t, 8, generator=g) for k in ("1", "3", "last")}
    return torch.randint(0, 1000, (t,), generator=g), torch.arange(t) % 2, hidden


def test_round_trip_layout_and_manifest(tmp_path):
    seqs = [_seq(t, i) for i, t in enumerate([4, 7, 0, 12, 3])]
    w = _writer(tmp_path / "o", data={"path": "d.jsonl"})
    for s in seqs:
        w.add(*s)
    w.close()
    m = read_manifest(tmp_path / "o")
    assert {k: m[k] for k in ("format", "version", "target", "layer_ids", "last_layer", "convention", "dtype",
                              "hidden_size", "num_tokens", "num_sequences", "complete", "data")} == {
        "format": "specdec-hidden-states", "version": 1, "target": "/m", "layer_ids": [1, 3], "last_layer": True,
        "convention": "hf_output_hidden_states", "dtype": "float32", "hidden_size": 8, "num_tokens": 26,
        "num_sequences": 5, "complete": True, "data": {"path": "d.jsonl"}}
    assert m["target_config_sha256"] == config_sha256(CONFIG)
    # shards fill to >= 10 tokens with whole sequences: [4, 7], [0, 12], [3]
    assert [(e["file"], e["num_sequences"], e["num_tokens"]) for e in m["shards"]] == [
        ("shard-00000.safetensors", 2, 11), ("shard-00001.safetensors", 2, 12), ("shard-00002.safetensors", 1, 3)]
    with safe_open(str(tmp_path / "o" / "shard-00001.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["hidden.1", "hidden.3", "hidden.last", "input_ids", "loss_mask", "offsets"]
        assert f.get_tensor("input_ids").dtype == torch.int32 and f.get_tensor("loss_mask").dtype == torch.uint8
        assert f.get_tensor("offsets").tolist() == [0, 0, 12] and f.get_tensor("hidden.1").shape == (12, 8)
    ds = HiddenStateDataset(tmp_path / "o")
    ds = pickle.loads(pickle.dumps(ds))  # DataLoader workers get a copy
    assert len(ds) == 5 and ds.manifest == m
    for i, (ids, mask, hidden) in enumerate(seqs):
        item = ds[i]
        assert torch.equal(item["input_ids"], ids.long()) and torch.equal(item["loss_mask"], mask.bool())
        assert item["input_ids"].dtype == torch.int64 and item["loss_mask"].dtype == torch.bool
        assert item["hidden"].keys() == {"1", "3", "last"}
        for k in hidden:
            assert torch.equal(item["hidden"][k], hidden[k])
    assert torch.equal(ds[-1]["input_ids"], seqs[-1][0].long())
    with pytest.raises(IndexError, match="sequence 5 is out of range: the dataset holds 5"):
        ds[5]


def test_bfloat16_storage(tmp_path):
    w = _writer(tmp_path / "o", dtype="bfloat16")
    ids, mask, hidden = _seq(5, 0)
    w.add(ids, mask, hidden)
    w.close()
    got = HiddenStateDataset(tmp_path / "o")[0]["hidden"]["last"]
    assert got.dtype == torch.bfloat16 and torch.equal(got, hidden["last"].bfloat16())


def test_add_checks_shapes_and_keys(tmp_path):
    w = _writer(tmp_path / "o")
    ids, mask, hidden = _seq(5, 0)
    with pytest.raises(ValueError, match=r"hidden has keys \['1', 'last'\], expected \['1', '3', 'last'\]"):
        w.add(ids, mask, {"1": hidden["1"], "last": hidden["last"]})
    with pytest.raises(ValueError, match=r"hidden\['3'\] has shape \(4, 8\), expected \(5, 8\)"):
        w.add(ids, mask, {**hidden, "3": hidden["3"][:4]})
    with pytest.raises(ValueError, match=r"loss_mask has shape \(4,\), expected \(5,\)"):
        w.add(ids, mask[:4], hidden)
    with pytest.raises(ValueError, match=r"nothing to record"):
        _writer(tmp_path / "p", layer_ids=[], last_layer=False)
    with pytest.raises(ValueError, match=r"^layer id 5 is outside the model: valid ids are 0\.\.4"):
        _writer(tmp_path / "p", layer_ids=[5])
    assert not (tmp_path / "p").exists()


def test_refuses_shards_of_another_model_or_settings(tmp_path):
    out = tmp_path / "o"
    w = _writer(out)
    w.add(*_seq(12, 0))
    w.close()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = {**CONFIG, "vocab_size": 7}
    with pytest.raises(IncompatibleShardsError) as exc:
        _writer(out, target_config=other, target_path="/other", resume=True)
    assert str(exc.value) == (
        f"output directory {str(out)!r} holds shards of another target model (target '/m'): target_config_sha256="
        f"{config_sha256(CONFIG)!r} there, {config_sha256(other)!r} here. Choose another output directory, or "
        "delete that one to start over.")
    with pytest.raises(IncompatibleShardsError, match=r"of other settings .*dtype='float32' there, 'float16' here"):
        _writer(out, dtype="float16", resume=True)
    with pytest.raises(ShardDirError, match=r"already holds 1 sequences in 1 shard\(s\) of this target: pass "
                                            r"resume=True \(--resume\)"):
        _writer(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume_cleans_what_a_kill_left_and_continues(tmp_path):
    out = tmp_path / "o"
    w = _writer(out)
    for i in range(3):
        w.add(*_seq(6, i))  # shard 0 = sequences 0, 1; sequence 2 pending
    # A kill between writing shard 1 and listing it, and one during a temporary file:
    (out / "shard-00001.safetensors").write_bytes(b"orphan")
    (out / ".tmp-shard-00002.safetensors-123").write_bytes(b"half")
    (out / ".tmp-manifest.json-123").write_bytes(b"{")
    del w
    r = _writer(out, resume=True)
    assert r.num_sequences_done == 2
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shard-00000.safetensors"]
    for i in range(2, 4):
        r.add(*_seq(6, i))
    r.close()
    ds = HiddenStateDataset(out)
    assert len(ds) == 4 and torch.equal(ds[3]["hidden"]["3"], _seq(6, 3)[2]["3"])


def test_missing_or_changed_shards_and_strays_are_refused(tmp_path):
    out = tmp_path / "o"
    w = _writer(out)
    w.add(*_seq(12, 0))
    w.close()
    (out / "shard-00000.safetensors").write_bytes(b"truncated")
    with pytest.raises(ShardDirError, match=r"shard .*shard-00000.safetensors' listed in the manifest is missing or "
                                            r"has 9 bytes"):
        _writer(out, resume=True)
    stray = tmp_path / "s"
    stray.mkdir()
    (stray / "shard-00000.safetensors").write_bytes(b"x")
    with pytest.raises(ShardDirError, match=r"holds shard files \(shard-00000.safetensors, \.\.\.\) but no "
                                            r"manifest.json"):
        _writer(stray)
    (stray / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ShardDirError, match=r"has format='other', expected 'specdec-hidden-states'"):
        read_manifest(stray)


def test_background_writes_the_same_bytes_and_raises_the_threads_error_at_close(tmp_path, monkeypatch):
    """background=True writes shards on a thread while the caller goes on: the same files as a synchronous
    writer; an error there (here a full budget at the second shard) is raised by a later flush or close, and
    the manifest lists only the shards on disk."""
    seqs = [_seq(t, i) for i, t in enumerate([4, 7, 0, 12, 3, 9])]
    many = [_seq(t, i) for i, t in enumerate([11, 3, 8, 14, 2, 10, 12, 5, 9, 13, 1, 11])]  # 8 shards, 3 in flight
    for name, background, data in (("sync", False, seqs), ("thread", True, seqs), ("sync8", False, many),
                                   ("thread8", True, many)):
        w = _writer(tmp_path / name, background=background)
        for s in data:
            w.add(*s)
        w.close()
    assert len(read_manifest(tmp_path / "sync8")["shards"]) == 8
    for a, b in (("sync", "thread"), ("sync8", "thread8")):
        names = sorted(p.name for p in (tmp_path / a).iterdir())
        assert names == sorted(p.name for p in (tmp_path / b).iterdir())
        for f in names:
            assert (tmp_path / a / f).read_bytes() == (tmp_path / b / f).read_bytes(), f
    first = (tmp_path / "sync" / "shard-00000.safetensors").stat().st_size
    with pytest.raises(ValueError, match=r"writer_threads=0 is invalid: it must be an int >= 1"):
        _writer(tmp_path / "zero", background=True, writer_threads=0)
    w = _writer(tmp_path / "budget", background=True, max_bytes=first + 10)
    with pytest.raises(DiskBudgetExceeded, match="shard 1 .* was not written: max_bytes="):
        for s in seqs:
            w.add(*s)
        w.close()
    m = read_manifest(tmp_path / "budget")
    assert [e["file"] for e in m["shards"]] == ["shard-00000.safetensors"] and not m["complete"]
    assert sorted(p.name for p in (tmp_path / "budget").iterdir()) == ["manifest.json", "shard-00000.safetensors"]


def test_shard_layout_streams_a_safetensors_file_of_the_concatenations(tmp_path):
    """The writer streams each tensor's pieces after a header it builds itself: the file must read back with
    safetensors as the concatenations, every tensor's data aligned to its item size."""
    import hashlib

    from safetensors import safe_open
    from safetensors.torch import load_file

    from specdec_tools.shards import shard_layout

    g = torch.Generator().manual_seed(0)
    pieces = {"hidden.2": [torch.randn(3, 5, generator=g).to(torch.bfloat16), torch.zeros(0, 5, dtype=torch.bfloat16),
                           torch.randn(4, 5, generator=g).to(torch.bfloat16)],
              "input_ids": [torch.arange(3, dtype=torch.int32), torch.arange(4, dtype=torch.int32)],
              "loss_mask": [torch.ones(5, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8)],
              "offsets": [torch.tensor([0, 3, 7])],
              "hidden.last": [torch.randn(7, 5, generator=g)]}
    header, chunks = shard_layout(pieces, {"format": "x"})
    path = tmp_path / "s.safetensors"
    path.write_bytes(header + b"".join(bytes(c) for c in chunks))
    got = load_file(path)
    assert sorted(got) == sorted(pieces)
    for name, parts in pieces.items():
        assert torch.equal(got[name], torch.cat(parts)), name
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "x"}
    n = int.from_bytes(header[:8], "little")
    assert len(header) == 8 + n and n % 8 == 0
    for name, meta in json.loads(header[8:]).items():
        if name != "__metadata__":
            assert meta["data_offsets"][0] % pieces[name][0].element_size() == 0, name
    w = _writer(tmp_path / "w")
    for s in [_seq(t, i) for i, t in enumerate([4, 7, 12])]:
        w.add(*s)
    w.close()
    for e in read_manifest(tmp_path / "w")["shards"]:
        data = (tmp_path / "w" / e["file"]).read_bytes()
        assert len(data) == e["bytes"] and hashlib.sha256(data).hexdigest() == e["sha256"]

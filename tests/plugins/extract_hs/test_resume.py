"""A run killed in the middle of a shard, then resumed, leaves exactly what an uninterrupted run leaves;
a full disk budget stops cleanly; nothing half-written survives either."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from extract_hs_util import dir_listing, extract, random_seqs, write_ids_jsonl

from specdec_tools.shards import DiskBudgetExceeded, HiddenStateDataset, ShardWriter, read_manifest


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the writer gets to clean up after it."""


def _kill_at_shard(monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    """Shard ``index`` dies half-way through its temporary file, as a killed process leaves it."""
    real = ShardWriter._write_shard

    def write(self: ShardWriter, path: Path, chunks: list) -> tuple[Path, str]:
        if path.name == f"shard-{index:05d}.safetensors":
            data = b"".join(bytes(c) for c in chunks)
            path.with_name(f".tmp-{path.name}-99999").write_bytes(data[: len(data) // 2])
            raise Killed()
        return real(self, path, chunks)

    monkeypatch.setattr(ShardWriter, "_write_shard", write)


def _files(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in dir_listing(path)}


@pytest.mark.parametrize("generate", [False, True], ids=["forward", "generate"])
def test_killed_mid_shard_then_resumed_equals_uninterrupted(tiny_llama_path, tmp_path, monkeypatch, generate):
    seqs = random_seqs(9, 96, 4, 14, seed=3)
    data = write_ids_jsonl(tmp_path / "data.jsonl", seqs)
    # batch size 1: rows then never depend on which sequences share a forward, so shards compare bytewise
    flags = ["--model", tiny_llama_path, "--layers", "0,2", "--last", "--data", data, "--shard-tokens", "20",
             "--batch-size", "1", *(["--generate", "3"] if generate else [])]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert extract(*flags, "--out", str(full)) == 0
    assert len(read_manifest(full)["shards"]) >= 4

    with monkeypatch.context() as m:
        _kill_at_shard(m, 2)
        with pytest.raises(Killed):
            extract(*flags, "--out", str(cut))
    killed = read_manifest(cut)
    assert [e["file"] for e in killed["shards"]] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    assert killed["complete"] is False
    assert killed["num_sequences"] == sum(e["num_sequences"] for e in killed["shards"])
    assert ".tmp-shard-00002.safetensors-99999" in dir_listing(cut)  # what the kill left behind
    assert len(HiddenStateDataset(cut)) == killed["num_sequences"]  # readable as it is

    with pytest.raises(ValueError, match=r"already holds \d+ sequences .* pass resume=True \(--resume\)"):
        extract(*flags, "--out", str(cut))
    assert extract(*flags, "--out", str(cut), "--resume") == 0
    assert _files(cut) == _files(full)  # every shard byte and the manifest


def test_disk_budget_stops_cleanly_and_resume_continues(tiny_llama_path, tmp_path):
    seqs = random_seqs(8, 96, 6, 12, seed=4)
    data = write_ids_jsonl(tmp_path / "data.jsonl", seqs)
    flags = ["--model", tiny_llama_path, "--layers", "1", "--data", data, "--shard-tokens", "16"]
    full, out = tmp_path / "full", tmp_path / "out"
    assert extract(*flags, "--out", str(full)) == 0
    sizes = [e["bytes"] for e in read_manifest(full)["shards"]]
    budget = sizes[0] + sizes[1] + sizes[2] // 2  # room for two shards, not three

    with pytest.raises(DiskBudgetExceeded) as exc:
        extract(*flags, "--out", str(out), "--max-bytes", str(budget))
    m = read_manifest(out)
    done = m["num_sequences"]
    pending = read_manifest(full)["shards"][2]["num_sequences"]
    assert str(exc.value) == (
        f"shard 2 ({sizes[2]} bytes) was not written: max_bytes={budget} ({sizes[0] + sizes[1]} bytes in 2 shard(s) "
        f"already). {str(out)!r} holds {done} complete sequences; the {pending} pending were dropped. Free space or "
        "raise the budget, then rerun with resume=True (--resume) to continue.")
    assert dir_listing(out) == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"]
    assert (m["complete"], len(m["shards"]), m["num_tokens"]) == (False, 2, sum(e["num_tokens"] for e in m["shards"]))
    assert sum(f.stat().st_size for f in out.glob("shard-*")) <= budget

    assert extract(*flags, "--out", str(out), "--resume", "--max-bytes", "1G") == 0
    assert _files(out) == _files(full)


def test_full_disk_raises_disk_budget_exceeded_without_a_temp_file(tmp_path, monkeypatch):
    import errno

    import torch

    import specdec_tools.shards as shards

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    w = ShardWriter(tmp_path / "o", target_path="t", target_config={"num_hidden_layers": 2}, layer_ids=[1],
                    last_layer=False, dtype="float32", hidden_size=4, shard_tokens=2)
    monkeypatch.setattr(shards.os, "fsync", no_space)  # the shard's temporary file is written, then the disk is full
    with pytest.raises(DiskBudgetExceeded, match=r"^shard 0 \(\d+ bytes\) was not written: the disk is full"):
        w.add(torch.arange(3), torch.ones(3), {"1": torch.zeros(3, 4)})
    assert dir_listing(tmp_path / "o") == ["manifest.json"]
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["shards"] == []

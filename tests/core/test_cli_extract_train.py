"""`specdec train` and `specdec extract` on the command line: real training of the skiphead fixture plugin on the
bundled tiny target (CPU, seconds), from text run through the target (--online) and from shards; every user
mistake is one exact line and exit status 2; `specdec extract` is the extract_hs plugin's command, imported only
when it runs."""

from __future__ import annotations

import importlib.abc
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_train import TEXT_FILES, needs_skiphead, write_shards

import specdec
from specdec.cli import main

TINY = specdec.bundled_model("tiny")


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("cli-shards"), TEXT_FILES, layer_ids=[2], last_layer=True)


def _train(out: Path, *data: str, steps: int = 30) -> list[str]:
    return ["train", "--method", "skiphead", "--target", TINY, *data, "--out", str(out), "--steps", str(steps),
            "--batch-size", "8", "--lr", "3e-3", "--eval-every", "5", "--eval-fraction", "0.1", "--threads", "1",
            "--no-progress"]


def _check_run(out: Path, capsys, kind: str) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    losses = [e["loss"] for e in metrics["eval_history"]]
    assert [e["step"] for e in metrics["eval_history"]] == [5, 10, 15, 20, 25, 30]
    assert losses[-1] < losses[0] - 0.5, losses  # the head learns: held-out loss falls
    held = metrics["held_out"]
    assert len(held["acceptance_per_position"]) == 2 and held["positions"] > 0
    assert held["mean_acceptance_length"] == pytest.approx(1 + sum(held["accepted_prefix_per_position"]), abs=1e-3)
    assert metrics["data"]["kind"] == kind and metrics["training"]["mean_step_seconds"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "metrics.json", "model.safetensors"]
    card = (out / "README.md").read_text()
    assert card.startswith("# `skiphead` head for `tiny`, trained by `specdec train`")
    assert "| 1 | " in card and "| 2 | " in card and "specdec train --method skiphead" in card
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[0].startswith("method: skiphead; 30 steps in ") and f"-> {held['loss']:.4f} (step 30)" in stdout[0]
    assert stdout[-1] == f"wrote {out} (the head, README.md, metrics.json)"
    return metrics


@needs_skiphead
def test_train_online_learns_and_reports_the_target_share(tmp_path, capsys):
    assert main(_train(tmp_path, "--online", "--text", *TEXT_FILES, "--seq-len", "64")) == 0
    metrics = _check_run(tmp_path, capsys, "online")
    assert 0 < metrics["training"]["target_forward_share"] < 1
    assert metrics["data"]["seq_len"] == 64 and metrics["data"]["files"] == TEXT_FILES


@needs_skiphead
def test_train_from_shards_learns(tmp_path, capsys, shard_dir):
    assert main(_train(tmp_path, "--data", shard_dir)) == 0
    metrics = _check_run(tmp_path, capsys, "shards")
    assert metrics["training"]["target_forward_share"] is None
    assert (metrics["data"]["layer_ids"], metrics["data"]["last_layer"]) == ([2], True)


@needs_skiphead
def test_train_reads_an_aux_layer_from_shards(tmp_path, shard_dir):
    assert main([*_train(tmp_path, "--data", shard_dir, steps=2), "--option", "feature_layer=2"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["hidden_states"] == ["2", "last"] and metrics["options"]["feature_layer"] == 2


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def test_train_mistakes_are_one_line(capsys, tmp_path):
    base = ["train", "--method", "skiphead", "--target", TINY, "--out", str(tmp_path)]
    online = ["--online", "--text", TEXT_FILES[0]]
    cases = [
        (base, "no training data: pass --data DIR (hidden-state shards written by `specdec extract`) or --online "
               "--text FILE... (text run through the target while training)."),
        ([*base, "--data", str(tmp_path), *online], "--data and --online exclude each other: train from shards (--data "
         "DIR) or from text run through the target (--online --text FILE...), not both."),
        ([*base, "--online"], "--online needs text to run through the target: add --text FILE... (text or .jsonl "
                              "files)."),
        ([*base, "--text", TEXT_FILES[0]], "--text is the text of --online training: add --online, or train from "
                                           "shards with --data DIR alone."),
        ([*base, *online, "--steps", "0"], "--steps 0 is invalid: it must be an int >= 1 (optimizer steps)."),
        ([*base, *online, "--lr", "0"], "--lr 0.0 is invalid: it must be a finite number > 0, e.g. --lr 1e-3."),
        ([*base, *online, "--eval-fraction", "1"], "--eval-fraction 1.0 is invalid: it must be in (0, 1), e.g. 0.05."),
        (["train", "--method", "skiphead", "--out", "x"], "the following arguments are required: --target (see "
                                                          "`specdec train --help`)"),
    ]
    for argv, message in cases:
        assert _error(capsys, argv) == f"specdec train: error: {message}", argv


@needs_skiphead
def test_train_method_option_and_data_mistakes(capsys, tmp_path, shard_dir):
    base = ["train", "--target", TINY, "--out", str(tmp_path)]
    err = _error(capsys, [*base, "--method", "nope", "--data", shard_dir])
    trained = ", ".join(sorted(specdec.available_trainers()))  # skiphead, and eagle/eagle3 where installed
    assert err.startswith(f"specdec train: error: No trainer for method 'nope'. Methods with trainers: {trained}. "
                          "Install a plugin that trains it with: pip install specdec-plugin-<name> (e.g. pip install "
                          "specdec-plugin-nope)")
    base += ["--method", "skiphead"]
    assert _error(capsys, [*base, "--data", shard_dir, "--option", "heads=3"]) == (
        "specdec train: error: Unknown training option(s) ['heads'] for method 'skiphead'. Valid options: num_heads, "
        "feature_layer (set with --option key=value).")
    assert _error(capsys, [*base, "--data", shard_dir, "--option", "num_heads=0"]) == (
        "specdec train: error: num_heads=0 is invalid: it must be an int >= 1.")
    assert _error(capsys, [*base, "--data", shard_dir, "--option", "feature_layer=3"]) == (
        f"specdec train: error: --data {shard_dir!r}: the shards hold layer 2, the last hidden state ('last'), but "
        "method 'skiphead' needs layer 3, the last hidden state ('last') (layer 3 missing): extract the shards again "
        "with the layers it needs (layer ids 3 and the last hidden state), or train with --online.")
    assert _error(capsys, [*base, "--data", str(tmp_path / "none")]) == (
        f"specdec train: error: --data {str(tmp_path / 'none')!r} does not exist: pass the folder `specdec extract` "
        "wrote (it holds manifest.json and the shards), or use --online.")
    assert _error(capsys, [*base, "--data", str(tmp_path)]) == (
        f"specdec train: error: {str(tmp_path)!r} has no manifest.json: it is not a hidden-state shard directory "
        "(write one with `specdec extract`).")
    assert _error(capsys, [*base, "--online", "--text", str(tmp_path)]) == (
        f"specdec train: error: --text {str(tmp_path)!r} is a folder: pass UTF-8 text files, or .jsonl files of "
        "strings or {\"text\": ...} / {\"prompt\": ...} objects (e.g. --text data/*.txt).")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"messages": []}\n')
    assert _error(capsys, [*base, "--online", "--text", str(bad)]) == (
        f"specdec train: error: --text {str(bad)!r} line 2 is neither a JSON string nor an object with a string "
        "'text' or 'prompt': pass UTF-8 text files, or .jsonl files of strings or {\"text\": ...} / {\"prompt\": "
        "...} objects.")
    short = tmp_path / "short.jsonl"
    short.write_text('"def f(x):"\n{"prompt": "return", "completion": " x"}\n')
    assert _error(capsys, [*base, "--online", "--text", str(short)]) == (
        "specdec train: error: --text gives 9 tokens, 0 window(s) of --seq-len 256: training needs at least 2 (one "
        "to train on, one held out); give more text or a smaller --seq-len.")


# ---------------------------------------------------------------- extract


class _Hide(importlib.abc.MetaPathFinder):
    """Imports of ``names`` fail as they do when nothing provides them."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):
        if name in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _hide(monkeypatch, *names: str) -> None:
    for name in ("specdec_extract_hs", "specdec_extract_hs.command"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Hide(*names), *sys.meta_path])


def test_extract_without_the_plugin_says_how_to_install_it(capsys, monkeypatch):
    _hide(monkeypatch, "specdec_extract_hs")
    for argv in (["extract", "--out", "x"], ["extract", "--help"]):
        assert _error(capsys, argv) == (
            "specdec extract: error: `specdec extract` comes from the plugin specdec-plugin-extract_hs, which is "
            "not installed: pip install specdec-plugin-extract_hs")
    monkeypatch.undo()
    _hide(monkeypatch, "specdec_extract_hs.command")
    pytest.importorskip("specdec_extract_hs")
    assert _error(capsys, ["extract"]) == (
        "specdec extract: error: `specdec extract` comes from the plugin specdec-plugin-extract_hs, which is "
        "installed without its `command` module (an older version): pip install specdec-plugin-extract_hs")


def test_extract_delegates_to_the_plugin_command(capsys, monkeypatch):
    seen = []

    def add_arguments(parser):
        parser.add_argument("--layer-ids", required=True)

    def run(args):
        seen.append(args.layer_ids)
        if args.layer_ids == "bad":
            raise ValueError("layer ids 'bad' are invalid: pass ints, e.g. --layer-ids 2,6")
        return 0

    package = types.ModuleType("specdec_extract_hs")
    command = types.ModuleType("specdec_extract_hs.command")
    command.add_arguments, command.run, package.command = add_arguments, run, command
    monkeypatch.setitem(sys.modules, "specdec_extract_hs", package)
    monkeypatch.setitem(sys.modules, "specdec_extract_hs.command", command)
    assert main(["extract", "--layer-ids", "2,6"]) == 0 and seen == ["2,6"]
    assert _error(capsys, ["extract", "--layer-ids", "bad"]) == (
        "specdec extract: error: layer ids 'bad' are invalid: pass ints, e.g. --layer-ids 2,6")
    assert _error(capsys, ["extract"]) == ("specdec extract: error: the following arguments are required: "
                                           "--layer-ids (see `specdec extract --help`)")


def test_help_and_train_help_import_neither_the_plugin_nor_the_tools():
    code = ("import sys, contextlib, io\nfrom specdec.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    codes = [main(['--help']), main(['train', '--help'])]\n"
            "print(codes, sorted(m for m in ('specdec_extract_hs', 'specdec_tools') if m in sys.modules))\n"
            "print('extract' in out.getvalue() and '--online' in out.getvalue())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[0, 0] []", "True"]


@needs_skiphead
def test_extract_then_train_on_its_shards(tmp_path, capsys):
    """The real extract_hs command's shards are what `specdec train --data` reads (skipped without the plugin)."""
    pytest.importorskip("specdec_extract_hs.command")
    texts = tmp_path / "texts"
    texts.mkdir()
    for f in TEXT_FILES[:2]:
        (texts / Path(f).name).write_text(Path(f).read_text(encoding="utf-8"), encoding="utf-8")
    shards, out = tmp_path / "shards", tmp_path / "head"
    assert main(["extract", "--model", TINY, "--layers", "2", "--last", "--data", str(texts), "--out", str(shards),
                 "--max-model-len", "64", "--device", "cpu", "--no-progress"]) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    argv = [*_train(out, "--data", str(shards), steps=4), "--eval-every", "2", "--option", "feature_layer=2"]
    assert main(argv) == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["sequences"] == manifest["num_sequences"] > 2
    assert [e["step"] for e in metrics["eval_history"]] == [2, 4]

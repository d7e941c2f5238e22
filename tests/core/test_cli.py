"""The `specdec` command: methods listing, generate with and without speculation, config files, errors."""

from __future__ import annotations

import json
import subprocess
import sys

from specdec.cli import main


def test_methods_lists_fixture_plugin(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("copycat"))
    assert "specdec-plugin-copycat" in line and "0.1.0" in line and line.rstrip().endswith("ok")


def test_config_file_read_and_string_prompt_needs_tokenizer(tiny_llama_path, tmp_path, capsys):
    config = tmp_path / "spec.json"
    config.write_text(json.dumps({"method": "copycat", "num_speculative_tokens": 3}))
    code = main(["generate", "--model", tiny_llama_path, "--config", str(config), "--no-progress", "hello"])
    assert code == 2
    assert "prompt 0 is a string but the model has no tokenizer" in capsys.readouterr().err


def test_generate_errors_are_reported_not_raised(tiny_llama_path, capsys):
    assert main(["generate", "--model", "/no/such/dir", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--model", tiny_llama_path, "--method", "nope", "x"]) == 2
    assert "Unknown method 'nope'" in capsys.readouterr().err
    assert main(["generate", "--model", tiny_llama_path, "--temperature", "-1", "x"]) == 2
    assert "temperature=-1.0 is invalid" in capsys.readouterr().err


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "methods"], capture_output=True, text=True,
                         check=True).stdout
    assert "copycat" in out

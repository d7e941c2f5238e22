"""The `specdec` command: methods listing, generate with and without speculation, config files and flags,
threads and progress bars. Mistakes on the command line are in test_cli_errors.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

import specdec
from specdec import cli
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
    assert "--temperature -1.0 is invalid: it must be a finite number >= 0" in capsys.readouterr().err


def test_console_script_installed():
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "methods"], capture_output=True, text=True,
                         check=True).stdout
    assert "copycat" in out


# --- the speculative config: file keys, then flags (issue 18, defect 7) -----------------------------


@dataclass(frozen=True)
class _WindowOptions:
    window: int = 3


class WindowProposer(specdec.Proposer):
    """A second method with options of its own, to switch to from a file that names copycat."""

    method = "window_method"
    Options = _WindowOptions

    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


class _Stop(Exception):
    pass


@pytest.fixture
def llm_calls(monkeypatch):
    """specdec.LLM replaced by a recorder that stops the command once it has the arguments."""
    calls = []

    class RecordingLLM:
        def __init__(self, model, speculative_config=None, **kwargs):
            calls.append({"model": model, "config": speculative_config, **kwargs})
            raise _Stop("recorded")

    monkeypatch.setattr(specdec, "LLM", RecordingLLM, raising=False)
    return calls


def _config_of(llm_calls, tiny_llama_path, *flags):
    assert main(["generate", "--model", tiny_llama_path, "--no-progress", *flags, "x"]) == 2
    return llm_calls[-1]["config"]


def test_flags_override_the_keys_a_config_file_sets(llm_calls, tiny_llama_path, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("method: copycat\nnum_speculative_tokens: 3\nmin_history: 4\non_bad_drafts: drop\n")
    config = _config_of(llm_calls, tiny_llama_path, "--config", str(path))
    assert config.to_dict() == {"method": "copycat", "num_speculative_tokens": 3, "model": None,
                                "on_bad_drafts": "drop", "speculation_policy": "auto", "min_history": 4}
    config = _config_of(llm_calls, tiny_llama_path, "--config", str(path), "-k", "5", "--option", "min_history=6",
                        "--on-bad-drafts", "error")
    assert (config.num_speculative_tokens, config.min_history, config.on_bad_drafts) == (5, 6, "error")


def test_method_flag_switches_a_config_files_method(llm_calls, tiny_llama_path, tmp_path, register_proposer):
    register_proposer(WindowProposer)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "copycat", "num_speculative_tokens": 3}))
    # the file's defaults (copycat's min_history) never count as set, so they do not follow the switch
    config = _config_of(llm_calls, tiny_llama_path, "--config", str(path), "--method", "window_method")
    assert config.to_dict() == {"method": "window_method", "num_speculative_tokens": 3, "model": None,
                                "on_bad_drafts": "error", "speculation_policy": "auto", "window": 3}


def test_method_flag_refuses_the_old_methods_options_a_file_sets(tiny_llama_path, tmp_path, register_proposer,
                                                                 capsys):
    register_proposer(WindowProposer)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "copycat", "num_speculative_tokens": 3, "min_history": 4}))
    assert main(["generate", "--model", tiny_llama_path, "--config", str(path), "--method", "window_method",
                 "x"]) == 2
    err = capsys.readouterr().err
    assert err == (f"specdec generate: error: --method window_method replaces method 'copycat' of --config "
                   f"{str(path)!r}, which also sets ['min_history']: option(s) window_method does not have (its "
                   "options: window). Remove them from the file, or leave out --method.\n")


def test_config_file_without_k_needs_it(llm_calls, tiny_llama_path, tmp_path, capsys):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "copycat"}))
    assert main(["generate", "--model", tiny_llama_path, "--config", str(path), "x"]) == 2
    assert "num_speculative_tokens is required for method 'copycat'" in capsys.readouterr().err
    assert _config_of(llm_calls, tiny_llama_path, "--config", str(path), "-k", "2").num_speculative_tokens == 2


# --- --trust-remote-code (defect 8) ---------------------------------------------------------------


def test_trust_remote_code_reaches_llm(llm_calls, tiny_llama_path):
    _config_of(llm_calls, tiny_llama_path)
    assert llm_calls[-1]["trust_remote_code"] is False
    _config_of(llm_calls, tiny_llama_path, "--trust-remote-code")
    assert llm_calls[-1]["trust_remote_code"] is True


# --- threads and progress bars on a real run of the bundled model (defects 9, 10) ------------------


@pytest.fixture(scope="module")
def bundled_tiny():
    try:
        return specdec.bundled_model("tiny")
    except FileNotFoundError:
        pytest.skip("the bundled tiny model is not in this checkout")


@pytest.fixture
def two_threads():
    """torch starts each test with 2 intra-op threads; the conftest's 1 comes back afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield torch
    torch.set_num_threads(before)


def _run_tiny(model, *flags):
    return main(["generate", "--model", model, "--max-tokens", "2", "--json", *flags, "def f(x):"])


def test_small_model_defaults_to_one_cpu_thread(bundled_tiny, two_threads, monkeypatch):
    assert _run_tiny(bundled_tiny, "--no-progress", "--device", "cpu") == 0
    assert two_threads.get_num_threads() == 1
    two_threads.set_num_threads(2)
    assert _run_tiny(bundled_tiny, "--no-progress", "--device", "cpu", "--threads", "2") == 0
    assert two_threads.get_num_threads() == 2
    monkeypatch.setattr(cli, "_ONE_THREAD_PARAMS", 1000)  # the bundled model is now "large"
    assert _run_tiny(bundled_tiny, "--no-progress", "--device", "cpu") == 0
    assert two_threads.get_num_threads() == 2


def test_no_progress_hides_the_weight_loading_bar(bundled_tiny, capsys):
    from transformers.utils import logging as hf_logging

    assert _run_tiny(bundled_tiny) == 0
    assert "Loading weights" in capsys.readouterr().err  # the bar this test is about is shown by default
    assert _run_tiny(bundled_tiny, "--no-progress") == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "Generating" not in err
    assert hf_logging.is_progress_bar_enabled()  # switched back on for whoever runs next in this process

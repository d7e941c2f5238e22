"""Command-line mistakes end in one line, ``specdec <command>: error: <value, rule, fix>``, and exit 2 (no
traceback unless --debug); the plugin-environment variables are parsed strictly and explained.

Uses the fixture plugins tests/fixtures/specdec-plugin-copycat (entry point and method `copycat`) and
specdec-plugin-broken (entry point `broken`, fails on import).
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specdec
from specdec import cli, registry
from specdec.cli import main

_INSTALLED = {ep.name for ep in importlib_metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
needs_fixtures = pytest.mark.skipif(not {"copycat", "broken"} <= _INSTALLED,
                                    reason="fixture plugins not installed: make install")


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry that has loaded nothing, with no SPECDEC_* variable set; the original comes back afterwards."""
    monkeypatch.delenv("SPECDEC_PLUGINS", raising=False)
    monkeypatch.delenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY)  # restored on teardown
    registry._reset()


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"specdec {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, tiny_llama_path) -> Path:
    """Broken inputs: malformed config files, a binary prompt file, corrupt model directories."""
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "bad.yaml").write_text("method: [ngram\n")
    (root / "bad.json").write_text('{"method": "copycat",}')
    (root / "empty.txt").write_text("\n  \n")
    (root / "binary.txt").write_bytes(b"\xff\xfe\x00prompt")
    (root / "a-dir").mkdir()
    (root / "bad-config").mkdir()
    (root / "bad-config" / "config.json").write_text("{not json")
    (root / "bad-weights").mkdir()
    (root / "bad-weights" / "config.json").write_text((Path(tiny_llama_path) / "config.json").read_text())
    (root / "bad-weights" / "model.safetensors").write_bytes(b"garbage, not a safetensors header")
    return root


# --- defect 1: each mistake is one line and exit 2 -----------------------------------------------

GENERATE_MISTAKES = [
    (["--threads", "0"], ["--threads 0 is invalid: it must be an int >= 1"]),
    (["--threads", "-1"], ["--threads -1 is invalid: it must be an int >= 1"]),
    (["--device", "tpu"], ["--device 'tpu' is invalid: use cpu, cuda or cuda:N", "CUDA is"]),
    (["--device", "cuda:abc"], ["--device 'cuda:abc' is invalid: use cpu, cuda or cuda:N"]),
    (["--device", ""], ["--device '' is invalid"]),
    (["--device", "cuda:99"], ["--device cuda:99 is invalid: CUDA is", "use --device cpu"]),
    (["--config", "{root}/bad.yaml"], ["bad.yaml' is not valid YAML", "line 2, column 1"]),
    (["--config", "{root}/bad.json"], ["bad.json' is not valid JSON", "line 1, column"]),
    (["--config", "{root}/a-dir"], ["a-dir' is a directory: pass a JSON or YAML file"]),
    (["--file", "{root}/a-dir"], ["--file '{root}/a-dir' is a directory", "one prompt per line"]),
    (["--file", "{root}/missing.txt"], ["--file '{root}/missing.txt' does not exist"]),
    (["--file", "{root}/binary.txt"], ["--file '{root}/binary.txt' is not UTF-8 text"]),
    (["--file", "{root}/empty.txt"], ["no prompt given; pass prompts as arguments, --file FILE, or on stdin"]),
    (["--model", "{root}/bad-config"], ["bad-config"]),
    (["--model", "{root}/bad-weights"], ["bad-weights"]),
    (["--max-tokens", "-1"], ["--max-tokens -1 is invalid: it must be an int >= 1"]),
    (["--max-num-seqs", "0"], ["--max-num-seqs 0 is invalid: it must be an int >= 1"]),
    (["--max-model-len", "1"], ["--max-model-len 1 is invalid: it must be an int >= 2"]),
    (["--top-p", "2"], ["--top-p 2.0 is invalid: it must be in (0, 1]"]),
    (["--top-k", "-2"], ["--top-k -2 is invalid: it must be an int >= -1"]),
    (["--temperature", "nan"], ["--temperature nan is invalid: it must be a finite number >= 0"]),
    (["--dtype", "float8"], ["dtype='float8' is invalid"]),
    (["--method", "copycat", "-k", "0"], ["-k 0 is invalid: it must be an int >= 1"]),
    (["-k", "3"], ["need --method (or a --config that sets method)"]),
    (["--option", "foo"], ["--option 'foo' is invalid: it must look like key=value"]),
    (["--option", "=3"], ["--option '=3' is invalid: it must look like key=value"]),
    (["--method", "none", "-k", "3"], ["--method none is the baseline: it takes no --config, -k"]),
    (["--max-tokens", "many"], ["argument --max-tokens: invalid int value: 'many'"]),
]


@pytest.mark.parametrize("flags,fragments", GENERATE_MISTAKES, ids=[" ".join(f) for f, _ in GENERATE_MISTAKES])
def test_generate_mistake_is_one_line_and_exit_2(flags, fragments, bad_files, tiny_llama_path, capsys):
    root = str(bad_files)
    argv = ["generate", "--no-progress", *[f.format(root=root) for f in flags]]
    if "--model" not in argv:
        argv += ["--model", tiny_llama_path]
    if "--file" not in argv:
        argv.append("a prompt")
    assert main(argv) == 2
    line = _one_error_line(capsys, "generate")
    for fragment in fragments:
        assert fragment.format(root=root) in line


def test_unreadable_prompt_file(tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("x\n")
    real = Path.read_text

    def read_text(self, *args, **kwargs):  # chmod 000 does not stop root, so refuse the read here
        if self == prompts:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert main(["generate", "--file", str(prompts)]) == 2
    assert f"--file {str(prompts)!r} cannot be read (Permission denied)" in _one_error_line(capsys, "generate")


def test_unexpected_exception_keeps_its_type_and_points_to_debug(monkeypatch, capsys):
    class WeirdError(Exception):
        pass

    def boom(args):
        raise WeirdError("deep inside")

    monkeypatch.setattr(cli, "_run", boom)
    assert main(["methods"]) == 2
    assert _one_error_line(capsys, "methods") == ("specdec methods: error: WeirdError: deep inside (rerun with "
                                                  "--debug for the traceback)")
    with pytest.raises(WeirdError):
        main(["methods", "--debug"])
    with pytest.raises(WeirdError):
        main(["--debug", "methods"])


def test_multi_line_messages_become_one_line(monkeypatch, capsys):
    def boom(args):
        raise OSError("first line\n  second line")

    monkeypatch.setattr(cli, "_run", boom)
    assert main(["methods"]) == 2
    assert _one_error_line(capsys, "methods") == "specdec methods: error: first line second line"


def test_keyboard_interrupt_exits_130_quietly(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert main(["methods"]) == 130
    assert capsys.readouterr().err == ""
    with pytest.raises(KeyboardInterrupt):
        main(["methods", "--debug"])


def _run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=120, stdin=subprocess.DEVNULL)


def test_no_traceback_in_a_real_process(bad_files):
    proc = _run_cli("generate", "--no-progress", "--model", str(bad_files / "bad-weights"), "x")
    assert proc.returncode == 2
    assert proc.stderr.startswith("specdec generate: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    proc = _run_cli("generate", "--threads", "0", "--device", "tpu", "x")
    assert (proc.returncode, proc.stderr) == (2, "specdec generate: error: --threads 0 is invalid: it must be an "
                                                 "int >= 1 (torch CPU threads); leave it out for the default.\n")


def test_debug_prints_the_traceback_in_a_real_process():
    proc = _run_cli("generate", "--debug", "--device", "tpu", "x")
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "--device 'tpu' is invalid" in proc.stderr


# --- defect 2: --option refuses the core keys -----------------------------------------------------


@pytest.mark.parametrize("option,flag", [("method=copycat", "--method copycat"),
                                         ("num_speculative_tokens=3", "--num-speculative-tokens 3"),
                                         ("model=/ckpt", "--draft-model /ckpt"),
                                         ("on_bad_drafts=drop", "--on-bad-drafts drop")])
def test_option_refuses_core_keys(option, flag, capsys):
    assert main(["generate", "--method", "copycat", "-k", "2", "--option", option, "x"]) == 2
    line = _one_error_line(capsys, "generate")
    key = option.split("=")[0]
    assert f"--option {option!r} is refused: {key} is a core key with its own flag; use {flag}" in line


# --- defect 3: bench refuses methods that are not installed --------------------------------------


@pytest.mark.parametrize("flags,fragments", [
    (["--methods", "nope"], ["--methods names 'nope', not installed. Installed: ", "specdec methods"]),
    (["--methods", "copycat", "nope:3"], ["--methods names 'nope', not installed"]),
    (["--threads", "0"], ["--threads 0 is invalid: it must be an int >= 1"]),
    (["--temperature", "0", "nan"], ["--temperature nan is invalid"]),
    (["--model", "/no/such/model"], ["--model '/no/such/model' is not a directory"]),
    (["--draft-model", "/no/draft"], ["--draft-model '/no/draft' is not a directory"]),
    (["--device", "tpu"], ["--device 'tpu' is invalid: use cpu, cuda or cuda:N"]),
    (["-k", "0"], ["k=0 is invalid: it must be an int >= 1"]),
])
def test_bench_mistake_is_one_line_and_exit_2(flags, fragments, tmp_path, capsys):
    assert main(["bench", "--no-peers", "--no-plots", "--no-progress", "--out", str(tmp_path), *flags]) == 2
    line = _one_error_line(capsys, "bench")
    for fragment in fragments:
        assert fragment in line


@needs_fixtures
def test_bench_unknown_method_lists_installed(tmp_path, capsys):
    assert main(["bench", "--methods", "copycta", "--out", str(tmp_path)]) == 2
    assert "copycat" in _one_error_line(capsys, "bench").split("Installed: ", 1)[1]


def test_bench_unwritable_out_fails_before_running(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    import specdec_tools.bench

    def never(settings):
        raise AssertionError("the benchmark ran before --out was checked")

    monkeypatch.setattr(specdec_tools.bench, "run_benchmark", never)
    assert main(["bench", "--methods", "copycat", "--out", str(blocker / "sub")]) == 2
    assert f"--out {str(blocker / 'sub')!r} cannot be written" in _one_error_line(capsys, "bench")


# --- defect 4: SPECDEC_DISABLE_PLUGIN_AUTOLOAD and SPECDEC_PLUGINS -------------------------------


@needs_fixtures
@pytest.mark.parametrize("value", ["", "0", "false", "False", "no", "off", " OFF "])
def test_disable_autoload_false_values_load_plugins(fresh_registry, monkeypatch, value):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", value)
    assert "copycat" in specdec.available_methods()


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_disable_autoload_true_values_load_none(fresh_registry, monkeypatch, value):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", value)
    assert specdec.available_methods() == {}
    with pytest.raises(specdec.UnknownMethodError, match="SPECDEC_DISABLE_PLUGIN_AUTOLOAD=.* stops installed "
                                                         "plugins from loading: unset it"):
        specdec.get_proposer_class("copycat")


@pytest.mark.parametrize("value", ["maybe", "2", "disable"])
def test_disable_autoload_other_values_are_errors(fresh_registry, monkeypatch, value, capsys):
    monkeypatch.setenv("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", value)
    with pytest.raises(ValueError) as exc:
        specdec.available_methods()
    assert str(exc.value) == (f"SPECDEC_DISABLE_PLUGIN_AUTOLOAD={value!r} is invalid: it is a boolean; set it to 1, "
                              "true, yes or on (on), or to 0, false, no or off, or leave it empty or unset (off).")
    assert main(["methods"]) == 2
    assert "SPECDEC_DISABLE_PLUGIN_AUTOLOAD" in _one_error_line(capsys, "methods")


@needs_fixtures
def test_method_left_out_by_specdec_plugins_names_the_plugin_to_add(fresh_registry, monkeypatch):
    monkeypatch.setenv("SPECDEC_PLUGINS", "broken")
    with pytest.raises(specdec.UnknownMethodError) as exc:
        specdec.get_proposer_class("copycat")
    message = str(exc.value)
    assert message.startswith("Unknown method 'copycat': it is provided by the installed plugin 'copycat', which "
                              "SPECDEC_PLUGINS='broken' leaves out")
    assert "SPECDEC_PLUGINS=broken,copycat" in message
    assert "pip install" not in message
    assert "copycat" not in registry._REGISTRY.methods  # the allowlist still holds


@pytest.mark.skipif("ngram" not in _INSTALLED, reason="specdec-plugin-ngram not installed")
def test_method_name_in_specdec_plugins_is_explained(fresh_registry, monkeypatch):
    monkeypatch.setenv("SPECDEC_PLUGINS", "ngram_gpu")
    with pytest.warns(UserWarning, match=r"SPECDEC_PLUGINS='ngram_gpu' names \['ngram_gpu'\], which match no "
                                         r"installed plugin\. Installed plugins \(entry point names\): .*ngram"):
        with pytest.raises(specdec.UnknownMethodError) as exc:
            specdec.get_proposer_class("ngram_gpu")
    message = str(exc.value)
    assert "provided by the installed plugin 'ngram'" in message
    assert "SPECDEC_PLUGINS=ngram," in message
    assert "pip install" not in message


@needs_fixtures
def test_unknown_method_outside_the_allowlist_still_suggests_pip(fresh_registry, monkeypatch):
    monkeypatch.setenv("SPECDEC_PLUGINS", "copycat")
    with pytest.raises(specdec.UnknownMethodError, match="pip install specdec-plugin-"):
        specdec.get_proposer_class("not_a_method_anywhere")


@needs_fixtures
def test_cli_reports_a_filtered_out_method(fresh_registry, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_PLUGINS", "broken")
    assert main(["generate", "--method", "copycat", "-k", "2", "x"]) == 2
    assert "SPECDEC_PLUGINS=broken,copycat" in _one_error_line(capsys, "generate")



@pytest.mark.skipif("ngram" not in _INSTALLED, reason="specdec-plugin-ngram not installed")
def test_warnings_are_one_line_too(fresh_registry, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_PLUGINS", "ngram_gpu")
    assert main(["methods"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specdec: warning: SPECDEC_PLUGINS='ngram_gpu' names ['ngram_gpu']")

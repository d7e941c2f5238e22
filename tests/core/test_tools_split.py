"""The runtime package `specdec` and the tools beside it (`specdec_tools`: model training, the benchmark):
what `import specdec` loads, the aliases kept for documented entry points, and the benchmark reading each
method's settings from its proposer class instead of a list of plugin names."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec import Drafts, Proposer
from specdec_tools import bench

CORE = Path(__file__).resolve().parents[2] / "core"
PLUGIN_METHODS = {"ngram", "ngram_gpu", "suffix", "draft_model"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_import_specdec_loads_no_tools_plots_or_prometheus():
    proc = _python("import sys, specdec\n"
                   "print(sorted(m for m in ('specdec_tools', 'matplotlib', 'prometheus_client') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_specdec_methods_works_without_loading_the_tools():
    proc = _python("import sys\nfrom specdec.cli import main\ncode = main(['methods'])\n"
                   "print('tools loaded:', 'specdec_tools' in sys.modules, 'rc:', code)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "tools loaded: False rc: 0"


def test_bench_help_loads_the_harness_on_demand(capsys):
    from specdec.cli import main

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--methods" in out and "--method-option" in out and "bench_default" in out


def test_zoo_alias_reexports_the_recipe_and_runs_as_main():
    import specdec.zoo
    import specdec_tools.zoo

    assert specdec.zoo.__all__ == specdec_tools.zoo.__all__
    for name in specdec_tools.zoo.__all__:
        assert getattr(specdec.zoo, name) is getattr(specdec_tools.zoo, name), name
    proc = subprocess.run([sys.executable, "-m", "specdec.zoo", "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m specdec.zoo" in proc.stdout and "--preset" in proc.stdout


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module, without its docstrings (module, class, function)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_no_plugin_method_name_in_core_or_tools_code():
    """Plugins declare their own settings (Proposer.bench_options and friends): no code in specdec or
    specdec_tools names one (comments, docstrings and examples inside messages may)."""
    files = sorted((CORE / "specdec").rglob("*.py")) + sorted((CORE / "specdec_tools").rglob("*.py"))
    assert len(files) > 10
    found = [f"{path.relative_to(CORE)}:{node.lineno}: {node.value!r}" for path in files
             for node in _code_strings(ast.parse(path.read_text(encoding="utf-8"), str(path)))
             if node.value in PLUGIN_METHODS]
    assert not found, "plugin names in code (declare them on the plugin's Proposer instead):\n" + "\n".join(found)


# ---------------------------------------------------------------- the Proposer attributes the benchmark reads


@dataclass
class _KnobOptions:
    knob: int = 1


class _Base(Proposer):
    def propose(self, batch):
        return Drafts.from_lists([[] for _ in batch.req_ids], 1)


class _Quick(_Base):
    method = "tools_quick"
    Options = _KnobOptions
    bench_options = {"knob": 3}
    bench_default = frozenset({"quick", "full"})
    per_request_state = True


class _FullOnly(_Base):
    method = "tools_full"
    bench_default = frozenset({"full"})


class _WithDraft(_Base):
    method = "tools_draft"
    takes_draft_model = True


class _Unlisted(_Base):
    method = "tools_unlisted"


def test_proposer_bench_attributes_default_to_nothing_special():
    assert (Proposer.bench_options, Proposer.bench_default) == ({}, frozenset())
    assert not Proposer.per_request_state and not Proposer.takes_draft_model


def test_default_methods_are_the_ones_whose_proposer_asks(register_proposer):
    register_proposer(_Quick, _FullOnly, _WithDraft, _Unlisted)
    quick, full = bench.default_methods("quick"), bench.default_methods("full")
    assert "tools_quick" in quick and not {"tools_full", "tools_draft", "tools_unlisted"} & set(quick)
    assert {"tools_quick", "tools_full"} <= set(full) and not {"tools_draft", "tools_unlisted"} & set(full)
    with pytest.raises(ValueError, match="run='fast' is invalid: choose from quick, full"):
        bench.default_methods("fast")


def test_cli_bench_default_methods_follow_bench_default(register_proposer):
    from specdec.cli import _build_parser

    register_proposer(_Quick, _FullOnly)
    args = _build_parser().parse_args(["bench", "--no-progress"])
    settings = bench.settings_from_args(args)
    assert "tools_quick" in settings.methods and "tools_full" not in settings.methods


def test_resolve_methods_reads_bench_options_and_takes_draft_model(register_proposer):
    from specdec_tools.bench.run import resolve_methods

    register_proposer(_Quick, _WithDraft)
    s = bench.Settings(methods=["tools_quick:2", "tools_draft"], method_options={"tools_quick": {"other": 1}})
    methods, notes = resolve_methods(s, "/path/to/draft")
    by_name = {m.name: m.config for m in methods}
    assert by_name["tools_quick"] == {"method": "tools_quick", "num_speculative_tokens": 2, "knob": 3, "other": 1}
    assert by_name["tools_draft"]["model"] == "/path/to/draft" and not notes
    s = bench.Settings(methods=["tools_quick"], method_options={"tools_quick": {"knob": 7}})
    assert resolve_methods(s, None)[0][0].config["knob"] == 7  # --method-option wins over bench_options
    methods, notes = resolve_methods(bench.Settings(methods=["tools_draft"]), None)
    assert methods == [] and notes == ["tools_draft: skipped, no --draft-model given for a non-bundled --model."]


def test_resolve_methods_reads_a_speculation_policy_after_at(register_proposer):
    from specdec_tools.bench.run import resolve_methods

    register_proposer(_Quick)
    methods, _ = resolve_methods(bench.Settings(methods=["tools_quick:2@fixed", "tools_quick:2@auto",
                                                         "tools_quick:3"]), None)
    assert [m.name for m in methods] == ["tools_quick@fixed", "tools_quick@auto", "tools_quick"]
    assert [m.config.get("speculation_policy") for m in methods] == ["fixed", "auto", None]
    assert {m.config["method"] for m in methods} == {"tools_quick"}
    with pytest.raises(ValueError, match=r"method tools_quick:2@always is invalid: the part after @ is a "
                                         r"speculation policy, one of auto, fixed \(e.g. ngram:4@fixed\)."):
        resolve_methods(bench.Settings(methods=["tools_quick:2@always"]), None)
    with pytest.raises(ValueError, match="method 'tools_quick@fixed' is given twice"):
        resolve_methods(bench.Settings(methods=["tools_quick@fixed", "tools_quick:4@fixed"]), None)


@pytest.mark.parametrize("cls, kept", [(_Quick, True), (_FullOnly, False)])
def test_fresh_proposer_keeps_only_per_request_state(cls, kept, monkeypatch):
    import specdec

    made = []
    monkeypatch.setattr(specdec, "create_proposer", lambda config, target: made.append(config) or "new")
    old = object.__new__(cls)
    llm = SimpleNamespace(speculative_config=SimpleNamespace(method=cls.method), proposer=old, target=None)
    bench.fresh_proposer(llm)
    assert (llm.proposer is old) == kept and len(made) == (0 if kept else 1)


@pytest.mark.parametrize("method, per_request, draft, runs, options", [
    ("ngram", True, False, {"quick", "full"}, {"prompt_lookup_min": 2, "prompt_lookup_max": 5, "num_threads": 1}),
    ("ngram_gpu", True, False, {"full"}, {"prompt_lookup_min": 2, "prompt_lookup_max": 5}),
    ("suffix", False, False, {"quick", "full"}, {}),
    ("draft_model", True, True, {"quick", "full"}, {}),
])
def test_bundled_plugins_declare_their_benchmark_settings(method, per_request, draft, runs, options):
    """The settings the harness used to hard-code, now on each plugin's proposer (skipped without it)."""
    import specdec

    info = specdec.available_methods().get(method)
    if info is None or info.status != "ok":
        pytest.skip(f"plugin for {method} not installed")
    cls = info.proposer_class
    assert (cls.per_request_state, cls.takes_draft_model, set(cls.bench_default), cls.bench_options) == (
        per_request, draft, runs, options)


def test_resolve_methods_reads_options_of_one_entry_after_plus(register_proposer):
    """name:k@policy+key=value: the same method twice in one run with different options (a chain and a tree),
    values parsed as JSON where they parse; a + part without = is refused."""
    from specdec_tools.bench.run import resolve_methods

    register_proposer(_Quick)
    s = bench.Settings(methods=["tools_quick:2@fixed", "tools_quick:2@fixed+tree=default+depth=3"])
    methods, notes = resolve_methods(s, None)
    assert [m.name for m in methods] == ["tools_quick@fixed", "tools_quick@fixed+tree=default+depth=3"]
    assert methods[1].config == {"method": "tools_quick", "num_speculative_tokens": 2, "knob": 3,
                                 "speculation_policy": "fixed", "tree": "default", "depth": 3}
    assert "tree" not in methods[0].config and not notes
    with pytest.raises(ValueError, match=r"method tools_quick:2\+tree is invalid: options after \+ look like "
                                         r"key=value"):
        resolve_methods(bench.Settings(methods=["tools_quick:2+tree"]), None)

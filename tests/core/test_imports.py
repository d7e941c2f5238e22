"""specdec's modules import each other without cycles (issue 19).

The graph is read from the source with ``ast``: every ``import``/``from ... import`` of a specdec module,
at the top of a module or inside a function, is an edge. Imports under ``if TYPE_CHECKING:`` are left
out (they never run). ``from specdec import X`` is an edge to the module that defines ``X`` (read from
``specdec/__init__.py``: its imports and its ``_LAZY`` table), or to the submodule ``X``. A module's
parent packages are not edges: every ``import specdec.x`` runs ``specdec/__init__.py`` first, which
imports most of the package, so counting them would put every module in one cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import specdec

ROOT = Path(specdec.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, skipping ``if TYPE_CHECKING:`` bodies."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module a ``from X import ...`` reads from, with relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _root_names(modules: dict[str, Path], package: str) -> dict[str, str]:
    """Name exported by the package (``specdec``) -> the module of it that defines the name."""
    tree = ast.parse(modules[package].read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            names.update((alias.asname or alias.name, node.module) for alias in node.names)
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
            names.update(ast.literal_eval(node.value))
    return names


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its closest enclosing module that is a specdec module (None outside specdec)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module of the package at ``root`` (specdec) -> the package's modules it imports at run time
    (anywhere in its body)."""
    package = root.name
    modules = _modules(root)
    root_names = _root_names(modules, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            else:
                source = _absolute(node, name, is_package)
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in modules:  # from specdec import metrics: the submodule
                        targets.append(sub)
                    elif source == package and alias.name in root_names:  # from specdec import LLM
                        targets.append(root_names[alias.name])
                    else:
                        targets.append(_known(source, modules))
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None when the graph is acyclic (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_graph_reader_sees_every_kind_of_import():
    graph = import_graph()
    assert {"specdec", "specdec.config", "specdec.registry", "specdec.kernels.rejection_triton"} <= set(graph)
    assert "specdec.config" in graph["specdec"]  # from specdec.config import ... (top level)
    assert "specdec.metrics" in graph["specdec"]  # from specdec import metrics (a submodule)
    assert "specdec.hookspecs" in graph["specdec.registry"]  # from specdec import hookspecs
    # A lazy import inside a function still counts: the sampler picks the Triton kernels on first use.
    assert "specdec.kernels.rejection_triton" in graph["specdec.rejection_sampler"]


def test_graph_reader_on_a_small_package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import A\n_LAZY = {'Late': 'pkg.late'}\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\nA = 1\n",
        "b.py": "def f():\n    from . import c\n    import pkg.sub.d\n",
        "c.py": "from pkg import A, Late\n",
        "late.py": "import json\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..c import x\nfrom .e import y\n",
        "sub/e.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert import_graph(pkg) == {
        "pkg": {"pkg.a"},
        "pkg.a": set(),  # TYPE_CHECKING imports never run
        "pkg.b": {"pkg.c", "pkg.sub.d"},  # inside a function, relative and dotted
        "pkg.c": {"pkg.a", "pkg.late"},  # names the package exports, eagerly or through _LAZY
        "pkg.late": set(),
        "pkg.sub": set(),
        "pkg.sub.d": {"pkg.c", "pkg.sub.e"},
        "pkg.sub.e": set(),
    }


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_specdec_import_graph_is_acyclic():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "specdec modules import each other in a cycle: " + " -> ".join(cycle)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


ENGINE_PARTS = ["specdec.requests", "specdec.scheduler", "specdec.token_buffer", "specdec.verify"]


def test_engine_parts_never_reach_the_engine():
    """The engine's parts (docs/engine.md) are imported by the loop, never the other way round; the
    scheduler decides over request state alone (no model, no engine: it imports no specdec module)."""
    graph = import_graph()
    for part in ENGINE_PARTS:
        assert part in graph["specdec.engine"]
        assert "specdec.engine" not in _reachable(graph, part), f"{part} imports specdec.engine"
    assert graph["specdec.scheduler"] == set()


PUBLIC_MODULES = ["config", "registry", "trainers", "target", "cuda_graphs", "rejection_sampler", "engine", "proposer",
                  "metadata", "sampling", "requests", "scheduler", "token_buffer", "verify"]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_module_imports_on_its_own(module):
    """Each public module imports first in a fresh interpreter (no import order hides a cycle)."""
    result = subprocess.run([sys.executable, "-c", f"import specdec.{module}"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"import specdec.{module} failed:\n{result.stderr}"


# --- the cycle config -> registry -> config is gone: a config looks its method up once ------------


@dataclass(frozen=True)
class _CountedOptions:
    window: int = 3


class _CountedProposer(specdec.Proposer):
    method = "imports_counted_method"
    Options = _CountedOptions

    def propose(self, batch):
        return specdec.Drafts.empty(batch.batch_size)


class _CountedPlugin:
    @specdec.hookimpl
    def specdec_register_proposers(self, register):
        register(_CountedProposer)


@pytest.fixture
def counted_lookups(monkeypatch):
    """Registers ``imports_counted_method`` by hand and counts the registry's method lookups."""
    from specdec import registry

    name = specdec.register_plugin(_CountedPlugin(), name="imports_counted")
    calls: list[str] = []
    real = registry.get_proposer_class
    monkeypatch.setattr(registry, "get_proposer_class", lambda method: calls.append(method) or real(method))
    yield calls
    specdec.unregister_plugin(name)


def test_config_looks_its_method_up_once(counted_lookups):
    config = specdec.SpeculativeConfig.from_dict({"method": "imports_counted_method", "num_speculative_tokens": 2,
                                                  "window": 5})
    assert counted_lookups == ["imports_counted_method"]
    assert config.window == 5 and config.to_dict()["window"] == 5
    proposer = specdec.create_proposer(config.to_dict())  # a dict: one more config, then the proposer
    assert isinstance(proposer, _CountedProposer) and proposer.options == _CountedOptions(window=5)


def test_registry_create_proposer_takes_a_built_config(counted_lookups):
    from specdec import registry

    config = specdec.SpeculativeConfig(method="imports_counted_method", num_speculative_tokens=2)
    assert isinstance(registry.create_proposer(config), _CountedProposer)
    with pytest.raises(TypeError, match=r"pass the dict to specdec\.create_proposer"):
        registry.create_proposer({"method": "imports_counted_method", "num_speculative_tokens": 2})

"""No plugin reaches into the core's private names (issue 19).

Plugins build on the public runtime (``specdec.ModelRunner``, ``specdec.cuda_graphs``, ``specdec.layout``...),
so the core can change its internals without breaking them. Read from the source with ``ast``, for
every plugin in ``plugins/`` and every third-party fixture in ``tests/fixtures/``:

- no ``from specdec... import _name`` and no import of a ``specdec`` module whose name starts with ``_``;
- no attribute ``obj._name`` (dunders aside) unless the plugin's own package defines ``_name`` (a method,
  a class attribute, a ``self._name`` assignment, a slot): a private name the plugin did not define is
  someone else's internals, the core's or a library's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p for p in [*REPO.glob("plugins/*/specdec_*"), *REPO.glob("tests/fixtures/*/specdec_*")]
                  if p.is_dir())


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_private_names(trees: list[ast.AST]) -> set[str]:
    """Private names a package defines itself: functions, classes, attributes it assigns, slots."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Name):
                            names.add(t.id)
                        elif isinstance(t, ast.Attribute):
                            names.add(t.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)  # __slots__ entries, setattr names
    return {n for n in names if _private(n)}


def _violations(package: Path) -> list[str]:
    files = sorted(package.rglob("*.py"))
    trees = [ast.parse(f.read_text(), filename=str(f)) for f in files]
    own = _defined_private_names(trees)
    found = []
    for f, tree in zip(files, trees):
        where = f.relative_to(package.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "specdec":
                if any(_private(part) for part in node.module.split(".")):
                    found.append(f"{where}:{node.lineno}: imports private module {node.module}")
                found += [f"{where}:{node.lineno}: imports {a.name} from {node.module}" for a in node.names
                          if _private(a.name)]
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno}: imports private module {a.name}" for a in node.names
                          if a.name.split(".")[0] == "specdec" and any(_private(p) for p in a.name.split("."))]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{where}:{node.lineno}: uses {ast.unparse(node)}, a private name it does not define")
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_plugin_uses_only_public_names(package: Path) -> None:
    assert _violations(package) == []


def test_the_check_sees_every_plugin_and_catches_a_private_reach(tmp_path: Path) -> None:
    assert {p.name for p in PACKAGES} >= {"specdec_ngram", "specdec_suffix", "specdec_draft_model"}
    pkg = tmp_path / "specdec_bad"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from specdec.cuda_graphs import _Graph\n"
        "import specdec._hidden\n"
        "class P:\n"
        "    def __init__(self, target):\n"
        "        self._mine = 1\n"
        "        self._mine += target._run(self._mine)\n"
    )
    assert [v.split(": ", 1)[1] for v in _violations(pkg)] == [
        "imports _Graph from specdec.cuda_graphs",
        "imports private module specdec._hidden",
        "uses target._run, a private name it does not define",
    ]

"""The README's examples run as written (the plugin example and the Python quickstart)."""

from __future__ import annotations

import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import specdec
from specdec import LLM, SamplingParams

README = (Path(__file__).parents[2] / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _plugin_source() -> str:
    return next(b for b in _python_blocks() if "specdec_register_proposers" in b)


def test_plugin_example_registers_and_is_lossless(tiny_llama_path):
    module = types.ModuleType("readme_plugin")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(_plugin_source(), "README.md", "exec"), module.__dict__)
    # A reader who pip-installed the example has "mymethod" registered already: test under another name.
    proposer = next(v for v in vars(module).values() if isinstance(v, type) and issubclass(v, specdec.Proposer)
                    and v is not specdec.Proposer)
    proposer.method = "test_readme_example"
    name = specdec.register_plugin(module, name="readme-plugin")
    try:
        prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11]]
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        base = LLM(tiny_llama_path, dtype="float32").generate(prompts, params)
        llm = LLM(tiny_llama_path, {"method": "test_readme_example", "num_speculative_tokens": 3}, dtype="float32")
        assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in base]
        assert llm.stats.num_drafts > 0
    finally:
        specdec.unregister_plugin(name)
        del sys.modules[module.__name__]


def test_python_quickstart_runs(capsys):
    source = next(b for b in _python_blocks() if "bundled_model" in b and "LLM(" in b)
    exec(compile(source, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "length" in out  # finish_reason printed by the example


def test_plugin_example_builds_as_written(tmp_path):
    """The README's pyproject.toml and module, laid out as it says, build a wheel whose metadata
    names the distribution and the entry point (what `pip install .` installs)."""
    toml = re.search(r"```toml\n(.*?)```", README, flags=re.S).group(1)
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "specdec_myplugin").mkdir()
    (tmp_path / "specdec_myplugin" / "__init__.py").write_text(_plugin_source())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(tmp_path)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("specdec_plugin_myplugin-0.1.0-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "specdec_myplugin/__init__.py" in names
    assert "[specdec]\nmyplugin = specdec_myplugin" in entry_points


def test_every_document_the_code_cites_is_in_the_repository():
    """Docstrings and configs once cited a design document that only lived outside the repository."""
    root = Path(__file__).parents[2]
    files = [p for pattern in ("core/**/*.py", "plugins/**/*.py", "tests/**/*.py", "benchmarks/*.py", "**/*.toml",
                               "*.md", "docs/*.md", "plugins/*/README.md")
             for p in root.glob(pattern) if ".venv" not in p.parts]
    cited = set()
    for f in files:
        text = f.read_text(encoding="utf-8")
        outside = [name for name in ("DESIGN", "FORMATS") if f"{name}.md" in text]
        assert not outside, (f, outside)
        cited |= set(re.findall(r"\bdocs/[\w.-]+\.md\b", text))
    assert "docs/design.md" in cited
    missing = sorted(c for c in cited if not (root / c).is_file())
    assert not missing, missing


ROOT = Path(__file__).parents[2]
LINKED_DOCS = ["README.md", "benchmarks/README.md", *sorted(p.relative_to(ROOT).as_posix()
                                                            for p in (ROOT / "docs").glob("*.md"))]


def _links(text: str) -> list[str]:
    """Targets of markdown links and images, `[..](target)` and `![..](target)`, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`(?:[^`\n]|\n(?!\n))+`", "", text)  # a code span may wrap, never past a blank line
    return re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)


def _relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I) and not target.startswith("#")


def _slugs(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6}\s+(.*?)\s*#*$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_readme_is_a_front_door_under_200_lines():
    """The run-by-run benchmark narrative lives in benchmarks/README.md, engine details in docs/."""
    lines = README.count("\n")
    assert lines < 200, f"README.md has {lines} lines; move detail to benchmarks/README.md or docs/"


def test_relative_links_resolve_to_files_in_the_repository():
    """Every relative link and image in README.md, benchmarks/README.md and docs/*.md names a file (or a
    folder, which GitHub lists) inside the repository, resolved from the linking file's folder."""
    assert "docs/engine.md" in LINKED_DOCS
    broken, checked = [], 0
    for doc in LINKED_DOCS:
        for target in filter(_relative, _links((ROOT / doc).read_text(encoding="utf-8"))):
            checked += 1
            path = ((ROOT / doc).parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(ROOT.resolve()) or not path.exists():
                broken.append(f"{doc}: {target}")
    assert checked > 20  # the regex still finds links
    assert not broken, "links that resolve to nothing in the repository:\n" + "\n".join(broken)


def test_link_anchors_name_a_heading():
    """`file.md#section` links land on a heading of that file (GitHub's slugs)."""
    broken = []
    for doc in LINKED_DOCS:
        for target in filter(_relative, _links((ROOT / doc).read_text(encoding="utf-8"))):
            path, _, anchor = target.partition("#")
            if anchor and path.endswith(".md"):
                linked = ((ROOT / doc).parent / path).resolve()
                if linked.is_file() and anchor not in _slugs(linked.read_text(encoding="utf-8")):
                    broken.append(f"{doc}: {target}")
    assert not broken, "anchors that name no heading:\n" + "\n".join(broken)


def test_link_checker_sees_broken_links():
    text = ("[a](docs/design.md) ![p](no/such.png) [w](https://x.org) [s](#top) `[c](not/a/link)` [d](docs/)"
            " `a span\nthat wraps`, [`e`](e.md)")
    assert list(filter(_relative, _links(text))) == ["docs/design.md", "no/such.png", "docs/", "e.md"]
    assert "h200" in _slugs("# Benchmarks\n\n## H200\n") and "writing-a-plugin" in _slugs("## Writing a plugin")

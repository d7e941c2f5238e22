"""Loading never runs code from a model directory (DESIGN section 8): a directory whose auto_map points at
its own Python files is refused with the flag that allows it, for the target, its tokenizer and a
draft model; nothing prompts on a terminal; and with trust_remote_code=True the code does run."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdec import LLM, SpeculativeConfig, bundled_model

REFUSED = r"needs to run its own Python code to load \(.*\); .*trust_remote_code=True.*--trust-remote-code"

_CONFIG_PY = '''
import pathlib
pathlib.Path({ran!r}, "configuration_evil.py").write_text("ran")
from transformers import LlamaConfig


class EvilConfig(LlamaConfig):
    model_type = "specdec-evil"
'''
_MODELING_PY = '''
import pathlib
pathlib.Path({ran!r}, "modeling_evil.py").write_text("ran")
from transformers import LlamaForCausalLM

from .configuration_evil import EvilConfig


class EvilForCausalLM(LlamaForCausalLM):
    config_class = EvilConfig
'''
_TOKENIZER_PY = '''
import pathlib
pathlib.Path({ran!r}, "tokenization_evil.py").write_text("ran")
from transformers import PreTrainedTokenizerFast


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
'''


def _ran(d: Path) -> list[str]:
    """The files of ``d`` that were executed (each writes its name into ``d/../ran-<name>``)."""
    ran = d.parent / f"ran-{d.name}"
    return sorted(p.name for p in ran.iterdir())


def _edit_json(file: Path, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _remote_model(src: str, d: Path) -> Path:
    """A copy of ``src`` whose architecture is only defined by Python files in it (auto_map)."""
    shutil.copytree(src, d)
    ran = d.parent / f"ran-{d.name}"
    ran.mkdir()
    _edit_json(d / "config.json", model_type="specdec-evil", architectures=["EvilForCausalLM"],
               auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                         "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (d / "configuration_evil.py").write_text(_CONFIG_PY.format(ran=str(ran)))
    (d / "modeling_evil.py").write_text(_MODELING_PY.format(ran=str(ran)))
    return d


def _tokenizer_source() -> Path:
    try:
        return Path(bundled_model("tiny-draft"))
    except FileNotFoundError as exc:
        pytest.skip(f"needs the bundled tokenizer files: {exc}")


def _remote_tokenizer(d: Path, model: str | None = None) -> Path:
    """A tokenizer (in a copy of ``model``, or alone) whose class is only in tokenization_evil.py."""
    if model is not None:
        shutil.copytree(model, d)
    else:
        d.mkdir()
    ran = d.parent / f"ran-{d.name}"
    ran.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(_tokenizer_source() / name, d / name)
    _edit_json(d / "tokenizer_config.json", tokenizer_class="EvilTokenizer",
               auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
    (d / "tokenization_evil.py").write_text(_TOKENIZER_PY.format(ran=str(ran)))
    return d


@pytest.fixture
def terminal(monkeypatch):
    """stdin is a terminal and anyone who asks gets "y": the worst case for transformers' prompt."""
    import builtins
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompts: list[str] = []
    monkeypatch.setattr(sys, "stdin", Terminal("y\n" * 8))
    monkeypatch.setattr(builtins, "input", lambda prompt="": prompts.append(prompt) or "y")
    return prompts


def test_target_needing_remote_code_is_refused_and_its_code_never_runs(tiny_llama_path, tmp_path, terminal):
    d = _remote_model(tiny_llama_path, tmp_path / "evil-target")
    with pytest.raises(ValueError, match=re.escape(f"model directory {str(d)!r}") + ".*" + REFUSED):
        LLM(str(d), dtype="float32")
    assert _ran(d) == [] and terminal == []


def test_tokenizer_needing_remote_code_is_refused_and_its_code_never_runs(tiny_llama_path, tmp_path, terminal):
    in_model = _remote_tokenizer(tmp_path / "evil-tok-in-model", tiny_llama_path)
    with pytest.raises(ValueError, match=re.escape(f"tokenizer directory {str(in_model)!r}") + ".*" + REFUSED):
        LLM(str(in_model), dtype="float32")
    alone = _remote_tokenizer(tmp_path / "evil-tok")
    with pytest.raises(ValueError, match=re.escape(f"tokenizer directory {str(alone)!r}") + ".*" + REFUSED):
        LLM(tiny_llama_path, dtype="float32", tokenizer=str(alone))
    assert _ran(in_model) == [] and _ran(alone) == [] and terminal == []


def test_draft_needing_remote_code_is_refused_and_its_code_never_runs(tiny_llama_path, tiny_llama_draft_path,
                                                                     tmp_path, terminal):
    pytest.importorskip("specdec_draft_model")
    d = _remote_model(tiny_llama_draft_path, tmp_path / "evil-draft")
    config = SpeculativeConfig(method="draft_model", model=str(d), num_speculative_tokens=2)
    with pytest.raises(ValueError, match=re.escape(f"model directory {str(d)!r}") + ".*" + REFUSED):
        LLM(tiny_llama_path, config, dtype="float32")
    assert _ran(d) == [] and terminal == []


def _python(code: str, tmp_path: Path, *args: str, stdin: int | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, offline, with transformers' module cache under ``tmp_path``."""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], stdin=stdin, capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)


def test_no_prompt_on_a_real_terminal(tiny_llama_path, tmp_path):
    """stdin is a pseudo-terminal with "y" already typed: transformers, asked nothing explicit, would prompt
    and read it; specdec must refuse without prompting or reading, and the code must not run."""
    d = _remote_model(tiny_llama_path, tmp_path / "evil-pty")
    code = """
        import sys
        from specdec import LLM
        assert sys.stdin.isatty()
        try:
            LLM(sys.argv[1], dtype="float32")
        except ValueError as exc:
            print("REFUSED:", exc)
    """
    controller, terminal = os.openpty()
    try:
        os.write(controller, b"y\n")
        proc = _python(code, tmp_path, str(d), stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[y/N]" not in proc.stdout + proc.stderr
    assert re.search(REFUSED, proc.stdout), proc.stdout[-3000:]
    assert _ran(d) == []


def test_trust_remote_code_true_runs_the_directory_code(tiny_llama_path, tiny_llama_draft_path, tmp_path):
    """The opt-in works: the same directories load, through their own classes, once it is given."""
    target = _remote_model(tiny_llama_path, tmp_path / "trusted-target")
    tokenizer = _remote_tokenizer(tmp_path / "trusted-tok")
    draft = _remote_model(tiny_llama_draft_path, tmp_path / "trusted-draft")
    code = """
        import sys
        from specdec import HFTargetModel, SpeculativeConfig
        from specdec.loading import load_tokenizer

        target, tokenizer, draft, llm = sys.argv[1:]
        t = HFTargetModel(target, dtype="float32", device="cpu", trust_remote_code=True)
        t.allocate(1)
        print("target", type(t.hf_model).__name__, tuple(t.forward([0], [[2, 3, 4]], [1]).logits.shape))
        print("tokenizer", type(load_tokenizer(tokenizer, trust_remote_code=True)).__name__)
        try:
            from specdec_draft_model.proposer import DraftModelProposer
        except ImportError:
            pass
        else:
            config = SpeculativeConfig(method="draft_model", model=draft, num_speculative_tokens=2)
            print("draft", type(DraftModelProposer(config, t).draft.hf_model).__name__)
        if llm == "1":
            from specdec import LLM, SamplingParams
            out = LLM(target, dtype="float32", trust_remote_code=True).generate([[2, 3]], SamplingParams(max_tokens=3))
            print("llm", len(out[0].token_ids))
    """
    with_llm = "trust_remote_code" in inspect.signature(LLM).parameters
    proc = _python(code, tmp_path, str(target), str(tokenizer), str(draft), "1" if with_llm else "0",
                   stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "target EvilForCausalLM (1, 96)" in proc.stdout
    assert "tokenizer EvilTokenizer" in proc.stdout
    assert _ran(target) == ["configuration_evil.py", "modeling_evil.py"]
    assert _ran(tokenizer) == ["tokenization_evil.py"]
    if importlib.util.find_spec("specdec_draft_model") is not None:
        assert "draft EvilForCausalLM" in proc.stdout and _ran(draft) == ["configuration_evil.py", "modeling_evil.py"]
    if with_llm:
        assert "llm 3" in proc.stdout

"""The README's examples run as written (the plugin example and the Python quickstart)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import specdec
from specdec import LLM, SamplingParams

README = (Path(__file__).parents[2] / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_plugin_example_registers_and_is_lossless(tiny_llama_path):
    source = next(b for b in _python_blocks() if "specdec_register_proposers" in b)
    module = types.ModuleType("readme_plugin")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, "README.md", "exec"), module.__dict__)
    name = specdec.register_plugin(module, name="readme-plugin")
    try:
        prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11]]
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        base = LLM(tiny_llama_path, dtype="float32").generate(prompts, params)
        llm = LLM(tiny_llama_path, {"method": "mymethod", "num_speculative_tokens": 3}, dtype="float32")
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

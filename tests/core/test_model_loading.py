"""Loading models and tokenizers: a module passed in is left as it is unless a change was asked for; a
bad tokenizer argument or a broken model directory is refused with an error naming it and the fix."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from specdec import LLM, HFTargetModel, SamplingParams, bundled_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _hf(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)  # in eval mode, as from_pretrained returns it


def _state(model) -> list[tuple[str, torch.dtype, torch.device, int]]:
    return [(n, p.dtype, p.device, p.data_ptr()) for n, p in model.named_parameters()]


# ---------------------------------------------------------------- a module passed in


def test_module_keeps_its_dtype_device_and_mode(tiny_llama_path):
    hf = _hf(tiny_llama_path, torch.bfloat16)
    before = _state(hf)
    llm = LLM(hf, max_num_seqs=2)
    assert _state(hf) == before and not hf.training  # same tensors, not copies or conversions
    assert llm.target.hf_model is hf and llm.target.dtype == torch.bfloat16 and llm.target.device.type == "cpu"
    outs = llm.generate([[2, 3, 4], [5, 6]], GREEDY)
    assert [len(o.token_ids) for o in outs] == [4, 4]
    assert _state(hf) == before


def test_module_is_converted_in_place_when_a_dtype_is_asked_for(tiny_llama_path):
    hf = _hf(tiny_llama_path, torch.bfloat16)
    llm = LLM(hf, dtype="float32", max_num_seqs=1)
    assert llm.target.hf_model is hf and llm.target.dtype == torch.float32
    assert {p.dtype for p in hf.parameters()} == {torch.float32}  # documented: nn.Module.to, in place
    assert len(llm.generate([[2, 3, 4]], GREEDY)[0].token_ids) == 4


def test_module_in_training_mode_is_refused_untouched(tiny_llama_path):
    hf = _hf(tiny_llama_path, torch.bfloat16).train()
    before = _state(hf)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM is in training mode .*call model\.eval\(\) before"):
        LLM(hf, dtype="float32")
    assert hf.training and _state(hf) == before


# ---------------------------------------------------------------- tokenizer argument


def test_tokenizer_argument_that_is_not_a_tokenizer_is_refused(tiny_llama_path, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer path '/nonexistent' does not exist: pass the directory "
                                                r"tokenizer\.save_pretrained wrote"):
        LLM(tiny_llama_path, tokenizer="/nonexistent")
    with pytest.raises(ValueError, match=re.escape(f"tokenizer path {str(tmp_path)!r} holds no tokenizer "
                                                   "(tokenizer.json, tokenizer_config.json, tokenizer.model)")):
        HFTargetModel(tiny_llama_path, tokenizer=str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        HFTargetModel(tiny_llama_path, tokenizer=tmp_path / "tokenizer.json")
    with pytest.raises(TypeError, match=r"tokenizer=42 \(int\) is invalid: pass a tokenizer object"):
        LLM(tiny_llama_path, tokenizer=42)


def test_tokenizer_path_loads(tiny_llama_path):
    try:
        tokenizer_dir = bundled_model("tiny-draft")
    except FileNotFoundError as exc:
        pytest.skip(f"needs the bundled tokenizer files: {exc}")
    t = HFTargetModel(tiny_llama_path, dtype="float32", device="cpu", tokenizer=tokenizer_dir)
    assert t.tokenizer is not None and t.tokenizer.decode(t.tokenizer.encode("def f")) == "def f"


def test_corrupt_tokenizer_files_are_refused(tiny_llama_path, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": ')
    with pytest.raises(ValueError, match=r"tokenizer config '.*tokenizer_config\.json' is not valid JSON"):
        HFTargetModel(tiny_llama_path, tokenizer=str(tmp_path))
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ValueError, match=re.escape(f"tokenizer at {str(tmp_path)!r} could not be loaded")):
        HFTargetModel(tiny_llama_path, tokenizer=str(tmp_path))


# ---------------------------------------------------------------- broken model directories


def _edit_config(d: Path, **changes) -> None:
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    (d / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def _cut_weights(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _foreign_weights(d: Path) -> None:
    from safetensors.torch import save_file

    save_file({"encoder.weight": torch.zeros(4, 4)}, d / "model.safetensors", metadata={"format": "pt"})


def _sharded_without_a_shard(d: Path) -> None:
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


BROKEN = {
    "config not JSON": (lambda d: (d / "config.json").write_text('{"model_type": "llama",'),
                        r"model config '.*config\.json' is not valid JSON \(.* at line 1 column \d+\)"),
    "config a list": (lambda d: (d / "config.json").write_text("[1, 2]"),
                      r"config\.json' holds a JSON list, not an object"),
    "no model_type": (lambda d: _edit_config(d, model_type=None),
                      r"config\.json' has model_type=None: it needs the architecture's name there"),
    "unknown model_type": (lambda d: _edit_config(d, model_type="no-such-arch"),
                           r"model_type='no-such-arch', an architecture transformers .* does not know: upgrade"),
    "weights cut short": (_cut_weights, r"weights file 'model\.safetensors' of model directory .* is truncated: its "
                                        r"header describes \d+ bytes, the file has \d+"),
    "weights garbage": (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64),
                        r"'model\.safetensors' of model directory .* is not a safetensors file or is cut short"),
    "weights header garbage": (lambda d: (d / "model.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"not json"),
                               r"'model\.safetensors' of model directory .* has a corrupt header"),
    "weights of another model": (_foreign_weights, r"its weights lack \d+ of the model's tensors \(e\.g\. \['lm_head"
                                                   r"\.weight'.*which transformers would fill with random values"),
    "weights missing": (lambda d: (d / "model.safetensors").unlink(),
                        r"could not be loaded: .*no file named model\.safetensors.*\(OSError\)"),
    "a shard missing": (_sharded_without_a_shard,
                        r"lacks weight shards \['model-00002-of-00002\.safetensors'\] listed in model\.safetensors"),
    "config disagrees with weights": (lambda d: _edit_config(d, intermediate_size=96),
                                      r"the shapes of its weights do not match its config\.json"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_model_directory_is_refused_naming_it(tiny_llama_path, tmp_path, case):
    break_it, message = BROKEN[case]
    d = tmp_path / "model"
    shutil.copytree(tiny_llama_path, d)
    break_it(d)
    with pytest.raises(ValueError, match=message) as err:
        LLM(str(d), dtype="float32")
    assert str(d) in str(err.value)


def test_model_path_that_is_a_file_is_refused(tiny_llama_path):
    weights = str(Path(tiny_llama_path) / "model.safetensors")
    with pytest.raises(ValueError, match=re.escape(f"model path {weights!r} is a file, not a directory: pass the "
                                                   "directory that holds config.json")):
        LLM(weights)

"""Loading a local Hugging Face model directory (and its tokenizer) without surprises.

Every Hugging Face call here passes ``trust_remote_code`` explicitly: with False, transformers
never imports the directory's own Python files and never asks on stdin (its ``[y/N]`` prompt only
appears when the argument is left out). A directory that needs its own code is refused with the
flag that allows it, and a broken directory (bad JSON, no ``model_type``, cut or foreign weights)
is refused with what is wrong with it, before transformers gets a chance to fail deep inside.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["load_causal_lm", "load_tokenizer", "has_tokenizer_files", "check_model_dir", "check_weights",
           "read_json_object", "read_state_dict", "REMOTE_CODE_FIX"]

REMOTE_CODE_FIX = ("if you trust the Python files in it, pass LLM(..., trust_remote_code=True) "
                   "(CLI: specdec generate --trust-remote-code)")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_RESAVE = "re-save the model with save_pretrained (or copy it again)"


def _remote_code_error(what: str, path: str, why: str) -> ValueError:
    return ValueError(f"{what} {path!r} needs to run its own Python code to load ({why}); specdec does not run "
                      f"code from a model directory unless asked: {REMOTE_CODE_FIX}.")


def read_json_object(file: Path, what: str) -> dict[str, Any]:
    """``file`` as a JSON object, or a ValueError saying why it is not one."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(file)!r} is not text (not UTF-8): the file is corrupt; {_RESAVE}.") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {str(file)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}): the file is corrupt or cut short; {_RESAVE}.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} {str(file)!r} holds a JSON {type(data).__name__}, not an object: it must "
                         f"map keys to values; {_RESAVE}.")
    return data


def check_model_dir(path: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """The parsed config.json of model directory ``path``; raises with the fix when the path is missing,
    not a directory, has no usable config, or needs remote code that was not allowed."""
    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"model path {path!r} does not exist. Pass a local directory saved with save_pretrained "
            "(config.json + weights); specdec never downloads from a hub. The bundled model is "
            "specdec.bundled_model('tiny')."
        )
    if not p.is_dir():
        raise ValueError(f"model path {path!r} is a file, not a directory: pass the directory that holds "
                         "config.json and the weights (the folder save_pretrained wrote).")
    if not (p / "config.json").is_file():
        raise ValueError(f"model path {path!r} has no config.json: it is not a Hugging Face model directory.")
    config = read_json_object(p / "config.json", "model config")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model config {str(p / 'config.json')!r} has model_type={model_type!r}: it needs the "
                         "architecture's name there (e.g. \"llama\", \"qwen3\"); add it or " + _RESAVE + ".")
    if model_type not in CONFIG_MAPPING:
        if config.get("auto_map") and not trust_remote_code:
            raise _remote_code_error("model directory", path,
                                     f"config.json has model_type={model_type!r}, which transformers does not "
                                     f"have built in, and an auto_map {config['auto_map']!r}")
        if not config.get("auto_map"):
            raise ValueError(f"model at {path!r} has model_type={model_type!r}, an architecture transformers "
                             f"{__version__} does not know: upgrade transformers, or fix model_type in config.json.")
    return config


def _check_safetensors(file: Path, path: str) -> None:
    """Refuse a safetensors file whose header is unreadable or whose tensors run past its end."""
    size = file.stat().st_size
    bad = f"weights file {file.name!r} of model directory {path!r}"
    with file.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise ValueError(f"{bad} is not a safetensors file or is cut short ({size} bytes, "
                             f"no complete header): {_RESAVE}.")
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ValueError(f"{bad} has a corrupt header (not the JSON tensor table safetensors writes): "
                             f"{_RESAVE}.") from None
    if 8 + n + end > size:
        raise ValueError(f"{bad} is truncated: its header describes {8 + n + end} bytes, the file has {size}; "
                         f"{_RESAVE}.")


def check_weights(path: str) -> None:
    """Check the safetensors weights of ``path`` (single file or shards) are complete; other formats are
    left to transformers (``.bin`` files are read with ``torch.load(weights_only=True)``)."""
    p = Path(path)
    files = [p / "model.safetensors"] if (p / "model.safetensors").is_file() else []
    index = p / "model.safetensors.index.json"
    if not files and index.is_file():
        weight_map = read_json_object(index, "weights index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"weights index {str(index)!r} has no weight_map object: {_RESAVE}.")
        files = [p / name for name in sorted(set(map(str, weight_map.values())))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"model directory {path!r} lacks weight shards {missing} listed in "
                             f"{index.name}: copy every shard, or {_RESAVE}.")
    for file in files:
        _check_safetensors(file, path)


def read_state_dict(path: str, what: str = "head") -> dict[str, torch.Tensor]:
    """The tensors of a draft head's directory ``path`` (``what`` names it in errors: "head", "draft"):
    ``model.safetensors`` or its shards (checked with :func:`check_weights` first), else ``pytorch_model.bin``
    read only through ``torch.load(weights_only=True)``, which refuses pickles that would run code."""
    p = Path(path)
    if (p / "model.safetensors").is_file() or (p / "model.safetensors.index.json").is_file():
        from safetensors.torch import load_file

        check_weights(path)
        files = [p / "model.safetensors"]
        if not files[0].is_file():
            index = read_json_object(p / "model.safetensors.index.json", "weights index")
            files = sorted({p / f for f in index["weight_map"].values()})
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    if (p / "pytorch_model.bin").is_file():
        try:
            state = torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as exc:  # weights_only refuses pickles that would run code: say so
            raise ValueError(f"{what} weights {str(p / 'pytorch_model.bin')!r} could not be read with "
                             f"torch.load(weights_only=True) ({type(exc).__name__}: {str(exc).splitlines()[0]}): "
                             f"specdec never unpickles arbitrary objects; re-save the {what} as "
                             "model.safetensors.") from None
        if not isinstance(state, dict):
            raise ValueError(f"{what} weights {str(p / 'pytorch_model.bin')!r} hold a {type(state).__name__}, not a "
                             "state dict of tensors.")
        return state
    raise ValueError(f"{what} directory {path!r} has no weights: expected model.safetensors (or shards with "
                     "model.safetensors.index.json) or pytorch_model.bin.")


def _load_failed(path: str, exc: BaseException) -> ValueError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(f"model directory {path!r} could not be loaded: {first} ({type(exc).__name__}). Check that "
                      f"config.json matches the weights and every weights file is complete; {_RESAVE}.")


def load_causal_lm(path: str, dtype: torch.dtype, trust_remote_code: bool = False, **extra: Any) -> nn.Module:
    """``AutoModelForCausalLM`` from local directory ``path`` in ``dtype`` (eval mode), after the checks
    above; the directory's own code runs only with ``trust_remote_code=True``. ``extra``: further
    ``from_pretrained`` arguments (tensor parallelism: :func:`specdec.tp.tp_load_kwargs`)."""
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = check_model_dir(path, trust_remote_code)
    check_weights(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        model, info = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                           trust_remote_code=trust_remote_code,
                                                           output_loading_info=True, **extra)
    except ValueError as exc:
        msg = str(exc)
        if "trust_remote_code" in msg:
            raise _remote_code_error("model directory", path,
                                     f"auto_map {raw.get('auto_map')!r} in config.json") from None
        if "Unrecognized configuration class" in msg or "AutoModelForCausalLM" in msg:
            raise ValueError(
                f"model at {path!r} (model_type={raw['model_type']!r}) is not a causal language model: "
                "specdec needs a decoder-only model loadable with AutoModelForCausalLM (Llama, Qwen2/3, ...)."
            ) from exc
        raise _load_failed(path, exc) from exc
    except (OSError, SafetensorError, pickle.UnpicklingError, EOFError) as exc:
        raise _load_failed(path, exc) from exc
    except RuntimeError as exc:  # shape mismatches; anything else (a device error) is not the directory's fault
        if "mismatch" not in str(exc):
            raise
        raise ValueError(f"model directory {path!r}: the shapes of its weights do not match its config.json "
                         f"(transformers logged which tensors above): the config was edited or belongs to another "
                         f"model; {_RESAVE}.") from exc
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        # transformers would fill these with random values and carry on: a model that looks fine and is not.
        raise ValueError(f"model directory {path!r}: its weights lack {len(missing)} of the model's tensors "
                         f"(e.g. {missing[:3]}), which transformers would fill with random values; the weights "
                         f"are incomplete or belong to another model: {_RESAVE}.")
    return model.eval()


def has_tokenizer_files(path: str) -> bool:
    """Whether directory ``path`` holds any of the files a tokenizer is saved as."""
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def _check_tokenizer_code(path: str, tokenizer_config: dict[str, Any]) -> None:
    """Refuse a tokenizer whose class is only in the directory's own code (``auto_map``)."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    auto_map = tokenizer_config.get("auto_map")
    ref = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else auto_map
    if not ref:
        return
    name = tokenizer_config.get("tokenizer_class")
    built_in = None
    if isinstance(name, str):
        built_in = tokenizer_class_from_name(name) or tokenizer_class_from_name(name + "Fast")
    if built_in is None or not built_in.__module__.startswith("transformers."):
        raise _remote_code_error("tokenizer directory", path,
                                 f"tokenizer_config.json names tokenizer_class={name!r}, which transformers "
                                 f"does not have built in, and an auto_map {ref!r}")


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` from local directory ``path``; raises with the fix when the path is missing, holds
    no tokenizer, is corrupt, or needs remote code that was not allowed."""
    from transformers import AutoTokenizer

    p = Path(path)
    fix = ("pass the directory tokenizer.save_pretrained wrote, a loaded tokenizer, or tokenizer=None "
           "(the tokenizer saved with the model, if any)")
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {path!r} does not exist: {fix}.")
    if not p.is_dir():
        raise ValueError(f"tokenizer path {path!r} is a file, not a directory: {fix}.")
    if not has_tokenizer_files(path):
        raise ValueError(f"tokenizer path {path!r} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): {fix}.")
    if (p / "tokenizer_config.json").is_file():
        tokenizer_config = read_json_object(p / "tokenizer_config.json", "tokenizer config")
        if not trust_remote_code:
            _check_tokenizer_code(path, tokenizer_config)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # the tokenizers backend raises bare Exceptions for a bad tokenizer.json
        if isinstance(exc, ValueError) and "trust_remote_code" in str(exc):
            raise _remote_code_error("tokenizer directory", path,
                                     "its tokenizer is defined by code in the directory") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(f"tokenizer at {path!r} could not be loaded: {first} ({type(exc).__name__}); "
                         "re-save it with tokenizer.save_pretrained.") from exc

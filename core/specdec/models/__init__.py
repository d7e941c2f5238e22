"""Models bundled with specdec: `tiny` (target) and `tiny-draft` (its draft), both trained by `specdec.zoo`,
and draft heads for `tiny` trained by their plugins (`tiny-eagle3`, `tiny-eagle`: specdec-plugin-eagle's recipes;
`tiny-medusa`: specdec-plugin-medusa's; `tiny-dflash`: specdec-plugin-dflash's).

A language model's folder holds what `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` read, plus the
model card (README.md) and the metrics.json it is rendered from; a head's folder holds its published layout
(config.json, model.safetensors) and its card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BUNDLED_LMS = ("tiny", "tiny-draft")
BUNDLED_HEADS = ("tiny-eagle3", "tiny-eagle", "tiny-medusa", "tiny-dflash")
BUNDLED_MODELS = BUNDLED_LMS + BUNDLED_HEADS
REBUILD_COMMAND = "python -m specdec.zoo --preset tiny tiny-draft --out core/specdec/models --device cuda"
HEAD_REBUILD_COMMANDS = {
    "tiny-eagle3": "python -m specdec_eagle.train_bundled --out core/specdec/models/tiny-eagle3 --steps 1800 "
                   "--megabytes 4",
    "tiny-eagle": "python -m specdec_eagle.train_bundled --method eagle --out core/specdec/models/tiny-eagle "
                  "--steps 800 --megabytes 3",
    "tiny-medusa": "python -m specdec_medusa.train_bundled --out core/specdec/models/tiny-medusa --steps 240",
    "tiny-dflash": "python -m specdec_dflash.train_bundled --out core/specdec/models/tiny-dflash --steps 900 "
                   "--threads 1",
}
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_HEAD_FILES = ("config.json", "model.safetensors")


def bundled_model(name: str = "tiny") -> str:
    """Local path of a bundled model, ready for `from_pretrained` or `specdec.LLM(model=...)`."""
    if name not in BUNDLED_MODELS:
        raise ValueError(f"Unknown bundled model {name!r}. Available: {', '.join(BUNDLED_MODELS)}.")
    path = Path(__file__).resolve().parent / name
    head = name in BUNDLED_HEADS
    missing = [f for f in (_HEAD_FILES if head else _REQUIRED_FILES) if not (path / f).is_file()]
    if missing:
        module = HEAD_REBUILD_COMMANDS[name].split()[2] if head else ""  # specdec_<plugin>.train_bundled
        plugin = module.split(".")[0].replace("specdec_", "specdec-plugin-")
        how = (f"(CPU, a few minutes, with {plugin} installed): {HEAD_REBUILD_COMMANDS[name]}" if head
               else f"(GPU, a few minutes): {REBUILD_COMMAND}")
        raise FileNotFoundError(f"Bundled model {name!r} is incomplete: {', '.join(missing)} missing in {path}. "
                                f"Rebuild it from a source checkout {how}")
    return str(path)


def bundled_default(target: Any, name: str) -> str | None:
    """``bundled_model(name)`` when ``target`` (a :class:`specdec.TargetModel`) runs the bundled ``tiny``: the
    default draft or head a method offers it (``tiny-draft``, ``tiny-eagle3``, ``tiny-eagle``, ``tiny-medusa``,
    ``tiny-dflash``).
    None for any other target, and in a source checkout whose bundled models were not built; an incomplete
    ``name`` folder raises as :func:`bundled_model` does, with the command that rebuilds it."""
    try:
        tiny = bundled_model("tiny")
    except FileNotFoundError:
        return None
    if target is None or Path(str(target.model_name)).resolve() != Path(tiny).resolve():
        return None
    return bundled_model(name)

"""Models bundled with specdec: `tiny` (target) and `tiny-draft` (its draft), both trained by `specdec.zoo`.

Each folder holds what `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` read, plus the model
card (README.md) and the metrics.json it is rendered from.
"""

from __future__ import annotations

from pathlib import Path

BUNDLED_MODELS = ("tiny", "tiny-draft")
REBUILD_COMMAND = "python -m specdec.zoo --preset tiny tiny-draft --out core/specdec/models --device cuda"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def bundled_model(name: str = "tiny") -> str:
    """Local path of a bundled model, ready for `from_pretrained` or `specdec.LLM(model=...)`."""
    if name not in BUNDLED_MODELS:
        raise ValueError(f"Unknown bundled model {name!r}. Available: {', '.join(BUNDLED_MODELS)}.")
    path = Path(__file__).resolve().parent / name
    missing = [f for f in _REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Bundled model {name!r} is incomplete: {', '.join(missing)} missing in {path}. "
            f"Rebuild the bundled models from a source checkout (GPU, a few minutes) with: {REBUILD_COMMAND}"
        )
    return str(path)

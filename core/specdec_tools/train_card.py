"""The model card of a head trained by ``specdec train``: metrics.json (what was measured) and README.md
(rendered from it), written beside the head."""

from __future__ import annotations

import platform
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["collect_metrics", "render_card", "write_card"]


def collect_metrics(trainer: Any, data: Any, *, run_settings: dict[str, Any], history: list[dict[str, Any]],
                    timing: dict[str, Any], device: str, resumed_from: int | None, split: tuple[int, int],
                    command: str | None) -> dict[str, Any]:
    """Everything the card shows, as plain JSON values."""
    import torch
    import transformers

    import specdec

    target = trainer.target
    options = trainer.options
    last = history[-1] if history else {}
    cls = type(trainer)
    return {
        "method": trainer.method,
        "trainer": f"{cls.__module__}.{cls.__qualname__}",
        "head": trainer.describe(),
        "options": asdict(options) if is_dataclass(options) and not isinstance(options, type) else {},
        "target": {"path": target.path, "model_type": getattr(target.config, "model_type", None),
                   "num_layers": target.num_layers, "hidden_size": target.hidden_size,
                   "vocab_size": target.vocab_size},
        "hidden_states": trainer.hidden_keys(),
        "data": {**data.describe(), "train_sequences": split[0], "held_out_sequences": split[1]},
        "training": {**run_settings, "device": device,
                     "precision": "bf16 autocast" if device != "cpu" else "float32", **timing,
                     "resumed_from_step": resumed_from},
        "held_out": {k: v for k, v in last.items() if k not in ("step", "train_loss")},
        "eval_history": history,
        "versions": {"specdec": specdec.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
        "command": command,
    }


def _fmt(x: Any, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def render_card(m: dict[str, Any]) -> str:
    t, d, tr, h = m["target"], m["data"], m["training"], m["held_out"]
    if d["kind"] == "online":
        data = (f"{d['tokens']:,} tokens of text from {len(d['files'])} file(s) ({', '.join(d['files'][:5])}"
                f"{', ...' if len(d['files']) > 5 else ''}), cut into {d['sequences']} windows of {d['seq_len']} "
                f"tokens; hidden states computed by the target ({d['target_dtype']}) inside the training loop.")
    else:
        data = (f"shards written by `specdec extract` in `{d['path']}`: {d['sequences']} sequences"
                f"{', ' + format(d['tokens'], ',') + ' tokens' if d.get('tokens') else ''}, hidden states in "
                f"{d.get('dtype') or 'their stored dtype'} (extracted from `{d.get('target')}`).")
    share = tr.get("target_forward_share")
    step_ms = tr["mean_step_seconds"] * 1e3 if tr.get("mean_step_seconds") else None
    in_target = f", {share:.0%} of it in the target forward" if share is not None else ""
    timing = f"{tr['seconds']} s in all; mean step {_fmt(step_ms, '.1f')} ms{in_target}"
    resumed = f" Resumed from the checkpoint of step {tr['resumed_from_step']}." if tr.get("resumed_from_step") else ""
    lines = [
        f"# `{m['method']}` head for `{Path(t['path']).name}`, trained by `specdec train`",
        "",
        f"- **Head**: {m['head']} (`{m['trainer']}`), options {m['options'] or 'none'}.",
        f"- **Target**: `{t['path']}` ({t['model_type']}, {t['num_layers']} layers, hidden size {t['hidden_size']}, "
        f"vocabulary {t['vocab_size']}); features: hidden states {', '.join(m['hidden_states']) or 'none'}.",
        f"- **Data**: {data} Held out for the metrics below: {d['held_out_sequences']} sequences, chosen by a fixed "
        f"hash of their index (never trained on); {d['train_sequences']} for training.",
        f"- **Training**: AdamW (betas 0.9/0.95, weight decay {tr['weight_decay']:g} on matrices), peak learning rate "
        f"{tr['lr']:g}, {tr['warmup']} warm-up steps then cosine decay to 10%, gradient clipping {tr['grad_clip']:g}, "
        f"{tr['steps']} steps of {tr['batch_size']} sequences, seed {tr['seed']}, {tr['precision']} on "
        f"{tr['device']}: {timing}.{resumed}",
        "",
        "## Held-out acceptance estimate",
        "",
        "Top-1 agreement of the head's draft at each position with the target's own greedy token there, given the "
        "true prefix; *accepted prefix* is the share of positions where every draft up to that one agrees (what a "
        "greedy chain would accept). An estimate: real decoding drafts from the target's own outputs.",
        "",
        "| draft position | agreement | accepted prefix |",
        "|---|---|---|",
        *(f"| {j + 1} | {a:.3f} | {p:.3f} |" for j, (a, p) in
          enumerate(zip(h.get("acceptance_per_position", []), h.get("accepted_prefix_per_position", [])))),
        "",
        "Estimated mean acceptance length (1 + sum of accepted prefixes): "
        f"{_fmt(h.get('mean_acceptance_length'), '.3f')} over {h.get('positions', 0):,} held-out positions; "
        f"held-out loss {_fmt(h.get('loss'))}.",
        "",
        "## Held-out loss",
        "",
        "| step | train loss (smoothed) | held-out loss | est. mean acceptance length |",
        "|---|---|---|---|",
        *(f"| {e['step']} | {_fmt(e['train_loss'])} | {_fmt(e['loss'])} | {_fmt(e['mean_acceptance_length'], '.3f')} |"
          for e in m["eval_history"]),
        "",
        "## Versions and command",
        "",
        ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
    ]
    if m.get("command"):
        lines += ["```", m["command"], "```", ""]
    return "\n".join(lines)


def write_card(out: str | Path, metrics: dict[str, Any]) -> None:
    (Path(out) / "README.md").write_text(render_card(metrics), encoding="utf-8")

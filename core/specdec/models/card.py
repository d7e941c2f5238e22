"""The model card (README.md) of a model trained by `specdec.zoo`, rendered from its metrics.json."""

from __future__ import annotations

from pathlib import Path


def _row(split: str, m: dict) -> str:
    return f"| {split} | {m['loss']:.3f} | {m['accuracy']:.3f} | {m['tokens']:,} |"


def _sample(python: str, s: dict) -> list[str]:
    return [
        f"## Greedy continuation of held-out code ({python}, `{s['file']}`)",
        "",
        "Prompt (it ends mid-line on purpose: a prompt ending in a newline makes the model dedent):",
        "```python",
        s["prompt"],
        "```",
        "Continuation (greedy, 64 tokens):",
        "```python",
        s["continuation"].rstrip("\n"),
        "```",
        "",
    ]


def render_card(info: dict) -> str:
    p, d, t = info["preset"], info["data"], info["training"]
    role = "target model" if p["name"] == p["family"] else f"draft model (for `{p['family']}`)"
    sources = "standard library" + (" and site-packages" if p["site_packages"] else "")
    autocast = "bf16 autocast, " if t["device"] != "cpu" else ""
    rows = [_row(f"{k} (Python {d['python']})", m) for k, m in info["metrics"].items()]
    rows += [_row(f"held-out ({k})", m) for k, m in info.get("evaluations", {}).items()]
    arch = (
        f"`LlamaForCausalLM`, {p['num_layers']} layer(s), hidden size {p['hidden_size']}, {p['num_heads']} "
        f"attention heads ({p['num_kv_heads']} key/value), MLP {p['intermediate_size']}, tied embeddings, "
        f"context {p['seq_len']} tokens; {info['params']:,} parameters "
        f"({info['non_embedding_params']:,} outside the embedding), saved in {p['save_dtype']}: "
        f"`model.safetensors` is {info['safetensors_bytes'] / 2**20:.2f} MiB."
    )
    tokenizer = (
        f"byte-level BPE (Hugging Face `tokenizers`), {d['tokenizer_vocab']} tokens; `<|endoftext|>` ends "
        f"each file. Trained on the train split only; every `{p['family']}` model uses the same one."
    )
    data = (
        f"the `.py` files of the {sources} of Python {d['python']} (`{d['stdlib']}`), without test "
        f"directories, files over 512 KiB or duplicate contents, split by a hash of each file's path: "
        f"{d['files']['train']} train files ({d['tokens']['train']:,} tokens), {d['files']['valid']} valid "
        f"(to choose the checkpoint), {d['files']['held-out']} held-out ({d['tokens']['held-out']:,} tokens, "
        f"used for nothing but the metrics below)."
    )
    dropout = f"dropout {p['dropout']:g} on the embedding, attention and MLP outputs, " * bool(p["dropout"])
    training = (
        f"AdamW (betas 0.9/0.95, weight decay 0.1), peak learning rate {p['lr']:g}, {p['warmup']} warmup "
        f"steps then cosine decay to 10%, batches of {p['batch_size']} random {p['seq_len']}-token windows, "
        f"{dropout}{_copy(p)}seed {t['seed']}, {autocast}{t['device']}: {t['steps']} steps "
        f"({t['tokens_seen']:,} tokens, {t['epochs']} epochs) in {t['train_seconds']} s; the checkpoint of "
        f"step {t['best_step']} had the lowest valid loss and is the one saved. torch "
        f"{info['versions']['torch']}, transformers {info['versions']['transformers']}, tokenizers "
        f"{info['versions']['tokenizers']}."
        + (f" Distilled from `{t['teacher']}`: loss = {1 - p['distill_weight']:g} x cross-entropy on the data + "
           f"{p['distill_weight']:g} x cross-entropy against `{t['teacher']}`'s next-token distribution; held-out "
           f"greedy agreement with it: {info['metrics']['held-out']['agreement_with_teacher']:.3f}."
           if t.get("teacher") else "")
    )
    return "\n".join([
        f"# specdec `{p['name']}`: a {info['params'] / 1e6:.2f}M-parameter Llama trained on Python source",
        "",
        f"The {role} of specdec's own model family, trained from scratch by `specdec.zoo` so that",
        "speculative decoding can be shown, tested and benchmarked offline. It writes Python-looking code",
        "and is good for nothing else.",
        "",
        f"- **Architecture**: {arch}",
        f"- **Tokenizer**: {tokenizer}",
        f"- **Data**: {data}",
        f"- **Training**: {training}",
        "",
        "## Metrics",
        "",
        f"Next-token loss (nats) and greedy next-token accuracy over non-overlapping {p['seq_len']}-token",
        "windows of each split, with the float32 weights loaded from this folder (train: a random sample of",
        "train windows as large as the held-out set).",
        "",
        "| split | loss | accuracy | tokens |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        *_copy_metric(info),
        "The split is a property of each file's path, so the held-out files of another Python version (rows",
        "`held-out (Python X.Y.Z)`, added by `python -m specdec.zoo --eval DIR` run with that Python) were",
        "not trained on either.",
        "",
        *[line for key, sample in info["samples"].items() for line in _sample(key, sample)],
        "## Rebuild",
        "",
        "```",
        info["rebuild"],
        "```",
        "",
        "The same command, data and software give the same split and tokenizer; GPU training is not",
        "bitwise deterministic. The recipe is `specdec/zoo.py`; the data is Python's own source (PSF",
        "license).",
        "",
    ])


def _copy_metric(info: dict) -> list[str]:
    held = info["metrics"]["held-out"]
    if "copy_accuracy" not in held:
        return []
    return [f"Copy accuracy (held-out): {held['copy_accuracy']:.3f}, the greedy accuracy over the second half of",
            f"windows made of a held-out span of {info['preset']['seq_len'] // 2} tokens twice.", ""]


def _copy(p: dict) -> str:
    share = p.get("copy_fraction", 0.0)
    if not share:
        return ""
    return (f"{share:.0%} of each batch copy windows (a window's first 1/8 to 1/2, then the window again from "
            "its start: a passage and its repeat, as code corpora hold), ")


def write_card(out: Path, info: dict) -> None:
    (Path(out) / "README.md").write_text(render_card(info))

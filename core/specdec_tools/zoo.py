"""Train specdec's own model family on Python source: a byte-level BPE and small Llama models.

The bundled pair (`tiny`, `tiny-draft`, shipped in `specdec/models/`) and the benchmark pair
(`bench`, `bench-draft`, built on demand, never committed) are rebuilt with one command::

    python -m specdec.zoo --preset tiny tiny-draft --out core/specdec/models --device cuda
    python -m specdec.zoo --preset bench bench-draft --out /tmp/zoo --device cuda

Data: the `.py` files of the running Python's standard library (bench presets add its
site-packages), split into train / valid / held-out by a hash of each file's relative path, so the
same path lands in the same split on every machine and Python version. `valid` picks the
checkpoint; `held-out` is only ever used for the reported metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specdec.models.card import write_card

__all__ = ["EOS", "HELD_OUT_PERCENT", "MAX_FILE_BYTES", "PRESETS", "Preset", "VALID_PERCENT", "agreement",
           "build_model", "build_one", "check_saved", "collect_files", "copy_accuracy", "copy_windows",
           "encode_files", "evaluate", "evaluate_here", "greedy_sample", "hash_sample", "main", "prepare_family",
           "save_model", "source_roots", "split_of", "train", "train_tokenizer"]

EOS = "<|endoftext|>"
HELD_OUT_PERCENT = 5  # hash bucket < 5 -> held-out
VALID_PERCENT = 4  # 5 <= bucket < 9 -> valid (checkpoint selection)
MAX_FILE_BYTES = 512 * 1024  # larger .py files are generated tables or prose (pydoc_data/topics.py)
SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}
# generated lookup tables rather than code (encodings/cp*.py): they would inflate the metrics
GENERATED_MARKERS = ("Python Character Mapping Codec",)


@dataclass(frozen=True, slots=True)
class Preset:
    """One model of the family: architecture, data and training schedule."""

    name: str
    family: str  # presets of one family share the tokenizer (and the corpus)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup: int = 100
    eval_every: int = 100
    site_packages: bool = False
    corpus_mb: float = 0.0  # 0 = every train file; else a hash-ordered sample of this many MB
    tokenizer_mb: float = 64.0  # text the BPE is trained on (hash-ordered sample of train files)
    dropout: float = 0.0  # on embedding, attention and MLP outputs while training (not in the saved model)
    save_dtype: str = "float16"
    max_minutes: float = 0.0  # 0 = no limit; else the step count is cut to fit (printed)
    # A draft distilled from its target: when the preset named here is built earlier in the same run,
    # the loss is (1 - w) * CE(data) + w * CE(teacher's next-token distribution), w = distill_weight.
    teacher: str | None = None
    distill_weight: float = 0.9
    # Share of each training batch made of copy windows (see copy_windows): real code corpora repeat
    # passages (vendored files, edited copies), and models trained on them copy long spans; a few
    # minutes of training on deduplicated files does not teach it. 0 = plain windows only.
    copy_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"preset {self.name}: heads must divide hidden_size, kv heads must divide heads")
        if not 0.0 <= self.copy_fraction <= 1.0:
            raise ValueError(f"preset {self.name}: copy_fraction={self.copy_fraction!r} must lie in [0, 1]")


# columns: name, family, hidden, layers, heads, kv heads, MLP, vocab, seq len, batch, steps, peak LR
PRESETS = {
    p.name: p
    for p in (
        Preset("micro", "micro", 32, 1, 2, 2, 64, 512, 64, 4, 4, 3e-3, warmup=1, eval_every=2, dropout=0.1,
               copy_fraction=0.5),
        Preset("micro-draft", "micro", 16, 1, 2, 1, 32, 512, 64, 4, 4, 3e-3, warmup=1, eval_every=2,
               teacher="micro"),
        # A 2048-token context, so a grounded edit of a real file fits (issue 20: 709-token prompts did not
        # fit in 512); 16 windows a batch keep the tokens per step of the earlier 64 x 512. A quarter of
        # the target's batches are copy windows (it repeats passages it has seen, as code models do); the
        # draft, distilled from it, gets half, as bench-draft does.
        Preset("tiny", "tiny", 256, 4, 4, 2, 512, 4096, 2048, 16, 1500, 3e-3, dropout=0.2, copy_fraction=0.25),
        Preset("tiny-draft", "tiny", 96, 2, 3, 3, 256, 4096, 2048, 16, 3000, 4e-3, dropout=0.1, teacher="tiny",
               copy_fraction=0.5),
        Preset("bench", "bench", 768, 12, 12, 12, 2304, 16384, 2048, 32, 3000, 1e-3, warmup=100,
               eval_every=250, site_packages=True, corpus_mb=256, save_dtype="bfloat16", max_minutes=3.0,
               copy_fraction=0.25),
        # Two layers: on a GPU a small model's forward costs per layer (kernel launches), not per
        # parameter, so the draft is shallow and as wide as it can be at the same speed.
        # Half its batches are copy windows: with a quarter (2026-12-01) it copied poorly (held-out copy
        # accuracy 0.37 against the target's 0.88) and its drafts missed wherever the target repeats.
        Preset("bench-draft", "bench", 512, 2, 8, 8, 1536, 16384, 2048, 32, 3000, 2e-3, warmup=100,
               eval_every=250, site_packages=True, corpus_mb=256, save_dtype="bfloat16", max_minutes=2.0,
               teacher="bench", copy_fraction=0.5),
    )
}


# ---------------------------------------------------------------- corpus


def split_of(rel: str) -> str:
    """'train', 'valid' or 'held-out', from a hash of the relative path (stable across machines)."""
    bucket = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") % 100
    if bucket < HELD_OUT_PERCENT:
        return "held-out"
    return "valid" if bucket < HELD_OUT_PERCENT + VALID_PERCENT else "train"


def _walk_py(root: Path, prefix: str) -> list[tuple[str, Path]]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((prefix + path.relative_to(root).as_posix(), path))
    return found


def source_roots(site_packages: bool) -> list[tuple[str, Path]]:
    """(prefix, root) of the running Python's stdlib and, optionally, its site-packages."""
    paths = sysconfig.get_paths()
    roots = [("", Path(paths["stdlib"]))]
    if site_packages:
        for key in ("purelib", "platlib"):
            root = Path(paths[key])
            if root.is_dir() and all(r != root for _, r in roots):
                roots.append(("site-packages/", root))
    return roots


def collect_files(site_packages: bool = False) -> dict[str, list[tuple[str, str]]]:
    """Sorted `(relative path, text)` per split; duplicate contents are kept once (first path)."""
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "valid": [], "held-out": []}
    seen: set[bytes] = set()
    files = sorted(f for prefix, root in source_roots(site_packages) for f in _walk_py(root, prefix))
    for rel, path in files:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        digest = hashlib.sha256(text.encode()).digest()
        if not text.strip() or digest in seen or any(m in text[:500] for m in GENERATED_MARKERS):
            continue
        seen.add(digest)
        splits[split_of(rel)].append((rel, text))
    return splits


def hash_sample(files: list[tuple[str, str]], megabytes: float) -> list[tuple[str, str]]:
    """A deterministic sample of about `megabytes` of text drawn in hash order, returned sorted."""
    if megabytes <= 0:
        return files
    budget, picked = megabytes * 2**20, []
    for rel, text in sorted(files, key=lambda f: hashlib.sha256(b"sample:" + f[0].encode()).digest()):
        if budget <= 0:
            break
        picked.append((rel, text))
        budget -= len(text)
    return sorted(picked)


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 pre-tokenisation, so indentation runs become tokens), HF-wrapped."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with tokenizers_parallel():
        tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS)


def encode_files(tokenizer, texts: list[str], chunk: int = 512) -> np.ndarray:
    """All texts as one int32 stream, each file followed by EOS. The batches are encoded on every core (the
    tokenizers library's thread pool) even where ``TOKENIZERS_PARALLELISM=false`` is set to quiet its warnings
    about forks (the GPU scripts set it): the bench corpus took 161 s on one core of the H200's host."""
    backend, eos = tokenizer.backend_tokenizer, tokenizer.eos_token_id
    parts = []
    with tokenizers_parallel():
        for i in range(0, len(texts), chunk):
            for enc in backend.encode_batch_fast(texts[i : i + chunk], add_special_tokens=False):
                parts.append(np.asarray(enc.ids + [eos], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


@contextlib.contextmanager
def tokenizers_parallel() -> Iterator[None]:
    """The tokenizers library's thread pool on for the block (``TOKENIZERS_PARALLELISM=true``, read at each call;
    the setting before it restored after)."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


# ---------------------------------------------------------------- model, training, evaluation


def build_model(preset: Preset, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    if len(tokenizer) > preset.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, preset {preset.name} {preset.vocab_size}")
    config = LlamaConfig(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        max_position_embeddings=preset.seq_len,
        tie_word_embeddings=True,  # the embedding is most of a small model; drafters may share it
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


def _lr(step: int, preset: Preset, total: int) -> float:
    if step < preset.warmup:
        return preset.lr * (step + 1) / preset.warmup
    progress = min(1.0, (step - preset.warmup) / max(1, total - preset.warmup))
    return preset.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def copy_windows(batch: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Rows of ``batch`` ([b, T+1] token windows) that repeat their own start: row i becomes its first
    ``lengths[i]`` tokens, then the window again from its beginning (a copy of those tokens, then
    the text that followed them), cut to T+1 tokens. The shape of "a file, then the file again"."""
    j = torch.arange(batch.shape[1], device=batch.device)
    src = torch.where(j[None, :] < lengths[:, None], j[None, :], j[None, :] - lengths[:, None])
    return batch.gather(1, src)


@torch.no_grad()
def copy_accuracy(model, tokens, seq_len: int, max_windows: int = 64, batch_size: int = 16) -> float:
    """Greedy next-token accuracy over the second half of windows built as ``x x`` (a held-out span x
    of seq_len / 2 tokens, twice): how well the model copies text it has just seen."""
    device = next(model.parameters()).device
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device)
    half = seq_len // 2
    starts = _windows(tokens, half)[:max_windows]
    was_training, correct, count = model.training, 0, 0
    model.eval()
    for i in range(0, len(starts), batch_size):
        x = tokens[starts[i : i + batch_size] + torch.arange(half, device=device)]  # [b, half]
        logits = model(input_ids=torch.cat([x, x], 1)).logits  # [b, 2 * half, V]
        # position half - 1 + j predicts x[j] (its copy); the first prediction has nothing to copy yet
        pred = logits[:, half:-1].argmax(-1)
        correct += (pred == x[:, 1:]).sum().item()
        count += pred.numel()
    model.train(was_training)
    return correct / max(1, count)


def _windows(tokens: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = (tokens.numel() - 1) // seq_len
    return torch.arange(n, device=tokens.device)[:, None] * seq_len


@torch.no_grad()
def evaluate(model, tokens, seq_len: int, max_windows: int = 0, seed: int | None = None,
             autocast: bool = False, batch_size: int = 32) -> dict:
    """Mean next-token loss and accuracy over non-overlapping `seq_len` windows of a token stream.

    `max_windows` caps the work: the first windows, or a seeded random subset when `seed` is given.
    `autocast` runs CUDA models in bf16 (progress evals); reported metrics use the weights' dtype.
    """
    device = next(model.parameters()).device
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device)
    starts = _windows(tokens, seq_len)
    if max_windows and len(starts) > max_windows:
        if seed is None:
            starts = starts[:max_windows]
        else:
            g = torch.Generator().manual_seed(seed)
            starts = starts[torch.randperm(len(starts), generator=g)[:max_windows].to(device)]
    was_training, loss_sum, correct, count = model.training, 0.0, 0, 0
    model.eval()
    offsets = torch.arange(seq_len + 1, device=device)
    for i in range(0, len(starts), batch_size):
        batch = tokens[starts[i : i + batch_size] + offsets]  # [b, T+1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast and device.type == "cuda"):
            logits = model(input_ids=batch[:, :-1]).logits.float()  # [b, T, V]
        y = batch[:, 1:]
        loss_sum += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train(was_training)
    return {"loss": loss_sum / max(1, count), "accuracy": correct / max(1, count), "tokens": count}


def _add_dropout(model, p: float) -> list:
    """Residual dropout through forward hooks, so the saved model stays a plain `LlamaForCausalLM`.

    The stdlib is only ~2M tokens: the tiny models see it many times and overfit without it.
    """
    def hook(module, args, out):
        if isinstance(out, tuple):  # attention returns (output, weights)
            return (F.dropout(out[0], p, module.training), *out[1:])
        return F.dropout(out, p, module.training)

    modules = [model.model.embed_tokens]
    for layer in model.model.layers:
        modules += [layer.self_attn, layer.mlp]
    return [m.register_forward_hook(hook) for m in modules] if p > 0 else []


def train(model, preset: Preset, train_tokens: np.ndarray, valid_tokens: np.ndarray, device: str, seed: int,
          steps: int, max_minutes: float, teacher=None) -> dict:
    """AdamW + warmup/cosine on random windows; keeps the checkpoint with the lowest valid loss.
    With a ``teacher`` model (same vocabulary) the loss mixes in its next-token distributions."""
    dev = torch.device(device)
    model.to(dev).train()
    if teacher is not None:
        teacher.to(dev).eval()
    data = torch.as_tensor(train_tokens, device=dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=preset.lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    offsets = torch.arange(preset.seq_len + 1, device=dev)
    total, limit, step, seen = steps, max_minutes * 60.0, 0, 0
    best = {"loss": math.inf, "step": 0, "state": None}
    hooks = _add_dropout(model, preset.dropout)
    num_copy = round(preset.copy_fraction * preset.batch_size)
    t0 = t_mark = time.perf_counter()
    while step < total:
        for group in opt.param_groups:
            group["lr"] = _lr(step, preset, total)
        high = data.numel() - preset.seq_len - 1
        starts = torch.randint(0, high, (preset.batch_size,), device=dev, generator=gen)
        batch = data[starts[:, None] + offsets].long()  # [B, T+1]
        if num_copy:
            lengths = torch.randint(preset.seq_len // 8, preset.seq_len // 2 + 1, (num_copy,), device=dev,
                                    generator=gen)
            batch[:num_copy] = copy_windows(batch[:num_copy], lengths)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = model(input_ids=batch[:, :-1]).logits  # [B, T, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        if teacher is not None:
            loss = (1 - preset.distill_weight) * loss + preset.distill_weight * _distill_loss(logits, teacher, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, seen = step + 1, seen + batch[:, 1:].numel()
        if limit and step in (5, 25) and dev.type == "cuda":
            torch.cuda.synchronize()  # time the GPU, not how far ahead the host has queued
        if step == 5:  # the first steps include allocator and kernel warm-up
            t_mark = time.perf_counter()
        if limit and step == 25:
            per_step = (time.perf_counter() - t_mark) / 20 * 1.08  # ~8% for the periodic evals
            fit = max(step, step + int((limit - (time.perf_counter() - t0)) / per_step))
            if fit < total:
                print(f"[{preset.name}] {max_minutes:g} min budget: {fit} steps, not {total}", flush=True)
                total = fit
        out_of_time = bool(limit) and time.perf_counter() - t0 > limit
        if step % preset.eval_every == 0 or step == total or out_of_time:
            elapsed = time.perf_counter() - t0
            val = evaluate(model, valid_tokens, preset.seq_len, max_windows=256, autocast=True)
            if val["loss"] < best["loss"]:
                best = {"loss": val["loss"], "step": step, "state": copy.deepcopy(model.state_dict())}
            print(f"[{preset.name}] step {step}/{total} loss {loss.item():.3f} valid {val['loss']:.3f} "
                  f"acc {val['accuracy']:.3f} lr {_lr(step - 1, preset, total):.2e} "
                  f"tok/s {seen / elapsed:,.0f} elapsed {elapsed:.0f}s", flush=True)
        if out_of_time:
            print(f"[{preset.name}] stopped by the {max_minutes:g} min budget at step {step}", flush=True)
            break
    train_seconds = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    return {"steps": step, "best_step": best["step"], "train_seconds": round(train_seconds, 1),
            "tokens_seen": seen, "epochs": round(seen / max(1, len(train_tokens)), 2)}


def _distill_loss(logits: torch.Tensor, teacher, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the student's ``logits`` against the teacher's next-token distributions."""
    with torch.no_grad(), torch.autocast(batch.device.type, dtype=torch.bfloat16, enabled=batch.device.type == "cuda"):
        target = torch.softmax(teacher(input_ids=batch[:, :-1]).logits.float(), -1)
    return -(target * torch.log_softmax(logits.float(), -1)).sum(-1).mean()


@torch.no_grad()
def agreement(draft, target, tokens, seq_len: int, max_windows: int = 64, batch_size: int = 16) -> float:
    """Share of positions where the draft's and the target's greedy next tokens agree (what a greedy
    draft-then-verify step accepts), over the first windows of a token stream."""
    device = next(target.parameters()).device
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=device)
    starts = _windows(tokens, seq_len)[:max_windows]  # [n, 1]
    same = count = 0
    for i in range(0, len(starts), batch_size):
        x = tokens[starts[i : i + batch_size] + torch.arange(seq_len, device=device)]  # [b, seq_len]
        same += (draft(input_ids=x).logits.argmax(-1) == target(input_ids=x).logits.argmax(-1)).sum().item()
        count += x.numel()
    return same / max(1, count)


# ---------------------------------------------------------------- saving, checks, model card


def greedy_sample(model, tokenizer, files: list[tuple[str, str]], new_tokens: int = 64) -> dict:
    """Greedy continuation of the first 4 lines of a function in the first held-out file."""
    rel, text = files[0]
    lines = text.splitlines()
    # the first function whose body starts with code (a docstring makes a dull sample)
    start = next((i for i in range(len(lines) - 1) if lines[i].lstrip().startswith("def ")
                  and not lines[i + 1].lstrip().startswith(('"', "'"))), 0)
    # No trailing newline: the BPE joins a newline with the next line's indentation, so a prompt
    # ending in a bare "\n" token tells the model that the next line is not indented.
    prompt = "\n".join(lines[start : start + 4])
    device = next(model.parameters()).device
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    return {"file": rel, "prompt": prompt, "continuation": tokenizer.decode(out[0, ids.shape[1] :])}


def _python() -> str:
    return "Python " + ".".join(map(str, sys.version_info[:3]))


def check_saved(out: Path, device: str) -> tuple:
    """Reload `out` through the Auto classes; the float32 CPU copy must match the device copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    cpu = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False).float().eval()
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False).float().to(device).eval()
    ids = tokenizer("import os\n\n\ndef main(argv):\n    return 0\n", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (cpu(input_ids=ids).logits - model(input_ids=ids.to(device)).logits.cpu()).abs().max().item()
    if not diff < 1e-2:
        raise RuntimeError(f"{out}: CPU float32 logits differ from {device} logits by {diff}")
    return model, tokenizer


def save_model(model, tokenizer, preset: Preset, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").to(getattr(torch, preset.save_dtype)).save_pretrained(out)
    tokenizer.model_max_length = preset.seq_len
    tokenizer.save_pretrained(out)


# ---------------------------------------------------------------- the recipe


def prepare_family(preset: Preset, max_files: int, tokenizer_dir: str | None) -> dict:
    """Corpus, tokenizer and token streams, shared by every preset of one family in a run."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    splits = collect_files(preset.site_packages)
    if max_files:
        splits = {k: v[: max_files if k == "train" else max(1, max_files // 4)] for k, v in splits.items()}
    splits["train"] = hash_sample(splits["train"], preset.corpus_mb)
    t1 = time.perf_counter()
    if tokenizer_dir:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
    else:
        sample = hash_sample(splits["train"], preset.tokenizer_mb)
        tokenizer = train_tokenizer([t for _, t in sample], preset.vocab_size)
    t2 = time.perf_counter()
    streams = {k: encode_files(tokenizer, [t for _, t in v]) for k, v in splits.items()}
    t3 = time.perf_counter()
    roots = source_roots(preset.site_packages)
    data = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "stdlib": str(roots[0][1]),
        "site_packages": [str(r) for _, r in roots[1:]],
        "files": {k: len(v) for k, v in splits.items()},
        "bytes": {k: sum(len(t) for _, t in v) for k, v in splits.items()},
        "tokens": {k: int(len(v)) for k, v in streams.items()},
        "tokenizer_vocab": len(tokenizer),
        "seconds": {"corpus": round(t1 - t0, 1), "tokenizer": round(t2 - t1, 1), "encode": round(t3 - t2, 1)},
    }
    print(f"[{preset.family}] corpus {data['files']} files, {data['tokens']} tokens, vocab {len(tokenizer)}, "
          f"{data['seconds']}", flush=True)
    return {"tokenizer": tokenizer, "splits": splits, "streams": streams, "data": data, "models": {}}


def build_one(preset: Preset, fam: dict, out: Path, args, rebuild: str) -> dict:
    import tokenizers
    import transformers

    torch.manual_seed(args.seed)
    model = build_model(preset, fam["tokenizer"])
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    print(f"[{preset.name}] {params:,} parameters ({params - embed:,} outside the embedding)", flush=True)
    streams = fam["streams"]
    steps = args.max_steps or preset.steps
    minutes = preset.max_minutes if args.max_minutes is None else args.max_minutes
    teacher = fam["models"].get(preset.teacher) if preset.teacher else None
    if teacher is None and preset.teacher and args.teacher:  # a target saved by an earlier run
        teacher, _ = check_saved(Path(args.teacher), args.device)
    if teacher is not None:
        print(f"[{preset.name}] distilled from {preset.teacher} (weight {preset.distill_weight:g})", flush=True)
    result = train(model, preset, streams["train"], streams["valid"], args.device, args.seed, steps, minutes,
                   teacher=teacher)
    result["teacher"] = preset.teacher if teacher is not None else None
    save_model(model, fam["tokenizer"], preset, out)
    model, tokenizer = check_saved(out, args.device)
    fam["models"][preset.name] = model
    held = evaluate(model, streams["held-out"], preset.seq_len, max_windows=512)
    metrics = {
        "train": evaluate(model, streams["train"], preset.seq_len, seed=args.seed,
                          max_windows=max(1, held["tokens"] // preset.seq_len)),
        "valid": evaluate(model, streams["valid"], preset.seq_len, max_windows=512),
        "held-out": held,
    }
    held["copy_accuracy"] = copy_accuracy(model, streams["held-out"], preset.seq_len)
    print(f"[{preset.name}] held-out copy accuracy: {held['copy_accuracy']:.3f}", flush=True)
    if teacher is not None:
        held["agreement_with_teacher"] = agreement(model, teacher, streams["held-out"], preset.seq_len)
        print(f"[{preset.name}] held-out greedy agreement with {preset.teacher}: "
              f"{held['agreement_with_teacher']:.3f}", flush=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    info = {
        "preset": asdict(preset),
        "params": params,
        "non_embedding_params": params - embed,
        "safetensors_bytes": (out / "model.safetensors").stat().st_size,
        "data": fam["data"],
        "training": {**result, "seed": args.seed, "device": device_name},
        "metrics": metrics,
        "samples": {_python(): greedy_sample(model, tokenizer, fam["splits"]["held-out"])},
        "rebuild": rebuild,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    }
    (out / "metrics.json").write_text(json.dumps(info, indent=2) + "\n")
    write_card(out, info)
    print(f"[{preset.name}] saved to {out}: " + ", ".join(f"{k} loss {m['loss']:.3f} acc {m['accuracy']:.3f}"
                                                         for k, m in metrics.items()), flush=True)
    sample = info["samples"][_python()]
    print(f"[{preset.name}] sample: {sample['prompt']!r} -> {sample['continuation']!r}", flush=True)
    return info


def evaluate_here(path: str, device: str = "cpu") -> dict:
    """Held-out metrics of a saved model on this Python's own files; recorded in its metrics.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(path)
    info = json.loads((out / "metrics.json").read_text())
    preset = Preset(**info["preset"])
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False).float().to(device).eval()
    held = collect_files(preset.site_packages)["held-out"]
    result = evaluate(model, encode_files(tokenizer, [t for _, t in held]), preset.seq_len, max_windows=512)
    key = _python()
    info.setdefault("evaluations", {})[key] = {**result, "files": len(held)}
    info.setdefault("samples", {})[key] = greedy_sample(model, tokenizer, held)
    (out / "metrics.json").write_text(json.dumps(info, indent=2) + "\n")
    write_card(out, info)
    print(f"{out}: held-out on {key} ({len(held)} files): "
          f"loss {result['loss']:.3f} accuracy {result['accuracy']:.3f}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", choices=sorted(PRESETS),
                        help="one (written into OUT), or several (OUT/NAME each)")
    parser.add_argument("--out", help="output folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=0, help="override the preset's step count")
    parser.add_argument("--max-minutes", type=float, default=None, help="override the preset's time budget")
    parser.add_argument("--files", type=int, default=0, help="use only the first N train files (smoke tests)")
    parser.add_argument("--tokenizer", help="reuse this saved tokenizer instead of training one")
    parser.add_argument("--teacher", metavar="DIR",
                        help="distil presets that have a teacher from this saved model (and use its tokenizer) "
                             "when the teacher is not built in the same run, e.g. to rebuild only a draft")
    parser.add_argument("--eval", nargs="+", metavar="DIR", help="only measure saved models on this Python")
    args = parser.parse_args(argv)
    if args.teacher:
        if not (Path(args.teacher) / "config.json").is_file():
            parser.error(f"--teacher {args.teacher}: no saved model there (config.json missing); pass the folder "
                         "the teacher preset was built into, e.g. .bench-models/bench")
        args.tokenizer = args.tokenizer or args.teacher
    if args.eval:
        for path in args.eval:
            evaluate_here(path, args.device)
        return 0
    if not args.preset or not args.out:
        parser.error("--preset and --out are required (or --eval DIR)")
    rebuild = "python -m specdec.zoo " + " ".join(argv if argv is not None else sys.argv[1:])
    families: dict[str, dict] = {}
    for name in args.preset:
        preset = PRESETS[name]
        out = Path(args.out) if len(args.preset) == 1 else Path(args.out) / name
        if preset.family not in families:
            families[preset.family] = prepare_family(preset, args.files, args.tokenizer)
        build_one(preset, families[preset.family], out, args, rebuild)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

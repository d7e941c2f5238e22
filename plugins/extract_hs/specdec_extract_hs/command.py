"""``specdec extract``: run a target over a data set and write hidden-state shards.

    specdec extract --model M --layers 2,6,9 [--last] --data PATH --out DIR [--generate N] [--resume]
                    [--max-bytes SIZE] [--dtype ...] [--batch-size ...] [--max-model-len ...] [--device ...]

The CLI calls :func:`add_arguments` on its ``extract`` subparser and :func:`run` with the parsed
arguments. Bad input raises ``ValueError`` (one line: what, the rule, the fix) before any file is
written; a full disk budget raises :class:`specdec_tools.shards.DiskBudgetExceeded` after the last
complete shard, and ``--resume`` continues from there.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from specdec.cli_common import loading_bars

__all__ = ["add_arguments", "run", "parse_layers", "parse_size"]

DEFAULT_MAX_MODEL_LEN = 2048
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``specdec extract``'s flags to ``parser``."""
    parser.add_argument("--model", required=True, help="target model directory (Hugging Face causal LM)")
    parser.add_argument("--layers", default="", help="layer ids to record, comma-separated, HF output_hidden_states "
                        "indexing: 0 = embeddings, i = output of decoder layer i (e.g. 2,6,9)")
    parser.add_argument("--last", action="store_true", help="also record the final normed hidden state (hidden.last)")
    parser.add_argument("--data", required=True, help="text file, directory of files, .jsonl (text / prompt / "
                        "prompt+response / messages / input_ids) or .npy token ids")
    parser.add_argument("--out", required=True, help="shard directory to write")
    parser.add_argument("--generate", type=int, default=None, metavar="N",
                        help="let the target write up to N response tokens per prompt (greedy); loss mask on them")
    parser.add_argument("--resume", action="store_true", help="continue a run into --out that was stopped")
    parser.add_argument("--max-bytes", default=None, metavar="SIZE",
                        help="disk budget of the shards: bytes, or with K/M/G/T (powers of 1024), e.g. 20G")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="dtype the target runs in and the shards store (auto: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--store-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="store the hidden states in another dtype than the target runs in")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward (decoded together with "
                        "--generate)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help=f"longest sequence; longer texts are split into windows of it (default: the model's "
                        f"max_position_embeddings, at most {DEFAULT_MAX_MODEL_LEN})")
    parser.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard (default 32768)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow the model directory to run its own Python code")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_layers(text: str) -> tuple[int, ...]:
    """``"2,6,9"`` -> (2, 6, 9); empty -> ()."""
    parts = [p.strip() for p in str(text or "").split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--layers {text!r} is invalid: pass layer ids as comma-separated ints, e.g. --layers 2,6,9."
                         ) from None


def parse_size(text: str | None) -> int | None:
    """``"20G"`` -> 20 * 2**30 bytes; plain numbers are bytes; None stays None."""
    if text is None:
        return None
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"--max-bytes {text!r} is invalid: pass bytes, or a number with K, M, G or T (powers of "
                         "1024), e.g. --max-bytes 20G.")
    size = int(float(m.group(1)) * 1024 ** "_kmgt".index(m.group(2).lower() or "_"))
    if size < 1:
        raise ValueError(f"--max-bytes {text!r} is invalid: the budget must be at least 1 byte.")
    return size


def _check_int(flag: str, value: Any, minimum: int) -> None:
    if value is not None and (not isinstance(value, int) or value < minimum):
        raise ValueError(f"{flag} {value!r} is invalid: it must be an int >= {minimum}.")


def _target_config(model: str, trust_remote_code: bool) -> dict[str, Any]:
    """config.json of ``model``, refusing what is not a causal LM (before anything loads)."""
    from specdec.loading import check_model_dir

    config = check_model_dir(model, trust_remote_code)
    archs = config.get("architectures") or []
    if archs and not any(str(a).endswith(_CAUSAL_SUFFIXES) for a in archs):
        raise ValueError(f"model {model!r} is {', '.join(map(str, archs))}, not a causal language model: specdec "
                         "extract needs a decoder-only *ForCausalLM model (Llama, Qwen2/3, ...).")
    return config


def _max_model_len(args: argparse.Namespace, config: dict[str, Any]) -> int:
    model_max = int(config.get("max_position_embeddings") or (config.get("text_config") or {}).get(
        "max_position_embeddings") or DEFAULT_MAX_MODEL_LEN)
    if args.max_model_len is None:
        return min(model_max, DEFAULT_MAX_MODEL_LEN)
    if args.max_model_len > model_max:
        raise ValueError(f"--max-model-len {args.max_model_len} exceeds the model's max_position_embeddings="
                         f"{model_max}: pass at most {model_max}.")
    return args.max_model_len


def _check_resume(out: Path, info: dict[str, Any], resume: bool) -> None:
    """A resumed run must read the same data (same items) as the one it continues."""
    from specdec_tools.shards import MANIFEST, read_manifest

    if not resume or not (out / MANIFEST).is_file():
        return
    old = read_manifest(out)
    before = old.get("data", {})
    if old["shards"] and before.get("items_sha256") not in (None, info["items_sha256"]):
        changed = [k for k in ("path", "num_items", "generate", "max_model_len") if before.get(k) != info[k]]
        raise ValueError(f"--resume: {str(out)!r} was written from other data ({', '.join(changed) or 'the items'} "
                         f"differ: {', '.join(f'{k}={before.get(k)!r} there, {info[k]!r} here' for k in changed)}); "
                         "resume with the same --data, --generate and --max-model-len, or choose another --out.")


def run(args: argparse.Namespace) -> int:
    """Run ``specdec extract``; returns 0 once the shard directory is complete."""
    with loading_bars(not args.no_progress):
        return _extract(args)


def _extract(args: argparse.Namespace) -> int:
    from specdec.loading import has_tokenizer_files, load_tokenizer
    from specdec_extract_hs.data import load_data
    from specdec_tools.shards import DEFAULT_SHARD_TOKENS, check_layer_ids, num_hidden_layers

    layers = parse_layers(args.layers)
    max_bytes = parse_size(args.max_bytes)
    for flag, value, low in (("--generate", args.generate, 1), ("--batch-size", args.batch_size, 1),
                             ("--max-model-len", args.max_model_len, 2), ("--shard-tokens", args.shard_tokens, 1)):
        _check_int(flag, value, low)
    if not layers and not args.last:
        raise ValueError("nothing to record: pass --layers (e.g. --layers 2,6,9), --last, or both.")
    config = _target_config(args.model, args.trust_remote_code)
    layers = check_layer_ids(layers, num_hidden_layers(config))
    max_len = _max_model_len(args, config)
    limit = max_len - args.generate - 2 if args.generate else max_len  # room for the answer (see extract.py)
    if limit < 1:
        raise ValueError(f"--generate {args.generate} leaves no room for a prompt in --max-model-len {max_len}: "
                         f"raise --max-model-len or lower --generate.")
    tok = load_tokenizer(args.model, args.trust_remote_code) if has_tokenizer_files(args.model) else None
    data = load_data(args.data, tok, limit, generate=bool(args.generate), model=args.model)
    if not data.items:
        raise ValueError(f"--data {args.data!r} gave no sequences ({data.num_empty} empty): nothing to extract.")
    _warn_about(data, limit)
    info = {"path": str(args.data), "num_items": len(data.items), "items_sha256": data.fingerprint(),
            "generate": args.generate, "max_model_len": max_len,
            "recorded": "forward: every token" if not args.generate else "in flight: prompt + up to N response tokens"}
    _check_resume(Path(args.out), info, args.resume)
    shard_tokens = args.shard_tokens or DEFAULT_SHARD_TOKENS
    if args.generate:
        writer = _run_generate(args, layers, data.items, info, max_len, shard_tokens, max_bytes, tok)
    else:
        writer = _run_forward(args, layers, data.items, info, max_len, shard_tokens, max_bytes, tok)
    m = writer.manifest
    print(f"wrote {m['num_sequences']} sequences ({m['num_tokens']} tokens) in {len(m['shards'])} shard(s) to "
          f"{args.out}", file=sys.stderr)
    return 0


def _warn_about(data: Any, limit: int) -> None:
    if data.num_cut:
        warnings.warn(f"{data.num_cut} sequence(s) longer than {limit} tokens were cut to it (raise --max-model-len "
                      "to keep them whole).", stacklevel=3)
    if data.prompt_only:
        warnings.warn(f"{data.prompt_only} prompt(s) have no response, so their loss mask is all 0: pass --generate N "
                      "to let the target answer them.", stacklevel=3)


def _bar(args: argparse.Namespace, total: int, unit: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc="extract", disable=args.no_progress,
                dynamic_ncols=True, file=sys.stderr)


def _run_forward(args: argparse.Namespace, layers: tuple[int, ...], items: list[Any],
                 info: dict[str, Any], max_len: int, shard_tokens: int, max_bytes: int | None, tok: Any) -> Any:
    import specdec
    from specdec_extract_hs.extract import extract_forward
    from specdec_extract_hs.proposer import target_config
    from specdec_tools.shards import ShardWriter, hidden_size_of

    target = specdec.HFTargetModel(args.model, dtype=args.dtype, device=args.device, max_model_len=max_len,
                                   tokenizer=tok, trust_remote_code=args.trust_remote_code)
    path, cfg = target_config(target)
    store = args.store_dtype or str(target.dtype).removeprefix("torch.")
    writer = ShardWriter(args.out, target_path=path, target_config=cfg, layer_ids=layers, last_layer=args.last,
                         dtype=store, hidden_size=hidden_size_of(cfg), shard_tokens=shard_tokens,
                         max_bytes=max_bytes, resume=args.resume, data=info, background=True)
    todo = items[writer.num_sequences_done:]
    bar = _bar(args, sum(len(it.token_ids) for it in todo), "tok")
    try:
        extract_forward(target, todo, writer, args.batch_size, bar)
        writer.close()
    finally:
        bar.close()
    return writer


def _run_generate(args: argparse.Namespace, layers: tuple[int, ...], items: list[Any], info: dict[str, Any],
                  max_len: int, shard_tokens: int, max_bytes: int | None, tok: Any) -> Any:
    import specdec
    from specdec_extract_hs.extract import extract_generate

    config = {"method": "extract_hidden_states", "num_speculative_tokens": 1, "output_dir": args.out,
              "layer_ids": list(layers), "last_layer": args.last, "dtype": args.store_dtype or "auto",
              "shard_tokens": shard_tokens, "max_bytes": max_bytes, "resume": args.resume}
    llm = specdec.LLM(args.model, config, dtype=args.dtype, device=args.device, max_model_len=max_len,
                      max_num_seqs=args.batch_size, tokenizer=tok, trust_remote_code=args.trust_remote_code)
    writer = llm.proposer.writer
    writer.manifest["data"].update(info)
    todo = items[writer.num_sequences_done:]
    bar = _bar(args, len(todo), "seq")
    try:
        extract_generate(llm, todo, args.generate, args.batch_size, bar)
        writer.close()
    finally:
        bar.close()
    return writer

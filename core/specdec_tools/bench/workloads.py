"""Benchmark settings and workloads: the run's knobs and the prompts built from held-out files."""

from __future__ import annotations

import keyword
import random
import re
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import check_int

WORKLOADS = ("completion", "edit", "repeated")
DEFAULT_RUNS = ("quick", "full")  # the values of Proposer.bench_default: `specdec bench`, benchmarks/e2e.py
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{3,}\b")


# ---------------------------------------------------------------- settings


@dataclass(slots=True)
class Settings:
    """One benchmark run. ``methods`` entries are ``name`` or ``name:k``; None means the installed
    methods whose proposer's ``bench_default`` has ``"full"`` (see :func:`default_methods`);
    ``tie_rel`` is the near-tie bound of the bfloat16 check (see :func:`tie_bound`)."""

    model: str | None = None
    draft_model: str | None = None
    methods: list[str] | None = None
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    batch: list[int] = field(default_factory=lambda: [1, 8])
    temperature: list[float] = field(default_factory=lambda: [0.0, 0.8])
    k: int = 4
    prompts: int = 8
    prompt_tokens: int = 256
    max_tokens: int = 64
    repeats: int = 3
    peer_repeats: int = 1
    seed: int = 0
    dtype: str = "auto"
    device: str | None = None
    max_model_len: int | None = None
    cuda_graphs: bool | None = None
    fused_forward: bool | None = None  # LLM(fused_forward=...); None: LLM's default (fused where supported)
    cpu_threads: str | int | None = "auto"  # LLM(cpu_threads=...): "auto", an int, or None (torch's own)
    prefill_graph_tokens: int | None = None  # LLM(prefill_graph_tokens=...); None: LLM's default
    admit_group: int | None = None  # LLM(admit_group=...); None: LLM's default
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    peers: bool = True
    plots: bool = True
    tie_rel: float = 0.05
    out: str = "benchmarks/results/e2e"
    name: str = "e2e"
    progress: bool = True
    threads: int | None = None
    timing_seconds: float = 0.3  # least wall time spent timing T(1) / T(k+1) per method and workload

    def __post_init__(self) -> None:
        for key in ("k", "prompts", "prompt_tokens", "max_tokens", "repeats", "peer_repeats"):
            check_int(key, getattr(self, key), 1)
        if self.admit_group is not None:
            check_int("admit_group", self.admit_group, 1)
        if not self.batch or any(b < 1 for b in self.batch):
            raise ValueError(f"batch={self.batch!r} is invalid: give batch sizes >= 1.")
        if not self.temperature or any(t < 0 for t in self.temperature):
            raise ValueError(f"temperature={self.temperature!r} is invalid: give temperatures >= 0 (0 = greedy).")
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if bad or not self.workloads:
            raise ValueError(f"workloads={self.workloads!r} is invalid: choose from {', '.join(WORKLOADS)}.")
        if not 0 < self.tie_rel < 1:
            raise ValueError(f"tie_rel={self.tie_rel!r} is invalid: it must be in (0, 1), e.g. 0.05.")


def parse_method(spec: str, default_k: int) -> tuple[str, int]:
    """``"ngram"`` -> ("ngram", default_k); ``"suffix:8"`` -> ("suffix", 8); a speculation policy after ``@``
    (``"ngram:4@fixed"``) is the caller's to read."""
    name, _, k = spec.partition("@")[0].partition(":")
    if k and not k.isdigit():
        raise ValueError(f"method {spec!r} is invalid: write name or name:k with k an int >= 1, e.g. suffix:8.")
    return name, int(k) if k else default_k


def default_methods(run: str = "full") -> list[str]:
    """The installed methods (sorted) whose proposer class lists ``run`` (``"quick"`` or ``"full"``) in
    its ``bench_default``: the plugins, not the benchmark, say which of them a default run includes."""
    from specdec import available_methods

    if run not in DEFAULT_RUNS:
        raise ValueError(f"run={run!r} is invalid: choose from {', '.join(DEFAULT_RUNS)}.")
    return [name for name, info in available_methods().items()
            if info.status == "ok" and run in getattr(info.proposer_class, "bench_default", ())]


# ---------------------------------------------------------------- workloads


@dataclass(slots=True)
class Workload:
    """Prompts (token ids) grouped into the ``generate()`` calls that carry them, in order."""

    name: str
    calls: list[list[list[int]]]

    @property
    def prompts(self) -> list[list[int]]:
        return [p for call in self.calls for p in call]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def line_chunks(tokenizer: Any, text: str, max_tokens: int) -> list[str]:
    """Consecutive whole-line chunks of ``text`` of at most ``max_tokens`` tokens and at least half
    that (shorter tails are dropped; a single over-long line is skipped)."""
    lines = text.splitlines(keepends=True)
    counts = [len(ids) for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]] if lines else []
    chunks, cur, n = [], [], 0
    for line, c in zip(lines, counts):
        if cur and n + c > max_tokens:
            chunks.append("".join(cur))
            cur, n = [], 0
        if c <= max_tokens:
            cur.append(line)
            n += c
    if cur:
        chunks.append("".join(cur))
    return [c for c in chunks if max_tokens // 2 <= len(_encode(tokenizer, c)) <= max_tokens]


def small_edit(text: str, rng: random.Random, top_lines: int = 8) -> tuple[str, int]:
    """``text`` with one identifier in its first ``top_lines`` lines renamed (``name`` ->
    ``name_v2``), or a comment line inserted where there is none; returns it and the changed line."""
    lines = text.splitlines(keepends=True)
    top = max(1, min(top_lines, len(lines) // 3))
    cands = [(i, m.end()) for i, line in enumerate(lines[:top]) for m in _IDENT.finditer(line)
             if not keyword.iskeyword(m.group())]
    if cands:
        i, end = rng.choice(cands)
        lines[i] = lines[i][:end] + "_v2" + lines[i][end:]
    else:
        i = rng.randrange(top)
        lines.insert(i, "# edited\n")
    return "".join(lines), i


def held_out_files() -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's held-out split (never trained on)."""
    from specdec_tools.zoo import collect_files

    return collect_files(site_packages=False)["held-out"]


def build_workloads(tokenizer: Any, names: list[str], num_prompts: int, batch: int, prompt_tokens: int,
                    seed: int = 0, files: list[tuple[str, str]] | None = None) -> list[Workload]:
    """The workloads for one batch size: ``max(num_prompts, batch)`` requests each (``repeated``: three
    calls per group of ``batch`` base prompts: same, same, near-duplicate)."""
    files = held_out_files() if files is None else files
    chunked = [line_chunks(tokenizer, text, prompt_tokens) for _, text in sorted(files)]
    chunked = [c for c in chunked if len(c) >= 2]
    if not chunked:
        raise ValueError(f"no held-out file has two chunks of {prompt_tokens // 2}-{prompt_tokens} tokens; "
                         "lower --prompt-tokens.")
    random.Random(seed).shuffle(chunked)

    def chunk(i: int, first: int = 0) -> str:  # request i: file i mod F, its chunks from `first` on in turn
        chunks = chunked[i % len(chunked)][first:]
        return chunks[(i // len(chunked)) % len(chunks)]

    n = max(num_prompts, batch)
    out = []
    for name in names:
        rng = random.Random(f"{seed}:{name}")  # a workload's prompts do not depend on which others run
        if name == "completion":  # chunk 0 of each file first: a file's opening
            out.append(Workload(name, [[_encode(tokenizer, chunk(i)) for i in range(n)]]))
        elif name == "edit":
            prompts = []
            for i in range(n):
                text = chunk(i)
                edited, line = small_edit(text, rng)
                head = "".join(edited.splitlines(keepends=True)[: line + 3])
                # capped, so the prompt budget of run_benchmark (1.4 x prompt_tokens) always holds
                prompts.append(_encode(tokenizer, text + "\n" + head)[: int(1.35 * prompt_tokens)])
            out.append(Workload(name, [prompts]))
        else:  # other chunks than completion's; per group of `batch`: same, same, near-duplicate
            calls = []
            for g in range(-(-max(1, -(-num_prompts // 3)) // batch)):  # ceil(ceil(num_prompts / 3) / batch)
                texts = [chunk(j, first=1) for j in range(g * batch, (g + 1) * batch)]
                same = [_encode(tokenizer, t) for t in texts]
                calls += [same, [list(p) for p in same], [_encode(tokenizer, small_edit(t, rng)[0]) for t in texts]]
            out.append(Workload(name, calls))
    return out

"""One vLLM engine per process: ``python tests_vllm/vllm_worker.py JOB.json RESULT.json``.

The tests start each engine in a fresh process because vLLM 0.32.0's CPU worker cannot start in a process that
has imported llvmlite's bindings (numba: vLLM's own ngram and specdec's): at worker start vLLM rebinds its Triton
kernels by scanning every module's attributes, and ``llvmlite.binding.ffi.lib`` answers ``vars()`` with a
function wrapper (``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``). A server runs one engine
per process, where this never arises: the adapter is imported after that scan.

The job: ``{"env": {...}, "speculative_config": {...} or null, "runs": [{"name", "prompts", "max_tokens",
"batch"}]}``. The result: per run the generated token ids, vLLM's spec-decode counters over the run and what the
adapter's ``propose`` saw (:class:`ProposeLog`); or ``{"error": [messages of the exception chain]}`` when the
engine does not start.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

K = 4
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 1024
# Small, so prompts of 100-300 tokens prefill in several chunks: rows that sample nothing for a few steps.
MAX_NUM_BATCHED_TOKENS = 96
# vLLM reads these when it is imported or an engine starts: in-process engine core, 1 GiB of CPU KV cache, no hub.
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}


@dataclass
class ProposeLog:
    """What vLLM handed the adapter's ``propose`` over a run, and what its row tracker made of it."""

    calls: int = 0
    max_rows: int = 0
    prefill_rows: int = 0  # rows that sampled nothing (a prefill chunk)
    drafted: int = 0
    accepted: int = 0  # sampled tokens beyond the bonus on rows that had drafts: drafts vLLM accepted
    moved: int = 0  # requests found in another row than at their previous step
    req_ids: list[str] = field(default_factory=list)  # every request id the tracker gave, in order of arrival
    _rows: dict[str, int] = field(default_factory=dict)
    _drafted: dict[str, int] = field(default_factory=dict)

    def observe(self, adapter: Any, sampled: list[list[int]], drafts: list[list[int]]) -> None:
        ids = adapter.rows.req_ids[: len(sampled)]
        self.calls += 1
        self.max_rows = max(self.max_rows, len(sampled))
        for row, (rid, s, d) in enumerate(zip(ids, sampled, drafts)):
            self.prefill_rows += not s
            if s and self._drafted.get(rid):
                self.accepted += len(s) - 1
            if rid not in self._rows:
                self.req_ids.append(rid)
            elif self._rows[rid] != row:
                self.moved += 1
            self._rows[rid] = row
            self._drafted[rid] = len(d) if s else self._drafted.get(rid, 0)
            self.drafted += len(d)

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def make_llm(speculative_config: dict | None, model: str) -> Any:
    """A vLLM engine on ``model`` with the tests' settings (float32, so greedy outputs compare exactly)."""
    from vllm import LLM

    return LLM(model=model, dtype="float32", gpu_memory_utilization=0.4, max_model_len=MAX_MODEL_LEN,
               max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, seed=0,
               speculative_config=speculative_config, disable_log_stats=False)


def generate(llm: Any, prompts: list[list[int]], max_tokens: list[int], batch: int) -> list[list[int]]:
    """Greedy, EOS ignored. ``batch=1``: one request per ``generate`` call (each new request reuses row 0); else
    all at once (more requests than rows: the queued ones take rows as others finish)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=m) for m in max_tokens]
    if batch == 1:
        outs = [llm.generate([TokensPrompt(prompt_token_ids=p)], [sp], use_tqdm=False)[0]
                for p, sp in zip(prompts, params)]
    else:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's cumulative spec-decode counters (drafts, draft tokens, accepted tokens)."""
    return {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num_") and isinstance(getattr(m, "value", None), (int, float))}


def _chain(exc: BaseException | None) -> list[str]:
    out = []
    while exc is not None and len(out) < 10:
        out.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return out


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Start the job's engine and run its runs; see the module docstring."""
    for key, value in {**VLLM_ENV, **job.get("env", {})}.items():
        os.environ[key] = value
    from specdec_vllm.proposer import SpecdecProposer

    import specdec

    log = ProposeLog()
    inner = SpecdecProposer.propose

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        drafts = inner(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=slot_mappings)
        log.observe(self, sampled_token_ids, drafts)
        return drafts

    SpecdecProposer.propose = propose  # every adapter class inherits it
    try:
        llm = make_llm(job.get("speculative_config"), str(specdec.bundled_model("tiny")))
    except Exception as exc:
        return {"error": _chain(exc)}
    results = {}
    for r in job["runs"]:
        log.__init__()
        before = spec_counters(llm)
        outputs = generate(llm, r["prompts"], r["max_tokens"], r["batch"])
        after = spec_counters(llm)
        results[r["name"]] = {"outputs": outputs, "log": log.summary(),
                              "counters": {k: after[k] - before.get(k, 0) for k in after}}
    return {"runs": results}


def main(argv: list[str]) -> int:
    job_path, out_path = argv
    with open(job_path) as f:
        job = json.load(f)
    result = run(job)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

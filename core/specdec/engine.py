"""LLM: an offline engine in vLLM's style, with or without speculative decoding.

Per step: propose -> build SpecDecodeMetadata -> one target forward over (last token + drafts) of
every running request -> rejection_sample -> append accepted tokens, commit their KV (rejected
drafts' KV is never committed) -> metrics -> stop checks. Without a speculative config the same
loop decodes one token per step: the baseline every speedup is measured against.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specdec.calls import Call, CallQueue
from specdec.config import SpeculativeConfig, as_speculative_config
from specdec.cuda_graphs import DEFAULT_PREFILL_GRAPH_TOKENS
from specdec.errors import check_int
from specdec.metadata import SpecDecodeMetadata
from specdec.metrics import SpecDecodingLogging, SpecDecodingProm, SpecDecodingStats, StepTimer
from specdec.proposer import DraftBatch, Drafts, Proposer
from specdec.registry import create_proposer
from specdec.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler
from specdec.sampling import SamplingMetadata, SamplingParams
from specdec.target import HFTargetModel, TargetModel, TargetOutput
from specdec.validation import DeferredDrafts, check_drafts, check_sampling_params, defer_drafts, validate_prompts

__all__ = ["LLM", "RequestOutput", "RequestMetrics", "StepTimer"]

logger = logging.getLogger("specdec.engine")


@dataclass(slots=True)
class RequestMetrics:
    """Per-request speculation counters and timings.

    ``acceptance_length`` = 1 + accepted / drafts: tokens produced per verify step that drafted.
    """

    num_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    first_token_time: float = 0.0
    latency: float = 0.0

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / drafts (1.0 when nothing was drafted)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(slots=True)
class RequestOutput:
    """One finished request: generated ``token_ids`` (prompt excluded), ``text`` when a tokenizer is
    present, ``finish_reason`` (``"stop"``: EOS or a stop token, ``"length"``: max_tokens or
    max_model_len) and ``metrics``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    metrics: RequestMetrics


@dataclass(slots=True)
class _Request:
    req_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)
    last_sampled: list[int] = field(default_factory=list)
    slot: int = -1
    finish_reason: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    start_time: float = 0.0
    hidden: tuple[torch.Tensor | None, list[torch.Tensor] | None, int] | None = None
    in_proposer: bool = False
    call: Any = None  # the generate call (specdec.calls.Call) it belongs to
    num_tokens: int = 0  # prompt + output, kept by LLM._append (read several times a step)

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_ids) + len(self.output)


class LLM:
    """Generate with a Hugging Face causal LM, optionally with speculative decoding.

    Args:
        model: local model directory (or a loaded ``PreTrainedModel``, in eval mode); never
            downloaded. A loaded module keeps its own dtype and device unless ``dtype=`` /
            ``device=`` ask for a change (then it is converted in place).
        speculative_config: a :class:`SpeculativeConfig`, a flat dict in vLLM's style, or a path to
            a JSON/YAML file; None decodes one token per step (the baseline).
        dtype: ``"auto"`` (float32 on CPU, bfloat16 on CUDA; a loaded module's own dtype),
            ``"float32"``, ``"bfloat16"``, ...
        device: defaults to CUDA when available (a loaded module's own device).
        max_model_len: longest prompt + output; defaults to the model's max_position_embeddings.
        max_num_seqs: requests decoded together (KV slots); more prompts wait and join as others
            finish, in groups (see ``admit_group``) so one prefill forward serves several of them.
        admit_group: waiting requests join once this many slots are free (or all of them fit);
            None (default): ``max_num_seqs // 4``, at least 1. Smaller groups keep the batch fuller
            when requests finish at different steps (speculation), at the cost of more prefills.
        tokenizer: a tokenizer object or path; default: the one saved with the model, if any.
        log_stats: log a speculation metrics line every ``log_interval_s`` seconds.
        cuda_graphs: capture the decode/verify forward in CUDA graphs at start-up (default: on
            when the model runs on CUDA); falls back to eager with a log line where capture fails.
        prefill_graph_tokens: with ``cuda_graphs``, also capture prefill graphs for groups of new
            requests of up to this many (padded) tokens in all, so admitting requests costs a replay
            instead of an eager forward (about 10 ms for a 12-layer model on an H200, whatever the
            prompt); larger groups stay eager. None (default): 8192
            (:data:`specdec.cuda_graphs.DEFAULT_PREFILL_GRAPH_TOKENS`) when the step is captured;
            0 turns them off.
        profile_steps: time each decode step's parts (propose / forward / sample / bookkeeping)
            into ``llm.step_timer``; it synchronises the device after the forward, so leave it off
            outside benchmarks.
        trust_remote_code: allow model directories (target, tokenizer, a proposer's draft model or
            head) to run their own Python code (``auto_map``). Off by default: such a directory is
            refused with an error naming it and this flag, never with an interactive prompt.
        trust_draft_probs: verify a plugin's sampled drafts against the ``probs`` it reports (after the
            checks of docs/design.md section 8), accepting with min(1, p/q). False discards them and
            verifies every draft as one-hot (accepted with probability p(x)): lossless however the
            plugin chose its drafts or described them, at the cost of the acceptance a true q buys.
        prometheus: feed Prometheus counters (:class:`specdec.metrics.SpecDecodingProm`, labelled
            with the model and method) once per verify step: a ``prometheus_client``
            ``CollectorRegistry``, or True for the global default registry. None (default): off.

    Threads: one ``LLM`` may be shared by several threads. Requests of concurrent ``generate`` calls
    join one running batch (first come, first admitted; one calling thread at a time runs the steps,
    until its own requests are done, then another takes over). Each call returns its own outputs, the
    same tokens as alone wherever the model's output does not depend on its batch-mates (greedy and
    seeded requests in float32; see docs/design.md section 8). A step that fails (a plugin's error,
    say) ends every call with a request in that step, with that error; the others go on. Calling
    ``generate`` from inside a step on the thread running it (a plugin hook) raises ``RuntimeError``.
    """

    def __init__(self, model: str | Path | nn.Module | TargetModel,
                 speculative_config: SpeculativeConfig | dict[str, Any] | str | Path | None = None, *,
                 dtype: str | torch.dtype | None = "auto", device: str | torch.device | None = None,
                 max_model_len: int | None = None, max_num_seqs: int = 8, tokenizer: Any = None,
                 log_stats: bool = False, log_interval_s: float = 5.0, cuda_graphs: bool | None = None,
                 prefill_graph_tokens: int | None = None, profile_steps: bool = False,
                 admit_group: int | None = None, trust_remote_code: bool = False,
                 prometheus: Any = None, trust_draft_probs: bool = True) -> None:
        check_int("max_num_seqs", max_num_seqs, 1)
        for name, flag in (("trust_remote_code", trust_remote_code), ("trust_draft_probs", trust_draft_probs),
                           ("log_stats", log_stats), ("profile_steps", profile_steps)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}={flag!r} is invalid: it must be True or False.")
        if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
            raise TypeError(f"cuda_graphs={cuda_graphs!r} is invalid: it must be True, False or None (on when the "
                            "model runs on CUDA).")
        if isinstance(log_interval_s, bool) or not isinstance(log_interval_s, (int, float)) or not (
                0 < log_interval_s < float("inf")):
            raise ValueError(f"log_interval_s={log_interval_s!r} is invalid: it must be a number of seconds > 0.")
        self.trust_draft_probs = trust_draft_probs
        registry = _prometheus_registry(prometheus)
        speculative_config = as_speculative_config(speculative_config)  # a bad one fails before the model loads
        if admit_group is not None:
            check_int("admit_group", admit_group, 1, "(the free slots that let waiting requests join) or None "
                      "(max_num_seqs // 4)")
        if prefill_graph_tokens is not None:
            check_int("prefill_graph_tokens", prefill_graph_tokens, 0,
                      "(0 turns prefill graphs off) or None (the default size)")
        if isinstance(model, (str, Path, nn.Module)):
            model = HFTargetModel(model, dtype=dtype, device=device, max_model_len=max_model_len,
                                  tokenizer=tokenizer, trust_remote_code=trust_remote_code)
        self.target: TargetModel = model
        self.tokenizer = getattr(model, "tokenizer", None)
        self.max_num_seqs = max_num_seqs
        self.admit_group = admit_group if admit_group is not None else max(1, max_num_seqs // 4)
        self.speculative_config: SpeculativeConfig | None = speculative_config
        self.proposer: Proposer | None = None
        k = 0
        # Slots first, so model-based proposers can size their own caches to match.
        if speculative_config is not None and speculative_config.num_speculative_tokens >= self.target.max_model_len:
            # A verify step of k + 1 tokens could never fit (nor could its CUDA graphs be captured).
            raise ValueError(f"num_speculative_tokens={speculative_config.num_speculative_tokens} is invalid: it "
                             f"must be < max_model_len={self.target.max_model_len}; typical values are 2-8.")
        self.target.allocate(max_num_seqs)
        if speculative_config is not None:
            self.proposer = create_proposer(speculative_config, self.target)
            k = speculative_config.num_speculative_tokens
        self.num_speculative_tokens = k
        self.stats = SpecDecodingStats(num_spec_tokens=max(k, 1))
        self._logging = SpecDecodingLogging(interval_s=log_interval_s) if log_stats else None
        self.prometheus: SpecDecodingProm | None = None
        if registry is not None:
            method = speculative_config.method if speculative_config is not None else "none"
            self.prometheus = SpecDecodingProm(max(k, 1), self.target.model_name, method, registry)
        # Requests of every generate call in flight (from any thread) and the engine's running batch.
        self._calls = CallQueue()
        self._running: list[_Request] = []
        self._free = list(range(max_num_seqs))
        self._hidden_request = self.proposer.hidden_states_needed() if self.proposer else None
        self._ids = itertools.count()  # request ids; next() on a count is atomic under the GIL
        self.step_timer = StepTimer(enabled=profile_steps)
        self._sampler = RejectionSampler()
        self._sm_cache: tuple[tuple[int, ...], SamplingMetadata, list[_Request]] | None = None
        # Every slot's prompt + output, appended to in place (the proposer's DraftBatch.token_ids is a
        # view of it when the running slots are 0..B-1), plus a device mirror updated with only the
        # tokens written since the last step.
        self._tokens = np.zeros((max_num_seqs, self.target.max_model_len), dtype=np.int32)
        # The mirror starts the first time a proposer reads DraftBatch.token_ids_device (GPU
        # proposers); CPU proposers never pay for it.
        self._tokens_dev: torch.Tensor | None = None
        self._device_mirror = self.target.device.type != "cpu"  # on a CPU target the host ids are enough
        self._dirty: list[tuple[int, int, int]] = []  # (slot, start, end) not yet mirrored
        # Greedy drafts a proposer leaves on the device go to the verify forward without a host round
        # trip (DeferredDrafts) where the target takes device ids; True: CPU drafts too (tests).
        self._defer_drafts: bool | None = None
        if cuda_graphs is None:
            cuda_graphs = self.target.device.type == "cuda"
        if cuda_graphs and hasattr(self.target, "capture_graphs"):
            logger.info("Capturing CUDA graphs for the %s step...", "verify" if k else "decode")
            # A verify step where no request got a draft is a one-token step: it gets its own graphs
            # (T(1), not T(k+1); prompt-lookup methods find nothing to draft in many steps).
            if prefill_graph_tokens is None:
                prefill_graph_tokens = DEFAULT_PREFILL_GRAPH_TOKENS
            self.target.capture_graphs(sorted({1, k + 1}), hidden=self._hidden_request,
                                       max_prefill_tokens=prefill_graph_tokens)

    # -- public API ----------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for one prompt or a list; each prompt is a string or a list of token ids.

        All prompts are validated before any work starts (a bad one raises ``ValueError`` naming
        its index, so nothing in flight is lost). Outputs come back in prompt order. Safe to call
        from several threads: their requests share the running batch (see :class:`LLM`).
        """
        if not isinstance(use_tqdm, bool):
            raise TypeError(f"use_tqdm={use_tqdm!r} is invalid: it must be True or False.")
        if self._calls.driver == threading.get_ident():
            raise RuntimeError("LLM.generate was called from inside a generate call on the same thread (from a "
                               "plugin hook?): it would deadlock. Call it after the running call returns.")
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
        else:
            params = [sampling_params] * len(prompt_list)
        if len(params) != len(prompt_list):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompt_list)} prompts; pass one "
                             "SamplingParams or one per prompt.")
        token_lists = validate_prompts(prompt_list, self.tokenizer, self.target.vocab_size,
                                       self.target.max_model_len)
        check_sampling_params(params, self.target.vocab_size)
        requests = []
        for prompt, ids, p in zip(prompt_list, token_lists, params):
            gen = None
            if p.seed is not None:
                gen = torch.Generator(device=self.target.device)
                gen.manual_seed(p.seed)
            requests.append(_Request(str(next(self._ids)), prompt if isinstance(prompt, str) else None,
                                     ids, p, gen))
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(requests), desc="Generating", unit="req", dynamic_ncols=True)
        call = Call(len(requests), bar, requests=requests)
        for r in requests:
            r.call = call
        self._calls.submit(call)
        try:
            while self._calls.acquire(call):  # until done; drives whenever nobody else does
                try:
                    self._drive(call)
                finally:
                    self._calls.release()
        except BaseException as exc:  # interrupted (Ctrl-C) while waiting or between steps
            self._calls.fail({call}, exc)  # its waiting requests leave the queue; running ones finish unread
            raise
        finally:
            if bar is not None:
                bar.close()
        if call.error is not None:
            raise call.error
        if self._logging is not None:
            self._logging.log()
        return [self._to_output(r) for r in requests]

    # -- the loop ------------------------------------------------------------------------------
    def _drive(self, call: Call) -> None:
        """Run steps (any call's requests) until ``call`` is done. A failing step (admission, forward,
        sampling, a plugin hook, retiring) ends the calls of the requests in it (and, for an interrupt,
        this one) with its error; the engine stays usable."""
        while not call.done:
            admitted: list[_Request] = []
            retiring: list[_Request] = []
            try:
                if not self._running and len(self._free) == self.max_num_seqs:
                    self.target.allocate(self.max_num_seqs)  # idle: same size, only resets every slot's length
                self._admit(admitted)
                if admitted:
                    self._prefill(admitted)
                    self._running.extend(admitted)
                elif self._running:
                    self._decode_step(self._running)
                else:
                    raise RuntimeError(f"specdec: {call.remaining} request(s) of this generate call are neither "
                                       "waiting nor running (a bug in specdec's engine; please report it).")
                self._retire_finished(retiring)
            except BaseException as exc:
                failed = list({id(r): r for r in (*self._running, *admitted, *retiring)}.values())
                own = not isinstance(exc, Exception) or not failed  # an interrupt, or nobody else to blame
                self._abort(failed, exc, call if own else None)
                continue
            if self._logging is not None:
                self._logging.maybe_log()

    def _admit(self, admitted: list[_Request]) -> None:
        """Move waiting requests that join now into free slots, appending each to ``admitted`` as it
        is taken (so a failure half-way loses none). A prefill forward costs about a step whatever the
        number of prompts it carries, so they join in groups: when ``admit_group`` slots are free, or
        when all of the waiting ones fit."""
        waiting = len(self._calls)
        if not waiting or not self._free or (self._running and len(self._free) < min(self.admit_group, waiting)):
            return
        admitted.extend(self._calls.take(len(self._free)))
        for r in admitted:
            r.slot = self._free.pop(0)
            self._write_tokens(r.slot, 0, r.prompt_ids)
            r.start_time = time.perf_counter()
            self.target.reset_slot(r.slot)

    def _retire_finished(self, retiring: list[_Request]) -> None:
        """Finished requests leave the batch (collected in ``retiring`` first), free their slots, leave
        the proposer, and count towards their calls."""
        retiring.extend(r for r in self._running if r.finish_reason is not None)
        for r in retiring:
            self._running.remove(r)
            self._free.append(r.slot)
            r.metrics.latency = time.perf_counter() - r.start_time
        self._free.sort()
        self._running.sort(key=lambda r: r.slot)
        for r in retiring:
            self._release(r)  # a plugin's remove_request: may raise
        for r in retiring:
            self._calls.finish(r)

    def _abort(self, failed: list[_Request], error: BaseException, also: Call | None) -> None:
        """End the calls of ``failed`` (and ``also``) with ``error``; free their slots and proposer state."""
        for r in failed:
            try:
                self._release(r)  # leave the proposer with no stale requests
            except Exception:  # the proposer is failing already: the call's error says why
                logger.debug("remove_request(%r) failed while aborting", r.req_id, exc_info=True)
            if r.slot >= 0 and r.slot not in self._free:
                self._free.append(r.slot)
        self._free.sort()
        self._running = [r for r in self._running if all(r is not f for f in failed)]
        calls = {r.call for r in failed} | ({also} if also is not None else set())
        self._calls.fail(calls, error)

    def _release(self, r: _Request) -> None:
        if r.in_proposer:
            r.in_proposer = False
            self.proposer.remove_request(r.req_id)

    def _prefill(self, reqs: list[_Request]) -> None:
        timer = self.step_timer
        timer.start()
        reqs = sorted(reqs, key=lambda r: r.slot)
        out = self.target.forward([r.slot for r in reqs], [r.prompt_ids for r in reqs], [1] * len(reqs),
                                  self._hidden_request)
        for r in reqs:
            self.target.advance(r.slot, len(r.prompt_ids))
            if self.proposer is not None:
                self.proposer.add_request(r.req_id, np.asarray(r.prompt_ids, dtype=np.int32))
                r.in_proposer = True
        self._keep_hidden(reqs, out, [len(r.prompt_ids) - 1 for r in reqs])
        sampled = self._sample(reqs, [[] for _ in reqs], None, out)
        now = time.perf_counter()
        for r, row in zip(reqs, sampled):
            r.metrics.first_token_time = now - r.start_time
            self._append(r, [row[0]])
        timer.prefill_lap(len(reqs))

    def _decode_step(self, reqs: list[_Request]) -> None:
        timer = self.step_timer
        timer.start()
        drafts, probs, deferred = self._propose(reqs)
        # Synchronised (profiles only) so device-side drafting counts as propose, not forward.
        timer.lap("propose", sync=self.target.device if deferred is not None else None)
        slots = [r.slot for r in reqs]
        if deferred is None:
            tokens = [[r.output[-1]] + d for r, d in zip(reqs, drafts)]
            out = self.target.forward(slots, tokens, [len(t) for t in tokens], self._hidden_request)
        else:  # the drafts' ids are written on the device; the host packs placeholders
            tokens = [[r.output[-1]] + [0] * w for r, w in zip(reqs, deferred.widths)]
            out = self.target.forward(slots, tokens, [len(t) for t in tokens], self._hidden_request,
                                      draft_ids=deferred.device_ids)
        if self.proposer is not None:  # host work in the forward's shadow (a profile counts it as forward)
            self.proposer.while_verifying()
        timer.lap("forward", sync=self.target.device)
        if deferred is None:
            sampled = self._sample(reqs, drafts, probs, out)
        else:
            argmax = out.greedy_token_ids()  # the step's one wait for the device
            drafts = deferred.lists()
            sampled = _greedy_accept(drafts, argmax, deferred.widths)
        timer.lap("sample")
        drafted, accepted_per_req = [len(d) for d in drafts], [len(new) - 1 for new in sampled]
        advance = self.target.advance
        for r, n, accepted, new in zip(reqs, drafted, accepted_per_req, sampled):
            advance(r.slot, 1 + accepted)
            m = r.metrics
            m.num_steps += 1
            if n:
                m.num_drafts += 1
                m.num_draft_tokens += n
                m.num_accepted_tokens += accepted
            self._append(r, new)
        self.stats.observe_drafts(drafted, accepted_per_req)
        self._keep_hidden(reqs, out, accepted_per_req)
        if self._logging is not None or self.prometheus is not None:
            step = SpecDecodingStats(self.stats.num_spec_tokens)  # this step's drafts alone
            step.observe_drafts(drafted, accepted_per_req)
            if self._logging is not None:
                self._logging.observe(step, num_generated_tokens=sum(accepted_per_req) + len(reqs))
            if self.prometheus is not None:
                self.prometheus.inc(step.num_drafts, step.num_draft_tokens, step.num_accepted_tokens,
                                    step.num_accepted_tokens_per_pos)
        timer.lap("bookkeeping")
        timer.steps += 1
        timer.rows += len(reqs)

    def _sample(self, reqs: list[_Request], drafts: list[list[int]], probs: torch.Tensor | None,
                out: TargetOutput) -> list[list[int]]:
        """Verify ``drafts`` against ``out.logits`` (the layout of :class:`SpecDecodeMetadata`); returns
        each request's accepted drafts plus its recovered/bonus token. Contains the step's one
        device->host read. An all-greedy batch takes a shortcut with the same result as the rejection
        sampler's greedy rule: the argmax of every row on the host (computed inside the target's CUDA
        graph when it replayed one), the prefix match on the host."""
        if all(r.params.temperature == 0 for r in reqs):
            return _greedy_accept(drafts, out.greedy_token_ids(), [len(d) for d in drafts])
        metadata = SpecDecodeMetadata.from_draft_token_ids(drafts, self.target.device)
        # RejectionSampler picks the Triton kernels on CUDA (torch reference elsewhere).
        sampled = self._sampler(metadata, probs, out.logits, self._sampling_metadata(reqs)).tolist()
        return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in sampled]

    def _propose(self, reqs: list[_Request]
                 ) -> tuple[list[list[int]], torch.Tensor | None, DeferredDrafts | None]:
        """This step's drafts: checked lists and their probs, or (greedy batches whose drafts sit on the
        target's device) :class:`DeferredDrafts` for the verify forward to read there."""
        if self.proposer is None:
            return [[] for _ in reqs], None, None
        batch = self._draft_batch(reqs)
        result = self.proposer.propose(batch)
        if not self.trust_draft_probs and isinstance(result, Drafts) and result.probs is not None:
            result = Drafts(result.token_ids, result.num_draft_tokens)  # one-hot: q is never read
        k = self.num_speculative_tokens
        limits = [max(0, min(k, self.target.max_model_len - r.num_tokens, r.params.max_tokens - len(r.output) - 1))
                  for r in reqs]
        policy = self.speculative_config.on_bad_drafts
        if self._can_defer(result, reqs):
            deferred = defer_drafts(result, batch, limits, self.target.vocab_size, self.proposer, policy)
            if deferred is None:
                return [[] for _ in reqs], None, None
            return [], None, deferred
        drafts, probs = check_drafts(result, batch, limits, self.target.vocab_size, self.proposer, policy)
        if probs is not None and probs.device != self.target.device:  # the verifier reads them beside the logits
            probs = probs.to(self.target.device)
        return drafts, probs, None

    def _can_defer(self, result: Any, reqs: list[_Request]) -> bool:
        """Whether this step's drafts can stay on the device until the verify forward has read them:
        a greedy batch, drafts on the target's device (an accelerator, or any with ``_defer_drafts``)
        and a target whose forward takes device ids."""
        ids = getattr(result, "token_ids", None)
        if (not isinstance(result, Drafts) or not isinstance(ids, torch.Tensor) or self._defer_drafts is False
                or not getattr(self.target, "accepts_draft_ids", False)):
            return False
        dev = self.target.device
        if ids.device.type != dev.type or dev.index not in (None, ids.device.index):
            return False
        if ids.device.type == "cpu" and not self._defer_drafts:
            return False
        return all(r.params.temperature == 0 for r in reqs)

    def _write_tokens(self, slot: int, start: int, tokens: list[int]) -> None:
        self._tokens[slot, start: start + len(tokens)] = tokens
        if self._tokens_dev is not None:
            self._dirty.append((slot, start, start + len(tokens)))

    def _device_tokens(self, slots: list[int], contiguous: bool, width: int) -> torch.Tensor:
        """Rows of the device mirror for ``slots``: started from the host buffer on first use, then
        brought up to date with the tokens written since the last read."""
        if self._tokens_dev is None:
            self._tokens_dev = torch.from_numpy(self._tokens).to(self.target.device, copy=True)
            self._dirty.clear()
        self._sync_device_tokens()
        rows = slice(0, len(slots)) if contiguous else torch.tensor(slots, device=self._tokens_dev.device)
        return self._tokens_dev[rows, :width]

    def _sync_device_tokens(self) -> None:
        """Mirror the tokens written since the last step: one host->device copy and one scatter."""
        if not self._dirty:
            return
        rows = np.concatenate([np.full(e - s, slot) for slot, s, e in self._dirty])
        cols = np.concatenate([np.arange(s, e) for _, s, e in self._dirty])
        packed = torch.from_numpy(np.stack([rows, cols, self._tokens[rows, cols]]).astype(np.int64))
        packed = packed.to(self._tokens_dev.device, non_blocking=True)
        self._tokens_dev[packed[0], packed[1]] = packed[2].to(torch.int32)
        self._dirty.clear()

    def _draft_batch(self, reqs: list[_Request]) -> DraftBatch:
        lengths = np.array([r.num_tokens for r in reqs], dtype=np.int64)
        width = int(lengths.max())
        slots = [r.slot for r in reqs]
        contiguous = slots == list(range(len(slots)))
        # A view (no copy, O(1) per step) when the running slots are 0..B-1, as they usually are.
        token_ids = self._tokens[: len(slots), :width] if contiguous else self._tokens[slots, :width]
        fields = dict(
            req_ids=[r.req_id for r in reqs], token_ids=token_ids, num_tokens=lengths,
            sampled_token_ids=[list(r.last_sampled) for r in reqs],
            num_speculative_tokens=self.num_speculative_tokens, max_model_len=self.target.max_model_len,
            sampling_params=[r.params for r in reqs],
        )
        if self._device_mirror:
            batch = _LazyDeviceTokens(lambda: self._device_tokens(slots, contiguous, width), **fields)
        else:
            batch = DraftBatch(**fields)
        if self._hidden_request is not None:
            _fill_hidden(batch, reqs, self.target.device)
        return batch

    def _keep_hidden(self, reqs: list[_Request], out: Any, last_index: list[int]) -> None:
        if self._hidden_request is None:
            return
        qsl = out.query_start_loc.tolist()
        for i, r in enumerate(reqs):
            s, e = qsl[i], qsl[i + 1]
            h = out.hidden_states[s:e] if out.hidden_states is not None else None
            aux = [a[s:e] for a in out.aux_hidden_states] if out.aux_hidden_states is not None else None
            r.hidden = (h, aux, last_index[i])

    def _sampling_metadata(self, reqs: list[_Request]) -> SamplingMetadata:
        """Batched sampling tensors, rebuilt only when the running set changes (their host->device
        copies would otherwise run every step)."""
        key = tuple(id(r) for r in reqs)
        if self._sm_cache is None or self._sm_cache[0] != key:
            gens = {i: r.generator for i, r in enumerate(reqs) if r.generator is not None}
            md = SamplingMetadata.from_params([r.params for r in reqs], self.target.device, generators=gens)
            self._sm_cache = (key, md, list(reqs))  # holding the requests keeps their ids unique
        return self._sm_cache[1]

    def _append(self, r: _Request, new: list[int]) -> None:
        """Append sampled tokens, stopping at EOS / stop ids / max_tokens / max_model_len."""
        p = r.params
        eos = () if p.ignore_eos else getattr(self.target, "eos_token_ids", ())
        start = r.num_tokens
        room = min(p.max_tokens - len(r.output), self.target.max_model_len - start)  # >= 1 while running
        take = new[:room]
        if room <= len(new):
            r.finish_reason = "length"
        for i, t in enumerate(take):
            if t in eos or t in p.stop_token_ids:
                take, r.finish_reason = take[: i + 1], "stop"
                break
        self._write_tokens(r.slot, start, take)
        r.output.extend(take)
        r.num_tokens += len(take)
        r.last_sampled = take

    def _to_output(self, r: _Request) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(r.output, skip_special_tokens=True)
        return RequestOutput(r.req_id, r.prompt, list(r.prompt_ids), list(r.output), text,
                             r.finish_reason or "length", r.metrics)


class _LazyDeviceTokens(DraftBatch):
    """A DraftBatch whose ``token_ids_device`` is made on first read (one mirror update), so a
    proposer that never reads it costs no host-to-device copy."""

    def __init__(self, make: Any, **batch_fields: Any) -> None:
        DraftBatch.__init__(self, **batch_fields)  # token_ids_device=None goes through the setter
        self.__dict__["_make"] = make

    @property
    def token_ids_device(self) -> torch.Tensor | None:  # type: ignore[override]
        if self.__dict__.get("_make") is not None:
            self.__dict__["_token_ids_device"] = self.__dict__.pop("_make")()
        return self.__dict__.get("_token_ids_device")

    @token_ids_device.setter
    def token_ids_device(self, value: torch.Tensor | None) -> None:
        self.__dict__.pop("_make", None)
        self.__dict__["_token_ids_device"] = value


def _greedy_accept(drafts: list[list[int]], argmax: list[int], widths: list[int]) -> list[list[int]]:
    """Greedy verification on the host: each request keeps its drafts up to the first that differs
    from the target's argmax there, plus the argmax after them. Request i's rows start after the
    ``widths[j] + 1`` rows of each earlier request j (its drafts as verified; a dropped request's
    list is empty but its rows are still there)."""
    accepted, row = [], 0
    for d, w in zip(drafts, widths):
        a = 0
        while a < len(d) and d[a] == argmax[row + a]:
            a += 1
        accepted.append(d[:a] + [argmax[row + a]])
        row += w + 1
    return accepted


def _fill_hidden(batch: DraftBatch, reqs: list[_Request], device: torch.device) -> None:
    hs, aux_lists, last, qsl = [], [], [], [0]
    for r in reqs:
        h, aux, li = r.hidden
        n = (h if h is not None else aux[0]).shape[0]
        last.append(qsl[-1] + li)
        qsl.append(qsl[-1] + n)
        hs.append(h)
        aux_lists.append(aux)
    if hs[0] is not None:
        batch.hidden_states = torch.cat(hs)
    if aux_lists[0] is not None:
        batch.aux_hidden_states = [torch.cat([a[i] for a in aux_lists]) for i in range(len(aux_lists[0]))]
    batch.query_start_loc = torch.tensor(qsl, dtype=torch.long, device=device)
    batch.last_hidden_indices = torch.tensor(last, dtype=torch.long, device=device)


def _prometheus_registry(prometheus: Any) -> Any:
    """The registry ``LLM(prometheus=...)`` names: None/False (off), True (the global one) or a
    ``CollectorRegistry``."""
    if prometheus is None or prometheus is False:
        return None
    import prometheus_client

    if prometheus is True:
        return prometheus_client.REGISTRY
    if isinstance(prometheus, prometheus_client.CollectorRegistry):
        return prometheus
    raise TypeError(f"prometheus={prometheus!r} is invalid: pass a prometheus_client.CollectorRegistry, True for "
                    "the default registry, or None to turn the counters off.")


def _as_prompt_list(prompts: Any) -> list[str | list[int]]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (np.ndarray, torch.Tensor)) and prompts.ndim in (1, 2):
        return [prompts] if prompts.ndim == 1 else list(prompts)  # one prompt of ids, or one per row
    if isinstance(prompts, (list, tuple)):
        if len(prompts) == 0:
            raise ValueError("prompts is an empty list: pass at least one prompt (a string or token ids).")
        if all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]
        return list(prompts)
    raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; got "
                    f"{type(prompts).__name__}.")

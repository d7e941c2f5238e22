"""LLM: an offline engine in vLLM's style, with or without speculative decoding.

Per step: propose -> build SpecDecodeMetadata -> one target forward over (last token + drafts) of
every running request -> rejection_sample -> append accepted tokens, commit their KV (rejected
drafts' KV is never committed) -> metrics -> stop checks. Without a speculative config the same
loop decodes one token per step: the baseline every speedup is measured against.

The parts (docs/engine.md): :mod:`specdec.requests` (request state and outputs),
:mod:`specdec.scheduler` (who runs: waiting, running, slots), :mod:`specdec.token_buffer` (token
rows, device mirror, DraftBatch), :mod:`specdec.verify` (draft checks, verification). This module
is the loop that runs them.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specdec.calls import Call, CallQueue
from specdec.config import SpeculativeConfig
from specdec.cpu_threads import CpuThreads, check_cpu_threads
from specdec.cuda_graphs import DEFAULT_PREFILL_GRAPH_TOKENS, tree_buckets
from specdec.keyed import keyed_plain_samples, keyed_row_samples
from specdec.metrics import SpecDecodingLogging, SpecDecodingProm, SpecDecodingStats, StepTimer
from specdec.policy import TIMED_PLAIN, SpeculationPolicy
from specdec.proposer import DraftBatch, Drafts, HiddenStateRequest, Proposer
from specdec.registry import create_proposer
from specdec.rejection_torch import compute_target_probs
from specdec.requests import Request, RequestMetrics, RequestOutput, make_requests
from specdec.runner import TargetOutput
from specdec.sampling import SamplingParams
from specdec.scheduler import Scheduler
from specdec.target import HFTargetModel, TargetModel
from specdec.token_buffer import TokenBuffer
from specdec.tp import from_rank0, is_tp
from specdec.validation import MAX_TREE_NODES, DeferredDrafts, DeferredTrees, check_llm_args, first_chains
from specdec.verify import DrawnSamples, Verifier, accept_deferred, greedy_tree_accept, tree_children, tree_depths

__all__ = ["LLM", "RequestOutput", "RequestMetrics", "StepTimer"]

logger = logging.getLogger("specdec.engine")

# consecutive plain steps (skipping a hidden-state proposer) that still collect the target's hidden states; later
# ones in the run collect none (bare steps: LLM._recompute_bare). Re-measurement bursts of plain steps (4) stay
# below it, so only a long plain run pays the recompute at its end (unless TIMED_BARE).
BARE_AFTER = 16
# With TIMED_BARE, plain steps the policy takes to time the plain mode (its warm-up, re-measurement bursts while
# drafting wins: specdec.policy.TIMED_PLAIN) go bare at once, so that they time what a long plain run costs, and the
# switch back into drafting pays their recompute (the policy counts it). Off by default: in the closed-loop
# simulation (benchmarks/policy_scenarios.py --only gpu --extra "--collect-ms C [--timed-bare]", s52) it gains where
# drafting ties plain (head-b32-tie 1.173 -> 1.109 of every step plain at a 0.12 ms collecting premium) but costs
# 3-6% where drafting pays (ep-pays 0.840 -> 0.867, pays-then-loses 0.977 -> 0.998: each burst then pays a long
# run's recompute, 16 ms for eagle3); the premium itself is not yet measured apart on the device.
TIMED_BARE = False
# ...on targets of these device types: on a GPU collecting and keeping the states costs host time a small step is
# short of (H200, batch 8: 0.71x of the baseline with every step plain, 1.02x bare); on a CPU the forward computes
# them anyway, and the recompute would be compute the step has to spare less than host time.
BARE_DEVICES = ("cuda",)


class TokensLeft(Sequence):
    """The tokens each request of a decode step may still generate (:meth:`LLM._tokens_left`), in the step's order,
    counted when first read: the speculation policy reads them only at the end-of-batch test of a drafting
    decision, and a plain run's steps skip it (counted every step, they cost the device machine's host ~1 us a
    request). Read it during the step it was made for; the counts are those of its first read."""

    __slots__ = ("_llm", "_reqs", "_counts")

    def __init__(self, llm: LLM, reqs: list[Request]) -> None:
        self._llm, self._reqs, self._counts = llm, reqs, None

    def _list(self) -> list[int]:
        if self._counts is None:
            left = self._llm._tokens_left
            self._counts = [left(r) for r in self._reqs]
        return self._counts

    def __len__(self) -> int:
        return len(self._reqs)

    def __getitem__(self, i: int | slice) -> int | list[int]:  # as a list's
        return self._list()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:  # equal to the list it stands for, as a list is
        return self._list() == list(other) if isinstance(other, (list, TokensLeft)) else NotImplemented

    __hash__ = None  # mutable-looking, as a list

    def __repr__(self) -> str:
        return f"TokensLeft({self._list()!r})"


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
        fused_forward: the target's forward through :class:`specdec.fused.FusedLlama` (fused projections
            and kernels): None (default) on CUDA and the CPU where supported (Llama, Mistral, Qwen2, Qwen3
            families), True wherever supported, False never; see :class:`specdec.ModelRunner`.
        cpu_threads: torch threads while a CPU engine runs its steps: ``"auto"`` (default) as many as the cores
            other processes left free since the engine last looked (``/proc/stat``; at most torch's count when the
            engine was built, at least 1; torch's setting is restored after each call), an int for that many, None
            to leave torch alone. On a 2-core machine with one core busy elsewhere, torch's default of 2 threads
            made every step 3.4x slower (see :mod:`specdec.cpu_threads`). Ignored on GPU engines.
        tensor_parallel_size: shard the target over this many ranks (run the script under ``torchrun
            --nproc-per-node N``; every rank builds the same ``LLM`` and calls ``generate`` with the same
            arguments); the policy's plan, the drafts and the verified tokens of each step are rank 0's on every
            rank (:mod:`specdec.tp`). Proposers run on every rank (a draft model replicated). 1: no sharding.
        overlap_steps: while the host reads and commits a plain decode step (no drafts) of greedy requests and
            seeded ones without top-k / top-p, the device already runs the next one (its inputs that step's
            tokens, taken on the device: the argmax, or the keyed sample drawn there; a replay of the same step
            graphs), used when every request of the batch goes on and the next step is plain too, dropped
            otherwise (its cache writes sit past the committed lengths, where nothing reads them). Output is
            unchanged; it hides the host's time per step (about 0.13 ms on an H200 host, 12% of a 1B target's
            batch-1 step). Without speculation every such step; with ``speculation_policy="auto"`` the plain
            steps the policy chooses, queued when it would choose plain again (:meth:`SpeculationPolicy.would_draft
            <specdec.policy.SpeculationPolicy.would_draft>`), so that its plain mode runs as fast as the baseline
            it is weighed against. Default True; acts only with step graphs, one rank, ``profile_steps`` off, and
            not with ``speculation_policy="fixed"`` (every step drafts), nor for batches holding an unseeded
            sampled request (its token comes from the rejection sampler's random stream) or a filtered one.
            ``llm.steps_queued`` counts the steps queued ahead, ``llm.steps_ahead`` those used (the others were
            dropped: a request stopped, a drafting step came next).

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
                 prometheus: Any = None, trust_draft_probs: bool = True,
                 fused_forward: bool | None = None, tensor_parallel_size: int = 1,
                 cpu_threads: str | int | None = "auto", overlap_steps: bool = True) -> None:
        check_cpu_threads(cpu_threads)
        registry, speculative_config = check_llm_args(
            max_num_seqs, cuda_graphs, log_interval_s, prometheus, speculative_config, admit_group,
            prefill_graph_tokens, trust_remote_code=trust_remote_code, trust_draft_probs=trust_draft_probs,
            log_stats=log_stats, profile_steps=profile_steps, overlap_steps=overlap_steps)
        self.trust_draft_probs = trust_draft_probs
        if isinstance(model, (str, Path, nn.Module)):
            model = HFTargetModel(model, dtype=dtype, device=device, max_model_len=max_model_len,
                                  tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                                  fused_forward=fused_forward, tensor_parallel_size=tensor_parallel_size)
        elif not all(hasattr(model, a) for a in ("forward", "advance", "device", "vocab_size")):
            raise TypeError(f"LLM(model={model!r}) is invalid: pass a local model directory (str or Path), a loaded "
                            "Hugging Face causal LM (nn.Module) or a specdec.TargetModel; the bundled test model is "
                            "specdec.bundled_model('tiny').")
        self.target: TargetModel = model
        # torch threads of a CPU engine's loop: the cores other processes leave free (specdec.cpu_threads)
        self.cpu_threads = CpuThreads(cpu_threads) if self.target.device.type == "cpu" else None
        self.tokenizer = getattr(model, "tokenizer", None)
        self.max_num_seqs = max_num_seqs
        self.admit_group = admit_group if admit_group is not None else max(1, max_num_seqs // 4)
        self.speculative_config: SpeculativeConfig | None = speculative_config
        self.proposer: Proposer | None = None
        k = 0
        if speculative_config is not None and speculative_config.num_speculative_tokens >= self.target.max_model_len:
            # A verify step of k + 1 tokens could never fit (nor could its CUDA graphs be captured).
            raise ValueError(f"num_speculative_tokens={speculative_config.num_speculative_tokens} is invalid: it "
                             f"must be < max_model_len={self.target.max_model_len}; typical values are 2-8.")
        self.target.allocate(max_num_seqs)  # slots first, so model-based proposers can size their caches to match
        if speculative_config is not None:
            self.proposer = create_proposer(speculative_config, self.target)
            k = speculative_config.num_speculative_tokens
        self.num_speculative_tokens = k
        self.policy: SpeculationPolicy | None = None  # speculation_policy="auto": which steps and requests draft
        if speculative_config is not None and speculative_config.speculation_policy == "auto":
            # a tree proposer's drafting steps also choose whole trees or their first-child chains
            self.policy = SpeculationPolicy(k, trees=self.proposer.max_tree_nodes() > 0
                                            and hasattr(self.target, "forward_tree"))
        self.stats = SpecDecodingStats(num_spec_tokens=max(k, 1))
        self._logging = SpecDecodingLogging(interval_s=log_interval_s) if log_stats else None
        self.prometheus: SpecDecodingProm | None = None
        if registry is not None:
            method = speculative_config.method if speculative_config is not None else "none"
            self.prometheus = SpecDecodingProm(max(k, 1), self.target.model_name, method, registry)
        self._calls = CallQueue()  # requests of every generate call in flight, from any thread
        self._scheduler = Scheduler(max_num_seqs, self.admit_group, self._calls)
        self._hidden_request = self.proposer.hidden_states_needed() if self.proposer else None
        self._ids = itertools.count()  # request ids; next() on a count is atomic under the GIL
        self.step_timer = StepTimer(enabled=profile_steps)
        self._verifier = Verifier(self.target, self.proposer, speculative_config, k)
        self._tokens = TokenBuffer(max_num_seqs, self.target.max_model_len, self.target.device,
                                   hidden=self._hidden_request is not None)
        # Greedy drafts a proposer leaves on the device go to the verify forward without a host round
        # trip (DeferredDrafts) where the target takes device ids; True: CPU drafts too (tests); False: never.
        self._defer_drafts: bool | None = None
        # a target that clamps device draft ids into its vocabulary itself takes them as drafted (one launch less)
        self._target_clamps = getattr(type(self.target), "clamps_draft_ids", False) is True
        self._tp = is_tp(self.target)  # tensor parallel: every step's decisions are rank 0's (_agree)
        if self._tp:
            self._defer_drafts = False  # drafts go through the host, where rank 0's are shared
        if cuda_graphs or (cuda_graphs is None and self.target.device.type == "cuda"):
            self._capture_graphs(prefill_graph_tokens)
        # overlap_steps: the next plain greedy step, queued on the device before this one's tokens are read
        self._overlap = (overlap_steps and (self.proposer is None or self.policy is not None) and not self._tp
                         and not profile_steps and hasattr(self.target, "forward_ahead"))
        self._ahead: tuple[list[Request], list[int], TargetOutput] | None = None
        # Long plain runs of a skippable hidden-state proposer collect no hidden states (bare steps, BARE_AFTER);
        # they are recomputed (forward_hidden) before its next call.
        self._bare_ok = (self._hidden_request is not None and self.proposer is not None and self.proposer.skippable
                         and self.policy is not None and not self._tp and hasattr(self.target, "forward_hidden")
                         and self.target.device.type in BARE_DEVICES)
        self._plain_run = 0  # consecutive decode steps that skipped the proposer
        self._timed_bare_on = TIMED_BARE  # (read once: a benchmark may set it on one engine of several)
        self._timed_bare = False  # with TIMED_BARE: this plain run went bare at a step the policy times: stays bare
        self._missed = False  # the last decode step skipped the proposer: leaving requests' last tokens unseen
        self._recompute_warm = not self._bare_ok  # the recompute has run once in this engine (_warm_recompute)
        self._drawn_host: torch.Tensor | None = None  # _drawn_copy's buffer
        self.steps_ahead = 0  # decode steps served by a step queued ahead (for tests and profiles)
        self.steps_queued = 0  # decode steps queued ahead: those not served were dropped (the batch changed)

    def _capture_graphs(self, prefill_graph_tokens: int | None) -> None:
        if not hasattr(self.target, "capture_graphs"):
            return
        k = self.num_speculative_tokens
        logger.info("Capturing CUDA graphs for the %s step...", "verify" if k else "decode")
        # A verify step where no request got a draft is a one-token step: it gets its own graphs
        # (T(1), not T(k+1); prompt-lookup methods find nothing to draft in many steps).
        if prefill_graph_tokens is None:
            prefill_graph_tokens = DEFAULT_PREFILL_GRAPH_TOKENS
        # A proposer that drafts token trees gets tree-verification graphs up to its largest tree.
        nodes = self.proposer.max_tree_nodes() if self.proposer is not None else 0
        nodes = min(int(nodes), MAX_TREE_NODES) if hasattr(self.target, "forward_tree") else 0
        kwargs = {"tree_lens": tree_buckets(nodes)} if nodes > 0 else {}
        self.target.capture_graphs(sorted({1, k + 1}), hidden=self._hidden_request,
                                   max_prefill_tokens=prefill_graph_tokens, **kwargs)

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
        requests = make_requests(prompts, sampling_params, self.tokenizer, self.target.vocab_size,
                                 self.target.max_model_len, self.target.device, self._ids)
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(requests), desc="Generating", unit="req", dynamic_ncols=True)
        call = Call(len(requests), bar, requests=requests)
        for r in requests:
            r.call = call
        try:
            self._calls.run(call, self._drive)
        finally:
            if bar is not None:
                bar.close()
        if call.error is not None:
            raise call.error
        if self._logging is not None:
            self._logging.log()
        return [r.to_output(self.tokenizer) for r in requests]

    # -- the loop ------------------------------------------------------------------------------
    def _drive(self, call: Call) -> None:
        """Run steps (any call's requests) until ``call`` is done. A failing step (admission, forward,
        sampling, a plugin hook, retiring) ends the calls of the requests in it (and, for an interrupt,
        this one) with its error; the engine stays usable."""
        if self.cpu_threads is None:
            self._steps(call)
        else:
            with self.cpu_threads.running():
                self._steps(call)

    def _steps(self, call: Call) -> None:
        while not call.done:
            retired: list[Request] = []
            try:
                if self._scheduler.idle:
                    self.target.allocate(self.max_num_seqs)  # same size: only resets every slot's length
                plan = self._scheduler.schedule()
                if plan.prefill:
                    self._prefill(plan.prefill)
                elif plan.decode:
                    self._decode_step(plan.decode)
                else:
                    raise RuntimeError(f"specdec: {call.remaining} request(s) of this generate call are neither "
                                       "waiting nor running (a bug in specdec's engine; please report it).")
                retired = self._scheduler.retire()
                self._retire(retired)
            except BaseException as exc:
                failed = [*self._scheduler.running, *retired]  # admitted requests run from schedule() on
                own = not isinstance(exc, Exception) or not failed  # an interrupt, or nobody else to blame
                self._abort(failed, exc, call if own else None)
                continue
            if self._logging is not None:
                self._logging.maybe_log()

    def _retire(self, retired: list[Request]) -> None:
        """Finished requests (out of the batch, slots free) leave the proposer and count towards their calls.
        After steps that skipped a :attr:`~specdec.Proposer.skippable` proposer, it gets the leaving requests'
        tokens it did not see first (:meth:`~specdec.Proposer.observe`, a batch of them without hidden states;
        suffix keeps them in its global tree)."""
        for r in retired:
            r.metrics.latency = time.perf_counter() - r.start_time
        if self._missed:
            leaving = [r for r in retired if r.in_proposer]
            if leaving:
                self.proposer.observe(self._tokens.draft_batch(leaving, self.num_speculative_tokens, hidden=False))
        for r in retired:
            self._release(r)  # a plugin's remove_request: may raise
        for r in retired:
            self._calls.finish(r)

    def _abort(self, failed: list[Request], error: BaseException, also: Call | None) -> None:
        """End the calls of ``failed`` (and ``also``) with ``error``; free their slots and proposer state."""
        self._ahead = None
        for r in failed:
            try:
                self._release(r)  # leave the proposer with no stale requests
            except Exception:  # the proposer is failing already: the call's error says why
                logger.debug("remove_request(%r) failed while aborting", r.req_id, exc_info=True)
        self._scheduler.abort(failed)
        calls = {r.call for r in failed} | ({also} if also is not None else set())
        self._calls.fail(calls, error)

    def _release(self, r: Request) -> None:
        if self.policy is not None:
            self.policy.forget(r.req_id)
        if r.in_proposer:
            r.in_proposer = False
            self.proposer.remove_request(r.req_id)

    def _prefill(self, reqs: list[Request]) -> None:
        """Requests that joined this step: their prompts go into their slots (KV emptied), then one
        forward over all of them samples each one's first token."""
        for r in reqs:
            self._tokens.write(r.slot, 0, r.prompt_ids)
            r.start_time = time.perf_counter()
            self.target.reset_slot(r.slot)
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
        self._tokens.keep_hidden(reqs, out, [len(r.prompt_ids) - 1 for r in reqs])
        sampled = self._agree(self._verifier.sample(reqs, [[] for _ in reqs], None, out))
        now = time.perf_counter()
        for r, row in zip(reqs, sampled):
            r.metrics.first_token_time = now - r.start_time
            self._append(r, [row[0]])
        timer.prefill_lap(len(reqs))

    def _decode_step(self, reqs: list[Request]) -> None:
        """One step of the running batch: propose, one target forward over (last token + drafts), verify."""
        if not self._recompute_warm:  # before the step's clock: its one-time cost is no plain step's (timed, it
            self._warm_recompute(reqs[0])  # set the policy's plain steps at 8.3 ms against ~0.5, H200, eagle3, b8)
        timer = self.step_timer
        timer.start()
        t0 = time.perf_counter()
        policy = self.policy
        widths, sampled_batch, remaining, ids = None, False, None, []
        if policy is not None:
            ids = [r.req_id for r in reqs]
            sampled_batch = any(r.params.temperature > 0 for r in reqs)  # the policy keeps such batches' costs apart
            # nobody waits to join: the batch only shrinks and ends with its longest request (policy.pays_at_end)
            remaining = None if len(self._calls) else TokensLeft(self, reqs)
            widths = self._agree(policy.plan(ids, sampled_batch, remaining))
        plain = widths is not None and not any(widths)
        skipped = plain and self.proposer.skippable
        self._missed = skipped
        if self._bare_ok:
            self._plain_run = self._plain_run + 1 if skipped else 0
            if not skipped:
                self._recompute_bare(reqs)
            # TIMED_BARE: a plain step timed against drafting runs as a long run's would, bare (collecting, it
            # measured ~0.9 ms against 0.62 at batch 32 on the H100, and drafting won at 0.87x of the baseline); so
            # does the rest of its run (a step may not collect after bare ones)
            if self._timed_bare_on:
                self._timed_bare = skipped and (self._timed_bare or policy.plain_reason in TIMED_PLAIN)
        hidden = self._collects(self._plain_run)  # what this step's forward collects
        k = self.num_speculative_tokens
        batch = None if skipped or self.proposer is None else self._tokens.draft_batch(reqs, k)
        trees = None
        if skipped or (plain and self.proposer.observe(batch)):
            drafts, probs, deferred = [[] for _ in reqs], None, None  # a plain step: the proposer drafts nothing
        else:
            drafts, probs, deferred, trees = self._propose(reqs, batch, widths)
        # Synchronised (profiles only) so device-side drafting counts as propose, not forward.
        timer.lap("propose", sync=self.target.device if deferred is not None else None)
        if trees is not None:
            self._tree_step(reqs, trees, t0)
            return
        slots = [r.slot for r in reqs]
        drawn = None  # a plain step's keyed samples, drawn on the device to queue the next step on them
        unpiped = False  # a plain step that could have queued the next one, but the next one drafts
        if deferred is None:
            plain_step = not any(drafts)
            out = self._take_ahead(reqs) if self._ahead is not None and plain_step else None
            self._ahead = None  # a step with drafts drops what was queued (it ran without them)
            if out is None:
                tokens = [[r.output[-1]] + d for r, d in zip(reqs, drafts)]
                out = self.target.forward(slots, tokens, [len(t) for t in tokens], hidden)
            # without step graphs nothing can be queued (and a seeded request's own keyed path is faster)
            if (self._overlap and plain_step and getattr(self.target, "graphs", None) is not None
                    and self._queueable(reqs)):
                if policy is not None and policy.would_draft(ids, sampled_batch, remaining):
                    unpiped = True  # the next step drafts: this one runs alone, its host work not overlapped
                else:  # the next step is plain too: bare once the run is long enough
                    drawn = self._queue_ahead(reqs, out, self._collects(self._plain_run + 1))
        else:  # the drafts' ids are written on the device; the host packs placeholders
            self._ahead = None
            tokens = [[r.output[-1]] + [0] * w for r, w in zip(reqs, deferred.widths)]
            out = self.target.forward(slots, tokens, [len(t) for t in tokens], self._hidden_request,
                                      draft_ids=deferred.raw_ids if self._target_clamps else deferred.device_ids)
        if self.proposer is not None:  # host work in the forward's shadow (a profile counts it as forward)
            self.proposer.while_verifying()
        timer.lap("forward", sync=self.target.device)
        if deferred is None:
            sampled = self._agree(self._verifier.sample(reqs, drafts, probs, out, drawn))
        else:
            drafts, sampled = accept_deferred(deferred, out, reqs)  # the step's one wait for the device
        timer.lap("sample")
        self._commit(reqs, drafts, sampled, out, carry=skipped)
        if policy is not None:
            policy.observe(ids, [len(d) for d in drafts], [len(s) - 1 for s in sampled],
                           time.perf_counter() - t0, tree=False if policy.trees else None, sampled=sampled_batch,
                           unpiped=unpiped)
        timer.lap("bookkeeping")
        timer.steps += 1
        timer.rows += len(reqs)

    def _collects(self, plain_run: int) -> HiddenStateRequest | None:
        """The hidden states a step collects as the ``plain_run``-th plain step in a row: none (a bare step) past
        :data:`BARE_AFTER`, or (:data:`TIMED_BARE`) in a run that went bare at a step the policy times, where bare
        steps apply; else the proposer's."""
        return None if self._bare_ok and (plain_run > BARE_AFTER or self._timed_bare) else self._hidden_request

    def _warm_recompute(self, req: Request) -> None:
        """Once, at an engine's first decode step: a one-token recompute (``forward_hidden`` of ``req``'s first
        position, discarded). On the H200 (s27, random eagle3 head, batch 8) a recompute of 8 x 64 positions took
        67 ms in a timed pass against 12-19 ms for later calls at new widths (s26), and every eagle3@auto row's first
        timed pass ran 25-50 ms slower than its second (0.68-0.88x of the baseline, then 0.86-1.00x): likely a
        first call's one-time cost in the process (lazily loaded kernels), now paid at the first decode step, not
        at a switch (not yet confirmed on the device: ``benchmarks/recompute_first.py`` tells the two apart)."""
        self._recompute_warm = True
        self.target.forward_hidden([req.slot], [[int(self._tokens.host[req.slot, 0])]], [0], self._hidden_request)

    def _recompute_bare(self, reqs: list[Request]) -> None:
        """Before the proposer's call: the hidden states of the bare steps of ``reqs`` (plain steps of a long run
        that collected none), in one forward over their inputs that reads the cache and writes nothing to it
        (``forward_hidden``), kept as those steps would have kept them. On the H200 a head method's plain step
        spent ~100-200 us more host time than the baseline's collecting and keeping its states, in a step the host
        bounds (batch 8, short prompts: 0.71x of the baseline with every step plain); a long run now pays one
        forward over its positions at the switch back into drafting, which the policy counts in that switch (over the
        last position alone for a proposer that reads no other: ``HiddenStateRequest.all_positions=False``)."""
        bare = [r for r in reqs if r.bare is not None]
        if bare:
            last = not self._hidden_request.all_positions  # the proposer reads each request's last position alone
            slots, tokens, starts = self._tokens.bare_inputs(bare, last)
            self._tokens.fill_bare(bare, self.target.forward_hidden(slots, tokens, starts, self._hidden_request), last)

    def _queue_ahead(self, reqs: list[Request], out: TargetOutput,
                     hidden: HiddenStateRequest | None) -> DrawnSamples | None:
        """With ``overlap_steps`` and step graphs: queue the step after ``out`` (a plain step of ``reqs``, tokens
        unread); the caller has checked :meth:`_queueable` (every request has room for two more tokens, none frees
        its slot by length; the scheduler would not admit waiting requests next, a prefill step; requests waiting
        for slots that stay taken do not stop it; every request is greedy or seeded without top-k / top-p).
        ``hidden``: what the queued step collects (None: a bare step). A seeded request's token is its keyed
        sample (:func:`~specdec.keyed.keyed_plain_samples`, drawn here on the device, one launch for the batch),
        which the queued step takes as its input. Returns those samples, copied to the host before the queued step (a
        read behind it would wait for it), for this step's verification to read (None when nothing was drawn).
        Unseeded sampled requests draw from the rejection sampler's random stream, filtered ones race over filtered
        probabilities: not queued."""
        keyed = [i for i, r in enumerate(reqs) if r.params.temperature != 0]
        drawn = sampled = None
        if keyed:
            ps = [reqs[i].params for i in keyed]
            ids = keyed_plain_samples(out.logits, keyed, [reqs[i].num_tokens for i in keyed],
                                      [p.temperature for p in ps], [p.seed for p in ps])
            at = torch.tensor(keyed)
            at = at.pin_memory().to(ids.device, non_blocking=True) if ids.is_cuda else at  # no wait for the device
            drawn, sampled = self._drawn_copy(keyed, ids), (at, ids)
        slots = [r.slot for r in reqs]
        nxt = self.target.forward_ahead(out, slots, hidden, sampled)
        if nxt is not None:
            self.steps_queued += 1
            self._ahead = (list(reqs), [self.target.lengths[s] + 1 for s in slots], nxt)
        return drawn

    def _queueable(self, reqs: list[Request]) -> bool:
        """The host-side conditions of :meth:`_queue_ahead`: no request frees its slot by length within two tokens,
        nobody is admitted next, and every request is greedy, or seeded without top-k / top-p."""
        if self._scheduler.admits() or any(self._tokens_left(r) < 2 for r in reqs):
            return False
        return not any(r.params.temperature != 0 and (r.params.seed is None or r.params.top_k or r.params.top_p < 1.0)
                       for r in reqs)

    def _drawn_copy(self, indices: list[int], ids: torch.Tensor) -> DrawnSamples:
        """``ids`` copied into a host buffer kept for it (pinned on a GPU, so the copy is queued without waiting),
        with an event after the copy: the step's samples, readable before the step queued behind them is done. One
        buffer serves every step: a step's samples are read before the next step draws its own."""
        n, cuda = ids.numel(), ids.is_cuda
        if self._drawn_host is None or self._drawn_host.numel() < n:
            self._drawn_host = torch.empty(max(n, self.max_num_seqs), dtype=torch.long, pin_memory=cuda)
        host = self._drawn_host[:n]
        host.copy_(ids, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return DrawnSamples(indices, host, event)

    def _take_ahead(self, reqs: list[Request]) -> TargetOutput | None:
        """The step queued ahead, when it is this step: the same requests in the same order, each at the length it
        was queued for (so each committed exactly the token it was given); otherwise None (it is dropped)."""
        queued, starts, out = self._ahead
        self._ahead = None
        lengths = self.target.lengths
        if len(queued) != len(reqs) or any(a is not b or lengths[b.slot] != s
                                           for a, b, s in zip(queued, reqs, starts)):
            return None
        self.steps_ahead += 1
        return out

    def _propose(self, reqs: list[Request], batch: DraftBatch | None, widths: list[int] | None = None
                 ) -> tuple[list[list[int]], torch.Tensor | None, DeferredDrafts | None, list | None]:
        """This step's drafts (at most ``widths[i]`` for request i, the policy's plan): checked lists and their
        probs, or (greedy batches whose drafts sit on the target's device) :class:`DeferredDrafts` for the
        verify forward to read there; or, last, checked token trees (:attr:`Drafts.parents`) when the whole
        batch can be verified over trees (:meth:`_tree_step`, a target with ``forward_tree``; otherwise each
        tree's first-child chain)."""
        if self.proposer is None:
            return [[] for _ in reqs], None, None, None
        result = self.proposer.propose(batch)
        if isinstance(result, Drafts) and result.parents is not None:
            chains = self.policy is not None and self.policy.trees and not self.policy.tree_step
            if hasattr(self.target, "forward_tree") and not chains and not self._tp:
                deferred = self._verifier.deferred_trees(result, batch, reqs, widths, self._defer_drafts)
                if deferred is not None:  # the tree forward reads them on the device: no wait for the drafting
                    return [], None, None, deferred
            trees = self._agree(self._verifier.checked_trees(result, batch, reqs, caps=widths))
            if hasattr(self.target, "forward_tree") and not chains:
                return [], None, None, trees
            return first_chains(trees), None, None, None  # checked above; verified as chains, one-hot
        drafts, probs, deferred = self._verifier.checked_drafts(result, batch, reqs, self.trust_draft_probs,
                                                                self._defer_drafts, caps=widths)
        if self._tp:
            drafts = self._agree(drafts)
        return drafts, probs, deferred, None

    def _agree(self, decided: Any) -> Any:
        """Under tensor parallelism, rank 0's ``decided`` (a plan, drafts, verified tokens) on every rank, so that
        every rank issues the same forwards and appends the same tokens; else ``decided`` itself."""
        return from_rank0(decided) if self._tp else decided

    def _tree_step(self, reqs: list[Request], trees: list[tuple[list[int], list[int]]] | DeferredTrees, t0: float
                   ) -> None:
        """The rest of a decode step whose drafts are token trees: one target forward over every request's tree
        (``forward_tree``, or ``forward_tree_ids`` for :class:`~specdec.validation.DeferredTrees`, checked on the
        host after it; a captured tree graph where one fits); per request a path: for greedy and seeded
        requests the longest path whose every token is what the target emits there (:meth:`_tree_targets`,
        :func:`~specdec.verify.greedy_tree_accept`), for unseeded sampled ones recursive rejection over siblings
        (:meth:`_tree_rejection`); its KV entries kept (``keep_paths``), then the step's bookkeeping as for
        chains."""
        timer = self.step_timer
        self._ahead = None
        slots = [r.slot for r in reqs]
        if isinstance(trees, DeferredTrees):
            roots = [r.output[-1] for r in reqs]
            out = self.target.forward_tree_ids(slots, roots, trees.ids, trees.parents, trees.lens,
                                               self._hidden_request)
        else:
            tokens = [[r.output[-1]] + t for r, (t, _) in zip(reqs, trees)]
            parents = [[p + 1 for p in par] for _, par in trees]
            out = self.target.forward_tree(slots, tokens, parents, self._hidden_request)
        timer.lap("forward", sync=self.target.device)
        argmax = out.greedy_token_ids()  # the wait for the forward (deferred trees: their host copy was queued before)
        if isinstance(trees, DeferredTrees):
            tokens, parents = trees.nodes(roots)  # checked only now; a dropped node's token is -1: never accepted
        targets = self._tree_targets(reqs, tokens, parents, out, argmax)
        row, paths, sampled = 0, [], []
        for r, tk, par in zip(reqs, tokens, parents):
            if r.params.free:
                path, new = self._tree_rejection(r, tk, par, out.logits[row: row + len(tk)])
            else:
                path, new = greedy_tree_accept(tk, par, targets[row: row + len(tk)])
            paths.append(path)
            sampled.append(new)
            row += len(tk)
        paths, sampled = self._agree((paths, sampled))
        timer.lap("sample")
        if hasattr(self.target, "keep_paths"):
            self.target.keep_paths([r.slot for r in reqs], paths)
        else:
            for r, path in zip(reqs, paths):
                self.target.keep_path(r.slot, path)
        # Metrics and the policy count a tree's depth as its drafts (the positions it drafted, <= k) and its
        # accepted path's length as accepted.
        depths = [max(d for d, t in zip(tree_depths(par), tk) if t >= 0) for tk, par in zip(tokens, parents)]
        if self._hidden_request is not None:  # the proposer's next hand-over: each accepted path's rows, in order
            qsl = out.query_start_loc.tolist()
            rows = torch.tensor([qsl[i] + n for i, path in enumerate(paths) for n in path], device=self.target.device)
            out = dataclasses.replace(
                out, query_start_loc=torch.tensor([0] + list(itertools.accumulate(len(p) for p in paths))),
                hidden_states=None if out.hidden_states is None else out.hidden_states.index_select(0, rows),
                aux_hidden_states=None if out.aux_hidden_states is None else [
                    a.index_select(0, rows) for a in out.aux_hidden_states])
        self._commit(reqs, [[0] * d for d in depths], sampled, out, advanced=True)
        if self.policy is not None:
            self.policy.observe([r.req_id for r in reqs], depths, [len(s) - 1 for s in sampled],
                                time.perf_counter() - t0, tree=True,
                                sampled=any(r.params.temperature > 0 for r in reqs))
        timer.lap("bookkeeping")
        timer.steps += 1
        timer.rows += len(reqs)

    def _tree_rejection(self, r: Request, tokens: list[int], parents: list[int], logits: torch.Tensor
                        ) -> tuple[list[int], list[int]]:
        """An unseeded sampled request's tree, verified by recursive rejection over siblings (one-hot drafts):
        at each node, with ``p`` the target's distribution there (temperature, top-k, top-p), child ``c`` is
        accepted with probability ``p(c)``; a rejected child's token is removed from ``p`` (renormalised) before
        the next sibling; with every child rejected the token is drawn from what is left. Each emitted token then
        follows the target's distribution whatever the tree (a one-hot draft ``q = e_c`` gives ``min(1, p/q) =
        p(c)`` and the residual ``max(0, p - q)`` normalised: ``p`` without ``c``). Returns the path and tokens
        like :func:`~specdec.verify.greedy_tree_accept`; draws from torch's global generator."""
        p = r.params
        dev = logits.device
        probs = compute_target_probs(
            logits, torch.full((len(tokens),), float(p.temperature), device=dev),
            torch.full((len(tokens),), int(p.top_k), device=dev) if p.top_k else None,
            torch.full((len(tokens),), float(p.top_p), device=dev) if p.top_p < 1.0 else None)
        children = tree_children(parents)
        path = [0]
        while True:
            q = probs[path[-1]].clone()
            nxt = None
            for c in children.get(path[-1], ()):
                if tokens[c] < 0:  # a node the checks dropped
                    continue
                mass = float(q.sum())
                if mass <= 0:
                    break
                if float(torch.rand((), device=dev)) * mass < float(q[tokens[c]]):
                    nxt = c
                    break
                q[tokens[c]] = 0.0  # rejected: the residual is p without this token
            if nxt is None:
                return path, [tokens[n] for n in path[1:]] + [int(torch.multinomial(q, 1))]
            path.append(nxt)

    def _tree_targets(self, reqs: list[Request], tokens: list[list[int]], parents: list[list[int]], out: Any,
                      argmax: list[int]) -> list[int]:
        """The token the target emits at every tree node: the argmax for a greedy request; for a seeded sampled
        one its keyed sample (:mod:`specdec.keyed`) of the position the node predicts (the request's length
        plus the node's depth), so walking down while a child equals it gives the baseline's own keyed output.
        ``argmax``: every node's argmax (``out.greedy_token_ids()``)."""
        targets = argmax
        keyed = [i for i, r in enumerate(reqs) if r.params.keyed]
        if not keyed:
            return targets
        targets = list(targets)  # the output's own list stays as it is
        offsets = list(itertools.accumulate([0] + [len(t) for t in tokens]))
        rows, positions, owner = [], [], []
        for j, i in enumerate(keyed):
            depth = tree_depths(parents[i])
            rows += range(offsets[i], offsets[i + 1])
            positions += [reqs[i].num_tokens + d for d in depth]
            owner += [j] * len(depth)
        ps = [reqs[i].params for i in keyed]
        x = keyed_row_samples(out.logits, rows, owner, positions, [p.temperature for p in ps],
                              [p.top_k for p in ps], [p.top_p for p in ps], [p.seed for p in ps])
        for row, t in zip(rows, x):
            targets[row] = t
        return targets

    def _commit(self, reqs: list[Request], drafts: list[list[int]], sampled: list[list[int]], out: Any,
                carry: bool = False, advanced: bool = False) -> None:
        """Each request keeps its verified tokens (accepted drafts + one) and their KV; metrics count them.
        ``carry``: the proposer was skipped, so the hidden states it has not seen are kept for its next call.
        ``advanced``: the KV is already committed (a tree step's ``keep_path``)."""
        drafted, accepted_per_req = [len(d) for d in drafts], [len(new) - 1 for new in sampled]
        advance = self.target.advance
        for r, n, accepted, new in zip(reqs, drafted, accepted_per_req, sampled):
            if not advanced:
                advance(r.slot, 1 + accepted)
            m = r.metrics
            m.num_steps += 1
            if n:
                m.num_drafts += 1
                m.num_draft_tokens += n
                m.num_accepted_tokens += accepted
            self._append(r, new)
        self.stats.observe_drafts(drafted, accepted_per_req)
        self._tokens.keep_hidden(reqs, out, accepted_per_req, carry=carry)
        if self._logging is not None or self.prometheus is not None:
            step = SpecDecodingStats(self.stats.num_spec_tokens)  # this step's drafts alone
            step.observe_drafts(drafted, accepted_per_req)
            if self._logging is not None:
                self._logging.observe(step, num_generated_tokens=sum(accepted_per_req) + len(reqs))
            if self.prometheus is not None:
                self.prometheus.inc(step.num_drafts, step.num_draft_tokens, step.num_accepted_tokens,
                                    step.num_accepted_tokens_per_pos)

    def _tokens_left(self, r: Request) -> int:
        """Tokens ``r`` may still generate: up to its ``max_tokens`` and to the target's ``max_model_len``."""
        return min(r.params.max_tokens - len(r.output), self.target.max_model_len - r.num_tokens)

    def _append(self, r: Request, new: list[int]) -> None:
        """Append sampled tokens, stopping at EOS / stop ids / max_tokens / max_model_len."""
        p = r.params
        eos = () if p.ignore_eos else getattr(self.target, "eos_token_ids", ())
        start = r.num_tokens
        room = self._tokens_left(r)  # >= 1 while running
        take = new[:room]
        if room <= len(new):
            r.finish_reason = "length"
        for i, t in enumerate(take):
            if t in eos or t in p.stop_token_ids:
                take, r.finish_reason = take[: i + 1], "stop"
                break
        self._tokens.write(r.slot, start, take)
        r.output.extend(take)
        r.num_tokens += len(take)
        r.last_sampled = take

"""The model runner: any Hugging Face causal LM over batches of KV-cache slots, eager or from CUDA graphs.

:class:`ModelRunner` is what the engine verifies with (the target) and what a plugin runs its own
model with (a draft model, a head's transformer layer): one runtime for every model. It owns

- slots and per-slot lengths (``lengths[slot]`` tokens have committed KV entries), with rollback by
  moving the length back (:meth:`ModelRunner.advance` with a negative count): no cache copies;
- packing of a step's inputs (:func:`specdec.layout.pack_tokens`, :func:`specdec.layout.logit_rows`);
- the forward over fixed-shape tensors that CUDA graphs capture (:meth:`ModelRunner.step_tensors`,
  :meth:`ModelRunner.run`), eager forwards over any batch (:meth:`ModelRunner.forward`), and captured
  forwards over batch / query / KV-length buckets (:meth:`ModelRunner.capture_graphs`, built on
  :func:`specdec.cuda_graphs.capture_buckets`, the capture helper shared with plugins' draft chains);
- logits for chosen rows and the hidden states of chosen layers (:class:`specdec.HiddenStateRequest`),
  written into static buffers inside the graphs.

``docs/runner.md`` shows a plugin that runs its own small model on it. ``HFTargetModel`` (the name the
target has always had) is this class.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdec.cuda_graphs import GraphRunner
from specdec.kernels import triton_available
from specdec.kv_cache import SlotKVCache
from specdec.layout import (
    adjacent_columns,
    check_tree_parents,
    logit_rows,
    pack_tokens,
    tree_layout_device,
    tree_node_inputs,
)
from specdec.loading import has_tokenizer_files, load_causal_lm, load_tokenizer, read_json_object
from specdec.proposer import HiddenStateRequest
from specdec.tp import check_tp_device, check_tp_launch, local_kv_heads, tp_load_kwargs

logger = logging.getLogger("specdec.runner")
# Tree steps' positions, write positions and mask by one Triton launch on CUDA (ModelRunner.tree_step_tensors); False:
# the torch steps there too.
TREE_KERNEL = True
# keep_paths: up to this many slots with KV entries to move take an index_select and an index_copy_ each (a tree step
# at small batch; advanced indexing over the cache cost ~100 us of host time there), more one gather and one scatter
FEW_SLOT_MOVES = 4

# SDPA backends of eager forwards over ever-new shapes (no per-shape plan to build, unlike cuDNN's)
NO_PLAN_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

__all__ = ["ModelRunner", "TargetOutput", "adjacent_columns", "kv_cache_bytes", "resolve_device", "resolve_dtype"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(slots=True)
class TargetOutput:
    """Result of one forward over a batch of slots.

    Attributes:
        logits: ``[R, V]`` float32 logits, request by request: for request i the last
            ``num_logits[i]`` of its input positions (the sampler's layout when
            ``num_logits[i] = drafts + 1``).
        query_start_loc: ``[B + 1]`` offsets of each request's positions in the hidden states, on
            the host (building them never waits for the device).
        hidden_states: ``[T, H]`` final hidden states of every processed position (when asked).
        aux_hidden_states: requested auxiliary layers, each ``[T, H]`` (when asked). The hidden states are
            tensors of their own (no later forward writes them): the engine keeps row ranges of them across
            steps where the speculation policy skips the proposer.
    """

    logits: torch.Tensor
    query_start_loc: torch.Tensor
    hidden_states: torch.Tensor | None = None
    aux_hidden_states: list[torch.Tensor] | None = None
    # Set by a CUDA-graph replay: the argmax of every logits row, computed inside the graph and on its
    # way to pinned host memory (see greedy_token_ids).
    host_argmax: Any = None

    def greedy_token_ids(self) -> list[int]:
        """The argmax of every ``logits`` row, on the host: the greedy tokens. After a graph replay
        this waits for the argmax the graph already computed (a small copy, no extra kernel);
        otherwise it takes the argmax of ``logits`` here. Either way it is the step's one
        device-to-host read."""
        if self.host_argmax is not None:
            ids = self.host_argmax.read()
            if ids is not None:
                return ids
        return self.logits.argmax(-1).tolist()


def resolve_device(device: str | int | torch.device | None, default: torch.device | None = None) -> torch.device:
    """``device`` as a torch.device this machine has (None: ``default``, else CUDA when available, else
    the CPU). Unknown names, a missing CUDA or a GPU index out of range raise ValueError naming it."""
    if device is None:
        return default if default is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device={device!r} is invalid: pass 'cpu', 'cuda', 'cuda:N' or a torch.device.")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"device={device!r} is invalid: use 'cpu', 'cuda' or 'cuda:N' (N a GPU index).") from exc
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device={device!r} is invalid: CUDA is not available here (torch {torch.__version__}); "
                             "pass device='cpu'.")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r} is invalid: this machine has {count} CUDA device(s), "
                             f"cuda:0 to cuda:{count - 1}.")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``"auto"``/None -> float32 on CPU, bfloat16 on CUDA; names and torch dtypes pass through."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is invalid: use one of 'auto', {', '.join(map(repr, _DTYPES))}.")
    return _DTYPES[dtype]


class ModelRunner:
    """Runs any Hugging Face causal LM over batches of slots with a :class:`SlotKVCache`: the target
    the engine verifies with (``specdec.HFTargetModel`` is this class) and any model a plugin runs.

    The parts a plugin uses beside :meth:`forward` (see ``docs/runner.md``): ``lengths`` (committed
    tokens per slot), :meth:`allocate` / :meth:`ensure_slots` / :meth:`reset_slot` / :meth:`advance`
    (negative counts roll back), :meth:`step_tensors` and :meth:`run` (the fixed-shape forward CUDA graphs
    capture), :meth:`compute_logits`, :attr:`scratch_position`, ``cache`` (its ``keys``/``values``
    per layer, ``[slots, kv_heads, max_model_len + 1, head_dim]``), ``config``, ``base`` (the decoder),
    ``lm_head`` and :meth:`capture_graphs`.

    Args:
        model: a local path or an already loaded ``PreTrainedModel``. A module passed in is used as it
            is: in its own dtype and on its own device unless ``dtype``/``device`` ask for others (then
            ``nn.Module.to`` converts it in place: the caller's object changes); it must be in eval
            mode (``model.eval()``; ``from_pretrained`` returns it so), which specdec does not switch
            for you.
        dtype: ``"auto"`` (for a path: float32 on CPU, bfloat16 on CUDA; for a module: its own), a
            name, or a torch dtype.
        device: ``"cpu"``, ``"cuda"``...; defaults to CUDA when available (a module: its own device).
        max_model_len: longest sequence (prompt + output); defaults to the model's
            ``max_position_embeddings``.
        tokenizer: a tokenizer, a path, or None to load one from the model path if present.
        trust_remote_code: let transformers import Python files from the model (and tokenizer)
            directory; off by default, and a directory that needs them is refused with this flag in
            the message. Stored as ``self.trust_remote_code`` for proposers that load their own models.
        fused_forward: run the model through :class:`specdec.fused.FusedLlama` (fused q/k/v and gate/up
            projections, fused residual+RMSNorm, rotary+KV-write and SiLU*up kernels; Triton on CUDA) instead
            of Hugging Face's layers. None (default): on CUDA and the CPU where :func:`specdec.fused.fused_support`
            accepts the model (Llama, Mistral, Qwen2, Qwen3 families; on the CPU its torch ops: for the bundled
            tiny model 1.27-1.51x Hugging Face's layers' tok/s at batch 1, 1.13-1.18x at batch 8, 1.01-1.05x at batch
            32, ``benchmarks/cpu_forward.py``), else off; True: wherever supported, refusing an unsupported model
            with the reason; False: never. The arithmetic is Hugging Face's with rounding in another order
            (float32: equal within 1e-5; bf16: near-ties may differ). Where the model was loaded from a path its
            q/k/v and gate/up weights become views of the concatenated ones (no extra memory); a module passed in
            keeps its own and the fused copies add their size.
        ``self.fused``: the :class:`~specdec.fused.FusedLlama` in use, or None; ``self.fused_reason``: why not.
        tensor_parallel_size: shard the target over this many processes (launched by ``torchrun``, one per device)
            with transformers' TP plan (:mod:`specdec.tp`; needs ``accelerate``); each rank's KV cache holds its own
            KV heads. 1 (default): no sharding. Under TP the forward runs eagerly (no CUDA graphs yet) through
            Hugging Face's layers.
    """

    accepts_draft_ids = True  # forward() takes draft_ids (see TargetModel)
    clamps_draft_ids = True  # ... and clamps them into the vocabulary itself (the engine need not)

    def __init__(self, model: str | Path | nn.Module, dtype: str | torch.dtype | None = "auto",
                 device: str | torch.device | None = None, max_model_len: int | None = None,
                 tokenizer: Any = None, trust_remote_code: bool = False, fused_forward: bool | None = None,
                 tensor_parallel_size: int = 1) -> None:
        if not isinstance(trust_remote_code, bool):
            raise TypeError(f"trust_remote_code={trust_remote_code!r} is invalid: it must be True or False.")
        self.trust_remote_code = trust_remote_code
        if not (tokenizer is None or isinstance(tokenizer, (str, Path)) or _is_tokenizer(tokenizer)):
            raise TypeError(f"tokenizer={tokenizer!r} ({type(tokenizer).__name__}) is invalid: pass a tokenizer "
                            "object (with encode and decode), the path of a directory tokenizer.save_pretrained "
                            "wrote, or None (the tokenizer saved with the model, if any).")
        if isinstance(tokenizer, (str, Path)):  # before the model: a wrong path fails fast
            tokenizer = load_tokenizer(str(tokenizer), trust_remote_code)
        self.tp_size = check_tp_launch(tensor_parallel_size)
        if self.tp_size > 1:
            if not isinstance(model, (str, Path)):
                raise TypeError(f"tensor_parallel_size={self.tp_size} needs the model's path (each rank loads its "
                                f"shard), not a loaded {type(model).__name__}.")
            self.model_name = str(model)
            check_tp_device(self.tp_size, resolve_device(device))
            hf_model = load_causal_lm(str(model), resolve_dtype(dtype, resolve_device(device)), trust_remote_code,
                                      **tp_load_kwargs(self.tp_size))
            self.device = next(hf_model.parameters()).device  # the rank's device, placed by transformers
            self.dtype = next(hf_model.parameters()).dtype
            if tokenizer is None and has_tokenizer_files(str(model)):
                tokenizer = load_tokenizer(str(model), trust_remote_code)
        elif isinstance(model, (str, Path)):
            self.device = resolve_device(device)
            self.dtype = resolve_dtype(dtype, self.device)
            self.model_name = str(model)
            hf_model = load_causal_lm(str(model), self.dtype, trust_remote_code).to(self.device)
            if tokenizer is None and has_tokenizer_files(str(model)):
                tokenizer = load_tokenizer(str(model), trust_remote_code)
        elif isinstance(model, nn.Module):
            hf_model = self._adopt(model, dtype, device)
            self.model_name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
        else:
            raise TypeError(f"model must be a path or a torch.nn.Module, got {type(model).__name__}.")
        self.tokenizer = tokenizer
        self.hf_model = hf_model
        self.config = self.hf_model.config
        self.base = self.hf_model.base_model
        self.lm_head = self.hf_model.get_output_embeddings()
        if self.lm_head is None or self.base is self.hf_model:
            raise ValueError(f"{type(self.hf_model).__name__} has no LM head/base model split; "
                             "specdec needs a *ForCausalLM model.")
        self.vocab_size = int(self.config.vocab_size)
        self.num_layers = int(self.config.num_hidden_layers)
        model_max = int(getattr(self.config, "max_position_embeddings", 0) or 0) or 2048
        if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 2):
            raise ValueError(f"max_model_len={max_model_len!r} is invalid: it must be an int >= 2.")
        if max_model_len is not None and max_model_len > model_max:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings="
                             f"{model_max}; pass max_model_len <= {model_max}.")
        self.max_model_len = max_model_len or model_max
        eos = getattr(self.config, "eos_token_id", None)
        if eos is None and tokenizer is not None:
            eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = set(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
        self._cache_kwarg = "cache" if "cache" in inspect.signature(self.base.forward).parameters \
            else "past_key_values"
        self.cache: SlotKVCache | None = None
        self.lengths: list[int] = []
        self.graphs: GraphRunner | None = None  # set by capture_graphs
        self._taps: dict[int, torch.Tensor] | None = None  # hidden states the layer hooks keep during run()
        self._tapped: set[int] = set()  # hidden-state indices with a hook installed
        self._tap_ok: dict[tuple[int, ...], bool] = {}  # _tap's answer per set of indices
        self.fused, self.fused_reason = self._build_fused(fused_forward, owned=isinstance(model, (str, Path)))

    def _build_fused(self, choice: bool | None, owned: bool) -> tuple[Any, str | None]:
        """The fused forward ``fused_forward`` asks for, or None and the reason (see the class docstring)."""
        if choice not in (None, True, False):
            raise TypeError(f"fused_forward={choice!r} is invalid: it must be None (on CUDA and the CPU where "
                            "supported), True or False.")
        if choice is False:
            return None, "fused_forward=False"
        if self.tp_size > 1:
            if choice:
                raise ValueError("fused_forward=True cannot run a tensor-parallel target (it needs whole weights); "
                                 "pass fused_forward=None or False.")
            return None, "tensor parallel (the fused forward needs whole weights)"
        from specdec.fused import FusedLlama, fused_support  # the module imports triton only when it runs it

        reason = fused_support(self)
        if reason is not None:
            if choice:
                raise ValueError(f"fused_forward=True cannot run {self.model_name!r}: {reason}; pass "
                                 "fused_forward=None (Hugging Face's layers where unsupported) or False.")
            return None, reason
        if choice is None and self.device.type not in ("cuda", "cpu"):
            return None, f"on {self.device.type} (pass fused_forward=True to use it there)"
        return FusedLlama(self, share_weights=owned), None

    def _adopt(self, model: nn.Module, dtype: str | torch.dtype | None, device: str | torch.device | None
               ) -> nn.Module:
        """A caller's module: kept in its own dtype and device unless others were asked for (then converted
        in place), and never switched out of training mode behind the caller's back."""
        if model.training:
            raise ValueError(f"model {type(model).__name__} is in training mode (dropout on): call model.eval() "
                             "before passing it; specdec leaves a module you pass in as it is.")
        first = next((t for t in itertools.chain(model.parameters(), model.buffers()) if t.is_floating_point()),
                     None)
        own_dtype = first.dtype if first is not None else torch.float32
        self.device = resolve_device(device, first.device if first is not None else torch.device("cpu"))
        self.dtype = own_dtype if dtype in (None, "auto") else resolve_dtype(dtype, self.device)
        if device is not None or self.dtype != own_dtype:
            model.to(device=self.device, dtype=self.dtype)
        return model

    # -- KV slots ----------------------------------------------------------------------------
    def allocate(self, num_slots: int) -> None:
        """(Re)allocate ``num_slots`` empty slots of ``max_model_len`` positions each."""
        if self.cache is not None and len(self.lengths) == num_slots:
            self.lengths = [0] * num_slots
            return
        self.graphs = None  # captured graphs point at the old buffers
        cfg = self.config
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        kv_heads = local_kv_heads(self.hf_model, kv_heads, self.tp_size)  # this rank's shard under TP
        self.cache = None  # let the old buffers go before the new ones are counted and allocated
        _check_kv_memory(num_slots, self.num_layers, kv_heads, head_dim, self.max_model_len, self.dtype,
                         self.device)
        self.cache = SlotKVCache(self.num_layers, num_slots, kv_heads, head_dim, self.max_model_len,
                                 self.dtype, self.device)
        self.lengths = [0] * num_slots
        # step_tensors' constants: made here, outside any graph capture, and read by every captured graph.
        dev = self.device
        self._aranges = torch.arange(self.max_model_len + 1, device=dev)
        self._scratch = torch.tensor(self.cache.scratch, device=dev)
        self._zero = torch.zeros((), dtype=self.dtype, device=dev)
        self._masked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=dev)

    def ensure_slots(self, num_slots: int) -> None:
        """Grow to at least ``num_slots`` slots, keeping every slot's entries (a one-off copy; callers
        that know their batch size up front should call :meth:`allocate` instead)."""
        if self.cache is not None and len(self.lengths) >= num_slots:
            return
        old, lengths = self.cache, self.lengths
        self.cache = None
        self.allocate(num_slots)
        if old is not None:
            n = len(lengths)
            self.cache.kv[:, :, :n].copy_(old.kv)
            self.lengths[:n] = lengths

    def advance(self, slot: int, num_tokens: int) -> None:
        """Commit the first ``num_tokens`` tokens of the last forward for ``slot`` (a negative count
        un-commits the last entries: drafters use it to drop their own speculative tokens)."""
        self.lengths[slot] += num_tokens

    def reset_slot(self, slot: int) -> None:
        """Free ``slot`` for a new request (its stale entries are masked, never read)."""
        self.lengths[slot] = 0

    def get_input_embeddings(self) -> nn.Module:
        """The model's token embedding (drafters may share it)."""
        return self.hf_model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        """The model's LM head (drafters may share it)."""
        return self.lm_head

    # -- forward -----------------------------------------------------------------------------
    @property
    def scratch_position(self) -> int:
        """The cache position past every slot's capacity where padding and idle tokens write their KV
        (never read by a real query): the KV write position :meth:`step_tensors` gives them."""
        return self.cache.scratch

    def step_tensors(self, start: torch.Tensor, n: torch.Tensor, q: int, kv_len: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions ``[b, q]``, KV write positions ``[b, q]`` and the additive attention mask
        ``[b, 1, q, kv_len]`` of ``q`` new tokens per row, computed on the device from ``start``
        (committed length per row) and ``n`` (real new tokens per row, 0 for an idle row), so a
        captured graph recomputes them on replay. Token j of row i sits at ``start_i + j`` and sees
        keys ``[0, start_i + j]``; padding tokens (``j >= n_i``) write to :attr:`scratch_position` and see
        their row's valid prefix. Positions are clamped to ``max_model_len - 1`` (only padding can pass
        it: a dynamic rope would rescale for them). Five kernels, on constants made once per cache."""
        j = self._aranges[:q]
        real = j < n[:, None]
        positions = (start[:, None] + j).clamp(max=self.max_model_len - 1)
        write_pos = torch.where(real, positions, self._scratch)
        limit = torch.minimum(positions, (start + n - 1)[:, None])
        return positions, write_pos, self.mask_from_limit(limit, kv_len)

    def mask_from_limit(self, limit: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The additive mask ``[b, 1, j, kv_len]`` where query (i, j) sees keys ``0 .. limit[i, j]``: for
        callers that step positions themselves (a draft chain's one-token steps)."""
        return torch.where(self._aranges[:kv_len] <= limit[:, :, None], self._zero, self._masked)[:, None]

    def run(self, input_ids: torch.Tensor, rows: slice | torch.Tensor, row_index: torch.Tensor, kv_len: int,
            step_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor], aux_layer_ids: tuple[int, ...] = (),
            fused: bool = True) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The model over ``[b, q]`` new tokens in cache rows ``row_index`` (``[b, 1]``; ``rows``: the same
        as a slice when contiguous, for views instead of gathers) with the first ``kv_len`` cache
        positions visible and ``step_tensors`` from :meth:`step_tensors`. Returns the final hidden
        states ``[b, q, H]`` and the hidden states of ``aux_layer_ids`` (Hugging Face
        ``output_hidden_states`` indexing), each ``[b, q, H]``. Writes the new tokens' KV (commit them
        with :meth:`advance`). No host synchronisation: capturable in a CUDA graph. ``fused=False``: the Hugging
        Face modules even where the fused forward is on (no Triton kernel compiled for a new shape)."""
        positions, write_pos, mask = step_tensors
        n = self.num_layers + 1
        if self.fused is not None and fused:
            taps = {i % n: None for i in aux_layer_ids if i % n != n - 1}
            last = self.fused.forward(input_ids, positions, write_pos, mask, rows, row_index, kv_len,
                                      aux=taps or None)
            return last, ([taps[i % n] if i % n in taps else last for i in aux_layer_ids] if aux_layer_ids else None)
        self.cache.prepare(rows, row_index, write_pos, kv_len)
        kwargs = dict(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                      **{self._cache_kwarg: self.cache})
        if not aux_layer_ids:
            return self.base(**kwargs).last_hidden_state, None
        if not self._tap(aux_layer_ids):  # no plain layer list: Hugging Face's capture of every layer
            out = self.base(output_hidden_states=True, **kwargs)
            return out.last_hidden_state, [out.hidden_states[i] for i in aux_layer_ids]
        self._taps = taps = {}
        try:
            out = self.base(**kwargs)
        finally:
            self._taps = None
        last = out.last_hidden_state
        return last, [taps[i % n] if i % n in taps else last for i in aux_layer_ids]

    def _tap(self, aux_layer_ids: tuple[int, ...]) -> bool:
        """Install (once per index) taps that keep the hidden states ``aux_layer_ids`` index, as
        Hugging Face's ``output_hidden_states`` numbers them (0: the first layer's input, i: layer i's
        output, ``num_layers``: the final norm's output, which :meth:`run` reads from the model's output),
        on those layers only: Hugging Face's own capture hooks every layer, a cost on every eager step.
        False where the model has no plain list of ``num_layers`` decoder layers."""
        ok = self._tap_ok.get(aux_layer_ids)
        if ok is not None:
            return ok
        layers = getattr(self.base, "layers", None)
        if not isinstance(layers, nn.ModuleList) or len(layers) != self.num_layers:
            self._tap_ok[aux_layer_ids] = False
            return False
        n = self.num_layers + 1
        # The layer's own forward wrapped (an instance attribute), not a module hook: a module with hooks takes
        # torch's general call path, ~7 us more a call on the CPU, every eager step
        for i in {i % n for i in aux_layer_ids} - self._tapped - {self.num_layers}:
            layer = layers[max(i - 1, 0)]
            inner = layer.forward
            if i == 0:
                def keep_input(*args: Any, inner: Any = inner, **kwargs: Any) -> Any:
                    if self._taps is not None:
                        self._taps[0] = args[0] if args else kwargs["hidden_states"]
                    return inner(*args, **kwargs)
                layer.forward = keep_input
            else:
                def keep_output(*args: Any, inner: Any = inner, i: int = i, **kwargs: Any) -> Any:
                    output = inner(*args, **kwargs)
                    if self._taps is not None:
                        self._taps[i] = output[0] if isinstance(output, tuple) else output
                    return output
                layer.forward = keep_output
            self._tapped.add(i)
        self._tap_ok[aux_layer_ids] = True
        return True

    def compute_logits(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """LM head (and final logit soft-capping where the model has it); float32 ``[R, V]``, written into ``out``
        when given (one row of a fused target with one-row kernels: the LM head writes its float32 copy itself)."""
        softcap = getattr(self.config, "final_logit_softcapping", None)
        fused, head = self.fused, self.lm_head
        if (out is not None and h.shape[0] == 1 and fused is not None and fused.fuse_one_row and not softcap
                and isinstance(head, nn.Linear) and head.bias is None):
            return fused.ops.row_linear(h, head.weight, out=out)
        logits = self.lm_head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits if out is None else out.copy_(logits)

    @torch.inference_mode()
    def forward(self, slots: list[int], tokens: list[list[int]], num_logits: list[int],
                hidden: HiddenStateRequest | None = None, draft_ids: torch.Tensor | None = None) -> TargetOutput:
        """Run ``tokens[i]`` for ``slots[i]`` at positions ``lengths[slot] + j``; return the logits of
        the last ``num_logits[i]`` positions of each request (and hidden states when asked).

        ``draft_ids``: ``[B, W]`` ids on this model's device that replace ``tokens[i][1 : 1 + W]``
        (the host lists hold placeholders there; ids past a row's length are ignored), so drafts
        made on the device are verified without a host round trip; they are clamped into the vocabulary here
        (``clamps_draft_ids``), so an out-of-vocabulary id cannot index past the embedding. Replays a captured
        CUDA graph when one fits the batch (see :meth:`capture_graphs`)."""
        if self.cache is None:
            raise RuntimeError("call allocate(num_slots) before forward().")
        lens = [len(t) for t in tokens]
        starts = [self.lengths[s] for s in slots]
        kv_len = max(a + b for a, b in zip(starts, lens))  # longest row after this forward
        if kv_len > self.max_model_len:
            raise ValueError(f"a request would exceed max_model_len={self.max_model_len} "
                             f"(lengths {starts} + new {lens}).")
        if self.graphs is not None:
            # A group of new requests may have a prefill graph; short ones also fit the step graphs.
            out = None
            if max(starts) == 0 and draft_ids is None:
                out = self.graphs.prefill(slots, tokens, lens, num_logits, hidden)
            if out is None:
                out = self.graphs.forward(slots, tokens, starts, lens, num_logits, hidden, draft_ids)
            if out is not None:
                return out
        return self._eager(slots, tokens, starts, num_logits, hidden, draft_ids)

    def _eager(self, slots: list[int], tokens: list[list[int]], starts: list[int], num_logits: list[int],
               hidden: HiddenStateRequest | None, draft_ids: torch.Tensor | None = None,
               write_kv: bool = True) -> TargetOutput:
        """:meth:`forward` without a graph, ``tokens[i]`` at positions ``starts[i] + j``; ``write_kv=False``: every KV
        write goes to the scratch position (the cache holds those positions already: :meth:`forward_hidden`), and
        the Hugging Face modules run even where the fused forward is on."""
        lens = [len(t) for t in tokens]
        b, q, dev = len(slots), max(lens), self.device
        kv_len = max(a + n for a, n in zip(starts, lens))
        input_ids = torch.from_numpy(pack_tokens(list(range(b)), tokens, lens, b, q)).to(dev)
        if draft_ids is not None:
            input_ids[:, 1: 1 + draft_ids.shape[1]] = draft_ids.clamp(0, self.vocab_size - 1)
        contiguous = slots == list(range(slots[0], slots[0] + b))
        slot_t = torch.tensor(slots, device=dev)
        rows = slice(slots[0], slots[0] + b) if contiguous else slot_t
        positions, write, mask = self.step_tensors(torch.tensor(starts, device=dev), torch.tensor(lens, device=dev),
                                                   q, kv_len)
        if not write_kv:
            write = torch.full_like(positions, self.cache.scratch)
        aux_ids = tuple(hidden.aux_layer_ids) if hidden is not None else ()
        h, aux = self.run(input_ids, rows, slot_t[:, None], kv_len, (positions, write, mask), aux_ids, fused=write_kv)
        return self.collect(h.reshape(b * q, -1), [a.reshape(b * q, -1) for a in aux] if aux else None,
                            list(range(b)), q, lens, num_logits, hidden, owned=True)

    @torch.inference_mode()
    def forward_hidden(self, slots: list[int], tokens: list[list[int]], starts: list[int],
                       hidden: HiddenStateRequest) -> TargetOutput:
        """The hidden states ``hidden`` asks for of ``tokens[i]`` at positions ``starts[i] + j`` of ``slots[i]``,
        tokens already in the cache (committed by plain steps that collected no states): the forward of
        :meth:`forward` reading the cache as it is and writing nothing to it (every KV write goes to the scratch
        position), no logits. The engine's long plain runs collect no states and recompute them here, once, before
        the proposer's next call. Eager (no graph), through the Hugging Face modules."""
        lens = [len(t) for t in tokens]
        for s, a, n in zip(slots, starts, lens):
            if a < 0 or n < 1 or a + n > self.lengths[s]:
                raise ValueError(f"forward_hidden: positions {a}..{a + n - 1} of slot {s} must be committed "
                                 f"(length {self.lengths[s]}).")
        # the modules, not the fused forward: Triton compiles its kernels again for each new shape, ~0.1 s each
        # (on the H200 a random-head eagle3 pass at batch 8 ran 0.20-0.33x of the baseline through them); and not
        # cuDNN's attention, which builds a plan for each new shape: ~0.1 s a first call on the H200 (s26 call 3,
        # recompute_profile.py: 76-117 ms against 12-19 once built), which stalled every switch out of a bare run
        with sdpa_kernel(NO_PLAN_BACKENDS):
            return self._eager(slots, tokens, starts, [0] * len(slots), hidden, write_kv=False)

    def collect(self, h: torch.Tensor, aux: list[torch.Tensor] | None, rows: list[int], q: int, lens: list[int],
                 num_logits: list[int], hidden: HiddenStateRequest | None,
                 logit_index: torch.Tensor | None = None, all_logits: torch.Tensor | None = None,
                 owned: bool = False, aux_base: torch.Tensor | None = None) -> TargetOutput:
        """Gather, from flat ``[rows * q, H]`` states where request i sits in row ``rows[i]``, the logits
        rows and the real positions' states. Indices are computed on the host; ``logit_index`` is
        the logits rows already on the device (the graph path ships them with its inputs, so the
        gather is queued behind the replay instead of waiting for it). ``all_logits``: the logits of
        every one of the flat rows, when a graph already computed them. ``owned``: ``h`` and ``aux`` are this
        forward's own tensors (eager), not a graph's output buffers that the next replay rewrites, so their
        first rows are handed over as views instead of copies. ``aux_base``: the ``[rows * q, n * H]`` tensor whose
        column ranges ``aux`` are (a step graph's buffers, found once by :func:`adjacent_columns`), or None to look."""
        dev = self.device
        if logit_index is None:
            logit_index = torch.from_numpy(logit_rows(rows, q, lens, num_logits)).to(dev, non_blocking=True)
        if all_logits is not None:
            logits = all_logits.index_select(0, logit_index)
        else:
            logits = self.compute_logits(h.index_select(0, logit_index))
        qsl = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        result = TargetOutput(logits=logits, query_start_loc=torch.from_numpy(qsl))
        if hidden is not None:
            total = int(qsl[-1])
            if rows == list(range(len(rows))) and (q == 1 or all(n == q for n in lens)):
                flat = None  # the first rows, in order (a plain step, full drafts)
            else:
                n = np.asarray(lens, dtype=np.int64)  # flat rows of the real positions, request by request
                flat = np.repeat(np.asarray(rows, dtype=np.int64) * q - (np.cumsum(n) - n), n) + np.arange(total)
                if np.array_equal(flat, np.arange(total)):
                    flat = None
            if flat is None:
                def take(x: torch.Tensor) -> torch.Tensor:
                    # a tensor of its own unless it is already: a graph's output buffer is rewritten
                    return x[:total] if owned else x[:total].clone()
            else:
                index = torch.from_numpy(flat)
                # pinned, so that the copy is queued behind the forward instead of waiting for it
                real = (index.pin_memory() if dev.type == "cuda" else index).to(dev, non_blocking=True)

                def take(x: torch.Tensor) -> torch.Tensor:
                    return x.index_select(0, real)
            if hidden.last_layer:
                result.hidden_states = take(h)
            if hidden.aux_layer_ids:
                base = aux_base if aux_base is not None or owned or len(aux) < 2 else adjacent_columns(aux)
                if base is not None:  # a step graph's layers, side by side in its output: one copy of them all
                    result.aux_hidden_states = list(take(base).split(aux[0].shape[-1], dim=-1))
                elif len(aux) > 1 and not owned and len({(a.shape[-1], a.dtype) for a in aux}) == 1:
                    # one copy for every layer (a launch costs more host time than its kernel takes): the layers
                    # side by side in one [T, n * H] tensor, handed over as its column views
                    joined = torch.cat([a[:total] if flat is None else a for a in aux], dim=-1)
                    result.aux_hidden_states = list((joined if flat is None else take(joined)).split(
                        aux[0].shape[-1], dim=-1))
                else:
                    result.aux_hidden_states = [take(a) for a in aux]
        return result

    def tree_step_tensors(self, start: torch.Tensor, n: torch.Tensor, parents: torch.Tensor, q: int, kv_len: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`step_tensors` of token trees, on the device (capturable): ``q`` nodes per row, ``n`` real ones
        (0: an idle row), ``parents [b, q]`` each node's parent in its row (node 0 the root; depths and ancestor
        sets from :func:`~specdec.layout.tree_layout_device`, which clamps a bad parent into a tree). Node
        j of row i sits at position ``start_i + depth[i, j]`` (clamped to ``max_model_len - 1``), writes its KV at
        ``start_i + j`` (padding: :attr:`scratch_position`) and attends the committed prefix ``0 .. start_i - 1``
        and the cache positions of the nodes it sees; a query that would see nothing (a padding node of an empty
        row) sees position 0. On CUDA one Triton launch (:mod:`specdec.kernels.tree_triton`, the same tensors;
        :data:`TREE_KERNEL`), else the torch steps below."""
        if TREE_KERNEL and parents.is_cuda and triton_available():
            from specdec.kernels.tree_triton import tree_step_tensors

            return tree_step_tensors(start, n, parents, kv_len, self.max_model_len, int(self.cache.scratch),
                                     self.dtype)
        depth, sees = tree_layout_device(parents)
        j = self._aranges[:q]
        real = j < n[:, None]
        positions = (start[:, None] + depth).clamp(max=self.max_model_len - 1)
        write_pos = torch.where(real, start[:, None] + j, self._scratch)
        keys = self._aranges[:kv_len]
        node = keys[None, :] - start[:, None]  # [b, kv] the node a cache position holds (this step)
        in_tree = (node >= 0) & (node < n[:, None])
        visible = torch.gather(sees, 2, node.clamp(0, q - 1)[:, None, :].expand(-1, q, -1)) & in_tree[:, None, :]
        visible |= (keys < start[:, None])[:, None, :]
        visible |= (keys == 0) & ~visible.any(-1, keepdim=True)
        return positions, write_pos, torch.where(visible, self._zero, self._masked)[:, None]

    @torch.inference_mode()
    def forward_tree(self, slots: list[int], tokens: list[list[int]], parents: list[list[int]],
                     hidden: HiddenStateRequest | None = None) -> TargetOutput:
        """One forward over a token tree per request (tree verification, issue 25): ``tokens[i]`` is the root (the
        request's last accepted token) then its nodes, ``parents[i][j]`` the parent of node ``j + 1`` as an index
        into ``tokens[i]`` (0: the root), smaller than ``j + 1`` (topological order: no cycles). Node ``j`` sits at
        position ``lengths[slot] + depth(j)`` and attends the committed prefix, its ancestors and itself; its KV is
        written at ``lengths[slot] + j`` (keep accepted paths' with :meth:`keep_paths`). Returns the logits of every
        node, request by request, in :class:`~specdec.target.TargetOutput`'s layout (``query_start_loc`` over
        ``len(tokens[i])``), and their hidden states when asked. Replays a captured tree graph when one fits (see
        :meth:`capture_graphs`), else runs eagerly. Chains are trees whose node j has parent j - 1."""
        b, lens = len(slots), [len(t) for t in tokens]
        starts = self._tree_starts("forward_tree", slots, lens)
        check_tree_parents(parents, lens)
        q, dev = max(lens), self.device
        if self.graphs is not None:
            out = self.graphs.forward_tree(slots, tokens, parents, starts, lens, hidden)
            if out is not None:
                return out
        rows = list(range(b))
        input_ids = torch.from_numpy(pack_tokens(rows, tokens, lens, b, q)).to(dev)
        par = torch.from_numpy(pack_tokens(rows, [[0] + p for p in parents], lens, b, q)).to(dev)
        return self._eager_tree(slots, input_ids, par, starts, lens, hidden)

    @torch.inference_mode()
    def forward_tree_ids(self, slots: list[int], roots: list[int], ids: torch.Tensor, parents: torch.Tensor,
                         lens: list[int], hidden: HiddenStateRequest | None = None) -> TargetOutput:
        """:meth:`forward_tree` over trees that sit on the device, as a proposer drafted them (tree verification
        without a host round trip between drafting and verifying): request i's root ``roots[i]`` then the first
        ``lens[i] - 1`` nodes of ``ids[i]`` (``[len(slots), N]``) whose parents ``parents[i]`` are indices among those
        nodes (-1: the root), :attr:`specdec.Drafts.parents`' convention. Nothing is read back: ids are clamped
        into the vocabulary and parents into earlier nodes on the device, so a malformed tree cannot index out of
        range (its nodes' logits are then meaningless: the caller checks the tree on the host afterwards and drops
        what fails, :class:`~specdec.validation.DeferredTrees`). The root's logits never depend on its nodes."""
        starts = self._tree_starts("forward_tree_ids", slots, lens)
        b, q, dev = len(slots), max(lens), self.device
        if self.graphs is not None:
            out = self.graphs.forward_tree_ids(slots, roots, ids, parents, starts, lens, hidden)
            if out is not None:
                return out
        input_ids = torch.zeros(2, b, q, dtype=torch.long, device=dev)
        input_ids[0, :, 0] = torch.tensor(roots, device=dev)
        input_ids[:, :, 1:] = tree_node_inputs(ids[:, : q - 1], parents[:, : q - 1], self.vocab_size)
        return self._eager_tree(slots, input_ids[0], input_ids[1], starts, lens, hidden)

    def _tree_starts(self, caller: str, slots: list[int], lens: list[int]) -> list[int]:
        """The slots' committed lengths, where trees of ``lens`` nodes (root included) start; raises unless the
        cache is allocated and every tree fits before ``max_model_len``."""
        if self.cache is None:
            raise RuntimeError(f"call allocate(num_slots) before {caller}().")
        starts = [self.lengths[s] for s in slots]
        if max(a + n for a, n in zip(starts, lens)) > self.max_model_len:
            raise ValueError(f"a request would exceed max_model_len={self.max_model_len} "
                             f"(lengths {starts} + tree nodes {lens}).")
        return starts

    def _eager_tree(self, slots: list[int], input_ids: torch.Tensor, parents: torch.Tensor, starts: list[int],
                    lens: list[int], hidden: HiddenStateRequest | None) -> TargetOutput:
        """The eager tree forward over packed ``input_ids`` / ``parents`` ``[len(slots), q]`` on the device."""
        b, q = input_ids.shape
        dev = self.device
        kv_len = max(a + n for a, n in zip(starts, lens))
        slot_t = torch.tensor(slots, device=dev)
        steps = self.tree_step_tensors(torch.tensor(starts, device=dev), torch.tensor(lens, device=dev), parents, q,
                                       kv_len)
        aux_ids = tuple(hidden.aux_layer_ids) if hidden is not None else ()
        h, aux = self.run(input_ids, slot_t, slot_t[:, None], kv_len, steps, aux_ids)
        return self.collect(h.reshape(b * q, -1), [a.reshape(b * q, -1) for a in aux] if aux else None,
                            list(range(b)), q, lens, lens, hidden, owned=True)

    @torch.inference_mode()
    def keep_paths(self, slots: list[int], paths: list[list[int]]) -> None:
        """Commit each slot's accepted root-to-node path of the last :meth:`forward_tree`: ``paths[i]`` holds node
        indices (0, the root, first; increasing), whose KV entries move to the positions right after the slot's
        committed prefix (those entries only, every layer's keys and values at once over the cache's joined
        tensor: per slot one ``index_select`` and one ``index_copy_`` where few slots move, else one gather and one
        scatter for all), then each slot advances by ``len(paths[i])``."""
        moves: dict[int, list[tuple[int, int]]] = {}  # slot -> (destination, source) of every entry that moves
        for slot, path in zip(slots, paths):
            if not path or path[0] != 0 or any(b <= a for a, b in zip(path, path[1:])):
                raise ValueError(f"path {path} must start at the root (0) and increase.")
            start = self.lengths[slot]
            ms = [(start + i, start + n) for i, n in enumerate(path) if n != i]
            if ms:
                moves[slot] = ms
        # every source is read before any destination is written: moves within a slot cannot clash
        kv = self.cache.kv
        if 0 < len(moves) <= FEW_SLOT_MOVES:  # a handful of launches, no advanced indexing on the host
            at = torch.tensor([m for ms in moves.values() for m in ms]).to(self.device, non_blocking=True)
            i = 0
            for slot, ms in moves.items():
                row = kv[:, :, slot]  # [2, layers, kv_heads, P, d]
                row.index_copy_(3, at[i: i + len(ms), 0], row.index_select(3, at[i: i + len(ms), 1]))
                i += len(ms)
        elif moves:
            r, d, s = torch.tensor([(slot, *m) for slot, ms in moves.items() for m in ms]).to(
                self.device, non_blocking=True).unbind(1)
            kv[:, :, r, :, d] = kv[:, :, r, :, s]
        for slot, path in zip(slots, paths):
            self.advance(slot, len(path))

    def keep_path(self, slot: int, path: list[int]) -> None:
        """:meth:`keep_paths` of one slot."""
        self.keep_paths([slot], [path])

    @torch.inference_mode()
    def forward_ahead(self, prev: TargetOutput, slots: list[int], hidden: HiddenStateRequest | None = None,
                      sampled: tuple[torch.Tensor, torch.Tensor] | None = None) -> TargetOutput | None:
        """Queue, behind the step graph replay ``prev`` (a plain decode step of ``slots``, one token each, whose
        tokens nobody has read yet), the next such step with ``prev``'s greedy tokens as inputs, at the lengths the
        slots will have once ``prev``'s tokens are committed (:meth:`specdec.cuda_graphs.GraphRunner.ahead`): the
        device computes it while the host commits ``prev``; with the hidden states ``hidden`` asks for (as
        :meth:`forward`); ``sampled``: ``(indices, ids)`` on the device, the next inputs of the requests at those
        indices of ``slots`` in place of their argmax. None without step graphs (or none captured for
        ``hidden``'s layers) or room."""
        if self.graphs is None:
            return None
        starts = [self.lengths[s] + 1 for s in slots]
        if max(starts) + 1 > self.max_model_len:
            return None
        return self.graphs.ahead(prev, slots, starts, hidden, sampled)

    def capture_graphs(self, query_lens: list[int], hidden: HiddenStateRequest | None = None,
                       use_graphs: bool = True, max_prefill_tokens: int = 0, tree_lens: list[int] | None = None
                       ) -> bool:
        """Capture CUDA graphs of the forward for every slot-count bucket, each query length in
        ``query_lens`` and KV-length buckets, and (``max_prefill_tokens`` > 0) prefill graphs for
        groups of new requests of up to that many tokens in all, and (``tree_lens``) tree-verification graphs of
        :meth:`forward_tree` for trees of up to each of those node counts (root included). Returns False (and logs
        why) where capture is not possible; forward then stays eager. ``use_graphs=False`` keeps the same
        static-buffer path without capturing (for testing it on the CPU)."""
        if self.tp_size > 1:
            logger.info("tensor_parallel_size=%d: the target runs eagerly (CUDA graphs under TP are not captured yet).",
                        self.tp_size)
            self.graphs = None
            return False
        self.graphs = GraphRunner.build(self, query_lens, hidden, use_graphs, max_prefill_tokens, tree_lens)
        return self.graphs is not None


def kv_cache_bytes(num_slots: int, num_layers: int, kv_heads: int, head_dim: int, max_model_len: int,
                   dtype: torch.dtype) -> int:
    """Bytes of a slot KV cache: keys and values for every slot, layer and position (+1 scratch)."""
    item = torch.empty(0, dtype=dtype).element_size()
    return 2 * num_slots * num_layers * kv_heads * head_dim * (max_model_len + 1) * item


def _available_bytes(device: torch.device) -> int | None:
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        # MemAvailable counts reclaimable page cache, unlike the free-pages count.
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
        return None
    except (ValueError, OSError, RuntimeError):
        return None


def _check_kv_memory(num_slots: int, num_layers: int, kv_heads: int, head_dim: int, max_model_len: int,
                     dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, with the fix in the message, a KV cache that cannot fit (instead of an OOM later)."""
    need = kv_cache_bytes(num_slots, num_layers, kv_heads, head_dim, max_model_len, dtype)
    free = _available_bytes(device)
    if free is not None and need > 0.9 * free:
        raise MemoryError(
            f"the KV cache needs {need / 2**20:.1f} MiB ({num_slots} slots x max_model_len={max_model_len} x "
            f"{num_layers} layers) but only {free / 2**20:.1f} MiB is free on {device}: pass a smaller "
            "max_model_len or max_num_seqs to LLM."
        )


def _is_tokenizer(obj: Any) -> bool:
    return callable(getattr(obj, "encode", None)) and callable(getattr(obj, "decode", None))


def read_model_config(path: str) -> dict[str, Any]:
    """The raw config.json of a local model directory (a ValueError naming it when it is not a JSON object)."""
    return read_json_object(Path(path) / "config.json", "model config")

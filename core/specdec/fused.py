"""FusedLlama: a Llama-family forward in about ten kernels a layer, for drafts and targets.

The draft model's chains run through it (``specdec-plugin-draft_model``, ``draft_fused``), and so does the target
(:class:`specdec.ModelRunner`, ``fused_forward``; on CUDA and the CPU by default): at 1-3B parameters and batch 1 a
step of Hugging Face's layers ran at about 29% of the H200's weight-bandwidth floor, inside the same CUDA graphs.

A small draft's GPU forward costs kernel launches, not arithmetic. Hugging Face's Llama layer
launches about 36 kernels: RMSNorm alone is six, rotary about ten. A 2-layer draft therefore spends
most of a forward launching, and a chain of k of them costs a good part of the target's verify
forward.

This module runs the same layer in nine kernels (ten when attention splits its keys, five more with
``triton_rope=False``, see below), on the model's own weights and slot KV cache:

1. [residual add +] RMSNorm: one kernel;
2. the q/k/v projections as one matmul (concatenated weights);
3. rotary embedding of q and k and the KV-cache write, one kernel;
4. attention: a split-key Triton kernel (:func:`specdec.fused_kernels.attend`) that reads each KV head once
   for the query heads sharing it, from the row's own cache slot, up to the row's last visible key (plus a
   merge kernel when the keys are split), elsewhere ``scaled_dot_product_attention`` over the rows' cache (a
   gathered copy when the rows are not contiguous; on the CPU the query heads sharing a KV head packed as its query
   rows, on CUDA the keys and values repeated per query head);
5. the output projection;
6. residual add + RMSNorm: one kernel;
7. gate and up projections as one matmul;
8. SiLU(gate) * up, one kernel;
9. the down projection (its residual add is fused into the next norm).

At batch 1 a step's projections are one row each, where cuBLAS reaches 1.4-2.5 TB/s on the small weights (split-K
kernels plus a reduction each); there they run as a one-row Triton kernel (``triton_linear``,
:func:`specdec.fused_kernels.linear`: 1.09x / 1.12x shorter steps for 1B / 3B targets on an H200), and the steps
between them ride inside those kernels (``fuse_one_row``, :func:`row_linear`): each RMSNorm in the projection that
reads its output (the sum of squares taken in the same pass over the input as the dot products, its 1 / RMS applied
to them at the end), SiLU(gate) * up in the down projection's input loads, each residual add in the output
projection's and the down projection's stores: four launches a layer besides the rotary and attention. With
:data:`specdec.fused_kernels.PDL` set (off by default: +5% at 1B, -5% at 3B) every kernel here launches with
programmatic dependent launch on Hopper: a kernel starts while the one before drains and waits only where it reads
what that one wrote, so a projection streams its first weight tile during the previous kernel's tail.

The kernels are Triton on CUDA (:mod:`specdec.fused_kernels`). Elsewhere the same steps run
as the torch functions below, the reference the kernels are tested against (in the Triton
interpreter on CPU). ``triton_rope=False`` runs step 3 as torch ops on CUDA too (the cos and sin rows
gathered once per forward, then five small kernels a layer). The Triton rotary + KV-write kernel once hit
an illegal memory access on an H200 (torch 2.11, triton 3.6) in draft chains. Diagnosed 2026-12-02
(``benchmarks/gpu_rope_capture.py``): the fault came back when every
chain bucket ran eagerly before any capture, so neither graphs nor a compile during capture caused it.
The kernel read its index tensors at ``ptr + t``, and for a one-row batch the slot index
(``row_index.expand(1, q)`` flattened) is a stride-0 view of one element: entries 1..q-1 were read from
the memory after it and the keys went to garbage addresses. The launcher now makes its indices
contiguous (the parity test feeds it such views), and on 2026-12-03 the H200 ran it in the target's step
graphs and the draft chains' (the CUDA suite, ``benchmarks/results/h200/s14-2026-12-03``): it is on by
default, a 10% shorter step for a 1B target at batch 1 and 27% at batch 8 than the torch ops.

The arithmetic is Hugging Face's with rounding in a different order, so a draft can differ from the
unfused one at a near-tie. That never touches correctness: drafts are proposals the target verifies.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from specdec.head_layers import attention

__all__ = ["FusedLlama", "add_rmsnorm", "attend", "fused_support", "linear", "rope_rows", "rope_store",
           "rope_store_rows", "rope_table", "row_linear", "silu_mul", "visible_ends"]

_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn", "longrope")  # cos/sin depend on the position only
# FusedLlama's defaults for ``triton_rope`` (see the module docstring) and ``triton_attention``; switches for GPU
# checks.
TRITON_ROPE = True
TRITON_ATTENTION = True
TRITON_LINEAR = True  # FusedLlama's default for ``triton_linear``
FUSE_ONE_ROW = True  # with triton_linear, FusedLlama's default for ``fuse_one_row``


def fused_support(model: Any) -> str | None:
    """None when :class:`FusedLlama` can run ``model`` (a :class:`specdec.ModelRunner`), else the reason."""
    cfg = model.config
    if cfg.model_type not in _MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not 'silu'"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in _STATIC_ROPE:
        return f"rope_type {rope_type!r} depends on more than the position"
    layer = model.base.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    if any(hasattr(attn, n) for n in ("q_norm", "k_norm")) and cfg.model_type != "qwen3":
        return "per-head q/k norms outside the qwen3 family"
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return "an MLP other than gate/up/down"
    if getattr(mlp.down_proj, "bias", None) is not None or getattr(attn.o_proj, "bias", None) is not None:
        return "output biases"
    head_dim = model.base.layers[0].self_attn.head_dim
    if head_dim & (head_dim - 1) or head_dim < 8:
        return f"head_dim {head_dim} is not a power of two >= 8"
    return None


@dataclass
class _Layer:
    ln1: torch.Tensor
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    ln2: torch.Tensor
    wgu: torch.Tensor
    wd: torch.Tensor
    q_norm: torch.Tensor | None = None  # Qwen3: RMSNorm weights over each head's q and k, before the rotary
    k_norm: torch.Tensor | None = None


class FusedLlama:
    """The forward of a Llama-family :class:`specdec.ModelRunner` (the draft) with fused weights and
    kernels, on that model's own slot KV cache. Its weights are concatenated copies made once
    (q/k/v and gate/up); the embedding, norms, output projections and LM head are shared.

    Args:
        model: the draft, already on its device and dtype; see :func:`fused_support`.
        use_triton: Triton kernels (default: when the model is on CUDA and triton is installed).
        kernels: the module of Triton kernels (default :mod:`specdec.fused_kernels`; tests
            pass a copy loaded for the interpreter).
        triton_rope: with ``use_triton``, also the Triton rotary + KV-write kernel (default ``TRITON_ROPE``, on;
            False: the torch step, see the module docstring); the RMSNorm and SiLU kernels are used either way.
        triton_attention: with ``use_triton``, attention as one Triton kernel (:func:`specdec.fused_kernels.attend`:
            each KV head read once for its query heads, from the row's own cache slot, up to its last visible key)
            instead of SDPA over the rows' cache (:func:`attend`; default ``TRITON_ATTENTION``, on; SDPA for a
            head_dim below 16, which the kernel's tl.dot cannot take).
        triton_linear: with ``use_triton``, the projections of a one-row step (a decode step at batch 1) by the
            one-row Triton kernel (:func:`specdec.fused_kernels.linear`: the weight read once in long runs, no
            split-K reduction, its first tile loaded before the previous kernel ends under PDL; default
            ``TRITON_LINEAR``, on), with the norms, SiLU * up and residual adds inside them (the attribute
            ``fuse_one_row``, set from this; switched on alone it runs that path's torch steps); otherwise, and for
            more rows, cuBLAS.
        share_weights: make the model's own q/k/v and gate/up weights views of the concatenated ones, so the
            fused forward costs no extra memory (the model's values are unchanged; for a model the caller does
            not hand over, leave it False: its parameters are re-pointed).
    """

    def __init__(self, model: Any, use_triton: bool | None = None, kernels: ModuleType | None = None,
                 triton_rope: bool | None = None, share_weights: bool = False,
                 triton_attention: bool | None = None, triton_linear: bool | None = None) -> None:
        reason = fused_support(model)
        if reason is not None:
            raise ValueError(f"FusedLlama cannot run {model.model_name!r}: {reason}.")
        cfg, base = model.config, model.base
        self.model = model
        attn = base.layers[0].self_attn
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.eps = float(cfg.rms_norm_eps)
        self.hidden = int(cfg.hidden_size)
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        self.layers = []
        with torch.no_grad():
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                bias = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                self.layers.append(_Layer(
                    ln1=layer.input_layernorm.weight,
                    wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                    bqkv=torch.cat(bias).contiguous() if bias[0] is not None else None,
                    wo=a.o_proj.weight, ln2=layer.post_attention_layernorm.weight,
                    wgu=torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(), wd=m.down_proj.weight,
                    q_norm=a.q_norm.weight if hasattr(a, "q_norm") else None,
                    k_norm=a.k_norm.weight if hasattr(a, "k_norm") else None))
                if share_weights:  # the separate weights' storage goes: theirs are views of the fused ones now
                    _share(self.layers[-1].wqkv, [a.q_proj, a.k_proj, a.v_proj])
                    _share(self.layers[-1].wgu, [m.gate_proj, m.up_proj])
            # cos/sin of every position from the model's own rotary module, so every static rope
            # variant (scaling, attention factor) comes out as the model computes it.
            positions = torch.arange(model.max_model_len, device=model.device)[None]
            probe = torch.zeros(1, dtype=model.dtype, device=model.device)
            cos, sin = base.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()  # [max_model_len, head_dim]
        self.rope_table = rope_table(self.cos, self.sin)  # what the torch step reads (see rope_rows)
        if use_triton is None:
            use_triton = model.device.type == "cuda" and importlib.util.find_spec("triton") is not None
        self.use_triton = use_triton
        self.triton_rope = use_triton and (TRITON_ROPE if triton_rope is None else triton_rope)
        # The kernels module is imported here, not with the plugin (see fused_kernels' docstring).
        here = sys.modules[__name__]
        fast = (kernels or importlib.import_module("specdec.fused_kernels")) if use_triton else here
        # tl.dot needs 16-wide operands: heads narrower than that keep SDPA (tiny drafts have head_dim 8)
        self.triton_attention = (use_triton and self.head_dim >= 16
                                 and (TRITON_ATTENTION if triton_attention is None else triton_attention))
        # rope_store None: the torch step, its table rows gathered once per forward for every layer.
        self.triton_linear = use_triton and (TRITON_LINEAR if triton_linear is None else triton_linear)
        self.ops = SimpleNamespace(add_rmsnorm=fast.add_rmsnorm, silu_mul=fast.silu_mul,
                                   rope_store=fast.rope_store if self.triton_rope else None,
                                   attend=fast.attend if self.triton_attention else attend,
                                   linear=fast.linear if self.triton_linear else F.linear,
                                   row_linear=fast.row_linear if self.triton_linear else row_linear)
        # A one-row step (batch 1 decoding) as the one-row kernel with its neighbours inside (see row_linear).
        self.fuse_one_row = self.triton_linear and FUSE_ONE_ROW

    # -- the forward -------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, write_pos: torch.Tensor,
                mask: torch.Tensor, rows: slice | torch.Tensor, row_index: torch.Tensor, kv_len: int,
                aux: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Final (normed) hidden states ``[b, q, H]`` of ``[b, q]`` new tokens, with the inputs
        :meth:`specdec.ModelRunner.step_tensors` makes; writes their keys and values at
        ``write_pos`` in the model's cache rows ``row_index``. No host synchronisation. ``aux``: a dict whose
        keys are hidden-state indices in Hugging Face's ``output_hidden_states`` numbering below the layer
        count (i: the residual stream entering layer i, 0 the embeddings); each gets its ``[b, q, H]`` state."""
        b, q = input_ids.shape
        x = F.embedding(input_ids.reshape(-1), self.embed)  # [T, H]
        if aux is not None and 0 in aux:
            aux[0] = x.view(b, q, self.hidden)
        pos, wpos = positions.reshape(-1), write_pos.reshape(-1)
        slot = row_index.expand(b, q).reshape(-1)
        ops = self.ops
        rows_cs = None if ops.rope_store else rope_rows(self.rope_table, pos)
        ends = visible_ends(mask) if self.triton_attention else None
        attn = (b, q, pos, wpos, slot, mask, rows, row_index, kv_len, rows_cs, ends)
        if self.fuse_one_row and b * q == 1:  # the residual stream s; four launches a layer besides attention
            s = x
            for i, layer in enumerate(self.layers):
                if aux is not None and i and i in aux:
                    aux[i] = s.view(b, q, self.hidden)
                qkv = ops.row_linear(s, layer.wqkv, layer.bqkv, norm=layer.ln1, eps=self.eps)
                s = ops.row_linear(self._attention(qkv, i, layer, *attn), layer.wo, residual=s)
                gu = ops.row_linear(s, layer.wgu, norm=layer.ln2, eps=self.eps)
                s = ops.row_linear(gu, layer.wd, glu=True, residual=s)
            h, _ = ops.add_rmsnorm(s, None, self.norm, self.eps)
            return h.view(b, q, self.hidden)
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = ops.add_rmsnorm(x, residual, layer.ln1, self.eps)
            if aux is not None and i and i in aux:
                aux[i] = residual.view(b, q, self.hidden)
            qkv = ops.linear(h, layer.wqkv, layer.bqkv)
            x = ops.linear(self._attention(qkv, i, layer, *attn), layer.wo)
            h, residual = ops.add_rmsnorm(x, residual, layer.ln2, self.eps)
            x = ops.linear(ops.silu_mul(ops.linear(h, layer.wgu)), layer.wd)
        h, _ = ops.add_rmsnorm(x, residual, self.norm, self.eps)
        return h.view(b, q, self.hidden)

    def _attention(self, qkv: torch.Tensor, i: int, layer: _Layer, b: int, q: int, pos: torch.Tensor,
                   wpos: torch.Tensor, slot: torch.Tensor, mask: torch.Tensor, rows: slice | torch.Tensor,
                   row_index: torch.Tensor, kv_len: int, rows_cs: tuple[torch.Tensor, torch.Tensor] | None,
                   ends: torch.Tensor | None) -> torch.Tensor:
        """Layer ``i``'s attention from its projected ``qkv`` ``[T, (nh + 2 nk) d]``: the rotary, the KV write into
        the cache, attention; returns ``[T, nh d]``, the output projection's input."""
        ops = self.ops
        if layer.q_norm is not None:
            qkv = self._head_norms(qkv, layer)
        k_buf, v_buf = self.model.cache.keys[i], self.model.cache.values[i]
        if rows_cs is None:
            qh = ops.rope_store(qkv, self.cos, self.sin, pos, wpos, slot, k_buf, v_buf, b, q, self.heads,
                                self.kv_heads, self.head_dim)  # [b, heads, q, d]
        else:
            qh = rope_store_rows(qkv, *rows_cs, wpos, slot, k_buf, v_buf, b, q, self.heads, self.kv_heads,
                                 self.head_dim)
        o = ops.attend(qh.transpose(1, 2), k_buf, v_buf, mask, rows, row_index, kv_len, self.scaling, ends)
        return o.reshape(b * q, self.heads * self.head_dim)

    def _head_norms(self, qkv: torch.Tensor, layer: _Layer) -> torch.Tensor:
        """Qwen3's RMSNorm over each query and key head (Hugging Face's formula, before the rotary): ``[T, (nh
        + 2 nk) d]`` in, the same layout out."""
        t, nh, nk, d = qkv.shape[0], self.heads, self.kv_heads, self.head_dim
        heads = qkv.view(t, nh + 2 * nk, d)
        q, _ = add_rmsnorm(heads[:, :nh], None, layer.q_norm, self.eps)
        k, _ = add_rmsnorm(heads[:, nh: nh + nk], None, layer.k_norm, self.eps)
        return torch.cat((q, k, heads[:, nh + nk:]), 1).view(t, -1)


def _share(fused: torch.Tensor, linears: list[Any]) -> None:
    """Point each linear's weight at its rows of ``fused`` (their concatenation along dim 0)."""
    at = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = fused[at: at + n]
        at += n


# -- the fused steps in torch: the reference the Triton kernels (same names and signatures) match --


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (``x`` when None; the add in the model dtype, as Hugging Face's);
    returns ``(RMSNorm(s) * weight, s)``."""
    s = x if residual is None else x + residual
    var = s.float().pow(2).mean(-1, keepdim=True)
    return weight * (s.float() * torch.rsqrt(var + eps)).to(s.dtype), s


def attend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, mask: torch.Tensor, rows: slice | torch.Tensor,
           row_index: torch.Tensor, kv_len: int, scale: float, ends: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the queries ``q`` ``[b, q, nh, d]`` over the first ``kv_len`` keys and values of cache rows
    ``rows`` (``k_buf[rows]``; ``row_index`` ``[b, 1]``: the same rows as indices) with the additive ``mask``
    ``[b, 1, q, kv_len]``; returns ``[b, q, nh, d]``. On the CPU grouped-query heads are packed, not repeated
    (:func:`specdec.head_layers.attention`: the query heads sharing a KV head attend as its query rows; Hugging Face
    packs a decode step's heads the same way): repeating the keys and values cost the CPU forward 4-13x its
    attention time at batch 8-32. The reference of the Triton kernel of the same name, which reads each row's slot
    and KV head once for its group, up to ``ends`` (:func:`visible_ends`; unused here)."""
    keys, values = k_buf[rows, :, :kv_len], v_buf[rows, :, :kv_len]
    return attention(q.transpose(1, 2), keys, values, mask, scale=scale).transpose(1, 2)


def visible_ends(mask: torch.Tensor) -> torch.Tensor:
    """Per row of an additive ``mask`` ``[b, 1, q, kv_len]``, one past the last key any of its queries sees (0 when
    none does), int32 ``[b]``: where the attention kernel may stop reading. Device ops only (capturable); computed
    once per forward for every layer."""
    seen = (mask[:, 0] > torch.finfo(mask.dtype).min).any(1)  # [b, kv_len]
    at = torch.arange(1, seen.shape[-1] + 1, dtype=torch.int32, device=mask.device)
    return (seen.to(torch.int32) * at).amax(-1)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, wpos: torch.Tensor,
               slot: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, b: int, q: int, nh: int, nk: int,
               d: int) -> torch.Tensor:
    """Rotary embedding (``cos``/``sin`` tables ``[positions, d]``) of the queries and keys in ``qkv``
    ``[b * q, (nh + 2 nk) d]``; writes keys and values at ``k_buf[slot, :, wpos]``; returns the
    queries as ``[b, nh, q, d]`` (a transposed view of ``[b, q, nh, d]``, as Hugging Face's attention
    gets them). Positions past the table use its last row (idle rows only). The reference of the
    Triton kernel of the same name; :class:`FusedLlama` runs its parts, :func:`rope_rows` once per
    forward (of a :func:`rope_table` made once) and :func:`rope_store_rows` per layer."""
    return rope_store_rows(qkv, *rope_rows(rope_table(cos, sin), pos), wpos, slot, k_buf, v_buf, b, q, nh, nk, d)


def rope_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``[positions, 2 d]``: each position's cos row, then its sin row with the first half negated, so
    that ``rotate_half(x) * sin == swap_halves(x) * signed_sin`` exactly (a negation is exact and moves
    from ``x`` to ``sin``), and one gather fetches both."""
    half = sin.shape[-1] // 2
    return torch.cat((cos, -sin[..., :half], sin[..., half:]), dim=-1).contiguous()


def rope_rows(table: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and signed-sin rows of positions ``pos`` (clamped to the table), ``[T, 1, d]`` each, from
    a :func:`rope_table`: the same for every layer of a forward, so gathered once (one kernel)."""
    rows = table[pos.clamp(max=table.shape[0] - 1)][:, None]
    return rows.chunk(2, dim=-1)


def rope_store_rows(qkv: torch.Tensor, c: torch.Tensor, s: torch.Tensor, wpos: torch.Tensor, slot: torch.Tensor,
                    k_buf: torch.Tensor, v_buf: torch.Tensor, b: int, q: int, nh: int, nk: int,
                    d: int) -> torch.Tensor:
    """:func:`rope_store` with the rows of :func:`rope_rows` (``s``: the signed sine): three kernels for
    the rotation of queries and keys together, one per cache write."""
    heads = qkv.view(b * q, nh + 2 * nk, d)
    qk, vs = heads[:, : nh + nk], heads[:, nh + nk:]  # queries and keys rotate together: fewer kernels
    x1, x2 = qk.chunk(2, dim=-1)
    rot = torch.addcmul(qk * c, torch.cat((x2, x1), dim=-1), s)  # [T, nh + nk, d]
    k_buf[slot, :, wpos] = rot[:, nh:].to(k_buf.dtype)
    v_buf[slot, :, wpos] = vs.to(v_buf.dtype)
    return rot[:, :nh].view(b, q, nh, d).transpose(1, 2)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """``SiLU(gate) * up`` of ``gu = [gate | up]`` ``[T, 2I]``."""
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)``, a projection (the Triton module's runs one row by its own kernel)."""
    return F.linear(x, w, bias)


def row_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
               eps: float = 1e-6, glu: bool = False, residual: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """A projection with the layer steps next to it, the unit of :class:`FusedLlama`'s one-row steps: ``x`` first
    RMSNorm'd with weight ``norm`` (``eps``), or, with ``glu``, ``x = [gate | up]`` first made ``SiLU(gate) * up``;
    then ``F.linear(x, w, bias)``, plus ``residual`` (the add in the model dtype); written into ``out`` when given
    (e.g. float32 logits: the result is rounded to the model dtype first, as an LM head's is). The Triton module's
    runs one row as one kernel (normalising by the RMS after the dot products, so in half precision it rounds
    differently)."""
    if norm is not None:
        x, _ = add_rmsnorm(x, None, norm, eps)
    elif glu:
        x = silu_mul(x)
    y = F.linear(x, w, bias)
    y = y if residual is None else y + residual
    return y if out is None else out.copy_(y)

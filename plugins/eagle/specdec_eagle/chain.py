"""A lean greedy draft chain for EAGLE heads: the catch-up forward and the k - 1 one-token head steps of
a decode step in one function, over weights and rotary tables prepared once.

Why: on a CPU with a small head every torch op costs a few microseconds of dispatch, and the module path
(:meth:`specdec_eagle.heads.EagleHead.decode`) spends about 100 ops per head forward (unfused norms, three
q/k/v projections, rotary angles recomputed each call, repeated KV heads, a gathered copy of the slot's
KV, a host read of the longest position). On the bundled tiny target that made drafting 43% of a step.
Here a head step is about 25 ops: fused q/k/v and gate/up weights, the module's RMSNorm (its formula on
the CPU, bitwise equal; aten's fused kernel on CUDA), rotary tables indexed by position, grouped-query SDPA
reading the slot's KV in place, and the draft vocabulary's embeddings gathered once so a draft id feeds the
next step directly.
Every position, write position and mask is made on the host from what the engine hands over (no reads
of the device inside).

Greedy by default; with a ``pick`` function (the proposer's sampler: each draft sampled at its request's
temperature from the head's float32 logits, with the distributions the rejection sampler needs) the same steps
draft sampled requests. The chain runs eagerly on the CPU; on CUDA :class:`specdec_eagle.graph_chain.CapturedHeadChain`
captures the same steps in CUDA graphs.

With ``kernels`` (on CUDA the proposer passes :mod:`specdec.fused_kernels`, option ``draft_fused``) a head step
runs through the target's fused kernels instead: the one-row projections with the post-attention norm and the
residual adds inside them, the rotary and KV write in one kernel, and the split-key attention that reads each
slot's keys in place up to its own last visible position. Measured on the H200 before it (bench target and its
trained EAGLE-3 head, batch 1, k = 5): a captured chain replay took 462 us at a 128-position KV bucket and
936 us at 2048, the SDPA kernel alone ~100 us a step at 2048 (it runs one program per head over every key of the
bucket), and eagle3 ran at 0.82-0.87x of the fused baseline. With it, same machine and run: 313-327 us at every
bucket, eagle3 0.78-0.91x against 0.68-0.80x with ``draft_fused=False`` (the proposer's host work, ~0.3-0.5 ms a
step, is what keeps it below the baseline's 0.36 ms steps).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from specdec.head_layers import attention, rms_norm
from specdec_eagle.heads import EagleHead, HeadKVCache

__all__ = ["HEAD_ROWS", "HEAD_ROW_WORK", "GreedyHeadChain", "PickDraft"]

# Rows of a head step that go through the row kernel's few-row form (its projections with their norms, SiLU * up and
# residual adds inside) rather than cuBLAS and separate torch steps: a chain at batch <= HEAD_ROWS, a token tree's
# frontier of top-k <= HEAD_ROWS at batch 1; a step then keeps ~3 launches for its MLP and output projection instead
# of ~15. Only where rows x weight elements stay within HEAD_ROW_WORK: on large weights the kernel's arithmetic, not the
# weight read, bounds it (a few-row form ran a 1B target's 4-token verify 2.7-3.1x slower than cuBLAS, s38-s39), so a
# large head's wide projections keep cuBLAS. Off (1) by default until the few-row kernel is measured ahead of cuBLAS
# on the device: its first form (rows one after another) cost 14.5 us a launch on an H100 against cuBLAS's 4 and made
# a tree step's kernels 1.16x longer, though a batch-8 chain ran 1.16-1.23x faster for the ~30 launches it saved; the
# form now in fused_kernels (the rows' products with each weight tile taken together) is unmeasured there (s46).
HEAD_ROWS = 1
HEAD_ROW_WORK = 1 << 27  # e.g. 8 rows of a 4096 x 4096 projection; the bench head's LM head (8192 x 768) at 16 rows

# pick(h [B, H], j) -> (draft j's target ids [B], their distributions [B, V] or None where the verifier reads none)
PickDraft = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]]


def _few_rows(w: torch.Tensor, rows: int) -> int:
    """``max_rows`` for a head step's projection by ``w`` over ``rows`` rows: :data:`HEAD_ROWS` where the row kernel
    pays (:data:`HEAD_ROW_WORK`), else 1 (one row still takes it: that is the batch-1 chain's path)."""
    return HEAD_ROWS if rows * w.numel() <= HEAD_ROW_WORK else 1


class GreedyHeadChain:
    """Greedy drafting for one head over its slot KV cache; weights are views or concatenations of the
    head's own, made once (the head must not be trained while a chain holds them). ``kernels``: a module with
    :mod:`specdec.fused_kernels`' functions (``linear``, ``row_linear``, ``rope_store``, ``attend``) for every head
    step (see the module docstring); None, or a head_dim below 16 (``attend``'s smallest), keeps the torch ops."""

    @torch.inference_mode()
    def __init__(self, head: EagleHead, capacity: int, kernels: ModuleType | None = None) -> None:
        cfg = head.cfg
        self.head, self.cfg = head, cfg
        self.eagle3 = cfg.kind == "eagle3"
        self.nh, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        a, m = head.self_attn, head.mlp
        self.w_qkv = torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight))  # [(nh + 2 nkv) d, in]
        self.w_kv = self.w_qkv[self.nh * self.d:]  # [2 nkv d, in]: the keys and values alone (_store_kv)
        self.w_o = a.o_proj.weight
        self.w_gu = torch.cat((m.gate_proj.weight, m.up_proj.weight))  # [2 I, H]
        self.w_down = m.down_proj.weight
        self.inter = m.gate_proj.weight.shape[0]
        self.fc_w, self.fc_b = head.fc.weight, head.fc.bias
        self.post_w = head.post_attention_layernorm.weight
        self.lm_w = head.lm_head.weight
        w = head.embed_tokens.weight
        if self.eagle3:
            self.hidden_w, self.in_w = head.hidden_norm.weight, head.input_layernorm.weight
            self.norm_w = head.norm.weight
            self.d2t = head.d2t
            # Embeddings of the draft vocabulary in draft-id order: a draft feeds the next step as is.
            self.embed_draft = w[head.draft_to_target(torch.arange(cfg.draft_vocab_size, device=w.device))]
        else:
            self.d2t, self.embed_draft = None, w
        self.embed = w
        # cos/sin of every position (the same float32 products as Attention.qkv computes per call)
        angles = torch.arange(capacity + 1, device=w.device).float()[:, None] * a.inv_freq  # [P, d/2]
        angles = torch.cat((angles, angles), dim=-1)
        self.rope = torch.stack((angles.cos(), angles.sin()), 1)[:, :, None].to(w.dtype)  # [P, 2, 1, d]
        self.kernels = kernels if self.d >= 16 else None
        if self.kernels is not None:  # the rotary kernel's tables [P, d]
            self.cos, self.sin = self.rope[:, 0, 0].contiguous(), self.rope[:, 1, 0].contiguous()

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # The module's own norm (heads.RMSNorm): on the CPU its formula (bitwise equal; aten's fused rms_norm is
        # slower there), on CUDA the fused kernel.
        return rms_norm(x, w, self.eps)

    def _step(self, cache: HeadKVCache, slots: torch.Tensor, contiguous: bool, kv_len: int, embeds: torch.Tensor,
              feats: torch.Tensor, pos: torch.Tensor, write: torch.Tensor,
              mask: torch.Tensor | None, ends: torch.Tensor | None = None, fused: bool = True) -> torch.Tensor:
        """One head forward: ``embeds [B, q, H]``, ``feats [B, q, F]`` (projected by fc unless H wide, as
        :meth:`Eagle3Head.attn_input`), positions and KV write positions ``[B, q]``; attends to the first ``kv_len``
        positions of each slot (a view of the cache when ``slots`` is ``0..B-1``) where ``mask [B, 1, q, kv_len]``
        (bool, None: all visible; through :attr:`kernels` also an additive float32 mask, 0 where visible). ``ends``
        (int32 ``[B]``, optional): one past each row's last visible position, where the fused attention stops
        reading (None: it reads all ``kv_len``). ``fused=False``: torch ops even with :attr:`kernels`. -> hidden
        ``[B, q, H]``."""
        if fused and self.kernels is not None:
            return self._fused_step(cache, slots, kv_len, embeds, feats, pos, write, mask, ends)
        b, q = pos.shape
        x, residual = self._inputs(embeds, feats)
        qk, v = self._qkv(x, pos)
        rows = slots[:, None].expand(b, q)
        cache.keys[rows, :, write] = qk[:, :, self.nh:]
        cache.values[rows, :, write] = v
        keys, values = ((cache.keys[:b, :, :kv_len], cache.values[:b, :, :kv_len]) if contiguous
                        else (cache.keys[slots, :, :kv_len], cache.values[slots, :, :kv_len]))
        out = attention(qk[:, :, : self.nh].transpose(1, 2), keys, values, mask, enable_gqa=True)  # [B, nh, q, d]
        return self._finish(out.transpose(1, 2), residual)

    def _fused_step(self, cache: HeadKVCache, slots: torch.Tensor, kv_len: int, embeds: torch.Tensor,
                    feats: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, mask: torch.Tensor | None,
                    ends: torch.Tensor | None) -> torch.Tensor:
        """:meth:`_step` through :attr:`kernels`: up to :data:`HEAD_ROWS` rows seven launches after the inputs (q/k/v,
        rotary + KV write, attention, the output projection with its residual add, gate/up with the post-attention
        norm, the down projection with SiLU * up and its residual add); more rows take cuBLAS for the projections."""
        fk, (b, q) = self.kernels, pos.shape
        t = b * q
        x, residual = self._inputs(embeds, feats)
        qkv = fk.linear(x.reshape(t, -1), self.w_qkv, max_rows=_few_rows(self.w_qkv, t))
        slot = slots[:, None].expand(b, q).reshape(-1)
        qh = fk.rope_store(qkv, self.cos, self.sin, pos.reshape(-1), write.reshape(-1), slot, cache.keys,
                           cache.values, b, q, self.nh, self.nkv, self.d)  # [b, nh, q, d]
        bias = (torch.zeros((), dtype=torch.float32, device=pos.device).expand(b, 1, q, kv_len) if mask is None
                else mask if mask.is_floating_point()  # already the kernel's additive float32 mask
                else torch.where(mask, 0.0, torch.finfo(torch.float32).min))  # None: a stride-0 mask of zeros
        out = fk.attend(qh.transpose(1, 2), cache.keys, cache.values, bias, slots, slots[:, None], kv_len,
                        self.d ** -0.5, ends)  # [b, q, nh, d]
        h = fk.row_linear(out.reshape(t, self.nh * self.d), self.w_o, residual=residual.reshape(t, -1).contiguous(),
                          max_rows=_few_rows(self.w_o, t))
        gu = fk.row_linear(h, self.w_gu, norm=self.post_w, eps=self.eps, max_rows=_few_rows(self.w_gu, t))
        return fk.row_linear(gu, self.w_down, glu=True, residual=h, max_rows=_few_rows(self.w_down, t)).view(b, q, -1)

    def _inputs(self, embeds: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention input and the residual of a head forward from ``embeds [..., H]`` and ``feats [..., F]``
        (EAGLE-3: both normed and concatenated, the features projected by fc unless H wide; EAGLE: fc over both)."""
        if self.eagle3:
            f = F.linear(feats, self.fc_w) if feats.shape[-1] != self.cfg.hidden_size else feats
            normed = self._norm(f, self.hidden_w)
            x = torch.cat((self._norm(embeds, self.in_w), normed), -1)
            return x, (normed if self.cfg.norm_before_residual else f)
        x = F.linear(torch.cat((embeds, feats), -1), self.fc_w, self.fc_b)
        return x, x

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated queries and keys ``[B, q, nh + nkv, d]`` and values ``[B, q, nkv, d]`` of ``x [B, q, *]`` at
        rotary positions ``pos [B, q]``."""
        b, q = pos.shape
        qkv = F.linear(x, self.w_qkv)  # [B, q, (nh + 2 nkv) d]
        qk = self._rope(qkv[..., : (self.nh + self.nkv) * self.d].view(b, q, self.nh + self.nkv, self.d), pos)
        return qk, qkv[..., (self.nh + self.nkv) * self.d:].view(b, q, self.nkv, self.d)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Heads ``x [B, q, heads, d]`` rotated to positions ``pos [B, q]`` (the prepared tables)."""
        cs = self.rope[pos]  # [B, q, 2, 1, d]
        a, c = x.chunk(2, dim=-1)
        return x * cs[:, :, 0] + torch.cat((-c, a), -1) * cs[:, :, 1]

    def _store_kv(self, cache: HeadKVCache, slots: torch.Tensor, embeds: torch.Tensor, feats: torch.Tensor,
                  pos: torch.Tensor, write: torch.Tensor) -> None:
        """Write the keys and values of ``embeds [B, q, H]`` / ``feats [B, q, F]`` at positions ``pos`` (their
        rotary angles) into the cache at ``write`` (``[B, q]``), and nothing else. A head is one layer: a
        position's key and value depend on its own token and feature only, so a catch-up whose outputs are not
        read needs no queries, attention, output projection or MLP (about a quarter of a full head step's
        arithmetic at the bundled tiny head's sizes, and no attention over the whole context per position)."""
        b, q = pos.shape
        x, _ = self._inputs(embeds, feats)
        kv = F.linear(x, self.w_kv)  # [B, q, 2 nkv d]
        rows = slots[:, None].expand(b, q)
        cache.keys[rows, :, write] = self._rope(kv[..., : self.nkv * self.d].view(b, q, self.nkv, self.d), pos)
        cache.values[rows, :, write] = kv[..., self.nkv * self.d:].view(b, q, self.nkv, self.d)

    def _finish(self, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The rest of a head forward from the attention output ``out [B, q, nh, d]``: the output projection onto
        ``residual``, then the MLP. -> hidden ``[B, q, H]``."""
        b, q = out.shape[:2]
        h = residual + F.linear(out.reshape(b, q, self.nh * self.d).to(residual.dtype), self.w_o)
        g, u = F.linear(self._norm(h, self.post_w), self.w_gu).split(self.inter, -1)
        return h + F.linear(F.silu(g) * u, self.w_down)

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary argmax of ``h [B, H]`` (the head's dtype has the float32 logits' argmax)."""
        return self.logits(h).argmax(-1)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of head outputs ``h [..., H]`` in the head's dtype (EAGLE-3: the final norm first;
        through :attr:`kernels` up to :data:`HEAD_ROWS` rows with that norm inside the LM head's kernel)."""
        t = h.numel() // h.shape[-1]
        if self.kernels is not None and (t == 1 or _few_rows(self.lm_w, t) >= t):
            rows = h.reshape(t, h.shape[-1]).contiguous()
            out = (self.kernels.row_linear(rows, self.lm_w, norm=self.norm_w, eps=self.eps, max_rows=t)
                   if self.eagle3 else self.kernels.linear(rows, self.lm_w, max_rows=t))
            return out.view(*h.shape[:-1], -1)
        if self.eagle3:
            h = self._norm(h, self.norm_w)
        return F.linear(h, self.lm_w)

    def _catch_up(self, cache: HeadKVCache, slot_t: torch.Tensor, contiguous: bool, tokens: torch.Tensor,
                  feats: torch.Tensor, pos: np.ndarray, valid: np.ndarray, fused: bool) -> torch.Tensor:
        """The catch-up forward alone: ``tokens [B, W]`` with target ``feats [B, W, F]`` at head positions ``pos
        [B, W]`` (``valid`` False on padding, which repeats a row's last position and writes the scratch position)
        over the slots ``slot_t`` (on the device; ``contiguous``: they are ``0 .. B-1``). Writes their KV; returns the
        hidden states ``[B, W, H]``. One head step, about a quarter of :meth:`EagleHead.decode`'s ops and no read of
        the device; through :attr:`kernels` only with ``fused`` (Triton compiles its kernels again for new widths,
        ~0.1 s each, which made a switch into drafting cost 70-100 ms on the H200)."""
        b, width = pos.shape
        dev = tokens.device
        idx = torch.from_numpy(np.concatenate((pos, np.where(valid, pos, cache.capacity)), 1)).to(dev)
        top = int(pos.max()) + 1
        mask = (torch.from_numpy(np.arange(top)[None, None, :] <= pos[:, :, None])[:, None].to(dev)
                if b > 1 or width > 1 else None)
        fused = fused and self.kernels is not None
        ends = torch.from_numpy(pos.max(1) + 1).to(device=dev, dtype=torch.int32) if fused else None
        return self._step(cache, slot_t, contiguous, top, self.embed[tokens], feats, idx[:, :width], idx[:, width:],
                          mask, ends, fused)

    @torch.inference_mode()
    def store_kv(self, cache: HeadKVCache, slots: list[int], tokens: torch.Tensor, feats: torch.Tensor,
                 pos: np.ndarray, valid: np.ndarray) -> None:
        """A catch-up whose outputs nobody reads: the keys and values of ``tokens [B, W]`` / target ``feats [B, W,
        F]`` at head positions ``pos [B, W]`` written to the cache (``valid`` False on padding, which writes the
        scratch position), and nothing else (:meth:`_store_kv`). The positions of a wide catch-up before each
        row's last go through it, on the CPU's chain and before the CUDA captured chain."""
        dev = tokens.device
        write = np.where(valid, pos, cache.capacity)
        self._store_kv(cache, torch.tensor(slots, device=dev), self.embed[tokens], feats,
                       torch.from_numpy(pos).to(dev), torch.from_numpy(write).to(dev))

    @torch.inference_mode()
    def draft(self, cache: HeadKVCache, slots: list[int], tokens: torch.Tensor, feats: torch.Tensor,
              pos: np.ndarray, valid: np.ndarray, steps: int, pick: PickDraft | None = None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_catch_up` over ``tokens [B, W]`` / target ``feats [B, W, F]`` at head positions ``pos [B, W]``
        (through :attr:`kernels` up to ``W = steps + 1``), then ``steps - 1`` one-token steps. Returns ``[B, steps]``
        drafts (target ids): greedy, or what ``pick(h, j)`` chooses from the head's output ``h [B, H]`` for draft
        ``j`` (target ids ``[B]`` and their distributions ``[B, V]``, e.g. sampled at the requests' temperatures,
        or None where the verifier reads none); and, with a ``pick`` that gives them, the distributions
        ``[B, steps, V]`` (else None)."""
        b, width = pos.shape
        cap = cache.capacity
        dev = tokens.device
        slot_t = torch.tensor(slots, device=dev)
        contiguous = slots == list(range(b))
        q_len = valid.sum(1)  # [B] >= 1
        last = pos[np.arange(b), q_len - 1]  # [B] the position whose output gives draft 1
        if width > steps + 1:  # a wide catch-up (a prompt, a plain run): of its outputs only each row's last is
            # read, so the positions before it only write their keys and values (CPU, tiny head, 8 rows of 512
            # positions: 36-40 ms against 125 ms for a full forward at every position, benchmarks/eagle_catch_up.py)
            self.store_kv(cache, slots, tokens, feats, pos, np.arange(width)[None, :] < (q_len - 1)[:, None])
            at = torch.from_numpy(q_len - 1).to(dev)
            rows = torch.arange(b, device=dev)
            tokens, feats = tokens[rows, at][:, None], feats[rows, at][:, None]
            pos, valid, q_len, width = last[:, None], np.ones((b, 1), dtype=bool), np.ones(b, dtype=np.int64), 1
        # the chain steps' positions and write positions at once, one per step
        chain = last[:, None] + np.arange(1, steps)[None, :]  # [B, steps - 1]
        chain_ok = chain < cap
        chain = np.minimum(chain, cap - 1)
        idx = torch.from_numpy(np.concatenate((chain, np.where(chain_ok, chain, cap)), 1)).to(dev)
        span = np.arange(max(int(pos.max()) + 1, int(chain.max(initial=0)) + 1))
        # through the kernels only as wide as a drafting step hands over (its accepted drafts and one more): a
        # wider catch-up (a prompt, a plain run) takes torch ops, as the captured chain's path does (a Triton
        # kernel is compiled again for each new block size and argument class, ~0.1 s each on the H200)
        h = self._catch_up(cache, slot_t, contiguous, tokens, feats, pos, valid, width <= steps + 1)
        h = h[:, -1] if (q_len == width).all() else h[torch.arange(b, device=dev), torch.from_numpy(q_len - 1).to(dev)]
        h = h[:, None]  # [B, 1, H]
        drafts = torch.empty(b, steps, dtype=torch.long, device=dev)
        probs = []

        def choose(j: int, out: torch.Tensor) -> None:
            if pick is None:
                drafts[:, j] = self._argmax(out)  # draft-vocabulary ids until the end
                return
            drafts[:, j], p = pick(out, j)
            if p is not None:
                probs.append(p)

        choose(0, h[:, 0])
        embed = self.embed_draft if pick is None else self.embed  # a pick's drafts are target ids
        chain_pos, chain_write = idx[:, : steps - 1], idx[:, steps - 1:]
        for j in range(1, steps):
            # a step sees keys up to its own position: with a single row, no mask
            top = int(chain[:, j - 1].max()) + 1
            m = None if b == 1 else torch.from_numpy(span[None, :top] <= chain[:, j - 1, None])[:, None, None].to(dev)
            ends = (torch.from_numpy(chain[:, j - 1] + 1).to(device=dev, dtype=torch.int32)
                    if self.kernels is not None else None)
            h = self._step(cache, slot_t, contiguous, top, embed[drafts[:, j - 1: j]],
                           h, chain_pos[:, j - 1: j], chain_write[:, j - 1: j], m, ends)
            choose(j, h[:, 0])
        if pick is not None:
            return drafts, torch.stack(probs, 1) if probs else None
        return (drafts if self.d2t is None else drafts + self.d2t[drafts]), None

"""A lean KV-cached forward for Llama-family decoders, used by :func:`lrmgym.policies.sampling.sample_batch`.

Why not ``model.forward`` with a transformers cache: for small models most of a decode step is overhead, not
arithmetic. On the 0.8 M-parameter default model at batch 128, one ``LlamaForCausalLM`` decode step took 16 ms
while its matrix products alone took 3.3 ms (mask building, cache objects, three separate q/k/v products, the
deprecation and kwargs layers). This module runs the same computation with the model's own weights and its
own rotary-embedding module: q/k/v and gate/up fused into one product each (with the norms' weights folded in),
RoPE as one complex product from a table made once per batch, one preallocated key/value buffer per layer, and
an additive mask. Rows that finish are dropped from the buffers, as in the sampler.

Only architectures whose decoder layer is exactly ``RMSNorm -> attention(q,k,v,o, RoPE) -> RMSNorm -> SiLU-gated
MLP`` qualify (``llama``, ``mistral`` without a sliding window, ``qwen2``), with plain ``nn.Linear`` projections
(a LoRA-wrapped model, or one with forward hooks, goes through ``model.forward``). :meth:`LlamaDecoder.build`
returns ``None`` for anything else, and the sampler falls back to the model's own forward.
``tests/policies/test_fastdecode.py`` checks the logits against ``model.forward`` on random models of each
supported type (grouped-query attention and q/k/v biases included).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LlamaDecoder", "llama_like", "sample_dtype"]

_KEEP_BYTES = 256 * 2**20
"""Largest key/value storage (per set) that :meth:`LlamaDecoder._buffers` keeps for reuse on CPU."""
_KEPT = threading.local()
"""Per thread, the storage pairs no live decoder holds (``_KEPT.free``): a decoder takes one for its life."""


def _take_storages(like: torch.Tensor) -> list[torch.Tensor]:
    free = getattr(_KEPT, "free", None)
    if free is None:
        free = _KEPT.free = []
    return free.pop() if free else [like.new_empty(0), like.new_empty(0)]


def _give_back(storages: list[torch.Tensor]) -> None:
    free = getattr(_KEPT, "free", None)
    if free is None:
        free = _KEPT.free = []
    if len(free) < 2:  # keep at most two idle pairs per thread
        free.append(storages)


_SUPPORTED = ("llama", "mistral", "qwen2")

_SAMPLE_DTYPE: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("sample_dtype", default=None)


@contextlib.contextmanager
def sample_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Decoders built inside this context (in this thread) run on a ``dtype`` copy of the model's weights.

    E.g. bf16 sampling of an fp32 model whose trainer stays fp32 (``policy.sample_dtype=bfloat16``), so the sampler's
    log-probs differ from the trainer's as an inference engine's do. ``None``: the model's own dtype. The model
    itself is not changed; the copy is made per batch, as the decoder's fused weights are.
    """
    token = _SAMPLE_DTYPE.set(dtype)
    try:
        yield
    finally:
        _SAMPLE_DTYPE.reset(token)


def _plain_linear(module: Any) -> bool:
    return _linear_weights(module) is not None


def _linear_weights(module: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(weight, bias)`` a linear layer applies: a plain ``nn.Linear``'s, or a peft LoRA layer's effective ones.

    A LoRA layer (``peft.tuners.lora.Linear`` over a plain ``nn.Linear``, no DoRA) applies ``W + sum of its active
    adapters' deltas`` (each ``scaling * B @ A``, peft's ``get_delta_weight``) in eval mode, where its dropout is
    the identity; when its adapters are disabled or merged into ``W``, just ``W``. Anything else: None (the
    decoder does not apply, and sampling takes the model's own forward).
    """
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not callable(getattr(module, "get_delta_weight", None)):
        return None
    if any(getattr(module, "use_dora", {}).values()) or getattr(module, "lora_embedding_A", None):
        return None
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return base.weight, base.bias
    weight = base.weight
    for name in getattr(module, "active_adapters", ()):
        if name in getattr(module, "lora_A", {}):
            weight = weight + module.get_delta_weight(name)
    return weight, base.bias


def _hooked(module: Any) -> bool:
    """Whether ``module`` has forward hooks, besides transformers' ``enable_input_require_grads`` one.

    transformers adds that hook to the input embedding with gradient checkpointing (so that a reentrant
    checkpoint sees an input that requires grad); it changes no value, so the lean passes may ignore it.
    """
    hooks = [h for h in module._forward_hooks.values() if "enable_input_require_grads" not in _qualname(h)]
    return bool(hooks or module._forward_pre_hooks)


def _qualname(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", ""))


def llama_like(model: Any) -> Any | None:
    """The causal LM whose modules a lean forward runs (a peft model's base model), or ``None`` if it does not qualify.

    Qualifies: a ``llama``, ``mistral`` (without a sliding window) or ``qwen2`` model with SiLU, no q/k norms,
    plain (or LoRA-wrapped) linear projections, no MLP biases and no forward hooks on any module.
    """
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # a peft PeftModel: its LoRA layers sit inside the base model's modules
        model = get_base()
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in _SUPPORTED:
        return None
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "use_sliding_window", False):
        return None
    if getattr(config, "model_type", None) == "mistral" and getattr(config, "sliding_window", None):
        return None
    if any(_hooked(m) for m in model.modules()):
        return None  # a hook (steering, probing, a test's bias) must see every forward
    needed = ("embed_tokens", "norm", "layers", "rotary_emb")
    if not all(hasattr(inner, name) for name in needed) or not _plain_linear(getattr(model, "lm_head", None)):
        return None
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        weights = [_linear_weights(p) for p in projections]
        if any(w is None for w in weights) or any(w[1] is not None for w in weights[4:]):  # type: ignore[index]
            return None  # not (LoRA-)linear, or an MLP with biases
        if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
            return None
    return model


class _Layer:
    """One decoder layer's weights, q/k/v and gate/up concatenated, the norms' weights folded in.

    Rebuilt for every batch, so that it follows the weights as training changes them. Each RMSNorm's weight
    scales the input columns of the product that reads it (``W (w * n) = (W * w) n``), so that the norm itself is
    only ``x / rms(x)`` (:func:`_normalize`). The q and k rows of each head are stored with the two halves of
    rotate-half RoPE interleaved (``0, D/2, 1, D/2+1, ...``), so that RoPE is one complex product on pairs of
    adjacent features (:func:`_rope`): a permutation of the head dim applied to both q and k leaves every q.k, and
    so attention, unchanged, and v and the output stay in the model's order. The key cache holds permuted keys.
    """

    def __init__(self, layer: Any, head_dim: int, parts: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.eps1, self.eps2 = _eps_tensor(norm1), _eps_tensor(norm2)
        # The attention scale is folded into the query rows (RoPE is linear, so scaling before it is the same).
        scaling = float(getattr(attn, "scaling", attn.head_dim**-0.5))
        (q_w, q_b), (k_w, k_b), (v_w, v_b), (o_w, o_b), (g_w, _), (u_w, _), (d_w, _) = (
            _linear_weights(m)  # type: ignore[misc]  # build() checked that each is a (LoRA-)linear layer
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        q_rows, k_rows = (_interleaved(w.shape[0], head_dim, w.device) for w in (q_w, k_w))
        biases = [q_b, k_b, v_b]
        qkv_b = torch.cat([(q_b * scaling)[q_rows], k_b[k_rows], v_b]) if all(b is not None for b in biases) else None
        self.qkv = _Product(torch.cat([(q_w * scaling)[q_rows], k_w[k_rows], v_w]) * norm1.weight, qkv_b, parts)
        self.o = _Product(o_w, o_b, parts)
        self.gate_up = _Product(torch.cat([g_w, u_w]) * norm2.weight, None, parts)
        self.down = _Product(d_w, None, parts)


def _interleaved(rows: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """Row order that interleaves each head's two RoPE halves: per head ``0, D/2, 1, D/2+1, ..., D/2-1, D-1``."""
    within = torch.arange(head_dim, device=device).view(2, head_dim // 2).t().reshape(-1)
    return (torch.arange(0, rows, head_dim, device=device)[:, None] + within).reshape(-1)


def _eps(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6))


def _eps_tensor(norm: Any) -> torch.Tensor:
    return torch.tensor(_eps(norm), dtype=torch.float32, device=norm.weight.device)


def _normalize(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over the last dim, in float32: an RMSNorm whose weight the caller applies.

    Through ``vector_norm`` and one ``addcmul``: four small ops where ``F.rms_norm`` runs about seven, which at
    decode sizes (a few rows of 128 features) is what the norm costs (18 against 24 us a call on a 2-core EPYC).
    """
    xf = x.float()
    return (xf * _inv_rms(xf, eps)).to(x.dtype)


def _inv_rms(xf: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``1 / sqrt(mean(xf^2) + eps)`` over the last dim (kept): one ``vector_norm`` pass, then per-row work."""
    norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
    return torch.addcmul(eps, norm, norm, value=1.0 / xf.shape[-1]).rsqrt_()


def _rotations(rotary: Any, like: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE of ``positions [b, t]`` as complex rotations ``cos + i sin``, ``[b, t, 1, D/2]`` (float32).

    The model's own rotary module computes the angles (any scaling type it implements). Its tables repeat the
    frequencies over both halves of the head dim (``cat(freqs, freqs)``), so the first half holds every angle.
    """
    cos, sin = rotary(torch.empty(0, dtype=torch.float32, device=like.device), positions)  # [b, t, D]
    half = cos.shape[-1] // 2
    return torch.complex(cos[..., :half].float(), sin[..., :half].float())[:, :, None]


def _rope(qk: torch.Tensor, rotations: torch.Tensor) -> None:
    """RoPE in place on ``qk [b, t, n, D]`` whose heads hold interleaved pairs (see :class:`_Layer`).

    Pair ``(x1, x2)`` becomes ``(x1 cos - x2 sin, x2 cos + x1 sin)``, rotate-half's result, as one complex product
    ``(x1 + i x2)(cos + i sin)``: one op where rotate-half takes a roll, two products and a sum.
    """
    if qk.dtype in (torch.float32, torch.float64):
        torch.view_as_complex(qk.unflatten(-1, (-1, 2))).mul_(rotations)
    else:  # no complex type for bfloat16: rotate in float32
        qk.copy_(_rotated(qk, rotations))


def _rotated(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """:func:`_rope` out of place, and differentiable (the training forward's RoPE).

    Its backward is one product by the conjugate. A dtype without a complex type (bfloat16) rotates in float32.
    """
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotations).flatten(-2).to(x.dtype)


class _Product:
    """``F.linear(x, weight, bias)``; on a 2-thread CPU, one batched product over two blocks of output columns.

    Why: at decode sizes (32 rows, 128-1536 features) MKL runs a plain product on one thread even when two are
    free, about 50 GFLOP/s on a 2-core AMD EPYC, while ``bmm`` over two column blocks (``[2, k, n/2]``, stored
    transposed and contiguous) runs the blocks on both threads: 65-100 GFLOP/s. From 8 to 512 rows it was faster
    at every size tried, at 1 024 rows equal, and on one thread equal. Only where measured (a CPU, exactly two
    intra-op threads): elsewhere ``blocks`` is 1 and this is ``F.linear``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> None:
        self.out, self.bias = weight.shape[0], bias
        self.blocks = parts if parts > 1 and self.out % parts == 0 else 1
        if self.blocks == 1:
            self.weight = weight
        else:  # [parts, k, n/parts]
            self.weight = weight.view(self.blocks, self.out // self.blocks, -1).transpose(1, 2).contiguous()

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``x [m, k]`` times the weight, unbiased, as blocks ``[blocks, m, n/blocks]`` (``blocks > 1`` only)."""
        return torch.bmm(x.expand(self.blocks, *x.shape), self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.blocks == 1:
            return F.linear(x, self.weight, self.bias)
        y = self.split(x.reshape(-1, x.shape[-1])).transpose(0, 1).reshape(*x.shape[:-1], self.out)
        return y if self.bias is None else y + self.bias

    def add_to(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``x + self(h)``, the residual added by the product itself (``addmm``) or by the blocks' reassembly."""
        if self.bias is not None:
            return x + self(h)
        m = x.shape[:-1].numel()
        if self.blocks == 1:
            return torch.addmm(x.reshape(m, -1), h.reshape(m, -1), self.weight.t()).view(x.shape)
        blocks = self.split(h.reshape(m, -1))  # [blocks, m, n/blocks]
        return torch.add(x.reshape(m, self.blocks, -1), blocks.transpose(0, 1)).view(x.shape)


class _LlamaParts:
    """What every lean pass reads of a qualifying model (:func:`llama_like`) besides its layers."""

    def __init__(self, model: Any) -> None:
        config, inner = model.config, model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm
        self.lm_head_w, self.lm_head_b = _linear_weights(model.lm_head)  # type: ignore[misc]
        self.rotary = inner.rotary_emb
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)


class LlamaDecoder(_LlamaParts):
    """Prefill a left-padded batch, then decode one token per row per call, with a preallocated KV buffer.

    Use :meth:`build` (``None`` when the model does not qualify). Shapes: ``b`` rows alive, ``H`` query heads,
    ``K`` key/value heads, ``D`` head size, ``L`` buffer length (prompt width + new tokens).
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        # Two column blocks per product on a CPU with two intra-op threads (see _Product), else plain products.
        parts = 2 if self.embed.device.type == "cpu" and torch.get_num_threads() == 2 else 1
        self.layers = [_Layer(layer, self.head_dim, parts) for layer in model.model.layers]
        self.final_eps = _eps_tensor(self.final_norm)
        # Angles depend on the position alone unless the RoPE type rescales with the length seen so far
        # (transformers' dynamic_rope_update: "dynamic" NTK and "longrope"); then they are computed per step.
        rope_type = str(getattr(self.rotary, "rope_type", "default"))
        self.static_rope = "dynamic" not in rope_type and rope_type != "longrope"
        self.table = torch.empty(0, 1, self.head_dim // 2, dtype=torch.complex64)  # [L, 1, D/2]: rotation per position
        self.keys: list[torch.Tensor] = []  # per layer [b, K, L, D]
        self.values: list[torch.Tensor] = []
        self.bias = torch.empty(0, 0)  # [b, L]: 0 on the buffer slots a query may attend to, -inf elsewhere
        self.length = 0
        self._turn = 1  # which of the two kept CPU storages _buffers handed out last
        self._kept: list[torch.Tensor] | None = None  # this decoder's pair of reused CPU storages, once it has one

    @classmethod
    def build(cls, model: Any) -> LlamaDecoder | None:
        """A decoder over ``model``'s current weights, or ``None`` if its architecture is not the supported one.

        A peft model is decoded through its base model's modules, with the LoRA layers' effective weights.
        """
        base = llama_like(model)
        if base is None:
            return None
        decoder, dtype = cls(base), _SAMPLE_DTYPE.get()
        if dtype is not None and dtype != decoder.embed.dtype:  # sample_dtype(): a copy in that dtype
            decoder.embed, decoder.lm_head_w = decoder.embed.to(dtype), decoder.lm_head_w.to(dtype)
            decoder.lm_head_b = None if decoder.lm_head_b is None else decoder.lm_head_b.to(dtype)
            for product in (p for layer in decoder.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)):
                product.weight = product.weight.to(dtype)
                product.bias = None if product.bias is None else product.bias.to(dtype)
        return decoder

    def _attention_block(
        self, i: int, x: torch.Tensor, rotations: torch.Tensor, start: int, mask: torch.Tensor
    ) -> torch.Tensor:
        """One layer on ``x [b, t, hidden]`` whose tokens go to buffer slots ``start .. start+t``.

        ``mask``: in a decode step, ``[b*K, 1, start+1]`` added to the scores (0 or -inf); in the prompt pass, a
        boolean ``[b, 1, t, t]``, True where a query may see a key.
        """
        layer, (b, t, _), d, heads, kv = self.layers[i], x.shape, self.head_dim, self.heads, self.kv_heads
        qkv = layer.qkv(_normalize(x, layer.eps1)).view(b, t, heads + 2 * kv, d)
        _rope(qkv[:, :, : heads + kv], rotations)  # on q and k at once
        qkv = qkv.transpose(1, 2)
        # Keys and values in separate buffers: a slice [:, :, :end] of a [b, K, L, D] buffer still merges its
        # (b, K) dims into one batch dim, so the products below read it in place (a joint [b, 2K, L, D] buffer
        # made matmul copy the whole cache at every step: 60 % of a decode step).
        self.keys[i][:, :, start : start + t] = qkv[:, heads : heads + kv]
        self.values[i][:, :, start : start + t] = qkv[:, heads + kv :]
        q, keys, values = qkv[:, :heads], self.keys[i][:, :, : start + t], self.values[i][:, :, : start + t]
        if mask.dtype != torch.bool:  # a decode step: plain matrix products beat SDPA's CPU kernel (0.5 vs 0.75 ms)
            end = start + 1
            groups = q.reshape(b * kv, heads // kv, d)  # query heads sharing a KV head
            scores = torch.baddbmm(mask, groups, keys.reshape(b * kv, end, d).transpose(1, 2))  # [b*K, H/K, end]
            attn = torch.bmm(torch.softmax(scores, dim=-1), values.reshape(b * kv, end, d)).view(b, heads, 1, d)
        else:
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0, enable_gqa=kv != heads)
        x = layer.o.add_to(x, attn.transpose(1, 2).reshape(b, t, heads * d))
        h = _normalize(x, layer.eps2)
        if layer.gate_up.blocks == 2:  # the two blocks are gate and up
            gate, up = layer.gate_up.split(h.view(b * t, -1))
        else:
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
        return layer.down.add_to(x, F.silu(gate) * up)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        hidden = _normalize(x, self.final_eps) * self.final_norm.weight.to(x.dtype)
        return F.linear(hidden, self.lm_head_w, self.lm_head_b).float()

    def _rotations_at(self, like: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE rotations of ``positions``: looked up in the batch's table, or computed (a dynamic RoPE type)."""
        if self.static_rope:
            return self.table[positions]
        return _rotations(self.rotary, like, positions)

    def prefill(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, new: int
    ) -> torch.Tensor:
        """Run left-padded prompts ``[B, T]``, keeping room for ``new`` tokens; last-position logits ``[B, V]``."""
        b, t = input_ids.shape
        x = F.embedding(input_ids, self.embed)
        # Slots are written before they are read, so the buffers need no initialisation.
        self.keys, self.values = self._buffers(x, b, t + new)
        valid = attention.bool()
        self.bias = torch.full((b, t + new), float("-inf"), dtype=x.dtype, device=x.device)
        self.bias[:, :t].masked_fill_(valid, 0.0)
        if self.static_rope:  # every position this batch can reach, computed once
            self.table = _rotations(self.rotary, x, torch.arange(t + new, device=x.device)[None])[0]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        # A padding query attends to itself too, so that no row of the mask is empty (an empty row gives NaN,
        # and NaN keys would leak into real rows through 0 * NaN); its output is never used.
        allowed = causal & (valid[:, None, :] | torch.eye(t, dtype=torch.bool, device=x.device))  # [B, t, t]
        rotations = self._rotations_at(x, positions)
        for i in range(len(self.layers)):
            x = self._attention_block(i, x, rotations, 0, allowed[:, None])
        self.length = t
        return self._logits(x[:, -1])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row (``tokens [b]``, ``positions [b]``); returns next-token logits ``[b, V]``."""
        x = F.embedding(tokens[:, None], self.embed)  # [b, 1, hidden]
        slot, b, kv = self.length, tokens.shape[0], self.kv_heads
        self.bias[:, slot] = 0.0
        mask = self.bias[:, None, None, : slot + 1].expand(b, kv, 1, slot + 1).reshape(b * kv, 1, slot + 1)
        rotations = self._rotations_at(x, positions[:, None])
        for i in range(len(self.layers)):
            x = self._attention_block(i, x, rotations, slot, mask)
        self.length = slot + 1
        return self._logits(x[:, -1])

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows in ``index`` (1-D long tensor), in that order; a repeated index copies its row.

        New buffers are made, copying only the slots written so far (the prompts' expansion to their samples).
        """
        written = self.length
        keys, values = self._buffers(self.keys[0], len(index), self.keys[0].shape[2])
        for old, fresh in zip((*self.keys, *self.values), (*keys, *values), strict=True):
            torch.index_select(old[:, :, :written], 0, index, out=fresh[:, :, :written])
        self.keys, self.values = keys, values
        self.bias = self.bias.index_select(0, index)

    def drop(self, order: list[int]) -> None:
        """Keep ``len(order)`` rows in the order of :func:`~lrmgym.policies.sampling.compaction_order`.

        Slot ``j`` keeps row ``j`` or takes a row from beyond the kept prefix, so only those rows are copied, in
        place, and the buffers become views of the prefix. Rebuilding the buffers whenever a row finished took
        25 % of the sampler's time at 32 x 8 samples.
        """
        moved = [j for j, row in enumerate(order) if row != j]
        if moved:
            dst = torch.tensor(moved, dtype=torch.long, device=self.bias.device)
            src = torch.tensor([order[j] for j in moved], dtype=torch.long, device=self.bias.device)
            for buffer in (*self.keys, *self.values, self.bias):
                buffer.index_copy_(0, dst, buffer.index_select(0, src))
        n = len(order)
        self.keys = [buffer[:n] for buffer in self.keys]
        self.values = [buffer[:n] for buffer in self.values]
        self.bias = self.bias[:n]

    def _buffers(self, like: torch.Tensor, rows: int, slots: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Uninitialised key and value buffers ``[rows, K, slots, D]`` per layer.

        On CPU they are carved from a storage kept for the next batch (two, used in turn, since :meth:`select`
        copies from one set into the other). Why: a fresh buffer of a few MB is a fresh ``mmap`` whose pages fault
        in on first touch, and at 32 x 8 samples of the default model that was 15 % of the sampler's time. The pair
        belongs to this decoder while it lives (taken from the thread's idle pairs, given back when the decoder is
        collected): two decoders alive at once, as ``lrmgym analyze shift`` runs a base and an RL model in
        lockstep, must not write into each other's caches.
        """
        shape = (rows, self.kv_heads, slots, self.head_dim)
        count = 2 * len(self.layers)
        numel = math.prod(shape)
        if like.device.type == "cpu" and count * numel * like.element_size() <= _KEEP_BYTES:
            self._turn = 1 - self._turn
            if self._kept is None:
                self._kept = _take_storages(like)
                weakref.finalize(self, _give_back, self._kept)
            kept = self._kept
            if kept[self._turn].numel() < count * numel or kept[self._turn].dtype != like.dtype:
                kept[self._turn] = like.new_empty(count * numel)
            flat = kept[self._turn][: count * numel].view(count, *shape)
        else:
            flat = like.new_empty(count, *shape)
        return list(flat[: len(self.layers)].unbind(0)), list(flat[len(self.layers) :].unbind(0))

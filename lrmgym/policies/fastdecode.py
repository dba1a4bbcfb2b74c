"""A lean KV-cached forward for Llama-family decoders, used by :func:`lrmgym.policies.sampling.sample_batch`.

Why not ``model.forward`` with a transformers cache: for small models most of a decode step is overhead, not
arithmetic. On the 0.8 M-parameter default model at batch 128, one ``LlamaForCausalLM`` decode step took 16 ms
while its matrix products alone took 3.3 ms (mask building, cache objects, three separate q/k/v products, the
deprecation and kwargs layers). This module runs the same computation with the model's own weights and its
own rotary-embedding module: q/k/v and gate/up fused into one product each (with the norms' weights folded in),
RoPE as one complex product from a table made once per batch, one preallocated key/value buffer per layer, and
an additive mask. Rows that finish are dropped from the buffers, as in the sampler.

Which models qualify (:func:`llama_like`, :data:`ARCHITECTURES`): those whose decoder layer is
``RMSNorm -> attention(q,k,v,o, RoPE) -> RMSNorm -> gated MLP``, with plain ``nn.Linear`` projections (or peft LoRA
layers, through their effective weights) and no forward hooks, plus what each type adds:

============  ===================================================================================================
model_type    what the lean passes apply beyond Llama's layer
============  ===================================================================================================
``llama``     nothing (SiLU gate)
``mistral``   ``config.sliding_window`` on every layer: a query sees the keys less than ``window`` positions back
``qwen2``     q/k/v biases; a window on the layers ``config.layer_types`` marks ``sliding_attention``
``qwen3``     a per-head RMSNorm on q and on k before RoPE; windows as Qwen2
``gemma``     embeddings times sqrt(hidden) (the module's ``embed_scale``), norms scaling by ``1 + weight``,
              tanh-GELU gate (GeGLU), the head tied to the embedding
============  ===================================================================================================

Anything else takes ``model.forward``, the reason logged once (:data:`FALLBACK_REASONS`): Gemma2 and Gemma3
(attention and final-logit soft-capping, sandwich norms, ``query_pre_attn_scalar``, alternating local/global layers
with their own RoPE bases: each would be a branch of its own in both passes, for two model families), and the MoE
types (routed experts are not one gated MLP). :meth:`LlamaDecoder.build` returns ``None`` for them, and the sampler
falls back to the model's own forward. ``tests/policies/test_fastdecode.py`` and ``test_lean_archs.py`` check the
logits against ``model.forward`` on random models of each supported type (grouped-query attention, q/k/v biases,
q/k norms, windows shorter than the sequences and Gemma's pieces included).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ARCHITECTURES", "FALLBACK_REASONS", "LlamaDecoder", "llama_like", "sample_dtype"]

logger = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class _Arch:
    """What a supported model type adds to the plain Llama layer (``RMSNorm -> attention -> RMSNorm -> gated MLP``).

    Attributes:
        qk_norm: A per-head RMSNorm on q and on k (over the head dim, its own weight) before RoPE (Qwen3).
        unit_offset: Every RMSNorm scales by ``1 + weight`` rather than ``weight`` (Gemma).
        scaled_embedding: The embedding module multiplies its rows by its ``embed_scale`` buffer, sqrt(hidden)
            (Gemma), rounded to the weight's dtype as the module does.
        window: Which layers attend within ``config.sliding_window`` positions (a key at most ``window - 1``
            positions before its query): ``"all"`` (Mistral), ``"layer_types"`` (those ``config.layer_types``
            marks ``sliding_attention``: Qwen2/Qwen3 with ``use_sliding_window``), ``"none"`` (Llama, Gemma).
    """

    qk_norm: bool = False
    unit_offset: bool = False
    scaled_embedding: bool = False
    window: str = "none"


ARCHITECTURES: dict[str, _Arch] = {
    "llama": _Arch(window="none"),
    "mistral": _Arch(window="all"),
    "qwen2": _Arch(window="layer_types"),
    "qwen3": _Arch(qk_norm=True, window="layer_types"),
    "gemma": _Arch(unit_offset=True, scaled_embedding=True),
}
"""The model types the lean passes (this decoder and :mod:`lrmgym.policies.fasttrain`) take, by ``model_type``."""

FALLBACK_REASONS: dict[str, str] = {
    "gemma2": "Gemma2 soft-caps the attention scores and the final logits (tanh), adds sandwich norms after "
    "attention and after the MLP, scales queries by query_pre_attn_scalar and alternates sliding and full layers",
    "gemma3_text": "Gemma3 adds sandwich norms and q/k norms to Gemma's layer and alternates sliding layers with a "
    "local RoPE base of their own",
    "gemma3": "Gemma3 is a multimodal wrapper around gemma3_text (sandwich norms, q/k norms, two RoPE bases)",
    "mixtral": "a mixture-of-experts MLP (routed experts) instead of one gated MLP",
    "qwen2_moe": "a mixture-of-experts MLP (routed and shared experts) instead of one gated MLP",
    "qwen3_moe": "a mixture-of-experts MLP (routed experts) instead of one gated MLP",
}
"""Why a model type close to the supported ones takes ``model.forward`` (logged once per process and type)."""

_ACTIVATIONS: dict[str, Any] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),  # Gemma's GeGLU
}
"""The MLP gate activations (``config.hidden_act``) the lean passes apply, as transformers' ``ACT2FN`` does."""

_LOGGED: set[str] = set()


def _log_fallback(model_type: str, reason: str) -> None:
    """Log once per process and reason that a model of ``model_type`` runs through ``model.forward``."""
    message = f"{model_type}: {reason}"
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning("Lean forward off for this model (model.forward runs instead): %s.", message)


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

    Qualifies: a model of one of the :data:`ARCHITECTURES` types with a gate activation the lean passes apply
    (SiLU; Gemma's tanh GELU), q/k norms exactly where its type has them, plain (or LoRA-wrapped) linear
    projections, no MLP biases and no forward hooks on any module. Where a model does not, the reason is logged
    once (:data:`FALLBACK_REASONS` for the types close to the supported ones).
    """
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # a peft PeftModel: its LoRA layers sit inside the base model's modules
        model = get_base()
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None:
        return None
    reason = _unsupported(model, config, inner)
    if reason is not None:
        _log_fallback(str(getattr(config, "model_type", None)), reason)
        return None
    return model


def _unsupported(model: Any, config: Any, inner: Any) -> str | None:
    """Why :func:`llama_like` does not take ``model``, or ``None`` when it does."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(str(model_type))
    if arch is None:
        known = ", ".join(ARCHITECTURES)
        return FALLBACK_REASONS.get(str(model_type), f"not one of the architectures the lean passes run ({known})")
    if (act := getattr(config, "hidden_act", "silu")) not in _ACTIVATIONS:
        return f"the MLP activation {act!r} (the lean passes apply {', '.join(_ACTIVATIONS)})"
    if any(_hooked(m) for m in model.modules()):
        return "forward hooks on a module (a hook, for steering, probing or a test, must see every forward)"
    needed = ("embed_tokens", "norm", "layers", "rotary_emb")
    if not all(hasattr(inner, name) for name in needed) or not _plain_linear(getattr(model, "lm_head", None)):
        return "no embed_tokens/norm/layers/rotary_emb in the decoder, or an LM head that is not a linear layer"
    if arch.scaled_embedding and not isinstance(getattr(inner.embed_tokens, "embed_scale", None), torch.Tensor):
        return "an embedding without its embed_scale buffer"
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        weights = [_linear_weights(p) for p in projections]
        if any(w is None for w in weights) or any(w[1] is not None for w in weights[4:]):  # type: ignore[index]
            return "a projection that is not a (LoRA-)linear layer, or an MLP with biases"
        if any(hasattr(attn, n) for n in ("q_norm", "k_norm")) != arch.qk_norm:
            return "q/k norms where its type has none, or none where it has them"
    return None


def layer_windows(model: Any) -> list[int | None]:
    """Per decoder layer of a :func:`llama_like` model, its sliding window (``None``: full causal attention).

    A query at position ``p`` attends to the keys at ``p - window + 1 .. p``, as transformers' sliding-window mask
    does (``kv > q - window``). Which layers slide is the architecture's (:attr:`_Arch.window`).
    """
    config, count = model.config, len(model.model.layers)
    window = getattr(config, "sliding_window", None) or None
    rule = ARCHITECTURES[config.model_type].window
    if window is None or rule == "none":
        return [None] * count
    if rule == "all":
        return [int(window)] * count
    types = list(getattr(config, "layer_types", None) or [])
    return [int(window) if i < len(types) and types[i] == "sliding_attention" else None for i in range(count)]


def norm_weight(norm: Any, arch: _Arch) -> torch.Tensor:
    """The factor an RMSNorm applies after normalizing: its weight, or ``1 + weight`` (Gemma's norms)."""
    return norm.weight + 1.0 if arch.unit_offset else norm.weight


class _Layer:
    """One decoder layer's weights, q/k/v and gate/up concatenated, the norms' weights folded in.

    Rebuilt for every batch, so that it follows the weights as training changes them. Each RMSNorm's weight
    scales the input columns of the product that reads it (``W (w * n) = (W * w) n``), so that the norm itself is
    only ``x / rms(x)`` (:func:`_normalize`). The q and k rows of each head are stored with the two halves of
    rotate-half RoPE interleaved (``0, D/2, 1, D/2+1, ...``), so that RoPE is one complex product on pairs of
    adjacent features (:func:`_rope`): a permutation of the head dim applied to both q and k leaves every q.k, and
    so attention, unchanged, and v and the output stay in the model's order. The key cache holds permuted keys.
    """

    def __init__(self, layer: Any, head_dim: int, parts: int, arch: _Arch) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.eps1, self.eps2 = _eps_tensor(norm1), _eps_tensor(norm2)
        # The attention scale is folded into the query rows (RoPE is linear, so scaling before it is the same),
        # or, with q/k norms (which would undo it), into the q norm's weight.
        scaling = float(getattr(attn, "scaling", attn.head_dim**-0.5))
        self.qk_norms = qk_norms(attn, head_dim, scaling) if arch.qk_norm else None
        if self.qk_norms is not None:
            scaling = 1.0
            self.qk_eps = _eps_tensor(attn.q_norm), _eps_tensor(attn.k_norm)  # made once, not per decode step
        (q_w, q_b), (k_w, k_b), (v_w, v_b), (o_w, o_b), (g_w, _), (u_w, _), (d_w, _) = (
            _linear_weights(m)  # type: ignore[misc]  # build() checked that each is a (LoRA-)linear layer
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        q_rows, k_rows = (_interleaved(w.shape[0], head_dim, w.device) for w in (q_w, k_w))
        biases = [q_b, k_b, v_b]
        qkv_b = torch.cat([(q_b * scaling)[q_rows], k_b[k_rows], v_b]) if all(b is not None for b in biases) else None
        n1, n2 = norm_weight(norm1, arch), norm_weight(norm2, arch)
        self.qkv = _Product(torch.cat([(q_w * scaling)[q_rows], k_w[k_rows], v_w]) * n1, qkv_b, parts)
        self.o = _Product(o_w, o_b, parts)
        self.gate_up = _Product(torch.cat([g_w, u_w]) * n2, None, parts)
        self.down = _Product(d_w, None, parts)


QKNorms = tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]
"""``((q weight, eps), (k weight, eps))`` of Qwen3's per-head q and k norms (:func:`qk_norms`)."""


def qk_norms(attn: Any, head_dim: int, scaling: float) -> QKNorms:
    """Qwen3's per-head q and k RMSNorms as ``(weight, eps)`` each, the weights in the interleaved head order.

    The norm runs over each head's ``D`` features (a permutation of them leaves the RMS as it is, so the weight is
    permuted like the rows); the attention scale goes into the q norm's weight, since the norm undoes any scaling
    of the product before it.
    """
    order = _interleaved(head_dim, head_dim, attn.q_norm.weight.device)
    return ((attn.q_norm.weight * scaling)[order], _eps(attn.q_norm)), (attn.k_norm.weight[order], _eps(attn.k_norm))


def _interleaved(rows: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """Row order that interleaves each head's two RoPE halves: per head ``0, D/2, 1, D/2+1, ..., D/2-1, D-1``."""
    within = torch.arange(head_dim, device=device).view(2, head_dim // 2).t().reshape(-1)
    return (torch.arange(0, rows, head_dim, device=device)[:, None] + within).reshape(-1)


def _within(t: int, window: int, device: torch.device) -> torch.Tensor:
    """``[t, t]`` True where key ``j`` is not ``window`` or more positions before query ``i`` (``j > i - window``)."""
    i = torch.arange(t, device=device)
    return i[None, :] > i[:, None] - window


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
        self.arch = ARCHITECTURES[config.model_type]
        self.final_scale = norm_weight(self.final_norm, self.arch)
        self.act = _ACTIVATIONS[getattr(config, "hidden_act", "silu")]
        self.windows = layer_windows(model)
        scale = inner.embed_tokens.embed_scale if self.arch.scaled_embedding else None
        self.embed_scale = scale.to(self.embed.dtype) if scale is not None else None

    def embedded(self, ids: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor:
        """The embedding rows of ``ids`` (times the embedding's scale where the architecture has one: Gemma)."""
        x = F.embedding(ids, self.embed, padding_idx=padding_idx)
        return x * self.embed_scale if self.embed_scale is not None else x


class LlamaDecoder(_LlamaParts):
    """Prefill a left-padded batch, then decode one token per row per call, with a preallocated KV buffer.

    Use :meth:`build` (``None`` when the model does not qualify). Shapes: ``b`` rows alive, ``H`` query heads,
    ``K`` key/value heads, ``D`` head size, ``L`` buffer length (prompt width + new tokens).
    """

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        # Two column blocks per product on a CPU with two intra-op threads (see _Product), else plain products.
        parts = 2 if self.embed.device.type == "cpu" and torch.get_num_threads() == 2 else 1
        self.layers = [_Layer(layer, self.head_dim, parts, self.arch) for layer in model.model.layers]
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
            if decoder.embed_scale is not None:  # Gemma
                decoder.embed_scale = decoder.embed_scale.to(dtype)
            for layer in decoder.layers:
                if layer.qk_norms is not None:  # Qwen3
                    layer.qk_norms = tuple((w.to(dtype), eps) for w, eps in layer.qk_norms)
        return decoder

    def _attention_block(
        self, i: int, x: torch.Tensor, rotations: torch.Tensor, start: int, mask: torch.Tensor, low: int = 0
    ) -> torch.Tensor:
        """One layer on ``x [b, t, hidden]`` whose tokens go to buffer slots ``start .. start+t``.

        ``mask``: in a decode step, ``[b*K, 1, start+1-low]`` added to the scores (0 or -inf) of buffer slots
        ``low .. start`` (``low > 0``: a sliding window); in the prompt pass, a boolean ``[b, 1, t, t]``, True where
        a query may see a key.
        """
        layer, (b, t, _), d, heads, kv = self.layers[i], x.shape, self.head_dim, self.heads, self.kv_heads
        qkv = layer.qkv(_normalize(x, layer.eps1)).view(b, t, heads + 2 * kv, d)
        if layer.qk_norms is not None:  # Qwen3: per-head RMSNorms on q and k before RoPE
            (q_w, _), (k_w, _) = layer.qk_norms
            q_eps, k_eps = layer.qk_eps
            qkv[:, :, :heads] = _normalize(qkv[:, :, :heads], q_eps) * q_w
            qkv[:, :, heads : heads + kv] = _normalize(qkv[:, :, heads : heads + kv], k_eps) * k_w
        _rope(qkv[:, :, : heads + kv], rotations)  # on q and k at once
        qkv = qkv.transpose(1, 2)
        # Keys and values in separate buffers: a slice [:, :, :end] of a [b, K, L, D] buffer still merges its
        # (b, K) dims into one batch dim, so the products below read it in place (a joint [b, 2K, L, D] buffer
        # made matmul copy the whole cache at every step: 60 % of a decode step).
        self.keys[i][:, :, start : start + t] = qkv[:, heads : heads + kv]
        self.values[i][:, :, start : start + t] = qkv[:, heads + kv :]
        q, keys, values = qkv[:, :heads], self.keys[i][:, :, low : start + t], self.values[i][:, :, low : start + t]
        if mask.dtype != torch.bool:  # a decode step: plain matrix products beat SDPA's CPU kernel (0.5 vs 0.75 ms)
            end = start + 1 - low
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
        return layer.down.add_to(x, self.act(gate) * up)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        hidden = _normalize(x, self.final_eps) * self.final_scale.to(x.dtype)
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
        x = self.embedded(input_ids)
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
        # A sliding window counts buffer slots: a left-padded row's real tokens sit in consecutive slots, so the
        # distance of two slots is that of their positions.
        masks = {w: allowed if w is None else allowed & _within(t, w, x.device) for w in set(self.windows)}
        rotations = self._rotations_at(x, positions)
        for i, window in enumerate(self.windows):
            x = self._attention_block(i, x, rotations, 0, masks[window][:, None])
        self.length = t
        return self._logits(x[:, -1])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row (``tokens [b]``, ``positions [b]``); returns next-token logits ``[b, V]``."""
        x = self.embedded(tokens[:, None])  # [b, 1, hidden]
        slot, b, kv = self.length, tokens.shape[0], self.kv_heads
        self.bias[:, slot] = 0.0
        masks = {}
        for window in set(self.windows):  # a sliding window: only the last `window` slots are read
            low = 0 if window is None else max(0, slot + 1 - window)
            n = slot + 1 - low
            masks[window] = low, self.bias[:, None, None, low : slot + 1].expand(b, kv, 1, n).reshape(b * kv, 1, n)
        rotations = self._rotations_at(x, positions[:, None])
        for i, window in enumerate(self.windows):
            low, mask = masks[window]
            x = self._attention_block(i, x, rotations, slot, mask, low)
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

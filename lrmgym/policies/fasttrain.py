"""A lean, differentiable forward for Llama-family models: the training twin of :mod:`lrmgym.policies.fastdecode`.

Why not ``model.forward``: for the small models lrmgym trains on a CPU, a training step is mostly work around the
matrix products. On the tiny default model, a forward and backward of the default update (micro-batches of
1 024 tokens) spent 38 % of its time in them; the rest went to the transformers layers' elementwise passes and
bookkeeping: the mask built per call, RoPE through slices, a negation and a concatenation, RMSNorm through
``pow, mean, rsqrt, mul, mul`` (about seven passes over the activations in its backward), and
``scaled_dot_product_attention``'s CPU kernel, which at head size 32 and under 100 positions runs forward and
backward 1.5-1.9x slower than two batched products and a softmax.

This module computes the same function with the model's own parameters (so gradients land on them, and the
optimizer, checkpoints and LoRA adapters are untouched): the model's own rotary-embedding module, RoPE as one
complex product (on q/k rows reordered as in the decoder), RMSNorm as ``x / rms(x)`` with a hand-written backward
and its weight folded into the products after it, attention as ``softmax(q k^T + mask) v`` with batched products and
a causal mask only, and the LM head applied only where a caller needs logits. q/k/v and gate/up stay separate
products here (unlike the decoder): with a gradient, one fused product's split output costs its backward more than
the fusion saves. Measured on the default run's own update batches (A/B in one process, idle machine, thread CPU
time, best of 8): 374 ms per update against 404 ms through ``model.forward`` (7 % less). The rest is elementwise
work that only a compiler fuses. ``compile=True`` (``learner.compile``) runs the layers through ``torch.compile``
(Inductor, dynamic shapes, so that the update's changing micro-batch shapes share one graph per kind of pass): on
the default run's update batches 1.26x faster (555 against 698 ms per update, A/B in one process, 2-core AMD EPYC),
but compiling took 80-220 s on that machine (the first time; Inductor's on-disk cache shortens later runs) and needs
a C++ compiler on a CPU, so it is off by default: it pays in runs of an hour, not in the default 530-s run. Eager
mode and the compiled graph round differently (fused kernels), within float tolerance. Two kinds of call:

- :meth:`LlamaTrainer.logits`: right-padded rows from position 0 (the plain training pass). Right padding means
  that a real token never attends to padding (padding comes after it), so the causal mask is the whole mask.
- :meth:`LlamaTrainer.prefill` then :meth:`LlamaTrainer.extend`: a prompt pass that keeps its keys and values
  (differentiable), and continuation rows on top of a row-selection of them, the layout of
  :mod:`lrmgym.learners.engine.shared_prefix`.

At real-model sizes two things change, by size, so that the tiny default model's update stays as it was: from
:data:`SDPA_MIN_KEYS` attended positions on, attention runs through ``scaled_dot_product_attention`` (its fused
causal kernel keeps no ``[t, t]`` scores for the backward), and where a pass's logits exceed :data:`LOGIT_CHUNK`
elements, :meth:`LlamaTrainer.logprobs` computes log-probs and entropies chunk by chunk (:func:`head_logprobs`:
the logits of a chunk are recomputed in the backward, never kept whole).

Which models qualify is :func:`lrmgym.policies.fastdecode.llama_like` (Llama, Mistral, Qwen2, Qwen3 and Gemma, the
table in :mod:`lrmgym.policies.fastdecode`; plain or LoRA linear layers; no hooks). Qwen3's q/k norms run here as
:class:`_Normalize` times their weight (the attention scale folded into the q norm's), Gemma's norms fold
``1 + weight``, and a sliding-window layer gets its own additive mask (``key position <= query position - window``
blocked) wherever some key is that far back, also on the SDPA path (then an explicit mask rather than its causal
kernel). In addition, a model in training mode with a dropout that would
be active (attention dropout, a LoRA dropout) does not qualify: this forward does not apply it. With transformers'
gradient checkpointing on (``policy.gradient_checkpointing``), this forward checkpoints each decoder layer too
(``torch.utils.checkpoint``, non-reentrant: only the layer's input is kept, the rest is recomputed). Where a model
does not qualify, :meth:`LlamaTrainer.build` returns ``None``, and callers take ``model.forward``.
``tests/policies/test_fasttrain.py`` checks logits and every parameter's gradient against ``model.forward``.
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Any

import torch
import torch.nn.functional as F

from lrmgym.policies.fastdecode import (
    _Arch,
    _eps,
    _hooked,
    _interleaved,
    _inv_rms,
    _linear_weights,
    _LlamaParts,
    _rotated,
    _rotations,
    llama_like,
    norm_weight,
    qk_norms,
)

__all__ = [
    "LOGIT_CHUNK",
    "SDPA_MIN_KEYS",
    "LlamaTrainer",
    "causal_lm_logits",
    "causal_lm_logprobs",
    "chunked_model_logprobs",
    "compile_unavailable",
    "head_logprobs",
]

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, ``(keys, values)`` of a pass, each ``[b, K, t, D]`` (after RoPE for the keys)."""


SDPA_MIN_KEYS = 512
"""From this many attended positions (prefix + pass) on, attention runs through ``scaled_dot_product_attention``
(its causal or masked fused kernel: no ``[b, H, t, P+t]`` score and probability tensors kept for the backward);
below it, as two batched products and a softmax. The tiny default model never reaches it (256 positions at most),
so its update is unchanged. Measured on a CPU, one thread, head size 32, 4 heads, 1 024 tokens per pass, forward
and backward of the attention alone: 2.95/2.82 ms (products/SDPA) at 64 positions, 5.4/4.8 at 128, 8.8/8.7 at 256,
24.7/18.1 at 512, 35.3/26.1 at 1 024; and the memory a 4 096-position row's attention keeps for its backward
(8 query and 2 key/value heads of 64): 1 651 MB as products, 37 MB through SDPA's causal kernel, 146 MB with an
explicit mask (the mask itself). ``benchmarks/memory_real.py`` measures whole passes; its ``--thresholds`` A/B on
a default update pass of the tiny model: 106.8 ms as it runs, 101.9 ms with SDPA forced (best of 15, one thread):
the threshold keeps the default run's numbers bit-identical rather than take that ~5 %."""

LOGIT_CHUNK = 1 << 24
"""Logit elements (64 MiB in float32) that :func:`head_logprobs` computes at a time. A pass whose logits fit in one
chunk (the tiny default model's: 1 024 tokens x 103) computes them whole, as before; a larger one (a 152k
vocabulary: 110 tokens per chunk) computes log-probs and entropies chunk by chunk and recomputes each chunk's
logits in the backward, so no ``[tokens, V]`` tensor outlives its chunk. Forced onto the tiny model's default
pass it costs 24 % (132.4 against 106.8 ms, ``benchmarks/memory_real.py --thresholds``): hence the switch."""


def compile_unavailable() -> str | None:
    """Why ``torch.compile`` cannot build the CPU training forward here, or ``None`` when it can.

    Inductor writes C++ for a CPU and builds it with the compiler ``$CXX`` names, ``g++`` when unset (its
    ``cpp.cxx`` setting); a CUDA device needs Triton instead, which comes with torch's CUDA builds.
    """
    if torch.cuda.is_available():
        return None
    cxx = os.environ.get("CXX") or "g++"
    return None if shutil.which(cxx) else f"the compiler {cxx!r} ($CXX, g++ when unset) is not on PATH"


class _Normalize(torch.autograd.Function):
    """``x / rms(x)`` over the last dim, computed in float32 (or float64), with a hand-written backward.

    The RMSNorm's weight is folded into the weights of the products that read it (``W * w`` per input column:
    a differentiable product of two small tensors), so only this part runs on activations. Why by hand: autograd
    through ``pow, mean, rsqrt, mul, mul`` takes about seven passes over the activations in the backward; this one
    takes three, ``gx = r (gy - x (r^2 / n) (gy . x))`` with the row dot products from ``vecdot``, and the
    forward two (``vector_norm``, then the product). 314 against 428 us forward and backward on ``[880, 128]``
    (one thread) for the earlier ``mean(x * x)`` forward and ``addcmul`` backward; ``F.rms_norm`` took 480.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:  # noqa: D102
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = _inv_rms(xf, xf.new_tensor(eps))
        ctx.save_for_backward(xf, rstd)
        return (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        xf, rstd = ctx.saved_tensors
        gf = grad.to(xf.dtype)
        coef = torch.linalg.vecdot(gf, xf).unsqueeze(-1) * rstd.square() / xf.shape[-1]
        return torch.addcmul(gf, xf, coef, value=-1.0).mul_(rstd).to(grad.dtype), None


class _TrainLayer:
    """One decoder layer's (effective) weights, the attention scale and the norms' weights folded in.

    The scale goes into q's rows; each norm's weight into the columns of the products that read the norm. As in
    the decoder, each head's q and k rows are reordered so that RoPE's two halves are interleaved (see
    :class:`~lrmgym.policies.fastdecode._Layer`): q.k, and so attention, is unchanged, and RoPE is one complex
    product (:func:`~lrmgym.policies.fastdecode._rotated`). The keys this forward keeps are in that order too.

    Unlike the decoder's :class:`~lrmgym.policies.fastdecode._Layer`, q/k/v and gate/up stay separate products:
    with a gradient, splitting one fused output costs its backward a concatenation (or a zero-filled buffer and a
    copy per part) of the output's gradient, more than the fused forward saves (measured on the tiny default
    model: a fused forward and backward took 18 % longer than separate products).
    """

    def __init__(self, layer: Any, head_dim: int, arch: _Arch, window: int | None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.window = window
        scaling = float(getattr(attn, "scaling", attn.head_dim**-0.5))  # RoPE is linear: scaling q first is the same
        self.qk_norms = qk_norms(attn, head_dim, scaling) if arch.qk_norm else None
        if self.qk_norms is not None:  # the scale is in the q norm's weight (the norm would undo it here)
            scaling = 1.0
        (q_w, q_b), (k_w, self.k_b), (v_w, self.v_b), (self.o_w, self.o_b) = (
            _linear_weights(m)  # type: ignore[misc]  # llama_like checked that each is a (LoRA-)linear layer
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        gate_w, up_w, self.down_w = (_linear_weights(m)[0] for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))  # type: ignore[index]
        # The norms' weights are folded into the products that read them (see _Normalize).
        n1, n2 = norm_weight(self.norm1, arch), norm_weight(self.norm2, arch)
        q_rows, k_rows = (_interleaved(w.shape[0], head_dim, w.device) for w in (q_w, k_w))
        self.q_w, self.q_b = (q_w * (n1 * scaling))[q_rows], (q_b[q_rows] * scaling if q_b is not None else None)
        self.k_w, self.k_b = (k_w * n1)[k_rows], (self.k_b[k_rows] if self.k_b is not None else None)
        self.v_w = v_w * n1
        self.gate_w, self.up_w = gate_w * n2, up_w * n2
        self.eps1, self.eps2 = _eps(self.norm1), _eps(self.norm2)


class _HeadLogProbs(torch.autograd.Function):
    """Next-token log-probs (and detached entropies) of ``hidden @ weight.T + bias``, ``rows`` tokens at a time.

    Forward: per chunk, the logits in float32 (divided by the temperature), their logsumexp ``lse``, the target's
    ``logit - lse``. Only ``hidden``, the targets and ``lse`` are kept. Backward: per chunk, the logits again, and
    ``d logp / d logits = onehot(target) - softmax`` (divided by the temperature) times the incoming gradient,
    then the two products of a linear layer's backward (the weight's gradient accumulated over chunks).
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        rows: int,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = hidden.shape[0]
        logp = torch.empty(m, dtype=torch.promote_types(weight.dtype, torch.float32), device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if entropy else logp.new_empty(0)
        for s in range(0, m, rows):
            logits = _chunk_logits(hidden[s : s + rows], weight, bias, temperature)
            lse[s : s + rows] = chunk_lse = torch.logsumexp(logits, dim=-1)
            logp[s : s + rows] = logits.gather(-1, targets[s : s + rows, None]).squeeze(-1) - chunk_lse
            if entropy:  # H = lse - sum(p * logits)
                probs = (logits - chunk_lse[:, None]).exp_()
                ent[s : s + rows] = chunk_lse - torch.linalg.vecdot(probs, logits)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: torch.Tensor) -> tuple:  # noqa: D102
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        rows, temperature = ctx.rows, ctx.temperature
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        for s in range(0, hidden.shape[0], rows):
            h, g = hidden[s : s + rows], grad[s : s + rows, None].to(lse.dtype)
            dlogits = (_chunk_logits(h, weight, bias, temperature) - lse[s : s + rows, None]).exp_().mul_(-g)
            dlogits.scatter_add_(1, targets[s : s + rows, None], g)
            if temperature != 1.0:
                dlogits.div_(temperature)
            dlogits = dlogits.to(weight.dtype)
            if grad_h is not None:
                grad_h[s : s + rows] = dlogits @ weight
            if grad_w is not None:
                grad_w.addmm_(dlogits.t(), h.to(weight.dtype))
            if grad_b is not None:
                grad_b += dlogits.sum(0)
        return grad_h, grad_w, grad_b, None, None, None, None


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> Any:
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32, or float64 for float64 input
    return logits.div_(temperature) if temperature != 1.0 else logits


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(F.linear(hidden, weight, bias) / temperature)`` at ``targets``, without the whole logits.

    ``hidden [..., h]`` and ``targets [...]`` (token ids) give ``(logp [...], entropy [...] or None)`` in float32
    (float64 for float64 input), computed :data:`LOGIT_CHUNK` logit elements at a time (the logits are recomputed in
    the backward). The entropies are detached. Differentiable in ``hidden``, ``weight`` and ``bias``.
    """
    shape = targets.shape
    rows = max(1, LOGIT_CHUNK // weight.shape[0])
    logp, ent = _HeadLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1), float(temperature), rows, entropy
    )
    return logp.view(shape), (ent.view(shape) if entropy else None)


_PLAIN_HEAD = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo", "olmo2", "gemma"}
)
"""Model types whose causal LM computes ``lm_head(decoder(...).last_hidden_state)`` and nothing more (no logit
scaling or soft-capping), so that :func:`chunked_model_logprobs` may run the decoder and the head apart."""


def chunked_model_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = False,
    targets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Next-token log-probs ``[b, t-1]`` (and entropies) through the model's own decoder, the head in chunks.

    For models the lean forward does not take (MoE layers, Gemma2, left padding ...) whose logits would exceed
    :data:`LOGIT_CHUNK`: transformers' decoder gives the hidden states, :func:`head_logprobs` the rest.
    ``targets [b, t-1]``: the tokens scored (default ``input_ids[:, 1:]``, the next tokens).
    ``None`` where the logits fit whole, or where the model is not one of :data:`_PLAIN_HEAD` with a plain linear
    head and no hooks on the causal LM or its head (the caller then takes ``model(...).logits``).
    """
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    if getattr(getattr(base, "config", None), "model_type", None) not in _PLAIN_HEAD:
        return None
    head, get_decoder = getattr(base, "lm_head", None), getattr(base, "get_decoder", None)
    if type(head) is not torch.nn.Linear or not callable(get_decoder) or _hooked(base) or _hooked(head):
        return None
    if input_ids.numel() * head.weight.shape[0] <= LOGIT_CHUNK:
        return None
    hidden = get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    targets = input_ids[:, 1:] if targets is None else targets
    return head_logprobs(hidden[:, :-1], head.weight, head.bias, targets, temperature, entropy)


def causal_lm_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, lean: bool = True
) -> torch.Tensor | None:
    """Log-probs ``[b, t-1]`` of ``targets [b, t-1]`` after each position, without ``[b, t, V]`` logits.

    For a loss over long rows (SFT's cross-entropy is ``-logp`` of the labels): through :class:`LlamaTrainer`
    where :func:`causal_lm_logits` would take it, else through :func:`chunked_model_logprobs`; in both the head runs
    :data:`LOGIT_CHUNK` logit elements at a time. ``None`` where the logits fit in one chunk (the caller computes
    them whole: the tiny model's path stays as it was) or where no chunked path applies to the model.
    """
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and input_ids.numel() * vocab <= LOGIT_CHUNK:
        return None  # decided before building a LlamaTrainer, which the whole-logits path builds again
    trainer = LlamaTrainer.build(model) if lean and right_padded(attention_mask) else None
    if trainer is not None:
        if trainer.fits_whole(input_ids.numel()):
            return None
        return trainer.logprobs(trainer.hidden(input_ids)[:, :-1], targets)[0]
    chunked = chunked_model_logprobs(model, input_ids, attention_mask, targets=targets)
    return None if chunked is None else chunked[0]


def _steps_aside(model: Any) -> bool:
    """Whether ``model.forward`` must run instead of this module.

    So when a dropout this module does not apply would be active (training mode, attention or LoRA dropout).
    """
    attention_dropout = model.training and float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0
    for module in model.modules():  # one pass (this runs before every training forward)
        if model.training and isinstance(lora := getattr(module, "lora_dropout", None), torch.nn.ModuleDict):
            if any(isinstance(d, torch.nn.Dropout) and d.p > 0 for d in lora.values()):
                return True
    return attention_dropout


def _checkpointing(model: Any) -> bool:
    """Whether ``model`` trains with transformers' gradient checkpointing on (``policy.gradient_checkpointing``).

    transformers marks the decoder (``model.model``, before v5) or each decoder layer (v5) with
    ``gradient_checkpointing = True``. The lean forward then recomputes each layer in the backward too.
    """
    inner = model.model
    marked = getattr(inner, "gradient_checkpointing", False) or any(
        getattr(layer, "gradient_checkpointing", False) for layer in inner.layers
    )
    return bool(model.training and marked)


class LlamaTrainer(_LlamaParts):
    """The lean forward over one model's current parameters (build one per forward pass: :meth:`build`).

    Shapes: ``b`` rows, ``t`` positions of this pass, ``P`` positions of a kept prefix, ``H`` query heads,
    ``K`` key/value heads, ``D`` head size, ``V`` vocabulary.
    """

    def __init__(self, model: Any, compiled: bool = False) -> None:
        super().__init__(model)
        self.padding_idx = getattr(model.model.embed_tokens, "padding_idx", None)  # no gradient from its lookups
        self.layers = [
            _TrainLayer(layer, self.head_dim, self.arch, window)
            for layer, window in zip(model.model.layers, self.windows, strict=True)
        ]
        self.final_eps = _eps(self.final_norm)
        self.checkpointing = _checkpointing(model)
        self._layers = functools.partial(_compiled_run(), self) if compiled else self._run

    @classmethod
    def build(cls, model: Any, compiled: bool = False) -> LlamaTrainer | None:
        """The lean forward of ``model`` as its parameters are now, or ``None`` where ``model.forward`` must run.

        ``compiled``: run the layers through ``torch.compile`` (see the module's docstring; check
        :func:`compile_unavailable` first).
        """
        base = llama_like(model)
        return None if base is None or _steps_aside(base) else cls(base, compiled)

    # ------------------------------------------------------------------------------------------ the layers
    def _run(
        self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor | None, past: KV | None, group: int = 1
    ) -> tuple:
        """Hidden states after the final norm ``[b, t, hidden]`` and this pass's keys and values.

        ``bias [t, P+t]`` or ``[b, 1, t, P+t]`` is added to the attention scores (0 where a query may see a key,
        the dtype's lowest value where not), ``None`` for a plain causal pass (``P = 0``); ``past`` holds the keys
        and values of the ``P`` positions before, one entry per ``group`` consecutive rows (see :meth:`extend`).
        Attention runs as batched products under :data:`SDPA_MIN_KEYS` keys, through SDPA from there on.
        """
        t = ids.shape[1]
        x = self.embedded(ids, self.padding_idx)
        rotations = _rotations(self.rotary, x, positions)  # [b, t, 1, D/2], complex
        prefix = past[0][0].shape[2] if past else 0
        fused = t + prefix >= SDPA_MIN_KEYS
        if bias is None and not fused:
            bias = self._causal(t, self.embed)
        biases = {w: self._windowed(bias, w, positions, prefix) for w in set(self.windows)}
        kept: KV = []
        recompute = self.checkpointing and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            args = (layer, x, rotations, biases[layer.window], past[i] if past is not None else None, group, fused)
            if recompute:  # keep the layer's input only; its activations are recomputed in the backward
                x, k, v = torch.utils.checkpoint.checkpoint(self._layer, *args, use_reentrant=False)
            else:
                x, k, v = self._layer(*args)
            kept.append((k, v))
        return _Normalize.apply(x, self.final_eps), kept

    def _layer(
        self,
        layer: _TrainLayer,
        x: torch.Tensor,
        rotations: torch.Tensor,
        bias: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        group: int,
        fused: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decoder layer of :meth:`_run`: the new residual stream and this pass's keys and values."""
        b, t, _ = x.shape
        heads, kv, d = self.heads, self.kv_heads, self.head_dim
        h = _Normalize.apply(x, layer.eps1)
        q, new_k = F.linear(h, layer.q_w, layer.q_b).view(b, t, heads, d), F.linear(h, layer.k_w, layer.k_b)
        new_k = new_k.view(b, t, kv, d)
        if layer.qk_norms is not None:  # Qwen3: per-head RMSNorms on q and k before RoPE
            (q_w, q_eps), (k_w, k_eps) = layer.qk_norms
            q, new_k = _Normalize.apply(q, q_eps) * q_w, _Normalize.apply(new_k, k_eps) * k_w
        # RoPE as one complex product on each head's interleaved pairs (0.24 against 0.35 ms forward and
        # backward for rotate-half's roll, two products and a sum, on one [40, 22, 4, 32] projection)
        q, new_k = _rotated(q, rotations).transpose(1, 2), _rotated(new_k, rotations).transpose(1, 2)
        new_v = F.linear(h, layer.v_w, layer.v_b).view(b, t, kv, d).transpose(1, 2)
        k, v = new_k, new_v
        if past is not None:
            k, v = _after_prefix(past[0], k, group), _after_prefix(past[1], v, group)
        if fused:  # q is pre-scaled (the scale is folded into q's weights): scale=1
            attn = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, is_causal=bias is None, scale=1.0, enable_gqa=kv != heads
            )
        else:
            if kv != heads:  # grouped-query attention: each key/value head serves heads / kv query heads
                k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
            scores = torch.matmul(q, k.transpose(-1, -2)).add_(bias)  # [b, H, t, P+t]
            attn = torch.matmul(torch.softmax(scores, dim=-1), v)  # [b, H, t, D]
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, heads * d), layer.o_w, layer.o_b)
        h = _Normalize.apply(x, layer.eps2)
        x = x + F.linear(self.act(F.linear(h, layer.gate_w)) * F.linear(h, layer.up_w), layer.down_w)
        return x, new_k, new_v

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of :meth:`_run`'s final hidden states (normalized, before the final norm's weight)."""
        return F.linear(hidden, self.lm_head_w * self.final_scale, self.lm_head_b)

    def fits_whole(self, tokens: int) -> bool:
        """Whether the logits of ``tokens`` positions fit in one :data:`LOGIT_CHUNK` (else :meth:`logprobs`)."""
        return tokens * self.lm_head_w.shape[0] <= LOGIT_CHUNK

    def logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`head_logprobs` of final hidden states ``[..., hidden]`` (:meth:`hidden`) at ``targets [...]``.

        The final norm's weight multiplies the hidden states here rather than the head's weight (as :meth:`head`
        does), so no second ``[V, hidden]`` weight is made.
        """
        scaled = hidden * self.final_scale
        return head_logprobs(scaled, self.lm_head_w, self.lm_head_b, targets, temperature, entropy)

    def _windowed(
        self, bias: torch.Tensor | None, window: int | None, positions: torch.Tensor, prefix: int
    ) -> torch.Tensor | None:
        """``bias`` for a layer with a sliding ``window`` (``None``: full attention, ``bias`` as it is).

        A query at position ``p`` must not see keys at ``p - window`` or before; the ``prefix`` keys sit at positions
        ``0 .. prefix-1`` (right-padded prompts), this pass's at ``positions [b or 1, t]``. Where no key is that far
        back (``prefix + t <= window``), the plain bias serves.
        """
        t = positions.shape[1]
        if window is None or prefix + t <= window:
            return bias
        keys = torch.arange(prefix, device=positions.device).expand(positions.shape[0], prefix)
        keys = torch.cat([keys, positions], dim=1)  # [b or 1, P+t]
        far = keys[:, None, :] <= positions[:, :, None] - window  # [b or 1, t, P+t]
        if bias is None:  # the fused causal pass: the mask becomes explicit
            bias = self._causal(t, self.embed)
        return bias.masked_fill(far if bias.dim() == 2 else far[:, None], torch.finfo(self.embed.dtype).min)

    def _causal(self, t: int, like: torch.Tensor) -> torch.Tensor:
        blocked = torch.ones(t, t, dtype=torch.bool, device=like.device).triu(1)
        return torch.zeros(t, t, dtype=like.dtype, device=like.device).masked_fill(blocked, torch.finfo(like.dtype).min)

    # ------------------------------------------------------------------------------------------ the passes
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[b, t, V]`` logits of right-padded rows starting at position 0.

        On the real tokens, what ``model(input_ids, mask)`` gives; padded positions hold values no caller reads.
        """
        return self.head(self.hidden(input_ids))

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`logits` before the head: final hidden states ``[b, t, hidden]`` (see :meth:`head`)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self._layers(input_ids, positions, None, None)[0]

    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        """Right-padded prompts ``[U, P]`` from position 0: final hidden states ``[U, P, hidden]``, keys/values."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self._layers(input_ids, positions, None, None)

    def extend(
        self, input_ids: torch.Tensor, past: KV, past_valid: torch.Tensor, positions: torch.Tensor, group: int = 1
    ) -> torch.Tensor:
        """Logits ``[N, C, V]`` of continuation rows ``[N, C]`` after ``past`` (the head on :meth:`extend_hidden`)."""
        return self.head(self.extend_hidden(input_ids, past, past_valid, positions, group))

    def extend_hidden(
        self, input_ids: torch.Tensor, past: KV, past_valid: torch.Tensor, positions: torch.Tensor, group: int = 1
    ) -> torch.Tensor:
        """Final hidden states ``[N, C, hidden]`` of continuation rows ``[N, C]`` after ``past``.

        ``past`` holds one prefix per ``group`` consecutive rows (``[N / group, K, P, D]`` per layer): rows
        ``g*group .. (g+1)*group - 1`` continue prefix ``g``. ``past_valid [N, P]`` is True on the prefix slots a
        row may attend to (its prompt's real tokens); ``positions [N, C]`` the continuation's RoPE positions.
        """
        n, c = input_ids.shape
        low = torch.finfo(self.embed.dtype).min
        prefix = torch.zeros(past_valid.shape, dtype=self.embed.dtype, device=input_ids.device)
        prefix = prefix.masked_fill(~past_valid, low)[:, None, None, :].expand(n, 1, c, -1)
        causal = self._causal(c, self.embed)[None, None].expand(n, 1, c, c)
        return self._layers(input_ids, positions, torch.cat([prefix, causal], dim=-1), past, group)[0]


def _after_prefix(prefix: torch.Tensor, new: torch.Tensor, group: int) -> torch.Tensor:
    """Keys (or values) ``[b, K, P+t, D]``: each row's prefix, then its own ``new [b, K, t, D]``.

    ``prefix [b / group, K, P, D]`` serves ``group`` consecutive rows each. It is broadcast (a stride-0 view)
    into the concatenation, so the backward sums each prefix's ``group`` gradients in one reduction; an
    ``index_select`` to one prefix per row would scatter-add them instead (about 3 % of a default update).
    """
    if group == 1:
        return torch.cat([prefix, new], dim=2)
    u, kv, p, d = prefix.shape
    joined = torch.cat([prefix[:, None].expand(u, group, kv, p, d), new.unflatten(0, (u, group))], dim=3)
    return joined.flatten(0, 1)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of ``attention_mask [b, t]`` is ones then zeros (and starts with a one)."""
    mask = attention_mask.bool()
    return bool(mask[:, 0].all()) and not bool((mask[:, 1:] & ~mask[:, :-1]).any())


@functools.cache
def _compiled_run() -> Any:
    """:meth:`LlamaTrainer._run` through ``torch.compile``, made on first use (one per process).

    Dynamo keeps a graph per kind of pass: with or without a kept prefix, with or without gradient.
    """
    return torch.compile(LlamaTrainer._run, dynamic=True)


def causal_lm_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, lean: bool = True) -> Any:
    """``model(input_ids=..., attention_mask=...).logits``, through :class:`LlamaTrainer` where it applies.

    The lean forward runs when ``lean`` is set, the model qualifies and the rows are right-padded; otherwise the
    model's own forward (left-padded rows, other architectures, hooks, active dropout).
    """
    trainer = LlamaTrainer.build(model) if lean and right_padded(attention_mask) else None
    if trainer is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    return trainer.logits(input_ids)

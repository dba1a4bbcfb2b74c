"""A lean KV-cached forward for Llama-family decoders, used by :func:`lrmgym.policies.sampling.sample_batch`.

Why not ``model.forward`` with a transformers cache: for small models most of a decode step is overhead, not
arithmetic. On the 0.8 M-parameter default model at batch 128, one ``LlamaForCausalLM`` decode step took 16 ms
while its matrix products alone took 3.3 ms (mask building, cache objects, three separate q/k/v products, the
deprecation and kwargs layers). This module runs the same computation with the model's own weights and its
own rotary-embedding module: q/k/v and gate/up fused into one product each, one preallocated key/value buffer
per layer, and a plain boolean mask. Rows that finish are dropped from the buffers, as in the sampler.

Only architectures whose decoder layer is exactly ``RMSNorm -> attention(q,k,v,o, RoPE) -> RMSNorm -> SiLU-gated
MLP`` qualify (``llama``, ``mistral`` without a sliding window, ``qwen2``), with plain ``nn.Linear`` projections
(a LoRA-wrapped model, or one with forward hooks, goes through ``model.forward``). :meth:`LlamaDecoder.build`
returns ``None`` for anything else, and the sampler falls back to the model's own forward.
``tests/policies/test_fastdecode.py`` checks the logits against ``model.forward`` on random models of each
supported type (grouped-query attention and q/k/v biases included).
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LlamaDecoder", "llama_like"]

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
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
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
    """One decoder layer's weights, q/k/v and gate/up concatenated.

    Rebuilt for every batch, so that it follows the weights as training changes them.
    """

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        # The attention scale is folded into the query rows (RoPE is linear, so scaling before it is the same).
        scaling = float(getattr(attn, "scaling", attn.head_dim**-0.5))
        (q_w, q_b), (k_w, k_b), (v_w, v_b), (o_w, o_b), (g_w, _), (u_w, _), (d_w, _) = (
            _linear_weights(m)  # type: ignore[misc]  # build() checked that each is a (LoRA-)linear layer
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        self.qkv_w = torch.cat([q_w * scaling, k_w, v_w])
        biases = [q_b, k_b, v_b]
        self.qkv_b = torch.cat([biases[0] * scaling, *biases[1:]]) if all(b is not None for b in biases) else None
        self.o_w, self.o_b = o_w, o_b
        self.gate_up_w = torch.cat([g_w, u_w])
        self.down_w = d_w


def _rms(norm: Any, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


def _rotary_tables(rotary: Any, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of ``positions [b, t]`` as ``[b, 1, t, D]``, with the sign of rotate-half folded into sin."""
    cos, sin = rotary(x, positions)  # [b, t, D], the model's own RoPE (any scaling type it implements)
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos[:, None], sin[:, None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate-half convention of these architectures, on ``x [b, h, t, D]``.

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = (-x2, x1)``; the sign is folded into ``sin``
    (see :func:`_rotary_tables`), which leaves a roll by half.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


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
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.keys: list[torch.Tensor] = []  # per layer [b, K, L, D]
        self.values: list[torch.Tensor] = []
        self.valid = torch.empty(0, 0, dtype=torch.bool)  # [b, L]: buffer slots a query may attend to
        self.length = 0
        self._turn = 1  # which of the two kept CPU storages _buffers handed out last
        self._kept: list[torch.Tensor] | None = None  # this decoder's pair of reused CPU storages, once it has one

    @classmethod
    def build(cls, model: Any) -> LlamaDecoder | None:
        """A decoder over ``model``'s current weights, or ``None`` if its architecture is not the supported one.

        A peft model is decoded through its base model's modules, with the LoRA layers' effective weights.
        """
        base = llama_like(model)
        return None if base is None else cls(base)

    def _attention_block(
        self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int, masked: torch.Tensor
    ) -> torch.Tensor:
        """One layer on ``x [b, t, hidden]`` whose tokens go to buffer slots ``start .. start+t``.

        ``masked`` is True where a query must not see a key: ``[b, 1, 1, start+t]`` when ``t == 1``, else
        ``[b, 1, t, t]`` (the prompt pass).
        """
        layer, (b, t, _), d, heads, kv = self.layers[i], x.shape, self.head_dim, self.heads, self.kv_heads
        qkv = F.linear(_rms(layer.norm1, x), layer.qkv_w, layer.qkv_b).view(b, t, heads + 2 * kv, d).transpose(1, 2)
        qkv[:, : heads + kv] = _rotate(qkv[:, : heads + kv], cos, sin)  # RoPE on q and k at once
        # Keys and values in separate buffers: a slice [:, :, :end] of a [b, K, L, D] buffer still merges its
        # (b, K) dims into one batch dim, so the products below read it in place (a joint [b, 2K, L, D] buffer
        # made matmul copy the whole cache at every step: 60 % of a decode step).
        self.keys[i][:, :, start : start + t] = qkv[:, heads : heads + kv]
        self.values[i][:, :, start : start + t] = qkv[:, heads + kv :]
        q, keys, values = qkv[:, :heads], self.keys[i][:, :, : start + t], self.values[i][:, :, : start + t]
        if t == 1:  # one query per row: plain matrix products beat SDPA's CPU kernel here (0.5 vs 0.75 ms)
            groups = q.reshape(b, kv, heads // kv, d)  # query heads sharing a KV head
            scores = (groups @ keys.transpose(-1, -2)).masked_fill_(masked, float("-inf"))  # [b, K, H/K, end]
            attn = (torch.softmax(scores, dim=-1) @ values).view(b, heads, 1, d)
        else:
            attn = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=~masked, scale=1.0, enable_gqa=kv != heads
            )  # fmt: skip
        x = x + F.linear(attn.transpose(1, 2).reshape(b, t, heads * d), layer.o_w, layer.o_b)
        gate, up = F.linear(_rms(layer.norm2, x), layer.gate_up_w).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.down_w)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(_rms(self.final_norm, x), self.lm_head_w, self.lm_head_b).float()

    def prefill(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, new: int
    ) -> torch.Tensor:
        """Run left-padded prompts ``[B, T]``, keeping room for ``new`` tokens; last-position logits ``[B, V]``."""
        b, t = input_ids.shape
        x = F.embedding(input_ids, self.embed)
        # Slots are written before they are read, so the buffers need no initialisation.
        self.keys, self.values = self._buffers(x, b, t + new)
        self.valid = torch.zeros(b, t + new, dtype=torch.bool, device=x.device)
        self.valid[:, :t] = attention.bool()
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        # A padding query attends to itself too, so that no row of the mask is empty (an empty row gives NaN,
        # and NaN keys would leak into real rows through 0 * NaN); its output is never used.
        allowed = causal & (self.valid[:, None, :t] | torch.eye(t, dtype=torch.bool, device=x.device))  # [B, t, t]
        cos, sin = _rotary_tables(self.rotary, x, positions)
        for i in range(len(self.layers)):
            x = self._attention_block(i, x, cos, sin, 0, ~allowed[:, None])
        self.length = t
        return self._logits(x[:, -1])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append one token per row (``tokens [b]``, ``positions [b]``); returns next-token logits ``[b, V]``."""
        x = F.embedding(tokens[:, None], self.embed)  # [b, 1, hidden]
        slot = self.length
        self.valid[:, slot] = True
        masked = ~self.valid[:, None, None, : slot + 1]  # [b, 1, 1, slot+1]
        cos, sin = _rotary_tables(self.rotary, x, positions[:, None])
        for i in range(len(self.layers)):
            x = self._attention_block(i, x, cos, sin, slot, masked)
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
        self.valid = self.valid.index_select(0, index)

    def drop(self, order: list[int]) -> None:
        """Keep ``len(order)`` rows in the order of :func:`~lrmgym.policies.sampling.compaction_order`.

        Slot ``j`` keeps row ``j`` or takes a row from beyond the kept prefix, so only those rows are copied, in
        place, and the buffers become views of the prefix. Rebuilding the buffers whenever a row finished took
        25 % of the sampler's time at 32 x 8 samples.
        """
        moved = [j for j, row in enumerate(order) if row != j]
        if moved:
            dst = torch.tensor(moved, dtype=torch.long, device=self.valid.device)
            src = torch.tensor([order[j] for j in moved], dtype=torch.long, device=self.valid.device)
            for buffer in (*self.keys, *self.values, self.valid):
                buffer.index_copy_(0, dst, buffer.index_select(0, src))
        n = len(order)
        self.keys = [buffer[:n] for buffer in self.keys]
        self.values = [buffer[:n] for buffer in self.values]
        self.valid = self.valid[:n]

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

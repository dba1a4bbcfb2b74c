"""Matmul FLOPs of Llama-family transformers: the forward, backward and KV-cached generation of given sequences.

Counted from the config (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, head_dim,
num_hidden_layers, vocab_size), two FLOPs per multiply-add, matmuls only (norms, RoPE, softmax, activations,
residual adds and the embedding lookup are left out: on these models they are a few per cent of the total and
no peak rate applies to them). Per token and layer: q and o projections ``2 h (H d)`` each, k and v ``2 h (K d)``
each, gate/up/down ``3 x 2 h I``; attention ``2 x 2 (H d)`` per (query, key) pair (scores ``q k^T`` and the
weighted sum over ``v``); once per token whose logits are computed, the lm_head ``2 h V``. Tied embeddings
change nothing: the lm_head is still an ``h x V`` matmul and the input embedding is a lookup.

**Attention pairs.** ``attention="dense"`` (the default) counts what the kernels compute: every query of a
forward call against every key in its cache and its own chunk, masked or not, so a prefill of ``T`` tokens costs
``T x T`` pairs. That is what SDPA's math and CPU kernels do with the explicit mask transformers passes for padded
batches (they multiply, then mask), and what ``torch.utils.flop_counter`` counts for SDPA.
``attention="causal"`` counts only the unmasked pairs, the useful work (``T (T + 1) / 2`` for a prefill:
query ``i`` sees keys ``0..i``). A decode step's single query sees its whole prefix either way.

**Backward = 2 x forward.** Each matmul ``Y = X W`` needs ``dX = dY W^T`` and ``dW = X^T dY`` in the backward,
each as large as the forward product (likewise ``dQ``/``dK`` and ``dP``/``dV`` in attention). This counts the
input gradient of the first layer too, which a trainer computes whenever the embedding is trained.

**Generation.** A completion of ``n`` tokens after a prompt of ``P``: one prefill of the prompt (logits of its
last position only, which give the first new token), then ``n - 1`` decode steps, the ``j``-th feeding token
``j`` at position ``P + j - 1`` against ``P + j`` keys (the last token is sampled but never fed). Each
completion pays its own prefill (a sampler that prefills a group's shared prompt once does less).

**Model FLOPs, not executed FLOPs.** These counts are the work of a plain trainer and sampler: every row runs its
own prompt, padding is left out. lrmgym's update (``shared_prefix``) and sampler run each group's prompt once, so
they execute fewer: on the default run about 61 % of the count in the update and 56 % in generation, measured with
``torch.utils.flop_counter`` by ``benchmarks/roofline.py``. The rates of :func:`achieved_rates` are therefore
model-FLOP rates (the numerator of MFU): they credit the work prefix sharing skips, and can exceed what the
hardware computed. Judge hardware efficiency on executed FLOPs: the update logs them too
(``compute/executed_flops_*``, ``perf/update_executed_gflops_s``); for generation ``benchmarks/roofline.py``
measures the share.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AttentionCount",
    "LlamaShape",
    "achieved_rates",
    "backward_flops",
    "chunk_flops",
    "forward_flops",
    "generate_flops",
    "trajectory_generate_flops",
]

AttentionCount = Literal["dense", "causal"]

# model_type values whose decoder is Llama's (q/k/v/o, SwiGLU gate/up/down, full attention, an lm_head).
_LLAMA_FAMILY = frozenset({"llama", "qwen2", "qwen3"})


@dataclass(frozen=True)
class LlamaShape:
    """The matmul shapes of a Llama-family decoder.

    Attributes:
        hidden: ``hidden_size`` (h).
        intermediate: ``intermediate_size`` of the gated MLP (I).
        heads: Query heads (H).
        kv_heads: Key/value heads (K; K < H is grouped-query attention).
        head_dim: Size of one head (d; ``hidden / heads`` unless the config says otherwise).
        layers: Decoder layers.
        vocab: Vocabulary size (V, the lm_head's outputs).
    """

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> LlamaShape | None:
        """The shape of a transformers config, or None for a model this module does not count.

        Args:
            config: A ``PretrainedConfig`` (``model.config``). Llama, Qwen2 and Qwen3 configs without sliding-window
                attention are understood; anything else (another ``model_type``, a missing field) gives None.
        """
        if getattr(config, "model_type", None) not in _LLAMA_FAMILY or getattr(config, "use_sliding_window", False):
            return None
        try:
            hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
            kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
            return cls(
                hidden=hidden, intermediate=int(config.intermediate_size), heads=heads, kv_heads=kv_heads,
                head_dim=head_dim, layers=int(config.num_hidden_layers), vocab=int(config.vocab_size),
            )  # fmt: skip
        except (AttributeError, TypeError, ValueError):
            return None

    @classmethod
    def of_model(cls, model: Any) -> LlamaShape | None:
        """:meth:`from_config` of ``model.config`` (None when the model has no config)."""
        config = getattr(model, "config", None)
        return cls.from_config(config) if config is not None else None

    @property
    def token_flops(self) -> int:
        """Forward FLOPs of one token through the projections and MLPs of all layers (no attention, no lm_head)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 2 * h * (2 * q + 2 * kv) + 3 * 2 * h * self.intermediate
        return self.layers * per_layer


def chunk_flops(
    shape: LlamaShape, tokens: int, cached: int = 0, logits: int | None = None, attention: AttentionCount = "dense"
) -> int:
    """Forward FLOPs of one forward call on ``tokens`` new tokens of one sequence after ``cached`` cached ones.

    Args:
        shape: The model.
        tokens: Tokens fed in this call (t).
        cached: Tokens already in the KV cache before them (c).
        logits: Positions whose logits are computed (default: all ``tokens``; a sampler's prefill: 1).
        attention: ``"dense"``: ``t (c + t)`` query-key pairs; ``"causal"``: ``t c + t (t + 1) / 2``.

    Returns:
        The matmul FLOPs of the call.
    """
    if tokens <= 0:
        return 0
    pairs = tokens * (cached + tokens) if attention == "dense" else tokens * cached + tokens * (tokens + 1) // 2
    attn = shape.layers * 2 * 2 * shape.heads * shape.head_dim * pairs
    head = 2 * shape.hidden * shape.vocab * (tokens if logits is None else logits)
    return tokens * shape.token_flops + attn + head


def forward_flops(shape: LlamaShape, lengths: Iterable[int], attention: AttentionCount = "dense") -> int:
    """Forward FLOPs of a batch of sequences of these ``lengths`` (padding excluded), logits at every position."""
    return sum(chunk_flops(shape, int(n), attention=attention) for n in lengths)


def backward_flops(shape: LlamaShape, lengths: Iterable[int], attention: AttentionCount = "dense") -> int:
    """Backward FLOPs of the same batch: twice the forward (input and weight gradients of every matmul)."""
    return 2 * forward_flops(shape, lengths, attention)


def generate_flops(shape: LlamaShape, prompt_len: int, new_tokens: int, attention: AttentionCount = "dense") -> int:
    """FLOPs of sampling ``new_tokens`` after a ``prompt_len``-token prompt with a KV cache (module docstring).

    Args:
        shape: The model.
        prompt_len: Tokens of the prompt (P), prefilled once with logits at its last position.
        new_tokens: Tokens generated (n >= 0); tokens 1 .. n-1 are fed back one decode step each.
        attention: How the prefill's pairs are counted (decode steps are the same either way).

    Returns:
        The matmul FLOPs; 0 when nothing is generated.
    """
    if new_tokens <= 0:
        return 0
    prefill = chunk_flops(shape, prompt_len, logits=1, attention=attention)
    steps = new_tokens - 1
    # Step j (1..n-1) feeds one token after P + j - 1 cached ones: P + j keys; summed, (n-1) P + n (n-1) / 2 pairs.
    pairs = steps * prompt_len + new_tokens * steps // 2
    decode = steps * (shape.token_flops + 2 * shape.hidden * shape.vocab)
    decode += shape.layers * 2 * 2 * shape.heads * shape.head_dim * pairs
    return prefill + decode


def trajectory_generate_flops(shape: LlamaShape, policy_mask: Iterable[bool]) -> int:
    """Sampling FLOPs of one trajectory: each run of policy tokens is a generation after the tokens before it.

    Args:
        shape: The model.
        policy_mask: Per token of the trajectory, whether the policy sampled it
            (:class:`~lrmgym.learners.engine.rollout.TokenizedTrajectory`'s ``policy_mask``). Each policy turn counts a
            prefill of its whole context, as a sampler that keeps no cache between turns computes it.

    Returns:
        The matmul FLOPs of :func:`generate_flops` summed over the policy turns.
    """
    total, position, run = 0, 0, 0
    for sampled in policy_mask:
        if sampled:
            run += 1
        elif run:
            total += generate_flops(shape, position - run, run)
            run = 0
        position += 1
    return total + (generate_flops(shape, position - run, run) if run else 0)


def achieved_rates(metrics: dict[str, Any]) -> dict[str, float]:
    """The achieved GFLOP/s of a step's metrics line, where its learner counted FLOPs.

    Args:
        metrics: A ``metrics.jsonl`` line: ``compute/flops_forward``, ``compute/flops_backward`` and
            ``compute/flops_generate`` with ``time/train_s`` (the update) and ``time/step_s`` (the whole step).

    Returns:
        Model-FLOP rates (module docstring: prefix sharing executes fewer FLOPs than counted):
        ``perf/update_gflops_s`` (forward + backward FLOPs of the update / its seconds) and
        ``perf/step_gflops_s`` (those plus the sampling's FLOPs / the step's seconds), each where its inputs are
        present and its time positive; empty for a learner that counts no FLOPs. Where the update also logs
        ``compute/executed_flops_*`` (what its kernels ran,
        :func:`lrmgym.learners.engine.shared_prefix.executed_flops`),
        ``perf/update_executed_gflops_s``, the hardware rate of the update.
    """
    update = [metrics.get(k) for k in ("compute/flops_forward", "compute/flops_backward")]
    if any(v is None for v in update):
        return {}
    rates = {}
    train_s, step_s = metrics.get("time/train_s"), metrics.get("time/step_s")
    generate = metrics.get("compute/flops_generate")
    if train_s:
        rates["perf/update_gflops_s"] = sum(update) / train_s / 1e9
        executed = [metrics.get(k) for k in ("compute/executed_flops_forward", "compute/executed_flops_backward")]
        if all(v is not None for v in executed):
            rates["perf/update_executed_gflops_s"] = sum(executed) / train_s / 1e9
    if step_s and generate is not None:
        rates["perf/step_gflops_s"] = (sum(update) + generate) / step_s / 1e9
    return rates

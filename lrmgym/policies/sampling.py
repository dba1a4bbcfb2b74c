"""A batched autoregressive sampler with a KV cache for any transformers causal LM.

Why our own loop instead of ``model.generate``: the learner needs, for every sampled token, the log-probability
under the distribution it was *actually* drawn from, and ``generate`` only returns processed scores for the
whole vocabulary at every step (``output_scores``), which costs a ``[B, V]`` copy per step and then a gather.
This loop also drops finished rows from the batch and the cache as soon as they end, so a group with a few
long answers does not keep paying for the short ones. On the tiny model it is faster than ``generate``
(see ``benchmarks/sampler_vs_generate.py``).

Log-prob convention (what :attr:`lrmgym.core.Completion.logprobs` holds for the ``hf`` and ``tiny`` policies):
    With ``temperature > 0`` each value is ``log q(token)``, where ``q`` is the distribution sampled from:
    ``softmax(logits / temperature)``, then restricted to the top-k tokens (if ``top_k > 0``) and to the
    nucleus (if ``top_p < 1``), then renormalised. At ``temperature == 1, top_k == 0, top_p == 1`` this is
    exactly the model's log-probability ``log_softmax(logits)``. With ``temperature == 0`` (greedy) the value
    is the model's untempered, unfiltered ``log_softmax(logits)`` at the chosen token (the sampling
    distribution is a point mass and would give 0 everywhere).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from lrmgym.policies.base import SamplingParams
from lrmgym.policies.fastdecode import LlamaDecoder

__all__ = [
    "BatchForward", "SampledSequence", "compaction_order", "draw", "filter_logits", "sample_batch", "sequence_logprobs",
]  # fmt: skip


@dataclass
class SampledSequence:
    """One sampled continuation: token ids, the sampler's log-probs, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop string) or "length"


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to raw logits; removed tokens get ``-inf``.

    Args:
        logits: ``[B, V]`` raw next-token logits (float32).
        sampling: The sampling parameters; ``temperature`` must be > 0 here.

    Returns:
        ``[B, V]`` processed logits whose softmax is the sampling distribution.
    """
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        # Probability mass strictly before each token; a token is kept while that mass is < top_p,
        # so the most likely token is always kept.
        before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = before >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(logq: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logq [b, V]`` (log-probabilities, ``-inf`` for excluded tokens), drawn from ``exp(logq)``.

    By inverting the cumulative distribution: one uniform ``u`` per row, and the first token whose cumulative
    probability exceeds ``u`` times the row's total. Why not ``torch.multinomial``: on a CPU, with a generator,
    it took 140-160 us a call for 32 rows of 103 tokens (an exponential draw per vocabulary entry), about 5 % of
    the tiny model's decode step; this took 80 (60 %). The running sums are in float64, so that a large
    vocabulary's rounding does not shift the boundaries. A token of probability 0 is never drawn: its interval
    is empty, and ``u * total`` is kept below the total. A row that is not finite raises ``ValueError``, as
    ``torch.multinomial`` refused it.
    """
    cdf = torch.cumsum(logq.exp(), -1, dtype=torch.float64)  # [b, V]
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):  # NaN would fall past the last token, and draw a token id of V
        rows = torch.nonzero(~torch.isfinite(total[:, 0]))[:, 0].tolist()
        raise ValueError(
            f"cannot sample: the next-token probabilities of rows {rows[:8]} are NaN or infinite (the model's logits "
            "are not finite, so its weights have diverged); lower the learning rate, or resume from an earlier "
            "checkpoint"
        )
    u = torch.rand(total.shape, generator=generator, dtype=cdf.dtype, device=cdf.device)
    target = torch.minimum(u.mul_(total), torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def _forward_kwargs(model: torch.nn.Module) -> tuple[str, dict]:
    """The KV-cache argument name of ``model.forward`` (``cache`` in recent transformers) and extra kwargs."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps forward(**kwargs)
    params = inspect.signature(base.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    return ("cache" if "cache" in params else "past_key_values"), extra


def _output_cache(out: object) -> object:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


class BatchForward:
    """Next-token logits for a shrinking batch.

    Through the lean :class:`~lrmgym.policies.fastdecode.LlamaDecoder` when the model qualifies, else through
    ``model.forward`` with a transformers KV cache.
    """

    def __init__(
        self, model: torch.nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor,
        new: int,
    ) -> None:  # fmt: skip
        self.model, self.input_ids, self.attention, self.positions = model, input_ids, attention, positions
        self.new = new
        self.fast = LlamaDecoder.build(model)
        self.cache: object = None
        self.cache_arg, self.extra = ("", {}) if self.fast is not None else _forward_kwargs(model)

    def first(self) -> torch.Tensor:
        """Logits ``[B, V]`` after the prompts."""
        if self.fast is not None:
            return self.fast.prefill(self.input_ids, self.attention, self.positions, self.new)
        return self._model(self.input_ids, self.positions)

    def next(self, token: torch.Tensor) -> torch.Tensor:
        """Append ``token [b]`` to each row; logits ``[b, V]``."""
        self.positions = self.positions[:, -1:] + 1
        if self.fast is not None:
            return self.fast.step(token, self.positions[:, 0])
        self.attention = torch.cat([self.attention, torch.ones_like(token[:, None])], dim=-1)
        return self._model(token[:, None], self.positions)

    def select(self, index: torch.Tensor) -> None:
        """Keep (or repeat) the rows in ``index``."""
        self.positions, self.attention = self.positions[index], self.attention[index]
        if self.fast is not None:
            self.fast.select(index)
        else:
            self.cache.batch_select_indices(index)

    def drop(self, order: list[int]) -> torch.Tensor:
        """Keep the rows of :func:`compaction_order`'s ``order``; returns it as an index for the caller's tensors."""
        index = torch.tensor(order, dtype=torch.long, device=self.positions.device)
        if self.fast is None:
            self.select(index)
            return index
        self.positions, self.attention = self.positions[index], self.attention[index]
        self.fast.drop(order)
        return index

    def _model(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=self.attention, position_ids=positions, use_cache=True,
                         **{self.cache_arg: self.cache}, **self.extra)  # fmt: skip
        self.cache = _output_cache(out)
        return out.logits[:, -1, :].float()


@torch.inference_mode()
def sample_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    stop_check: Callable[[list[int]], bool] | None = None,
) -> list[SampledSequence]:
    """Sample one continuation per prompt, all prompts in one left-padded batch with a KV cache.

    Args:
        model: A transformers causal LM (``forward(input_ids, attention_mask, position_ids, cache)``).
        prompts: Token ids of each prompt (repeat a prompt to draw several samples of it).
        sampling: Temperature, top-k, top-p and the token budget (``stop``/``seed`` are handled by the caller
            through ``stop_check`` and ``generator``).
        eos_ids: Token ids that end a sequence; the EOS token is kept in ``token_ids``.
        pad_id: Token id used for left padding (masked out, never attended to).
        generator: The random generator of the draws (:func:`draw`).
        stop_check: Called with a row's generated ids after each new token; ``True`` ends the row ("stop").

    Returns:
        One :class:`SampledSequence` per prompt, in order.
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    # Each distinct prompt is run once and its cache copied to the rows that share it (GRPO samples every
    # prompt G times, so this divides the prompt pass by G).
    distinct: dict[tuple[int, ...], int] = {}
    source = [distinct.setdefault(tuple(ids), len(distinct)) for ids in prompts]  # row -> distinct prompt
    width = max(len(p) for p in distinct)
    input_ids = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(distinct), width), dtype=torch.long)
    for row, ids in enumerate(distinct):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [U, T]
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    forward = BatchForward(model, input_ids, attention, positions, sampling.max_new_tokens)

    out_ids: list[list[int]] = [[] for _ in range(batch)]
    out_lp: list[list[float]] = [[] for _ in range(batch)]
    reasons = ["length"] * batch
    alive = list(range(batch))  # original row index of each row still in the batch
    logits = forward.first()  # [U, V]
    if len(distinct) < batch or source != sorted(source):
        expand = torch.tensor(source, dtype=torch.long, device=device)
        forward.select(expand)
        logits = logits[expand]  # [B, V]
    for _ in range(sampling.max_new_tokens):
        if sampling.temperature == 0:
            token = logits.argmax(-1)  # [b]
            logp = torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
        else:
            logq = torch.log_softmax(filter_logits(logits, sampling), -1)  # [b, V]
            token = draw(logq, generator)
            logp = logq.gather(-1, token[:, None])[:, 0]
        done = (token[:, None] == eos).any(-1)
        tokens, logps, dones = token.tolist(), logp.tolist(), done.tolist()
        keep: list[int] = []
        for i, row in enumerate(alive):
            out_ids[row].append(tokens[i])
            out_lp[row].append(logps[i])
            if dones[i] or (stop_check is not None and stop_check(out_ids[row])):
                reasons[row] = "stop"
            else:
                keep.append(i)
        if not keep or len(out_ids[alive[keep[0]]]) >= sampling.max_new_tokens:
            break
        if len(keep) < len(alive):
            order = compaction_order(keep)
            token = token[forward.drop(order)]
            alive = [alive[i] for i in order]
        logits = forward.next(token)
    return [SampledSequence(out_ids[r], out_lp[r], reasons[r]) for r in range(batch)]


def compaction_order(keep: Sequence[int]) -> list[int]:
    """The rows to keep (``keep``, ascending) in an order that moves the fewest of them.

    Rows already within the first ``len(keep)`` slots stay where they are; each slot there whose row finished
    takes a kept row from beyond it. So dropping ``f`` finished rows moves at most ``f`` rows of the KV cache,
    where keeping the original order moves every row after the first finished one.
    """
    n = len(keep)
    kept = set(keep)
    holes = [slot for slot in range(n) if slot not in kept]
    movers = [row for row in keep if row >= n]  # as many as there are holes
    order = list(range(n))
    for slot, row in zip(holes, movers, strict=True):
        order[slot] = row
    return order


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs of ``completion_ids`` after ``prompt_ids`` under ``softmax(logits / temperature)``, one forward.

    Args:
        model: A transformers causal LM.
        prompt_ids: The prompt's token ids.
        completion_ids: The continuation's token ids (at least one).
        temperature: Divides the logits (1.0 = the model's own distribution).

    Returns:
        ``[len(completion_ids)]`` float32 tensor (with grad if called under grad mode).
    """
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long, device=device)  # [1, T]
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature  # [C, V]
    target = ids[0, len(prompt_ids) :]
    return torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]

"""Training forward passes that compute each group's shared prompt once.

A GRPO step trains on G trajectories per task, and all G start with the same prompt tokens. A plain forward
pass runs the prompt G times; here the distinct prompts of a micro-batch run once, with the KV cache kept
(and differentiable), and the rest of the trajectories (policy and env turns) runs on top of it: where the
micro-batch holds whole groups in order (G rows of one prompt, then G of the next), each prompt's keys and values
are broadcast over its rows inside the attention's concatenation; otherwise they are indexed out to one copy
per row. Gradients reaching the prompt's keys and values from the G rows add up in the backward pass of that
broadcast (a sum) or index (a scatter-add), so the result equals the plain pass up to float rounding. On the
tiny default model prompts are about half of the tokens, and the update gets ~40 % cheaper; the broadcast takes
another 3 % off a default update against the index (A/B on its own batches, one thread).

Written here rather than taken from a library: TRL and OpenRLHF run the full sequences (TRL's
``shuffle_sequence_dict``/padding-free path packs but does not share prefixes), and transformers offers the
pieces (a cache whose ``update`` concatenates and is differentiable, ``reorder_cache``) but not the loop.

Layout: rows are right-padded (prompts of a micro-batch may differ in length), so a row's continuation sits at
cache positions ``P..P+C-1`` after its padded prompt; the attention mask hides the padding holes and
``position_ids`` restart at each row's own prompt length, so RoPE sees the same positions as the plain pass.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Any

import torch

from lrmgym.learners.algorithms.logprobs import token_entropy, token_logprobs
from lrmgym.learners.engine.flops import LlamaShape, chunk_flops
from lrmgym.policies.fasttrain import LlamaTrainer, chunked_model_logprobs, right_padded
from lrmgym.policies.sampling import _forward_kwargs, _output_cache

__all__ = ["executed_flops", "forward_logprobs", "prompt_groups", "sharing"]


def prompt_groups(input_ids: torch.Tensor, prompt_len: torch.Tensor) -> list[int]:
    """For each row, the index of its distinct prompt (first-seen order); rows with equal prompt tokens share."""
    seen: dict[tuple[int, ...], int] = {}
    lengths = prompt_len.tolist()
    return [seen.setdefault(tuple(input_ids[i, : lengths[i]].tolist()), len(seen)) for i in range(len(lengths))]


def _select_rows(cache: Any, index: torch.Tensor) -> Any:
    """The cache with its batch rows taken at ``index`` (differentiable: an ``index_select``)."""
    if hasattr(cache, "reorder_cache"):  # transformers Cache objects (DynamicCache)
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)  # legacy tuple format


def _equal_runs(owner: list[int]) -> int:
    """The rows per prompt where every prompt has the same number of consecutive rows, else 1.

    ``G`` when ``owner`` is ``G`` rows of prompt 0, then ``G`` of prompt 1, ... (a GRPO micro-batch of whole
    groups); 1 otherwise (then each row gets its own copy of its prompt's keys and values).
    """
    group = len(owner) // len(set(owner))
    return group if owner == [i // group for i in range(len(owner))] else 1


def _worth_sharing(owner: list[int], prompt_len: torch.Tensor, lengths: torch.Tensor, width: int) -> bool:
    """Whether two passes (distinct prompts, then continuations) cost at most 80 % of one plain pass.

    Counted in padded tokens. Each pass has a fixed cost too, so sharing a 4-token prompt in front of 32 sampled
    tokens loses.
    """
    distinct, after = len(set(owner)), int((lengths.cpu() - prompt_len).max())
    if distinct == len(owner) or after < 1:
        return False
    return distinct * int(prompt_len.max()) + len(owner) * after <= 0.8 * len(owner) * width


def _sliding_window(model: Any) -> bool:
    """Whether any layer of ``model`` attends within a sliding window (Mistral; Qwen2/3, Gemma2/3 sliding layers)."""
    config = getattr(model, "config", None)
    if not getattr(config, "sliding_window", None):
        return False
    types = getattr(config, "layer_types", None)
    if types:
        return any(t == "sliding_attention" for t in types)
    return bool(getattr(config, "use_sliding_window", True))


def sharing(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: torch.Tensor | None) -> list[int] | None:
    """Each row's distinct prompt where :func:`forward_logprobs` runs prompts once; None where it runs plain.

    Pass the result to :func:`forward_logprobs` and :func:`executed_flops` (``owner=``) to decide once per pass.
    """
    if prompt_len is None or int(prompt_len.min()) < 1:
        return None
    owner = prompt_groups(input_ids, prompt_len)
    return owner if _worth_sharing(owner, prompt_len, attention_mask.sum(-1), input_ids.shape[1]) else None


def executed_flops(
    shape: LlamaShape,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: torch.Tensor | None,
    owner: list[int] | None,
) -> int:
    """Forward matmul FLOPs that :func:`forward_logprobs` runs on these rows through the lean forward.

    What the kernels compute, padding included: a plain pass of ``[N, T]`` rows, or the distinct prompts
    (``[U, P]``, logits at their last position) and then ``[N, C]`` continuations after a ``P``-slot cache. The
    counts of :mod:`lrmgym.learners.engine.flops` (``compute/flops_*``) are a plain trainer's instead: every row its own
    prompt, no padding. Exact for the lean forward (``tests/learners/test_flops.py`` checks it against torch's
    FlopCounterMode); through ``model.forward`` (a model the lean forward does not take) an estimate, since its
    attention kernels and where it computes logits differ (4 % on the test's tiny model). Backward: twice this.
    ``owner``: :func:`sharing`'s result for these rows, the decision the pass took.
    """
    n, width = input_ids.shape
    if owner is None:
        return n * chunk_flops(shape, width)
    assert prompt_len is not None  # sharing() returns None without it
    width_p = int(prompt_len.max())
    width_c = int((attention_mask.sum(-1) - prompt_len.to(attention_mask.device)).max())
    return len(set(owner)) * chunk_flops(shape, width_p, logits=1) + n * chunk_flops(shape, width_c, cached=width_p)


def forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: torch.Tensor | None,
    pad_id: int,
    entropy: bool = False,
    temperature: float = 1.0,
    lean: bool = True,
    compiled: bool = False,
    owner: list[int] | None | EllipsisType = ...,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next-token log-probs of right-padded rows, sharing the forward pass of equal prompts.

    Args:
        model: A transformers causal LM (anything whose forward takes ``past_key_values`` and ``position_ids``).
        input_ids: ``[N, T]`` right-padded token rows.
        attention_mask: ``[N, T]`` 1 on real tokens.
        prompt_len: ``[N]`` tokens of each row's prompt (before its first policy token); ``None`` or a zero
            entry runs the plain forward pass, as does a micro-batch where sharing saves under 20 % of the
            padded tokens (no prompt shared by two rows, or prompts short next to the completions).
        pad_id: Token used for padding.
        entropy: Also return the (detached) entropy of each next-token distribution.
        temperature: Score under ``softmax(logits / temperature)``, the distribution a sampler at that
            temperature drew from (so the importance ratio compares like with like); 1 is the model's own.
        lean: Run the passes through :class:`~lrmgym.policies.fasttrain.LlamaTrainer` where the model qualifies
            (the same function and gradients, less overhead); otherwise, or when False, through ``model.forward``.
            The lean forward also bounds memory at real-model sizes: SDPA attention from
            :data:`~lrmgym.policies.fasttrain.SDPA_MIN_KEYS` positions on, and log-probs computed in chunks
            (:func:`~lrmgym.policies.fasttrain.head_logprobs`) where the logits exceed one
            :data:`~lrmgym.policies.fasttrain.LOGIT_CHUNK`.
        compiled: Run that lean forward's layers through ``torch.compile`` (``learner.compile``).
        owner: :func:`sharing`'s result for these rows, when the caller has it; ``...`` (default): decided here.

    Returns:
        ``(logp [N, T-1], entropy [N, T-1] or None)`` laid out like
        :func:`~lrmgym.learners.algorithms.logprobs.token_logprobs`: entry ``t`` scores token ``t + 1``. Entries
        inside a row's prompt (targets ``1 .. prompt_len - 1``) are 0 here; only targets from the first policy token on
        are computed.
    """
    n, width = input_ids.shape
    trainer = LlamaTrainer.build(model, compiled) if lean and right_padded(attention_mask) else None
    if owner is ...:
        owner = sharing(input_ids, attention_mask, prompt_len)
    if trainer is None and _sliding_window(model):
        owner = None  # model.forward places a window by cache slots, and a padded shared prompt shifts them
    if owner is None:
        if trainer is not None and not trainer.fits_whole(input_ids.numel()):  # large logits: chunk by chunk
            return trainer.logprobs(trainer.hidden(input_ids)[:, :-1], input_ids[:, 1:], temperature, entropy)
        if trainer is None:  # model.forward's decoder, the head in chunks (where the logits are large)
            chunked = chunked_model_logprobs(model, input_ids, attention_mask, temperature, entropy)
            if chunked is not None:
                return chunked
        if trainer is not None:
            logits = trainer.logits(input_ids)
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        if temperature != 1.0:
            logits = logits / temperature
        return token_logprobs(logits, input_ids), token_entropy(logits.detach()) if entropy else None
    device = input_ids.device
    plen = prompt_len.to(device)
    idx = torch.tensor(owner, device=device)
    first_row: dict[int, int] = {}  # prompt -> its first row; prompts are numbered in first-seen order
    for row, prompt in enumerate(owner):
        first_row.setdefault(prompt, row)
    rows_u = torch.tensor(list(first_row.values()), device=device)
    plen_u = plen[rows_u]
    width_p = int(plen_u.max())
    cols_p = torch.arange(width_p, device=device)
    pre_mask = (cols_p[None] < plen_u[:, None]).long()  # [U, P]
    prompts = torch.where(pre_mask.bool(), input_ids[rows_u, :width_p], pad_id)  # [U, P], right-padded
    cont_len = attention_mask.sum(-1) - plen  # [N]
    width_c = int(cont_len.max())
    cols_c = torch.arange(width_c, device=device)
    cont_mask = (cols_c[None] < cont_len[:, None]).long()  # [N, C]
    gather_cols = (plen[:, None] + cols_c[None]).clamp(max=width - 1)
    cont = torch.where(cont_mask.bool(), input_ids.gather(1, gather_cols), pad_id)  # [N, C], right-padded
    positions = plen[:, None] + cols_c[None]
    last = torch.arange(len(first_row), device=device), plen_u - 1
    # Scatter into the plain layout: continuation token j of row i is target column plen_i - 1 + j. Padding
    # goes to one spare column (width - 1), dropped at the end.
    target_cols = torch.where(cont_mask.bool(), plen[:, None] - 1 + cols_c[None], width - 1)

    def spread(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(n, width).scatter(1, target_cols, values * cont_mask)[:, : width - 1]

    if trainer is not None:
        hidden, kv = trainer.prefill(prompts)
        group = _equal_runs(owner)
        if group == 1:  # one prefix per row
            kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in kv]
        if not trainer.fits_whole(n * width_c):  # large logits: chunk by chunk, in hidden space
            hidden_c = trainer.extend_hidden(cont, kv, pre_mask.bool()[idx], positions, group)
            joined = torch.cat([hidden[last][idx].unsqueeze(1), hidden_c[:, :-1]], dim=1)  # [N, C, hidden]
            lp, ent = trainer.logprobs(joined, cont, temperature, entropy)
            return spread(lp), (spread(ent) if ent is not None else None)
        first = trainer.head(hidden[last])  # [U, V]: predicts policy token 1
        logits_c = trainer.extend(cont, kv, pre_mask.bool()[idx], positions, group)
    else:
        out = model(input_ids=prompts, attention_mask=pre_mask, use_cache=True)
        first = out.logits[last]  # [U, V]: predicts policy token 1
        cache = _select_rows(_output_cache(out), idx)
        cache_arg = _forward_kwargs(model)[0]  # "cache" in recent transformers, "past_key_values" before
        logits_c = model(
            input_ids=cont, attention_mask=torch.cat([pre_mask[idx], cont_mask], dim=1),
            position_ids=positions, use_cache=True, **{cache_arg: cache},
        ).logits  # fmt: skip
    # Position j of `scores` predicts continuation token j: from the prompt's last position for j = 0.
    scores = torch.cat([first[idx].unsqueeze(1), logits_c[:, :-1]], dim=1).float()  # [N, C, V]
    if temperature != 1.0:
        scores = scores / temperature
    lp = torch.gather(scores, -1, cont.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, dim=-1)  # [N, C]
    ent = None
    if entropy:
        logp_all = torch.log_softmax(scores.detach(), dim=-1)
        ent = spread(-(logp_all.exp() * logp_all).sum(-1))
    return spread(lp), ent

"""Shared-prefix training passes give the plain pass's log-probs and gradients."""

from __future__ import annotations

import pytest
import torch
import transformers

from lrmgym.learners.algorithms.logprobs import token_entropy, token_logprobs
from lrmgym.learners.engine.rollout import TokenizedTrajectory, collate
from lrmgym.learners.engine.shared_prefix import _equal_runs, forward_logprobs, prompt_groups, sharing

PAD = 0
COMMON = {
    "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 64,
}  # fmt: skip


def _model(kind: str, **extra) -> torch.nn.Module:
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[kind]
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config_cls(**COMMON, **extra)).train()


def _traj(prompt: list[int], turns: list[tuple[list[int], bool]]) -> TokenizedTrajectory:
    ids, mask = list(prompt), [False] * len(prompt)
    for toks, policy in turns:
        ids += toks
        mask += [policy] * len(toks)
    return TokenizedTrajectory(ids=ids, policy_mask=mask, sampler_logprobs=[0.0] * len(ids))


def _batch():
    """Three groups with prompts of different lengths, ragged completions, one multi-turn row (env tokens)."""
    g = torch.Generator().manual_seed(1)

    def toks(k: int) -> list[int]:
        return torch.randint(3, 40, (k,), generator=g).tolist()

    p1, p2, p3 = toks(5), toks(9), toks(2)
    seqs = [
        _traj(p1, [(toks(4), True)]),
        _traj(p1, [(toks(7), True)]),
        _traj(p1, [(toks(3), True), (toks(3), False), (toks(2), True)]),  # policy, env feedback, policy
        _traj(p2, [(toks(1), True)]),
        _traj(p2, [(toks(6), True)]),
        _traj(p3, [(toks(8), True)]),
        _traj(p3, [(toks(2), True)]),
    ]
    return collate(seqs, [1.0] * len(seqs), PAD)


def _plain(model, batch):
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits, batch.input_ids), token_entropy(logits.detach())


def test_prompt_groups_match_equal_prompts():
    batch = _batch()
    assert batch.prompt_len.tolist() == [5, 5, 5, 9, 9, 2, 2]
    assert prompt_groups(batch.input_ids, batch.prompt_len) == [0, 0, 0, 1, 1, 2, 2]


def test_equal_runs_finds_whole_groups_in_order():
    assert _equal_runs([0, 0, 1, 1, 2, 2]) == 2
    assert _equal_runs([0, 0, 0, 1, 1, 1]) == 3
    assert _equal_runs([0, 0, 0, 1, 1, 2, 2]) == 1  # unequal groups (the _batch() layout)
    assert _equal_runs([0, 1, 0, 1]) == 1  # interleaved
    assert _equal_runs([0, 0, 1, 1, 1, 1]) == 1  # 6 rows, 2 prompts, but not 3 + 3


# Rows 0, 1 | 3, 4 of _batch(): two prompts of two rows each, so the continuation pass broadcasts each prompt's
# keys and values over its group (_equal_runs == 2) instead of copying them per row.
@pytest.mark.parametrize("rows", [None, [0, 1, 3, 4]], ids=["ragged-groups", "equal-groups"])
@pytest.mark.parametrize(
    "kind, extra",
    [
        ("llama", {}),
        ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
        ("qwen2", {"num_key_value_heads": 2}),
    ],
)
def test_logprobs_entropy_and_gradients_match_the_plain_pass(kind, extra, rows):
    model = _model(kind, **extra)
    batch = _batch() if rows is None else _batch().select(rows)
    owner = sharing(batch.input_ids, batch.attention_mask, batch.prompt_len)
    assert owner is not None and _equal_runs(owner) == (1 if rows is None else 2)
    mask = batch.loss_mask.float()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2))

    def grads(logp):
        model.zero_grad()
        (logp * mask * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain_lp, plain_ent = _plain(model, batch)
    plain_grads = grads(plain_lp)
    shared_lp, shared_ent = forward_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.prompt_len, PAD, entropy=True
    )
    shared_grads = grads(shared_lp)
    m = mask.bool()
    assert m.sum() == batch.loss_mask.sum() == (33 if rows is None else 4 + 7 + 1 + 6)  # every policy token
    torch.testing.assert_close(shared_lp[m], plain_lp[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_ent[m], plain_ent[m], atol=1e-5, rtol=1e-5)
    prompt_targets = torch.arange(m.shape[1])[None] < batch.prompt_len[:, None] - 1
    assert (shared_lp[prompt_targets] == 0).all()  # targets inside the prompts are not computed
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_no_shared_prompt_runs_the_plain_pass():
    model = _model("llama")
    batch = _batch().select([0, 3, 5])  # one row per prompt
    calls = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    lp, _ = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, PAD)
    handle.remove()
    assert calls == [batch.input_ids.shape]  # one full pass, no prompt pass
    torch.testing.assert_close(lp, _plain(model, batch)[0])


def test_short_prompts_are_not_worth_a_second_pass():
    model = _model("llama")
    seqs = [_traj([5, 6], [(list(range(3, 3 + k)), True)]) for k in (20, 24)]  # 2 prompt tokens, 20+ sampled
    batch = collate(seqs, [1.0, -1.0], PAD)
    calls = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, PAD)
    handle.remove()
    assert calls == [(2, 26)]  # 1 x 2 + 2 x 24 = 50 padded tokens shared, against 52 plain: not worth it


def test_prompts_run_once_per_group():
    model = _model("llama")
    batch = _batch()
    calls = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, PAD)
    handle.remove()
    assert calls[0] == (3, 9)  # the three distinct prompts, padded to the longest
    assert calls[1] == (7, 8)  # every row's continuation, padded to the longest (8 tokens)


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("mistral", {"sliding_window": 4, "num_key_value_heads": 2}),
        ("qwen2", {"sliding_window": 4, "use_sliding_window": True, "max_window_layers": 0, "num_key_value_heads": 2}),
    ],
    ids=["mistral", "qwen2-sliding"],
)
def test_windowed_models_through_model_forward_match_the_plain_pass(kind, extra):
    """Through ``model.forward`` a shared prefix would be padded to the group's longest prompt, and transformers
    counts padding slots as positions when it places a sliding window: the pass runs plain for such models."""
    config_cls = {"mistral": transformers.MistralConfig, "qwen2": transformers.Qwen2Config}[kind]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**COMMON, **extra)).eval()
    batch = _batch()
    assert sharing(batch.input_ids, batch.attention_mask, batch.prompt_len) is not None  # sharing would pay
    lp, _ = forward_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_len, PAD, lean=False)
    m = batch.loss_mask.bool()
    with torch.no_grad():
        for row in range(len(batch.input_ids)):  # each row alone, unpadded: the reference
            n = int(batch.attention_mask[row].sum())
            ids = batch.input_ids[row : row + 1, :n]
            ref = token_logprobs(model(input_ids=ids).logits, ids)[0]
            torch.testing.assert_close(lp[row, : n - 1][m[row, : n - 1]], ref[m[row, : n - 1]], atol=1e-5, rtol=1e-5)

"""FLOP counts of lrmgym.learners.engine.flops: hand-computed on a tiny shape, and against torch's FlopCounterMode."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lrmgym.learners.engine.flops import (
    LlamaShape,
    backward_flops,
    chunk_flops,
    forward_flops,
    generate_flops,
)

# h=8, I=12, H=2 query heads, K=1 KV head, d=4, one layer, V=10.
TINY = LlamaShape(hidden=8, intermediate=12, heads=2, kv_heads=1, head_dim=4, layers=1, vocab=10)
# Per token: q 2*8*8 + k 2*8*4 + v 2*8*4 + o 2*8*8 = 384; gate/up/down 3*2*8*12 = 576; lm_head 2*8*10 = 160.
# Attention: 2 matmuls x 2 FLOPs x (H d = 8) = 32 per query-key pair.


def test_per_token_flops_by_hand() -> None:
    assert TINY.token_flops == 384 + 576


def test_forward_of_one_sequence_by_hand() -> None:
    # T=3: 3 tokens x (960 + 160 lm_head) = 3360; dense attention 3 x 3 = 9 pairs, causal 1+2+3 = 6 pairs.
    assert forward_flops(TINY, [3]) == 3360 + 32 * 9
    assert forward_flops(TINY, [3], attention="causal") == 3360 + 32 * 6
    assert forward_flops(TINY, [3, 1]) == 3360 + 32 * 9 + 1120 + 32 * 1
    assert backward_flops(TINY, [3]) == 2 * (3360 + 32 * 9)


def test_chunk_after_a_cache_by_hand() -> None:
    # 2 tokens after 5 cached: dense 2 x 7 = 14 pairs, causal 2*5 + 1 + 2 = 13; logits at 1 position only.
    assert chunk_flops(TINY, 2, cached=5, logits=1) == 2 * 960 + 160 + 32 * 14
    assert chunk_flops(TINY, 2, cached=5, logits=1, attention="causal") == 2 * 960 + 160 + 32 * 13


def test_generate_by_hand() -> None:
    # P=2, n=3: prefill 2 x 960 + 1 x 160 + 4 pairs (dense); steps feed tokens 1 and 2 at positions 2 and 3,
    # against 3 and 4 keys: 2 x (960 + 160) + 7 pairs. Token 3 is sampled, never fed.
    assert generate_flops(TINY, 2, 3) == (1920 + 160 + 32 * 4) + (2 * 1120 + 32 * 7)
    assert generate_flops(TINY, 2, 3, attention="causal") == (1920 + 160 + 32 * 3) + (2 * 1120 + 32 * 7)
    assert generate_flops(TINY, 2, 1) == 1920 + 160 + 32 * 4
    assert generate_flops(TINY, 2, 0) == 0


def test_generate_equals_its_chunks() -> None:
    shape = LlamaShape(hidden=16, intermediate=40, heads=4, kv_heads=2, head_dim=4, layers=3, vocab=33)
    p, n = 7, 6
    chunks = chunk_flops(shape, p, logits=1) + sum(chunk_flops(shape, 1, cached=p + j - 1) for j in range(1, n))
    assert generate_flops(shape, p, n) == chunks


def _tiny_llama(**overrides: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    kw = dict(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    kw.update(overrides)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))


def test_shape_from_config() -> None:
    model = _tiny_llama()
    assert LlamaShape.of_model(model) == LlamaShape(32, 48, 4, 2, 8, 2, 50)
    assert LlamaShape.from_config(type("Cfg", (), {"model_type": "gpt2"})()) is None
    assert LlamaShape.of_model(torch.nn.Linear(2, 2)) is None


def _counter(attn: str):
    """A FlopCounterMode that also counts SDPA's CPU flash kernel (torch has formulas only for the GPU kernels)."""
    from torch.utils import flop_counter as fc

    def forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
    }
    return fc.FlopCounterMode(display=False, custom_mapping=mapping if attn == "sdpa" else None)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_matches_torch_flop_counter_forward_and_backward(attn: str) -> None:
    """torch's FlopCounterMode on a real tiny Llama (GQA, tied embeddings): exact agreement (tolerance 1e-9).

    Except one documented difference: SDPA's flash kernel recomputes ``q k^T`` in its backward (5 attention
    matmuls where this module's convention counts 4), so torch counts half an attention forward more there.
    """
    model = _tiny_llama(attn_implementation=attn)
    ids = torch.randint(0, 50, (3, 11))
    shape = LlamaShape.of_model(model)
    with _counter(attn) as fwd:
        logits = model(input_ids=ids).logits
    assert fwd.get_total_flops() == pytest.approx(forward_flops(shape, [11] * 3), rel=1e-9)
    with _counter(attn) as bwd:
        logits.float().logsumexp(-1).sum().backward()
    attention = 3 * shape.layers * 2 * 2 * shape.heads * shape.head_dim * 11 * 11  # dense 11 x 11 pairs
    recompute = 0 if attn == "eager" else attention // 2
    assert bwd.get_total_flops() == pytest.approx(backward_flops(shape, [11] * 3) + recompute, rel=1e-9)


# ------------------------------------------------------------------------------------- the learners' metrics
def _grpo(**kw: Any) -> Any:
    from learner_helpers import small_grpo

    return small_grpo(**kw)


def _batch(algo: Any) -> tuple[list[Any], list[float]]:
    from lrmgym.learners.algorithms.advantages import group_advantages, scores_to_tensors
    from lrmgym.learners.engine.rollout import rollout, tokenize_trajectory

    ro = rollout(algo.env, algo.policy, [algo.env.task_at(i, seed=0) for i in range(4)], 4, algo.cfg.sampling(3))
    adv = group_advantages(*scores_to_tensors([[t.reward for t in g] for g in ro.groups])).advantages
    return [tokenize_trajectory(t, algo.policy.tokenizer) for g in ro.groups for t in g], adv.reshape(-1).tolist()


@pytest.mark.parametrize(
    ("options", "nograd_passes", "grad_passes"),
    [({}, 0, 1), ({"track_kl": True}, 1, 1), ({"epochs": 2, "minibatches": 2, "micro_batch_size": 3}, 1, 2)],
)
def test_the_update_counts_the_flops_of_each_pass(tmp_path, options, nograd_passes, grad_passes) -> None:
    from learner_helpers import make_loop, register_test_env, run_config

    register_test_env()
    algo = make_loop(run_config(_grpo(**options)), tmp_path, setup=True).algorithm
    seqs, adv = _batch(algo)
    stats = algo.updater.update(seqs, adv, measure_kl=algo.cfg.track_kl, behavior="recompute")
    once = forward_flops(algo.updater.shape, [len(s.ids) for s in seqs])  # every row, prompt included, no padding
    assert stats["compute/flops_forward"] == (grad_passes + nograd_passes) * once
    assert stats["compute/flops_backward"] == 2 * grad_passes * once


@pytest.mark.parametrize(
    "options",
    [{}, {"track_kl": True}, {"shared_prefix": False}, {"micro_batch_size": 3, "epochs": 2}, {"lean_forward": False}],
)
def test_the_update_counts_the_flops_it_executes(tmp_path, options) -> None:
    """compute/executed_flops_* equal torch's FlopCounterMode over the whole update (prompt once per group, padding).

    Exactly, with the lean forward; through model.forward the count is an estimate (its attention kernels and
    where it computes logits differ), within 5 % here.
    """
    from learner_helpers import make_loop, register_test_env, run_config
    from torch.utils.flop_counter import FlopCounterMode

    from lrmgym.learners.engine import shared_prefix

    register_test_env()
    algo = make_loop(run_config(_grpo(**options)), tmp_path, setup=True).algorithm
    seqs, adv = _batch(algo)
    shared = []
    real = shared_prefix.sharing

    def spy(*args: Any) -> Any:
        shared.append(real(*args))
        return shared[-1]

    shared_prefix.sharing = spy
    try:
        with FlopCounterMode(display=False) as counter:
            stats = algo.updater.update(seqs, adv, measure_kl=algo.cfg.track_kl, behavior="recompute")
    finally:
        shared_prefix.sharing = real
    executed = stats["compute/executed_flops_forward"] + stats["compute/executed_flops_backward"]
    if options in ({}, {"track_kl": True}):  # whole groups in a pass: some pass ran its prompts once
        assert any(owner is not None for owner in shared)
        assert executed < stats["compute/flops_forward"] + stats["compute/flops_backward"]
    if options.get("lean_forward", True):
        assert executed == counter.get_total_flops()
    else:  # an estimate there (shared_prefix.executed_flops)
        assert counter.get_total_flops() == pytest.approx(executed, rel=0.05)
    if not options:  # one pass with gradient, none without
        assert stats["compute/executed_flops_backward"] == 2 * stats["compute/executed_flops_forward"]


def test_a_grpo_run_logs_flops_and_achieved_rates(tmp_path) -> None:
    import json

    from learner_helpers import register_test_env, run_config

    from lrmgym.compose import train

    register_test_env()
    train(run_config(_grpo()), tmp_path)
    for m in [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]:
        assert m["compute/flops_generate"] > 0
        # The token counters stay beside the FLOPs: a step that trained rows counted both, one that did not neither.
        assert m["compute/forward_tokens"] == m["compute/backward_tokens"]
        assert (m["compute/forward_tokens"] > 0) == (m["compute/flops_forward"] > 0)
        update = m["compute/flops_forward"] + m["compute/flops_backward"]
        assert m["compute/flops_backward"] == 2 * m["compute/flops_forward"]  # no no-grad pass by default
        assert m["perf/update_gflops_s"] == pytest.approx(update / m["time/train_s"] / 1e9)
        total = update + m["compute/flops_generate"]
        assert m["perf/step_gflops_s"] == pytest.approx(total / m["time/step_s"] / 1e9)


def test_a_model_flops_does_not_count_logs_no_flops(tmp_path, monkeypatch) -> None:
    import json

    from learner_helpers import register_test_env, run_config

    from lrmgym.compose import train
    from lrmgym.learners.engine.flops import achieved_rates

    register_test_env()
    monkeypatch.setattr(LlamaShape, "of_model", classmethod(lambda cls, model: None))
    train(run_config(_grpo(steps=1)), tmp_path)
    (m,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert not [k for k in m if "flops" in k] and m["compute/forward_tokens"] > 0
    assert achieved_rates({"time/step_s": 1.0}) == {}


def test_trajectory_generate_flops_counts_each_policy_turn() -> None:
    from lrmgym.learners.engine.flops import trajectory_generate_flops

    # prompt 2, policy 3, env 1, policy 2: the second turn prefills the 6 tokens before it.
    mask = [False, False, True, True, True, False, True, True]
    assert trajectory_generate_flops(TINY, mask) == generate_flops(TINY, 2, 3) + generate_flops(TINY, 6, 2)
    assert trajectory_generate_flops(TINY, [False, True]) == generate_flops(TINY, 1, 1)

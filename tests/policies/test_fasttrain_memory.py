"""The lean training forward at real-model sizes: SDPA attention and chunked log-probs give the same numbers.

Both switch on by size (:data:`~lrmgym.policies.fasttrain.SDPA_MIN_KEYS` attended positions,
:data:`~lrmgym.policies.fasttrain.LOGIT_CHUNK` logit elements); the tests lower the thresholds so that tiny models
take the large-model paths, and compare log-probs, entropies and every parameter's gradient in float32 against the
products-and-softmax attention and the whole logits. What the backward keeps is checked through
``saved_tensors_hooks`` (deterministic, unlike a memory reading).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from fasttrain_helpers import IDS, MODELS, _close, _grads, _model, _right_padded

from lrmgym.learners.algorithms.logprobs import token_logprobs
from lrmgym.learners.engine.shared_prefix import forward_logprobs
from lrmgym.policies import fasttrain
from lrmgym.policies.fasttrain import LlamaTrainer, head_logprobs

PROMPTS = [list(range(3, 15)), list(range(20, 29))]
ROWS = [PROMPTS[0] + [9, 10, 11], PROMPTS[0] + [12], PROMPTS[1] + [13, 14, 15, 16], PROMPTS[1] + [17, 18]]
PROMPT_LEN = torch.tensor([12, 12, 9, 9])


def _pass(model, prompt_len, temperature=1.0, **patch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """forward_logprobs (lean) under the given module thresholds: log-probs, entropies, every gradient."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in patch.items():
            mp.setattr(fasttrain, name, value)
        model.zero_grad(set_to_none=True)
        ids, mask = _right_padded(ROWS)
        logp, ent = forward_logprobs(model, ids, mask, prompt_len, 0, entropy=True, temperature=temperature)
        weight = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)
        (logp * weight).sum().backward()
        return logp.detach(), ent, _grads(model)


def _same(a: tuple, b: tuple) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)
    _close(a[2], b[2])


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared-prefix"])
@pytest.mark.parametrize(("kind", "extra"), MODELS[:2] + MODELS[4:], ids=IDS[:2] + IDS[4:])
def test_sdpa_attention_matches_the_products(kind, extra, shared):
    model = _model(kind, **extra)
    prompt_len = PROMPT_LEN if shared else None
    _same(_pass(model, prompt_len, SDPA_MIN_KEYS=1), _pass(model, prompt_len, SDPA_MIN_KEYS=10**9))


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared-prefix"])
@pytest.mark.parametrize(("kind", "extra"), MODELS[:2] + MODELS[4:], ids=IDS[:2] + IDS[4:])
def test_chunked_logprobs_match_the_whole_logits(kind, extra, shared):
    model = _model(kind, **extra)
    prompt_len = PROMPT_LEN if shared else None
    vocab = model.config.vocab_size
    for temperature in (1.0, 0.7):
        chunked = _pass(model, prompt_len, temperature, LOGIT_CHUNK=3 * vocab)  # 3 tokens per chunk
        _same(chunked, _pass(model, prompt_len, temperature))  # whole logits (the tiny sizes' path)
    # both large-model paths at once against model.forward
    model.zero_grad(set_to_none=True)
    ids, mask = _right_padded(ROWS)
    # one plain model.forward over the whole rows (transformers' shared-prefix pass puts a sliding window off:
    # test_fasttrain.py::test_shared_prefix_passes_match_the_plain_model_forward)
    plain, ent = forward_logprobs(model, ids, mask, None, 0, entropy=True, lean=False)
    real = mask[:, 1:].bool()  # padded targets hold values no caller reads (lean and model.forward differ there)
    if prompt_len is not None:  # the shared layout computes targets from the first policy token on
        real &= torch.arange(real.shape[1]) >= prompt_len[:, None] - 1
    (plain * torch.linspace(-1.0, 1.0, plain.numel()).view_as(plain) * real).sum().backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fasttrain, "LOGIT_CHUNK", vocab)
        mp.setattr(fasttrain, "SDPA_MIN_KEYS", 1)
        logp, lean_ent = forward_logprobs(model, ids, mask, prompt_len, 0, entropy=True)
        (logp * torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp) * real).sum().backward()
    torch.testing.assert_close(logp[real], plain[real].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lean_ent[real], ent[real], rtol=1e-5, atol=1e-5)
    _close(_grads(model), expected)


def test_head_logprobs_backward_is_the_derivative():
    torch.manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fasttrain, "LOGIT_CHUNK", 2 * 11)  # 2 rows per chunk, the last one short
        assert torch.autograd.gradcheck(lambda h, w, b: head_logprobs(h, w, b, targets, 0.6)[0], (hidden, weight, bias))
        logp, ent = head_logprobs(hidden, weight, bias, targets, 0.6, entropy=True)
    whole = torch.log_softmax((hidden @ weight.T + bias) / 0.6, dim=-1)
    torch.testing.assert_close(logp, whole.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(ent, -(whole.exp() * whole).sum(-1))
    assert not ent.requires_grad


def _largest_saved(fn) -> int:
    """The most elements of any one tensor autograd keeps for the backward while ``fn()`` runs."""
    sizes = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_large_paths_keep_neither_scores_nor_whole_logits():
    """At one long row, the backward keeps no [H, t, t] attention tensor and no [t, V] logits."""
    config = transformers.Qwen2Config(
        vocab_size=400, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    t = 600  # past SDPA_MIN_KEYS
    ids = torch.randint(1, 400, (1, t))
    trainer = LlamaTrainer.build(model)
    assert trainer is not None and t >= fasttrain.SDPA_MIN_KEYS
    heads = model.config.num_attention_heads
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fasttrain, "LOGIT_CHUNK", 64 * 400)
        assert not trainer.fits_whole(t)
        kept = _largest_saved(lambda: trainer.logprobs(trainer.hidden(ids)[:, :-1], ids[:, 1:]))
    assert kept < t * 400 and kept < heads * t * t  # at most the hidden states, the weights, a chunk
    whole = _largest_saved(lambda: token_logprobs(trainer.logits(ids), ids))
    assert whole >= (t - 1) * 400  # the whole logits (what the chunks avoid)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fasttrain, "SDPA_MIN_KEYS", 10**9)
        assert _largest_saved(lambda: trainer.hidden(ids)) >= heads * t * t  # the products keep the scores


def _saved_total(fn) -> int:
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared-prefix"])
def test_gradient_checkpointing_recomputes_layers_with_the_same_gradients(shared):
    """policy.gradient_checkpointing: the lean forward checkpoints each layer; log-probs and gradients unchanged."""
    model = _model("qwen2", num_key_value_heads=2)
    prompt_len = PROMPT_LEN if shared else None
    plain = _pass(model, prompt_len, LOGIT_CHUNK=40)
    ids = torch.randint(1, 40, (2, 24))
    kept = _saved_total(lambda: LlamaTrainer.build(model).hidden(ids))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert LlamaTrainer.build(model).checkpointing
    _same(_pass(model, prompt_len, LOGIT_CHUNK=40), plain)
    assert _saved_total(lambda: LlamaTrainer.build(model).hidden(ids)) < kept / 3  # the layers' inputs only
    assert not LlamaTrainer.build(model.eval()).checkpointing  # eval mode: nothing to recompute


def _qwen3_moe() -> torch.nn.Module:
    config = transformers.Qwen3MoeConfig(
        vocab_size=40, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


def test_models_the_lean_forward_does_not_take_chunk_their_head_too():
    """Qwen3-MoE (routed experts: model.forward) with large logits: its decoder, then the head in chunks."""
    model = _qwen3_moe()
    assert LlamaTrainer.build(model) is None
    whole = _pass(model, None)
    chunked = _pass(model, None, LOGIT_CHUNK=3 * 40)
    ids, mask = _right_padded(ROWS)
    real = mask[:, 1:].bool()
    torch.testing.assert_close(chunked[0][real], whole[0][real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked[1][real], whole[1][real], rtol=1e-5, atol=1e-5)
    # gradients: a loss on the real targets only (padded targets differ between the two paths' layouts)
    grads = []
    for patch in ({}, {"LOGIT_CHUNK": 3 * 40}):
        with pytest.MonkeyPatch.context() as mp:
            for name, value in patch.items():
                mp.setattr(fasttrain, name, value)
            model.zero_grad(set_to_none=True)
            logp, _ = forward_logprobs(model, ids, mask, None, 0)
            (logp * real * torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)).sum().backward()
            grads.append(_grads(model))
    _close(grads[1], grads[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fasttrain, "LOGIT_CHUNK", 3 * 40)
        assert fasttrain.chunked_model_logprobs(model, ids, mask) is not None
        gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=40))
        assert fasttrain.chunked_model_logprobs(gpt2, ids, mask) is None  # not a known plain-head model
        model.lm_head.register_forward_hook(lambda m, i, o: o * 2)
        assert fasttrain.chunked_model_logprobs(model, ids, mask) is None  # a hook on the head must run
    assert fasttrain.chunked_model_logprobs(_qwen3_moe(), ids, mask) is None  # small logits: computed whole

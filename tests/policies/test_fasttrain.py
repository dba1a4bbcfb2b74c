"""The lean training forward computes ``model.forward``'s logits and gradients, and steps aside where it cannot."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from fasttrain_helpers import IDS, MODELS, _close, _grads, _model, _right_padded

from lrmgym.learners.engine.shared_prefix import _worth_sharing, forward_logprobs, prompt_groups
from lrmgym.policies.fasttrain import LlamaTrainer, _Normalize, causal_lm_logits, compile_unavailable, right_padded

ROWS = [[3, 4, 0, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15], [16]]  # a token 0 inside a row too


def test_the_norms_hand_written_backward_is_the_derivative():
    # float64 finite differences against the backward: rows of different scales, eps large enough to matter
    x = (torch.randn(5, 3, 8, dtype=torch.float64) * torch.tensor([0.01, 1.0, 30.0])[:, None]).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: _Normalize.apply(t, 1e-3), (x,))
    ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-3)
    torch.testing.assert_close(_Normalize.apply(x, 1e-3), ref)


def test_the_norm_runs_bfloat16_in_float32():
    x = torch.randn(4, 64).requires_grad_()
    xb = x.detach().bfloat16().requires_grad_()
    y, yb = _Normalize.apply(x, 1e-6), _Normalize.apply(xb, 1e-6)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), y, atol=2e-2, rtol=1e-2)  # bfloat16's own rounding of the output
    g = torch.randn(4, 64)
    y.backward(g)
    yb.backward(g.bfloat16())
    assert xb.grad.dtype == torch.bfloat16
    torch.testing.assert_close(xb.grad.float(), x.grad, atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize(("kind", "extra"), MODELS, ids=IDS)
def test_logits_and_every_gradient_match_model_forward(kind, extra):
    model = _model(kind, **extra)
    ids, mask = _right_padded(ROWS)
    reference = model(input_ids=ids, attention_mask=mask).logits
    weight = torch.randn_like(reference) * mask[..., None]  # a loss that reads every real position
    (reference * weight).sum().backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)

    trainer = LlamaTrainer.build(model)
    assert trainer is not None
    logits = trainer.logits(ids)
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[real], rtol=1e-5, atol=1e-5)
    (logits * weight).sum().backward()
    got = _grads(model)
    assert len(got) == len(list(model.parameters()))  # every parameter got its gradient
    _close(got, expected)


@pytest.mark.parametrize(("kind", "extra"), MODELS[:2] + MODELS[4:], ids=IDS[:2] + IDS[4:])
def test_shared_prefix_passes_match_the_plain_model_forward(kind, extra):
    """prefill + extend (a group's prompt once, its continuations on a row-selection of its keys/values).

    The reference is one plain ``model.forward`` over the whole rows, read at the continuations' targets (entries
    outside them are 0 in the shared layout). Not transformers' own shared-prefix pass: with a sliding window it
    counts a short prompt's padding slots in the prefix as positions (row 2 here), so its windows are off.
    """
    model = _model(kind, **extra)
    prompts = [list(range(3, 15)), list(range(20, 29))]  # long enough next to the continuations to be shared
    rows = [prompts[0] + [9, 10, 11], prompts[0] + [12], prompts[1] + [13, 14, 15, 16], prompts[0] + [17, 18]]
    ids, mask = _right_padded(rows)
    prompt_len = torch.tensor([12, 12, 9, 12])
    assert _worth_sharing(prompt_groups(ids, prompt_len), prompt_len, mask.sum(-1), ids.shape[1])
    cols = torch.arange(ids.shape[1] - 1)
    policy = (cols >= prompt_len[:, None] - 1) & (cols < mask.sum(-1)[:, None] - 1)  # from the first policy token
    weight = torch.randn(policy.shape, generator=torch.Generator().manual_seed(1)) * policy
    results = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = forward_logprobs(
            model, ids, mask, prompt_len if shared else None, 0, entropy=True, lean=shared
        )  # fmt: skip
        (logp * weight).sum().backward()
        results[shared] = logp.detach()[policy], entropy[policy], _grads(model)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-5)
    _close(results[True][2], results[False][2])


def test_lora_gradients_match_and_active_dropout_steps_aside():
    peft = pytest.importorskip("peft")
    base = _model("llama", tie_word_embeddings=True)
    spec = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    model = peft.get_peft_model(base, spec)
    with torch.no_grad():  # LoRA's B starts at zero; make the adapters do something
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    model.train()
    ids, mask = _right_padded(ROWS)
    reference = model(input_ids=ids, attention_mask=mask).logits
    weight = torch.randn_like(reference) * mask[..., None]
    (reference * weight).sum().backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)
    assert expected and all("lora" in n for n in expected)  # only the adapters train
    logits = causal_lm_logits(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[real], rtol=1e-5, atol=1e-5)
    (logits * weight).sum().backward()
    _close(_grads(model), expected)

    dropping = peft.get_peft_model(
        _model("llama"), peft.LoraConfig(r=4, lora_dropout=0.1, target_modules=["q_proj"])
    ).train()
    assert LlamaTrainer.build(dropping) is None  # training-mode dropout: model.forward applies it, we would not
    assert LlamaTrainer.build(dropping.eval()) is not None  # in eval mode dropout is the identity


def test_falls_back_where_it_does_not_apply():
    model = _model("llama")
    assert LlamaTrainer.build(model) is not None
    hooked = copy.deepcopy(model)
    hooked.model.layers[0].mlp.register_forward_hook(lambda m, i, o: o * 2)
    assert LlamaTrainer.build(hooked) is None
    dropout = _model("llama", attention_dropout=0.1)
    assert LlamaTrainer.build(dropout) is None
    assert LlamaTrainer.build(dropout.eval()) is not None
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable()
    lean = LlamaTrainer.build(checkpointed)  # takes it, and checkpoints its layers too (test_fasttrain_memory.py)
    assert lean is not None and lean.checkpointing
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=40)).eval()
    assert LlamaTrainer.build(gpt2) is None
    ids, mask = _right_padded(ROWS)
    torch.testing.assert_close(causal_lm_logits(gpt2, ids, mask), gpt2(input_ids=ids, attention_mask=mask).logits)


def test_left_padded_rows_take_model_forward():
    model = _model("llama").eval()
    ids = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert not right_padded(mask) and right_padded(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert not right_padded(torch.tensor([[0, 0, 0]]))
    torch.testing.assert_close(causal_lm_logits(model, ids, mask), model(input_ids=ids, attention_mask=mask).logits)


def _one_update(**options) -> tuple[dict, dict[str, torch.Tensor]]:
    """One PolicyUpdater step on a small llama with the given update options: its statistics and new parameters."""
    from lrmgym.learners.engine.rollout import TokenizedTrajectory
    from lrmgym.learners.engine.update import PolicyGradientConfig, PolicyUpdater

    class Policy:
        def __init__(self, model):
            self.model = model
            self.tokenizer = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 1})()

    prompt = [3, 4, 5, 6, 7]
    seqs = [
        TokenizedTrajectory(prompt + c, [False] * 5 + [True] * len(c), [0.0] * 5 + [-1.5] * len(c))
        for c in ([8, 9, 10], [11, 12], [13, 14, 15, 16], [17])
    ]
    model = _model("llama", tie_word_embeddings=True)
    cfg = PolicyGradientConfig(lr=1e-3, track_kl=True, kl_coef=0.1, **options)
    updater = PolicyUpdater(cfg, Policy(model), lambda: 0.0, 8)
    stats = updater.update(seqs, [1.0, -0.5, 0.25, -0.75], True, "recompute", sampler_known=True)
    return stats, {n: p.detach().clone() for n, p in model.named_parameters()}


def _same_update(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    for key in ("loss", "entropy", "kl_ref", "grad_norm", "train_infer/kl"):
        assert a[0][key] == pytest.approx(b[0][key], rel=1e-4, abs=1e-7), key
    for name, p in a[1].items():
        torch.testing.assert_close(p, b[1][name], rtol=0, atol=1e-5)  # 1 % of one Adam step (lr)


def test_the_update_is_the_same_with_and_without_it():
    """One PolicyUpdater step with lean_forward on and off: the same statistics and the same new parameters."""
    _same_update(_one_update(lean_forward=True), _one_update(lean_forward=False))


@pytest.mark.slow
@pytest.mark.skipif(compile_unavailable() is not None, reason="torch.compile has no C++ compiler here")
def test_the_compiled_update_is_the_same():
    """learner.compile: the update through torch.compile's graph gives the eager lean forward's step (minutes)."""
    _same_update(_one_update(compile=True), _one_update(compile=False))


def test_compile_needs_the_lean_forward_and_a_compiler(monkeypatch):
    from pydantic import ValidationError

    from lrmgym.learners.engine.update import PolicyGradientConfig

    with pytest.raises(ValidationError, match="lean_forward=false turns off; set lean_forward=true or compile=false"):
        PolicyGradientConfig(compile=True, lean_forward=False)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert compile_unavailable() == "the compiler '/nonexistent/c++' ($CXX, g++ when unset) is not on PATH"
    with pytest.raises(ValidationError, match="apt-get install g[+][+]. or set compile=false"):
        PolicyGradientConfig(compile=True)
    assert not PolicyGradientConfig(compile=False).compile  # off: nothing is checked

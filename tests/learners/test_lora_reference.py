"""A LoRA run's reference policy is the policy with its adapters off (peft's disable_adapter), not a second copy."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policies"))  # the lean-forward tests' models

import pytest
import torch
from fasttrain_helpers import _model

from lrmgym.learners.engine.pg_config import PolicyGradientConfig
from lrmgym.learners.engine.rollout import TokenizedTrajectory, collate
from lrmgym.learners.engine.update import PolicyUpdater
from lrmgym.learners.engine.weights import AdapterOffReference, frozen_reference

peft = pytest.importorskip("peft")

PROMPT = [3, 4, 5, 6, 7]
SEQS = [
    TokenizedTrajectory(PROMPT + c, [False] * 5 + [True] * len(c), [0.0] * 5 + [-1.5] * len(c))
    for c in ([8, 9, 10], [11, 12], [13, 14, 15, 16], [17])
]


class _Policy:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.tokenizer = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 1})()


def _lora(dropout: float = 0.0) -> torch.nn.Module:
    spec = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj", "v_proj", "down_proj"])
    return peft.get_peft_model(_model("llama", tie_word_embeddings=True), spec)


def _updater(model: torch.nn.Module, **options) -> PolicyUpdater:
    cfg = PolicyGradientConfig(lr=1e-2, track_kl=True, kl_coef=0.1, **options)
    return PolicyUpdater(cfg, _Policy(model), lambda: 0.0, 8)


def test_the_reference_is_the_policy_with_adapters_off():
    model = _lora(dropout=0.1).train()
    initial = copy.deepcopy(model).eval()  # what the reference used to be
    updater = _updater(model)
    assert isinstance(updater.ref_model, AdapterOffReference) and updater.ref_model.model is model
    batch = collate(SEQS, [1.0, -0.5, 0.25, -0.75], pad_id=0)
    first = updater.update(SEQS, [1.0, -0.5, 0.25, -0.75], True, "recompute", sampler_known=True)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-7)  # the step's reference pass ran before it moved anything
    moved = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert any(bool(p.detach().any()) for p in moved)  # the adapters trained
    model.train()
    ref = updater.no_grad_logprobs(updater.ref_model, batch)
    expected = updater.no_grad_logprobs(initial, batch)
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-6)
    assert model.training  # scoring the reference (in eval mode, adapters off) restored both
    assert all(not m.disable_adapters for m in model.modules() if hasattr(m, "lora_A"))  # adapters back on
    assert not torch.allclose(updater.no_grad_logprobs(model, batch), ref)  # the policy itself has moved


def test_a_copy_where_adapters_off_is_not_the_initial_policy():
    trained = _lora()
    with torch.no_grad():  # a loaded adapter: not the identity, so adapters off is not the starting policy
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    assert not isinstance(frozen_reference(trained), AdapterOffReference)
    assert not isinstance(frozen_reference(_lora(), refreshed=True), AdapterOffReference)  # ref_refresh_steps
    plain = _model("llama")
    reference = frozen_reference(plain)
    assert isinstance(reference, torch.nn.Module) and reference is not plain and not reference.training
    assert isinstance(_updater(_lora(), ref_refresh_steps=2).ref_model, torch.nn.Module)

"""learner.fp32_master: bfloat16 weights step through float32 copies, so updates below bfloat16's spacing add up."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policies"))  # the lean-forward tests' models

import torch
from fasttrain_helpers import _model
from test_lora_reference import SEQS, _Policy

from lrmgym.learners.engine.pg_config import PolicyGradientConfig
from lrmgym.learners.engine.update import PolicyUpdater

ADV = [1.0, -0.5, 0.25, -0.75]


def _updater(dtype: torch.dtype, **options) -> PolicyUpdater:
    model = _model("llama", tie_word_embeddings=True).to(dtype)
    cfg = PolicyGradientConfig(lr=1e-5, lr_decay="constant", max_grad_norm=None, **options)
    return PolicyUpdater(cfg, _Policy(model), lambda: 0.0, 8)


def _steps(updater: PolicyUpdater, n: int) -> None:
    for _ in range(n):
        updater.update(SEQS, ADV, True, "recompute")


def test_small_updates_accumulate_in_float32_masters():
    bare = _updater(torch.bfloat16, fp32_master=False)
    before = [p.detach().clone() for p in bare.model.parameters()]
    _steps(bare, 3)
    moved = sum(int((p != b).sum()) for p, b in zip(bare.model.parameters(), before, strict=True))
    total = sum(b.numel() for b in before)
    assert moved < 0.3 * total  # most of Adam's ~1e-5 steps vanish in bfloat16 (spacing ~4e-3 at 1): 15 % moved here

    mastered = _updater(torch.bfloat16)
    assert mastered.master is not None and all(w.dtype == torch.float32 for w in mastered.master.weights)
    start = [w.detach().clone() for w in mastered.master.weights]
    _steps(mastered, 3)
    for w, p in zip(mastered.master.weights, mastered.model.parameters(), strict=True):
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), w.detach().to(torch.bfloat16))  # rounded copy
        assert p.grad is None
    changed = sum(int((w != s).sum()) for w, s in zip(mastered.master.weights, start, strict=True))
    assert changed > 0.9 * total  # the float32 weights took (nearly) every step


def test_masters_resume_exactly_and_float32_weights_have_none():
    first = _updater(torch.bfloat16)
    _steps(first, 2)
    state = copy.deepcopy(first.state_dict())  # as a checkpoint file would (the optimizer's state is live)
    again = _updater(torch.bfloat16)
    again.load_state_dict(state)
    for w, v in zip(again.master.weights, first.master.weights, strict=True):
        assert torch.equal(w, v)  # the float32 weights, not the rounded ones
    _steps(first, 1)
    _steps(again, 1)
    for w, v in zip(again.master.weights, first.master.weights, strict=True):
        assert torch.equal(w, v)  # the next step from the resumed state is the same step
    assert _updater(torch.float32).master is None  # float32 weights step themselves, as before

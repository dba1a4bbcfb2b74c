"""Group advantages against hand-computed values."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lrmgym.learners.advantages import group_advantages, scores_to_tensors


def test_grpo_hand_values():
    rewards, valid = scores_to_tensors([[1.0, 0.0, 0.0, 1.0]])
    out = group_advantages(rewards, valid, "grpo")
    a = 0.5 / math.sqrt(1.0 / 3.0)  # deviation 0.5 over unbiased std sqrt(1/3)
    assert torch.allclose(out.advantages, torch.tensor([[a, -a, -a, a]]), atol=1e-5)
    assert out.zero_variance.tolist() == [False]


def test_dr_grpo_and_rloo_hand_values():
    rewards, valid = scores_to_tensors([[1.0, 0.0, 0.0, 1.0]])
    assert torch.allclose(
        group_advantages(rewards, valid, "dr_grpo").advantages, torch.tensor([[0.5, -0.5, -0.5, 0.5]])
    )
    # RLOO: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3
    rloo = group_advantages(rewards, valid, "rloo").advantages
    assert torch.allclose(rloo, torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_ungradeable_is_masked_not_zero():
    # With the None scored 0 the group would be [1, 0, 0]; masked it is [1, 0]: mean 0.5.
    rewards, valid = scores_to_tensors([[1.0, 0.0, None]])
    out = group_advantages(rewards, valid, "dr_grpo")
    assert torch.allclose(out.advantages, torch.tensor([[0.5, -0.5, 0.0]]))
    assert out.valid.tolist() == [[True, True, False]]


def test_zero_variance_groups():
    rewards, valid = scores_to_tensors([[1.0, 1.0, 1.0], [0.0, 0.0, None], [None, None, 1.0], [0.3, 0.1 + 0.2, 0.3]])
    out = group_advantages(rewards, valid)
    assert out.zero_variance.tolist() == [True, True, True, True]
    assert (out.advantages == 0).all()


def test_groups_are_independent():
    rewards, valid = scores_to_tensors([[2.0, 0.0], [5.0, 5.0]])
    out = group_advantages(rewards, valid, "dr_grpo")
    assert torch.allclose(out.advantages, torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
    assert out.zero_variance.tolist() == [False, True]


def test_ragged_groups_rejected():
    with pytest.raises(
        ValueError, match=f"^{re.escape('Every group must have the same number of completions, got sizes [1, 2].')}$"
    ):
        scores_to_tensors([[1.0], [1.0, 0.0]])


def test_unknown_estimator():
    rewards, valid = scores_to_tensors([[1.0, 0.0]])
    msg = "Unknown advantage estimator 'ppo'; expected 'grpo', 'dr_grpo' or 'rloo'."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        group_advantages(rewards, valid, "ppo")  # type: ignore[arg-type]

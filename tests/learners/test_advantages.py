"""Group advantages against hand-computed values."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lrmgym.learners.algorithms.advantages import (
    GROUP_ADVANTAGES,
    TOKEN_ADVANTAGES,
    gae,
    get_advantage,
    group_advantages,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    scores_to_tensors,
)


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
    msg = (
        "unknown group advantage estimator 'ppo'; known: dr_grpo, grpo, reinforce_pp, reinforce_pp_baseline, rloo. "
        "Did you mean 'grpo'? Use one of these, or register a new one with "
        "@lrmgym.learners.algorithms.advantages.register_advantage(name)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        group_advantages(rewards, valid, "ppo")


def test_registries_hold_the_estimators():
    assert GROUP_ADVANTAGES.names() == ("dr_grpo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo")
    assert TOKEN_ADVANTAGES.names() == ("gae",) and TOKEN_ADVANTAGES.lookup("gae") is gae
    assert get_advantage("rloo") is rloo


def test_grpo_divides_by_the_unbiased_std_of_the_gradeable_samples_plus_eps():
    # Group [2, 0, None, 1]: n = 3, mean 1, deviations (1, -1, 0), unbiased var (1 + 1 + 0) / 2 = 1, std 1.
    # eps = 1 (to see it): A = (1/2, -1/2, 0, 0). Population std sqrt(2/3), var, or n = 4 would all differ.
    rewards, valid = scores_to_tensors([[2.0, 0.0, None, 1.0]])
    out = group_advantages(rewards, valid, "grpo", eps=1.0)
    assert torch.allclose(out.advantages, torch.tensor([[0.5, -0.5, 0.0, 0.0]]))


def test_rloo_leaves_one_out_of_the_gradeable_samples():
    # [1, 0, 0, None]: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (the None is neither a 0 nor counted in n)
    rewards, valid = scores_to_tensors([[1.0, 0.0, 0.0, None]])
    assert torch.allclose(rloo(rewards, valid).advantages, torch.tensor([[1.0, -0.5, -0.5, 0.0]]))


def test_eps_reaches_only_the_estimators_that_take_it():
    rewards, valid = scores_to_tensors([[1.0, 0.0]])
    assert torch.allclose(group_advantages(rewards, valid, "dr_grpo", eps=5.0).advantages, torch.tensor([[0.5, -0.5]]))


def test_reinforce_pp_whitens_over_the_batch_without_a_group_baseline():
    # Gradeable rewards of the batch: 1, 0 | 1, 1, 1 (the None, stored as 100 here, enters nothing).
    # n = 5, mean 0.8, deviations (0.2, -0.8 | 0.2, 0.2, 0.2), sum of squares 4 * 0.04 + 0.64 = 0.8,
    # unbiased var 0.8 / 4 = 0.2, std 0.4472136: A = 0.2 / 0.4472136 = 0.4472136, -0.8 / 0.4472136 = -1.7888544.
    # The all-correct group keeps positive advantages (no group baseline) but is still flagged zero-variance.
    rewards = torch.tensor([[1.0, 0.0, 100.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    out = reinforce_pp(rewards, valid, eps=0.0)
    a, b = 0.2 / math.sqrt(0.2), -0.8 / math.sqrt(0.2)
    assert torch.allclose(out.advantages, torch.tensor([[a, b, 0.0], [a, a, a]]))
    assert out.zero_variance.tolist() == [False, True]


def test_reinforce_pp_of_a_flat_batch_is_zero():
    rewards, valid = scores_to_tensors([[0.1 + 0.2, 0.3], [0.3, None]])
    assert (reinforce_pp(rewards, valid).advantages == 0).all()


def test_reinforce_pp_baseline_whitens_group_centred_rewards_over_gradeable_samples():
    # Group-centred rewards: [1, 0, None] -> (0.5, -0.5, -); [1, 1, 1] -> (0, 0, 0); [1, 0, 0] -> (2/3, -1/3, -1/3).
    # Over the 8 gradeable samples: mean 0, sum of squares 0.25 + 0.25 + 4/9 + 1/9 + 1/9 = 7/6,
    # unbiased var (7/6) / 7 = 1/6, std 0.4082483. A = centred / std: 0.5 -> 1.2247449, 2/3 -> 1.6329932,
    # -1/3 -> -0.8164966. Counting the None (n = 9), dropping the flat group (n = 5), the population std or the
    # per-group std (GRPO) all give other numbers; the None's stored reward (100) must not matter.
    rewards = torch.tensor([[1.0, 0.0, 100.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    valid = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    out = reinforce_pp_baseline(rewards, valid, eps=0.0)
    std = math.sqrt(1 / 6)
    expected = [[0.5 / std, -0.5 / std, 0.0], [0.0, 0.0, 0.0], [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std]]
    assert torch.allclose(out.advantages, torch.tensor(expected))
    assert (out.advantages[1] == 0).all()  # exactly 0: the learner skips such rows
    assert out.zero_variance.tolist() == [False, True, False]


def _gae_case():
    # gamma 0.9, lam 0.8 (gamma * lam = 0.72); values without a bootstrap column (V after the last token = 0).
    # Row 0, all policy tokens, r = (0, 0, 1), V = (0.5, 0.6, 0.7):
    #   t=2: delta = 1 + 0.9*0 - 0.7 = 0.3                 A = 0.3
    #   t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03              A = 0.03 + 0.72*0.3 = 0.246
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04              A = 0.04 + 0.72*0.246 = 0.21712
    # Row 1, padded after 2 tokens, r = (0, 1, 9), V = (0.4, 0.2, 5.0): the padding's 9 and 5.0 are never read
    #   t=1: delta = 1 + 0.9*0 - 0.2 = 0.8                 A = 0.8
    #   t=0: delta = 0 + 0.9*0.2 - 0.4 = -0.22             A = -0.22 + 0.72*0.8 = 0.356
    # Row 2, env feedback in the middle (mask 1, 0, 1), r = (0, 5, 1), V = (0.5, 9.0, 0.7): the feedback token is
    # skipped, so next(0) = 2
    #   t=2: delta = 1 - 0.7 = 0.3                         A = 0.3
    #   t=0: delta = 0 + 0.9*0.7 - 0.5 = 0.13              A = 0.13 + 0.72*0.3 = 0.346
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 9.0], [0.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7], [0.4, 0.2, 5.0], [0.5, 9.0, 0.7]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return rewards, values, mask


def test_gae_hand_unrolled_with_padding_and_feedback():
    rewards, values, mask = _gae_case()
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    expected = torch.tensor([[0.21712, 0.246, 0.3], [0.356, 0.8, 0.0], [0.346, 0.0, 0.3]], dtype=torch.float64)
    assert torch.allclose(adv, expected)
    # returns = A + V on policy tokens, 0 elsewhere
    assert torch.allclose(
        ret, torch.tensor([[0.71712, 0.846, 1.0], [0.756, 1.0, 0.0], [0.846, 0.0, 1.0]], dtype=torch.float64)
    )


def test_gae_bootstraps_from_the_extra_value_column():
    # Row 0 with V_T = 0.5 after its last token: t=2: delta = 1 + 0.9*0.5 - 0.7 = 0.75, A = 0.75;
    # t=1: A = 0.03 + 0.72*0.75 = 0.57; t=0: A = 0.04 + 0.72*0.57 = 0.4504. Rows 1-2 get V_T = 0: as before.
    rewards, values, mask = _gae_case()
    boot = torch.cat([values, torch.tensor([[0.5], [0.0], [0.0]], dtype=torch.float64)], dim=1)
    adv, _ = gae(rewards, boot, mask, gamma=0.9, lam=0.8)
    expected = torch.tensor([[0.4504, 0.57, 0.75], [0.356, 0.8, 0.0], [0.346, 0.0, 0.3]], dtype=torch.float64)
    assert torch.allclose(adv, expected)


def test_gae_shape_error():
    msg = (
        "gae needs rewards and mask [N, T] and values [N, T + 1] or [N, T]; got rewards (2, 3), mask (2, 3), "
        "values (2, 5)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        gae(torch.zeros(2, 3), torch.zeros(2, 5), torch.ones(2, 3), gamma=1.0, lam=1.0)


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline", "grpo", "dr_grpo", "rloo"])
def test_a_batch_without_groups_has_no_advantages(name):
    out = group_advantages(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.bool), name)
    assert out.advantages.shape == (0, 4) and out.zero_variance.shape == (0,)

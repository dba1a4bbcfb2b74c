"""Ring-Zero's response window against the env's reference solutions (issue 38 item 4)."""

from __future__ import annotations

import pytest

from lrmgym.core import Task
from lrmgym.learners.algorithms.ring_zero import RL1Config, RL2Config
from lrmgym.learners.algorithms.ring_zero_window import fit_window, reference_lengths
from lrmgym.policies.tiny import build_tokenizer
from lrmgym.registry import make

SEED = 7


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _longest_by_hand(env, tokenizer, count):
    """The longest reference of the stream's first ``count`` tasks, tokenized here without the module's helper."""
    out = 0
    for i in range(count):
        text = env.task_at(i, seed=SEED).metadata["solution"]
        out = max(out, len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1)  # + EOS
    return out


def test_the_default_window_holds_the_longest_reference_on_the_testbed(tokenizer, capsys):
    env = make("Testbed-v0")
    cfg, info = fit_window(RL1Config(max_new_tokens=400), env, tokenizer, SEED, "rl1")
    longest = _longest_by_hand(env, tokenizer, 2048)
    assert longest > 48  # the testbed's chains need far more than the old first window
    assert cfg.window_start == longest == info["window"] == info["reference_max"]
    assert cfg.window(0) >= longest and info["reference_cut"] == 0 and info["warning"] is None
    assert capsys.readouterr().err == ""


def test_the_default_window_on_env_math_is_no_longer_below_its_references(tokenizer):
    env = make("Math-v0", style="compact")
    cfg, info = fit_window(RL1Config(), env, tokenizer, SEED, "rl1")
    assert cfg.window(0) == _longest_by_hand(env, tokenizer, 2048) > 24  # the old default cut these


def test_an_explicit_window_below_the_references_runs_with_a_one_line_warning(tokenizer, capsys):
    env = make("Math-v0", style="compact")
    cfg, info = fit_window(RL1Config(window_start=20), env, tokenizer, SEED, "rl1")
    assert cfg.window_start == 20  # the user's choice stands (the paper's curriculum starts small too)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err == info["warning"] + "\n"
    longest = info["reference_max"]
    assert "20 tokens" in err and f"longest {longest} tokens" in err
    assert f"learner.rl1.window_start=auto (or >= {longest})" in err
    assert 0 < info["reference_cut"] < 1 and "max_new_tokens>=" not in err


def test_a_stage_without_a_window_warns_when_its_budget_is_below_the_references(tokenizer, capsys):
    cfg, info = fit_window(RL2Config(), make("Testbed-v0"), tokenizer, SEED, "rl2")  # max_new_tokens 48
    assert cfg.window_start is None and info["window"] == 48
    err = capsys.readouterr().err
    assert "rl2's token budget (max_new_tokens) is 48 tokens" in err
    assert f"learner.rl2.max_new_tokens>={info['reference_max']}" in err and "window_start" not in err


def test_auto_with_a_budget_below_the_references_takes_the_budget_and_says_so(tokenizer, capsys):
    cfg, info = fit_window(RL1Config(max_new_tokens=60), make("Testbed-v0"), tokenizer, SEED, "rl1")
    assert cfg.window_start == 60
    assert "learner.rl1.max_new_tokens>=" in capsys.readouterr().err


class _NoReferences:
    def task_at(self, index, seed=None):
        return Task(f"t{index}", "Q:", answer="1")


def test_auto_without_references_is_the_whole_budget(tokenizer, capsys):
    cfg, info = fit_window(RL1Config(max_new_tokens=40), _NoReferences(), tokenizer, SEED, "rl1")
    assert cfg.window_start is None and cfg.window(0) == 40 and info["reference_max"] is None
    assert reference_lengths(_NoReferences(), tokenizer, SEED) == []
    assert capsys.readouterr().err == ""

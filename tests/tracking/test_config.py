"""run.report_to: validated names, exact messages, and a key a resume may change (old runs lack it)."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from lrmgym.cli.main import cli
from lrmgym.configs.resolve import resolve
from lrmgym.learners.engine.resume import check_config, may_change

BASE = ["env=echo", "policy=mock"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[tensorboard,wandb,mlflow]", ("tensorboard", "wandb", "mlflow")),
        ("[mlflow]", ("mlflow",)),
        ("wandb", ("wandb",)),
        ("[]", ()),
        ("null", ()),
    ],
)
def test_report_to_takes_any_subset(value, expected):
    assert resolve([*BASE, f"run.report_to={value}"]).run.report_to == expected


def test_report_to_defaults_to_nothing():
    cfg = resolve(BASE)
    assert cfg.run.report_to == () and cfg.to_dict()["run"]["report_to"] == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "[tensorbord]",
            "Error: run.report_to[0]: invalid value 'tensorbord'; allowed: 'tensorboard', 'wandb' or 'mlflow'. "
            "Did you mean 'tensorboard'?",
        ),
        (
            "[wandb,neptune]",
            "Error: run.report_to[1]: invalid value 'neptune'; allowed: 'tensorboard', 'wandb' or 'mlflow'.",
        ),
        (
            "[wandb,wandb]",
            "Error: run.report_to: invalid value [wandb, wandb]: 'wandb' is listed twice; name each tracker once.",
        ),
        (
            "3",
            "Error: run.report_to: invalid value 3: expected a list of trackers, e.g. "
            "run.report_to=[tensorboard,wandb,mlflow].",
        ),
    ],
)
def test_a_bad_tracker_name_is_one_error_line_naming_the_allowed_ones(value, message):
    result = CliRunner().invoke(cli, ["config", "show", *BASE, f"run.report_to={value}"])
    assert result.exit_code == 2, result.output
    assert result.output == message + "\n"


def test_a_resume_may_change_the_trackers():
    assert may_change("run.report_to")
    before = resolve(BASE).to_dict()
    now = resolve([*BASE, "run.report_to=[tensorboard]"]).to_dict()
    assert check_config(now, now, before) == (["run.report_to"], [])


def test_a_run_recorded_before_report_to_existed_still_resumes():
    now = resolve(BASE).to_dict()
    old = copy.deepcopy(now)
    del old["run"]["report_to"]  # run.json and config.yaml of an older lrmgym
    raw = json.loads(json.dumps(old))
    assert check_config(raw, now, old) == ([], ["options new since the run started, at their defaults: run.report_to."])
    assert check_config(raw, now, None) == (
        [],
        ["config.yaml lacks run.report_to; resuming with their defaults (the run keeps no run.json)."],
    )

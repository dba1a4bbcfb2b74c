"""The override grammar and its error messages, pinned exactly (they are part of the user interface)."""

import re

import pytest

from lrmgym.configs.resolve import ConfigError, list_presets, load_preset, parse_overrides, resolve

BASE = ("env=echo", "policy=mock")


def fail(*tokens, base=BASE):
    with pytest.raises(ConfigError) as err:
        resolve((*base, *tokens))
    return str(err.value)


def test_presets_are_package_data():
    assert {"echo", "math"} <= set(list_presets("env"))
    assert "mock" in list_presets("policy")
    assert load_preset("env", "echo")["id"] == "lrmgym/Echo-v0"


def test_defaults_and_overrides_resolve():
    cfg = resolve((*BASE, "env.words=5", "run.seed=3", "eval.k=[1,2]", "eval.n=4"))
    assert cfg.env.id == "lrmgym/Echo-v0" and cfg.env.options["words"] == 5
    assert cfg.policy.kind == "mock" and cfg.learner.kind == "grpo"
    assert cfg.run.seed == 3 and cfg.eval.k == [1, 2] and cfg.judge == {}


def test_group_tokens_apply_before_dotted_ones():
    cfg = resolve(("env.words=7", "env=echo", "policy=mock"))
    assert cfg.env.options["words"] == 7


def test_yaml_scalars_including_exponent_without_dot():
    groups, dotted = parse_overrides(["learner.lr=1e-6", "run.b=true", "run.c=[1, 4]", "run.d=text", "run.e="])
    assert [v for _, v, _ in dotted] == [1e-6, True, [1, 4], "text", ""]


def test_round_trip_through_yaml_dict():
    import yaml

    from lrmgym.configs.resolve import resolve_dict

    cfg = resolve((*BASE, "env.words=2"))
    again = resolve_dict(yaml.safe_load(cfg.to_yaml()))
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (
            ("foo",),
            "'foo' is not an override: "
            "expected GROUP=PRESET (e.g. env=math) or dotted.key=VALUE (e.g. learner.lr=1e-6).",
        ),
        (
            ("=3",),
            "'=3' is not an override: "
            "expected GROUP=PRESET (e.g. env=math) or dotted.key=VALUE (e.g. learner.lr=1e-6).",
        ),
        (
            ("evn=math",),
            "evn: unknown key (value 'math'); allowed: backend, env, eval, judge, learner, policy, run. "
            "Did you mean 'env'?",
        ),
        (("run=x",), "run: is a section, not a preset group; set its keys instead, e.g. run.KEY=VALUE."),
        (
            ("env=ecco",),
            "env: unknown preset or environment id 'ecco'; presets: {envs}; environment ids: {id_list}. "
            "Did you mean 'echo'?",
        ),
        (("env.wrds=2",), "env.wrds: unknown key (value 2); allowed: max_turns, words. Did you mean 'words'?"),
        (
            ("env.words=many",),
            "env.words: invalid value 'many': expected a valid integer, unable to parse string as an integer "
            "(an integer from 1 to 50).",
        ),
        (("env.words=0",), "env.words: invalid value 0: expected an integer from 1 to 50."),
        (
            ("env.id=lrmgym/Ecco-v0",),
            "env.id: unknown environment 'lrmgym/Ecco-v0'{id_allowed}",
        ),
        (("run.seed=-1",), "run.seed: invalid value -1: expected an integer >= 0."),
        (
            ("run.sed=1",),
            "run.sed: unknown key (value 1); allowed: name, output_dir, report_to, seed. Did you mean 'seed'?",
        ),
        (
            ("policy.kind=mok",),
            "policy.kind: unknown kind 'mok'; allowed: hf, mock, openai, tiny, vllm. Did you mean 'mock'?",
        ),
        (
            ("policy.mode=randm",),
            "policy.mode: invalid value 'randm'; allowed: 'random', 'adversarial' or 'scripted'. "
            "Did you mean 'random'?",
        ),
        (
            ("eval.n=2", "eval.k=[1,4]"),
            "eval: eval.k contains 4 but eval.n is 2: pass@4 needs at least 4 samples per task. "
            "Raise eval.n to 4 or more, or drop 4 from eval.k.",
        ),
        (("judge=nope",), "judge: unknown preset 'nope'; allowed: {judges}."),
        (("env.words.x=1",), "env.words.x: env.words is 3, not a section; it has no key 'x'."),
    ],
)
def test_error_messages_are_pinned(tokens, message):
    from lrmgym.configs.errors import allowed
    from lrmgym.registry import list_envs

    ids = list_envs(namespace=None)  # more than the built-in envs where other tests registered theirs
    message = message.format(
        envs=", ".join(list_presets("env")),
        id_list=", ".join(ids) if len(ids) <= 10 else "see `lrmgym envs list`",
        id_allowed=allowed("lrmgym/Ecco-v0", ids, "`lrmgym envs list` shows all {n}"),
        judges=", ".join(list_presets("judge")) or "none",
    )
    assert fail(*tokens) == message
    if "Ecco" in message:
        assert message.endswith("Did you mean 'lrmgym/Echo-v0'?") or "Did you mean 'lrmgym/Echo-v0'? " in message


def test_cli_exits_2_with_one_line_and_writes_nothing(tmp_path):
    from click.testing import CliRunner

    from lrmgym.cli.main import cli

    result = CliRunner().invoke(cli, ["run", "env=echo", "learner.lrr=1", f"run.output_dir={tmp_path}"])
    assert result.exit_code == 2
    assert re.fullmatch(
        r"Error: learner\.lrr: unknown key \(value 1\)\. Did you mean 'lr'\? `lrmgym config show` shows all \d+ "
        r"keys of learner with their values\.\n",
        result.output,
    )
    assert list(tmp_path.iterdir()) == []


def test_judges_add_to_accuracy_unless_an_accuracy_or_arena_judge_is_chosen():
    cfg = resolve((*BASE, "judge=format_strict"))
    assert list(cfg.judge) == ["accuracy", "format_strict"]
    assert cfg.judge["accuracy"].kind == "accuracy" and cfg.judge["format_strict"].kind == "format"
    cfg = resolve((*BASE, "judge=format_strict", "judge.accuracy.weight=0", "judge.format_strict.weight=0.5"))
    assert cfg.judge["accuracy"].weight == 0 and cfg.judge["format_strict"].weight == 0.5
    assert list(resolve((*BASE, "judge=arena")).judge) == ["arena"]
    assert list(resolve((*BASE, "judge=[format_loose,accuracy]")).judge) == ["format_loose", "accuracy"]
    assert resolve((*BASE, "judge=none")).judge == {}


def test_a_judge_listed_twice_is_refused_not_merged():
    # judge=[accuracy,accuracy] used to become one accuracy judge silently (issue 36.11).
    assert fail("judge=[accuracy,accuracy]") == (
        "judge: accuracy is listed twice in [accuracy, accuracy]; each preset is one judge, addressed as "
        "judge.accuracy.KEY. To weigh it more, set judge.accuracy.weight=2."
    )
    assert fail("judge=[format_strict,length,format_strict]").startswith("judge: format_strict is listed twice")


@pytest.mark.parametrize(
    ("tokens", "fix"),
    [
        (["learner=ppo"], "GAE"),
        (["learner=reinforce_pp"], "reinforce_pp_baseline"),
        (["learner=grpo", "learner.adv_estimator=reinforce_pp"], "reinforce_pp_baseline"),
    ],
)
def test_the_arena_is_refused_with_advantages_that_do_not_compare_within_a_group(tokens, fix):
    """Tournament rewards (min-max strengths in [0, 1]) mean something only against their own group: an estimator
    that compares a reward with a critic or with the whole batch would pay a routed all-wrong group."""
    with pytest.raises(ConfigError, match=fix) as err:
        resolve(["env=math", "judge=arena", *tokens])
    message = str(err.value)
    assert "\n" not in message and message.startswith("judge.arena:")


@pytest.mark.parametrize("learner", ["grpo", "cispo", "dr_grpo", "rloo", "dapo", "reinforce_pp_baseline"])
def test_the_arena_runs_with_group_relative_advantages(learner):
    tokens = (
        ["learner=grpo", "learner.adv_estimator=reinforce_pp_baseline"]
        if "baseline" in learner
        else [f"learner={learner}"]
    )
    cfg = resolve(["env=math", "judge=arena", *tokens])
    assert cfg.judge["arena"].kind == "arena"

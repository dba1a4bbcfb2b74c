"""backend=openrlhf: the train_ppo_ray argv, checked by OpenRLHF 0.11.2's own parser; the export; `lrmgym run`.

The argv tests run the real ``openrlhf/cli/train_ppo_ray.py`` of the 0.11.2 wheel on the generated flags
(:mod:`openrlhf_wheel`), so a flag OpenRLHF does not know, a value its parser or validation refuses, or a value
that lands on another key fails here; they skip when the wheel cannot be fetched. The refusal, export and CLI tests
need no wheel.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import openrlhf_wheel
import pytest
from click.testing import CliRunner
from openrlhf_wheel import ParseError, parse_train_ppo_ray

from lrmgym.cli.main import cli
from lrmgym.configs.errors import ConfigError
from lrmgym.configs.resolve import resolve, resolve_dict
from lrmgym.integrations import openrlhf_launch
from lrmgym.integrations.openrlhf_launch import (
    FIELDS,
    ExportPaths,
    export_openrlhf,
    launch_script,
    openrlhf_argv,
    plan,
    runtime_env,
)

openrlhf_dir = openrlhf_wheel.openrlhf_dir  # the session fixture: the unpacked 0.11.2 wheel (skips offline)
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
# The learner presets are sized for the tiny CPU model: async rollouts (and, opted in, a wall-clock budget), which
# OpenRLHF cannot express. Two GPUs: the defaults' 8 would need 8 micro batches per step.
BASE = ("env=math", "backend=openrlhf", "policy=hf", f"policy.model={MODEL}", "learner.time_budget_s=null",
        "learner.async_rollouts=false", "backend.gpus_per_node=2")  # fmt: skip


def cfg_of(*tokens: str):
    return resolve([*BASE, *tokens])


def parsed(source: Path, *tokens: str) -> dict:
    return parse_train_ppo_ray(source, openrlhf_argv(cfg_of(*tokens)))


def refusal(*tokens: str, base: tuple[str, ...] = BASE) -> str:
    with pytest.raises(ConfigError) as err:
        plan(resolve([*base, *tokens]))
    return str(err.value)


# ------------------------------------------------------------------------------------------------ presets
# preset, extra tokens, estimator, loss type, loss aggregation, (clip low, high), prompts, samples, train batch
PRESETS = [
    ("grpo", (), "group_norm", "ppo", "seq-mean-token-mean", (0.2, 0.2), 32, 8, 256),
    ("dr_grpo", ("learner.loss_agg=token_mean",), "dr_grpo", "ppo", "token-mean", (0.2, 0.2), 32, 8, 256),
    ("rloo", ("learner.loss_agg=token_mean",), "rloo", "ppo", "token-mean", (0.2, 0.2), 32, 8, 256),
    ("reinforce_pp", (), "reinforce", "ppo", "seq-mean-token-mean", (0.2, 0.2), 32, 8, 256),
    ("reinforce_pp", ("learner.adv_estimator=reinforce_pp_baseline",), "reinforce_baseline", "ppo",
     "seq-mean-token-mean", (0.2, 0.2), 32, 8, 256),
    ("gspo", (), "group_norm", "gspo", "seq-mean-token-mean", (3e-4, 4e-4), 32, 8, 256),
    ("dapo", ("learner.dynamic_sampling=false",), "group_norm", "ppo", "token-mean", (0.2, 0.28), 32, 8, 256),
    ("ppo", (), "gae", "ppo", "seq-mean-token-mean", (0.2, 0.2), 128, 2, 256),
]  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "extra", "estimator", "loss", "agg", "clip", "prompts", "samples", "batch"),
    PRESETS,
    ids=[f"{p[0]}-{p[2]}" for p in PRESETS],
)
def test_learner_presets_parse_with_openrlhfs_own_parser(
    openrlhf_dir, preset, extra, estimator, loss, agg, clip, prompts, samples, batch
):
    args = parsed(openrlhf_dir, f"learner={preset}", *extra)
    assert args["algo.advantage.estimator"] == estimator
    assert args["actor.policy_loss_type"] == loss
    assert args["actor.loss_agg_mode"] == agg
    assert args["actor.eps_clip_low_high"] == pytest.approx(list(clip))
    assert args["rollout.batch_size"] == prompts
    assert args["rollout.n_samples_per_prompt"] == samples
    assert args["train.batch_size"] == batch  # one minibatch: the step's B x G samples
    assert args["train.max_epochs"] == 1
    assert args["actor.adam.lr"] == pytest.approx(4e-4)
    assert args["actor.adam.betas"] == pytest.approx([0.9, 0.99])
    assert args["actor.lr_scheduler"] == "cosine_with_min_lr" and args["actor.min_lr_ratio"] == pytest.approx(0.1)
    assert args["rollout.max_new_tokens"] == 48
    assert args["data.max_len"] == 1024 + 48
    assert args["rollout.temperature"] == 1.0 and args["rollout.top_p"] == 1.0
    assert args["algo.kl.init_coef"] == 0.0 and args["algo.kl.use_loss"] is False
    assert args["actor.model_name_or_path"] == MODEL
    # OpenRLHF's own validation: a critic only for gae (it defaults to the actor's weights), the plug-in as reward.
    assert args["critic.model_name_or_path"] == (MODEL if estimator == "gae" else None)
    assert args["reward.remote_url"] == ["reward_func.py"]
    assert args["data.prompt_dataset"] == "train.jsonl" and args["eval.dataset"] == "eval.jsonl"
    assert (args["data.input_key"], args["data.label_key"]) == ("prompt", "label")
    assert args["train.colocate_all"] is True and args["vllm.num_engines"] == 2
    assert args["actor.num_gpus_per_node"] == 2 and args["ref.num_gpus_per_node"] == 2
    assert args["ckpt.path"] == "checkpoints" and args["ckpt.output_dir"] == "model" and args["ckpt.load_enable"]
    assert args["train.num_episodes"] == 1 and args["ckpt.save_steps"] == 50 and args["ckpt.max_num"] == 2


def test_kl_loss(openrlhf_dir):
    args = parsed(openrlhf_dir, "learner=grpo", "learner.kl_coef=0.04", "learner.kl_estimator=k2")
    assert args["algo.kl.use_loss"] is True
    assert args["algo.kl.estimator"] == "k2"
    assert args["algo.kl.init_coef"] == pytest.approx(0.04)


def test_ppo_critic_gae_and_kl_reward(openrlhf_dir):
    args = parsed(
        openrlhf_dir, "learner=ppo", "learner.kl_reward_coef=0.02", "learner.critic_warmup_steps=3",
        "learner.gamma=0.99", "learner.lam=0.95", "learner.value_clip=0.3", "learner.critic_lr=3e-5",
    )  # fmt: skip
    assert args["algo.advantage.estimator"] == "gae"
    assert (args["algo.kl.use_loss"], args["algo.kl.estimator"]) == (False, "k1")  # a per-token reward penalty
    assert args["algo.kl.init_coef"] == pytest.approx(0.02)
    assert args["critic.freezing_steps"] == 2  # steps 0, 1, 2 train only the critic, as lrmgym's 3 warm-up steps
    assert args["algo.advantage.gamma"] == pytest.approx(0.99)
    assert args["algo.advantage.lambd"] == pytest.approx(0.95)
    assert args["critic.value_clip"] == pytest.approx(0.3)
    assert args["critic.adam.lr"] == pytest.approx(3e-5) and args["critic.lr_scheduler"] == "constant"
    assert args["critic.num_gpus_per_node"] == 2


def test_lora(openrlhf_dir):
    args = parsed(
        openrlhf_dir, "policy.lora.r=16", "policy.lora.alpha=32", "policy.lora.dropout=0.05",
        "policy.lora.target_modules=[q_proj,v_proj]",
    )  # fmt: skip
    assert args["ds.lora.rank"] == 16 and args["ds.lora.alpha"] == 32
    assert args["ds.lora.dropout"] == pytest.approx(0.05)
    assert args["ds.lora.target_modules"] == ["q_proj", "v_proj"]
    plain = parsed(openrlhf_dir, "policy.lora.r=8")
    assert plain["ds.lora.rank"] == 8 and plain["ds.lora.target_modules"] == "all-linear"  # peft's shorthand
    assert parsed(openrlhf_dir)["ds.lora.rank"] == 0


def test_optimizer_schedule_and_minibatches(openrlhf_dir):
    args = parsed(
        openrlhf_dir, "learner.lr_decay=linear", "learner.min_lr_ratio=0", "learner.warmup_steps=30",
        "learner.steps=300", "learner.adam_betas=[0.9,0.95]", "learner.weight_decay=0.01",
        "learner.max_grad_norm=null", "learner.epochs=2", "learner.minibatches=4", "learner.lr=1e-6",
        "learner.temperature=0.7", "learner.top_p=0.95", "learner.max_new_tokens=1024", "backend.max_prompt_tokens=512",
    )  # fmt: skip
    assert args["actor.lr_scheduler"] == "linear"
    assert args["actor.lr_warmup_ratio"] == pytest.approx(0.1)
    assert args["actor.adam.betas"] == pytest.approx([0.9, 0.95])
    assert args["actor.adam.weight_decay"] == pytest.approx(0.01)
    assert args["actor.max_norm"] == 0.0  # no clipping
    assert args["train.max_epochs"] == 2 and args["train.batch_size"] == 64  # 32 x 8 / 4
    assert args["actor.adam.lr"] == pytest.approx(1e-6)
    assert args["rollout.temperature"] == pytest.approx(0.7) and args["rollout.top_p"] == pytest.approx(0.95)
    assert args["rollout.max_new_tokens"] == 1024 and args["data.max_len"] == 512 + 1024
    assert parsed(openrlhf_dir, "learner.lr_decay=constant")["actor.lr_scheduler"] == "constant_with_warmup"


def test_evaluation(openrlhf_dir):
    args = parsed(openrlhf_dir, "eval.n=8", "eval.k=[1,8]", "eval.temperature=0.6", "learner.eval_every=10")
    assert args["eval.steps"] == 10 and args["eval.n_samples_per_prompt"] == 8
    assert args["eval.temperature"] == pytest.approx(0.6) and args["eval.dataset"] == "eval.jsonl"
    after = parsed(openrlhf_dir, "learner.steps=40")  # eval_every 0: once, after the last step
    assert after["eval.steps"] == 40
    none = parsed(openrlhf_dir, "learner.eval_before_after=false")
    assert none["eval.steps"] == -1 and none["eval.dataset"] is None


def test_pg_loss_reinforce_is_ppo_at_ratio_one(openrlhf_dir):
    assert parsed(openrlhf_dir, "learner.pg_loss=reinforce")["actor.policy_loss_type"] == "ppo"
    message = refusal("learner.pg_loss=reinforce", "learner.epochs=2")
    assert "learner.pg_loss='reinforce'" in message and "set learner.epochs=1 learner.minibatches=1" in message


def test_backend_layout(openrlhf_dir):
    args = parsed(
        openrlhf_dir, "backend.colocate=false", "backend.vllm_num_engines=2", "backend.tensor_parallel_size=2",
        "backend.async_train=true", "backend.zero_stage=3", "backend.param_dtype=fp16", "backend.num_nodes=2",
        "backend.gradient_checkpointing=true", "backend.adam_offload=true", "backend.train_micro_batch_size=2",
        "backend.rollout_micro_batch_size=4", "run.seed=7", "backend.extra_args=[--vllm.enforce_eager]",
    )  # fmt: skip
    assert args["train.colocate_all"] is False and args["vllm.enable_sleep"] is False
    assert args["vllm.num_engines"] == 2 and args["vllm.tensor_parallel_size"] == 2
    assert args["train.async_enable"] is True
    assert args["ds.zero_stage"] == 3 and args["ds.param_dtype"] == "fp16"
    assert args["actor.num_nodes"] == 2 and args["ref.num_nodes"] == 2
    assert args["actor.gradient_checkpointing_enable"] is True and args["ds.adam_offload"] is True
    assert args["train.micro_batch_size"] == 2 and args["rollout.micro_batch_size"] == 4
    assert args["train.seed"] == 7
    assert args["vllm.enforce_eager"] is True
    assert args["vllm.gpu_memory_utilization"] == pytest.approx(0.95)  # OpenRLHF's default without colocation


def test_policy_dtype_and_local_folder(openrlhf_dir, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    args = parse_train_ppo_ray(openrlhf_dir, openrlhf_argv(cfg_of(f"policy.model={folder}", "policy.dtype=float16")))
    assert args["actor.model_name_or_path"] == str(folder.resolve())
    assert args["ds.param_dtype"] == "fp16"


def test_the_harness_fails_on_what_openrlhf_refuses(openrlhf_dir):
    with pytest.raises(ParseError, match="unrecognized arguments: --advantage_estimator"):
        parse_train_ppo_ray(openrlhf_dir, ["--advantage_estimator", "group_norm"])  # the flat pre-0.10.2 name
    argv = openrlhf_argv(cfg_of())
    at = argv.index("--rollout.n_samples_per_prompt")
    with pytest.raises(ParseError, match="group_norm requires n_samples_per_prompt > 1"):  # its validation runs
        parse_train_ppo_ray(openrlhf_dir, [*argv[:at], "--rollout.n_samples_per_prompt", "1", *argv[at + 2 :]])


# ------------------------------------------------------------------------------------------------ refusals
def test_the_cpu_sized_presets_are_refused_with_every_fix_at_once():
    base = ("env=math", "backend=openrlhf", "policy=hf", f"policy.model={MODEL}")
    message = refusal("learner=grpo", "learner.time_budget_s=530", base=base)  # the opt-in wall-clock budget
    assert message.startswith(
        "backend=openrlhf cannot run this config as it is; 2 settings to change (nothing was written): "
    )
    assert "learner.time_budget_s=530.0: OpenRLHF has no wall-clock budget" in message
    assert "set learner.time_budget_s=null (the run's length is learner.steps)" in message
    assert "learner.async_rollouts=true:" in message and "set learner.async_rollouts=false" in message
    assert "\n" not in message


def test_lrmgyms_trackers_are_refused_with_openrlhfs_own_logging_as_the_fix():
    message = refusal("run.report_to=[wandb]")
    assert "run.report_to=[wandb]: lrmgym's trackers follow the native loop" in message
    assert "use backend.tensorboard=true, or OpenRLHF's wandb flags in backend.extra_args" in message


def test_the_tiny_policy_is_refused():
    message = refusal("policy=tiny", base=("env=math", "backend=openrlhf"))
    assert message == (
        "policy.kind='tiny': OpenRLHF trains a Hugging Face causal LM that it loads from a model folder or a hub id, "
        "not lrmgym's embedded tiny model; use policy=hf policy.model=/path/to/model-folder (config.json and "
        "weights) or policy.model=ORG/NAME (a hub id, downloaded on the GPU machine)."
    )


@pytest.mark.parametrize(
    ("tokens", "named"),
    [
        (("learner=cispo",), "learner.pg_loss='cispo': OpenRLHF's --actor.policy_loss_type takes ppo or gspo"),
        (("learner=dr_grpo",), "learner.loss_agg='seq_mean_token_sum_norm':"),
        (("learner=rloo",), "set learner.loss_agg=token_mean"),
        (("learner=dapo",), "learner.dynamic_sampling=true: OpenRLHF's dynamic filtering"),
        (
            ("learner=dapo", "learner.dynamic_sampling=false", "learner.overlong_filter=true"),
            "learner.overlong_filter=true:",
        ),
        (("learner=gspo", "learner.loss_agg=token_mean"), "learner.loss_agg='token_mean': OpenRLHF's GSPO"),
        (("learner.ref_refresh_steps=100",), "learner.ref_refresh_steps=100:"),
        (("learner.behavior_logprobs=sampler",), "learner.behavior_logprobs='sampler':"),
        (("learner.window_start=24",), "learner.window_start=24: OpenRLHF has no response-window curriculum"),
        (("learner.stop=[END]",), "learner.stop=[END]: OpenRLHF's sampler takes no stop strings"),
        (("learner.generation_budget=1000",), "learner.generation_budget=1000:"),
        (("learner.minibatches=3",), "learner.minibatches=3: OpenRLHF splits a step's 32 x 8 = 256 samples"),
        (("learner.lr_decay=linear",), "learner.min_lr_ratio=0.1: OpenRLHF's linear schedule"),
        (("learner=ppo", "learner.value_clip=null"), "learner.value_clip=null:"),
        (("learner=ppo", "learner.whiten_advantages=false"), "learner.whiten_advantages=false:"),
        (("learner=ppo", "learner.critic_epochs=2"), "learner.critic_epochs=2:"),
        (("learner=ppo", "learner.kl_coef=0.1", "learner.kl_reward_coef=0.1"), "learner.kl_reward_coef=0.1:"),
        (("policy.lora.r=8", "policy.lora.alpha=12.5"), "policy.lora.alpha=12.5: OpenRLHF's --ds.lora.alpha"),
        (("policy.adapter=/some/adapter",), "policy.adapter='/some/adapter':"),
        (("policy.tokenizer=other/tok",), "policy.tokenizer='other/tok':"),
        (("eval.n=4", "eval.k=[1,2]"), "eval.k=[1, 2]: OpenRLHF reports pass@1 and pass@4"),
        (("eval.top_k=5",), "eval.top_k=5:"),
        (("eval.max_new_tokens=100",), "eval.max_new_tokens=100: OpenRLHF evaluates with the rollouts'"),
        (("eval.stop=[x]",), "eval.stop=[x]:"),
        (("backend.vllm_num_engines=3",), "backend.vllm_num_engines=3: with backend.colocate=true"),
        (("backend.colocate=false",), "backend.vllm_num_engines=null: without colocation"),
        (("backend.train_micro_batch_size=3",), "backend.train_micro_batch_size=3: DeepSpeed needs"),
        (("backend.extra_args=[--actor.adam.lr,1e-5]",), "--actor.adam.lr is set from the lrmgym config"),
    ],
)
def test_unmappable_options_are_refused_by_name(tokens, named):
    message = refusal(*tokens)
    assert named in message
    assert "(nothing was written)" in message or message.startswith(("learner.kind=", "policy.kind="))


@pytest.mark.parametrize(
    ("learner", "why"),
    [
        ("ring_zero", "Ring-Zero is a pipeline of stages (RL with CISPO, self-distillation, RL, RL) and train_ppo_ray "
         "runs one RL stage with no CISPO loss"),
        ("reason_maxxer", "ReasonMaxxer is an offline advantage-weighted fine-tune of sampled rollouts on LoRA, not an "
         "on-policy RL loop, and OpenRLHF has none like it"),
        ("kl_distill learner.teacher=tiny", "KL-LoRA distillation is an offline LoRA fine-tune on a teacher's cached "
         "top-k logits, not an on-policy RL loop, and OpenRLHF has none like it"),
    ],
)  # fmt: skip
def test_learners_without_an_openrlhf_equivalent_are_refused(learner, why):
    learner, *extra = learner.split()
    base = ("env=math", "backend=openrlhf", f"policy.model={MODEL}", "policy=hf")
    message = refusal(f"learner={learner}", *extra, base=base)
    assert message == f"learner.kind='{learner}': {why}; train it with the native backend (backend=native)."


def test_every_learner_policy_and_eval_field_is_classified():
    from lrmgym.configs.schema import RunSection
    from lrmgym.eval.config import EvalConfig
    from lrmgym.learners.algorithms.dapo import DAPOConfig
    from lrmgym.learners.algorithms.grpo import GRPOConfig
    from lrmgym.learners.algorithms.ppo import PPOConfig
    from lrmgym.policies.hf import HFPolicyConfig
    from lrmgym.policies.vllm import VLLMPolicyConfig

    sections = {
        "learner": [GRPOConfig, DAPOConfig, PPOConfig],
        "policy": [HFPolicyConfig, VLLMPolicyConfig],
        "eval": [EvalConfig],
        "run": [RunSection],
    }
    keys = {f"{s}.{name}" for s, models in sections.items() for model in models for name in model.model_fields}
    assert sorted(keys - set(FIELDS)) == []  # a new field must be classified in FIELDS
    assert sorted(set(FIELDS) - keys - {"env", "judge"}) == []  # and FIELDS names no field that is gone
    assert {r.status for r in FIELDS.values()} == {"mapped", "irrelevant", "unmappable"}


@pytest.mark.parametrize(
    "tokens",
    [("learner=grpo",), ("learner=ppo",), ("learner=dapo", "learner.dynamic_sampling=false"),
     ("learner=grpo", "policy=vllm", f"policy.model={MODEL}"), ("policy.lora.r=4",)],
)  # fmt: skip
def test_the_plan_accounts_for_every_key_of_the_config(tokens):
    cfg = cfg_of(*tokens)
    launch = plan(cfg)
    accounted = set(launch.mapped) | set(launch.irrelevant) | set(launch.unused)
    for section in ("learner", "policy", "eval", "run"):
        model = getattr(cfg, section)
        missing = [f"{section}.{name}" for name in type(model).model_fields if f"{section}.{name}" not in accounted]
        assert missing == []
    assert "--actor.adam.lr 0.0004" in launch.mapped["learner.lr"]
    assert launch.irrelevant["learner.torch_threads"].startswith("CPU threads of the native trainer")
    assert "learner.time_budget_s" in launch.unused  # at null here: OpenRLHF has none, nothing is lost


# ------------------------------------------------------------------------------------------------ the config
def test_backend_absent_is_native_and_leaves_saved_configs_as_they_were():
    cfg = resolve(["env=echo", "policy=mock"])
    assert cfg.backend.kind == "native"
    assert "backend" not in cfg.to_dict() and "backend" not in cfg.to_yaml()
    old = {k: v for k, v in cfg.to_dict().items()}  # a config.yaml written before backends existed
    assert resolve_dict(old).backend.kind == "native"
    explicit = resolve(["env=echo", "policy=mock", "backend=native"])
    assert explicit.to_dict() == cfg.to_dict()


def test_backend_openrlhf_implies_the_hf_policy():
    assert resolve(["backend=openrlhf", f"policy.model={MODEL}"]).policy.kind == "hf"
    assert resolve(["backend=openrlhf", "policy=tiny"]).policy.kind == "tiny"  # named: kept (and refused by plan)
    assert resolve(["env=echo"]).policy.kind == "tiny"


def test_backend_openrlhf_round_trips_through_the_saved_config():
    cfg = cfg_of("backend.num_nodes=2", "backend.address=http://10.0.0.1:8265")
    again = resolve_dict(cfg.to_dict())
    assert again.backend == cfg.backend and again.to_dict()["backend"]["num_nodes"] == 2


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (("backend=nope",), "backend: unknown preset 'nope'; allowed: native, openrlhf."),
        (("backend.kind=openrlhff",), "backend.kind: unknown kind 'openrlhff'; allowed: native, openrlhf. Did you "
         "mean 'openrlhf'?"),
        (("backend.num_nodes=2",), "backend.num_nodes: unknown key (value 2); allowed: kind. backend.num_nodes "
         "needs backend=openrlhf: add backend=openrlhf."),
        (("backend=openrlhf", "backend.zero_stage=4"), "backend.zero_stage: invalid value 4; allowed: 0, 1, 2 or 3."),
        (("backend=openrlhf", "backend.async_train=true"), "backend: backend.async_train=true needs "
         "backend.colocate=false: OpenRLHF's async mode samples with vLLM on GPUs of its own while the actor trains "
         "(it refuses vLLM's sleep mode, which colocation needs)."),
    ],
)  # fmt: skip
def test_backend_config_errors(tokens, message):
    with pytest.raises(ConfigError) as err:
        resolve(["env=echo", "policy=mock", *tokens])
    assert str(err.value) == message


# ------------------------------------------------------------------------------------------------ launch.sh
def _command_of(script: str) -> list[str]:
    body = script[script.index("\nexec ") + len("\nexec ") :]
    return shlex.split(body.replace("\\\n", " "))


def test_launch_script_for_a_local_run_and_for_ray_job_submit(tmp_path):
    local = cfg_of()
    argv = openrlhf_argv(local)
    script = launch_script(local, argv, None, "a header\nof two lines")
    assert script.startswith("#!/usr/bin/env bash\n# a header\n# of two lines\nset -euo pipefail\n")
    assert _command_of(script) == ["python", "-m", "openrlhf.cli.train_ppo_ray", *argv]
    submit = cfg_of("backend.address=http://127.0.0.1:8265")
    env = runtime_env(submit, tmp_path)
    script = launch_script(submit, openrlhf_argv(submit), env)
    command = _command_of(script)
    assert command[:6] == ["ray", "job", "submit", "--address", "http://127.0.0.1:8265", "--runtime-env-json"]
    assert json.loads(command[6]) == env
    assert command[7:11] == ["--", "python", "-m", "openrlhf.cli.train_ppo_ray"]
    assert env["working_dir"] == str(tmp_path)
    assert env["py_modules"] == [str(Path(openrlhf_launch.__file__).resolve().parents[1])]  # the lrmgym package
    assert "torch" not in " ".join(env["pip"]) and any(r.startswith("gymnasium") for r in env["pip"])
    path = tmp_path / "launch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "pip" not in runtime_env(cfg_of("backend.pip=[]", "backend.py_modules=false"), tmp_path)


# ------------------------------------------------------------------------------------------------ the export
def _fake_writers(calls: list | None = None, fail: str | None = None):
    def write_data(cfg, out_dir, n_train, n_eval):
        if calls is not None:
            calls.append(("data", n_train, n_eval))
        rows = "".join(json.dumps({"prompt": f"Q{i}", "label": "{}", "datasource": "math"}) + "\n" for i in range(2))
        (Path(out_dir) / "train.jsonl").write_text(rows)
        (Path(out_dir) / "eval.jsonl").write_text(rows)
        if fail == "data":
            raise RuntimeError("the data writer broke")
        return {"train": Path(out_dir) / "train.jsonl", "eval": Path(out_dir) / "eval.jsonl", "warnings": ["w"]}

    def write_plugins(cfg, out_dir, **kwargs):
        (Path(out_dir) / "reward_func.py").write_text("def reward_func(queries, prompts, labels, **kw): ...\n")
        if fail == "plugins":
            raise OSError(28, "No space left on device")
        path = str(Path(out_dir) / "reward_func.py")
        return {"reward_func": path, "agent_func": None, "argv": ["--reward.remote_url", path], "max_turns": 1}

    return write_data, write_plugins


def test_export_writes_the_folder_and_nothing_half_written(tmp_path):
    calls: list = []
    out = tmp_path / "exp"
    result = export_openrlhf(cfg_of("learner.steps=3", "learner.prompts_per_step=4", "eval.tasks=7"), out,
                             writers=_fake_writers(calls), version="9.9")  # fmt: skip
    assert calls == [("data", 12, 7)]  # steps x prompts_per_step training prompts
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml", "eval.jsonl", "export.json", "launch.sh", "reward_func.py", "runtime_env.json", "train.jsonl"
    ]  # fmt: skip
    record = json.loads((out / "export.json").read_text())
    assert record["command"] == result.command == _command_of((out / "launch.sh").read_text())
    assert f"--data.prompt_dataset {out.resolve() / 'train.jsonl'}" in record["mapped"]["env"]
    assert record["plugin"]["argv"] == ["--reward.remote_url", str(out.resolve() / "reward_func.py")]
    assert resolve_dict(__import__("yaml").safe_load((out / "config.yaml").read_text())).backend.kind == "openrlhf"
    assert result.warnings == ["w"] and (out / "launch.sh").stat().st_mode & 0o111
    for fail in ("data", "plugins"):  # a writer's failure leaves no folder, and no temporary sibling
        with pytest.raises((RuntimeError, OSError)):
            export_openrlhf(cfg_of(), tmp_path / f"broken-{fail}", writers=_fake_writers(fail=fail))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


def test_export_refuses_a_full_folder_unless_forced(tmp_path):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "old.txt").write_text("mine")
    with pytest.raises(openrlhf_launch.ExportError, match="exists and is not empty; .* pass --force"):
        export_openrlhf(cfg_of(), out, writers=_fake_writers())
    assert (out / "old.txt").read_text() == "mine"
    export_openrlhf(cfg_of(), out, force=True, writers=_fake_writers())
    assert not (out / "old.txt").exists() and (out / "launch.sh").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]
    with pytest.raises(ConfigError):  # a refused config writes nothing, not even the empty folder
        export_openrlhf(cfg_of("learner.stop=[x]"), tmp_path / "never", writers=_fake_writers())
    assert not (tmp_path / "never").exists()


def _wheel_or_none() -> Path | None:
    """The unpacked wheel, or None offline (a test's other checks still run)."""
    try:
        return openrlhf_wheel.openrlhf_source()
    except pytest.skip.Exception:
        return None


def test_export_for_ray_job_submit_names_files_inside_the_working_dir(tmp_path):
    out = tmp_path / "exp"
    export_openrlhf(cfg_of("backend.address=http://127.0.0.1:8265"), out, writers=_fake_writers())
    command = _command_of((out / "launch.sh").read_text())
    assert json.loads(command[6]) == json.loads((out / "runtime_env.json").read_text())
    assert command[command.index("--data.prompt_dataset") + 1] == "train.jsonl"
    source = _wheel_or_none()
    if source is None:
        pytest.skip("the openrlhf wheel cannot be fetched: the argv was not parsed")
    args = parse_train_ppo_ray(source, command[11:])
    assert args["data.prompt_dataset"] == "train.jsonl" and args["reward.remote_url"] == ["reward_func.py"]
    assert args["ckpt.path"] == str(out.resolve() / "checkpoints")  # outputs: the export folder itself


def _real_writers_or_skip():
    try:
        from lrmgym.integrations.labels import write_data  # noqa: F401
        from lrmgym.integrations.openrlhf_plugins import write_plugins  # noqa: F401
    except ImportError as err:
        pytest.skip(f"the data / plug-in writers are not in this build: {err}")


SMALL = ("learner.steps=2", "learner.prompts_per_step=4", "eval.tasks=3")


def test_cli_export_openrlhf_end_to_end(tmp_path):
    _real_writers_or_skip()
    out = tmp_path / "exp"
    tokens = ["export", "openrlhf", "env=math", "learner=grpo", f"policy.model={MODEL}", *BASE[4:], *SMALL]
    result = CliRunner().invoke(cli, [*tokens, f"out={out}"])
    assert result.exit_code == 0, result.output
    assert f"exported to {out}:" in result.output
    for name in ("train.jsonl", "eval.jsonl", "reward_func.py", "launch.sh", "runtime_env.json", "export.json"):
        assert (out / name).is_file(), name
    assert len((out / "train.jsonl").read_text().splitlines()) == 8
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")], capture_output=True).returncode == 0
    env = json.loads((out / "runtime_env.json").read_text())
    assert env["working_dir"] == str(out.resolve())
    command = json.loads((out / "export.json").read_text())["command"]
    assert command[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
    assert command == _command_of((out / "launch.sh").read_text())
    source = _wheel_or_none()
    if source is not None:
        args = parse_train_ppo_ray(source, command[3:])
        assert Path(args["data.prompt_dataset"]) == out.resolve() / "train.jsonl"
        assert Path(args["reward.remote_url"][0]).is_file() and args["rollout.batch_size"] == 4
    again = CliRunner().invoke(cli, [*tokens, f"out={out}"])
    assert again.exit_code == 2 and "exists and is not empty" in again.output
    assert CliRunner().invoke(cli, [*tokens, f"out={out}", "--force"]).exit_code == 0
    missing = CliRunner().invoke(cli, tokens)
    assert missing.exit_code == 2 and "out=DIR: name the export folder once" in missing.output


def test_cli_run_backend_openrlhf_on_a_machine_without_gpus(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(cli, ["run", *BASE, "learner=grpo", *SMALL, f"run.output_dir={runs}"])
    assert result.exit_code == 1
    # learner=grpo's tiny-model lr and token budget with policy=hf draw their one-line warning first
    lines = [line for line in result.output.splitlines() if not line.startswith("warning: policy=hf with learner")]
    assert len(lines) == 1 and lines[0].startswith("Error: backend=openrlhf cannot launch on this machine: no CUDA GPU")
    assert "Nothing was written" in lines[0]
    assert not runs.exists()


def test_cli_run_dry_run_prints_the_command_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(openrlhf_launch, "_default_writers", lambda: _fake_writers())
    runs = tmp_path / "runs"
    tokens = ["run", "env=math", "backend=openrlhf", f"policy.model={MODEL}", *BASE[4:], *SMALL,  # policy=hf implied
              f"run.output_dir={runs}", "run.name=r1", "--dry-run"]  # fmt: skip
    result = CliRunner().invoke(cli, tokens)
    assert result.exit_code == 0, result.output
    command = shlex.split(result.stdout.strip().splitlines()[-1])
    assert command[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
    assert command[command.index("--data.prompt_dataset") + 1] == str((runs / "r1").absolute() / "train.jsonl")
    assert command[command.index("--actor.model_name_or_path") + 1] == MODEL
    assert not runs.exists()
    native = CliRunner().invoke(cli, ["run", "env=echo", "policy=mock", "--dry-run", f"run.output_dir={runs}"])
    assert native.exit_code == 2 and "--dry-run prints the launch command of backend=openrlhf" in native.output


def test_cli_run_launches_launch_sh_and_keeps_the_run_directory_when_openrlhf_fails(tmp_path, monkeypatch):
    if importlib.util.find_spec("openrlhf") is not None:
        pytest.skip("openrlhf is installed here: launch.sh would really start it")
    monkeypatch.setattr(openrlhf_launch, "_default_writers", lambda: _fake_writers())
    monkeypatch.setattr(openrlhf_launch, "machine_problem", lambda cfg: None)  # as on a GPU machine
    runs = tmp_path / "runs"
    result = CliRunner().invoke(cli, ["run", *BASE, *SMALL, f"run.output_dir={runs}", "run.name=r1"])
    # This interpreter has no openrlhf: `python -m openrlhf.cli.train_ppo_ray` exits 1, after the export was made.
    assert result.exit_code == 1, result.output
    assert f"run directory: {runs / 'r1'}" in result.output
    assert "Error: OpenRLHF exited with code 1; the run directory" in result.output
    assert sorted(p.name for p in (runs / "r1").iterdir()) == [
        "config.yaml", "eval.jsonl", "export.json", "launch.sh", "reward_func.py", "runtime_env.json", "train.jsonl"
    ]  # fmt: skip
    assert sorted(p.name for p in runs.iterdir()) == ["r1"]  # no temporary sibling left
    taken = CliRunner().invoke(cli, ["run", *BASE, *SMALL, f"run.output_dir={runs}", "run.name=r1"])
    assert taken.exit_code == 2 and "already exists" in taken.output


def test_machine_problem_names_what_is_missing(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    problem = openrlhf_launch.machine_problem(cfg_of())
    assert problem is not None and "no CUDA GPU (torch.cuda.is_available() is False)" in problem
    monkeypatch.setattr(openrlhf_launch.shutil, "which", lambda name: None)
    submit = openrlhf_launch.machine_problem(cfg_of("backend.address=http://h:8265"))
    assert submit is not None and re.search(r"`ray` command, which is not on PATH", submit)
    monkeypatch.setattr(openrlhf_launch.shutil, "which", lambda name: "/usr/bin/ray")
    assert openrlhf_launch.machine_problem(cfg_of("backend.address=http://h:8265")) is None


def test_export_paths_default_to_the_export_folders_names():
    paths = ExportPaths()
    assert (paths.train, paths.eval, paths.plugin, paths.plugin_flag) == (
        "train.jsonl", "eval.jsonl", "reward_func.py", "--reward.remote_url"
    )  # fmt: skip

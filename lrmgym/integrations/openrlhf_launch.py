"""OpenRLHF as a training backend: a resolved config becomes ``python -m openrlhf.cli.train_ppo_ray`` argv.

``backend=openrlhf`` trains the configured env, judges and learner with OpenRLHF (0.10.2 to 0.11.x, whose flags
are dotted: ``--algo.advantage.estimator``) on Ray GPUs instead of lrmgym's native loop. This module turns the
resolved :class:`~lrmgym.configs.schema.RunConfig` into what OpenRLHF reads:

- :func:`plan`: the argv, and a record of what every lrmgym key became. Every field of the learner, policy and
  eval configs is in :data:`FIELDS`: *mapped* (to a flag, a data file or the plug-in), *irrelevant* (a knob of
  the native trainer that changes nothing OpenRLHF computes; the reason is recorded) or *unmappable*. An
  unmappable option at a non-default value is refused: one :class:`~lrmgym.configs.errors.ConfigError` lists
  every such key with its value, what OpenRLHF does instead and how to fix it. Nothing is dropped silently;
  where an lrmgym *default* has no OpenRLHF equivalent, the difference is listed in ``export.json``.
- :func:`runtime_env` and :func:`launch_script`: the Ray runtime env that ships lrmgym to the workers (the
  plug-in imports it inside every vLLM actor) and ``launch.sh``: ``python -m ...`` here, or ``ray job submit``
  to ``backend.address``.
- :func:`export_openrlhf`: writes the whole folder (data, plug-in, ``launch.sh``, ``runtime_env.json``,
  ``export.json``, ``config.yaml``) into a temporary sibling and renames it into place, so no half-written
  folder is ever left.
- :func:`machine_problem`: why this machine cannot launch it (no CUDA, no openrlhf), or None.

The prompts and labels are :func:`lrmgym.integrations.labels.write_data`'s, the reward / agent plug-in
:func:`lrmgym.integrations.openrlhf_plugins.write_plugins`'s. Facts about OpenRLHF's flags come from its 0.11.2
``openrlhf/cli/train_ppo_ray.py`` and the code that reads them (``trainer/ppo_utils/experience_maker.py``,
``models/loss.py``, ``trainer/ray/ppo_actor.py``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, model_validator

from lrmgym.configs.errors import ConfigError, show
from lrmgym.configs.schema import StrictModel

__all__ = [
    "ENTRY_POINT",
    "FIELDS",
    "ExportError",
    "OPENRLHF_REQUIREMENT",
    "ExportPaths",
    "ExportResult",
    "LaunchPlan",
    "OpenRLHFBackendConfig",
    "check_out_dir",
    "export_openrlhf",
    "launch_command",
    "launch_script",
    "machine_problem",
    "openrlhf_argv",
    "plan",
    "runtime_env",
]

OPENRLHF_REQUIREMENT = "openrlhf>=0.10.2,<0.12"
"""The OpenRLHF versions whose CLI this argv is written for (dotted flags since 0.10.2)."""
ENTRY_POINT = ("python", "-m", "openrlhf.cli.train_ppo_ray")
"""The command the argv follows."""
LAUNCH_FILE, RUNTIME_ENV_FILE, EXPORT_FILE, CONFIG_FILE = "launch.sh", "runtime_env.json", "export.json", "config.yaml"
CHECKPOINTS_DIR, MODEL_DIR, TENSORBOARD_DIR = "checkpoints", "model", "tensorboard"
"""Where OpenRLHF writes, inside the export folder (or ``backend.output_dir``)."""
INPUT_KEY, LABEL_KEY = "prompt", "label"
"""The data rows' prompt and label columns (lrmgym.integrations.labels writes these)."""
# Requirements OpenRLHF's own environment provides (and pins: reinstalling them in a Ray job would break it).
_PROVIDED_BY_OPENRLHF = {"torch", "transformers", "peft"}


# ------------------------------------------------------------------------------------------------ the config
class OpenRLHFBackendConfig(StrictModel):
    """Train with OpenRLHF (``python -m openrlhf.cli.train_ppo_ray``) on Ray GPUs instead of the native loop.

    The learner, policy and eval sections say *what* is trained (mapped onto OpenRLHF's flags, see
    lrmgym/integrations/openrlhf_launch.py); these keys say *where*: GPUs, vLLM engines, DeepSpeed, Ray.
    """

    kind: Literal["openrlhf"] = "openrlhf"
    """The backend kind."""
    address: str = ""
    """Ray dashboard address to submit the job to (`ray job submit --address`, e.g. http://127.0.0.1:8265); empty:
    launch.sh runs `python -m openrlhf.cli.train_ppo_ray` on this machine, which starts a local Ray itself."""
    num_nodes: int = Field(1, ge=1, le=4096)
    """Nodes of the actor (and of the reference model and critic)."""
    gpus_per_node: int = Field(8, ge=1, le=64)
    """GPUs per node of the actor (and of the reference model and critic)."""
    colocate: bool = True
    """Put the actor, reference, critic and vLLM engines on the same GPUs, sleeping the idle ones
    (--train.colocate_all with vLLM and DeepSpeed sleep mode); false: each takes GPUs of its own."""
    vllm_num_engines: int | None = Field(None, ge=1, le=4096)
    """vLLM engines that sample the rollouts; None: as many as fill the actor's GPUs (num_nodes x gpus_per_node /
    tensor_parallel_size), which colocate requires. Without colocate it must be set."""
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """GPUs per vLLM engine (tensor parallelism)."""
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    """Share of a GPU's memory vLLM may take; None: 0.5 with colocate (the models share the GPU), else
    OpenRLHF's 0.95."""
    zero_stage: Literal[0, 1, 2, 3] = 2
    """DeepSpeed ZeRO stage."""
    param_dtype: Literal["bf16", "fp16"] | None = None
    """Training precision; None: fp16 when policy.dtype is float16, else bf16 (OpenRLHF trains in no other)."""
    train_micro_batch_size: int = Field(4, ge=1, le=65536)
    """Samples per GPU per forward/backward pass of the update (gradient accumulation up to the minibatch)."""
    rollout_micro_batch_size: int = Field(8, ge=1, le=65536)
    """Samples per GPU per forward pass when the rollouts' log-probs (and values) are computed."""
    max_prompt_tokens: int = Field(1024, ge=1, le=1_000_000)
    """Token budget of a prompt (and, in multi-turn envs, of each turn's feedback): with learner.max_new_tokens it
    sets the context OpenRLHF allots (--data.max_len = turns x (max_prompt_tokens + max_new_tokens))."""
    max_len: int | None = Field(None, ge=2, le=10_000_000)
    """--data.max_len itself (prompt + every turn); None: computed as max_prompt_tokens says."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more compute)."""
    adam_offload: bool = False
    """Keep Adam's state in CPU memory (DeepSpeed offload)."""
    async_train: bool = False
    """OpenRLHF's own asynchronous mode (--train.async_enable): vLLM samples the next batch while the actor
    trains, and the PPO ratio's old log-probs are the trainer's. Needs colocate=false."""
    output_dir: str | None = None
    """Where OpenRLHF writes checkpoints/, model/ (the trained weights) and tensorboard/; None: the export folder.
    Give a path the cluster's nodes share when backend.address names a remote cluster."""
    tensorboard: bool = True
    """Write TensorBoard logs (--logger.tensorboard_dir)."""
    py_modules: bool = True
    """Ship this installation's lrmgym package to the Ray workers (runtime_env py_modules); false when lrmgym is
    installed on every node."""
    pip: list[str] | None = None
    """Requirements the Ray job installs for the plug-in (runtime_env pip); None: lrmgym's own requirements but
    torch, transformers and peft (OpenRLHF's environment has them); []: none."""
    extra_args: list[str] = Field(default_factory=list)
    """Further OpenRLHF flags appended to the argv as they are (e.g. ["--vllm.enforce_eager"]); a flag lrmgym
    already sets is refused (set the lrmgym key instead)."""

    @model_validator(mode="after")
    def _check_layout(self) -> OpenRLHFBackendConfig:
        if self.async_train and self.colocate:
            raise ValueError(
                "backend.async_train=true needs backend.colocate=false: OpenRLHF's async mode samples with vLLM on "
                "GPUs of its own while the actor trains (it refuses vLLM's sleep mode, which colocation needs)."
            )
        if self.extra_args and not self.extra_args[0].startswith("--"):
            raise ValueError(
                f"backend.extra_args must start with a flag (--name), got {self.extra_args[0]!r}; e.g. "
                "backend.extra_args=[--vllm.enforce_eager]."
            )
        return self


# ------------------------------------------------------------------------------------------------ the field table
class FieldRule(NamedTuple):
    """How one lrmgym key reaches OpenRLHF: ``status`` is mapped, irrelevant or unmappable; ``text`` says how/why."""

    status: Literal["mapped", "irrelevant", "unmappable"]
    text: str


def _m(text: str) -> FieldRule:
    return FieldRule("mapped", text)


def _i(text: str) -> FieldRule:
    return FieldRule("irrelevant", text)


def _u(text: str) -> FieldRule:
    return FieldRule("unmappable", text)


_NATIVE_ONLY = "a knob of the native trainer's compute; OpenRLHF's micro batches are backend.*_micro_batch_size"
FIELDS: dict[str, FieldRule] = {
    # -- the learner: the kind and its advantages
    "learner.kind": _m("grpo and dapo: a group estimator (learner.adv_estimator); ppo: gae with a critic; ring_zero, "
                       "reason_maxxer and kl_distill are refused (no OpenRLHF equivalent)"),
    "learner.adv_estimator": _m("--algo.advantage.estimator: grpo -> group_norm, dr_grpo -> dr_grpo, rloo -> rloo, "
                                "reinforce_pp -> reinforce, reinforce_pp_baseline -> reinforce_baseline"),
    "learner.drop_zero_advantage": _i("leaving zero-advantage samples out of the update changes no gradient (the "
                                      "loss's normaliser still counts them); OpenRLHF keeps them"),
    # -- the run's length, budgets, evaluation, checkpoints, logging (LoopConfig)
    "learner.steps": _m("train.jsonl holds steps x prompts_per_step prompts, read once (--train.num_episodes 1)"),
    "learner.time_budget_s": _u("OpenRLHF has no wall-clock budget: its run ends when train.jsonl runs out"),
    "learner.generation_budget": _u("OpenRLHF has no sampling budget: its run ends when train.jsonl runs out"),
    "learner.eval_before_after": _m("--eval.steps learner.steps when eval_every is 0 (after the last step); "
                                    "OpenRLHF never evaluates before training"),
    "learner.eval_greedy": _m("false: as OpenRLHF, which evaluates at --eval.temperature only; true (the default) "
                              "has no equivalent (export.json says so)"),
    "learner.eval_every": _m("--eval.steps"),
    "learner.checkpoint_every": _m("--ckpt.save_steps (DeepSpeed checkpoints in checkpoints/, resumed by "
                                   "--ckpt.load_enable when launch.sh runs again)"),
    "learner.keep_checkpoints": _m("--ckpt.max_num"),
    "learner.log_samples": _i("the native samples.jsonl; OpenRLHF logs one sample per step itself"),
    "learner.torch_threads": _i("CPU threads of the native trainer; OpenRLHF's GPU workers set their own"),
    "learner.progress": _i("the native progress bar; OpenRLHF shows its own"),
    "learner.idle_steps_per_s": _i("the native run's expected speed, for its progress and summary lines"),
    "learner.max_failed_steps": _i("the native loop's stop after steps that graded nothing; OpenRLHF trains on"),
    # -- the update (PolicyGradientConfig)
    "learner.lr": _m("--actor.adam.lr"),
    "learner.warmup_steps": _m("--actor.lr_warmup_ratio warmup_steps / steps"),
    "learner.lr_decay": _m("--actor.lr_scheduler: constant -> constant_with_warmup, cosine -> cosine_with_min_lr, "
                           "linear -> linear (which ends at 0: min_lr_ratio must be 0)"),
    "learner.min_lr_ratio": _m("--actor.min_lr_ratio (cosine); linear needs 0; unused by constant"),
    "learner.weight_decay": _m("--actor.adam.weight_decay (OpenRLHF exempts biases and norm weights)"),
    "learner.adam_betas": _m("--actor.adam.betas (and --critic.adam.betas)"),
    "learner.fp32_master": _i("the native optimizer's; DeepSpeed's bf16 training keeps float32 master weights"),
    "learner.max_grad_norm": _m("--actor.max_norm (None -> 0: no clipping)"),
    "learner.epochs": _m("--train.max_epochs"),
    "learner.minibatches": _m("--train.batch_size = prompts_per_step x group_size / minibatches"),
    "learner.micro_batch_size": _i(_NATIVE_ONLY),
    "learner.micro_batch_tokens": _i(_NATIVE_ONLY),
    "learner.shared_prefix": _i("a native compute saving with the same result (the prompt runs once per group)"),
    "learner.lean_forward": _i("a native compute saving with the same result (the lean Llama training forward)"),
    "learner.compile": _i("a native compute saving with the same result (torch.compile of the lean forward)"),
    "learner.update_threads": _i("CPU threads of the native update; OpenRLHF's GPU workers run their own"),
    "learner.pg_loss": _m("--actor.policy_loss_type: ppo_clip -> ppo, gspo -> gspo, reinforce -> ppo with one "
                          "optimizer step per rollout (ratio 1); cispo is refused"),
    "learner.clip_low": _m("--actor.eps_clip_low_high LOW HIGH"),
    "learner.clip_high": _m("--actor.eps_clip_low_high LOW HIGH"),
    "learner.is_cap": _u("cispo's importance-weight cap; OpenRLHF has no cispo"),
    "learner.is_cap_mode": _u("cispo's importance-weight cap; OpenRLHF has no cispo"),
    "learner.loss_agg": _m("--actor.loss_agg_mode: seq_mean_token_mean -> seq-mean-token-mean, token_mean -> "
                           "token-mean; seq_mean_token_sum_norm is refused"),
    "learner.kl_coef": _m("--algo.kl.use_loss --algo.kl.init_coef (0: --algo.kl.init_coef 0, no reference model)"),
    "learner.kl_estimator": _m("--algo.kl.estimator, with the KL loss (kl_coef > 0)"),
    "learner.track_kl": _i("logging only; OpenRLHF logs the KL when it has a reference model (a KL term)"),
    "learner.track_kl_every": _i("logging only"),
    "learner.ref_refresh_steps": _u("OpenRLHF's reference model is the initial policy throughout"),
    "learner.behavior_logprobs": _u("OpenRLHF's PPO ratio takes the trainer's recomputed log-probs (recompute); "
                                    "the sampler's (sampler) have no flag"),
    # -- the rollouts (RolloutConfig)
    "learner.prompts_per_step": _m("--rollout.batch_size"),
    "learner.group_size": _m("--rollout.n_samples_per_prompt"),
    "learner.max_new_tokens": _m("--rollout.max_new_tokens, and --data.max_len with backend.max_prompt_tokens"),
    "learner.window_start": _u("OpenRLHF has no response-window curriculum: --rollout.max_new_tokens is fixed"),
    "learner.window_every_steps": _i("read only with window_start, which is refused"),
    "learner.temperature": _m("--rollout.temperature (OpenRLHF's log-probs are tempered too)"),
    "learner.top_p": _m("--rollout.top_p"),
    "learner.stop": _u("OpenRLHF's sampler takes no stop strings"),
    "learner.max_turns": _m("the plug-in's turn limit (write_plugins) and --data.max_len"),
    "learner.async_rollouts": _u("lrmgym's async rollouts take the sampler's log-probs as the ratio's old ones; "
                                 "OpenRLHF's async mode (backend.async_train) the trainer's"),
    "learner.async_stall_s": _i("read only with learner.async_rollouts, which is refused"),
    # -- DAPO
    "learner.dynamic_sampling": _u("OpenRLHF's dynamic filtering drops a group by its mean score (outside (0, 1)), "
                                   "refills without a round cap and consumes train.jsonl as it goes"),
    "learner.refill_prompts": _i("read only with dynamic_sampling, which is refused"),
    "learner.max_rounds": _i("read only with dynamic_sampling, which is refused"),
    "learner.overlong_filter": _u("OpenRLHF cannot mask truncated samples out of the loss and the group statistics"),
    # -- PPO
    "learner.gamma": _m("--algo.advantage.gamma"),
    "learner.lam": _m("--algo.advantage.lambd"),
    "learner.critic": _m("OpenRLHF's critic: a copy of the policy with a value head, trained end to end (critic="
                         "model); critic=head (a head on the detached policy) becomes that too (export.json says so)"),
    "learner.critic_lr": _m("--critic.adam.lr with --critic.lr_scheduler constant"),
    "learner.critic_epochs": _u("OpenRLHF's critic trains --train.max_epochs passes, the actor's"),
    "learner.value_clip": _m("--critic.value_clip (None, the plain squared error, is refused)"),
    "learner.critic_warmup_steps": _m("--critic.freezing_steps critic_warmup_steps - 1 (OpenRLHF freezes the actor "
                                      "while the step index, from 0, is at most freezing_steps)"),
    "learner.kl_reward_coef": _m("--algo.kl.init_coef with --algo.kl.estimator k1 and no KL loss: the per-token "
                                 "reward penalty -coef x (log pi_old - log pi_ref)"),
    "learner.tis_cap": _u("the native engine's truncated importance sampling; OpenRLHF corrects its vLLM engines' "
                          "gap with its own --algo.advantage.is_correction_* options, not mapped from this cap"),
    "learner.whiten_advantages": _m("OpenRLHF whitens GAE's advantages over the batch's tokens (false is refused)"),
    # -- the policy (hf, vllm)
    "policy.kind": _m("hf and vllm: --actor.model_name_or_path policy.model; tiny, mock and openai are refused"),
    "policy.model": _m("--actor.model_name_or_path (a local folder as an absolute path, else the hub id)"),
    "policy.tokenizer": _u("OpenRLHF loads the tokenizer of --actor.model_name_or_path"),
    "policy.dtype": _m("--ds.param_dtype: float16 -> fp16, else bf16 (backend.param_dtype overrides)"),
    "policy.device": _i("the native trainer's device; OpenRLHF places its workers on the backend's GPUs"),
    "policy.lora": _m("--ds.lora.rank / alpha / dropout / target_modules"),
    "policy.adapter": _u("OpenRLHF starts LoRA adapters fresh; it cannot load a trained one"),
    "policy.chat_template": _m("--data.apply_chat_template when the env's prompts are chat messages"),
    "policy.answer_instruction": _i("the native policy's system message; the export writes the env's prompts as "
                                    "they are (for a real model: env.style=instruct env.chat=true)"),
    "policy.batch_size": _i("the native sampler's batch; OpenRLHF's vLLM engines batch themselves"),
    "policy.attn_implementation": _i("the native model's kernel; OpenRLHF's workers choose their own"),
    "policy.gradient_checkpointing": _i("the native trainer's; OpenRLHF's is backend.gradient_checkpointing"),
    "policy.trust_remote_code": _m("OpenRLHF always loads with trust_remote_code=True (export.json says so)"),
    "policy.max_model_len": _i("the native vLLM engine's; OpenRLHF's engines get --data.max_len"),
    "policy.gpu_memory_utilization": _i("the native vLLM engine's; see backend.vllm_gpu_memory_utilization"),
    "policy.enforce_eager": _m("--vllm.enforce_eager"),
    "policy.seed": _i("the native vLLM engine's seed; OpenRLHF seeds engine i with --train.seed + i"),
    "policy.engine": _i("the native hf policy's rollout engine (lean, or a colocated vLLM); OpenRLHF always "
                        "samples with its own vLLM engines"),
    "policy.engine_kwargs": _u("OpenRLHF builds its vLLM engines without extra keyword arguments"),
    # -- evaluation
    "eval.n": _m("--eval.n_samples_per_prompt"),
    "eval.k": _m("OpenRLHF reports eval_*_pass1 and eval_*_pass{n}: k may be 1 and n, no other"),
    "eval.tasks": _m("eval.jsonl holds that many tasks (--eval.dataset)"),
    "eval.split": _m("the split eval.jsonl's tasks come from (write_data)"),
    "eval.temperature": _m("--eval.temperature"),
    "eval.top_p": _u("OpenRLHF evaluates with the rollouts' top_p (learner.top_p)"),
    "eval.top_k": _u("OpenRLHF's sampler applies no top-k"),
    "eval.max_new_tokens": _u("OpenRLHF evaluates with the rollouts' budget (learner.max_new_tokens)"),
    "eval.stop": _u("OpenRLHF's sampler takes no stop strings"),
    "eval.seed": _m("the task stream of eval.jsonl (write_data)"),
    "eval.batch_size": _i("the native evaluation's batch; OpenRLHF's vLLM engines batch themselves"),
    "eval.pass_threshold": _u("OpenRLHF's pass1 is the mean reward and pass{n} the best, with no threshold"),
    "eval.confidence": _i("lrmgym's bootstrap intervals; OpenRLHF reports none"),
    "eval.bootstrap": _i("lrmgym's bootstrap intervals; OpenRLHF reports none"),
    # -- the run, the env and the judges
    "run.seed": _m("--train.seed, and the seeds of train.jsonl and eval.jsonl (write_data)"),
    "run.name": _i("names the run directory of `lrmgym run`"),
    "run.output_dir": _i("holds the run directory of `lrmgym run`"),
    "run.report_to": _u("lrmgym's trackers follow the native loop; OpenRLHF logs through its own --logger.* flags"),
    "env": _m("train.jsonl / eval.jsonl labels (write_data) and the plug-in (write_plugins)"),
    "judge": _m("the plug-in's reward (write_plugins)"),
}  # fmt: skip
"""Every lrmgym key backend=openrlhf reads, and how (tests/integrations/test_openrlhf_argv.py checks each learner,
policy and eval field is here)."""

# The lrmgym advantage estimators and their OpenRLHF names (--algo.advantage.estimator, experience_maker.py).
# reinforce_pp is OpenRLHF's "reinforce", not "reinforce_baseline": lrmgym's reinforce_pp whitens the raw rewards
# over the whole batch with no group baseline, which is what "reinforce" does (the return, whitened over the
# batch); "reinforce_baseline" first subtracts each prompt's group mean, which is lrmgym's reinforce_pp_baseline.
# Both OpenRLHF estimators whiten over the batch's tokens, lrmgym's over its samples (each once): the same when
# the completions are equally long (lrmgym/learners/algorithms/advantages.py says so of its own estimator).
ESTIMATORS = {
    "grpo": "group_norm",
    "dr_grpo": "dr_grpo",
    "rloo": "rloo",
    "reinforce_pp": "reinforce",
    "reinforce_pp_baseline": "reinforce_baseline",
}
LOSS_AGG_MODES = {"seq_mean_token_mean": "seq-mean-token-mean", "token_mean": "token-mean"}
"""lrmgym's loss aggregations and OpenRLHF's --actor.loss_agg_mode."""
_LR_SCHEDULERS = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr", "linear": "linear"}
# Options OpenRLHF can express at one value only: (that value, the fix) of each; any other value is refused.
_ONLY: dict[str, tuple[Any, str]] = {
    "learner.time_budget_s": (None, "set learner.time_budget_s=null (the run's length is learner.steps)"),
    "learner.generation_budget": (None, "set learner.generation_budget=null (the run's length is learner.steps)"),
    "learner.window_start": (None, "set learner.window_start=null"),
    "learner.stop": ([], "set learner.stop=[]"),
    "learner.ref_refresh_steps": (None, "set learner.ref_refresh_steps=null"),
    "learner.behavior_logprobs": ("recompute", "set learner.behavior_logprobs=recompute"),
    "learner.async_rollouts": (False, "set learner.async_rollouts=false (or add backend.async_train=true "
                               "backend.colocate=false for OpenRLHF's own async mode)"),
    "learner.dynamic_sampling": (False, "set learner.dynamic_sampling=false (or add OpenRLHF's filter yourself: "
                                 "backend.extra_args=[--algo.dynamic_filtering_enable])"),
    "learner.overlong_filter": (False, "set learner.overlong_filter=false (judge=overlong shapes the reward instead)"),
    "learner.is_cap": (None, "leave learner.is_cap unset"),
    "learner.is_cap_mode": ("relative", "leave learner.is_cap_mode unset"),
    "policy.adapter": (None, "merge the adapter into its base model (peft's merge_and_unload) and give that folder "
                       "as policy.model"),
    "policy.engine_kwargs": ({}, "set policy.engine_kwargs={}"),
    "eval.top_k": (0, "set eval.top_k=0"),
    "eval.stop": ([], "set eval.stop=[]"),
    "eval.pass_threshold": (1.0, "set eval.pass_threshold=1.0"),
    "run.report_to": ((), "set run.report_to=[] and use backend.tensorboard=true, or OpenRLHF's wandb flags in "
                      "backend.extra_args=[--logger.wandb.key,...]"),
}  # fmt: skip
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ------------------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class ExportPaths:
    """The paths the argv names, as OpenRLHF will read them (absolute, or relative to Ray's working_dir)."""

    train: str = "train.jsonl"
    """The training prompts (--data.prompt_dataset)."""
    eval: str | None = "eval.jsonl"
    """The evaluation prompts (--eval.dataset); None: no evaluation data."""
    plugin: str = "reward_func.py"
    """The plug-in file."""
    plugin_flag: str = "--reward.remote_url"
    """--reward.remote_url (a single-turn reward_func.py) or --train.agent_func_path (an agent_func.py)."""
    checkpoints: str = CHECKPOINTS_DIR
    """--ckpt.path: DeepSpeed checkpoints."""
    model: str = MODEL_DIR
    """--ckpt.output_dir: the trained model."""
    tensorboard: str = TENSORBOARD_DIR
    """--logger.tensorboard_dir."""


@dataclass
class LaunchPlan:
    """The argv of ``train_ppo_ray`` and what each lrmgym key became."""

    argv: list[str]
    """The flags after ``python -m openrlhf.cli.train_ppo_ray``."""
    mapped: dict[str, list[str]] = field(default_factory=dict)
    """lrmgym key -> the flags (or files) it set."""
    irrelevant: dict[str, str] = field(default_factory=dict)
    """lrmgym key -> why OpenRLHF does not need it."""
    unused: dict[str, str] = field(default_factory=dict)
    """lrmgym key -> what OpenRLHF lacks: options it cannot express, here at their defaults (so nothing is lost)."""
    differences: list[str] = field(default_factory=list)
    """What OpenRLHF does differently from lrmgym at lrmgym's defaults (nothing the config set is dropped)."""


def _arg(value: Any) -> str:
    """A value as an argv word: floats in their shortest exact form (4e-4 -> '0.0004')."""
    if isinstance(value, bool):
        raise TypeError("a switch has no value")  # a programming error: use _Mapper.switch
    if isinstance(value, float):
        return repr(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


class _Mapper:
    """Collects the argv, what each key mapped to, the differences and the refusals."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self.mapped: dict[str, list[str]] = {}
        self.differences: list[str] = []
        self.refusals: list[str] = []

    def _record(self, keys: str | Sequence[str], text: str) -> None:
        for key in [keys] if isinstance(keys, str) else keys:
            self.mapped.setdefault(key, []).append(text)

    def flag(self, keys: str | Sequence[str], name: str, *values: Any) -> None:
        words = [_arg(v) for v in values]
        self.argv += [name, *words]
        self._record(keys, " ".join([name, *words]))

    def switch(self, keys: str | Sequence[str], name: str) -> None:
        self.argv.append(name)
        self._record(keys, name)

    def record(self, keys: str | Sequence[str], text: str) -> None:
        self._record(keys, text)

    def refuse(self, key: str, value: Any, why: str, fix: str) -> None:
        self.refusals.append(f"{key}={show(value)}: {why}; {fix}")

    def differ(self, text: str) -> None:
        self.differences.append(text)

    def only(self, section: str, model: Any, names: Sequence[str]) -> None:
        """Refuse each of ``names`` (a field of ``model``) set to another value than the one OpenRLHF has (_ONLY)."""
        for name in names:
            if name not in type(model).model_fields:
                continue
            key = f"{section}.{name}"
            value, (expressible, fix) = getattr(model, name), _ONLY[key]
            if value != expressible:
                self.refuse(key, value, FIELDS[key].text, fix)


def plan(
    cfg: Any, paths: ExportPaths | None = None, *, chat_prompts: bool = False, turns: int | None = None
) -> LaunchPlan:
    """The ``train_ppo_ray`` argv of ``cfg`` (``backend.kind`` openrlhf) and what every key became.

    Args:
        cfg: A resolved :class:`~lrmgym.configs.schema.RunConfig`.
        paths: Where the argv says the data, plug-in and outputs are; default: the export folder's names,
            relative (as :func:`export_openrlhf` lays them out).
        chat_prompts: The env's prompts are chat messages (OpenRLHF then applies the tokenizer's chat template).
        turns: Policy turns per episode (the plug-in's); None: learner.max_turns, else the env's max_turns option,
            else 1. Sizes --data.max_len.

    Raises:
        ConfigError: ``cfg`` sets options OpenRLHF cannot express (every one is named, with its fix), or the
            backend's GPU layout does not fit the batch sizes.
    """
    backend = cfg.backend
    if getattr(backend, "kind", None) != "openrlhf":
        raise ConfigError(
            f"backend.kind: {show(getattr(backend, 'kind', None))} is not 'openrlhf'; add backend=openrlhf."
        )
    paths = paths or ExportPaths()
    m = _Mapper()
    _map_policy(m, cfg.policy, backend)
    _check_learner_kind(cfg.learner)
    _map_data(m, cfg, paths, chat_prompts)
    _map_learner(m, cfg.learner, cfg, turns)
    _map_eval(m, cfg.eval, cfg.learner, paths)
    _map_outputs(m, cfg.learner, paths, backend)
    _map_resources(m, cfg, backend)
    _map_extra(m, backend)
    if m.refusals:
        many = f"{len(m.refusals)} settings" if len(m.refusals) > 1 else "1 setting"
        raise ConfigError(
            f"backend=openrlhf cannot run this config as it is; {many} to change (nothing was written): "
            + "; ".join(m.refusals)
            + "."
        )
    m.differences += _STANDING_DIFFERENCES
    irrelevant = {k: r.text for k, r in FIELDS.items() if r.status == "irrelevant" and _present(cfg, k)}
    unused = {
        k: r.text for k, r in FIELDS.items() if r.status == "unmappable" and _present(cfg, k) and k not in m.mapped
    }
    return LaunchPlan(m.argv, m.mapped, irrelevant, unused, m.differences)


def openrlhf_argv(cfg: Any, paths: ExportPaths | None = None, *, chat_prompts: bool = False) -> list[str]:
    """The flags :func:`plan` maps ``cfg`` to (after ``python -m openrlhf.cli.train_ppo_ray``)."""
    return plan(cfg, paths, chat_prompts=chat_prompts).argv


def _present(cfg: Any, key: str) -> bool:
    section, _, name = key.partition(".")
    model = getattr(cfg, section, None)
    return not name or (model is not None and name in type(model).model_fields)


# ------------------------------------------------------------------------------------------------ sections
def _map_policy(m: _Mapper, policy: Any, backend: OpenRLHFBackendConfig) -> None:
    kind = getattr(policy, "kind", None)
    if kind not in ("hf", "vllm"):
        what = {
            "tiny": "lrmgym's embedded tiny model",
            "mock": "a mock policy, which has no weights",
            "openai": "a policy behind an HTTP server, whose weights OpenRLHF cannot reach",
        }.get(kind, f"a {kind!r} policy")
        raise ConfigError(
            f"policy.kind={show(kind)}: OpenRLHF trains a Hugging Face causal LM that it loads from a model folder "
            f"or a hub id, not {what}; use policy=hf policy.model=/path/to/model-folder (config.json and weights) "
            "or policy.model=ORG/NAME (a hub id, downloaded on the GPU machine)."
        )
    m.flag(("policy.kind", "policy.model"), "--actor.model_name_or_path", _model_ref(policy.model))
    if policy.tokenizer is not None and policy.tokenizer != policy.model:
        m.refuse("policy.tokenizer", policy.tokenizer, FIELDS["policy.tokenizer"].text,
                 "set policy.tokenizer=null (save the tokenizer into the model folder)")  # fmt: skip
    dtype = backend.param_dtype or ("fp16" if policy.dtype == "float16" else "bf16")
    m.flag(("policy.dtype", "backend.param_dtype"), "--ds.param_dtype", dtype)
    if backend.param_dtype is None and policy.dtype not in ("float16", "bfloat16"):
        m.differ(f"policy.dtype={show(policy.dtype)}: OpenRLHF trains in bf16 or fp16 only; it trains in {dtype}")
    m.only("policy", policy, ["adapter", "engine_kwargs"])
    lora = getattr(policy, "lora", None)
    if lora is not None:
        m.flag("policy.lora", "--ds.lora.rank", lora.r)
        if float(lora.alpha).is_integer():
            m.flag("policy.lora", "--ds.lora.alpha", int(lora.alpha))
        else:
            m.refuse("policy.lora.alpha", lora.alpha, "OpenRLHF's --ds.lora.alpha is an integer",
                     f"set policy.lora.alpha to an integer such as {round(lora.alpha)}")  # fmt: skip
        m.flag("policy.lora", "--ds.lora.dropout", float(lora.dropout))
        modules = [lora.target_modules] if isinstance(lora.target_modules, str) else list(lora.target_modules)
        if modules != ["all-linear"]:  # OpenRLHF's default is the string peft reads as every linear layer
            m.flag("policy.lora", "--ds.lora.target_modules", *modules)
        else:
            m.record("policy.lora", "--ds.lora.target_modules all-linear (OpenRLHF's default)")
    else:
        m.record("policy.lora", "no LoRA (--ds.lora.rank 0, OpenRLHF's default): every weight trains")
    if getattr(policy, "enforce_eager", False):
        m.switch("policy.enforce_eager", "--vllm.enforce_eager")
    elif hasattr(policy, "enforce_eager"):
        m.record("policy.enforce_eager", "false: CUDA graphs on (OpenRLHF's default)")
    if getattr(policy, "trust_remote_code", None) is not None:
        m.record("policy.trust_remote_code", "OpenRLHF loads with trust_remote_code=True whatever it says")
    if not getattr(policy, "trust_remote_code", True):
        m.differ("policy.trust_remote_code=false: OpenRLHF loads the model and tokenizer with trust_remote_code=True, "
                 "so code in the model folder runs; give it a folder you trust")  # fmt: skip


def _model_ref(model: str) -> str:
    """``policy.model`` as OpenRLHF should see it: an existing folder as an absolute path, else the hub id."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"policy.model={show(model)}: is a file; give the model folder (with config.json).")
        return str(path.resolve())
    if path.is_absolute() or _HUB_ID.match(model):
        return model  # a folder on the GPU machine, or a hub id OpenRLHF downloads there
    raise ConfigError(
        f"policy.model={show(model)}: no such folder here, and not a hub id (ORG/NAME); give an absolute path (a "
        "folder on the GPU machine) or a hub id."
    )


def _check_learner_kind(learner: Any) -> None:
    kind = getattr(learner, "kind", None)
    reasons = {
        "ring_zero": "Ring-Zero is a pipeline of stages (RL with CISPO, self-distillation, RL, RL) and "
        "train_ppo_ray runs one RL stage with no CISPO loss",
        "reason_maxxer": "ReasonMaxxer is an offline advantage-weighted fine-tune of sampled rollouts on LoRA, not "
        "an on-policy RL loop, and OpenRLHF has none like it",
        "kl_distill": "KL-LoRA distillation is an offline LoRA fine-tune on a teacher's cached top-k logits, not an "
        "on-policy RL loop, and OpenRLHF has none like it",
    }
    if kind in reasons:
        raise ConfigError(
            f"learner.kind={show(kind)}: {reasons[kind]}; train it with the native backend (backend=native)."
        )
    if kind not in ("grpo", "dapo", "ppo"):
        raise ConfigError(
            f"learner.kind={show(kind)}: backend=openrlhf knows no OpenRLHF mapping for this learner; mapped kinds: "
            "dapo, grpo, ppo (and the presets over them); train it with backend=native."
        )


def _map_data(m: _Mapper, cfg: Any, paths: ExportPaths, chat_prompts: bool) -> None:
    m.flag(("env", "learner.steps", "run.seed"), "--data.prompt_dataset", paths.train)
    m.flag("env", "--data.input_key", INPUT_KEY)
    m.flag(("env", "judge"), "--data.label_key", LABEL_KEY)
    m.flag(("env", "judge", "learner.max_turns"), paths.plugin_flag, paths.plugin)
    if chat_prompts:
        if getattr(cfg.policy, "chat_template", True):
            m.switch(("env", "policy.chat_template"), "--data.apply_chat_template")
        else:
            m.refuse("policy.chat_template", False, "the env's prompts are chat messages, which OpenRLHF feeds "
                     "through the tokenizer's chat template only", "set policy.chat_template=true")  # fmt: skip
    else:
        m.record("policy.chat_template", "text prompts: fed as they are, as the native policy does")


def _map_learner(m: _Mapper, lc: Any, cfg: Any, turns: int | None) -> None:
    m.flag("learner.steps", "--train.num_episodes", 1)
    m.record("learner.steps", f"train.jsonl: {lc.steps} x {lc.prompts_per_step} = {lc.steps * lc.prompts_per_step} "
             "prompts")  # fmt: skip
    m.only(
        "learner", lc,
        ["time_budget_s", "generation_budget", "window_start", "stop", "ref_refresh_steps", "behavior_logprobs",
         "async_rollouts", "dynamic_sampling", "overlong_filter", "is_cap", "is_cap_mode"],
    )  # fmt: skip
    if lc.eval_greedy:
        m.differ("learner.eval_greedy=true: OpenRLHF has no greedy evaluation beside the sampled one")
    m.record("learner.eval_greedy", "false: OpenRLHF evaluates at --eval.temperature only" if not lc.eval_greedy
             else "true: no OpenRLHF equivalent (a difference)")  # fmt: skip
    _map_advantages(m, lc)
    _map_loss(m, lc)
    _map_kl(m, lc)
    _map_optimizer(m, lc)
    # One step: B prompts x G samples; the update: epochs x minibatches optimizer steps over them.
    samples = lc.prompts_per_step * lc.group_size
    m.flag("learner.prompts_per_step", "--rollout.batch_size", lc.prompts_per_step)
    m.flag("learner.group_size", "--rollout.n_samples_per_prompt", lc.group_size)
    if samples % lc.minibatches:
        m.refuse("learner.minibatches", lc.minibatches,
                 f"OpenRLHF splits a step's {lc.prompts_per_step} x {lc.group_size} = {samples} samples into equal "
                 "minibatches of --train.batch_size", f"choose a divisor of {samples}")  # fmt: skip
    else:
        m.flag(("learner.minibatches", "learner.prompts_per_step", "learner.group_size"), "--train.batch_size",
               samples // lc.minibatches)  # fmt: skip
    m.flag("learner.epochs", "--train.max_epochs", lc.epochs)
    m.flag("learner.max_new_tokens", "--rollout.max_new_tokens", lc.max_new_tokens)
    m.flag("learner.temperature", "--rollout.temperature", lc.temperature)
    m.flag("learner.top_p", "--rollout.top_p", lc.top_p)
    backend = cfg.backend
    turns = int(turns or lc.max_turns or cfg.env.options.get("max_turns") or 1)
    max_len = backend.max_len or turns * (backend.max_prompt_tokens + lc.max_new_tokens)
    if max_len <= lc.max_new_tokens:
        m.refuse("backend.max_len", backend.max_len, f"it leaves no room for a prompt beside learner.max_new_tokens="
                 f"{lc.max_new_tokens}", "raise it or set backend.max_len=null")  # fmt: skip
    m.flag(("backend.max_len", "backend.max_prompt_tokens", "learner.max_new_tokens", "learner.max_turns"),
           "--data.max_len", max_len)  # fmt: skip
    if turns > 1:
        m.differ(f"{turns} turns: OpenRLHF's multi-turn executor lets each turn generate what is left of "
                 f"--data.max_len ({max_len}), not learner.max_new_tokens, and its advantages are per trajectory "
                 "(one reward, on the last token)")  # fmt: skip
    if lc.kind == "ppo":
        _map_critic(m, lc)


def _map_advantages(m: _Mapper, lc: Any) -> None:
    if lc.kind == "ppo":
        m.flag("learner.kind", "--algo.advantage.estimator", "gae")
        m.flag("learner.gamma", "--algo.advantage.gamma", lc.gamma)
        m.flag("learner.lam", "--algo.advantage.lambd", lc.lam)
        if not lc.whiten_advantages:
            m.refuse("learner.whiten_advantages", False, "OpenRLHF always whitens GAE's advantages over the batch "
                     "(--algo.advantage.no_std_norm keeps the mean subtraction)",
                     "set learner.whiten_advantages=true")  # fmt: skip
        else:
            m.record("learner.whiten_advantages", "OpenRLHF whitens GAE's advantages over the batch's tokens")
        return
    estimator = ESTIMATORS.get(lc.adv_estimator)
    if estimator is None:
        m.refuse("learner.adv_estimator", lc.adv_estimator, "OpenRLHF has no such --algo.advantage.estimator",
                 f"use one of {', '.join(ESTIMATORS)}")  # fmt: skip
        return
    m.flag(("learner.kind", "learner.adv_estimator"), "--algo.advantage.estimator", estimator)
    if estimator in ("reinforce", "reinforce_baseline"):
        m.differ(f"learner.adv_estimator={lc.adv_estimator} -> {estimator}: OpenRLHF whitens over the batch's "
                 "tokens, lrmgym over its samples (the same when completions are equally long)")  # fmt: skip
    if estimator == "group_norm":
        m.differ("learner.adv_estimator=grpo -> group_norm: (r - mean) / (std + 1e-9), lrmgym adds 1e-6")


def _map_loss(m: _Mapper, lc: Any) -> None:
    pg = lc.pg_loss
    if pg == "ppo_clip":
        m.flag("learner.pg_loss", "--actor.policy_loss_type", "ppo")
    elif pg == "gspo":
        m.flag("learner.pg_loss", "--actor.policy_loss_type", "gspo")
    elif pg == "reinforce" and lc.epochs == 1 and lc.minibatches == 1:
        # One optimizer step per rollout, with the old log-probs recomputed by the trainer: the ratio is exactly 1
        # where the only gradient is taken, and PPO-clip's gradient there is -A grad log pi, REINFORCE's.
        m.flag("learner.pg_loss", "--actor.policy_loss_type", "ppo")
        m.record("learner.pg_loss", "reinforce: PPO-clip at ratio 1 (one optimizer step per rollout)")
    elif pg == "reinforce":
        m.refuse("learner.pg_loss", pg, "OpenRLHF's losses all carry the PPO ratio, which equals REINFORCE's "
                 "ratio-free loss only with one optimizer step per rollout",
                 "set learner.epochs=1 learner.minibatches=1, or learner.pg_loss=ppo_clip")  # fmt: skip
    else:
        m.refuse("learner.pg_loss", pg, "OpenRLHF's --actor.policy_loss_type takes ppo or gspo; it has no "
                 f"{pg} loss", "use learner.pg_loss=ppo_clip or gspo, or train with backend=native")  # fmt: skip
    m.flag(("learner.clip_low", "learner.clip_high"), "--actor.eps_clip_low_high", lc.clip_low, lc.clip_high)
    # --actor.dual_clip and --actor.entropy_coef stay unset (OpenRLHF: none): lrmgym's configs have neither (the
    # dual_clip argument of losses.ppo_clip is no config key), so both sides train without them.
    if pg == "gspo" and lc.loss_agg != "seq_mean_token_mean":
        m.refuse("learner.loss_agg", lc.loss_agg, "OpenRLHF's GSPO always averages each sequence, then the "
                 "sequences", "set learner.loss_agg=seq_mean_token_mean")  # fmt: skip
    elif lc.loss_agg in LOSS_AGG_MODES:
        m.flag("learner.loss_agg", "--actor.loss_agg_mode", LOSS_AGG_MODES[lc.loss_agg])
    else:
        m.refuse("learner.loss_agg", lc.loss_agg, "OpenRLHF's --actor.loss_agg_mode takes token-mean or "
                 "seq-mean-token-mean; it cannot divide each sequence's token sum by the fixed budget (Dr. GRPO's "
                 "seq_mean_token_sum_norm)", "set learner.loss_agg=token_mean (one mean over the step's tokens: "
                 "no length normalisation per sequence either, but the divisor is the step's token count, not the "
                 "budget)")  # fmt: skip


def _map_kl(m: _Mapper, lc: Any) -> None:
    kl_reward = float(getattr(lc, "kl_reward_coef", 0.0))
    if lc.kl_coef > 0 and kl_reward > 0:
        m.refuse("learner.kl_reward_coef", kl_reward, "OpenRLHF applies its one KL coefficient as a loss term "
                 "(--algo.kl.use_loss) or as a reward penalty, not both, and learner.kl_coef is set too",
                 "set learner.kl_reward_coef=0 or learner.kl_coef=0")  # fmt: skip
    elif lc.kl_coef > 0:
        if hasattr(lc, "kl_reward_coef"):
            m.record("learner.kl_reward_coef", "0: the KL is a loss term only")
        # lrmgym adds kl_coef x aggregate(KL) to the loss with the policy loss's aggregation; so does OpenRLHF.
        m.switch("learner.kl_coef", "--algo.kl.use_loss")
        m.flag("learner.kl_estimator", "--algo.kl.estimator", lc.kl_estimator)
        m.flag("learner.kl_coef", "--algo.kl.init_coef", lc.kl_coef)
        m.differ("learner.kl_coef: OpenRLHF clamps each token's KL estimate to [-10, 10]")
    elif kl_reward > 0:
        m.record("learner.kl_coef", "0: the KL is a reward penalty only (learner.kl_reward_coef)")
        m.flag("learner.kl_reward_coef", "--algo.kl.estimator", "k1")  # log pi_old - log pi_ref, as lrmgym's
        m.flag("learner.kl_reward_coef", "--algo.kl.init_coef", kl_reward)
        m.record("learner.kl_estimator", "unused: the KL reward penalty is k1 (log pi_old - log pi_ref)")
    else:
        m.flag(("learner.kl_coef", "learner.kl_reward_coef"), "--algo.kl.init_coef", 0)  # OpenRLHF's default: 0.01
        m.record("learner.kl_estimator", "unused: no KL term (kl_coef 0), so no reference model is loaded")


def _map_optimizer(m: _Mapper, lc: Any) -> None:
    m.flag("learner.lr", "--actor.adam.lr", lc.lr)
    m.flag("learner.adam_betas", "--actor.adam.betas", *lc.adam_betas)
    m.flag("learner.weight_decay", "--actor.adam.weight_decay", lc.weight_decay)
    m.flag("learner.max_grad_norm", "--actor.max_norm", lc.max_grad_norm if lc.max_grad_norm is not None else 0)
    if lc.lr_decay == "linear" and lc.min_lr_ratio != 0:
        m.refuse("learner.min_lr_ratio", lc.min_lr_ratio, "OpenRLHF's linear schedule (transformers') decays to 0",
                 "set learner.min_lr_ratio=0, or learner.lr_decay=cosine, which ends at min_lr_ratio x lr")  # fmt: skip
    m.flag("learner.lr_decay", "--actor.lr_scheduler", _LR_SCHEDULERS[lc.lr_decay])
    if lc.lr_decay == "cosine":
        m.flag("learner.min_lr_ratio", "--actor.min_lr_ratio", lc.min_lr_ratio)
    elif lc.lr_decay == "constant":
        m.record("learner.min_lr_ratio", "unused by a constant schedule")
    m.flag("learner.warmup_steps", "--actor.lr_warmup_ratio", min(1.0, lc.warmup_steps / lc.steps))
    if lc.lr_decay != "constant" or lc.warmup_steps:
        m.differ("learner.lr_decay: OpenRLHF's schedule moves every optimizer step and runs its decay after the "
                 "warmup; lrmgym's moves once a step and decays over the whole run")  # fmt: skip
    if lc.weight_decay:
        m.differ("learner.weight_decay: OpenRLHF exempts biases and norm weights, lrmgym decays every weight")


def _map_critic(m: _Mapper, lc: Any) -> None:
    m.flag("learner.critic_lr", "--critic.adam.lr", lc.critic_lr)
    m.flag("learner.critic_lr", "--critic.lr_scheduler", "constant")
    m.flag("learner.adam_betas", "--critic.adam.betas", *lc.adam_betas)
    m.flag("learner.weight_decay", "--critic.adam.weight_decay", lc.weight_decay)
    m.flag("learner.max_grad_norm", "--critic.max_norm", lc.max_grad_norm if lc.max_grad_norm is not None else 0)
    m.flag("learner.critic_warmup_steps", "--critic.freezing_steps", lc.critic_warmup_steps - 1)
    if lc.value_clip is None:
        m.refuse("learner.value_clip", None, "OpenRLHF always clips the value loss (--critic.value_clip)",
                 "set learner.value_clip to a number (0.2, the default)")  # fmt: skip
    else:
        m.flag("learner.value_clip", "--critic.value_clip", lc.value_clip)
    if lc.critic == "head":
        m.differ("learner.critic=head: OpenRLHF's critic is a copy of the policy with a value head, trained end to "
                 "end (lrmgym's critic=model), not a head on the detached policy")  # fmt: skip
    m.record("learner.critic", "the critic is initialised from --actor.model_name_or_path (OpenRLHF's default)")
    critic_epochs = lc.critic_epochs or lc.epochs
    if critic_epochs != lc.epochs:
        default = type(lc).model_fields["critic_epochs"].get_default()
        if lc.critic_epochs == default:
            m.differ(f"learner.critic_epochs={lc.critic_epochs} (the default): OpenRLHF's critic trains "
                     f"--train.max_epochs {lc.epochs} passes, the actor's")  # fmt: skip
        else:
            m.refuse("learner.critic_epochs", lc.critic_epochs, FIELDS["learner.critic_epochs"].text,
                     f"set learner.critic_epochs=null (or {lc.epochs}, learner.epochs)")  # fmt: skip


def _map_eval(m: _Mapper, ev: Any, lc: Any, paths: ExportPaths) -> None:
    steps = lc.eval_every if lc.eval_every > 0 else (lc.steps if lc.eval_before_after else -1)
    m.flag(("learner.eval_every", "learner.eval_before_after"), "--eval.steps", steps)
    if lc.eval_before_after:
        m.differ("learner.eval_before_after: OpenRLHF does not evaluate before training")
        if lc.eval_every > 0 and lc.steps % lc.eval_every:
            m.differ(f"learner.eval_before_after: nor after the last step, {lc.steps}, which is not a multiple of "
                     f"learner.eval_every={lc.eval_every}")  # fmt: skip
    if steps != -1 and paths.eval is not None:
        m.flag(("eval.tasks", "eval.split", "eval.seed"), "--eval.dataset", paths.eval)
    m.flag("eval.n", "--eval.n_samples_per_prompt", ev.n)
    m.flag("eval.temperature", "--eval.temperature", ev.temperature)
    extra_k = [k for k in ev.k if k not in (1, ev.n)]
    if extra_k:
        m.refuse("eval.k", ev.k, f"OpenRLHF reports pass@1 and pass@{ev.n} (eval.n) only",
                 f"set eval.k=[1] or eval.k=[1,{ev.n}]")  # fmt: skip
    else:
        m.record("eval.k", f"eval_*_pass1 and eval_*_pass{ev.n}")
    m.only("eval", ev, ["top_k", "stop", "pass_threshold"])
    m.differ("eval: OpenRLHF's eval_*_pass1 is the mean reward of the plug-in (judges included) and "
             f"eval_*_pass{ev.n} the best of eval.n, not the share of correct answers")  # fmt: skip
    for name, rollout_value in (("top_p", lc.top_p), ("max_new_tokens", lc.max_new_tokens)):
        value = getattr(ev, name)
        if value == rollout_value:
            continue
        key = f"eval.{name}"
        if value == type(ev).model_fields[name].get_default():
            m.differ(f"{key}={show(value)} (the default): OpenRLHF evaluates with learner.{name}={show(rollout_value)}")
        else:
            m.refuse(key, value, f"OpenRLHF evaluates with the rollouts' {name} (learner.{name})",
                     f"set {key}={show(rollout_value)}")  # fmt: skip


def _map_outputs(m: _Mapper, lc: Any, paths: ExportPaths, backend: OpenRLHFBackendConfig) -> None:
    m.flag("learner.checkpoint_every", "--ckpt.save_steps", lc.checkpoint_every)
    m.flag("learner.keep_checkpoints", "--ckpt.max_num", lc.keep_checkpoints)
    m.flag(("learner.checkpoint_every", "backend.output_dir"), "--ckpt.path", paths.checkpoints)
    m.switch("learner.checkpoint_every", "--ckpt.load_enable")  # launch.sh again resumes from the newest checkpoint
    m.flag("backend.output_dir", "--ckpt.output_dir", paths.model)
    if backend.tensorboard:
        m.flag(("backend.tensorboard", "backend.output_dir"), "--logger.tensorboard_dir", paths.tensorboard)


def _map_resources(m: _Mapper, cfg: Any, b: OpenRLHFBackendConfig) -> None:
    gpus = b.num_nodes * b.gpus_per_node
    roles = ["actor", "ref"] + (["critic"] if cfg.learner.kind == "ppo" else [])
    for role in roles:
        m.flag("backend.num_nodes", f"--{role}.num_nodes", b.num_nodes)
        m.flag("backend.gpus_per_node", f"--{role}.num_gpus_per_node", b.gpus_per_node)
    engines = b.vllm_num_engines
    if b.colocate:
        if engines is None and gpus % b.tensor_parallel_size == 0:
            engines = gpus // b.tensor_parallel_size
        if engines is None or engines * b.tensor_parallel_size != gpus:
            m.refuse("backend.vllm_num_engines", b.vllm_num_engines,
                     f"with backend.colocate=true the vLLM engines must fill the actor's {b.num_nodes} x "
                     f"{b.gpus_per_node} = {gpus} GPUs exactly (engines x tensor_parallel_size "
                     f"{b.tensor_parallel_size})", "set backend.vllm_num_engines=null with a tensor_parallel_size "
                     f"that divides {gpus}, or backend.colocate=false")  # fmt: skip
            engines = engines or 1
        m.switch("backend.colocate", "--train.colocate_all")
        m.switch("backend.colocate", "--vllm.enable_sleep")
        m.switch("backend.colocate", "--ds.enable_sleep")
    elif engines is None:
        m.refuse("backend.vllm_num_engines", None, "without colocation the vLLM engines need GPUs of their own",
                 "set backend.vllm_num_engines (each takes backend.tensor_parallel_size GPUs)")  # fmt: skip
        engines = 1
    m.flag("backend.vllm_num_engines", "--vllm.num_engines", engines)
    m.flag("backend.tensor_parallel_size", "--vllm.tensor_parallel_size", b.tensor_parallel_size)
    utilization = b.vllm_gpu_memory_utilization or (0.5 if b.colocate else None)
    if utilization is not None:
        m.flag("backend.vllm_gpu_memory_utilization", "--vllm.gpu_memory_utilization", utilization)
    m.flag("backend.zero_stage", "--ds.zero_stage", b.zero_stage)
    # DeepSpeed: a minibatch (--train.batch_size) is micro_batch_size x accumulation steps x the actor's GPUs.
    lc = cfg.learner
    samples = lc.prompts_per_step * lc.group_size
    minibatch = samples // lc.minibatches
    if minibatch % (b.train_micro_batch_size * gpus):
        fits = [d for d in range(1, minibatch // gpus + 1) if minibatch % (d * gpus) == 0]
        m.refuse("backend.train_micro_batch_size", b.train_micro_batch_size,
                 f"DeepSpeed needs --train.batch_size {minibatch} (prompts_per_step x group_size / minibatches) to "
                 f"be a multiple of micro_batch_size x the actor's {gpus} GPUs",
                 f"set backend.train_micro_batch_size to one of {fits[-4:]}" if fits else "use fewer GPUs or more "
                 "samples per minibatch (learner.prompts_per_step, group_size, minibatches)")  # fmt: skip
    m.flag("backend.train_micro_batch_size", "--train.micro_batch_size", b.train_micro_batch_size)
    if samples // b.rollout_micro_batch_size < gpus:  # OpenRLHF asserts each actor process gets a batch
        m.refuse("backend.rollout_micro_batch_size", b.rollout_micro_batch_size,
                 f"OpenRLHF needs at least one micro batch per actor GPU ({gpus}) of the step's {samples} samples",
                 f"set it to at most {max(1, samples // gpus)}")  # fmt: skip
    m.flag("backend.rollout_micro_batch_size", "--rollout.micro_batch_size", b.rollout_micro_batch_size)
    if b.gradient_checkpointing:
        m.switch("backend.gradient_checkpointing", "--actor.gradient_checkpointing_enable")
    if b.adam_offload:
        m.switch("backend.adam_offload", "--ds.adam_offload")
    if b.async_train:
        m.switch("backend.async_train", "--train.async_enable")
    m.flag("run.seed", "--train.seed", cfg.run.seed)
    m.only("run", cfg.run, ["report_to"])


def _map_extra(m: _Mapper, b: OpenRLHFBackendConfig) -> None:
    if not b.extra_args:
        return
    ours = {a for a in m.argv if a.startswith("--")}
    for arg in b.extra_args:
        if arg.startswith("--") and arg.split("=", 1)[0] in ours:
            m.refuse("backend.extra_args", b.extra_args, f"{arg.split('=', 1)[0]} is set from the lrmgym config",
                     "set the lrmgym key that maps to it instead (export.json lists them)")  # fmt: skip
            return
    m.argv += list(b.extra_args)
    m.record("backend.extra_args", " ".join(b.extra_args))


_STANDING_DIFFERENCES = [
    "ungradeable completions (verdict score None): lrmgym masks them out of the loss and the group statistics; "
    "OpenRLHF has no mask, so the plug-in's reward for them (the env's failure value) enters both",
    "OpenRLHF clips each sample's reward to [-10, 10] (--reward.clip_range), after the group baseline for the "
    "group estimators; lrmgym clips none",
]
"""What OpenRLHF always does differently, whatever the config says."""


# ------------------------------------------------------------------------------------------------ Ray and launch.sh
def _lrmgym_requirements() -> list[str]:
    """The requirements of lrmgym the plug-in needs on a Ray worker: all but the extras and OpenRLHF's pins."""
    try:
        requires = importlib.metadata.requires("lrmgym") or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that is not installed
        requires = []
    out = []
    for req in requires:
        if ";" in req and "extra" in req.split(";", 1)[1]:
            continue
        name = re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].strip().lower()
        if name and name not in _PROVIDED_BY_OPENRLHF:
            out.append(req.split(";", 1)[0].strip())
    return out


def runtime_env(cfg: Any, root: str | os.PathLike) -> dict[str, Any]:
    """The Ray runtime env of ``ray job submit``: the export folder as working_dir, lrmgym shipped to the workers.

    The plug-in imports lrmgym inside every vLLM actor, so the workers need the package (``py_modules``: this
    installation's package folder) and its requirements (``pip``) unless every node has lrmgym installed
    (``backend.py_modules=false backend.pip=[]``). OpenRLHF's own outputs in the folder are not uploaded.
    """
    backend = cfg.backend
    env: dict[str, Any] = {
        "working_dir": str(root),
        "excludes": [f"{CHECKPOINTS_DIR}/", f"{MODEL_DIR}/", f"{TENSORBOARD_DIR}/"],
    }
    if backend.py_modules:
        env["py_modules"] = [str(Path(__file__).resolve().parents[1])]  # the lrmgym package folder
    pip = _lrmgym_requirements() if backend.pip is None else list(backend.pip)
    if pip:
        env["pip"] = pip
    return env


def launch_command(cfg: Any, argv: Sequence[str], env: dict[str, Any] | None = None) -> list[str]:
    """The whole command launch.sh runs: ``python -m ...`` here, or ``ray job submit ... -- python -m ...``."""
    address = cfg.backend.address
    if not address:
        return [*ENTRY_POINT, *argv]
    if env is None:
        raise ValueError("a `ray job submit` command needs the runtime env")
    env_json = json.dumps(env, sort_keys=True)
    return ["ray", "job", "submit", "--address", address, "--runtime-env-json", env_json, "--", *ENTRY_POINT, *argv]


def launch_script(cfg: Any, argv: Sequence[str], env: dict[str, Any] | None = None, header: str = "") -> str:
    """``launch.sh``: strict bash, run from its own folder, then the command (each flag with its values on a line)."""
    command = launch_command(cfg, argv, env)
    head_len = len(command) - len(argv)
    lines = [shlex.join(command[:head_len])]
    current: list[str] = []
    for word in argv:
        if word.startswith("--") and current:
            lines.append(shlex.join(current))
            current = []
        current.append(word)
    if current:
        lines.append(shlex.join(current))
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return (
        "#!/usr/bin/env bash\n"
        + comment
        + "set -euo pipefail\n"
        + 'cd "$(dirname "$0")"\n'
        + "exec "
        + " \\\n    ".join(lines)
        + "\n"
    )


def machine_problem(cfg: Any) -> str | None:
    """Why this machine cannot launch ``cfg``'s OpenRLHF run now (None: it can).

    A local launch (no ``backend.address``) needs CUDA GPUs and openrlhf importable in this interpreter; a
    ``ray job submit`` needs the ``ray`` command.
    """
    if cfg.backend.address:
        if shutil.which("ray") is None:
            return (
                f"backend.address={cfg.backend.address!r} submits with the `ray` command, which is not on PATH; "
                "install it with pip install 'lrmgym[openrlhf]' (or 'ray[default]')"
            )
        return None
    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("no CUDA GPU (torch.cuda.is_available() is False)")
    except ImportError:
        missing.append("no torch")
    if importlib.util.find_spec("openrlhf") is None:
        missing.append("openrlhf is not installed (pip install 'lrmgym[openrlhf]' on a GPU machine)")
    if not missing:
        return None
    return f"backend=openrlhf cannot launch on this machine: {'; '.join(missing)}"


# ------------------------------------------------------------------------------------------------ the export
class ExportError(ValueError):
    """The export folder cannot be written (the message says why and what to do)."""


@dataclass
class ExportResult:
    """What :func:`export_openrlhf` wrote."""

    out_dir: Path
    """The export folder."""
    command: list[str]
    """The command launch.sh runs (from inside ``out_dir``)."""
    plan: LaunchPlan
    """The argv and the mapping record."""
    files: dict[str, str]
    """What each file is, by its name in ``out_dir``."""
    warnings: list[str] = field(default_factory=list)
    """What the data writer warned about (e.g. train and eval rows from the same tasks)."""


DataWriter = Callable[..., Any]
PluginWriter = Callable[..., Any]


def _default_writers() -> tuple[DataWriter, PluginWriter]:
    try:
        from lrmgym.integrations.labels import write_data
        from lrmgym.integrations.openrlhf_plugins import write_plugins
    except ImportError as err:
        raise ExportError(
            f"this installation cannot write OpenRLHF's data and plug-in ({err}); "
            "lrmgym.integrations.labels and lrmgym.integrations.openrlhf_plugins are needed."
        ) from None
    return write_data, write_plugins


def _paths_from(value: Any, tmp: Path, names: Sequence[str]) -> list[Path | None]:
    """The files a writer returned (a mapping by name, a sequence, or one path), as paths inside ``tmp``."""
    if isinstance(value, dict):
        found = [value.get(n) for n in names]
    elif isinstance(value, (list, tuple)):
        found = list(value) + [None] * (len(names) - len(value))
    else:
        found = [value] + [None] * (len(names) - 1)
    out: list[Path | None] = []
    for item in found[: len(names)]:
        if item is None:
            out.append(None)
            continue
        path = Path(item)
        out.append(path if path.is_absolute() else tmp / path)
    return out


def _plugin_from(info: Any, tmp: Path) -> tuple[str, Path]:
    """``(flag, file)`` of the plug-in write_plugins wrote: an agent_func.py or a reward_func.py."""
    items: dict[str, Any] = dict(info) if isinstance(info, dict) else {}
    argv = items.get("argv")
    if isinstance(argv, (list, tuple)) and len(argv) == 2 and argv[0] in _PLUGIN_FLAGS:
        path = Path(argv[1]) if Path(argv[1]).is_absolute() else tmp / argv[1]
        if not path.is_file():
            raise ExportError(f"write_plugins named {path.name}, which it did not write")
        return str(argv[0]), path
    agent = items.get("agent_func_path") or items.get("agent_func") or items.get("agent")
    reward = items.get("reward_func_path") or items.get("reward_func") or items.get("reward")
    if agent is None and reward is None:  # a path, or a mapping whose values are the files
        candidates = [Path(v) for v in items.values() if isinstance(v, (str, os.PathLike))] or (
            [Path(info)] if isinstance(info, (str, os.PathLike)) else []
        )
        for path in candidates:
            if path.name.startswith("agent") and path.suffix == ".py":
                agent = path
            elif path.suffix == ".py":
                reward = reward or path
    chosen = agent if agent is not None else reward
    if chosen is None:
        raise ExportError(f"write_plugins returned {info!r}: no agent_func.py or reward_func.py in it")
    path = Path(chosen)
    path = path if path.is_absolute() else tmp / path
    if not path.is_file():
        raise ExportError(f"write_plugins named {path.name}, which it did not write")
    return ("--train.agent_func_path" if agent is not None else "--reward.remote_url"), path


_PLUGIN_FLAGS = ("--train.agent_func_path", "--reward.remote_url")


def _chat_prompts(train: Path) -> bool:
    """Whether the first row of the training data holds chat messages (a list) as its prompt."""
    with train.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return isinstance(json.loads(line).get(INPUT_KEY), list)
    raise ExportError(f"{train.name} holds no prompts; check learner.steps and learner.prompts_per_step")


def _swap_into_place(tmp: Path, out_dir: Path, force: bool) -> None:
    """Rename ``tmp`` to ``out_dir``: over an empty folder, or (force) over a full one moved aside first."""
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    if not any(out_dir.iterdir()):
        os.rename(tmp, out_dir)  # POSIX renames a folder over an empty one
        return
    if not force:  # checked before the export began; another process filled it since
        raise ExportError(f"out: {str(out_dir)!r} is not empty; pass --force to replace it")
    aside = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(out_dir, aside)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(aside, out_dir)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def check_out_dir(out_dir: Path, force: bool) -> None:
    """Refuse an export folder that is a file, or a non-empty folder without ``force``.

    Never replaced, ``force`` or not: the current folder or one above it (a shell stands in it), a run folder
    or a folder holding one (``runs/``); a new folder inside a run folder needs ``force``. An earlier export
    (:func:`lrmgym.files.check_output_dir`) is replaced with ``force``.
    """
    from lrmgym.files import OutputPathError, check_output_dir

    try:
        check_output_dir(out_dir, force=force, what="out")
    except OutputPathError as err:
        raise ExportError(str(err)) from None
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"out: {str(out_dir)!r} is a file; give a folder (it is created).")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(
            f"out: {str(out_dir)!r} exists and is not empty; choose a new folder, or pass --force to replace it "
            "(its files are deleted)."
        )


def export_openrlhf(
    cfg: Any,
    out_dir: str | os.PathLike,
    *,
    force: bool = False,
    root: str | os.PathLike | None = None,
    writers: tuple[DataWriter, PluginWriter] | None = None,
    version: str = "",
) -> ExportResult:
    """Write everything OpenRLHF needs to train ``cfg`` into ``out_dir``, all or nothing.

    ``out_dir`` gets ``train.jsonl`` and ``eval.jsonl`` (``write_data``), the plug-in (``write_plugins``),
    ``launch.sh``, ``runtime_env.json``, ``export.json`` (what each lrmgym key became, what OpenRLHF does
    differently) and ``config.yaml`` (the resolved config). Everything is written into a temporary sibling that
    is renamed into place at the end; on any failure it is removed and ``out_dir`` is as it was.

    Args:
        cfg: A resolved RunConfig with ``backend.kind`` openrlhf.
        out_dir: The export folder: new, or empty, or (with ``force``) replaced.
        force: Replace a non-empty ``out_dir``.
        root: The folder the argv and launch.sh name (default ``out_dir``): the dry run writes elsewhere.
        writers: ``(write_data, write_plugins)``; default lrmgym.integrations' own.
        version: lrmgym's version, recorded in export.json.

    Raises:
        ConfigError: The config cannot be expressed for OpenRLHF (before anything is written).
        ExportError: ``out_dir`` cannot be written, or a writer returned something unusable.
    """
    given = Path(out_dir)
    root_dir = Path(os.path.abspath(root if root is not None else given))
    plan(cfg)  # every refusal before anything is written
    check_out_dir(given, force)
    # Absolute from here: a writer returns the paths it wrote, which a relative folder would make relative to
    # the working directory, not to the temporary folder.
    out_dir = Path(os.path.abspath(given))
    write_data, write_plugins = writers or _default_writers()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        lc = cfg.learner
        data = write_data(cfg, tmp, lc.steps * lc.prompts_per_step, cfg.eval.tasks)
        train, evaluation = _paths_from(data, tmp, ("train", "eval"))
        if train is None or not train.is_file():
            raise ExportError(f"write_data returned {data!r}: no training file in it")
        folder = Path(cfg.policy.model).expanduser()  # a local model's tokenizer gives the turn markers
        extra = {"tokenizer": str(folder.resolve())} if folder.is_dir() else {}
        plugin_info = write_plugins(cfg, tmp, **extra)
        flag, plugin = _plugin_from(plugin_info, tmp)
        turns = plugin_info.get("max_turns") if isinstance(plugin_info, dict) else None
        local = not cfg.backend.address
        outputs = Path(cfg.backend.output_dir).expanduser().absolute() if cfg.backend.output_dir else root_dir

        def named(path: Path) -> str:  # absolute for a local launch, relative to Ray's working_dir for a submit
            rel = path.relative_to(tmp)
            return str(root_dir / rel) if local else rel.as_posix()

        paths = ExportPaths(
            train=named(train),
            eval=named(evaluation) if evaluation is not None and evaluation.is_file() else None,
            plugin=named(plugin),
            plugin_flag=flag,
            checkpoints=str(outputs / CHECKPOINTS_DIR),
            model=str(outputs / MODEL_DIR),
            tensorboard=str(outputs / TENSORBOARD_DIR),
        )
        launch = plan(cfg, paths, chat_prompts=_chat_prompts(train), turns=turns)
        env = runtime_env(cfg, root_dir)
        command = launch_command(cfg, launch.argv, env)
        header = (
            f"Written by `lrmgym export openrlhf` (lrmgym {version or '?'}) for {OPENRLHF_REQUIREMENT}: {cfg.env.id}\n"
            f"with learner {cfg.learner.kind}. export.json says what each lrmgym key became. Running it again\n"
            f"resumes from the newest checkpoint in {paths.checkpoints}. Run it where openrlhf is installed:\n"
            "`python` must be that environment's interpreter (lrmgym run puts its own first on PATH)."
        )
        (tmp / LAUNCH_FILE).write_text(launch_script(cfg, launch.argv, env, header), encoding="utf-8")
        (tmp / LAUNCH_FILE).chmod(0o755)
        (tmp / RUNTIME_ENV_FILE).write_text(json.dumps(env, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / CONFIG_FILE).write_text(cfg.to_yaml(), encoding="utf-8")
        files = {
            train.name: "training prompts and labels (--data.prompt_dataset)",
            plugin.name: f"the plug-in ({flag})",
            LAUNCH_FILE: "the launch command; run it from anywhere: bash launch.sh",
            RUNTIME_ENV_FILE: "the Ray runtime env of `ray job submit` (lrmgym shipped to the workers)",
            EXPORT_FILE: "this record",
            CONFIG_FILE: "the resolved lrmgym config",
        }
        if evaluation is not None and evaluation.is_file():
            files[evaluation.name] = "evaluation prompts and labels (--eval.dataset)"
        record = {
            "lrmgym": version,
            "openrlhf": OPENRLHF_REQUIREMENT,
            "command": command,
            "cwd": str(root_dir),
            "files": files,
            "data": _relocated(data, tmp, root_dir) if isinstance(data, dict) else {},
            "plugin": _relocated(plugin_info, tmp, root_dir) if isinstance(plugin_info, dict) else {},
            "mapped": launch.mapped,
            "irrelevant": launch.irrelevant,
            "unused": launch.unused,
            "differences": launch.differences,
        }
        (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        warnings = [str(w) for w in data.get("warnings", [])] if isinstance(data, dict) else []
        _swap_into_place(tmp, out_dir, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out_dir=given, command=command, plan=launch, files=files, warnings=warnings)


def _relocated(value: Any, tmp: Path, root: Path) -> Any:
    """``value`` (a writer's report) with every path inside the temporary folder named at its final place."""
    if isinstance(value, dict):
        return {str(k): _relocated(v, tmp, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_relocated(v, tmp, root) for v in value]
    if isinstance(value, (str, Path)) and str(value).startswith(str(tmp)):
        return str(root / Path(value).relative_to(tmp))
    return str(value) if isinstance(value, Path) else value

"""The composition root: a resolved config in, live objects out (env with judges, policy, run context).

This is the one module that knows every wing: ``cli -> compose -> (configs, learners, judges, policies,
envs) -> core``. Configs only describe; learners only receive (:class:`~lrmgym.learners.engine.context.RunContext`);
nothing below imports this module.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

__all__ = ["build_context", "build_env", "build_policy", "prepare", "train"]


def build_env(config: Any) -> Any:
    """The configured env wrapped in the configured judges (none: the env's own verifier alone)."""
    env = config.env.make()
    if not config.judge:
        return env
    from lrmgym.judges.base import JudgedEnv

    return JudgedEnv(env, [judge.build() for judge in config.judge.values()])


def env_answer_instruction(env_config: Any) -> str:
    """The system instruction ``auto`` stands for with this env config (``""``: none needed or known).

    The math env in the ``compact`` style: its own instruction for its ``template`` (the sentence its ``instruct``
    style appends to each question). Anything else: ``""`` (Game24's compact prompts too: its instruction depends
    on the episode mode; ``env.style=instruct`` is what a real model should get there).
    """
    env_id = str(getattr(env_config, "id", ""))
    template = getattr(env_config, "template", None)
    if getattr(env_config, "style", None) != "compact" or template is None:
        return ""
    if env_id.startswith("lrmgym/Math-"):
        from lrmgym.envs.math.templates import INSTRUCTIONS

        return INSTRUCTIONS.get(str(template), "")
    return ""


def build_policy(config: Any) -> Any:
    """The configured policy; a tiny model of a recipe not built yet is built (and cached) first.

    ``policy.path=RUN`` naming a run directory loads that run's trained model (its newest checkpoint; see
    :func:`lrmgym.runs.load_run_policy`).
    """
    path = getattr(config.policy, "path", None)
    if config.policy.kind == "tiny" and path:
        from lrmgym.runs import HFExportError, is_run_dir, load_run_policy

        if is_run_dir(path):
            try:
                return load_run_policy(path, device=config.policy.device)
            except HFExportError as err:
                raise ValueError(f"policy.path={path}: {err}") from None
    needs_build = getattr(config.policy, "needs_build", None)
    if callable(needs_build) and needs_build():
        from lrmgym.learners.algorithms.sft import build_tiny

        check_device = getattr(config.policy, "check_device", None)
        if callable(check_device):
            check_device()  # a device this machine lacks: refused before minutes of building
        build_tiny(config.policy)
    policy = config.policy
    if getattr(policy, "answer_instruction", None) == "auto":  # policy=hf: the env's answer-format instruction
        policy = policy.model_copy(update={"answer_instruction": env_answer_instruction(config.env)})
    return policy.build()


def build_context(config: Any, run_dir: Path | str) -> Any:
    """Build the run's env, policy and eval plan from a resolved :class:`~lrmgym.configs.schema.RunConfig`."""
    from lrmgym.learners.engine.context import RunContext
    from lrmgym.runs import model_commands

    return RunContext(
        env=build_env(config),
        policy=build_policy(config),
        eval=config.eval,
        seed=int(config.run.seed),
        run_dir=Path(run_dir),
        make_env=functools.partial(build_env, config),
        make_policy=functools.partial(build_policy, config),
        config=config,
        report_to=tuple(config.run.report_to),
        model_commands=functools.partial(model_commands, config=config),
        load_model=load_named_model,
    )


def load_named_model(value: str, option: str) -> Any:
    """The policy a learner's option names (a model folder, a run directory of ``lrmgym run``, tiny), eval mode.

    A bad name raises a one-line :class:`~lrmgym.configs.locate.ModelLocateError` (a ``ValueError``) that
    starts with ``option``.
    """
    from lrmgym.configs.locate import load_located, locate_model

    return load_located(locate_model(value, option, None), build_policy)


def prepare(config: Any, run_dir: Path | str) -> Any:
    """The learner's run loop over a freshly built context; ``.run(resume=...)`` trains."""
    learner = config.learner
    seed_torch = getattr(learner, "seed_torch", None)
    if callable(seed_torch):
        seed_torch(int(config.run.seed))  # before the policy's build: its initialisation draws from torch
    return learner.build(build_context(config, run_dir))


def train(config: Any, run_dir: Path | str, resume: bool = False) -> dict[str, Any]:
    """Train as ``config.learner`` says, in ``run_dir``; returns the run's summary (also in ``summary.json``)."""
    return prepare(config, run_dir).run(resume=resume)

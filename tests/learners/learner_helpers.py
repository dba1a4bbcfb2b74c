"""Test fixtures for the learner: a dense-reward env a random tiny model can improve on, and tiny policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import lrmgym
from lrmgym.core import Completion, Task, TextEnv, Verdict

TEST_ENV_ID = "lrmgym/LearnerTestA-v0"


class CountAConfig(BaseModel):
    """Options of the count-a test env."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_turns: int = Field(1, ge=1, le=5)
    """Policy turns; above 1, a completion under half 'a' gets feedback and another try."""
    ungradeable_marker: str = ""
    """Completions containing this (when non-empty) are ungradeable."""


class CountAEnv(TextEnv):
    """Reward = fraction of 'a' characters in the completion: dense, so a random tiny model has signal."""

    Config = CountAConfig

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_turns = self.config.max_turns

    def make_task(self, index: int, rng: np.random.Generator) -> Task:
        return Task(id=f"counta/{index}", prompt=f"Q{int(rng.integers(0, 10))}:", answer="a")

    def verify(self, task: Task, completion: Completion) -> Verdict:
        text = completion.text
        if self.config.ungradeable_marker and self.config.ungradeable_marker in text:
            return Verdict.ungradeable("marker")
        score = text.count("a") / len(text) if text else 0.0
        return Verdict(score=score, correct=score >= 0.5, reason="fraction of a")

    def feedback(self, task: Task, completion: Completion, verdict: Verdict, turn: int) -> str | None:
        return "|more a:"


def register_test_env() -> None:
    """Register :class:`CountAEnv` (idempotent)."""
    import gymnasium

    if TEST_ENV_ID not in gymnasium.registry:
        lrmgym.register(TEST_ENV_ID, "learner_helpers:CountAEnv")


def tiny_hf_policy(seed: int = 0, hidden: int = 32, layers: int = 1):
    """An HFPolicy around a freshly initialised (untrained) tiny Llama with the tiny model's char tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrmgym.policies.hf import HFPolicy
    from lrmgym.policies.tiny import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 32, intermediate_size=2 * hidden, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(seed)
    return HFPolicy(LlamaForCausalLM(cfg), tok, device="cpu")


def save_tiny_hf(path: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama and its tokenizer with save_pretrained (for `policy=hf policy.model=PATH`)."""
    policy = tiny_hf_policy(seed)
    policy.model.save_pretrained(str(path))
    policy.tokenizer.save_pretrained(str(path))
    return path


class TinyTestPolicyConfig(BaseModel):
    """A policy config for RunConfig in tests: a fresh tiny random Llama."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tinytest"] = "tinytest"
    seed: int = 0

    def build(self):
        return tiny_hf_policy(self.seed)


def small_grpo(**overrides: Any) -> Any:
    """A GRPOConfig of 2 steps of 4 tasks x 4 samples x 8 new tokens, no evaluation, KL or clipping; ``overrides``."""
    from lrmgym.learners.algorithms.grpo import GRPOConfig

    base: dict[str, Any] = dict(
        steps=2, prompts_per_step=4, group_size=4, max_new_tokens=8, eval_before_after=False, progress=False,
        lr=1e-3, max_grad_norm=None, track_kl=False,
    )  # fmt: skip
    return GRPOConfig(**{**base, **overrides})


def run_config(learner: Any, env_id: str = TEST_ENV_ID, seed: int = 0, eval_tasks: int = 8, **env_options: Any):
    """A RunConfig made in code (no CLI), with the test policy."""
    from lrmgym.configs.schema import EnvConfig, RunConfig, RunSection
    from lrmgym.eval.config import EvalConfig

    return RunConfig(
        env=EnvConfig(id=env_id, **env_options),
        policy=TinyTestPolicyConfig(seed=seed),
        learner=learner,
        eval=EvalConfig(tasks=eval_tasks, n=2, max_new_tokens=8, split=None),
        run=RunSection(seed=seed),
    )


def make_loop(cfg: Any, run_dir: Path, setup: bool = False) -> Any:
    """The learner's run loop over a context built from ``cfg`` (as ``lrmgym.compose.train`` builds it)."""
    from lrmgym.compose import build_context

    cfg.learner.seed_torch(int(cfg.run.seed))
    loop = cfg.learner.build(build_context(cfg, run_dir))
    if setup:
        loop.algorithm.setup()
    return loop


_TRY_LOCK = (
    "import sys\n"
    "from lrmgym.learners.engine.rundir import RunDirLocked, lock_run_dir\n"
    "try:\n"
    "    with lock_run_dir(sys.argv[1]):\n"
    "        print('free')\n"
    "except RunDirLocked as err:\n"
    "    print(err)\n"
)


def lock_seen_from_another_process(run_dir: Path) -> str:
    """What a second process trying to lock ``run_dir`` meets: ``free``, or the refusal's message."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _TRY_LOCK, str(run_dir)], capture_output=True, text=True,
                          timeout=120, env=env, check=True)  # fmt: skip
    return done.stdout.strip()

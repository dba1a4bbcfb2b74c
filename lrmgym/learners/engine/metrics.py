"""What a step of a group learner logs: rollout statistics for ``metrics.jsonl``, records for ``samples.jsonl``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lrmgym.core import Trajectory
from lrmgym.learners.engine.flops import LlamaShape, trajectory_generate_flops
from lrmgym.learners.engine.rollout import Rollout, TokenizedTrajectory, env_attr

__all__ = ["rollout_metrics", "sample_records"]


def rollout_metrics(
    ro: Rollout,
    trajs: list[Trajectory],
    tokenized: list[TokenizedTrajectory],
    zero_variance: torch.Tensor,
    trained: int,
    turns: int,
    env: Any,
    judge_metrics: dict[str, Any] | None = None,
    shape: LlamaShape | None = None,
) -> dict[str, Any]:
    """Reward, accuracy, signal, length and throughput of one step's rollouts (and the env's judge metrics).

    Args:
        ro: The step's rollout.
        trajs: Its trajectories, task-major (``[B * G]``).
        tokenized: The same trajectories as tokens.
        zero_variance: ``[B]`` bool, the groups without signal.
        trained: How many trajectories went into the update.
        turns: Policy turns allowed per episode.
        env: The env (its ``pop_metrics()``, when it has one, adds ``judge/*`` keys).
        judge_metrics: The judges' metrics of this rollout when another process graded it (async rollouts);
            they replace the env's own (which then judged nothing).
        shape: The policy's model shape (:class:`~lrmgym.learners.engine.flops.LlamaShape`): adds
            ``compute/flops_generate``, the sampling's matmul FLOPs as a plain sampler computes them (model FLOPs,
            see :mod:`lrmgym.learners.engine.flops`); None (a model that module does not count) leaves it out.

    ``generations`` counts the completions sampled (every policy turn of every trajectory): the step's sampling
    cost, summed by the loop's ``generation_budget``. ``all_failed_frac`` is the share of groups none of whose
    judged trajectories is correct; ``format_ok_frac`` the share of trajectories whose verdict passed a format
    check (None where nothing checked the format).
    """
    rewards = [t.reward for t in trajs if t.reward is not None]
    judged = [t.verdict.correct for t in trajs if t.verdict is not None and t.verdict.correct is not None]
    policy_tokens = [sum(s.policy_mask) for s in tokenized]
    completions = [turn.completion for t in trajs for turn in t.turns if turn.role == "policy"]
    generated = sum(len(c.token_ids) if c and c.token_ids is not None else 0 for c in completions)
    first = [v[0].correct for group in ro.turn_verdicts for v in group if v and v[0].correct is not None]
    # A group "all failed" when none of its judged trajectories is correct (Ring-Zero's all-failed-group ratio).
    known = [[t.verdict.correct for t in group if t.verdict is not None and t.verdict.correct is not None]
             for group in ro.groups]  # fmt: skip
    failed = [not any(group) for group in known if group]
    formats = [t.verdict.format_ok for t in trajs if t.verdict is not None and t.verdict.format_ok is not None]
    metrics: dict[str, Any] = {
        "reward/mean": float(np.mean(rewards)) if rewards else None,
        "reward/std": float(np.std(rewards)) if rewards else None,
        "accuracy": float(np.mean(judged)) if judged else None,
        "zero_variance_frac": float(zero_variance.float().mean()),
        "zero_variance_groups": int(zero_variance.sum()),
        "all_failed_frac": float(np.mean(failed)) if failed else None,
        "format_ok_frac": float(np.mean(formats)) if formats else None,
        "ungradeable_frac": 1.0 - len(rewards) / max(len(trajs), 1),
        "trained_frac": trained / max(len(trajs), 1),
        "generations": len(completions),
        "length/mean": float(np.mean(policy_tokens)) if policy_tokens else 0.0,
        "length/truncated_frac": float(np.mean([c is not None and c.finish_reason == "length" for c in completions])),
        "tokens_per_s": generated / ro.generate_s if ro.generate_s > 0 else 0.0,
        "compute/generated_tokens": generated,
    }
    if shape is not None:
        metrics["compute/flops_generate"] = sum(trajectory_generate_flops(shape, s.policy_mask) for s in tokenized)
    if turns > 1:
        metrics["turns/mean"] = float(np.mean([len(t.policy_turns) for t in trajs]))
        metrics["first_turn_accuracy"] = float(np.mean(first)) if first else None
        metrics["retokenized_turns"] = sum(s.retokenized for s in tokenized)
    pop = env_attr(env, "pop_metrics")
    own = pop() if callable(pop) else None
    judged = judge_metrics if judge_metrics is not None else own
    metrics.update({f"judge/{k}": v for k, v in (judged or {}).items()})
    return metrics


def sample_records(ro: Rollout, advantages: torch.Tensor, groups: int) -> list[dict[str, Any]]:
    """The first ``groups`` groups of a rollout as ``samples.jsonl`` records (turns, reward, advantage, verdict)."""
    out = []
    for b, group in enumerate(ro.groups[:groups]):
        task = group[0].task
        out.append({
            "task_id": task.id, "prompt": task.prompt, "answer": task.answer,
            "trajectories": [
                {
                    "turns": [{"role": turn.role, "text": turn.text} for turn in t.turns],
                    "reward": t.reward, "advantage": float(advantages[b, g]),
                    "verdict": t.verdict.to_dict() if t.verdict is not None else None,
                }
                for g, t in enumerate(group)
            ],
        })  # fmt: skip
    return out

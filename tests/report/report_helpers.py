"""Helpers of the report's tests: the runs each learner makes, and a sample that tries to inject script."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SMALL = ("eval.tasks=6", "eval.n=2", "eval.max_new_tokens=48")
_RL_STAGE = ("steps=2", "prompts_per_step=4", "group_size=4", "time_budget_s=null", "async_rollouts=false",
             "progress=false", "eval_greedy=false", "log_samples=2")  # fmt: skip
RUNS: dict[str, tuple[str, ...]] = {
    "grpo": ("learner=grpo", "judge=[accuracy,format_strict]", "learner.steps=3", "learner.prompts_per_step=4",
             "learner.group_size=4", "learner.async_rollouts=false", "learner.progress=false"),
    "ppo": ("learner=ppo", "learner.steps=2", "learner.prompts_per_step=4", "learner.group_size=4",
            "learner.async_rollouts=false", "learner.progress=false"),
    "dapo": ("learner=dapo", "learner.steps=2", "learner.prompts_per_step=4", "learner.group_size=4",
             "learner.async_rollouts=false", "learner.progress=false"),
    "ring_zero": ("learner=ring_zero", "learner.stages=[rl1,sd,rl2]", "eval.n=1", "learner.sd.progress=false",
                  "learner.sd.batch_size=8", "learner.sd.epochs=1",
                  *(f"learner.{stage}.{kv}" for stage in ("rl1", "rl2") for kv in _RL_STAGE)),
    "reason_maxxer": ("learner=reason_maxxer", "learner.problems=16", "learner.rollouts_per_problem=4",
                      "learner.max_problems=8", "learner.batch_size=4", "learner.micro_batch_size=4",
                      "learner.progress=false", "learner.log_samples=2"),
}  # fmt: skip
"""CLI overrides of each learner's run (over env=math policy=tiny and a small held-out evaluation)."""


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of a run directory without its checkpoints (which the report never reads)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints", "*.pt", "adapter"))
    return dst


def jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


PAYLOAD = "</script><script>alert(1)</script><img src=x onerror=\"document.title='pwned'\">\u2028\u2029&amp;<!--"
"""Model output that would run script or break the page if any of it reached the HTML unescaped."""


def poison(run_dir: Path) -> None:
    """Append a sample whose every text field (prompt, completion, reason, component name, task id) is PAYLOAD.

    config.yaml gets a comment with the script part of it too.
    """
    with open(run_dir / "config.yaml", "a", encoding="utf-8") as f:
        f.write("# </script><script>alert(1)</script>\n")
    samples = run_dir / "samples.jsonl"
    record = jsonl(samples)[-1]
    record.update(task_id=f"evil/{PAYLOAD}", prompt=PAYLOAD, answer=PAYLOAD)
    trajectory = record["trajectories"][0]
    trajectory["turns"] = [{"role": "policy", "text": f"xss-marker {PAYLOAD}"}]
    trajectory["verdict"].update(reason=PAYLOAD, parsed=PAYLOAD)
    trajectory["verdict"]["components"][0].update(name=f"judge{PAYLOAD}", reason=PAYLOAD)
    record["trajectories"] = [trajectory]
    with open(samples, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")

"""``lrmgym/MathTool-v0``: the math env plus a sandboxed ``python`` tool the policy may call before it answers.

Tasks, prompts (with the tool instructions added) and grading are the math env's (:mod:`lrmgym.envs.math`): the
final answer is read in the task's template, strictly, and checked by the math verifier with its answer-form
rules. Tool calls follow :mod:`lrmgym.envs.tools`: Hermes/Qwen ``<tool_call>`` JSON, the result as a
``<tool_response>`` env turn (masked out of the loss by the learners), at most ``max_tool_calls`` per episode, each
run in a fresh process of the code sandbox that is sent the call's code and nothing else (no task, no gold).

Reward integrity: only a turn without a tool call is graded, on its own text (never the tool's output); a turn
with a call scores 0 whatever else it holds. The tool can compute (that is its point) but cannot read the gold:
the sandbox never receives it, has a cleared environment, no network, its own pid namespace and, with bubblewrap, a
root built from read-only system folders only (with the unshare fallback, host data folders are covered; see
:mod:`lrmgym.envs.code.sandbox`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, field_validator

from lrmgym.core import TextEnv
from lrmgym.envs.math import loaders
from lrmgym.envs.math.env import MathConfig, MathEnv
from lrmgym.envs.tools import Tool, ToolOptions, ToolUseEnv

__all__ = ["MathToolConfig", "MathToolEnv", "data_folders"]


class MathToolConfig(MathConfig, ToolOptions):
    """Options of the math-with-a-python-tool env: the math env's, plus the tool's."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_turns: int = 1
    """Fixed at 1 here (no retry after a wrong answer): the episode's turns are max_tool_calls + 1."""

    @field_validator("max_turns")
    @classmethod
    def _no_retries(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                "this env's turns are max_tool_calls + 1 (the calls, then the answer) and a wrong "
                "answer gets no retry; set env.max_tool_calls instead"
            )
        return value


def data_folders(config: MathConfig) -> list[str]:
    """The folders that hold the env's data set (and so its gold answers): none for the generator.

    The unshare fallback covers them in every tool sandbox (it shows host folders it does not cover); bubblewrap
    shows none of them anyway.
    """
    if config.source == "procedural":
        return []
    if config.source in ("gsm8k", "math500"):
        return [str(Path(config.data_dir).expanduser() if config.data_dir else loaders.default_data_dir())]
    source = Path(config.source).expanduser().resolve()
    return [str(source if source.is_dir() else source.parent)]


class MathToolEnv(ToolUseEnv):
    """Math with a sandboxed Python tool: call it inside your reasoning, then answer in the math env's format.

    The grade is the math env's verdict on the final turn (the first turn without a tool call); tool-call turns
    score 0 and get the tool's output back as the next observation; ``max_tool_calls`` caps them.
    """

    Config = MathToolConfig

    @classmethod
    def preflight(cls, config: MathToolConfig) -> None:
        """Read a local data file when the config is resolved (as the math env does)."""
        MathEnv.preflight(MathConfig(**config.inner_options()))

    def build_inner(self) -> TextEnv:
        """The math env with the same options (single-turn)."""
        return MathEnv(**self.config.inner_options())

    def build_tools(self) -> dict[str, Tool]:
        """The ``python`` tool; the folder of the data set (which holds the gold answers) is hidden from it."""
        return {"python": self.config.python_tool(hide=data_folders(self.config))}

    @property
    def num_items(self) -> int | None:
        """How many distinct items a data-set source has; ``None`` for the generator."""
        return self.inner.num_items  # type: ignore[attr-defined]

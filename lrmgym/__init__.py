"""lrmgym: environments with verifiable rewards, judges and learners for training reasoning LLMs with RL.

The public surface::

    import lrmgym
    env = lrmgym.make("Echo-v0")          # or gymnasium.make("lrmgym/Echo-v0")
    prompt, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("...")
    info["verdict"]                         # a lrmgym.Verdict

Heavy dependencies (torch, transformers, vllm, openrlhf) are imported only by the modules that need them.
"""

from lrmgym import envs as _envs  # noqa: F401  (registers the bundled envs)
from lrmgym.core import Completion, Component, Group, Task, TextEnv, Trajectory, Turn, Verdict, task_rng
from lrmgym.registry import UnknownEnvError, list_envs, make, register, spec

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "Component",
    "Group",
    "Task",
    "TextEnv",
    "Trajectory",
    "Turn",
    "UnknownEnvError",
    "Verdict",
    "list_envs",
    "make",
    "register",
    "spec",
    "task_rng",
]

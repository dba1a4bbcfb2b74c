"""Bundled environments. Each domain lives in its own sub-package and registers itself here by id.

Registration stores only ``module:Class`` strings, so importing :mod:`lrmgym` imports no env module;
the module is imported when the env is first made.
"""

from lrmgym.registry import register

register("Echo-v0", "lrmgym.envs.echo:EchoEnv")
register("Math-v0", "lrmgym.envs.math.env:MathEnv")
register("Code-v0", "lrmgym.envs.code.env:CodeEnv")
register("MathTool-v0", "lrmgym.envs.math_tool.env:MathToolEnv")
register("Game24-v0", "lrmgym.envs.game24.env:Game24Env")
register("MultipleChoice-v0", "lrmgym.envs.mcq.env:MultipleChoiceEnv")
register("ReasoningGym-v0", "lrmgym.envs.rg.env:RGEnv")
register("Testbed-v0", "lrmgym.envs.math.testbed:TestbedEnv")

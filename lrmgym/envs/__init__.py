"""Bundled environments. Each domain lives in its own sub-package and registers itself here by id.

Registration stores only ``module:Class`` strings, so importing :mod:`lrmgym` imports no env module;
the module is imported when the env is first made.
"""

from lrmgym.registry import register

register("Echo-v0", "lrmgym.envs.echo:EchoEnv")
register("Math-v0", "lrmgym.envs.math.env:MathEnv")
register("Code-v0", "lrmgym.envs.code.env:CodeEnv")
register("Game24-v0", "lrmgym.envs.game24.env:Game24Env")
register("Testbed-v0", "lrmgym.envs.math.testbed:TestbedEnv")

"""Bundled environments. Each domain lives in its own sub-package and registers itself here by id.

Registration stores only ``module:Class`` strings, so importing :mod:`lrmgym` imports no env module;
the module is imported when the env is first made.
"""

from lrmgym.registry import register

register("Echo-v0", "lrmgym.envs.echo:EchoEnv")

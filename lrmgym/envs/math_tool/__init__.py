"""``lrmgym/MathTool-v0`` (``env=math_tool``): math problems where the policy may run Python before answering.

See :mod:`lrmgym.envs.math_tool.env` for the env and :mod:`lrmgym.envs.tools` for the tool-call rules and the
pattern for adding tools to another env.
"""

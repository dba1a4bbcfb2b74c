"""``lrmgym/Code-v0``: Python programming tasks graded by unit tests run in an isolated sandbox.

Modules: :mod:`~lrmgym.envs.code.env` (the env), :mod:`~lrmgym.envs.code.sandbox` (isolation and the
pool), :mod:`~lrmgym.envs.code.harness` (the in-sandbox grader the candidate cannot forge),
:mod:`~lrmgym.envs.code.loaders` (HumanEval, MBPP, JSONL), :mod:`~lrmgym.envs.code.procedural` (generated
tasks), :mod:`~lrmgym.envs.code.extract` (code extraction).
"""

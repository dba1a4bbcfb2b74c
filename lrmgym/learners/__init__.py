"""Learners: turn graded rollouts into a better policy. ``learner=grpo`` is :class:`lrmgym.learners.grpo.GRPOConfig`.

Submodules are imported on demand (torch is heavy): :mod:`~lrmgym.learners.losses` and
:mod:`~lrmgym.learners.advantages` (pure tensor functions), :mod:`~lrmgym.learners.rollout` (multi-turn
trajectories to masked token tensors), :mod:`~lrmgym.learners.rundir` (run directory, checkpoints, plots)
and :mod:`~lrmgym.learners.grpo` (the loop).
"""

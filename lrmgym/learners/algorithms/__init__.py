"""The learning algorithms: advantage estimators, policy losses, and the learners built from them.

GRPO, DAPO, PPO, SFT/distillation, Ring-Zero, ReasonMaxxer. Each runs on :mod:`lrmgym.learners.engine`.
Submodules are imported on demand.
"""

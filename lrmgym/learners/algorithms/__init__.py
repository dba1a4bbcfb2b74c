"""The learning algorithms: advantage estimators, policy losses, and the learners built from them.

GRPO, DAPO, PPO, SFT/distillation, Ring-Zero, ReasonMaxxer, KL-LoRA distillation (kl_distill). Each runs on
:mod:`lrmgym.learners.engine`.
Submodules are imported on demand.
"""

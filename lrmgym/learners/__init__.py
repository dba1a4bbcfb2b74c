"""Learners: turn graded rollouts into a better policy.

``learner=grpo`` is :class:`lrmgym.learners.algorithms.grpo.GRPOConfig`.

Two packages, so a newcomer finds the machinery apart from the maths:

- :mod:`lrmgym.learners.engine` runs any learner: the step loop (``loop``), the policy-gradient update over
  micro-batches (``update``), multi-turn rollouts to token tensors (``rollout``, ``async_rollout``), the run
  directory, checkpoints and resume (``rundir``, ``resume``, ``staged``), metrics and FLOP counts (``metrics``,
  ``flops``), judged-rollout files (``traces``, ``export``) and the name registries (``registry``).
- :mod:`lrmgym.learners.algorithms` holds what each method computes: advantage estimators and policy losses
  (``advantages``, ``losses``), GRPO, DAPO, PPO and its critic, SFT and distillation, Ring-Zero and ReasonMaxxer.

Submodules are imported on demand (torch is heavy).
"""

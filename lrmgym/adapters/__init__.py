"""Adapters to other trainers' own plug-in points: lrmgym envs and judges inside TRL and verl.

- :mod:`lrmgym.adapters.trl`: reward functions with the signature TRL's ``GRPOTrainer`` calls, and a
  ``datasets.Dataset`` of prompts and task labels to train on.
- :mod:`lrmgym.adapters.verl`: verl's custom reward function (``compute_score``), and the parquet files and
  ``reward.py`` that ``lrmgym export verl`` writes.

Neither module imports its trainer: they only have to match the calls the trainer makes. The tasks travel as
the labels of :mod:`lrmgym.integrations.labels`, so the process that grades rebuilds each task from two numbers.
(OpenRLHF is a backend: see :mod:`lrmgym.integrations.openrlhf_launch` and ``lrmgym export openrlhf``.)
"""

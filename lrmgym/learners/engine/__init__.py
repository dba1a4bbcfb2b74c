"""The learner engine: what every learner runs on (loop, update, rollout, run directory, resume, metrics).

An algorithm (:mod:`lrmgym.learners.algorithms`) says what to compute from a graded rollout; the engine
samples, batches, steps the optimiser, checkpoints, resumes and logs. Submodules are imported on demand.
"""

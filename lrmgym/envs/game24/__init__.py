"""The 24-point game: exact solver, eval-free checker, seeded generator, held-out ToT split, and the env.

``lrmgym.make("Game24-v0", mode="single" | "steps", split="train" | "test", ...)``; see
:class:`lrmgym.envs.game24.env.Game24Config` for the options.
"""

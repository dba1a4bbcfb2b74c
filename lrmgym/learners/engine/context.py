"""What a learner receives: the built world of one run (:class:`RunContext`).

Learners never build their own env or policy. The composition root (:mod:`lrmgym.compose`) builds them from
a resolved config, or a library user passes objects directly, so that one stage can continue another's
weights and any env or policy object can be trained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunContext"]


@dataclass
class RunContext:
    """The world a learner trains in.

    Attributes:
        env: The env, judges included (a :class:`~lrmgym.core.LearnerEnv`: ``task_at``, ``score_group``,
            ``feedback``, ``max_turns``).
        policy: The policy to train (a :class:`~lrmgym.policies.base.TrainablePolicy` for the native learners).
        eval: Held-out evaluation settings (:class:`~lrmgym.eval.config.EvalConfig`).
        seed: The run's seed; every stream of randomness derives from it.
        run_dir: Where the run writes (created by the caller).
        make_env: Builds an equal env in another process (async rollout workers); picklable. ``None``: the
            run cannot hand its env to a worker. Replacing ``env`` after construction drops a builder that was
            not also replaced (it would build the old env in the worker): the learner then samples in this
            process and says so, unless the new ``make_env`` is assigned too.
        make_policy: Builds an equal policy in another process; picklable, or ``None``; dropped like
            ``make_env`` when ``policy`` is replaced alone.
        config: The resolved run config, when there is one (written to records; never used to build).
        report_to: The experiment trackers the run loop also logs to (``run.report_to``; see
            :mod:`lrmgym.tracking`).
        model_commands: ``run_dir -> {"eval": ..., "export": ..., "eval_export": ...}``, the commands that
            evaluate and export the trained model, for the run's summary (:func:`lrmgym.runs.model_commands`,
            given by the composition root); ``None``: the summary has none.
        load_model: ``(name, option) -> policy``: loads a model a learner's option names (a model folder, a run
            directory of ``lrmgym run``, tiny), in eval mode; a bad name raises a one-line ``ValueError`` that
            starts with ``option`` (:func:`lrmgym.compose.load_named_model`, given by the composition root).
            ``None``: the run cannot load other models (``learner=kl_distill`` needs it for its teacher).
    """

    env: Any
    policy: Any
    eval: Any
    seed: int
    run_dir: Path
    make_env: Callable[[], Any] | None = None
    make_policy: Callable[[], Any] | None = None
    config: Any = None
    report_to: tuple[str, ...] = ()
    model_commands: Callable[[Path], dict[str, str]] | None = None
    load_model: Callable[[str, str], Any] | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        # Which builders the user assigned after construction: those vouch for the env/policy they build.
        object.__setattr__(self, "_own_builders", set())
        object.__setattr__(self, "_dropped", {})

    def __setattr__(self, name: str, value: Any) -> None:
        """Keep a worker builder only while it still builds the object it was given for (see ``make_env``)."""
        built = self.__dict__.get("_own_builders")
        if built is not None:  # after __post_init__
            if name in _BUILDER_OF and value is not self.__dict__.get(name):
                builder = _BUILDER_OF[name]
                if builder not in built and self.__dict__.get(builder) is not None:
                    object.__setattr__(self, builder, None)
                    self._dropped[builder] = name
            elif name in _BUILDER_OF.values():
                built.add(name)
                self._dropped.pop(name, None)
        object.__setattr__(self, name, value)

    def worker_builders_missing(self) -> str | None:
        """Why a worker process cannot rebuild this run's env and policy, in a few words; ``None``: it can."""
        for builder, replaced in self._dropped.items():  # an entry leaves when its builder is assigned again
            return f"ctx.{replaced} was replaced after the context was built, without a new ctx.{builder}"
        missing = [name for name in ("make_env", "make_policy") if getattr(self, name) is None]
        return f"the run context has no {' or '.join('ctx.' + m for m in missing)}" if missing else None


_BUILDER_OF = {"env": "make_env", "policy": "make_policy"}

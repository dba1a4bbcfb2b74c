"""The resolved run configuration: one pydantic model per section, each owned by its component.

``RunConfig`` is built only by :func:`lrmgym.configs.resolve.resolve`, which validates each section against
the model its component declares (the env's ``Config``, the policy / learner / judge kind's config class,
``EvalConfig``) and turns every failure into one :class:`~lrmgym.configs.errors.ConfigError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from lrmgym.tracking import TrackerName

__all__ = ["EnvConfig", "NativeBackendConfig", "RunConfig", "RunSection", "StrictModel"]


class StrictModel(BaseModel):
    """Base of lrmgym's config models: unknown keys are errors, and each field's docstring is its help."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class EnvConfig(BaseModel):
    """Which environment, and its options.

    Options other than ``id`` are validated against the env class's own ``Config`` model when the config is
    resolved, so ``env.difficulty=9`` is checked by the env that defines ``difficulty``.
    """

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    id: str = "lrmgym/Echo-v0"
    """Registered environment id, e.g. lrmgym/Math-v0 (see `lrmgym envs list`)."""

    @property
    def options(self) -> dict[str, Any]:
        """The env's options: every key but ``id``."""
        return dict(self.model_extra or {})

    def make(self) -> Any:
        """Make the environment with its options."""
        from lrmgym.registry import make

        return make(self.id, **self.options)


class RunSection(StrictModel):
    """Where and how a run is recorded."""

    name: str | None = None
    """Name of the run directory under output_dir; default: <env>-<learner>-<UTC timestamp>."""
    output_dir: Path = Path("runs")
    """Folder that holds run directories."""
    seed: int = Field(0, ge=0)
    """Master seed: task streams, sampling and initialisation derive from it."""
    report_to: tuple[TrackerName, ...] = ()
    """Experiment trackers that also get the run's metrics, evaluations, samples and config: any of tensorboard,
    wandb, mlflow (`pip install "lrmgym[tracking]"`); empty: the run directory alone. See lrmgym/tracking."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_list(cls, value: Any) -> Any:
        """``run.report_to=wandb`` means ``[wandb]`` and ``null`` means ``[]``; a tracker named twice is refused."""
        names = [] if value is None else [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)):
            raise ValueError("expected a list of trackers, e.g. run.report_to=[tensorboard,wandb,mlflow]")
        twice = sorted({str(n) for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(map(repr, twice))} is listed twice; name each tracker once")
        return names


class NativeBackendConfig(StrictModel):
    """Train in this process with lrmgym's own learner loop (the default backend)."""

    kind: Literal["native"] = "native"
    """The backend kind: native (this process), or openrlhf (see lrmgym/configs/presets/backend/openrlhf.yaml)."""


class RunConfig(BaseModel):
    """Everything one ``lrmgym run`` or ``lrmgym eval`` needs, validated."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    env: EnvConfig
    """The environment."""
    policy: SerializeAsAny[BaseModel]
    """The policy (a config with `kind` and `build()`)."""
    learner: SerializeAsAny[BaseModel]
    """The learner (a config with `kind` and `build(ctx)`, which returns its run loop; see lrmgym.compose)."""
    judge: dict[str, SerializeAsAny[BaseModel]] = Field(default_factory=dict)
    """Judges wrapped around the env, by name; empty means the env's own verifier alone."""
    eval: SerializeAsAny[BaseModel]
    """Held-out evaluation settings."""
    run: RunSection = Field(default_factory=RunSection)
    """Run directory and seed."""
    backend: SerializeAsAny[BaseModel] = Field(default_factory=NativeBackendConfig)
    """Where training runs: native (this process, the default) or openrlhf (OpenRLHF on Ray GPUs)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON types), in the shape :func:`~lrmgym.configs.resolve.resolve_dict` reads back.

        The native backend, the default, is left out: an absent ``backend`` means native, so the config of a
        native run reads exactly as it did before backends existed (and ``--resume`` of older runs sees no new key).
        """
        native = getattr(self.backend, "kind", "native") == "native"
        return self.model_dump(mode="json", exclude={"backend"} if native else None)

    def to_yaml(self) -> str:
        """The resolved config as YAML."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

"""Ring-Zero's RL stage options: :class:`RingZeroRLConfig` (RL-1's defaults), RL-1, RL-2, RL-3 and its tiers.

Each RL stage is the GRPO learner (:class:`~lrmgym.learners.algorithms.grpo.GRPOConfig`) with these options;
the stage list and the SD stage's options are :class:`~lrmgym.learners.algorithms.ring_zero.RingZeroConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lrmgym.learners.algorithms.grpo import GRPOConfig
from lrmgym.learners.algorithms.losses import LossAgg, PolicyLossName

__all__ = ["RL1Config", "RL2Config", "RL3Config", "RingZeroRLConfig", "TierConfig"]


class RingZeroRLConfig(GRPOConfig):
    """An RL stage of Ring-Zero: the GRPO learner's options with Ring-Zero's reward and loss defaults (RL-1's)."""

    kind: Literal["grpo"] = Field("grpo", exclude=True)
    """Not a choice here: every RL stage is the GRPO learner (not written to config.yaml)."""
    format_reward: Literal["strict", "loose", "none"] = "strict"
    """The format reward added to the env's: strict (format B: <think>...</think><answer>...</answer>, both
    closed, ending at EOS), loose (format A: a closed <think> block; papers.md 3.3 shows it exploited by text
    after the answer) or none. An env whose judges already check the format gets no second one."""
    format_weight: float = Field(1.0, ge=0.0, le=100.0)
    """Weight of the format reward (the paper's reward curves fit accuracy 0/1 + format 0/1)."""
    pg_loss: PolicyLossName = "cispo"
    """RL-1's clipped-IS policy gradient: -sg(min(rho, cap)) * A * log pi, no lower clip (ppo_clip to compare)."""
    is_cap: float | None = Field(5.0, gt=0.0, le=1000.0)
    """The importance-weight cap; absolute by default (papers.md 3.2 reads the sources' 5.0 as the cap)."""
    is_cap_mode: Literal["relative", "absolute"] = "absolute"
    """absolute (the cap is is_cap) or relative (1 + is_cap: the other reading of "epsilon_high = 5.0")."""
    behavior_logprobs: Literal["recompute", "sampler"] = "sampler"
    """The ratio correction: rho's denominator is the sampler's recorded log-prob, never a recomputation."""
    loss_agg: LossAgg = "token_mean"
    """RL-1's token-level loss (one mean over the batch's tokens); RL-2 and RL-3 use seq_mean_token_mean."""
    kl_coef: float = Field(1e-4, ge=0.0, le=100.0)
    """RL-1's k3 KL weight (beta = 1e-4); RL-2 and RL-3 have none."""
    ref_refresh_steps: int | None = Field(100, ge=1)
    """Reset the KL reference to the policy every this many steps (the paper: 400 of its thousands of steps)."""
    drop_zero_advantage: bool = True
    """Skip zero-advantage trajectories in the update (kept anyway while kl_coef > 0, as in GRPO)."""
    task_stream: Literal["own", "first"] = "own"
    """Where the stage's tasks come from: its own stream (a procedural env gives new problems) or the first
    stage's, from its start (a second pass over the problems RL-1 trained on, as the paper's stages share one
    data set; RL-3's default, so that its tasks have a shortest correct solution to be tiered by)."""

    @model_validator(mode="before")
    @classmethod
    def _cap_only_for_cispo(cls, data: Any) -> Any:
        # The cap belongs to cispo: with another pg_loss (ppo_clip, to compare against) and no cap asked for,
        # the stage has none, instead of an error about a default the user never set.
        if isinstance(data, dict) and data.get("pg_loss", "cispo") != "cispo" and "is_cap" not in data:
            data = {**data, "is_cap": None, "is_cap_mode": data.get("is_cap_mode", "relative")}
        return data


class RL1Config(RingZeroRLConfig):
    """RL-1 (papers.md 3.2): clipped IS with ratio correction, token-level loss, k3 KL, the response window."""

    window_start: int | Literal["auto"] | None = Field("auto")
    """The response window's first token budget, doubled every window_every_steps up to max_new_tokens (the
    paper: 4k -> 64k every 800 steps). "auto": the longest reference solution (tokens, EOS included) among the
    tasks the first window sees (up to 2048 of them, lrmgym/learners/algorithms/ring_zero_window.py), so that it
    cuts no task the model could solve as its references do; max_new_tokens when the env has no references. A
    number below that longest reference is run as given, with a warning naming how many tasks it cuts. None:
    max_new_tokens throughout."""
    window_every_steps: int = Field(150, ge=1)
    """Steps between doublings of the response window."""

    @field_validator("window_start", mode="before")
    @classmethod
    def _check_window_start(cls, value: Any) -> Any:
        if value is None or value == "auto":
            return value
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000:
            return value
        raise ValueError(
            "expected a token count from 1 to 1000000, 'auto' (the longest reference solution) or null "
            "(max_new_tokens throughout)."
        )


class RL2Config(RingZeroRLConfig):
    """RL-2 (papers.md 3.5): the sample-level loss, no KL; ratio correction and the IS cap kept."""

    loss_agg: LossAgg = "seq_mean_token_mean"
    """Sample-level: the mean over each trace's tokens, then over the traces."""
    kl_coef: float = Field(0.0, ge=0.0, le=100.0)
    """No KL in RL-2."""
    ref_refresh_steps: int | None = Field(None, ge=1)
    """No reference resets (no KL term)."""


class TierConfig(BaseModel):
    """One RL-3 tier: a token cap and (with RL-3's tier_marker=prompt) a prompt placed before the task."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")
    """The tier's name (metrics tier/<name>/..., eval/tier_<name>)."""
    max_new_tokens: int = Field(ge=1, le=1_000_000)
    """The tier's token cap."""
    prompt: str = Field("Reasoning budget: {name}, at most {max_new_tokens} tokens.\n", max_length=2000)
    """Text put before the task's prompt (a system message for chat prompts); {name} and {max_new_tokens} are
    filled in. The paper's tier prompts are not recovered (papers.md 3.9); this one is ours."""

    def text(self) -> str:
        """The prompt with its placeholders filled in."""
        return self.prompt.replace("{name}", self.name).replace("{max_new_tokens}", str(self.max_new_tokens))


def _default_tiers() -> list[TierConfig]:
    # The paper's 4k / 16k / 64k, scaled to the tiny model's answers (one step ~15 tokens, two ~21, up to ~35).
    return [
        TierConfig(name="low", max_new_tokens=18),
        TierConfig(name="medium", max_new_tokens=28),
        TierConfig(name="high", max_new_tokens=48),
    ]


class RL3Config(RL2Config):
    """RL-3 (papers.md 3.5): RL-2 with tiers (a task's tier from its shortest correct solution so far)."""

    tiers: list[TierConfig] = Field(default_factory=_default_tiers, min_length=1, max_length=16)
    """The tiers, by increasing token cap. A task goes to the lowest tier whose cap holds its shortest correct
    solution seen so far (in any earlier stage or this one); one never solved goes to the last tier. [OURS]: the
    paper's assignment rule is not recovered; this uses the proxy its Fig. 10d uses."""
    tier_marker: Literal["cap", "prompt"] = "cap"
    """How a sample is told its tier. cap (default): by the token cap alone, the prompt unchanged, so that the
    model sees only text of its own distribution (the tiny models never saw text before "Q:": greedy accuracy
    of the shipped model on 200 held-out tasks fell from 77.5 % to 53.5 % with "L " before the prompt, to 1 %
    with "Reasoning budget: low, at most 18 tokens."); prompt: each tier's prompt before the task (the paper's
    per-tier system prompts), as RL-3 did before."""
    eval_tiers: bool = True
    """After the stage, evaluate the held-out tasks once per tier (its prompt and cap)."""
    task_stream: Literal["own", "first"] = "first"
    """The first stage's task stream by default: a task is tiered by the shortest correct solution seen, and a
    procedural env's own stream would give RL-3 problems no stage has seen (all in the last tier)."""

    @model_validator(mode="after")
    def _check_tiers(self) -> RL3Config:
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers: names must be unique, got {names}.")
        caps = [t.max_new_tokens for t in self.tiers]
        if caps != sorted(caps) or len(set(caps)) != len(caps):
            raise ValueError(f"tiers: token caps must increase from tier to tier, got {caps}.")
        if caps[-1] > self.max_new_tokens:
            raise ValueError(
                f"tiers: the last tier's cap {caps[-1]} exceeds max_new_tokens={self.max_new_tokens}; raise "
                "max_new_tokens (it bounds every rollout) or lower the cap."
            )
        if self.async_rollouts:
            raise ValueError(
                "rl3 samples each tier with its own prompt and cap, which the async rollout worker cannot do; set "
                "learner.rl3.async_rollouts=false."
            )
        return self

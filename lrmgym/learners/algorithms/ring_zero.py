"""Ring-Zero: the staged zero-RL learner (``learner=ring_zero``; papers.md section 3).

Four stages, run in order in one run directory by :class:`~lrmgym.learners.engine.staged.StagedRun`::

    rl1  clipped-IS policy gradient from the base model: the weight sg(min(rho, 5.0)) on every token (no lower
         clip, no token loses its gradient), rho = trainer / sampler log-prob (the ratio correction), one mean
         over the batch's tokens, k3 KL (beta 1e-4) to a reference reset every N steps, reward = accuracy +
         format B, and a response window that doubles every M steps from the longest reference solution of
         the stage's training tasks (window_start=auto; lrmgym/learners/algorithms/ring_zero_window.py)
    sd   self-distillation: the shortest correct trace per problem from the RL stages' rollouts, optionally
         pruned by a policy (kept only if it still verifies), then supervised fine-tuning of the *base* model
         (lrmgym/learners/algorithms/distill.py, on the masked-CE code `lrmgym tiny build` uses)
    rl2  as rl1 with the sample-level loss (each trace's mean, then the mean over traces) and no KL
    rl3  as rl2 with tiers: each task gets a token cap (and, with tier_marker=prompt, a tier prompt) by the length
         of its shortest correct solution seen so far; evaluated per tier at the end

The stage options are :mod:`~lrmgym.learners.algorithms.ring_zero_config`, the RL stages' algorithm
:mod:`~lrmgym.learners.algorithms.ring_zero_rl`; this module holds the stage list and the stages themselves.
Stages are config: ``learner.stages=[rl1,sd]`` runs only those, ``learner.rl1.steps=200`` sets one stage's
option (every stage's options are its config class's fields, listed by ``lrmgym config show
learner=ring_zero``). Each RL stage is the GRPO learner (:mod:`lrmgym.learners.algorithms.grpo`) with these options plus
what Ring-Zero adds: the format reward, the shortest-correct record and the tiers. Metrics every stage logs:
``train_infer/logp_abs_diff`` and ``train_infer/kl`` (the train/infer gap), ``entropy``, ``length/mean``,
``format_ok_frac``, ``all_failed_frac``, ``clip_frac`` (the share of capped tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.learners.algorithms.distill import (
    SDConfig,
    Trace,
    build_corpus,
    pruner_for,
    read_traces,
    self_distill_loop,
    write_traces,
)
from lrmgym.learners.algorithms.ring_zero_config import RingZeroRLConfig, RL1Config, RL2Config, RL3Config, TierConfig
from lrmgym.learners.algorithms.ring_zero_rl import RingZeroRL, after_answer, with_tier
from lrmgym.learners.algorithms.ring_zero_window import fit_window
from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop
from lrmgym.learners.engine.onpolicy import _TRAIN_STREAM
from lrmgym.learners.engine.staged import StagedRun

__all__ = [
    "RL1Config",
    "RL2Config",
    "RL3Config",
    "RingZeroConfig",
    "RingZeroRL",
    "RingZeroRLConfig",
    "TierConfig",
    "after_answer",
    "with_tier",
]

StageName = Literal["rl1", "sd", "rl2", "rl3"]
TRACES_FILE = "traces.jsonl"
CORPUS_FILE = "corpus.jsonl"


class RingZeroConfig(BaseModel):
    """Options of ``learner=ring_zero``: the stage list and each stage's options."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: Literal["ring_zero"] = "ring_zero"
    """The learner kind."""
    stages: list[StageName] = Field(default_factory=lambda: ["rl1", "sd", "rl2", "rl3"], min_length=1)
    """The stages to run, in order (e.g. [rl1] or [rl1, sd]); each starts from the weights the previous one left
    (sd from the base model). A resumed run may append stages."""
    rl1: RL1Config = Field(default_factory=RL1Config)
    """RL-1's options."""
    sd: SDConfig = Field(default_factory=SDConfig)
    """The self-distillation stage's options."""
    rl2: RL2Config = Field(default_factory=RL2Config)
    """RL-2's options."""
    rl3: RL3Config = Field(default_factory=lambda: RL3Config(async_rollouts=False))
    """RL-3's options."""

    @model_validator(mode="after")
    def _check_stages(self) -> RingZeroConfig:
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages: each stage may appear once, got {self.stages}.")
        if "sd" in self.stages and not any(s in self.stages[: self.stages.index("sd")] for s in ("rl1", "rl2")):
            raise ValueError(
                f"stages={self.stages}: sd distils the shortest correct traces of an earlier RL stage; put rl1 "
                "(or rl2) before it."
            )
        return self

    def seed_torch(self, seed: int) -> None:
        """Seed torch for the run (before the policy is built), as the other learners do."""
        self.rl1.seed_torch(seed)

    def build(self, ctx: RunContext) -> StagedRun:
        """The staged run over ``ctx``; ``.run(resume=...)`` trains."""
        stages: list[Any] = []
        for name in self.stages:
            stages.append(_SDStage(self.sd) if name == "sd" else _RLStage(name, getattr(self, name)))
        return StagedRun(ctx, stages, learner="ring_zero")


def _format_env(make_env: Any, mode: str, weight: float) -> Any:
    """``make_env()`` with the format reward (picklable through functools.partial: the async worker builds it)."""
    return with_format(make_env(), mode, weight)


def with_format(env: Any, mode: str, weight: float) -> Any:
    """``env`` with a format judge of ``mode`` added to its reward (no second one where a judge checks it)."""
    from lrmgym.judges.base import JudgedEnv
    from lrmgym.judges.rule import AccuracyJudge, FormatJudge

    if any(isinstance(j, FormatJudge) for j in getattr(env, "judges", ())):
        return env
    return JudgedEnv(env, [AccuracyJudge(), FormatJudge(mode, weight=weight)])  # type: ignore[arg-type]


class _RLStage:
    """An RL stage of the staged run: the GRPO loop with Ring-Zero's reward, records and tiers."""

    from_base = False

    def __init__(self, name: str, cfg: RingZeroRLConfig) -> None:
        self.name, self.cfg = name, cfg
        self.algorithm: RingZeroRL | None = None
        self.window: dict[str, Any] = {}  # fit_window's findings: the first budget against the references

    def build(self, run: StagedRun, ctx: RunContext) -> Loop:
        cfg = self.cfg
        if cfg.format_reward != "none":
            make_env = functools.partial(_format_env, ctx.make_env, cfg.format_reward, cfg.format_weight)
            ctx = dataclasses.replace(
                ctx, env=with_format(ctx.env, cfg.format_reward, cfg.format_weight),
                make_env=make_env if ctx.make_env is not None else None,
            )  # fmt: skip
        stream = derived_seed(run.ctx.seed, _TRAIN_STREAM) if cfg.task_stream == "first" else None
        seed = stream if stream is not None else derived_seed(ctx.seed, _TRAIN_STREAM)
        cfg, self.window = fit_window(cfg, ctx.env, ctx.policy.tokenizer, seed, self.name)
        self.algorithm = RingZeroRL(cfg, self.name, known=known_lengths(run), stream_seed=stream)
        return Loop(ctx, cfg, self.algorithm)

    def finish(self, run: StagedRun, ctx: RunContext, loop: Loop, summary: dict[str, Any]) -> dict[str, Any]:
        assert self.algorithm is not None
        traces = sorted(self.algorithm.traces.values(), key=lambda t: t.task_id)
        write_traces(ctx.run_dir / TRACES_FILE, traces)
        mean = sum(t.tokens for t in traces) / len(traces) if traces else None
        out: dict[str, Any] = {"traces": len(traces), "trace_tokens_mean": mean, "window": self.window,
                               "notes": {"traces": len(traces), "window": self.window.get("window")}}  # fmt: skip
        if self.algorithm.tiers and getattr(self.cfg, "eval_tiers", False):
            out["tiers"] = tiers = {}
            for tier in self.algorithm.tiers:
                eval_cfg = loop.ctx.eval.model_copy(update={"max_new_tokens": tier.max_new_tokens})
                transform = functools.partial(self.algorithm.tiered, tier=tier)
                tiers[tier.name] = loop.evaluate(f"tier_{tier.name}", cfg=eval_cfg, transform=transform)
                acc = tiers[tier.name]["sampled"]
                out["notes"][tier.name] = f"{100 * acc['accuracy']:.1f}% ({acc['mean_tokens'] or 0:.1f} tok)"
        return out


def known_lengths(run: StagedRun) -> dict[str, int]:
    """The shortest correct solution length (tokens) of every task the finished stages solved."""
    known: dict[str, int] = {}
    for trace in earlier_traces(run):
        known[trace.task_id] = min(trace.tokens, known.get(trace.task_id, trace.tokens))
    return known


def earlier_traces(run: StagedRun) -> list[Trace]:
    """The traces the finished RL stages recorded, in stage order."""
    out: list[Trace] = []
    for record in run.earlier():
        path = record.folder / TRACES_FILE
        if path.is_file():
            out += read_traces(path)
    return out


# --------------------------------------------------------------------------------------------------- SD stage
class _SDStage:
    """Self-distillation: the corpus from the earlier RL stages' traces, then masked CE on the base model."""

    name = "sd"
    from_base = True  # the paper distils into the base model, resetting the train/infer drift

    def __init__(self, cfg: SDConfig) -> None:
        self.cfg = cfg
        self.report: dict[str, Any] = {}

    def build(self, run: StagedRun, ctx: RunContext) -> Loop:
        import json

        from lrmgym.files import atomic_write_text

        path = ctx.run_dir / CORPUS_FILE
        if path.is_file():  # a resumed stage: the corpus it was building on (pruning is not repeated)
            record = json.loads((ctx.run_dir / "corpus_report.json").read_text(encoding="utf-8"))
            corpus = [(row["prompt_token_ids"], row["target_token_ids"]) for row in map(json.loads, _lines(path))]
            self.report = record
        else:  # the policy still holds the weights the previous stage left (the RL model): it may prune
            start = time.perf_counter()
            pruner = pruner_for(self.cfg, ctx.policy)
            corpus, report = build_corpus(earlier_traces(run), ctx.env, ctx.policy.tokenizer, self.cfg, pruner)
            self.report = {**report.to_dict(), "build_s": time.perf_counter() - start}
            rows = [json.dumps({"prompt_token_ids": p, "target_token_ids": t}) for p, t in corpus]
            atomic_write_text(ctx.run_dir / "corpus_report.json", json.dumps(self.report, indent=1, default=str) + "\n")
            atomic_write_text(path, "".join(r + "\n" for r in rows))
        run.load_base()
        return self_distill_loop(ctx, self.cfg, corpus)

    def finish(self, run: StagedRun, ctx: RunContext, loop: Loop, summary: dict[str, Any]) -> dict[str, Any]:
        report = self.report
        notes = {"corpus": report.get("kept", report.get("traces"))}
        if report.get("pruned_accepted") is not None:
            notes["pruned"] = report["pruned_accepted"]
        return {"corpus": report, "notes": notes}


def _lines(path: Any) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

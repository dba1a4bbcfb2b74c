"""Ring-Zero: the staged zero-RL learner (``learner=ring_zero``; papers.md section 3).

Four stages, run in order in one run directory by :class:`~lrmgym.learners.engine.staged.StagedRun`::

    rl1  clipped-IS policy gradient from the base model: the weight sg(min(rho, 5.0)) on every token (no lower
         clip, no token loses its gradient), rho = trainer / sampler log-prob (the ratio correction), one mean
         over the batch's tokens, k3 KL (beta 1e-4) to a reference reset every N steps, reward = accuracy +
         format B, and a response window that doubles every M steps
    sd   self-distillation: the shortest correct trace per problem from the RL stages' rollouts, optionally
         pruned by a policy (kept only if it still verifies), then supervised fine-tuning of the *base* model
         (lrmgym/learners/algorithms/distill.py, on the masked-CE code `lrmgym tiny build` uses)
    rl2  as rl1 with the sample-level loss (each trace's mean, then the mean over traces) and no KL
    rl3  as rl2 with tiers: each task gets a system prompt and a token cap by the length of its shortest correct
         solution seen so far; evaluated per tier at the end

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

from lrmgym.core import Task
from lrmgym.episodes import Rollout, rollout
from lrmgym.learners.algorithms.distill import (
    SDConfig,
    Trace,
    build_corpus,
    pruner_for,
    read_traces,
    self_distill_loop,
    write_traces,
)
from lrmgym.learners.algorithms.grpo import GRPO, GRPOConfig
from lrmgym.learners.algorithms.losses import LossAgg, PolicyLossName
from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.loop import Loop, StepResult
from lrmgym.learners.engine.onpolicy import _SAMPLING, _TRAIN_STREAM
from lrmgym.learners.engine.staged import StagedRun

__all__ = [
    "RL1Config",
    "RL2Config",
    "RL3Config",
    "RingZeroConfig",
    "RingZeroRL",
    "RingZeroRLConfig",
    "TierConfig",
    "with_tier",
]

StageName = Literal["rl1", "sd", "rl2", "rl3"]
TRACES_FILE = "traces.jsonl"
CORPUS_FILE = "corpus.jsonl"
_TIER_SAMPLING = 0x7469  # "ti": the sampling seeds of RL-3's tier rollouts


# --------------------------------------------------------------------------------------------------- configs
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

    window_start: int | None = Field(24, ge=1, le=1_000_000)
    """The response window's first token budget, doubled every window_every_steps up to max_new_tokens (the
    paper: 4k -> 64k every 800 steps; 24 -> 48 for the tiny model, whose answers take 15-35 tokens)."""
    window_every_steps: int = Field(150, ge=1)
    """Steps between doublings of the response window."""


class RL2Config(RingZeroRLConfig):
    """RL-2 (papers.md 3.5): the sample-level loss, no KL; ratio correction and the IS cap kept."""

    loss_agg: LossAgg = "seq_mean_token_mean"
    """Sample-level: the mean over each trace's tokens, then over the traces."""
    kl_coef: float = Field(0.0, ge=0.0, le=100.0)
    """No KL in RL-2."""
    ref_refresh_steps: int | None = Field(None, ge=1)
    """No reference resets (no KL term)."""


class TierConfig(BaseModel):
    """One RL-3 tier: a prompt placed before the task and a token cap."""

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


# --------------------------------------------------------------------------------------------------- RL stages
def with_tier(task: Task, tier: TierConfig) -> Task:
    """``task`` with the tier's prompt before its own (a system message for chat prompts)."""
    text = tier.text()
    if isinstance(task.prompt, str):
        return dataclasses.replace(task, prompt=text + task.prompt)
    messages = list(task.prompt)
    if messages and messages[0].get("role") == "system":
        messages[0] = {**messages[0], "content": text + messages[0].get("content", "")}
    else:
        messages.insert(0, {"role": "system", "content": text.rstrip("\n")})
    return dataclasses.replace(task, prompt=messages)


class RingZeroRL(GRPO):
    """GRPO with Ring-Zero's record of the shortest correct trace per task, and (RL-3) its tiers.

    Args:
        cfg: The stage's options.
        known: Shortest correct solution lengths (tokens) by task id, from earlier stages (RL-3's tiers).
    """

    cfg: RingZeroRLConfig

    def __init__(
        self, cfg: RingZeroRLConfig, name: str, known: dict[str, int] | None = None, stream_seed: int | None = None
    ) -> None:
        super().__init__(cfg)
        self.name = name
        self.stream_seed = stream_seed
        self.traces: dict[str, Trace] = {}
        self.known = dict(known or {})
        self.tiers: list[TierConfig] = list(getattr(cfg, "tiers", []) or [])
        self._tier_metrics: dict[str, Any] = {}
        self._after: dict[str, float] = {}

    def setup(self) -> None:
        """GRPO's setup; the task stream is the first stage's when the stage says so."""
        super().setup()
        if self.stream_seed is not None:
            self.train_seed = self.stream_seed

    # ---- rollouts
    def collect(self) -> tuple[Rollout, float | None]:
        """The step's groups (per tier in RL-3), recorded in the shortest-correct store."""
        start = self.data_pos
        ro, wait_s = self._collect_tiers() if self.tiers else super().collect()
        self._record(ro, start)
        self._after = after_answer([t for group in ro.groups for t in group])
        return ro, wait_s

    def tier_of(self, task_id: str) -> int:
        """The tier index of a task: the lowest whose cap holds its shortest correct solution (never solved: last)."""
        length = self.known.get(task_id)
        if length is not None:
            for i, tier in enumerate(self.tiers):
                if length <= tier.max_new_tokens:
                    return i
        return len(self.tiers) - 1

    def _collect_tiers(self) -> tuple[Rollout, None]:
        cfg, step, g = self.cfg, self.loop.step, self.cfg.group_size
        tasks = self._tasks(self.data_pos)
        which = [self.tier_of(t.id) for t in tasks]
        groups: list[Any] = [None] * len(tasks)
        verdicts: list[Any] = [None] * len(tasks)
        generate_s = score_s = 0.0
        self._tier_metrics = {}
        for k, tier in enumerate(self.tiers):
            rows = [i for i, w in enumerate(which) if w == k]
            self._tier_metrics[f"tier/{tier.name}/tasks"] = len(rows)
            if not rows:
                continue
            seed = derived_seed(self.loop.ctx.seed, _SAMPLING, step, _TIER_SAMPLING, k)
            cap = min(tier.max_new_tokens, cfg.window(step))
            sampling = cfg.sampling(seed, step).model_copy(update={"max_new_tokens": cap})
            ro = rollout(self.env, self.policy, [with_tier(tasks[i], tier) for i in rows], g, sampling, self.turns)
            for i, group, tv in zip(rows, ro.groups, ro.turn_verdicts, strict=True):
                groups[i], verdicts[i] = group, tv
            generate_s += ro.generate_s
            score_s += ro.score_s
            right = [t.verdict.correct for grp in ro.groups for t in grp if t.verdict is not None]
            self._tier_metrics[f"tier/{tier.name}/accuracy"] = sum(bool(c) for c in right) / max(len(right), 1)
        self.data_pos += cfg.prompts_per_step
        return Rollout(groups, verdicts, generate_s, score_s), None

    def _record(self, ro: Rollout, start: int) -> None:
        """Keep each task's shortest correct single-turn trace (with the format, where one was checked)."""
        for b, group in enumerate(ro.groups):
            for t in group:
                v, turns = t.verdict, t.policy_turns
                if v is None or v.correct is not True or v.format_ok is False or len(turns) != 1:
                    continue
                c = turns[0].completion
                if c is None or c.token_ids is None:
                    continue
                n = len(c.token_ids)
                if t.task.id not in self.known or n < self.known[t.task.id]:
                    self.known[t.task.id] = n
                old = self.traces.get(t.task.id)
                if old is None or n < old.tokens:
                    self.traces[t.task.id] = Trace(
                        task_id=t.task.id, position=start + b, stream_seed=self.train_seed,
                        prompt_token_ids=list(c.prompt_token_ids or []), token_ids=list(c.token_ids), text=c.text,
                        tokens=n,
                    )  # fmt: skip

    def train_step(self) -> StepResult:
        """GRPO's step, plus the response window and (RL-3) each tier's share and accuracy."""
        out = super().train_step()
        out.metrics["window"] = self.cfg.window(self.loop.step)
        out.metrics["traces"] = len(self.traces)
        out.metrics.update(self._after)
        out.metrics.update(self._tier_metrics)
        return out

    # ---- state
    def state_dict(self) -> dict[str, Any]:
        """GRPO's state plus the trace store and the known lengths."""
        return {**super().state_dict(), "traces": [t.to_json() for t in self.traces.values()], "known": self.known}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        traces = [Trace.from_json(line) for line in state.get("traces", [])]
        self.traces = {t.task_id: t for t in traces}
        self.known = dict(state.get("known", self.known))


def after_answer(trajs: list[Any]) -> dict[str, float]:
    """How much text the policy wrote after its last ``</answer>`` (format A's exploit, papers.md 3.3).

    ``after_answer/frac``: the share of trajectories whose last policy turn has non-blank text after its last
    ``</answer>``; ``after_answer/chars``: the mean count of those characters (0 for the others).
    """
    counts = []
    for t in trajs:
        turns = t.policy_turns
        if not turns:
            continue
        text = turns[-1].text
        cut = text.rfind("</answer>")
        counts.append(len(text[cut + len("</answer>") :].strip()) if cut >= 0 else 0)
    if not counts:
        return {}
    return {
        "after_answer/frac": sum(c > 0 for c in counts) / len(counts),
        "after_answer/chars": sum(counts) / len(counts),
    }


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

    def build(self, run: StagedRun, ctx: RunContext) -> Loop:
        cfg = self.cfg
        if cfg.format_reward != "none":
            make_env = functools.partial(_format_env, ctx.make_env, cfg.format_reward, cfg.format_weight)
            ctx = dataclasses.replace(
                ctx, env=with_format(ctx.env, cfg.format_reward, cfg.format_weight),
                make_env=make_env if ctx.make_env is not None else None,
            )  # fmt: skip
        stream = derived_seed(run.ctx.seed, _TRAIN_STREAM) if cfg.task_stream == "first" else None
        self.algorithm = RingZeroRL(cfg, self.name, known=known_lengths(run), stream_seed=stream)
        return Loop(ctx, cfg, self.algorithm)

    def finish(self, run: StagedRun, ctx: RunContext, loop: Loop, summary: dict[str, Any]) -> dict[str, Any]:
        assert self.algorithm is not None
        traces = sorted(self.algorithm.traces.values(), key=lambda t: t.task_id)
        write_traces(ctx.run_dir / TRACES_FILE, traces)
        mean = sum(t.tokens for t in traces) / len(traces) if traces else None
        out: dict[str, Any] = {"traces": len(traces), "trace_tokens_mean": mean, "notes": {"traces": len(traces)}}
        if self.algorithm.tiers and getattr(self.cfg, "eval_tiers", False):
            out["tiers"] = tiers = {}
            for tier in self.algorithm.tiers:
                eval_cfg = loop.ctx.eval.model_copy(update={"max_new_tokens": tier.max_new_tokens})
                tiers[tier.name] = loop.evaluate(
                    f"tier_{tier.name}", cfg=eval_cfg, transform=functools.partial(with_tier, tier=tier)
                )
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

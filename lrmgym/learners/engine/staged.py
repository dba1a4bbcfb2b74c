"""Staged runs: learners one after another in one run directory, each starting from the weights the last left.

A pipeline such as Ring-Zero (RL-1 -> self-distillation -> RL-2 -> RL-3) is a list of :class:`Stage` objects.
Each stage builds an ordinary :class:`~lrmgym.learners.engine.loop.Loop` over a context whose run directory is the
stage's own folder, so every stage gets the loop's logs, checkpoints, budgets, SIGTERM handling and resume::

    run_dir/summary.json              the whole run: one entry per stage, before (first) and after (last)
    run_dir/stages/01-rl1/            the stage's loop directory: metrics.jsonl, checkpoints/, eval/, plots/ ...
    run_dir/stages/01-rl1/final.pt    the weights the stage left (written when its loop finished)
    run_dir/stages/01-rl1/stage.json  written last, atomically: the stage is done (its summary and outputs)
    run_dir/stages/02-sd/ ...

Weights: a stage starts from the weights the previous stage left (``final.pt``); a stage may go back to the
*base* weights (the policy as the run built it, e.g. Ring-Zero's distillation trains the base model) with
:meth:`StagedRun.load_base`. Resume: stages with ``stage.json`` are skipped, the first one without it resumes in
its own folder (from its newest checkpoint, or from its start weights when it had none), the rest run fresh. A
kill at any moment therefore continues the stage it hit, never an earlier one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from lrmgym.learners.engine.common import derived_seed
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.rundir import Checkpointer, atomic_torch_save, atomic_write_json, lock_run_dir

__all__ = ["Stage", "StageRecord", "StagedRun", "newest_checkpoint"]

STAGES_DIR = "stages"
FINAL_WEIGHTS = "final.pt"
STAGE_RECORD = "stage.json"
_STAGE_SEED = 0x7374  # "st": the seed stream of stages after the first


class Stage(Protocol):
    """One stage of a :class:`StagedRun`.

    ``name`` names its folder (``stages/NN-<name>``). :meth:`build` receives the run (for
    :meth:`StagedRun.load_base` and the earlier stages' records) and the stage's context, whose policy holds the
    weights the previous stage left; it returns the loop to run. :meth:`finish` runs once the loop has
    finished: it may write outputs into the stage folder and returns what ``stage.json`` records of them.
    """

    name: str
    from_base: bool
    """Whether the stage goes back to the base weights (:meth:`StagedRun.load_base`): the run then keeps a copy."""

    def build(self, run: StagedRun, ctx: RunContext) -> Any:
        """The stage's loop over ``ctx`` (anything with ``run(resume=...)`` returning a summary, and ``evals``)."""
        ...

    def finish(self, run: StagedRun, ctx: RunContext, loop: Any, summary: dict[str, Any]) -> dict[str, Any]:
        """Write the stage's outputs; returns what ``stage.json`` records of them (``notes`` go into the table)."""
        ...


@dataclasses.dataclass
class StageRecord:
    """A finished stage, as ``stage.json`` holds it."""

    index: int
    name: str
    folder: Path
    summary: dict[str, Any]
    outputs: dict[str, Any]
    start: str

    def to_json(self) -> dict[str, Any]:
        """The record as ``stage.json`` holds it."""
        return {"index": self.index, "name": self.name, "summary": self.summary, "outputs": self.outputs,
                "start": self.start}  # fmt: skip


class StagedRun:
    """Runs ``stages`` in order in ``ctx.run_dir`` (module docstring); ``.run(resume=...)`` trains.

    Args:
        ctx: The run's context; its policy holds the base weights.
        stages: The stages, in order.
        learner: The learner's name, for the summary and the table.
    """

    def __init__(self, ctx: RunContext, stages: Sequence[Stage], learner: str = "staged") -> None:
        if not stages:
            raise ValueError("a staged run needs at least one stage.")
        self.ctx, self.stages, self.learner = ctx, list(stages), learner
        self.model = ctx.policy.model
        # The base weights, kept in host memory when a stage trains the base model again (it loads them from here).
        self.base_state: dict[str, Any] | None = None
        if any(getattr(stage, "from_base", False) for stage in self.stages):
            self.base_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.records: list[StageRecord] = []
        self.start = "base"  # what the current stage started from: "base" or the previous stage's folder name

    # ------------------------------------------------------------------------------------------ layout
    def folder(self, index: int) -> Path:
        """The folder of stage ``index`` (0-based): ``stages/01-<name>``."""
        return self.ctx.run_dir / STAGES_DIR / f"{index + 1:02d}-{self.stages[index].name}"

    def _check_layout(self) -> None:
        """Refuse a run directory whose stage folders do not match the stage list (an edited learner.stages)."""
        root = self.ctx.run_dir / STAGES_DIR
        if not root.is_dir():
            return
        expected = {self.folder(i).name for i in range(len(self.stages))}
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        stray = [name for name in found if name not in expected]
        if stray:
            names = ", ".join(s.name for s in self.stages)
            raise ValueError(
                f"{root} holds stage folder(s) {', '.join(stray)} that the stage list [{names}] does not have; a "
                "resumed staged run may only add stages after the ones it ran. Restore learner.stages, or start a "
                "new run."
            )

    # ------------------------------------------------------------------------------------------ weights
    def load_base(self) -> None:
        """Put the base weights (the policy as the run built it) back into the policy."""
        if self.base_state is None:
            raise RuntimeError("load_base: no stage of this run declared from_base=True, so no base copy was kept.")
        self.model.load_state_dict(self.base_state)
        self.start = "base"

    def _load_final(self, record: StageRecord) -> None:
        path = record.folder / FINAL_WEIGHTS
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError) as err:
            raise ValueError(
                f"{path}: the weights stage {record.name!r} left cannot be loaded ({err}); delete "
                f"{record.folder / STAGE_RECORD} to run that stage again from its checkpoint."
            ) from None
        self.model.load_state_dict(state)
        self.start = record.folder.name

    # ------------------------------------------------------------------------------------------ records
    def _read_record(self, index: int) -> StageRecord | None:
        path = self.folder(index) / STAGE_RECORD
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{path} cannot be read ({err}); delete it to run stage {self.stages[index].name!r} again from its "
                "checkpoint."
            ) from None
        return StageRecord(index, self.stages[index].name, self.folder(index), data["summary"],
                           data.get("outputs", {}), data.get("start", "base"))  # fmt: skip

    def earlier(self, name: str | None = None) -> list[StageRecord]:
        """The stages finished before the current one (only those called ``name``, when given), in order."""
        return [r for r in self.records if name is None or r.name == name]

    def stage_context(self, index: int) -> RunContext:
        """Stage ``index``'s context: its folder as the run directory, and a seed of its own.

        Stages after the first get their own seed, so that a second RL stage does not replay the first one's task
        stream and sampling seeds.
        """
        seed = self.ctx.seed if index == 0 else derived_seed(self.ctx.seed, _STAGE_SEED, index)
        return dataclasses.replace(self.ctx, run_dir=self.folder(index), seed=seed)

    # ------------------------------------------------------------------------------------------ the run
    def run(self, resume: bool = False) -> dict[str, Any]:
        """Run the stages not yet finished; returns the run's summary (also ``summary.json``).

        The run directory is locked for the whole run, every stage included (a stage's loop holds nothing more).
        """
        with lock_run_dir(self.ctx.run_dir):
            return self._run(resume)

    def _run(self, resume: bool) -> dict[str, Any]:
        if resume:
            self._check_layout()
        for index, stage in enumerate(self.stages):
            record = self._read_record(index) if resume else None
            if record is not None:
                self.records.append(record)
                continue
            if self.records:  # start from what the previous stage left
                self._load_final(self.records[-1])
            ctx = self.stage_context(index)
            folder_existed = ctx.run_dir.is_dir()
            ctx.run_dir.mkdir(parents=True, exist_ok=True)
            print(f"stage {index + 1}/{len(self.stages)}: {stage.name} ({ctx.run_dir})", flush=True)
            loop = stage.build(self, ctx)
            if not folder_existed or not _has_progress(ctx.run_dir):
                self._seed_before(loop)
            summary = loop.run(resume=folder_existed)
            atomic_torch_save(self.model.state_dict(), ctx.run_dir / FINAL_WEIGHTS)
            outputs = stage.finish(self, ctx, loop, summary) or {}
            record = StageRecord(index, stage.name, ctx.run_dir, summary, outputs, self.start)
            atomic_write_json(ctx.run_dir / STAGE_RECORD, record.to_json())
            self.records.append(record)
        summary = self.summary()
        atomic_write_json(self.ctx.run_dir / "summary.json", summary)
        self.print_table()
        return summary

    def _seed_before(self, loop: Any) -> None:
        """A fresh stage's "before" evaluation is one already made of the same weights, when there is one.

        A stage that starts where the previous one ended has its "after" as "before"; one that starts from the
        base weights has the first stage's "before" (when that one started from the base too).
        """
        evals = getattr(loop, "evals", None)
        if evals is None or "before" in evals:
            return
        earlier = None
        if self.start == "base":
            first = self.records[0] if self.records else None
            if first is not None and first.start == "base":
                earlier = first.summary.get("evals", {}).get("before")
        elif self.records:
            earlier = self.records[-1].summary.get("evals", {}).get("after")
        if earlier is not None and _same_eval(loop, earlier):
            evals["before"] = {**earlier, "step": 0}

    def summary(self) -> dict[str, Any]:
        """The run's summary: each stage's, the first "before" and the last "after"."""
        stages = []
        for r in self.records:
            s = r.summary
            stages.append({
                "stage": r.name, "folder": str(r.folder), "start": r.start, "status": s.get("status"),
                "steps": s.get("steps"), "train_wall_s": s.get("train_wall_s"), "generations": s.get("generations"),
                "before": s.get("evals", {}).get("before"), "after": s.get("evals", {}).get("after"),
                "last10": s.get("last10", {}), "outputs": r.outputs,
            })  # fmt: skip
        evals = {}
        if stages and stages[0]["before"] is not None:
            evals["before"] = stages[0]["before"]
        if stages and stages[-1]["after"] is not None:
            evals["after"] = stages[-1]["after"]
        return {
            "status": stages[-1]["status"] if stages else "finished",
            "learner": self.learner,
            "stages": stages,
            "evals": evals,
            "train_wall_s": sum(s["train_wall_s"] or 0.0 for s in stages),
            "generations": sum(s["generations"] or 0 for s in stages),
            "run_dir": str(self.ctx.run_dir),
        }

    def print_table(self) -> None:
        """One row per stage: steps, time, completions, held-out accuracy (T and greedy) and length after it."""
        from rich.console import Console
        from rich.table import Table

        summary = self.summary()
        table = Table(title=f"{self.learner}: held-out accuracy after each stage")
        for col in ("stage", "from", "steps", "train s", "completions", "T-sampled", "greedy", "tokens", "notes"):
            table.add_column(col)
        before = summary["evals"].get("before")
        if before:
            table.add_row("(start)", "base", "", "", "", _acc(before, "sampled"), _acc(before, "greedy"),
                          _tokens(before), "")  # fmt: skip
        for s in summary["stages"]:
            after = s["after"] or {}
            notes = "; ".join(f"{k}: {v}" for k, v in (s["outputs"].get("notes") or {}).items())
            table.add_row(
                s["stage"], s["start"], str(s["steps"]), f"{s['train_wall_s'] or 0:.0f}", str(s["generations"] or 0),
                _acc(after, "sampled"), _acc(after, "greedy"), _tokens(after), notes,
            )  # fmt: skip
        Console().print(table)
        print(f"run: {self.ctx.run_dir}  ({summary['train_wall_s']:.0f} s training in {len(self.records)} stages)")


def _has_progress(folder: Path) -> bool:
    return (folder / "metrics.jsonl").exists() or bool(Checkpointer(folder / "checkpoints").steps())


def _same_eval(loop: Any, earlier: dict[str, Any]) -> bool:
    """Whether ``earlier`` was measured the way ``loop`` would measure its "before" (same tasks and samples)."""
    cfg = getattr(getattr(loop, "ctx", None), "eval", None)
    sampled = earlier.get("sampled") or {}
    if cfg is None or sampled.get("tasks") is None:
        return False
    wants_greedy = bool(getattr(getattr(loop, "cfg", None), "eval_greedy", False))
    return sampled.get("n") == cfg.n and ("greedy" in earlier) == wants_greedy


def _acc(e: dict[str, Any] | None, key: str) -> str:
    part = (e or {}).get(key)
    return f"{100 * part['accuracy']:.1f}%" if part else "-"


def _tokens(e: dict[str, Any] | None) -> str:
    part = (e or {}).get("sampled") or {}
    tokens = part.get("mean_tokens")
    return f"{tokens:.1f}" if tokens is not None else "-"


def newest_checkpoint(run_dir: Path) -> str | None:
    """The newest checkpoint of ``run_dir`` in words, or None.

    ``"step 40"``, ``"stage 03-rl2, step 40"``, or ``"the end of stage 02-sd"`` for a staged run between stages.
    """
    run_dir = Path(run_dir)
    steps = Checkpointer(run_dir / "checkpoints").steps()
    if steps:
        return f"step {steps[-1]}"
    root = run_dir / STAGES_DIR
    if not root.is_dir():
        return None
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    for folder in reversed(folders):
        if (folder / STAGE_RECORD).is_file():
            return f"the end of stage {folder.name}"
        steps = Checkpointer(folder / "checkpoints").steps()
        if steps:
            return f"stage {folder.name}, step {steps[-1]}"
    return None

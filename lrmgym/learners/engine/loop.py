"""The one training loop every native learner runs: an algorithm supplies the step, the loop does the rest.

What the loop owns: the run directory's logs (``metrics.jsonl``, ``samples.jsonl``), checkpoints and resume
(a killed run continues with no step lost or repeated), the step and time budgets, Ctrl-C and SIGTERM (the
first asks to stop after the current step and saves; the second aborts), the progress bar, held-out evaluation
(before, every ``eval_every`` steps, after), ``summary.json``, the plot and the before/after table, and the
experiment trackers of ``run.report_to`` (:mod:`lrmgym.tracking`), which get what the logs get.

What an :class:`Algorithm` owns: its own state (weights, optimizer, data position...) and one training step.

A step that graded nothing as asked (every sample ungradeable, or a judge that failed on every sample it was
given, e.g. a dead LLM-judge endpoint) prints a warning line; after :attr:`Loop.max_failed_steps` such steps in
a row the loop saves a checkpoint and stops with :class:`FailedStepsError` (one line, exit status 1), so that
a run never trains on nothing in silence. The run directory stays resumable.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lrmgym.learners.engine.algorithm import Algorithm, LoopConfig, StepResult
from lrmgym.learners.engine.common import keep_freed_memory
from lrmgym.learners.engine.context import RunContext
from lrmgym.learners.engine.failures import FailedStepsError, failed_step, last_failure
from lrmgym.learners.engine.flops import achieved_rates
from lrmgym.learners.engine.interrupt import Interrupt
from lrmgym.learners.engine.resume import checkpoint_with_log, clean_temps
from lrmgym.learners.engine.rundir import (
    Checkpointer,
    JsonlLog,
    atomic_write_json,
    capture_rng,
    lock_run_dir,
    plot_metrics,
    restore_rng,
)
from lrmgym.learners.engine.summary import duration, eval_summary, print_table
from lrmgym.tracking import Trackers

# Algorithm, LoopConfig and StepResult (engine/algorithm.py), FailedStepsError and failed_step (engine/failures.py) are
# re-exported: what a learner imports from the loop.
__all__ = ["Algorithm", "FailedStepsError", "Loop", "LoopConfig", "StepResult", "failed_step"]


SLOWER = 0.9
"""A run below this share of ``idle_steps_per_s`` says in its summary that the machine ran slower."""


class Loop:
    """Runs an :class:`Algorithm` in a run directory under a :class:`LoopConfig`."""

    max_failed_steps: int = 3
    """Stop after this many steps in a row that graded nothing (see :func:`failed_step`); 0: only warn each step.
    Set from ``LoopConfig.max_failed_steps`` (a loop config without that field keeps this default)."""

    def __init__(self, ctx: RunContext, cfg: LoopConfig, algorithm: Algorithm) -> None:
        self.ctx, self.cfg, self.algorithm = ctx, cfg, algorithm
        self.run_dir = ctx.run_dir
        self.metrics_log = JsonlLog(self.run_dir / "metrics.jsonl")
        self.samples_log = JsonlLog(self.run_dir / "samples.jsonl")
        self.checkpoints = Checkpointer(self.run_dir / "checkpoints", keep=cfg.keep_checkpoints)
        self.step = 0
        self.elapsed_s = 0.0
        self.generations = 0
        self.evals: dict[str, dict] = {}
        self.log_gaps: str | None = None  # steps with no metrics line, when a resume found them lost
        self.trackers = Trackers()  # opened by run(), once the step to continue from is known
        self._set_up = False
        self.max_failed_steps = int(getattr(cfg, "max_failed_steps", type(self).max_failed_steps))
        self._failed_streak = 0  # steps in a row that graded nothing
        self._last_samples: list[dict[str, Any]] = []
        algorithm.loop = self

    # ------------------------------------------------------------------------------------------ budget
    def progress(self) -> float:
        """How far the run is, in [0, 1]: the larger of its step share and its time-budget share."""
        done = self.step / self.cfg.steps
        if self.cfg.time_budget_s is not None:
            done = max(done, self.elapsed_s / self.cfg.time_budget_s)
        if self.cfg.generation_budget is not None:
            done = max(done, self.generations / self.cfg.generation_budget)
        return min(1.0, done)

    def expected_steps(self) -> int:
        """The steps this run will reach: ``steps``, or fewer where the time budget runs out first.

        The time budget's share is estimated from the mean step time so far.
        """
        expected = self.cfg.steps
        if self.step == 0:
            return expected
        budget = self.cfg.time_budget_s
        if budget is not None and self.elapsed_s > 0:
            left = max(0.0, budget - self.elapsed_s) / (self.elapsed_s / self.step)
            expected = min(expected, self.step + math.ceil(left))
        gens = self.cfg.generation_budget
        if gens is not None and self.generations > 0:
            left = max(0, gens - self.generations) / (self.generations / self.step)
            expected = min(expected, self.step + math.ceil(left))
        return expected

    def over_budget(self) -> bool:
        """Whether the time budget or the generation budget is spent."""
        if self.cfg.generation_budget is not None and self.generations >= self.cfg.generation_budget:
            return True
        return self.cfg.time_budget_s is not None and self.elapsed_s >= self.cfg.time_budget_s

    # ------------------------------------------------------------------------------------------ state
    def save(self) -> None:
        """Checkpoint the loop and the algorithm at the current step."""
        state = {
            **self.algorithm.state_dict(),
            "rng": capture_rng(),
            "elapsed_s": self.elapsed_s,
            "generations": self.generations,
            "evals": self.evals,
            "log_gaps": self.log_gaps,
        }
        self.checkpoints.save(self.step, state)

    def _resume(self) -> None:
        clean_temps(self.run_dir, _say)
        state, self.log_gaps = checkpoint_with_log(self.checkpoints, self.metrics_log, _say)
        if state is None:  # killed before the first checkpoint: start over in the same directory
            _say(f"no checkpoint in {self.checkpoints.directory}: starting over from step 0")
            self.metrics_log.truncate(0)
            self.samples_log.truncate(0)
            return
        self.algorithm.load_state_dict(state)
        restore_rng(state["rng"])
        self.step = int(state["step"])
        _say(f"resuming from step {self.step} ({self.checkpoints.path(self.step)})")
        self.elapsed_s = float(state.get("elapsed_s", 0.0))
        self.generations = int(state.get("generations", 0))
        self.evals = dict(state.get("evals", {}))
        self.log_gaps = self.log_gaps or state.get("log_gaps")
        # Lines written after the checkpoint belong to steps that will run again: drop them (and duplicates).
        self.metrics_log.truncate(self.step, unique=True)
        self.samples_log.truncate(self.step)
        self.checkpoints.drop_after(self.step, _say)  # newer ones (after a gap): never to be resumed from again

    # ------------------------------------------------------------------------------------------ the loop
    def setup(self) -> None:
        """The algorithm's setup (its own checks, optimizer, workers), once; :meth:`run` calls it too.

        Callable before :meth:`run`, so that ``lrmgym run`` meets a setup error while it can still remove the new
        run directory. On an error, what the setup started (a rollout worker) is closed.
        """
        if self._set_up:
            return
        try:
            self.algorithm.setup()
        except BaseException:
            self.algorithm.close()
            raise
        self._set_up = True

    def run(self, resume: bool = False) -> dict[str, Any]:
        """Run (or continue) training; returns the summary.

        The run directory is locked for the whole run (:func:`~lrmgym.learners.engine.rundir.lock_run_dir`):
        :class:`~lrmgym.learners.engine.rundir.RunDirLocked` when another process trains in it.
        """
        with lock_run_dir(self.run_dir):
            status = "failed"
            keep_freed_memory()  # page-fault-free reuse of activations on CPU (lrmgym.learners.engine.common)
            self.setup()
            try:
                summary = self._run(resume)
                status = summary["status"]
                return summary
            except KeyboardInterrupt:
                status = "interrupted"
                raise
            finally:
                self.trackers.close(status)
                self.algorithm.close()

    def _run(self, resume: bool) -> dict[str, Any]:
        if resume:
            self._resume()
        elif self.metrics_log.path.exists() or self.checkpoints.steps():
            raise FileExistsError(
                f"{self.run_dir} already holds a run (metrics or checkpoints); resume it with "
                f"`lrmgym run --resume {self.run_dir}` or choose a new run.name."
            )
        self.trackers = self._open_trackers(resume)
        if self.cfg.eval_before_after and "before" not in self.evals:
            self._record_eval("before", self.evaluate("step_0"))
            self.save()  # a resume from here does not evaluate again
        self._announce()
        bar = self._progress_bar()
        status = "finished"
        with Interrupt() as interrupt:
            while self.step < self.cfg.steps:
                if self.over_budget():
                    gens = self.cfg.generation_budget
                    status = "generation_budget" if gens is not None and self.generations >= gens else "time_budget"
                    break
                metrics = self.train_step()
                bar.total = self.expected_steps()  # a time budget ends the run before `steps`: say when
                bar.update(1)
                bar.set_postfix(**self.algorithm.postfix(metrics))
                stop = self._check_grading(metrics)
                if stop is not None:
                    bar.close()
                    self.save()
                    self.finish("failed_steps")
                    raise FailedStepsError(stop)
                if self.cfg.eval_every and self.step % self.cfg.eval_every == 0 and self.step < self.cfg.steps:
                    self._record_eval(f"step_{self.step}", self.evaluate(f"step_{self.step}"))
                if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps or self.over_budget():
                    self.save()
                if interrupt.requested:
                    status = "interrupted"
                    break
        bar.close()
        if status == "interrupted":
            self.save()
            self.finish(status)
            raise KeyboardInterrupt
        if self.cfg.eval_before_after and self.evals.get("after", {}).get("step") != self.step:
            # Also when a resume with more steps trained past an earlier "after": it describes an older model.
            if "after" in self.evals:
                earlier = self.evals.pop("after")
                self.evals[f"step_{earlier['step']}"] = earlier
            self._record_eval("after", self.evaluate(f"step_{self.step}"))
            self.save()  # so that a resume after this point does not evaluate again
        summary = self.finish(status)
        print_table(self, summary)
        return summary

    def _check_grading(self, metrics: dict[str, Any]) -> str | None:
        """Warn about a step that graded nothing; the stop message once ``max_failed_steps`` came in a row."""
        what = failed_step(metrics)
        if what is None:
            self._failed_streak = 0
            return None
        self._failed_streak += 1
        last = last_failure(self._last_samples, self.ctx.env)
        limit = self.max_failed_steps
        if limit and self._failed_streak >= limit:
            name = last.split(":", 1)[0]
            where = f"judge.{name}.policy" if f"judge/{name}/calls" in metrics else "judge.NAME.policy"
            return (
                f"stopped at step {self.step}: {limit} steps in a row in which {what}; last error: {last}. Fix the "
                f"judge (is its endpoint up? see {where} in {self.run_dir / 'config.yaml'}) or the env's verifier, "
                f"then continue with `lrmgym run --resume {self.run_dir}`."
            )
        then = f"; the run stops after {limit} such steps in a row" if limit else ""
        _say(f"warning: step {self.step}: {what}; last error: {last}{then}.")
        return None

    def _announce(self) -> None:
        """Before training: the steps to run and, at the idle machine's speed, when they will be done."""
        rate, left = self.cfg.idle_steps_per_s, self.cfg.steps - self.step
        if rate is None or left <= 0:
            return
        seconds = left / rate
        finish = time.strftime("%H:%M", time.localtime(time.time() + seconds))
        budget = self.cfg.time_budget_s
        cap = f"; learner.time_budget_s={budget:g} stops it sooner on a slower one" if budget else ""
        _say(
            f"Training {left} steps: about {duration(seconds)} at the {rate:g} steps/s of an idle 2-core machine, "
            f"done at about {finish}, then the final evaluation{cap}."
        )

    def speed(self, status: str) -> dict[str, Any]:
        """The run's training speed against ``idle_steps_per_s``, with a sentence when the machine ran slower."""
        rate = self.step / self.elapsed_s if self.step and self.elapsed_s > 0 else None
        idle = self.cfg.idle_steps_per_s
        out: dict[str, Any] = {"steps_per_s": rate, "idle_steps_per_s": idle}
        if rate is None or idle is None or rate >= SLOWER * idle:
            return out
        cause = (
            f"so learner.time_budget_s ended training after {self.step} of {self.cfg.steps} steps: fewer than the "
            "preset's, so the result is not comparable to its"
            if status == "time_budget"
            else f"so the run took longer; it trained the same {self.step} steps, and a fixed number of steps with a "
            "fixed seed gives the same result at any speed"
        )
        out["note"] = (
            f"This machine trained at {rate:.2f} steps/s, {idle / rate:.1f}x slower than the {idle:g} steps/s of an "
            f"idle 2-core machine (other processes, fewer or slower cores), {cause}."
        )
        return out

    def train_step(self) -> dict[str, Any]:
        """One step of the algorithm; appends its line to ``metrics.jsonl`` and returns it."""
        start = time.perf_counter()
        out = self.algorithm.train_step()
        self.step += 1
        metrics = {"step": self.step, **out.metrics}
        metrics["time/step_s"] = time.perf_counter() - start
        metrics.update(achieved_rates(metrics))
        self.elapsed_s += metrics["time/step_s"]
        self.generations += int(metrics.get("generations") or 0)
        self.algorithm.end_step()  # after step and elapsed_s have advanced
        self.metrics_log.append(metrics)
        samples = [{"step": self.step, **record} for record in out.samples]
        self._last_samples = samples
        for record in samples:
            self.samples_log.append(record)
        self.trackers.log_step(metrics, samples)
        return metrics

    def _progress_bar(self) -> Any:
        from lrmgym.progress import progress_bar  # a live bar on a terminal, plain lines in a log file

        return progress_bar(self.cfg.steps, self.algorithm.name, "steps", enabled=self.cfg.progress, initial=self.step)

    def _open_trackers(self, resume: bool) -> Trackers:
        """The trackers of ``ctx.report_to``, continuing the ones of the interrupted session on a resume."""
        if not self.ctx.report_to:
            return Trackers()
        to_dict = getattr(self.ctx.config, "to_dict", None)
        config = to_dict() if callable(to_dict) else {"learner": self.cfg.model_dump(mode="json")}
        return Trackers.open(self.ctx.report_to, self.run_dir, config, resumed=resume, first_step=self.step + 1)

    # ------------------------------------------------------------------------------------------ evaluation
    def _record_eval(self, key: str, result: dict[str, Any]) -> None:
        """Keep an evaluation under ``key`` (``before``, ``step_N``, ``after``) and hand it to the trackers."""
        self.evals[key] = result
        self.trackers.log_eval(self.evals, key)

    def evaluate(self, tag: str, cfg: Any = None, transform: Any = None) -> dict[str, Any]:
        """Held-out evaluation with ``cfg`` (default ``ctx.eval``) and greedy, results under ``eval/<tag>/``.

        ``transform`` rewrites each held-out task first (see :func:`lrmgym.eval.evaluate`).
        """
        from lrmgym.eval import evaluate

        ctx = self.ctx
        out: dict[str, Any] = {"step": self.step}
        cfg = cfg if cfg is not None else ctx.eval
        progress = self.cfg.progress
        report = evaluate(ctx.env, ctx.policy, cfg, self.run_dir / "eval" / tag, progress, transform)
        out["sampled"] = eval_summary(report)
        if self.cfg.eval_greedy and not (cfg.temperature == 0 and cfg.n == 1):
            greedy = cfg.model_copy(update={"temperature": 0.0, "n": 1, "k": [1]})
            report = evaluate(ctx.env, ctx.policy, greedy, self.run_dir / "eval" / f"{tag}_greedy", progress, transform)
            out["greedy"] = eval_summary(report)
        model = getattr(ctx.policy, "model", None)
        if model is not None:
            model.eval()
        return out

    # ------------------------------------------------------------------------------------------ the end
    def finish(self, status: str) -> dict[str, Any]:
        """Write ``summary.json`` and the plot; returns the summary."""
        metrics = list(self.metrics_log.records())
        plot = plot_metrics(metrics, self.run_dir / "plots" / "metrics.png", evals=self.evals)
        last = metrics[-10:]
        summary = {
            "status": status,
            "learner": self.algorithm.name,
            "steps": self.step,
            "steps_planned": self.cfg.steps,
            "train_wall_s": self.elapsed_s,
            "generations": self.generations,
            "speed": self.speed(status),
            "evals": self.evals,
            "last10": {
                k: float(np.mean([m[k] for m in last if m.get(k) is not None]))
                for k in ("reward/mean", "accuracy", "length/mean", "tokens_per_s", "time/step_s")
                if any(m.get(k) is not None for m in last)
            },
            "run_dir": str(self.run_dir),
            "plot": str(plot),
        }
        if self.log_gaps:
            summary["log_gaps"] = self.log_gaps
        if self.ctx.model_commands is not None and (commands := self.ctx.model_commands(self.run_dir)):
            summary["model_commands"] = commands
        extra = self.algorithm.summary()
        if extra:
            summary[self.algorithm.name] = extra
        atomic_write_json(self.run_dir / "summary.json", summary)
        return summary


def _say(message: str) -> None:
    print(message, flush=True)

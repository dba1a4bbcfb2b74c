"""The trackers of one run session, each fenced off: a tracker that fails is reported once and then left out.

Training never waits on a broken tracker and never stops for one: the first exception a tracker raises (its
library missing, an unwritable folder, a server down, a bug in a log call) is reported in one line on stderr,
naming the tracker, the error and the fix, and the tracker gets no further call.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lrmgym.tracking.base import BACKENDS, STATE_FILE, TrackedRun, Tracker, read_state, write_state
from lrmgym.tracking.records import eval_scalars, eval_table, sample_table, scalars

__all__ = ["INSTALL_HINT", "Trackers"]

INSTALL_HINT = 'pip install "lrmgym[tracking]"'


def _stderr(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)  # above a progress bar, not through it


def _stdout(line: str) -> None:
    print(line, flush=True)


class Trackers:
    """Fan-out to the run's trackers; every call is safe (see the module docstring).

    Build with :meth:`open`; an empty ``Trackers()`` logs nowhere.
    """

    def __init__(self, trackers: Mapping[str, Tracker] | None = None, report: Callable[[str], None] = _stderr) -> None:
        self.active: dict[str, Tracker] = dict(trackers or {})
        self.failed: dict[str, str] = {}
        """The trackers that failed, with the line that reported it."""
        self._report = report

    @classmethod
    def open(
        cls,
        names: Iterable[str],
        run_dir: Path,
        config: dict[str, Any],
        resumed: bool = False,
        first_step: int = 1,
        report: Callable[[str], None] = _stderr,
        announce: Callable[[str], None] = _stdout,
    ) -> Trackers:
        """Open each named tracker for ``run_dir``, continuing the tracker runs ``tracking.json`` records.

        A tracker that fails to open is reported and left out; an unknown name is a ``ValueError``.

        Args:
            names: Tracker names (``run.report_to``).
            run_dir: The run directory.
            config: The resolved run config (plain data), logged by every tracker.
            resumed: Whether this session continues an earlier one in ``run_dir``.
            first_step: The first training step this session logs.
            report: Where the one line about a failed tracker goes (default: stderr).
            announce: Where each opened tracker's line about where it logs goes (default: stdout).
        """
        out = cls(report=report)
        names = list(names)
        if not names:
            return out
        unknown = [n for n in names if n not in BACKENDS]
        if unknown:
            raise ValueError(f"report_to: unknown tracker {unknown[0]!r}; allowed: {', '.join(BACKENDS)}.")
        state = read_state(run_dir)
        for name in names:
            run = TrackedRun(run_dir, run_dir.name, config, resumed, first_step, dict(state.get(name) or {}))
            module, attr = BACKENDS[name].split(":")
            backend = getattr(importlib.import_module(module), attr)  # lrmgym's module: it imports no library yet
            try:
                out.active[name] = tracker = backend(run)
            except Exception as err:
                out._fail(name, err, backend.fix)
                continue
            state[name] = run.state
            where = getattr(tracker, "where", None)
            if where:
                announce(f"tracking: {name} {where}")
        try:
            write_state(run_dir, state)
        except OSError as err:
            report(f"report_to: cannot write {run_dir / STATE_FILE} ({err}); a resume of this run will start new "
                   "tracker runs instead of continuing these.")  # fmt: skip
        return out

    def _fail(self, name: str, err: Exception, fix: str) -> None:
        self.active.pop(name, None)
        fix = INSTALL_HINT if isinstance(err, ImportError) else fix
        message = " ".join(str(err).split()) or "no message"
        message = message if len(message) <= 300 else message[:297] + "..."
        line = f"report_to: {name} failed ({type(err).__name__}: {message}); the run goes on without it. Fix: {fix}"
        self.failed[name] = line
        self._report(line)

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self.active.items()):
            try:
                call(tracker)
            except Exception as err:
                self._fail(name, err, tracker.fix)

    # ------------------------------------------------------------------------------------------ what the loop logs
    def log_step(self, metrics: Mapping[str, Any], samples: list[Mapping[str, Any]]) -> None:
        """A training step: its metrics line's numbers, and its samples (as in ``samples.jsonl``) as a table."""
        if not self.active:
            return
        step, values, table = int(metrics["step"]), scalars(metrics), sample_table(samples)
        self._each(lambda t: t.log_scalars(values, step))
        if table is not None:
            self._each(lambda t: t.log_table("samples", table, step))

    def log_eval(self, evals: Mapping[str, Mapping[str, Any]], key: str) -> None:
        """The evaluation ``evals[key]`` just made: its accuracy as scalars, and the table of all evaluations."""
        if not self.active:
            return
        step, values, table = int(evals[key].get("step", 0)), eval_scalars(evals[key]), eval_table(evals)
        self._each(lambda t: t.log_scalars(values, step))
        self._each(lambda t: t.log_table("eval", table, step))

    def close(self, status: str) -> None:
        """Close every tracker (once; later calls do nothing)."""
        self._each(lambda t: t.close(status))
        self.active.clear()

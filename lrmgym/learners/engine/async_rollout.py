"""Rollouts in a second process, one step ahead of training (``learner.async_rollouts=true``).

While the trainer updates the policy on step ``t``'s rollouts, a worker process samples and grades step
``t+1``'s with a copy of the weights as they were before that update. On a machine with a core to spare this
runs generation and training side by side instead of one after the other. The price is one step of policy lag:
step ``t+1``'s samples come from the policy before update ``t``, so the PPO ratio uses the sampler's own
log-probabilities as the behaviour policy (the clipped ratio corrects the lag; PipelineRL and AReaL run
the same one-step-off-policy scheme at scale).

Why a process rather than a thread: decoding a small model is thousands of small torch calls, and two Python
threads doing that contend for the GIL (measured on the 2 CPU cores here: two threads of small matrix
products ran 5.5x slower than one). A process has its own interpreter and its own core.

The worker builds its own env (judges included) and policy with the run context's ``make_env`` and
``make_policy`` (picklable builders; :func:`lrmgym.compose.build_context` makes them from the run's config), so
the env must be makeable in a fresh interpreter (bundled, registered through the ``lrmgym.envs`` entry point,
or registered at run time in the trainer, which the worker repeats).
The worker is spawned (no fork of a process that holds torch threads), and a spawned process re-imports the
``__main__`` script it was started from, which in a script without ``if __name__ == "__main__":`` would start
training again in the worker. So when the builders need nothing from ``__main__`` (lrmgym's own envs, policies
and configs), the worker starts without it and a plain script works as it is; when they do (an env class
defined in the script), the script needs the guard, and a worker that died of its absence says so.
The worker's own loop is :func:`lrmgym.learners.engine.async_worker.worker_main`.
Weights travel as a ``torch.save`` byte string per step (3.2 MB for the tiny model). The worker ignores
SIGINT (the trainer handles Ctrl-C) and exits when the trainer's end of the pipe closes, so a trainer killed
with SIGKILL does not leave it behind.

The other way round, a worker that dies (SIGKILL, the out-of-memory killer) or stops (SIGSTOP, a frozen
process) while the trainer talks to it raises :class:`RolloutWorkerLost` wherever the trainer meets it: starting,
sending a request, waiting for a result. A thread in the worker counts heartbeats into shared memory; the
trainer gives up on a worker whose count has not moved for ``stall_s`` seconds and kills it. The bound counts
signs of life, not the rollout's length, so a long rollout never trips it. The trainer's own state is that of
the last finished step, so ``lrmgym run --resume`` continues from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import pickle
import pickletools
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from lrmgym.core import Task
from lrmgym.learners.engine.async_worker import worker_main
from lrmgym.learners.engine.rollout import Rollout
from lrmgym.policies.base import SamplingParams

__all__ = ["RolloutWorker", "RolloutWorkerError", "RolloutWorkerLost"]

STALL_S = 60.0
"""How long a worker may show no sign of life before the trainer gives up on it (it beats every second)."""
STARTUP_GRACE_S = 300.0
"""How long a worker may take to show its first heartbeat (it imports torch and lrmgym first)."""


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed; the message carries its traceback."""


class RolloutWorkerLost(RolloutWorkerError):
    """The rollout worker died (killed, crashed) or stopped answering; a one-line message says which and when."""


def _state_bytes(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return buffer.getvalue()


def _registration(env_id: str | None) -> tuple | None:
    """``(id, entry_point, kwargs)`` of an env registered in this process, for the worker to register too."""
    import gymnasium

    from lrmgym.registry import _qualify

    if env_id is None:
        return None
    spec = gymnasium.registry.get(_qualify(env_id))
    if spec is None:
        return None  # an entry-point plug-in: the worker finds it the same way
    return (spec.id, spec.entry_point, dict(spec.kwargs or {}))


def _needs_main(objects: Any) -> bool:
    """Whether unpickling ``objects`` imports ``__main__`` (a class or function defined in the running script)."""
    try:
        data = pickle.dumps(objects)
    except Exception:  # noqa: BLE001 - let the process start raise its own pickling error
        return True
    return any(arg == "__main__" or str(arg).startswith("__main__ ") for _, arg, _ in pickletools.genops(data))


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """While a process is spawned: a blank ``__main__``, so that the child does not re-import the user's script."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: nothing to re-import
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _main_script() -> str | None:
    """The script (or ``-m`` module) ``__main__`` runs, which a spawned process re-imports; None in a REPL."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return name or getattr(main, "__file__", None)


class RolloutWorker:
    """A process that samples and grades rollouts with a copy of the trainer's policy.

    Args:
        make_env: Builds the env (judges included) in the worker; picklable.
        make_policy: Builds the policy in the worker; picklable.
        env_id: The env's registered id, when the trainer registered it at run time (the worker repeats that).
        threads: torch threads in the worker (``None``: torch's default).
        stall_s: Give up on a worker that shows no sign of life (heartbeats, ten per bound, at most one a second)
            for this many seconds: stopped (SIGSTOP, Ctrl-Z) or frozen. It is then killed.

    The worker starts building at once; the first :meth:`submit` waits until it is ready, and raises
    :class:`RolloutWorkerError` (with the worker's traceback) if it could not build its env or policy.
    A worker that dies or stops at any point raises :class:`RolloutWorkerLost` from the call that meets it.
    """

    def __init__(
        self, make_env: Any, make_policy: Any, env_id: str | None = None, threads: int | None = None,
        stall_s: float = STALL_S,
    ) -> None:  # fmt: skip
        if not stall_s > 0:
            raise ValueError(f"stall_s must be > 0 seconds, got {stall_s!r}.")
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
        self._conn, child = context.Pipe()
        self.stall_s = float(stall_s)
        self._beats = context.RawValue("Q", 0)  # one writer (the worker's heartbeat), one reader (this process)
        beat_s = min(1.0, self.stall_s / 10)
        # The builders travel pickled (with the config they close over), so config classes defined outside
        # lrmgym work too.
        builders = (make_env, make_policy, threads, _registration(env_id))
        self._process = context.Process(
            target=worker_main, args=(child, *builders, self._beats, beat_s), name="lrmgym-rollout", daemon=True
        )
        self._needs_main = _needs_main(builders)
        with contextlib.nullcontext() if self._needs_main else _main_hidden():
            self._process.start()
        child.close()
        self.pending = False
        self.pending_state: bytes | None = None  # the weights the pending rollout samples with
        self.judge_metrics: dict | None = None  # the worker's judge metrics of the last collected rollout
        self._ready = False  # the worker builds its env and policy while the trainer evaluates

    @classmethod
    def for_context(cls, ctx: Any, threads: int | None = None, stall_s: float = STALL_S) -> RolloutWorker:
        """A worker that rebuilds ``ctx``'s env and policy (its ``make_env`` and ``make_policy``)."""
        if ctx.make_env is None or ctx.make_policy is None:
            raise ValueError(
                "learner.async_rollouts=true needs a run context that can rebuild its env and policy in a worker "
                "process (RunContext.make_env and make_policy, which lrmgym.compose.build_context sets); set "
                "learner.async_rollouts=false when passing objects directly."
            )
        spec = getattr(getattr(ctx.env, "unwrapped", ctx.env), "spec", None)
        return cls(ctx.make_env, ctx.make_policy, getattr(spec, "id", None), threads=threads, stall_s=stall_s)

    @property
    def pid(self) -> int | None:
        """The worker's process id."""
        return self._process.pid

    def wait_ready(self) -> None:
        """Wait until the worker has built its env and policy (:meth:`submit` does this itself)."""
        if not self._ready:
            self._receive("start-up")
            self._ready = True

    def submit(
        self,
        model: torch.nn.Module | None,
        tasks: Sequence[Task],
        group_size: int,
        sampling: SamplingParams,
        max_turns: int | None,
        state: bytes | None = None,
    ) -> None:
        """Start a rollout with ``model``'s current weights (or the saved ``state``); collect it with :meth:`result`.

        ``state`` is :attr:`pending_state` as a checkpoint saved it: a resumed run samples its first step with
        the weights the interrupted run had handed the worker, so it continues exactly.
        """
        if self.pending:
            raise RuntimeError("A rollout is already pending; collect it with result() first.")
        self.wait_ready()
        weights = state if state is not None else (_state_bytes(model) if model is not None else None)
        self._send(("rollout", weights, list(tasks), group_size, sampling, max_turns), "rollout")
        self.pending, self.pending_state = True, weights

    def result(self) -> Rollout:
        """Wait for the pending rollout."""
        if not self.pending:
            raise RuntimeError("No rollout is pending; submit() one first.")
        self.pending, self.pending_state = False, None
        ro, self.judge_metrics = self._receive("rollout")
        return ro

    # ------------------------------------------------------------------------------------------ the pipe, watched
    def _send(self, message: tuple, what: str) -> None:
        """Send ``message``, watching the worker meanwhile: a stopped worker never drains a large one."""
        data = ForkingPickler.dumps(message)  # what Connection.send does, here so that a pickling error raises here
        failure: list[BaseException] = []

        def send() -> None:
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as err:  # a dead reader: BrokenPipeError, ConnectionResetError
                failure.append(err)

        sender = threading.Thread(target=send, name="lrmgym-rollout-send", daemon=True)
        sender.start()
        watch = _Watch(self)
        while sender.is_alive():
            sender.join(timeout=watch.poll_s)
            if sender.is_alive():
                watch.check(f"sending a {what} request")
        if failure:
            raise self._lost(f"sending a {what} request")

    def _receive(self, what: str) -> Any:
        watch = _Watch(self)
        try:
            while not self._conn.poll(watch.poll_s):
                watch.check(what)
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            lost = self._lost(what)
            code = self._process.exitcode
            script = _main_script() if self._needs_main and what == "start-up" and code and code > 0 else None
            if script is not None:  # it died re-importing the user's script: the missing main guard
                raise RolloutWorkerError(
                    f"The rollout worker (pid {self._process.pid}) could not start: it re-imports {script} for the "
                    "objects defined there, so that script's training code must sit under "
                    '`if __name__ == "__main__":` (or set learner.async_rollouts=false).'
                ) from None
            raise lost from None
        if kind == "error":
            self.close()
            raise RolloutWorkerError(f"The rollout worker failed during {what}:\n{payload}")
        return payload

    def _lost(self, what: str, stalled: str | None = None) -> RolloutWorkerLost:
        """The error for a worker gone during ``what``; the worker is stopped for good first."""
        pid = self._process.pid
        if stalled is None:
            self._process.join(timeout=5)  # its end of the pipe closed: it is gone, or about to be
        code = self._process.exitcode
        self.close(wait_s=0.0)
        if stalled is not None:
            why = f"{stalled} for {self.stall_s:g} s during {what}; it was killed"
        elif code is not None and code < 0:
            name = _signal_name(-code)
            why = f"was killed by {name} during {what}" + (
                " (the out-of-memory killer, or a kill -9)" if -code == signal.SIGKILL else ""
            )
        elif code is not None:
            why = (
                f"exited with code {code} during {what} (learner.async_rollouts=false shows the error in this process)"
            )
        else:
            why = f"closed its pipe during {what}"
        return RolloutWorkerLost(f"The rollout worker (pid {pid}) {why}.")

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the worker (idempotent); one that has not stopped after ``wait_s`` seconds is killed."""
        if self._process.is_alive():
            if wait_s > 0:
                try:
                    self._conn.send(("stop",))
                except (OSError, ValueError):
                    pass
                self._process.join(timeout=wait_s)
            if self._process.is_alive():
                self._process.kill()  # also ends a stopped (SIGSTOP) process
                self._process.join(timeout=5)
        self._conn.close()
        self.pending = False


class _Watch:
    """Watches a worker's heartbeats while the trainer waits on its pipe: dead or silent for too long is lost."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        self.poll_s = min(1.0, worker.stall_s / 4)
        self._beats = worker._beats.value
        self._since = time.monotonic()

    def check(self, what: str) -> None:
        """Raise :class:`RolloutWorkerLost` if the worker has died, or shown no heartbeat within the bound."""
        worker = self.worker
        if worker._process.exitcode is not None:
            raise worker._lost(what)
        beats, now = worker._beats.value, time.monotonic()
        if beats != self._beats:
            self._beats, self._since = beats, now
            return
        bound = worker.stall_s if beats else max(worker.stall_s, STARTUP_GRACE_S)  # none yet: still importing
        if now - self._since >= bound:
            stopped = _process_state(worker._process.pid) in ("T", "t")
            raise worker._lost(what, "is stopped (SIGSTOP or Ctrl-Z): no sign of life" if stopped
                               else "has shown no sign of life")  # fmt: skip


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _process_state(pid: int | None) -> str | None:
    """The process's state letter from ``/proc`` (``T``: stopped), or ``None`` where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None

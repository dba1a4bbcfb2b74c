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
Weights travel as a ``torch.save`` byte string per step (3.2 MB for the tiny model). The worker ignores
SIGINT (the trainer handles Ctrl-C) and exits when the trainer's end of the pipe closes, so a trainer killed
with SIGKILL does not leave it behind.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import pickle
import pickletools
import signal
import sys
import traceback
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from lrmgym.core import Task
from lrmgym.learners.common import keep_freed_memory
from lrmgym.learners.rollout import Rollout, rollout
from lrmgym.policies.base import SamplingParams

__all__ = ["RolloutWorker", "RolloutWorkerError"]


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed; the message carries its traceback."""


def _state_bytes(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return buffer.getvalue()


def _worker_main(conn: Any, make_env: Any, make_policy: Any, threads: int | None, registration: tuple | None) -> None:
    """The worker's loop: build env and policy once, then serve ``("rollout", ...)`` requests until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer stops this worker when it stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import gymnasium

        from lrmgym.registry import register

        keep_freed_memory()
        if threads:
            torch.set_num_threads(threads)
        if registration is not None and registration[0] not in gymnasium.registry:
            register(registration[0], registration[1], **registration[2])  # registered at run time by the trainer
        env = make_env()
        policy = make_policy()
        if threads:  # the tiny policy's build sets its own thread count; the trainer's choice wins
            torch.set_num_threads(threads)
        conn.send(("ready", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        try:
            _, state, tasks, group_size, sampling, max_turns = message
            if state is not None:
                policy.model.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
            ro = rollout(env, policy, tasks, group_size, sampling, max_turns=max_turns)
            pop = getattr(env, "pop_metrics", None)  # the judges' counters of this rollout travel with it
            conn.send(("ok", (ro, pop() if callable(pop) else None)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


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

    The worker starts building at once; the first :meth:`submit` waits until it is ready, and raises
    :class:`RolloutWorkerError` (with the worker's traceback) if it could not build its env or policy.
    """

    def __init__(self, make_env: Any, make_policy: Any, env_id: str | None = None, threads: int | None = None) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
        self._conn, child = context.Pipe()
        # The builders travel pickled (with the config they close over), so config classes defined outside
        # lrmgym work too.
        builders = (make_env, make_policy, threads, _registration(env_id))
        self._process = context.Process(
            target=_worker_main, args=(child, *builders), name="lrmgym-rollout", daemon=True
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
    def for_context(cls, ctx: Any, threads: int | None = None) -> RolloutWorker:
        """A worker that rebuilds ``ctx``'s env and policy (its ``make_env`` and ``make_policy``)."""
        if ctx.make_env is None or ctx.make_policy is None:
            raise ValueError(
                "learner.async_rollouts=true needs a run context that can rebuild its env and policy in a worker "
                "process (RunContext.make_env and make_policy, which lrmgym.compose.build_context sets); set "
                "learner.async_rollouts=false when passing objects directly."
            )
        spec = getattr(getattr(ctx.env, "unwrapped", ctx.env), "spec", None)
        return cls(ctx.make_env, ctx.make_policy, getattr(spec, "id", None), threads=threads)

    @property
    def pid(self) -> int | None:
        """The worker's process id."""
        return self._process.pid

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
        if not self._ready:
            self._receive("start-up")
            self._ready = True
        weights = state if state is not None else (_state_bytes(model) if model is not None else None)
        self._conn.send(("rollout", weights, list(tasks), group_size, sampling, max_turns))
        self.pending, self.pending_state = True, weights

    def result(self) -> Rollout:
        """Wait for the pending rollout."""
        if not self.pending:
            raise RuntimeError("No rollout is pending; submit() one first.")
        self.pending, self.pending_state = False, None
        ro, self.judge_metrics = self._receive("rollout")
        return ro

    def _receive(self, what: str) -> Any:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self.close()
            script = _main_script() if self._needs_main and what == "start-up" else None
            if script is not None:
                raise RolloutWorkerError(
                    f"The rollout worker (pid {self._process.pid}) could not start: it re-imports {script} for the "
                    "objects defined there, so that script's training code must sit under "
                    '`if __name__ == "__main__":` (or set learner.async_rollouts=false).'
                ) from None
            raise RolloutWorkerError(
                f"The rollout worker (pid {self._process.pid}) died during {what} "
                f"(exit code {self._process.exitcode}); run with learner.async_rollouts=false to see the error "
                "in this process."
            ) from None
        if kind == "error":
            self.close()
            raise RolloutWorkerError(f"The rollout worker failed during {what}:\n{payload}")
        return payload

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self._process.is_alive():
            try:
                self._conn.send(("stop",))
            except (OSError, ValueError):
                pass
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5)
        self._conn.close()
        self.pending = False

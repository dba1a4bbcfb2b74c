"""The rollout worker process's side of :mod:`lrmgym.learners.engine.async_rollout`: its main loop.

:func:`worker_main` is what the spawned process runs: it ignores SIGINT and SIGTERM (the trainer stops it),
counts heartbeats in a daemon thread, builds its env and policy once, then answers ``("rollout", ...)``
requests on its pipe until the trainer's end closes or sends ``("stop",)``. Every reply is ``("ok", ...)`` or
``("error", traceback)``; the trainer side (:class:`~lrmgym.learners.engine.async_rollout.RolloutWorker`)
turns the latter into :class:`~lrmgym.learners.engine.async_rollout.RolloutWorkerError`.
"""

from __future__ import annotations

import io
import signal
import threading
import time
import traceback
from typing import Any

import torch

from lrmgym.learners.engine.common import keep_freed_memory
from lrmgym.learners.engine.rollout import rollout

__all__ = ["worker_main"]


def _heartbeat(beats: Any, interval: float) -> None:
    """Count up ``beats`` every ``interval`` seconds, for as long as the process runs (a daemon thread)."""
    while True:
        beats.value += 1
        time.sleep(interval)


def worker_main(
    conn: Any, make_env: Any, make_policy: Any, threads: int | None, registration: tuple | None,
    beats: Any = None, beat_s: float = 1.0,
) -> None:  # fmt: skip
    """The worker's loop: build env and policy once, then serve ``("rollout", ...)`` requests until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer stops this worker when it stops
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if beats is not None:
        threading.Thread(target=_heartbeat, args=(beats, beat_s), name="lrmgym-heartbeat", daemon=True).start()
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
        _reply(conn, ("error", traceback.format_exc()))  # nobody to tell when the trainer is gone
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
            reply = ("ok", (ro, pop() if callable(pop) else None))
        except Exception:
            reply = ("error", traceback.format_exc())
        if not _reply(conn, reply):
            return


def _reply(conn: Any, message: tuple) -> bool:
    """Send ``message`` to the trainer; ``False`` when the trainer is gone (its end of the pipe closed)."""
    try:
        conn.send(message)
    except OSError:  # BrokenPipeError, ConnectionResetError
        return False
    except Exception:  # the message does not pickle: the trainer gets that traceback instead
        return _reply(conn, ("error", traceback.format_exc()))
    return True

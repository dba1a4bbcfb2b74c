"""Ctrl-C and SIGTERM during a training run (:class:`Interrupt`): the first stops after the step, the second aborts."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["Interrupt"]


class Interrupt:
    """SIGINT and SIGTERM during training: the first asks to stop after the current step (and save); the second aborts.

    SIGTERM is what a scheduler's timeout or ``docker stop`` sends: it gets the same clean save as Ctrl-C.
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self._SIGNALS}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\n{name}: finishing the current step, then saving a checkpoint (again to abort now).", flush=True)

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

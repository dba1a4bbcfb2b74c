"""Progress of long loops: a live bar on a terminal, plain periodic lines in a log file.

A live bar (tqdm) redraws itself with carriage returns; written to a file or a pipe (``lrmgym run ... > log``, a
batch scheduler's log) those frames pile up into one line of tens of kilobytes that no reader can use. So
:func:`progress_bar` gives tqdm's bar only when its stream is a terminal, and otherwise a :class:`LogProgress`:
one ordinary line every ``every_s`` seconds (``grpo: 40/150 steps (27%), 1.41 steps/s, 78 s left, reward=0.61``)
and one at the end. Both take the same calls (``update``, ``set_postfix``, ``close``, ``total``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

__all__ = ["EVERY_S", "LogProgress", "is_terminal", "progress_bar", "quiet_library_bars"]

EVERY_S = 30.0
"""Seconds between two lines of a :class:`LogProgress`."""


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (a file, a pipe or a closed stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class LogProgress:
    """Progress as plain lines: one every ``every_s`` seconds of work, and one when a loop that showed some ends.

    Args:
        total: The units of work expected (may be changed while it runs, as tqdm's ``total``).
        desc: What is counted (the line's first word).
        unit: The unit's name.
        initial: Units already done (a resumed run).
        leave: Also print a final line when the loop ends before its first periodic line (a run's own bar).
        stream: Where the lines go (default: stderr, as tqdm's bar).
        every_s: Seconds between two lines.
    """

    def __init__(self, total: int | None, desc: str, unit: str = "it", initial: int = 0, leave: bool = True,
                 stream: TextIO | None = None, every_s: float = EVERY_S) -> None:  # fmt: skip
        self.total, self.desc, self.unit, self.n, self.leave = total, desc, unit, initial, leave
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.postfix: dict[str, Any] = {}
        self._start = self._last = time.monotonic()
        self._initial, self._printed, self._closed, self._printed_n = initial, False, False, None

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units; prints a line when ``every_s`` has passed since the last one."""
        self.n += n
        if time.monotonic() - self._last >= self.every_s:
            self._print()

    def set_postfix(self, **values: Any) -> None:
        """The values shown at the end of the next line (``reward=0.61 acc=0.80``)."""
        self.postfix = values

    def line(self) -> str:
        """The progress line as it stands now."""
        elapsed = time.monotonic() - self._start
        done = self.n - self._initial
        parts = [f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        if done > 0 and elapsed > 0:
            rate = done / elapsed
            parts.append(f"{rate:.3g} {self.unit}/s")
            if self.total and self.n < self.total:
                parts.append(f"{(self.total - self.n) / rate:.0f} s left")
        parts.append(f"{elapsed:.0f} s")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return f"{self.desc}: " + ", ".join(parts)

    def _print(self) -> None:
        print(self.line()[:400], file=self.stream, flush=True)
        self._last, self._printed, self._printed_n = time.monotonic(), True, self.n

    def close(self) -> None:
        """End the loop: a final line (unless the last one says it) if this one printed any or is ``leave``."""
        if not self._closed and (self._printed or self.leave) and self._printed_n != self.n:
            self._print()
        self._closed = True

    def write(self, text: str) -> None:
        """Print ``text`` as its own line (tqdm's ``write``)."""
        print(text, file=self.stream, flush=True)

    def refresh(self) -> None:
        """Nothing to redraw (tqdm's ``refresh``)."""

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int | None, desc: str, unit: str = "it", *, enabled: bool = True, initial: int = 0,
                 leave: bool = True, stream: TextIO | None = None) -> Any:  # fmt: skip
    """A tqdm bar on a terminal, a :class:`LogProgress` elsewhere; a silent tqdm when not ``enabled``."""
    from tqdm.auto import tqdm

    stream = stream if stream is not None else sys.stderr
    if enabled and not is_terminal(stream):
        return LogProgress(total, desc, unit, initial=initial, leave=leave, stream=stream)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, leave=leave,
                dynamic_ncols=True, file=stream)  # fmt: skip


def quiet_library_bars(stream: Any = None) -> bool:
    """Turn off transformers' and huggingface_hub's own bars (loading weights...) when ``stream`` is no terminal.

    Returns whether it did. Their bars are tqdm's, with the same carriage-return frames in a log file. Sets
    ``HF_HUB_DISABLE_PROGRESS_BARS`` (unless set) for libraries not imported yet, and tells those already imported.
    """
    if is_terminal(stream if stream is not None else sys.stderr):
        return False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers.utils.logging" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return True

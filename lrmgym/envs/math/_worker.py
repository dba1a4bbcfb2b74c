"""The verifier worker process: runs math-verify on one (gold, prediction) pair per request.

Started by :class:`lrmgym.envs.math.verify.VerifierPool` as ``python -m lrmgym.envs.math._worker``. It is a
separate process so that the parent can SIGKILL it when a comparison hangs in C code (a huge power, the
``str()`` of a sympy tower, math-verify issue #65), which no in-process timer can interrupt.

Protocol (one JSON object per line):
    parent -> worker on stdin: ``{"gold": str, "pred": str, "budget": float}`` (plus ``"stall": seconds``
    in tests, to stand for C code that no timer interrupts)
    worker -> parent on a private copy of its original stdout: ``{"status": ..., "equal": bool}``
    where ``status`` is ``"ok"``, ``"gold_unparsed"``, ``"pred_unparsed"``, ``"timeout"`` or ``"error"``.

The worker's own stdout and stderr point to /dev/null, so whatever sympy or math-verify prints cannot
corrupt the protocol. Only booleans and status strings leave the process: never a parsed expression,
whose ``str()`` alone can hang.
"""

from __future__ import annotations

import json
import re
import os
import resource
import signal
import sys
import threading
import time
from typing import Any

_MEMORY_LIMIT_BYTES = 3 << 30
_GOLD_MEMO_SIZE = 4096


class _BudgetExceeded(BaseException):
    """Raised by the interval timer inside the worker. A BaseException so ``except Exception`` cannot eat it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _BudgetExceeded()


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent thread dies (works even while C code holds the GIL)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _watch_parent(parent_pid: int) -> None:
    """Fallback for systems without prctl: exit when the parent is gone (checked between bytecodes)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(0)


_IMAGINARY_RE = re.compile(r"(?<=\d)i\b")


def _prepare(answer: str) -> str:
    """Spell what math-verify reads inconsistently in one way, then give it an anchor.

    - ``\\$`` is dropped: math-verify cannot parse ``\\boxed{\\$32,\\!348}`` at all.
    - ``5i`` becomes ``5 i``: math-verify treats ``i`` as the imaginary unit only when it stands alone
      (``6 - 5 i``), so ``6-5i`` and ``6 - 5 i`` would otherwise be different things.
    - Bare LaTeX such as ``\\frac12`` is not found without an anchor, so it is wrapped in ``\\boxed{}``
      (or ``$...$`` when its braces do not balance).
    """
    answer = _IMAGINARY_RE.sub(" i", answer.replace("\\$", ""))
    if any(marker in answer for marker in ("$", "\\boxed", "\\[", "\\(", "\\fbox")):
        return answer
    depth = 0
    for ch in answer:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            break
    return f"\\boxed{{{answer}}}" if depth == 0 else f"${answer}$"


class _Checker:
    """Holds math-verify (imported once) and a small memo of parsed gold answers."""

    def __init__(self) -> None:
        import math_verify

        self._parse = math_verify.parse
        self._verify = math_verify.verify
        self._gold_memo: dict[str, Any] = {}

    def _parse_gold(self, gold: str) -> Any:
        parsed = self._gold_memo.get(gold)
        if parsed is None:
            parsed = self._parse(_prepare(gold), parsing_timeout=None)
            if len(self._gold_memo) >= _GOLD_MEMO_SIZE:
                self._gold_memo.clear()
            self._gold_memo[gold] = parsed
        return parsed

    def check(self, gold: str, pred: str, budget: float) -> dict[str, Any]:
        signal.setitimer(signal.ITIMER_REAL, max(budget, 0.01))
        try:
            gold_parsed = self._parse_gold(gold)
            if all(isinstance(item, str) for item in gold_parsed):  # nothing but math-verify's raw-string fallback
                return {"status": "gold_unparsed", "equal": False}
            pred_parsed = self._parse(_prepare(pred), parsing_timeout=None)
            if not pred_parsed:
                return {"status": "pred_unparsed", "equal": False}
            equal = bool(self._verify(gold_parsed, pred_parsed, timeout_seconds=None))
            if not equal and all(isinstance(item, str) for item in pred_parsed):
                return {"status": "pred_unparsed", "equal": False}
            return {"status": "ok", "equal": equal}
        except _BudgetExceeded:
            return {"status": "timeout", "equal": False}
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure inside sympy is a verdict, not a crash
            return {"status": "error", "equal": False, "error": type(exc).__name__}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    """Serve requests until stdin closes."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT_BYTES, _MEMORY_LIMIT_BYTES))
    except (ValueError, OSError):
        pass
    parent = int(os.environ.get("LRMGYM_VERIFIER_PARENT", os.getppid()))
    _die_with_parent(parent)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the parent's terminal is the parent's business
    checker = _Checker()
    protocol.write('{"status": "ready"}\n')
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if "stall" in request:  # test hook: behave like C code that no timer can interrupt
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(float(request["stall"]))
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
            reply = checker.check(str(request["gold"]), str(request["pred"]), float(request["budget"]))
        except (KeyError, TypeError, ValueError) as exc:
            reply = {"status": "error", "equal": False, "error": type(exc).__name__}
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()

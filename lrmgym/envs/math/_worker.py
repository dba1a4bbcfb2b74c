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
_PARSE_MEMO_SIZE = 4096


# Pairs checked once at start-up: sympy and math-verify load parts of themselves on first use (complex numbers,
# intervals, floats), which costs 0.1-0.4 s each on a cold worker and must not eat into a real check's budget.
_WARM_UP = (
    ("6 - 5 i", "-5 i + 6"),
    ("(3,4]", "(3, 4]"),
    ("\\pi", "3.14159"),
    ("y=2x+3", "2x+3"),
    ("x^5 - x^4 + x - 1", "x^{5} - x^{4} + x - 1"),
    ("\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} -1.0 \\\\ 2 \\end{pmatrix}"),
    ("\\text{Evelyn}", "Evelyn"),
    ("\\frac{\\sqrt3}{2}", "\\sqrt{3}/2"),
    ("\\{1,2\\}", "1,2"),
)


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
_SPACING_RE = re.compile(r"(?<!\\)\\[,;: ]")  # not the "\\ " of a matrix row break


def _prepare(answer: str) -> str:
    """Spell what math-verify reads inconsistently in one way, then give it an anchor.

    - ``\\$`` is dropped: math-verify cannot parse ``\\boxed{\\$32,\\!348}`` at all.
    - LaTeX spacing (``\\,``, ``\\;``, ``\\:``, ``\\ ``) becomes a space: math-verify reads
      ``15\\text{ cm}^2\\,`` as ``15 cm**2`` but ``15\\text{ cm}^2`` as 15.
    - ``5i`` becomes ``5 i``: math-verify treats ``i`` as the imaginary unit only when it stands alone
      (``6 - 5 i``), so ``6-5i`` and ``6 - 5 i`` would otherwise be different things.
    - Bare LaTeX such as ``\\frac12`` is not found without an anchor, so it is wrapped in ``\\boxed{}``
      (or ``$...$`` when its braces do not balance).
    """
    answer = _SPACING_RE.sub(" ", _IMAGINARY_RE.sub(" i", answer.replace("\\$", ""))).strip()
    if any(marker in answer for marker in ("$", "\\boxed", "\\[", "\\(", "\\fbox")):
        return answer
    depth = 0
    for ch in answer:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            break
    return f"\\boxed{{{answer}}}" if depth == 0 else f"${answer}$"


class _Checker:
    """Holds math-verify (imported once) and a bounded memo of parsed answers."""

    def __init__(self) -> None:
        import math_verify

        self._parse = math_verify.parse
        self._verify = math_verify.verify
        self._memo: dict[str, Any] = {}

    def _parsed(self, answer: str) -> Any:
        """math-verify's parse of ``answer``, memoised: a group of samples often repeats the same answer.

        Only completed parses are stored (a parse cut by the timer raises past this), and only as objects:
        they are never printed (``str()`` of some parses hangs).
        """
        parsed = self._memo.get(answer)
        if parsed is None:
            parsed = self._parse(_prepare(answer), parsing_timeout=None)
            if len(self._memo) >= _PARSE_MEMO_SIZE:
                self._memo.clear()
            self._memo[answer] = parsed
        return parsed

    def check(self, gold: str, pred: str, budget: float) -> dict[str, Any]:
        signal.setitimer(signal.ITIMER_REAL, max(budget, 0.01))
        try:
            gold_parsed = self._parsed(gold)
            gold_is_text = all(isinstance(item, str) for item in gold_parsed)  # only the raw-string fallback
            pred_parsed = self._parsed(pred)
            if not pred_parsed:
                return {"status": "gold_unparsed" if gold_is_text else "pred_unparsed", "equal": False}
            equal = bool(self._verify(gold_parsed, pred_parsed, timeout_seconds=None))
            if gold_is_text and not equal:  # a string mismatch says nothing when the gold is not maths we can read
                return {"status": "gold_unparsed", "equal": False}
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
    for gold, pred in _WARM_UP:
        checker.check(gold, pred, 10.0)
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

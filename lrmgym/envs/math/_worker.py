r"""The verifier worker process: runs math-verify on one (gold, prediction) pair per request.

Started by :class:`lrmgym.envs.math.verify.VerifierPool` as ``python -m lrmgym.envs.math._worker``. It is a
separate process so that the parent can SIGKILL it when a comparison hangs in C code (a huge power, the
``str()`` of a sympy tower, math-verify issue #65), which no in-process timer can interrupt.

Protocol (one JSON object per line):
    parent -> worker on stdin: ``{"gold": str, "pred": str, "budget": float}``, optionally
    ``"numeric_of": "gold" | "pred"`` (return that side's value as a 50-digit string when the pair is
    equal), and in tests ``"stall": seconds`` (C code that no timer interrupts) or ``"hog": bytes`` (an
    allocation past the memory cap) with ``"stall_in": "gold" | "pred"`` (before or after the gold is read).
    worker -> parent on a private copy of its original stdout: first a progress line ``{"phase": "pred"}``
    once the gold is read, then the reply ``{"status": ..., "equal": bool, "phase": ...}`` where
    ``status`` is ``"ok"``, ``"gold_unparsed"``, ``"pred_unparsed"``, ``"timeout"`` or ``"error"``; an
    ``"ok"`` reply may carry ``"why": "false_relation"`` and ``"value"``. The progress line tells the
    parent, if the worker then dies or overruns, that the prediction (not the gold) was being checked.

What the worker adds to math-verify on the *prediction* (the gold is parsed as before):

- The whole answer must parse as LaTeX. math-verify falls back to the last number in the text when LaTeX
  parsing fails (``3 \to 4`` is 4 to it); we do not: an answer that does not parse is incorrect.
- Math delimiters and ``\boxed`` wrappers inside the answer are dropped, so math-verify cannot pick one
  of several ``$...$`` blocks; ``\approx`` is read as ``=``.
- Every equation in the answer must hold: ``3 = 4``, ``x = 3 = 4`` and ``\sqrt{16} = 5`` are incorrect.
  A side that is only names (``x``, ``AB``, ``f(2)``, ``x^2``) labels the value; any other side must equal
  the one it is set to (unless the gold is itself an equation, as in ``5x - 7y = 0``). In a chain, every
  value the names join must agree: ``\sqrt{16} = x = 5`` and ``3 = x = y = 4`` are incorrect.
- ``3e3`` is scientific notation (math-verify reads ``3*e*3``), and when a comparison fails with a
  lower-case ``i`` in it, it is retried with ``i`` as the imaginary unit (``e^{i\pi} = -1``).

The worker's own stdout and stderr point to /dev/null, so whatever sympy or math-verify prints cannot
corrupt the protocol. Only booleans and status strings leave the process: never a parsed expression,
whose ``str()`` alone can hang.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import sys
import threading
import time
from typing import Any

_MEMORY_LIMIT_BYTES = int(os.environ.get("LRMGYM_VERIFIER_MEMORY_BYTES") or 3 << 30)
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
# Scientific notation with at most a 3-digit exponent, as a whole token (not the "e" of a word or name).
_SCI_RE = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d{1,3})(?![\w.])")
# Math delimiters inside an answer; "\\[" after a backslash is a line break with an argument, not one.
_DELIMITER_RE = re.compile(r"(?<!\\)\\[()\[\]]|(?<!\\)\$")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_TEXT_RE = re.compile(r"\\(?:textnormal|textrm|textup|textmd|textsf)(?![A-Za-z])")
_PERCENT_RE = re.compile(r"(?<!\\)%")  # a bare % is a LaTeX comment: it would swallow the rest
_APPROX_RE = re.compile(r"\\(?:approx|simeq|thickapprox|doteq|approxeq)(?![A-Za-z])|\u2248")


def _prepare(answer: str) -> str:
    r"""Spell what math-verify reads inconsistently in one way, then give it an anchor.

    - ``\$`` is dropped: math-verify cannot parse ``\boxed{\$32,\!348}`` at all.
    - LaTeX spacing (``\,``, ``\;``, ``\:``, ``\ ``) becomes a space: math-verify reads
      ``15\text{ cm}^2\,`` as ``15 cm**2`` but ``15\text{ cm}^2`` as 15.
    - ``5i`` becomes ``5 i``: math-verify treats ``i`` as the imaginary unit only when it stands alone
      (``6 - 5 i``), so ``6-5i`` and ``6 - 5 i`` would otherwise be different things.
    - Bare LaTeX such as ``\frac12`` is not found without an anchor, so it is wrapped in ``\boxed{}``
      (or ``$...$`` when its braces do not balance).
    """
    answer = _SPACING_RE.sub(" ", _IMAGINARY_RE.sub(" i", answer.replace("\\$", ""))).strip()
    answer = _SCI_RE.sub(lambda m: f"{m.group(1)} \\times 10^{{{m.group(2)}}}", answer)
    if any(marker in answer for marker in ("$", "\\boxed", "\\[", "\\(", "\\fbox")):
        return answer
    depth = 0
    for ch in answer:
        depth += (ch == "{") - (ch == "}")
        if depth < 0:
            break
    return f"\\boxed{{{answer}}}" if depth == 0 else f"${answer}$"


def _unbox(answer: str) -> str:
    r"""``answer`` with every ``\boxed{...}``/``\fbox{...}`` replaced by its content."""
    while match := _BOX_RE.search(answer):
        depth = 0
        for i in range(match.end() - 1, len(answer)):
            depth += (answer[i] == "{") - (answer[i] == "}")
            if depth == 0:
                answer = answer[: match.start()] + " " + answer[match.end() : i] + " " + answer[i + 1 :]
                break
        else:  # unclosed: drop the command only
            answer = answer[: match.start()] + answer[match.end() - 1 :]
    return answer


def _prepare_prediction(answer: str) -> str:
    r"""The prediction as one formula, as the module docstring says.

    No inner ``$``/``\(``/``\[`` blocks or ``\boxed`` wrappers, ``\approx`` as ``=``, ``\textnormal`` as
    ``\text``, a bare ``%`` (a LaTeX comment) as ``\%``, runs of white space as one space, no final period.
    """
    answer = _DELIMITER_RE.sub(" ", answer.replace("\\$", ""))
    answer = _APPROX_RE.sub("=", _unbox(answer))
    answer = " ".join(_PERCENT_RE.sub(r"\\%", _TEXT_RE.sub(r"\\text", answer)).split())
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1]
    return _prepare(answer)


def _is_name(expr: Any) -> bool:
    r"""Whether ``expr`` only names a quantity (``x``, ``AB``, ``f(2)``, ``x^2``, ``\angle A``).

    A name has no number in it except in an exponent or a function's argument: ``3\text{ cm}``, ``x + 1`` and
    ``2a`` are values, so ``3\text{ cm} = 4`` must hold as an equation to be accepted.
    """
    if not _symbolic(expr):
        return False
    from sympy.core.function import AppliedUndef

    def names(node: Any) -> bool:
        if node.is_Symbol or isinstance(node, AppliedUndef):
            return True
        if node.is_Number or node.is_NumberSymbol:
            return False
        if node.is_Pow:
            return names(node.base)
        if node.is_Function:
            return True
        return bool(node.args) and all(names(arg) for arg in node.args)

    return names(expr)


def _symbolic(expr: Any) -> bool:
    """Whether ``expr`` has an unknown in it: a free symbol or an undefined function (``f(2)``)."""
    import sympy
    from sympy.core.function import AppliedUndef

    return isinstance(expr, sympy.Basic) and bool(expr.free_symbols or expr.atoms(AppliedUndef))


def _with_imaginary_i(expr: Any) -> Any:
    """``expr`` with every symbol named ``i`` replaced by the imaginary unit (math-verify keeps it a symbol)."""
    import sympy

    symbols = [s for s in getattr(expr, "free_symbols", ()) if getattr(s, "name", "") == "i"]
    return expr.subs({s: sympy.I for s in symbols}) if symbols else expr


def _has_i(items: list[Any]) -> bool:
    return any(s.name == "i" for item in items for s in getattr(item, "free_symbols", ()) if hasattr(s, "name"))


class _Checker:
    """Holds math-verify (imported once) and a bounded memo of parsed answers."""

    def __init__(self) -> None:
        import math_verify
        from math_verify import LatexExtractionConfig

        self._parse = math_verify.parse
        self._verify = math_verify.verify
        self._latex_only = [LatexExtractionConfig()]
        self._memo: dict[tuple[str, str], Any] = {}

    def _parsed(self, answer: str, kind: str = "gold") -> Any:
        """math-verify's parse of ``answer``, memoised: a group of samples often repeats the same answer.

        A gold is parsed as math-verify parses it (LaTeX, then a plain-expression fallback); a prediction
        as one LaTeX formula only (see the module docstring). Only completed parses are stored (a parse cut
        by the timer raises past this), and only as objects: they are never printed (``str()`` of some
        parses hangs).
        """
        key = (kind, answer)
        parsed = self._memo.get(key)
        if parsed is None:
            if kind == "gold":
                parsed = self._parse(_prepare(answer), parsing_timeout=None)
            else:
                parsed = self._parse(_prepare_prediction(answer), self._latex_only, parsing_timeout=None)
            if len(self._memo) >= _PARSE_MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = parsed
        return parsed

    def _equal(self, gold: Any, pred: Any) -> bool:
        """math-verify's comparison, retried with ``i`` as the imaginary unit when it fails."""
        gold = gold if isinstance(gold, list) else [gold]
        pred = pred if isinstance(pred, list) else [pred]
        if self._verify(gold, pred, timeout_seconds=None):
            return True
        if _has_i(gold) or _has_i(pred):
            exprs_gold = [_with_imaginary_i(g) for g in gold if not isinstance(g, str)]
            exprs_pred = [_with_imaginary_i(p) for p in pred if not isinstance(p, str)]
            return bool(exprs_gold and exprs_pred and self._verify(exprs_gold, exprs_pred, timeout_seconds=None))
        return False

    def _false_relation(self, pred: Any, gold_is_relation: bool) -> bool:
        r"""Whether an equation in ``pred`` does not hold (``3 = 4``, ``x = 3 = 4``, ``3\text{ cm} = 4``).

        An equation whose sides have unknowns holds when one side is a name (``x = 3``, ``y = 2x + 3``) or
        it is an identity; when the gold is itself an equation, a pred that is one equation (``2x + y = 0``)
        is left to math-verify, but each link of a chain (``y = 4 = 2x + 3``) is still checked.
        """
        from sympy import And, Eq, preorder_traversal

        for node in preorder_traversal(pred):
            if isinstance(node, And) and node.args and all(isinstance(link, Eq) for link in node.args):
                if self._false_chain(node.args):
                    return True
                continue
            if not isinstance(node, Eq):
                continue
            lhs, rhs = node.lhs, node.rhs
            if _symbolic(lhs) or _symbolic(rhs):
                if (gold_is_relation and node is pred) or _is_name(lhs) or _is_name(rhs):
                    continue
            if not self._equal(rhs, lhs):
                return True
        return False

    def _false_chain(self, links: tuple[Any, ...]) -> bool:
        r"""Whether a chain ``a = x = b`` (math-verify's ``And`` of its links) sets two unequal values equal.

        A name in the middle (``\sqrt{16} = x = 5``) makes each link look like a label; but every side the
        names join must agree: the values of one chain (sides that are not names) must all be equal.
        """
        parent: dict[Any, Any] = {}

        def root(side: Any) -> Any:
            while parent.setdefault(side, side) is not side:
                side = parent[side]
            return side

        for link in links:
            parent[root(link.lhs)] = root(link.rhs)
        values: dict[Any, Any] = {}
        for side in list(parent):
            if _is_name(side):
                continue
            first = values.setdefault(root(side), side)
            if first is not side and not self._equal(first, side):
                return True
        return False

    def check(self, gold: str, pred: str, budget: float, request: dict[str, Any], progress: Any) -> dict[str, Any]:
        from math_verify.grader import is_relation

        phase = "gold"
        signal.setitimer(signal.ITIMER_REAL, max(budget, 0.01))
        try:
            if request.get("stall_in") == "gold":
                _stall(request)
            gold_parsed = self._parsed(gold)
            gold_is_text = all(isinstance(item, str) for item in gold_parsed)  # only the raw-string fallback
            phase = "pred"
            progress(phase)
            if request.get("stall_in", "pred") == "pred":
                _stall(request)
            pred_parsed = self._parsed(pred, "pred")
            pred_exprs = [item for item in pred_parsed if not isinstance(item, str)]
            if not pred_exprs and not gold_is_text:
                return {"status": "pred_unparsed", "equal": False, "phase": phase}
            if not pred_parsed:
                return {"status": "gold_unparsed", "equal": False, "phase": phase}
            gold_exprs = [item for item in gold_parsed if not isinstance(item, str)]
            if pred_exprs and self._false_relation(pred_exprs[0], any(is_relation(g) for g in gold_exprs)):
                return {"status": "ok", "equal": False, "why": "false_relation", "phase": phase}
            equal = self._equal(gold_parsed, pred_parsed)
            if gold_is_text and not equal:  # a string mismatch says nothing when the gold is not maths we can read
                return {"status": "gold_unparsed", "equal": False, "phase": phase}
            reply: dict[str, Any] = {"status": "ok", "equal": equal, "phase": phase}
            side = {"gold": gold_exprs, "pred": pred_exprs}.get(request.get("numeric_of", ""))
            if equal and side:
                value = _numeric(side[0])
                if value is not None:
                    reply["value"] = value
            return reply
        except _BudgetExceeded:
            return {"status": "timeout", "equal": False, "phase": phase}
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure inside sympy is a verdict, not a crash
            return {"status": "error", "equal": False, "error": type(exc).__name__, "phase": phase}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _numeric(expr: Any) -> str | None:
    """The real value of ``expr`` (or of the right side of ``x = expr``) to 50 digits, as a string; else ``None``."""
    import sympy

    if isinstance(expr, sympy.Eq):
        expr = expr.rhs
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    # A literal like 1000.99 is parsed as a 15-digit binary float; read it back as the decimal it was
    # written as, or 50-digit evaluation shows its binary error (1000.99000000000000909...).
    expr = expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)})
    value = sympy.N(expr, 50)
    if not isinstance(value, sympy.Float) or not value.is_finite:
        return None
    return str(value)  # a Float's digits: bounded, safe to print


def _stall(request: dict[str, Any]) -> None:
    """Test hooks: stand for C code that no timer can interrupt, or for an answer that needs too much memory.

    ``"stall": seconds`` blocks the timer's signal and sleeps; ``"hog": bytes`` allocates past the memory
    cap, which fails at once without touching any page.
    """
    if "stall" in request:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(float(request["stall"]))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    if "hog" in request:
        bytearray(int(request["hog"]))


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

    def progress(phase: str) -> None:
        protocol.write(json.dumps({"phase": phase}) + "\n")

    for gold, pred in _WARM_UP:
        checker.check(gold, pred, 10.0, {}, lambda phase: None)
    protocol.write('{"status": "ready"}\n')
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold, pred, budget = str(request["gold"]), str(request["pred"]), float(request["budget"])
        except (KeyError, TypeError, ValueError) as exc:
            reply = {"status": "error", "equal": False, "error": type(exc).__name__}
        else:
            reply = checker.check(gold, pred, budget, request, progress)
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()

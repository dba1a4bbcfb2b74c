"""The reasoning-gym scoring worker: runs one task's own ``score_answer`` on one extracted answer per request.

Started by :class:`lrmgym.envs.math.verify.VerifierPool` (``worker_script=`` this file) as a separate process, so
that the parent can SIGKILL it when a scorer hangs in C code or eats memory, which no in-process timer stops.
It imports reasoning-gym once (about 2 s) and then serves requests, one JSON object per line:

    parent -> worker on stdin: ``{"task": str, "config": spec, "seed": int, "question_sha": str,
    "answer": str, "budget": float, "entry": {"question", "answer", "metadata"}}`` and, in tests only,
    ``"stall": seconds`` (C code no timer interrupts) or ``"hog": bytes`` (an allocation past the memory cap).
    worker -> parent on a private copy of its original stdout: ``{"status": "ok", "score": float}`` or
    ``{"status": "refused" | "timeout" | "error" | "stale", "reason": str}``.

The item is rebuilt here from ``(task, config spec, seed)`` (:func:`lrmgym.envs.rg.tasks.make_entry`), so the
scorer sees the generator's own types, and checked against the question's SHA-256 that the task carries. A few
generators depend on Python's hash seed, which differs between processes: when the rebuilt question differs,
the item the request carries (plain JSON, with the same question hash) is scored instead; when neither matches,
the reply is ``stale`` (the task was built by another reasoning-gym version), which the env marks ungradeable.

**Code in answers.** Several reasoning-gym scorers hand the model's text to ``eval`` (``n_queens``,
``spiral_matrix``, ``binary_matrix``, ``string_insertion``) or to sympy's ``parse_expr`` (``countdown``,
``puzzle24``, ``polynomial_multiplication``, the integration tasks), which runs Python. While a scorer runs, an
audit hook (:func:`sys.addaudithook`) inspects every source compiled from reasoning-gym or sympy's parser
and refuses any that is not plain data or arithmetic (:func:`safe_source`): no attribute access, no
subscripts, no names with underscores, no lambdas or comprehensions, calls only to a short list of maths
functions and sympy constructors, and no towers of powers or exponents above 10 000. A refused answer scores 0
with the reason ``refused``. The audit hook also refuses process, file-writing, socket and ``ctypes`` events
while a scorer runs.

Only a float and status strings leave this process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import resource
import signal
import sys
import threading
from collections import OrderedDict
from typing import Any

from lrmgym.envs.math._worker import _stall

_MEMORY_LIMIT_BYTES = int(os.environ.get("LRMGYM_RG_MEMORY_BYTES") or 2 << 30)
_ENTRY_MEMO = 512

SAFE_CALLS = frozenset(
    {
        # sympy's parser wraps numbers and names in these
        "Symbol", "Integer", "Float", "Rational", "Function", "Number",
        # maths an answer may spell
        "sqrt", "cbrt", "root", "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "atan2",
        "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "exp", "log", "ln", "Abs", "abs", "factorial",
        "binomial", "floor", "ceiling", "sign", "re", "im", "Mul", "Add", "Pow", "int", "float", "round", "min",
        "max", "erf", "gamma",
    }
)  # fmt: skip
"""The only callables a compiled answer may name."""

_SAFE_NODES = (
    ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.Name, ast.Call, ast.keyword, ast.Load, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)  # fmt: skip
_MAX_SOURCE_CHARS = 20_000
_MAX_STRING_CONSTANT = 1_000
_MAX_EXPONENT = 10_000  # 9**9**9 and 2**10**9 would run the scorer into its time bound; no task needs them
# Trusted compiles a scorer triggers: sympy's parser sets up its namespace with this line.
_TRUSTED_SOURCES = frozenset({"from sympy import *"})
# Compiles from these files compile text that may come from the answer.
_UNTRUSTED_CALLERS = (f"{os.sep}reasoning_gym{os.sep}", f"{os.sep}sympy{os.sep}parsing{os.sep}")
_REFUSED_EVENTS = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
    "os.truncate", "os.putenv", "os.unsetenv", "subprocess.Popen", "socket.", "ctypes.", "shutil.", "pty.",
    "webbrowser.", "urllib.", "http.", "ftplib.", "smtplib.", "sys.settrace", "sys.setprofile", "pdb.",
    "builtins.breakpoint", "marshal.loads", "pickle.find_class", "gc.get_referrers", "gc.get_objects",
    "gc.get_referents",
)  # fmt: skip


class Refused(BaseException):  # noqa: N818 - a verdict, not an error
    """Raised by the audit hook inside a scorer. A BaseException, so a scorer's ``except Exception`` cannot eat it."""


class _BudgetExceeded(BaseException):
    """Raised by the interval timer. A BaseException so ``except Exception`` cannot eat it."""


def safe_source(source: Any) -> str | None:
    """``None`` when ``source`` (text or an AST) is plain data or arithmetic; else why it is refused."""
    if isinstance(source, (bytes, bytearray)):
        try:
            source = bytes(source).decode("utf-8")
        except UnicodeDecodeError:
            return "source is not UTF-8"
    if isinstance(source, str):
        if source.strip() in _TRUSTED_SOURCES:
            return None
        if len(source) > _MAX_SOURCE_CHARS:
            return f"source of {len(source)} characters"
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return "not a single expression"
    elif isinstance(source, ast.AST):
        tree = source
        if isinstance(tree, ast.Module) and len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
            tree = ast.Expression(tree.body[0].value)
    else:
        return f"cannot inspect a {type(source).__name__}"
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            return f"{type(node).__name__} is not allowed"
        if isinstance(node, ast.Name) and node.id.startswith("_"):
            return f"name {node.id!r} is not allowed"
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in SAFE_CALLS):
            return "a call to something other than a maths function"
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            if len(node.value) > _MAX_STRING_CONSTANT:
                return "a long string constant"
        if isinstance(node, ast.keyword) and node.arg is None:
            return "** arguments are not allowed"
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift)):
            for inner in ast.walk(node.right):
                if isinstance(inner, ast.BinOp) and isinstance(inner.op, (ast.Pow, ast.LShift)):
                    return "a tower of powers"
                if isinstance(inner, ast.Constant) and isinstance(inner.value, (int, float)):
                    if abs(inner.value) > _MAX_EXPONENT:
                        return f"an exponent above {_MAX_EXPONENT}"
    return None


class _Guard:
    """The audit hook, armed only while a scorer runs (audit hooks cannot be removed once added)."""

    def __init__(self) -> None:
        self.armed = False
        self.refusal: str | None = None  # set when the hook refused, even if the scorer swallowed the exception

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            return
        if event == "compile":
            caller = sys._getframe(1).f_code.co_filename
            if not any(part in caller for part in _UNTRUSTED_CALLERS):
                return
            why = safe_source(args[0])
            if why is not None:
                self._refuse(f"code in the answer ({why})")
        elif event == "open":
            mode = args[1] if len(args) > 1 else "r"
            flags = args[2] if len(args) > 2 else 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            ):
                self._refuse("the scorer tried to open a file for writing")
        elif event.startswith(_REFUSED_EVENTS):
            self._refuse(f"the scorer raised the audit event {event!r}")

    def _refuse(self, why: str) -> None:
        self.armed = False  # the exception's own machinery must not re-enter the hook
        self.refusal = why
        raise Refused(why)


def _on_alarm(signum: int, frame: Any) -> None:
    raise _BudgetExceeded()


class _Scorer:
    """Rebuilds entries (memoised) and scores answers under the guard and a soft time budget."""

    def __init__(self, guard: _Guard) -> None:
        import reasoning_gym  # noqa: F401 - registers every dataset

        self.guard = guard
        self._entries: OrderedDict[str, tuple[Any, dict[str, Any]]] = OrderedDict()

    def entry(self, task: str, config: dict[str, Any], seed: int) -> tuple[Any, dict[str, Any]]:
        key = json.dumps([task, config, seed], sort_keys=True)
        if key not in self._entries:
            from lrmgym.envs.rg.tasks import make_entry

            self._entries[key] = make_entry(task, config, seed)
            if len(self._entries) > _ENTRY_MEMO:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return self._entries[key]

    def score(self, request: dict[str, Any]) -> dict[str, Any]:
        task, config, seed = str(request["task"]), dict(request["config"]), int(request["seed"])
        answer, budget = str(request["answer"]), float(request["budget"])
        try:
            dataset, entry = self.entry(task, config, seed)
        except Exception as err:  # noqa: BLE001 - reported, never raised
            return {"status": "stale", "reason": f"cannot rebuild the item: {type(err).__name__}: {err}"[:200]}
        if _sha(entry.get("question")) != request.get("question_sha"):
            # A generator whose items depend on Python's hash seed: score the item the task carries.
            carried = request.get("entry")
            if not isinstance(carried, dict) or _sha(carried.get("question")) != request.get("question_sha"):
                return {"status": "stale", "reason": "the rebuilt question differs from the task's"}
            entry = {"question": carried["question"], "answer": carried.get("answer"),
                     "metadata": carried.get("metadata") or {}}  # fmt: skip
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            _stall(request)  # the math worker's test hooks: a stall no timer interrupts, a memory bomb
            self.guard.armed, self.guard.refusal = True, None
            try:
                value = dataset.score_answer(answer, entry)
            finally:
                self.guard.armed = False
        except Refused as err:
            return {"status": "refused", "reason": str(err)[:200]}
        except _BudgetExceeded:
            return {"status": "timeout", "reason": f"the scorer ran past its {budget:.1f} s budget"}
        except MemoryError:
            return {"status": "error", "reason": "the scorer ran out of memory"}
        except RecursionError:
            return {"status": "error", "reason": "the scorer recursed too deep"}
        except Exception as err:  # noqa: BLE001 - a scorer that raises on an answer scores it 0
            return {"status": "error", "reason": f"the scorer raised {type(err).__name__}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.guard.refusal is not None:  # a scorer with a bare ``except:`` swallowed the refusal
            return {"status": "refused", "reason": self.guard.refusal[:200]}
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return {"status": "error", "reason": f"the scorer returned a {type(value).__name__}, not a number"}
        value = float(value)
        if not math.isfinite(value):
            return {"status": "error", "reason": f"the scorer returned {value}"}
        return {"status": "ok", "score": value}


def _sha(text: Any) -> str:
    return hashlib.sha256(str(text).encode()).hexdigest()


def main() -> None:
    """Serve requests until stdin closes."""
    from lrmgym.envs.math._worker import _die_with_parent, _watch_parent

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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard = _Guard()
    scorer = _Scorer(guard)
    sys.addaudithook(guard)
    protocol.write('{"status": "ready"}\n')
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = scorer.score(request)
        except (KeyError, TypeError, ValueError) as exc:
            reply = {"status": "error", "reason": f"bad request: {type(exc).__name__}"}
        protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()

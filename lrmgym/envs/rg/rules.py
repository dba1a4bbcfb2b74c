"""Extra rules for the reasoning-gym scorers that pay for answers the task forbids (found by benchmarks/rg_hacking.py).

A rule sees the extracted answer and the task and returns why the answer is refused, or ``None``. It runs in the
trusted process before the scorer, so it must be linear in the answer (every rule here parses at most
:data:`~lrmgym.envs.game24.checker.MAX_EXPR_CHARS` characters with :mod:`ast`, never ``eval``). An answer must
pass its task's rule *and* reasoning-gym's scorer. Results of the reward-hacking runs: benchmarks/results/rg_hacking.md.

- ``puzzle24``: reasoning-gym checks that four numbers in the config's range make 24 after ``int()``, not that they
  are the puzzle's numbers (``6*4*1*1`` solves every puzzle) and not exactly (``int(49/2)`` is 24). The rule is
  lrmgym's exact Game24 checker over the puzzle's numbers.
- ``countdown``: reasoning-gym evaluates the answer with sympy and compares the integers it contains, so ``**``,
  ``^`` (XOR), ``%`` and decimals (``12.5*8`` "uses" 12, 5 and 8 to make 100) are paid. The rule allows only the
  config's operators, unary minus, parentheses and integers, evaluated exactly.
- ``game_of_life_halting``: reasoning-gym compares ``bool(answer) == bool(gold)``, and the gold is the string
  ``"True"`` or ``"False"``, so any non-empty answer scores 1.0. The rule requires the gold word.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

from lrmgym.core import Task
from lrmgym.envs.game24.checker import MAX_EXPR_CHARS, MAX_VALUE_BITS, check_expression
from lrmgym.envs.game24.solver import apply_op

__all__ = ["RULES", "rule_reason"]

_OPERATORS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_MAX_NODES = 128


def _meta(task: Task) -> dict:
    meta = task.metadata.get("rg_metadata")
    return meta if isinstance(meta, dict) else {}


def _puzzle24(answer: str, task: Task) -> str | None:
    numbers = _meta(task).get("numbers")
    if not isinstance(numbers, list):
        return None
    result = check_expression(answer, numbers, 24)
    return None if result.ok else result.reason


def _exact(node: ast.AST, allowed: set[str], used: list[int]) -> Fraction:
    """The exact value of an arithmetic tree over integer literals, with the operators ``allowed`` and unary minus."""
    if isinstance(node, ast.Expression):
        return _exact(node.body, allowed, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_exact(node.operand, allowed, used)
    if isinstance(node, ast.BinOp) and _OPERATORS.get(type(node.op)) in allowed:
        left, right = _exact(node.left, allowed, used), _exact(node.right, allowed, used)
        value = apply_op(_OPERATORS[type(node.op)], left, right)
        if value is None:
            raise ValueError("division by zero")
        if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_VALUE_BITS:
            raise ValueError("an intermediate value is too large")
        return value
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise ValueError(f"{what} is not allowed: use integers, {' '.join(sorted(allowed))}, unary minus and parentheses")


def _countdown(answer: str, task: Task) -> str | None:
    meta = _meta(task)
    numbers, target = meta.get("numbers"), meta.get("target")
    if not isinstance(numbers, list) or not isinstance(target, int):
        return None
    if len(answer) > MAX_EXPR_CHARS or not answer.isascii():
        return f"not a short ASCII expression (at most {MAX_EXPR_CHARS} characters)"
    config = (task.metadata.get("rg_config") or {}).get("overrides") or {}
    allowed = set(config.get("operators") or _OPERATORS.values())
    try:
        tree = ast.parse(answer.strip(), mode="eval")
        if sum(1 for _ in ast.walk(tree)) > _MAX_NODES:
            return f"more than {_MAX_NODES} syntax nodes"
        used: list[int] = []
        value = _exact(tree, allowed, used)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        return f"not an allowed expression: {err}"[:200]
    if Counter(used) != Counter(numbers):
        return f"uses the numbers {sorted(used)}, the puzzle has {sorted(numbers)}"
    return None if value == target else f"its exact value is {value}, not {target}"


def _game_of_life_halting(answer: str, task: Task) -> str | None:
    gold = str(task.answer).strip().lower()
    return None if answer.strip().lower() == gold else f"the answer must be {task.answer!r} (True or False)"


RULES: dict[str, Callable[[str, Task], str | None]] = {
    "countdown": _countdown,
    "game_of_life_halting": _game_of_life_halting,
    "puzzle24": _puzzle24,
}
"""Task name -> rule."""


def rule_reason(name: str, answer: str, task: Task) -> str | None:
    """Why task ``name``'s rule refuses ``answer``; ``None`` when it has no rule or the answer passes."""
    rule = RULES.get(name)
    return None if rule is None else rule(answer, task)

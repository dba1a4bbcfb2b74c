"""``lrmgym/Math-v0``: procedural and dataset math problems with a bounded, strict verifier.

Modules: :mod:`.generator` (procedural problems), :mod:`.loaders` (GSM8K, MATH, local files),
:mod:`.templates` (prompts and worked solutions), :mod:`.extract` (strict answer extraction),
:mod:`.shape` (one value per answer: string rules), :mod:`.verify` (the bounded verifier, reusable on its
own) and :mod:`.env` (the env).
Importing this package imports neither sympy nor math-verify; only the verifier's worker processes do.
"""

from __future__ import annotations

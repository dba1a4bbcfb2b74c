"""Read the shared adversarial battery (``$LRMGYM_SHARED_DATA/adversarial/cases.json``) for tests and benchmarks.

The battery stores long strings compactly as ``{"concat": [text, {"repeat": s, "times": n}, ...]}``;
:func:`decode` expands them. The data set is not part of lrmgym (a user's clone has none): :func:`cases` returns
``None`` when it is absent, so the caller can skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["battery_path", "cases", "decode"]


def battery_path(root: str | os.PathLike | None = None) -> Path:
    """``cases.json`` under ``root``, else ``$LRMGYM_SHARED_DATA``, else ``../shared/data`` beside the checkout."""
    if root is None:
        default = Path(__file__).resolve().parents[2].parent / "shared" / "data"
        root = os.environ.get("LRMGYM_SHARED_DATA", default)
    return Path(root) / "adversarial" / "cases.json"


def decode(value: Any) -> Any:
    """``value`` with every ``{"concat": [...]}`` string expanded, inside dicts too."""
    if isinstance(value, dict) and "concat" in value:
        return "".join(p if isinstance(p, str) else p["repeat"] * p["times"] for p in value["concat"])
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value


def cases(component: str, root: str | os.PathLike | None = None) -> list[dict] | None:
    """The decoded cases of one component (``math_verifier``, ``code_sandbox``, ``game24_checker``), or ``None``."""
    path = battery_path(root)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return [{**c, "input": decode(c["input"])} for c in data if c["component"] == component]

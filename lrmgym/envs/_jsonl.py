"""Reading JSONL task files (plain or gzipped), shared by the env loaders."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: Path, error: type[Exception]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for each non-blank line; a bad line raises ``error`` naming it."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(
                    f"{path}:{line_no}: not valid JSON ({exc.msg}). Each line must be one JSON object."
                ) from None
            if not isinstance(row, dict):
                raise error(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}.")
            yield line_no, row

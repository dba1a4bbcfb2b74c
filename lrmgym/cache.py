"""A small thread-safe LRU cache keyed by content hashes, shared by verifiers and judges.

Standard library only, so any layer (envs, judges) can use it without importing another.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["ContentCache"]


class ContentCache:
    """A thread-safe bounded LRU cache from content hashes to outcomes (judge verdicts, math verdicts).

    Callers store only outcomes worth remembering: a failure is retried next time instead.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple[bool, Any]:
        """``(True, value)`` on a hit, ``(False, None)`` on a miss."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return True, self._data[key]
            return False, None

    def put(self, key: Hashable, value: Any) -> None:
        """Store a value, evicting the least recently used entry when full."""
        if self.max_entries <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

"""One torch thread in these tests: the CPU is shared, and tiny models gain nothing from more."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

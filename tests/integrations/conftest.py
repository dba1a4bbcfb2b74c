"""Fixtures of the integration tests: OpenRLHF 0.11.2's plug-in module, importable without installing OpenRLHF.

``pip install openrlhf`` fails on a CPU machine (flash-attn builds from source), so when ``openrlhf`` is not
importable the wheel is fetched once with ``pip download --no-deps --only-binary=:all: openrlhf==0.11.2`` into
``~/.cache/lrmgym-test/`` and unpacked there (:func:`openrlhf_wheel.openrlhf_source`); tests that need it skip,
with the reason, when that fails (no network). Only ``openrlhf.utils.agent`` is imported into the test process: it
needs transformers, aiohttp, sympy and pylatexenc, not vllm or ray. The ``openrlhf`` modules are removed from
``sys.modules`` and the folder from ``sys.path`` when the session ends.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
from openrlhf_wheel import openrlhf_source


def _needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"openrlhf.utils.agent needs {', '.join(missing)} (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def openrlhf_agent():
    """``openrlhf.utils.agent`` of OpenRLHF 0.11.2: the installed package, else the unpacked wheel."""
    _needs("transformers", "aiohttp", "sympy", "pylatexenc")
    added: Path | None = None
    if importlib.util.find_spec("openrlhf") is None:
        added = openrlhf_source()
        sys.path.insert(0, str(added))
    before = set(sys.modules)
    try:
        with warnings.catch_warnings():  # its math_utils has an invalid escape sequence ("\\%")
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module("openrlhf.utils.agent")
    except ImportError as err:
        pytest.skip(f"openrlhf.utils.agent cannot be imported: {err}")
    yield module
    for name in set(sys.modules) - before:
        if name == "openrlhf" or name.startswith("openrlhf."):
            del sys.modules[name]
    if added is not None and str(added) in sys.path:
        sys.path.remove(str(added))

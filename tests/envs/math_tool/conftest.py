"""With ``LRMGYM_TEST_NO_BWRAP=1``, bubblewrap is taken off ``PATH`` here too (by ``tests/envs/code/conftest.py``,
loaded by path), so the tool envs' ``sandbox=auto`` runs on the unshare fallback: CI runs these tests once each way."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

if os.environ.get("LRMGYM_TEST_NO_BWRAP", "") not in ("", "0") and shutil.which("bwrap") is not None:
    _CODE_CONFTEST = Path(__file__).resolve().parents[1] / "code" / "conftest.py"
    sys.path.insert(0, str(_CODE_CONFTEST.parent))  # for its `from code_helpers import ...`
    _spec = importlib.util.spec_from_file_location("lrmgym_code_conftest", _CODE_CONFTEST)
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))  # it hides bwrap when the variable is set

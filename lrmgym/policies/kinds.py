"""Which config class implements each policy kind (``kind -> "module:ConfigClass"``), and a lookup.

Strings, not imports, so that naming a kind imports only its module. :mod:`lrmgym.configs` takes its policy
table from here; a component that holds a policy config (an LLM judge) builds one from a mapping with
:func:`policy_config` without importing the configs layer.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

__all__ = ["POLICY_KINDS", "policy_config"]

POLICY_KINDS: dict[str, str] = {
    "mock": "lrmgym.testing.mock:MockPolicyConfig",
    "tiny": "lrmgym.policies.tiny:TinyPolicyConfig",
    "hf": "lrmgym.policies.hf:HFPolicyConfig",
    "openai": "lrmgym.policies.openai:OpenAIPolicyConfig",
    "vllm": "lrmgym.policies.vllm:VLLMPolicyConfig",
}


def policy_config(data: dict[str, Any]) -> Any:
    """The policy config a ``{kind: ..., ...}`` mapping describes (pydantic validates the rest).

    Raises:
        ValueError: The kind is missing or unknown (the message lists the known kinds).
    """
    kind = data.get("kind")
    allowed = ", ".join(sorted(POLICY_KINDS))
    if kind is None:
        raise ValueError(f"policy.kind: missing required key; allowed: {allowed}.")
    if kind not in POLICY_KINDS:
        close = difflib.get_close_matches(str(kind), list(POLICY_KINDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"policy.kind: unknown kind {kind!r}; allowed: {allowed}.{hint}")
    module, _, name = POLICY_KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name).model_validate(data)

"""Which config class implements each policy kind (``kind -> "module:ConfigClass"``), and a lookup.

Strings, not imports, so that naming a kind imports only its module. :mod:`lrmgym.configs` takes its policy
table from here; a component that holds a policy config (an LLM judge) builds one from a mapping with
:func:`policy_config` without importing the configs layer.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

__all__ = ["POLICY_KINDS", "nested_policy_config", "policy_config"]

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


def nested_policy_config(value: Any, context: dict[str, Any] | None, expected: str = "a policy config") -> Any:
    """A policy config held by another config (an LLM judge's ``policy``, SD's ``prune``), validated now.

    A config object with ``build`` is kept; a mapping (``{kind: openai, ...}``) becomes its kind's config through
    the resolver :mod:`lrmgym.configs` passes in the validation context as ``component`` (its errors name the
    dotted path; the holders do not import configs), else through :func:`policy_config`.

    Raises:
        ValueError: ``value`` is neither, the message naming ``expected``.
    """
    if callable(getattr(value, "build", None)) and hasattr(value, "model_dump"):
        return value
    resolve = (context or {}).get("component")
    if isinstance(value, dict) and callable(resolve):
        return resolve("policy", value)
    if isinstance(value, dict):
        return policy_config(value)
    raise ValueError(
        f"expected {expected} with a kind, e.g. {{kind: openai, base_url: ..., model: ...}}, got {value!r:.80}"
    )

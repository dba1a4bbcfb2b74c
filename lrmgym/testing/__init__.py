"""Public test kit: ``check_env`` for text envs, and mock policies under the Policy protocol.

Use it to test your own envs, judges and pipelines on a CPU in seconds::

    from lrmgym.testing import check_env, ScriptedPolicy
    check_env(lrmgym.make("MyEnv-v0"))
"""

from lrmgym.testing.checker import EnvCheckError, check_env
from lrmgym.testing.mock import (
    ADVERSARIAL_OUTPUTS,
    AdversarialPolicy,
    MockPolicyConfig,
    RandomTextPolicy,
    ScriptedPolicy,
)

__all__ = [
    "ADVERSARIAL_OUTPUTS",
    "AdversarialPolicy",
    "EnvCheckError",
    "MockPolicyConfig",
    "RandomTextPolicy",
    "ScriptedPolicy",
    "check_env",
]

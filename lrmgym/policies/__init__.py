"""Everything that produces completions, behind one :class:`~lrmgym.policies.base.Policy` protocol."""

from lrmgym.policies.base import Policy, SamplingParams

__all__ = ["Policy", "SamplingParams"]

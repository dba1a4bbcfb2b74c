"""Which config class implements each component kind: ``group -> kind -> "module:ConfigClass"``.

Strings, not imports, so that resolving a config imports only the modules of the kinds it names (no torch
for ``lrmgym config show env=math``). A kind whose module is not installed is reported as unavailable with
a clear message instead of a traceback.
"""

from __future__ import annotations

from lrmgym.policies.kinds import POLICY_KINDS

COMPONENTS: dict[str, dict[str, str]] = {
    "policy": POLICY_KINDS,
    "learner": {
        "grpo": "lrmgym.learners.algorithms.grpo:GRPOConfig",
        "dapo": "lrmgym.learners.algorithms.dapo:DAPOConfig",
        "ppo": "lrmgym.learners.algorithms.ppo:PPOConfig",
        "ring_zero": "lrmgym.learners.algorithms.ring_zero:RingZeroConfig",
        "reason_maxxer": "lrmgym.learners.algorithms.reason_maxxer:ReasonMaxxerConfig",
        "kl_distill": "lrmgym.learners.algorithms.kl_distill_config:KLDistillConfig",
    },
    "judge": {
        "accuracy": "lrmgym.judges.rule:AccuracyJudgeConfig",
        "format": "lrmgym.judges.rule:FormatJudgeConfig",
        "length": "lrmgym.judges.rule:LengthPenaltyConfig",
        "overlong": "lrmgym.judges.rule:OverlongPenaltyConfig",
        "llm_pointwise": "lrmgym.judges.llm:PointwiseJudgeConfig",
        "llm_pairwise": "lrmgym.judges.llm:PairwiseJudgeConfig",
        "rule_pairwise": "lrmgym.judges.pairwise_rule:RulePairwiseJudgeConfig",
        "rule_pointwise": "lrmgym.judges.pointwise_rule:RulePointwiseJudgeConfig",
        "arena": "lrmgym.judges.arena:ArenaJudgeConfig",
    },
    "backend": {
        "native": "lrmgym.configs.schema:NativeBackendConfig",
        "openrlhf": "lrmgym.integrations.openrlhf_launch:OpenRLHFBackendConfig",
    },
}
"""Each group's kinds. Adding a component = one line here plus its config class and a preset YAML."""

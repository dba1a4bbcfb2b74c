"""Judges: reward wrappers over any env (rule, LLM-as-judge, the Reasoning Arena tournament)."""

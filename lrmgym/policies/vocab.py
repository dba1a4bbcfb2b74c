"""Two policies that compare next-token distributions id by id must share one tokenizer."""

from __future__ import annotations

from typing import Any

__all__ = ["check_same_vocabulary"]


def check_same_vocabulary(policy: Any, other: Any, option: str, other_option: str) -> None:
    """Refuse two policies whose tokenizers differ: next-token distributions are compared id by id."""
    ours, theirs = other.tokenizer.get_vocab(), policy.tokenizer.get_vocab()
    if ours != theirs:
        differ = len(set(ours.items()) ^ set(theirs.items()))
        raise ValueError(
            f"{option}: its tokenizer's vocabulary differs from {other_option}'s ({len(theirs)} vs {len(ours)} "
            f"tokens, {differ} entries differ); next-token distributions are compared id by id, so both need one "
            "tokenizer."
        )

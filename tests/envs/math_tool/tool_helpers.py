"""Helpers of the tool-env tests: a scripted policy that reports token ids, and tasks with a known gold."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from lrmgym.core import Completion, Prompt, Task
from lrmgym.envs.tools import CALL_CLOSE, CALL_OPEN

GOLD = "918273645"
"""A gold answer no file, variable or module of the machine holds by chance (3 x 306091215)."""
QUESTION = "Compute 3 * 306091215."


def call(code: str, name: str = "python") -> str:
    """A well-formed tool call of ``code``."""
    return f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': {'code': code}})}{CALL_CLOSE}"


def r1(answer: str, think: str = "done") -> str:
    """A final answer in the r1 template."""
    return f"<think>{think}</think><answer>{answer}</answer>"


def gold_task(env, gold: str = GOLD, question: str = QUESTION) -> Task:
    """A math task with gold ``gold``, its prompt carrying the env's tool instructions."""
    inner = env.unwrapped.inner
    template = inner.config.template
    base = Task(
        id="tool-test/gold", prompt=f"Q:{question} A:", answer=gold,
        metadata={"source": "test", "template": template, "question": question, "answer_form": "integer"},
    )  # fmt: skip
    return env.unwrapped.with_tools(base)


class ScriptedTokenPolicy:
    """A :class:`~lrmgym.policies.base.TokenContextPolicy` that answers from a script and reports token ids.

    ``script(context_text, turn)`` gives the text of a turn (``turn`` is 1 for the first); it is encoded with the
    tiny model's character tokenizer and closed with EOS, and ``prompt_token_ids`` is exactly the context it was
    sampled on, so the episode driver's token-exact path is exercised as with a real model.
    """

    def __init__(self, script: Callable[[str, int], str]) -> None:
        from lrmgym.policies.tiny import build_tokenizer

        self.tokenizer = build_tokenizer()
        self.eos = self.tokenizer.eos_token_id
        self.script = script
        self.contexts: list[list[int]] = []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _complete(self, ids: list[int], turn: int) -> Completion:
        context = self.tokenizer.decode(ids, skip_special_tokens=False)
        text = self.script(context, turn)
        tokens = [*self._encode(text), self.eos]
        self.contexts.append(list(ids))
        return Completion(text, tokens, [0.0] * len(tokens), "stop", list(ids))

    def generate(self, prompts: Sequence[Prompt], n: int = 1, sampling=None) -> list[list[Completion]]:
        """Turn 1: the prompts' own encodings."""
        return [[self._complete(self._encode(str(p)), 1) for _ in range(n)] for p in prompts]

    def generate_from_ids(self, prompt_ids, n: int = 1, sampling=None) -> list[list[Completion]]:
        """Later turns: from the exact token context."""
        return [[self._complete(list(ids), 1 + list(ids).count(self.eos)) for _ in range(n)] for ids in prompt_ids]

    def encode_reply(self, prompt: Prompt, completion: Completion, reply: str) -> list[int]:
        """Text prompts: the reply's own encoding."""
        return self._encode(reply)

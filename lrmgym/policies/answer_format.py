r"""The answer-format instruction a chat model gets as a system message (``policy.answer_instruction``).

A real instruction-tuned model conditioned on the tiny model's compact prompt (``Q:12+7. A:``, raw text) has no
way to know that the math env reads its answer from ``<answer> </answer>`` (template ``r1``), ``\boxed{}``
(``boxed``) or a last ``Answer:`` line (``plain``): :mod:`lrmgym.envs.math.extract`, strict by default. With
``policy.answer_instruction`` set (``policy=hf``'s preset sets ``auto``) and a tokenizer that has a chat template,
:class:`~lrmgym.policies.hf.HFPolicy` sends every prompt through the template (a text prompt as one user message)
after a system message with the instruction (:func:`with_instruction`).

``auto`` is resolved when the run composes its parts (:func:`lrmgym.compose.build_policy`), from the env's config
(:func:`lrmgym.compose.env_answer_instruction`): the env's own instruction for its answer template when its
prompts are compact
(they state no format), and no system message (``""``) where the prompts state the format already (the
``instruct`` style, the code env's prompts) or the env is not one this module knows. The tiny policy has no such key:
its prompts stay as they are.
"""

from __future__ import annotations

from lrmgym.core import Prompt

__all__ = ["AUTO", "with_instruction"]

AUTO = "auto"
"""``policy.answer_instruction``'s value that takes the env's instruction (``compose.env_answer_instruction``)."""


def with_instruction(prompt: Prompt, instruction: str) -> Prompt:
    """``prompt`` as chat messages: a text prompt as one user message, after a system message with ``instruction``.

    A chat prompt that starts with a system message is kept as it is (the env's, or one already added), so that
    applying this twice changes nothing; an empty ``instruction`` adds no system message. Anything that is not a
    prompt is returned unchanged (the policy's own check reports it).
    """
    if isinstance(prompt, str):
        messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        messages = list(prompt)
    else:
        return prompt
    if not instruction or (messages and messages[0].get("role") == "system"):
        return messages
    return [{"role": "system", "content": instruction}, *messages]

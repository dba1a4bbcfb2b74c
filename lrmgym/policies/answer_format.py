r"""The answer-format instruction a chat model gets as a system message (``policy.answer_instruction``).

A real instruction-tuned model conditioned on the tiny model's compact prompt (``Q:12+7. A:``, raw text) has no
way to know that the math env reads its answer from ``<answer> </answer>`` (template ``r1``), ``\boxed{}``
(``boxed``) or a last ``Answer:`` line (``plain``): :mod:`lrmgym.envs.math.extract`, strict by default. With
``policy.answer_instruction`` set (``policy=hf``'s preset sets ``auto``) and a tokenizer that has a chat template,
:class:`~lrmgym.policies.hf.HFPolicy` sends every prompt through the template (a text prompt as one user message)
after a system message with the instruction (:func:`with_instruction`).

``auto`` is resolved when the run composes its parts (:func:`lrmgym.compose.build_policy`), from the env's config
(:func:`env_answer_instruction`): the env's own instruction for its answer template when its prompts are compact
(they state no format), and no system message (``""``) where the prompts state the format already (the
``instruct`` style, the code env's prompts) or the env is not one this module knows. The tiny policy has no such key:
its prompts stay as they are.
"""

from __future__ import annotations

from typing import Any

from lrmgym.core import Prompt

__all__ = ["AUTO", "env_answer_instruction", "with_instruction"]

AUTO = "auto"
"""``policy.answer_instruction``'s value that takes the env's instruction (:func:`env_answer_instruction`)."""


def env_answer_instruction(env_config: Any) -> str:
    """The system instruction ``auto`` stands for with this env config (``""``: none needed or known).

    The math env in the ``compact`` style: its own instruction for its ``template`` (the sentence its ``instruct``
    style appends to each question). Anything else: ``""`` (Game24's compact prompts too: its instruction depends
    on the episode mode; ``env.style=instruct`` is what a real model should get there).
    """
    env_id = str(getattr(env_config, "id", ""))
    template = getattr(env_config, "template", None)
    if getattr(env_config, "style", None) != "compact" or template is None:
        return ""
    if env_id.startswith("lrmgym/Math-"):
        from lrmgym.envs.math.templates import INSTRUCTIONS

        return INSTRUCTIONS.get(str(template), "")
    return ""


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

"""The copies of a policy's weights the update keeps: float32 masters of low-precision weights, the frozen reference.

:class:`Float32Master` (``learner.fp32_master``) is what the optimizer steps for bfloat16/float16 weights;
:func:`frozen_reference` gives the reference policy of the KL (:class:`AdapterOffReference` for a fresh LoRA
adapter, else a frozen copy); :class:`UpdaterState` is the updater's checkpointed state and the reference's resets.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["AdapterOffReference", "Float32Master", "Scorer", "UpdaterState", "frozen_reference"]


class Float32Master:
    """float32 copies of low-precision trainable parameters, which the optimizer steps (``learner.fp32_master``).

    Per optimizer step: :meth:`take_grads` moves the parameters' gradients onto the copies (in float32), the
    optimizer steps the copies, :meth:`write_back` rounds them into the parameters.
    """

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.weights = [torch.nn.Parameter(p.detach().float().clone()) for p in params]

    def take_grads(self) -> None:
        """Each parameter's gradient, in float32, onto its copy (and off the parameter)."""
        for p, w in zip(self.params, self.weights, strict=True):
            w.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        """The stepped copies, rounded, into the parameters."""
        for p, w in zip(self.params, self.weights, strict=True):
            p.copy_(w)

    @torch.no_grad()
    def load(self, saved: list[torch.Tensor] | None) -> None:
        """The copies from a checkpoint's ``saved`` float32 weights, or from the parameters when it has none."""
        sources = saved if saved is not None else [p.float() for p in self.params]
        for w, source in zip(self.weights, sources, strict=True):
            w.copy_(source)


class AdapterOffReference:
    """The reference policy of a LoRA run: the policy's own model with its adapters switched off.

    peft's ``disable_adapter()`` runs the base weights alone, which is the initial policy where the adapters
    start as the identity (every ``lora_B`` zero: peft's default initialisation), so no second copy of the model
    is kept (a 7B model's copy is 14 GB in bf16). :func:`frozen_reference` decides which reference a run gets.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @contextlib.contextmanager
    def scoring(self) -> Iterator[torch.nn.Module]:
        """The model with its adapters off and in eval mode (no dropout), restored on exit."""
        training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():  # type: ignore[operator]  # a peft PeftModel
                yield self.model
        finally:
            self.model.train(training)


Scorer = torch.nn.Module | AdapterOffReference
"""What the update's no-grad passes score with: a model, or the policy with its adapters off."""


def frozen_reference(model: torch.nn.Module, refreshed: bool = False) -> Scorer:
    """The frozen reference of ``model``'s policy as it is now: adapters off where that is the same, else a copy.

    :class:`AdapterOffReference` for a peft model whose LoRA adapters are all the identity now (a fresh
    adapter) and whose reference is never ``refreshed`` (reset to the current policy, which the base weights
    alone are not); a frozen ``deepcopy`` otherwise (a plain model, a loaded adapter, ``ref_refresh_steps``).
    """
    if not refreshed and callable(getattr(model, "disable_adapter", None)):
        lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
        if lora_b and all(not bool(p.detach().any()) for p in lora_b):
            return AdapterOffReference(model)
    return copy.deepcopy(model).eval().requires_grad_(False)


class UpdaterState:
    """The checkpointed state of :class:`~lrmgym.learners.engine.update.PolicyUpdater` and its reference resets.

    A mixin: the updater holds ``cfg``, ``model``, ``optimizer``, ``scheduler``, ``master`` (a
    :class:`Float32Master` or None), ``ref_model``, ``ref_step`` and ``engine`` (a rollout engine or None).
    """

    cfg: Any
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    master: Float32Master | None
    ref_model: Scorer | None
    ref_step: int
    engine: Any

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and schedule state; and the reference's weights once a reset replaced the initial ones."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.master is not None:
            state["fp32_master"] = [w.detach().clone() for w in self.master.weights]
        if self.ref_step > 0 and isinstance(self.ref_model, torch.nn.Module):  # a refreshed reference is a copy
            state.update(ref_step=self.ref_step, ref_model=self.ref_model.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        if self.engine is not None:
            self.engine.mark_stale()
        if self.master is not None:  # the float32 weights as saved, else the loaded (rounded) ones
            self.master.load(state.get("fp32_master"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.ref_step = int(state.get("ref_step", 0))
        if "ref_model" in state and isinstance(self.ref_model, torch.nn.Module):
            self.ref_model.load_state_dict(state["ref_model"])

    def refresh_ref(self) -> None:
        """Reset the reference to the policy when ``ref_refresh_steps`` says so (:meth:`update` calls this first).

        Due at the start of each step whose count of steps done (the schedule's) is a multiple of it: that step's
        KL is 0. A step without an update moves no weights, so a reset left to the next update copies the same
        policy. A resumed run rebuilds the initial reference as before; a reset one is in the checkpoint.
        """
        due = self.scheduler.last_epoch // self.cfg.ref_refresh_steps * self.cfg.ref_refresh_steps
        if isinstance(self.ref_model, torch.nn.Module) and due > self.ref_step:  # (a copy: frozen_reference)
            self.ref_model.load_state_dict(self.model.state_dict())
            self.ref_step = due

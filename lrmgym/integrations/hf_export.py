"""A trained run's model out and back in: ``lrmgym export hf`` and ``policy.path=RUN``.

A run directory's checkpoints (``checkpoints/step_N.pt``) hold the policy's ``state_dict`` beside the optimizer and
the RNG states: a resume format, not a model folder. :func:`load_run_policy` rebuilds the run's policy from its
``config.yaml`` (the tiny model, or ``policy=hf`` with or without LoRA) and loads a checkpoint's weights into it;
:func:`export_hf` writes that model as a transformers folder that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load offline, and that ``policy=hf policy.model=DIR`` (or vLLM) serves:

- ``config.json``, ``model.safetensors``, ``generation_config.json`` and the tokenizer's files;
- a LoRA run: the adapter merged into the base weights (default), or with ``adapter=True`` the peft adapter folder
  (``adapter_config.json`` + ``adapter_model.safetensors``, naming its base model by absolute path) and the
  tokenizer, for ``policy=hf policy.model=BASE policy.adapter=DIR``;
- ``lrmgym_export.json``: the run, the checkpoint and step, the form (full / merged / adapter).

The folder is written whole or not at all: into a temporary sibling, renamed to ``out`` at the end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lrmgym.files import replaced_dir
from lrmgym.runs import HFExportError, is_run_dir, load_run_policy, run_checkpoint

__all__ = ["EXPORT_RECORD", "HFExportError", "HFExportResult", "export_hf", "is_run_dir", "load_run_policy"]

EXPORT_RECORD = "lrmgym_export.json"
"""The file of an exported folder that says where its weights came from."""


@dataclass
class HFExportResult:
    """What :func:`export_hf` wrote: the folder, the checkpoint's step and file, the form and the files."""

    out_dir: Path
    step: int
    checkpoint: Path
    form: str
    files: list[str]


def _check_out(out: Path, force: bool) -> Path:
    from lrmgym.files import OutputPathError, check_output_dir

    try:
        resolved = check_output_dir(out, force, what="out")
    except OutputPathError as err:
        raise HFExportError(str(err)) from None
    if os.path.lexists(out) and not out.is_dir():
        raise HFExportError(f"out={out}: it is a file; give a new folder.")
    if out.exists() and not force:
        raise HFExportError(f"out={out}: it already exists; pass --force to replace it, or give a new folder.")
    return resolved


def _save(policy: Any, folder: Path, adapter: bool) -> str:
    """Write the model (merged / full / adapter) and tokenizer into ``folder``; returns the form written."""
    from transformers import GenerationConfig

    model = policy.model
    peft = hasattr(model, "peft_config")
    if adapter:
        base = model.peft_config["default"].base_model_name_or_path
        if base and Path(base).expanduser().is_dir():  # a folder: name it so the adapter loads from anywhere
            model.peft_config["default"].base_model_name_or_path = str(Path(base).expanduser().resolve())
        model.save_pretrained(str(folder))
        form = "adapter"
    else:
        if peft:
            model = model.merge_and_unload()
        model.save_pretrained(str(folder), safe_serialization=True)
        form = "merged" if peft else "full"
    policy.tokenizer.save_pretrained(str(folder))
    if not adapter and not (folder / "generation_config.json").is_file():
        GenerationConfig.from_model_config(model.config).save_pretrained(str(folder))
    return form


def export_hf(
    run_dir: str | os.PathLike, out: str | os.PathLike, step: int | None = None, adapter: bool = False,
    force: bool = False, version: str = "",
) -> HFExportResult:  # fmt: skip
    """Write run ``run_dir``'s model (its checkpoint of ``step``, default the newest) as a transformers folder.

    Args:
        run_dir: The directory of a ``lrmgym run``.
        out: The folder to write; replaced only with ``force`` (never a run folder or the current folder).
        step: The checkpoint's step; ``None``: the newest (the run's final weights once it has finished).
        adapter: For a LoRA run, write the adapter folder instead of merged weights.
        force: Replace an existing ``out``.
        version: The lrmgym version recorded in ``lrmgym_export.json``.

    Raises:
        HFExportError: A user's mistake (see :func:`load_run_policy`; ``out`` exists; ``adapter`` for a run
            without LoRA), before anything is written.
    """
    out = Path(out).expanduser()
    run_dir = Path(run_dir).expanduser()
    target = _check_out(out, force)
    checkpoint, step = run_checkpoint(run_dir, step)
    policy = load_run_policy(run_dir, step, device="cpu")
    if adapter and not hasattr(policy.model, "peft_config"):
        raise HFExportError(
            f"--adapter: RUN {str(run_dir)!r} trained all the model's weights (no LoRA), so there is no adapter; "
            "export without --adapter."
        )
    with replaced_dir(target) as tmp:  # --force: the old folder goes only once the new one is complete
        form = _save(policy, tmp, adapter)
        record = {"run": str(run_dir.resolve()), "checkpoint": checkpoint.name, "step": step, "form": form,
                  "lrmgym": version}  # fmt: skip
        (tmp / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp (and some writers) make files private; an exported model is a normal folder
        for written in tmp.iterdir():
            os.chmod(written, 0o644)
    files = sorted(p.name for p in target.iterdir())
    return HFExportResult(target, step, checkpoint, form, files)

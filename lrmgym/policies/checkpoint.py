"""Check a model folder before loading it: one clear error for each way a ``policy.model`` can be wrong.

:func:`model_folder` turns ``policy.model`` (a local folder, or a hub id already in the Hugging Face cache) into
the folder to load, and refuses, naming the path and the fix, before any weights are read:

- a path that does not exist, is a file, or is an empty folder;
- a folder without ``config.json`` (a peft adapter folder is recognised and pointed at ``policy.adapter``), or
  whose ``config.json`` is not JSON, names no ``model_type``, or one this transformers cannot load as a causal LM;
- a folder without weight files (``*.safetensors``, ``pytorch_model*.bin``...), or whose shard index names
  shards that are not there;
- a hub id that is not cached: nothing is ever downloaded at run time (``local_files_only=True``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["ModelFolderError", "adapter_folder", "model_folder", "tokenizer_folder"]

_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "tf_model.h5", "flax_model.msgpack", "*.gguf")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_MAX_CONFIG_BYTES = 16 << 20


class ModelFolderError(FileNotFoundError, ValueError):
    """``policy.model`` (or its tokenizer / adapter) is not a usable model folder; the message says why and the fix.

    Both a :class:`FileNotFoundError` (the files needed are not there) and a :class:`ValueError` (a bad config
    value), so a caller that reports either as a user's mistake reports this one.
    """


def _is_path(source: str) -> bool:
    """A path rather than a hub id: absolute, relative (``./``, ``../``), ``~``, or with more than one ``/``."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or os.sep != "/" and os.sep in source


def _cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of hub model ``repo_id`` (one that holds a config.json), or ``None``."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"


def _locate(source: str, field: str, what: str) -> Path:
    """The local folder ``source`` names (itself, or its cached hub snapshot)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelFolderError(
            f"{field}={source!r} is a file, not a folder. Point it at the folder that holds {what} "
            f"(e.g. {path.parent})."
        )
    if _is_path(source):
        raise ModelFolderError(
            f"{field}={source!r} is not a folder. Point it at a folder with {what} (e.g. one written by "
            "save_pretrained); nothing is downloaded at run time."
        )
    snapshot = _cached_snapshot(source)
    if snapshot is not None:
        return snapshot
    raise ModelFolderError(
        f"{field}={source!r} is neither a local folder nor a model in the Hugging Face cache ({_hub_cache()}); "
        "lrmgym never downloads at run time. Give the path of a local model folder, or download it first "
        f"(huggingface-cli download {source}) and run again."
    )


def _read_config(folder: Path, field: str, source: str) -> dict[str, Any]:
    config_path = folder / "config.json"
    try:
        if config_path.stat().st_size > _MAX_CONFIG_BYTES:
            raise ModelFolderError(f"{field}={source!r}: {config_path} is over 16 MiB, so it is not a model config.")
        data = json.loads(config_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        where = f" (line {err.lineno}, column {err.colno}: {err.msg})" if isinstance(err, json.JSONDecodeError) else ""
        raise ModelFolderError(
            f"{field}={source!r}: {config_path} is not valid JSON{where}. Re-save the model with save_pretrained, "
            "or download it again."
        ) from None
    except OSError as err:
        raise ModelFolderError(f"{field}={source!r}: {config_path} cannot be read ({err.strerror or err}).") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"{field}={source!r}: {config_path} is not a JSON object, so it is not a model config.")
    return data


def _check_model_type(config: dict[str, Any], folder: Path, field: str, source: str, remote_code: bool) -> None:
    model_type = config.get("model_type")
    if remote_code and "auto_map" in config:
        return  # the checkpoint's own code defines the model
    if not isinstance(model_type, str) or not model_type:
        raise ModelFolderError(
            f"{field}={source!r}: {folder / 'config.json'} names no model_type, so transformers cannot tell which "
            "model it is. Re-save the model with save_pretrained."
        )
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return  # the load itself will say what is missing
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelFolderError(
            f"{field}={source!r}: model_type {model_type!r} (in {folder / 'config.json'}) is unknown to transformers "
            f"{transformers.__version__}. Upgrade transformers (pip install -U transformers), or, if the checkpoint "
            "ships its own model code and you trust it, set policy.trust_remote_code=true."
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelFolderError(
            f"{field}={source!r}: a {model_type!r} model cannot be loaded as a causal language model "
            "(AutoModelForCausalLM); the hf policy needs a text-generation model (Llama, Qwen2, GPT-2, ...)."
        )


def _check_weights(folder: Path, field: str, source: str) -> None:
    for index_name in _INDEXES:
        index = folder / index_name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise ModelFolderError(
                    f"{field}={source!r}: {index} is not a valid shard index (a JSON object with a weight_map)."
                ) from None
            missing = sorted(s for s in shards if not (folder / s).is_file())
            if missing:
                raise ModelFolderError(
                    f"{field}={source!r}: {len(missing)} weight shard(s) named in {index.name} are missing, e.g. "
                    f"{folder / missing[0]}. Copy or download the whole model folder."
                )
            return
    if not any(next(folder.glob(pattern), None) is not None for pattern in _WEIGHT_GLOBS):
        present = sorted(p.name for p in folder.iterdir())[:8]
        raise ModelFolderError(
            f"{field}={source!r}: {folder} has a config.json but no weight files (*.safetensors or "
            f"pytorch_model.bin); it holds {', '.join(present)}. Save the model with save_pretrained, or copy "
            "its weights there."
        )


def model_folder(source: str, field: str = "policy.model", trust_remote_code: bool = False) -> Path:
    """The local folder of model ``source`` (a folder or a cached hub id), checked as the module docstring says.

    Raises:
        ModelFolderError: The first problem found; the message names the path and the fix.
    """
    folder = _locate(source, field, "config.json and the weights")
    if next(folder.iterdir(), None) is None:
        raise ModelFolderError(
            f"{field}={source!r}: the folder {folder} is empty. It needs config.json and weight files "
            "(*.safetensors), e.g. written by save_pretrained."
        )
    if not (folder / "config.json").is_file():
        if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
            raise ModelFolderError(
                f"{field}={source!r}: {folder} is the directory of a `lrmgym run`, not a model folder. Evaluate its "
                f"model with policy.path={source} (without policy=hf), or export it first: lrmgym export hf "
                f"{source} out=DIR, then {field}=DIR."
            )
        if (folder / "adapter_config.json").is_file():
            raise ModelFolderError(
                f"{field}={source!r}: {folder} holds a peft adapter, not a model. Set {field} to its base model "
                f"and policy.adapter={source}."
            )
        raise ModelFolderError(
            f"{field}={source!r}: {folder} has no config.json, so it is not a transformers model folder. Point it "
            "at the folder written by save_pretrained (the one holding config.json)."
        )
    config = _read_config(folder, field, source)
    _check_model_type(config, folder, field, source, trust_remote_code)
    _check_weights(folder, field, source)
    return folder


def tokenizer_folder(source: str, field: str = "policy.tokenizer") -> Path:
    """The local folder of tokenizer ``source`` (a folder or a cached hub id), which must hold tokenizer files."""
    folder = _locate(source, field, "the tokenizer files (tokenizer.json, tokenizer_config.json...)")
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelFolderError(
            f"{field}={source!r}: {folder} has no tokenizer files ({', '.join(_TOKENIZER_FILES[:2])}...). Save the "
            "tokenizer there with tokenizer.save_pretrained, or set policy.tokenizer to a folder that has one."
        )
    return folder


def adapter_folder(source: str, field: str = "policy.adapter") -> Path:
    """The local folder of a saved peft adapter, which must hold ``adapter_config.json``."""
    folder = _locate(source, field, "adapter_config.json and the adapter weights")
    if not (folder / "adapter_config.json").is_file():
        raise ModelFolderError(
            f"{field}={source!r}: {folder} has no adapter_config.json, so it is not a saved peft adapter. Point it "
            "at the folder written by the adapter's save_pretrained."
        )
    return folder

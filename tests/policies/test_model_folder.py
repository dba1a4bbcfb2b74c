"""Bad ``policy.model`` folders: one clear error naming the path and the fix, before any weights are read."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from lrmgym.policies.checkpoint import ModelFolderError, model_folder, tokenizer_folder
from lrmgym.policies.hf import HFPolicyConfig


def _folder(path, config=None, files=("model.safetensors", "tokenizer.json")):
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for name in files:
        (path / name).write_bytes(b"")
    return path


def _fails(source, message, **kwargs):
    with pytest.raises(ModelFolderError, match=f"^{re.escape(message)}$"):
        model_folder(str(source), **kwargs)


def test_an_empty_folder(tmp_path):
    _fails(
        tmp_path,
        f"policy.model={str(tmp_path)!r}: the folder {tmp_path} is empty. It needs config.json and weight files "
        "(*.safetensors), e.g. written by save_pretrained.",
    )


def test_a_corrupt_config_json(tmp_path):
    folder = _folder(tmp_path / "m", '{"model_type": "llama",')
    _fails(
        folder,
        f"policy.model={str(folder)!r}: {folder / 'config.json'} is not valid JSON (line 1, column 24: Expecting "
        "property name enclosed in double quotes). Re-save the model with save_pretrained, or download it again.",
    )
    (folder / "config.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ModelFolderError, match="config.json is not valid JSON. Re-save"):
        model_folder(str(folder))
    (folder / "config.json").write_text("[1]")
    with pytest.raises(ModelFolderError, match="config.json is not a JSON object, so it is not a model config.$"):
        model_folder(str(folder))


def test_an_unknown_or_non_causal_model_type(tmp_path):
    folder = _folder(tmp_path / "m", {"model_type": "not_a_model"})
    with pytest.raises(ModelFolderError, match=r"model_type 'not_a_model' \(in .*config\.json\) is unknown to "):
        model_folder(str(folder))
    model_folder(str(_folder(tmp_path / "r", {"model_type": "x", "auto_map": {}})), trust_remote_code=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ModelFolderError, match="a 'vit' model cannot be loaded as a causal language model"):
        model_folder(str(folder))
    (folder / "config.json").write_text("{}")
    with pytest.raises(ModelFolderError, match="config.json names no model_type"):
        model_folder(str(folder))


def test_no_weight_files_or_a_missing_shard(tmp_path):
    folder = _folder(tmp_path / "m", {"model_type": "llama"}, files=("tokenizer.json",))
    _fails(
        folder,
        f"policy.model={str(folder)!r}: {folder} has a config.json but no weight files (*.safetensors or "
        "pytorch_model.bin); it holds config.json, tokenizer.json. Save the model with save_pretrained, or copy "
        "its weights there.",
    )
    index = {"weight_map": {"a": "model-00001.safetensors", "b": "model-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model-00001.safetensors").write_bytes(b"")
    with pytest.raises(ModelFolderError, match=r"1 weight shard\(s\) named in model.safetensors.index.json are "):
        model_folder(str(folder))


def test_an_adapter_folder_a_file_and_a_missing_path(tmp_path):
    adapter = _folder(tmp_path / "a", files=("adapter_config.json", "adapter_model.safetensors"))
    with pytest.raises(ModelFolderError, match=re.escape("holds a peft adapter, not a model. Set policy.model to")):
        model_folder(str(adapter))
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelFolderError, match=re.escape(f"policy.model={str(file)!r} is a file, not a folder.")):
        model_folder(str(file))
    missing = tmp_path / "nope"
    with pytest.raises(ModelFolderError, match=re.escape(f"policy.model={str(missing)!r} is not a folder.")):
        model_folder(str(missing))
    with pytest.raises(FileNotFoundError):  # still what callers that catch FileNotFoundError expect
        model_folder(str(missing))


def test_a_hub_id_must_be_cached_nothing_is_downloaded(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _fails(
        "acme/tiny-model",
        f"policy.model='acme/tiny-model' is neither a local folder nor a model in the Hugging Face cache "
        f"({tmp_path / 'hub'}); lrmgym never downloads at run time. Give the path of a local model folder, or "
        "download it first (huggingface-cli download acme/tiny-model) and run again.",
    )
    snapshot = tmp_path / "hub" / "models--acme--tiny-model" / "snapshots" / "abc123"
    _folder(snapshot, {"model_type": "llama"})
    (tmp_path / "hub" / "models--acme--tiny-model" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny-model" / "refs" / "main").write_text("abc123")
    assert model_folder("acme/tiny-model") == snapshot


def test_a_folder_without_a_tokenizer(tmp_path):
    folder = _folder(tmp_path / "m", {"model_type": "llama"}, files=("model.safetensors",))
    with pytest.raises(ModelFolderError, match=re.escape(f"{folder} has no tokenizer files (tokenizer.json, ")):
        tokenizer_folder(str(folder))


def test_build_checks_before_loading_and_loads_local_files_only(tmp_path, monkeypatch):
    import transformers

    calls = []

    def fake_from_pretrained(path, **kwargs):
        calls.append(kwargs)
        raise OSError("boom")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    with pytest.raises(ModelFolderError, match="is empty"):
        HFPolicyConfig(model=str(_folder(tmp_path / "empty", files=()))).build()
    assert calls == []  # refused before transformers was asked for anything
    folder = _folder(tmp_path / "m", {"model_type": "llama"})
    with pytest.raises(ModelFolderError, match=re.escape(f"Could not load policy.model={str(folder)!r} from")):
        HFPolicyConfig(model=str(folder)).build()
    assert calls[0]["local_files_only"] is True


def test_adapter_and_lora_together_are_refused_at_config_time():
    with pytest.raises(ValidationError, match="set policy.adapter .* or policy.lora .*, not both"):
        HFPolicyConfig(model="m", adapter="a", lora={"r": 4})


def test_cli_eval_with_an_empty_model_folder_is_one_line(tmp_path):
    from lrmgym.cli.main import cli

    folder = _folder(tmp_path / "m", files=())
    out = tmp_path / "runs"
    args = ["eval", "env=echo", "policy=hf", f"policy.model={folder}", f"run.output_dir={out}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"Error: policy.model={str(folder)!r}: the folder {folder} is empty. It needs config.json and weight files "
        "(*.safetensors), e.g. written by save_pretrained."
    )
    assert "Traceback" not in result.output and not out.exists()


def test_corrupt_weights_are_one_error_not_a_safetensors_traceback(tmp_path):
    import shutil
    from pathlib import Path

    import lrmgym.policies

    shipped = Path(lrmgym.policies.__file__).parent / "tiny_default"
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shipped / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(ModelFolderError, match=r"^Could not load policy\.model=.*: Error while deserializing header"):
        HFPolicyConfig(model=str(folder), device="cpu").build()

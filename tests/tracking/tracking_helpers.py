"""Short GRPO runs with trackers, and readers that read each tracker's files back with the tracker's own tools."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import yaml
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "learners"))  # the learner tests' fixtures

from learner_helpers import TEST_ENV_ID, register_test_env, save_tiny_hf  # noqa: E402

from lrmgym.cli.main import cli  # noqa: E402

register_test_env()
__all__ = ["metrics", "mlflow_run", "run_cli", "save_tiny_hf", "tensorboard_scalars", "wandb_runs", "write_config"]
ALL = ["tensorboard", "wandb", "mlflow"]


def write_config(run_dir: Path, model: Path, steps: int, report_to=ALL, **learner) -> dict:
    """Write ``run_dir/config.yaml`` for a short GRPO run on the count-a env (``lrmgym run --resume`` starts it)."""
    from lrmgym.configs.resolve import resolve_dict

    base = dict(
        kind="grpo", steps=steps, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_before_after=True,
        eval_greedy=False, checkpoint_every=1, log_samples=1, progress=False, lr=3e-3, torch_threads=1,
    )  # fmt: skip
    raw = {
        "env": {"id": TEST_ENV_ID},
        "policy": {"kind": "hf", "model": str(model), "device": "cpu"},
        "learner": {**base, **learner},
        "eval": {"tasks": 2, "n": 1, "max_new_tokens": 8, "split": None},
        "run": {"seed": 3, "output_dir": str(run_dir.parent), "name": run_dir.name, "report_to": report_to},
    }
    cfg = resolve_dict(raw).to_dict()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def run_cli(run_dir: Path):
    """``lrmgym run --resume RUN_DIR`` (the first one of a folder with no checkpoint starts the run)."""
    result = CliRunner().invoke(cli, ["run", "--resume", str(run_dir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def metrics(run_dir: Path) -> list[dict]:
    """``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ tensorboard
def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` as TensorBoard's own EventAccumulator reads the folder (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(log_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """``{tag: [(step, text), ...]}`` of the text summaries (tables, config)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        out[tag] = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
    return out


# ------------------------------------------------------------------------------------------------ wandb
# wandb >= 0.19 dropped its Python reader of .wandb files (wandb.sdk.internal.datastore) and `wandb sync --view`;
# the file is still LevelDB-log framing (a ":W&B" header, 32 KiB blocks of crc32/length/type chunks) around the
# protobuf `Record` messages that wandb ships (wandb.proto.wandb_internal_pb2). This reads it with those classes.
_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """The ``Record`` messages of one offline run's ``run-<id>.wandb`` file, checksums verified."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path}: not a .wandb file"
    pos, pending, records = _HEADER, b"", []
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a chunk header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            break  # zero fill: the end of what was written
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"{path}: bad checksum at {pos}"
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_runs(run_dir: Path) -> list[dict]:
    """Each offline session in ``RUN_DIR/wandb/`` in order: its run id, whether resumed, config and history."""
    out = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        session = {"path": path, "id": None, "config": {}, "history": {}}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                session["id"] = record.run.run_id
                session["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                session["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                session["history"][int(row["_step"])] = row
        out.append(session)
    return out


# ------------------------------------------------------------------------------------------------ mlflow
def mlflow_run(run_dir: Path):
    """``(client, run)`` of the run's mlflow run, read from the file store in the run directory."""
    from mlflow.tracking import MlflowClient

    state = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return client, client.get_run(state["run_id"])

"""A full disk, for real: the run directory on a small tmpfs (in a private mount namespace, so no root is needed
where unprivileged user namespaces are allowed; skipped where they are not).

The run stops with one ``Error:`` line that says "no space left on device" and which checkpoint is intact, exit
code 1; that checkpoint loads; after the space is freed, ``--resume`` finishes with every step logged once and
the same metrics as an uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from learner_helpers import TEST_ENV_ID, register_test_env, save_tiny_hf

from lrmgym.compose import train
from lrmgym.configs.resolve import resolve_dict
from lrmgym.learners.engine.rundir import Checkpointer

register_test_env()
HERE = Path(__file__).resolve().parent
VOLATILE = ("time/", "tokens_per_s", "perf/")  # perf/*: FLOPs per second of wall time
STEPS = 16

_CLI = (
    "import sys; sys.path.insert(0, {here!r}); import learner_helpers; learner_helpers.register_test_env(); "
    "from lrmgym.cli.main import main; sys.argv = ['lrmgym', *sys.argv[1:]]; main()"
)


def _can_mount_tmpfs(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = tmp_path / "probe"
    probe.mkdir()
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {probe}"]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _config(run_dir: Path, model: Path) -> dict:
    raw = {
        "env": {"id": TEST_ENV_ID},
        "policy": {"kind": "hf", "model": str(model), "device": "cpu"},
        "learner": dict(
            kind="grpo",
            steps=STEPS,
            prompts_per_step=4,
            group_size=4,
            max_new_tokens=8,
            eval_before_after=False,
            checkpoint_every=2,
            keep_checkpoints=2,
            progress=False,
            lr=3e-3,
            torch_threads=1,
        ),  # fmt: skip
        "eval": {"tasks": 4, "n": 1, "max_new_tokens": 8, "split": None},
        "run": {"seed": 3, "output_dir": str(run_dir.parent), "name": run_dir.name},
    }
    return resolve_dict(raw).to_dict()


def _stable(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in lines]


@pytest.mark.parametrize("fill", ["checkpoint", "filler"])
def test_disk_full_keeps_the_last_checkpoint_and_resumes_cleanly(tmp_path, fill):
    """``checkpoint``: the tmpfs holds two checkpoints and not a third, so a checkpoint write fails. ``filler``:
    once the first checkpoint is written, the run is paused while a file fills the disk, so the next log append
    (or checkpoint) fails."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare or unprivileged namespaces missing)")
    model = save_tiny_hf(tmp_path / "model", seed=1)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    reference = tmp_path / "reference"
    train(resolve_dict(_config(reference, model)), reference)

    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "config.yaml").write_text(yaml.safe_dump(_config(mnt / "run", model), sort_keys=False))
    cli = " ".join([sys.executable, "-c", repr(_CLI.format(here=str(HERE))), "run", "--resume", str(mnt / "run")])
    size = "520k" if fill == "checkpoint" else "4m"
    filler = (
        f"while [ ! -e {mnt}/run/checkpoints/step_000002.pt ]; do sleep 0.01; done; kill -STOP $pid; "
        f"dd if=/dev/zero of={mnt}/filler bs=4k 2>/dev/null; kill -CONT $pid; "  # paused: the run cannot finish first
        if fill == "filler"
        else ""
    )
    script = (
        f"set -u; mount -t tmpfs -o size={size} tmpfs {mnt} && mkdir {mnt}/run && cp {staged}/config.yaml {mnt}/run/; "
        f"{cli} > {out}/first.out 2> {out}/first.err & pid=$!; {filler} wait $pid; echo $? > {out}/first.rc; "
        f"cp -r {mnt}/run {out}/full; rm -f {mnt}/filler; mount -o remount,size=64m {mnt}; "
        f"{cli} > {out}/second.out 2> {out}/second.err; echo $? > {out}/second.rc; cp -r {mnt}/run {out}/final"
    )
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    first_err = (out / "first.err").read_text()
    assert (out / "first.rc").read_text().strip() == "1", first_err[-2000:]
    assert "Traceback" not in first_err
    last = first_err.strip().splitlines()[-1]
    assert last.startswith("Error: no space left on device writing "), last
    kept = Checkpointer(out / "full" / "checkpoints").steps()
    assert kept and f"its newest checkpoint (step {kept[-1]}) is intact" in last and "--resume" in last
    assert Checkpointer(out / "full" / "checkpoints").load_latest()["step"] == kept[-1]  # it loads
    assert not list((out / "full" / "checkpoints").glob(".*.tmp"))  # the failed write left nothing behind
    if fill == "checkpoint":
        assert "step_000006.pt" in last and kept == [2, 4]

    second_err = (out / "second.err").read_text()
    assert (out / "second.rc").read_text().strip() == "0", second_err[-2000:]
    final = _stable(out / "final" / "metrics.jsonl")
    assert [m["step"] for m in final] == list(range(1, STEPS + 1))
    assert final == _stable(reference / "metrics.jsonl")

"""The real OpenRLHF 0.11.2 wheel for CPU tests: fetched once, unpacked, and its own CLI parser run on an argv.

``openrlhf_source()`` downloads ``openrlhf==0.11.2`` (``pip download --no-deps --only-binary=:all:``) into
``~/.cache/lrmgym-test/`` once and returns the unpacked folder that holds the ``openrlhf`` package (nothing is
installed). The test is skipped, with the reason, when pip cannot fetch it (offline). ``openrlhf_dir`` is the same
as a session fixture; import it into a test module (``from openrlhf_wheel import openrlhf_dir``).

``parse_train_ppo_ray(source, argv)`` runs OpenRLHF's own ``openrlhf/cli/train_ppo_ray.py`` on ``argv`` and
returns the parsed arguments, flattened to dotted keys. Its parser is built inside the file's
``if __name__ == "__main__":`` block, not in a function, so the file is run as ``__main__`` in a fresh interpreter
with the modules it imports at the top stubbed (ray, ``openrlhf.trainer.ray.*`` and ``openrlhf.utils``, the same set
OpenRLHF's own ``tests/test_ray_env_vars.py`` stubs; the real ``openrlhf.utils.config.hierarchize`` is kept). The
arguments are captured where ``train()`` hands them to ``get_strategy``: after argparse *and* after the file's own
validation (its asserts and normalisations, e.g. ``critic.model_name_or_path`` and ``reward.remote_url``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

VERSION = "0.11.2"
CACHE = Path(os.environ.get("LRMGYM_TEST_CACHE", Path.home() / ".cache" / "lrmgym-test"))

# Run in a fresh interpreter: argv[1] the folder holding the openrlhf package, argv[2] a JSON file with the argv,
# argv[3] the JSON file to write the parsed arguments to.
_HARNESS = r"""
import json, runpy, sys, types
from pathlib import Path

source, argv_file, out_file = sys.argv[1:4]
sys.path.insert(0, source)


class Parsed(Exception):
    pass


def capture(args):
    raise Parsed(args)


def stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


stub("ray", is_initialized=lambda: True)  # train() then skips ray.init and asks get_strategy first
stub("ray.util")
stub("ray.util.placement_group", placement_group=None)
stub("openrlhf.trainer.ray", create_vllm_engines=None)
stub("openrlhf.trainer.ray.launcher", RayActorGroup=None, ReferenceModelActor=None, RewardModelActor=None)
stub("openrlhf.trainer.ray.ppo_actor", PolicyModelActor=None)
stub("openrlhf.trainer.ray.ppo_critic", CriticModelActor=None)
utils = stub("openrlhf.utils", get_strategy=capture)
utils.__path__ = [str(Path(source) / "openrlhf" / "utils")]  # so the real openrlhf.utils.config imports


def flat(node, prefix=""):
    if isinstance(node, types.SimpleNamespace):
        out = {}
        for key, value in vars(node).items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(node) if isinstance(node, tuple) else node}


sys.argv = ["train_ppo_ray.py", *json.loads(Path(argv_file).read_text())]
try:
    runpy.run_path(str(Path(source) / "openrlhf" / "cli" / "train_ppo_ray.py"), run_name="__main__")
except Parsed as parsed:
    Path(out_file).write_text(json.dumps(flat(parsed.args[0]), default=str))
    sys.exit(0)
sys.exit("train_ppo_ray.py returned without calling get_strategy")
"""


class ParseError(AssertionError):
    """OpenRLHF's parser (or its validation) refused the argv; the message holds what it printed."""


def openrlhf_source() -> Path:
    """The unpacked openrlhf 0.11.2 wheel (the folder holding ``openrlhf/``), fetched once; skips if it cannot be."""
    target = CACHE / f"openrlhf-{VERSION}"
    if (target / "openrlhf" / "cli" / "train_ppo_ray.py").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", f"openrlhf=={VERSION}", "-d", tmp]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"cannot fetch openrlhf=={VERSION} with pip: {err}")
        wheels = sorted(Path(tmp).glob("openrlhf-*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"cannot fetch openrlhf=={VERSION} with pip: {reason}")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as whl:
            whl.extractall(unpacked)
        # The wheel keeps its packages under openrlhf-VERSION.data/purelib/.
        found = next(unpacked.rglob("openrlhf/cli/train_ppo_ray.py"), None)
        if found is None:
            pytest.skip(f"the openrlhf=={VERSION} wheel has no openrlhf/cli/train_ppo_ray.py")
        package_parent = found.parents[2]
        try:
            os.rename(package_parent, target)
        except OSError:  # another test process unpacked it first
            if not (target / "openrlhf" / "cli" / "train_ppo_ray.py").is_file():
                raise
    return target


@pytest.fixture(scope="session")
def openrlhf_dir() -> Path:
    """:func:`openrlhf_source` as a session fixture."""
    return openrlhf_source()


def parse_train_ppo_ray(source: Path, argv: list[str]) -> dict[str, object]:
    """``argv`` parsed and validated by OpenRLHF's own train_ppo_ray.py: ``{"algo.advantage.estimator": ...}``.

    Raises:
        ParseError: argparse or the file's validation refused it (the message is what OpenRLHF printed).
    """
    with tempfile.TemporaryDirectory() as tmp:
        argv_file, out_file = Path(tmp) / "argv.json", Path(tmp) / "args.json"
        argv_file.write_text(json.dumps(argv))
        done = subprocess.run(
            [sys.executable, "-c", _HARNESS, str(source), str(argv_file), str(out_file)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""},
        )  # fmt: skip
        if done.returncode != 0 or not out_file.is_file():
            raise ParseError(f"train_ppo_ray.py refused the argv (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out_file.read_text())

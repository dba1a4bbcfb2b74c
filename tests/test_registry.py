import os
import subprocess
import sys
import textwrap

import gymnasium
import pytest

import lrmgym


def test_gymnasium_make_works_and_returns_the_text_env():
    env = gymnasium.make("lrmgym/Echo-v0", words=2)
    assert isinstance(env, lrmgym.TextEnv)
    prompt, _ = env.reset(seed=0)
    assert prompt.startswith("Repeat exactly: ")


def test_make_accepts_short_and_full_ids():
    assert type(lrmgym.make("Echo-v0")) is type(lrmgym.make("lrmgym/Echo-v0"))
    assert "lrmgym/Echo-v0" in lrmgym.list_envs()


def test_unknown_id_has_did_you_mean():
    with pytest.raises(lrmgym.UnknownEnvError) as err:
        lrmgym.make("Ecoh-v0")
    assert str(err.value).startswith("Unknown environment id 'Ecoh-v0'. Did you mean 'lrmgym/Echo-v0'? Registered: ")


def test_register_rejects_bad_ids():
    with pytest.raises(ValueError, match=r"^Invalid env id 'bad id!': expected '\[namespace/\]Name-vN'"):
        lrmgym.register("bad id!", "x:y")


def test_register_a_local_env():
    lrmgym.register("LocalEcho-v3", "lrmgym.envs.echo:EchoEnv", words=1)
    env = lrmgym.make("LocalEcho-v3")
    assert len(env.reset(seed=0)[0].split()) == 3  # "Repeat exactly: <1 word>"


PLUGIN = '''
from lrmgym.core import Task, TextEnv, Verdict


class PlugEnv(TextEnv):
    """A plug-in env from a third-party package."""

    def make_task(self, index, rng):
        n = int(rng.integers(0, 100))
        return Task(id=f"plug/{index}", prompt=f"say {n}", answer=str(n))

    def verify(self, task, completion):
        ok = completion.text.strip() == task.answer
        return Verdict(score=float(ok), correct=ok)
'''


def test_third_party_plugin_through_entry_points(tmp_path):
    """A throwaway package with its own metadata and entry point, visible to a fresh interpreter."""
    (tmp_path / "plugpkg").mkdir()
    (tmp_path / "plugpkg" / "__init__.py").write_text(PLUGIN)
    dist = tmp_path / "plugpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[lrmgym.envs]\nPlug-v0 = plugpkg:PlugEnv\nacme/Other-v1 = plugpkg:PlugEnv\n"
    )
    script = textwrap.dedent(
        """
        import sys, gymnasium, lrmgym
        from lrmgym.testing import check_env
        assert "plugpkg" not in sys.modules
        assert "lrmgym/Plug-v0" in lrmgym.list_envs(), lrmgym.list_envs()
        assert "plugpkg" not in sys.modules  # registration is lazy: nothing imported yet
        env = lrmgym.make("Plug-v0")
        check_env(env, reference=lambda t: t.answer)
        env2 = gymnasium.make("lrmgym/Plug-v0")
        prompt, info = env2.reset(seed=1)
        print(type(env2).__name__, prompt, env2.step(info["task"].answer)[1])
        print("acme/Other-v1" in lrmgym.list_envs(namespace=None))
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].startswith("PlugEnv say ") and lines[0].endswith(" 1.0")
    assert lines[1] == "True"


def test_core_imports_stay_light():
    """core and the registry import no torch, transformers, sympy or pydantic-heavy modules."""
    code = (
        "import sys, lrmgym.core, lrmgym.registry; "
        "print(sorted(m for m in ('torch','transformers','sympy','math_verify','peft','matplotlib') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr

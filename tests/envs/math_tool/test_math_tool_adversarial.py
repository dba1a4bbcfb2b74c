"""Hostile tool code against env=math_tool, on both sandbox backends: it cannot reach the gold, nor hurt the host.

Each attack runs as a real tool call through the env (grading starts it, feedback returns it). The gold is a
number nothing on the machine holds by chance; the trainer process holds it in a task, an environment variable
and files in its working folder and in /tmp, and the tool's output must never contain it.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from tool_helpers import GOLD, call, gold_task, r1

import lrmgym
from lrmgym.envs.code.sandbox import SandboxError

TIMEOUT_S = 2.0
BACKENDS = ["bwrap", "unshare"]


@pytest.fixture(scope="module", params=BACKENDS)
def env(request, tmp_path_factory):
    backend = request.param
    if shutil.which(backend) is None or (backend == "bwrap" and os.environ.get("LRMGYM_TEST_NO_BWRAP")):
        pytest.skip(f"{backend} is not available here")
    secrets = tmp_path_factory.mktemp("secrets")
    (secrets / "gold.txt").write_text(f"gold={GOLD}\n")
    here = Path.cwd() / f".lrmgym-test-gold-{os.getpid()}.txt"
    here.write_text(f"gold={GOLD}\n")
    os.environ["LRMGYM_TEST_GOLD"] = GOLD
    made = lrmgym.make(
        "lrmgym/MathTool-v0", style="compact", max_tool_calls=2, tool_timeout_s=TIMEOUT_S, sandbox=backend,
        max_output_chars=4000,
    )  # fmt: skip
    try:
        made.unwrapped.tools["python"].pool  # noqa: B018 - start it now, so a failure to start skips
    except SandboxError as err:
        pytest.skip(f"the {backend} sandbox cannot start here: {err}")
    made.secret_paths = [str(secrets / "gold.txt"), str(here)]
    yield made
    made.close()
    here.unlink()
    os.environ.pop("LRMGYM_TEST_GOLD", None)


def tool_says(env, code: str) -> tuple[str, float]:
    """The env turn a call of ``code`` gets, and how long grading plus the call took."""
    task = gold_task(env)
    env.reset(options={"task": task})
    start = time.monotonic()
    obs, reward, terminated, _, info = env.step("<think>" + call(code))
    assert (reward, terminated) == (0.0, False)
    return obs, time.monotonic() - start


READ_GOLD = {
    "environment": "import os\nprint(dict(os.environ))",
    "proc": (
        "import os\n"
        "for pid in os.listdir('/proc'):\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            print(pid, name, open(f'/proc/{pid}/{name}', 'rb').read()[:4000])\n"
        "        except Exception as err:\n"
        "            print(pid, name, type(err).__name__)\n"
        "for path in ('/proc/self/root', '/proc/1/root', '/proc/1/cwd'):\n"
        "    try:\n"
        "        print(path, os.listdir(path))\n"
        "    except Exception as err:\n"
        "        print(path, type(err).__name__)\n"
    ),
    "frames": (
        "import sys, gc\n"
        "f = sys._getframe()\n"
        "while f is not None:\n"
        "    print(f.f_code.co_filename, sorted(f.f_globals)[:50], {k: repr(v)[:200] for k, v in f.f_locals.items()})\n"
        "    f = f.f_back\n"
        "found = [o for o in gc.get_objects() if isinstance(o, (dict, list, tuple)) and '9182' in repr(o)[:100000]]\n"
        "print('gc', [repr(o)[:300] for o in found][:20])\n"
        "print(sys.argv, sys.path, sys.orig_argv)\n"
    ),
    "stdin": "import sys, os\nprint(repr(sys.stdin.read()) if not sys.stdin.closed else 'closed')\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        print(fd, os.read(fd, 4096))\n"
    "    except OSError as err:\n"
    "        print(fd, err.errno)\n",
}


@pytest.mark.parametrize("attack", sorted(READ_GOLD))
def test_the_tool_cannot_read_the_gold(env, attack):
    obs, _ = tool_says(env, READ_GOLD[attack])
    assert GOLD not in obs
    assert "LRMGYM_TEST_GOLD" not in obs


def test_the_tool_cannot_read_files_that_hold_the_gold(env):
    paths = [*env.secret_paths, os.environ.get("LRMGYM_SHARED_DATA", "/work/shared/data") + "/gsm8k"]
    code = (
        "import os\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        print(path, open(path).read()[:200] if os.path.isfile(path) else os.listdir(path))\n"
        "    except Exception as err:\n"
        "        print(path, type(err).__name__)\n"
        "for top in ('/tmp', os.getcwd(), os.path.expanduser('~'), '/work', '/root', '/home'):\n"
        "    for root, dirs, files in os.walk(top):\n"
        "        for name in files:\n"
        "            try:\n"
        "                if '918273645' in open(os.path.join(root, name), errors='replace').read(100000):\n"
        "                    print('FOUND', root, name)\n"
        "            except Exception:\n"
        "                pass\n"
    )
    obs, _ = tool_says(env, code)
    assert GOLD not in obs and "FOUND" not in obs
    assert obs.count("Error") >= len(paths)  # each path was tried and failed (not found / not permitted)


def test_infinite_loop_fork_bomb_and_memory_are_bounded(env):
    for code, expected in (
        ("while True:\n    pass", f"ran past the {TIMEOUT_S:g} s limit"),
        ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", None),
        ("x = bytearray(64 * 1024 ** 3)", "MemoryError"),
        ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)", "Error"),
    ):
        obs, took = tool_says(env, code)
        assert took < TIMEOUT_S + 3.0, (code, took)
        if expected:
            assert expected in obs, obs
    obs, _ = tool_says(env, "print(6 * 7)")  # the tool still works afterwards
    assert "\n42\n" in obs


def test_huge_output_is_stopped_and_cut(env):
    obs, took = tool_says(env, "while True:\n    print('x' * 1000)")
    assert took < TIMEOUT_S + 3.0
    assert len(obs) < 4000 + 200 and "characters cut" in obs and "the output passed 65536 bytes" in obs


def test_nothing_persists_between_calls(env):
    first, _ = tool_says(env, "open('/tmp/state.txt', 'w').write('kept'); import os; print(os.listdir('/tmp'))")
    assert "state.txt" in first
    second, _ = tool_says(env, "import os; print(os.listdir('/tmp'), os.path.exists('/tmp/state.txt'))")
    assert "False" in second and "state.txt" not in second


def test_a_whole_episode_with_a_hostile_call_still_grades_the_answer(env):
    task = gold_task(env)
    env.reset(options={"task": task})
    env.step(call("import os\nos.kill(1, 9)\nos.kill(os.getppid(), 9)"))
    _, reward, terminated, _, _ = env.step(r1(GOLD))
    assert (reward, terminated) == (1.0, True)


def test_the_unshare_fallback_hides_the_data_set_of_the_tasks(tmp_path):
    """The fallback shows host folders it does not cover; the env covers the folder of its data set (the golds)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs util-linux unshare and root (a data folder outside the fallback's own covered list)")
    folder = Path(f"/lrmgym-tooltest-{os.getpid()}")
    folder.mkdir()
    try:
        data = folder / "golds.jsonl"
        data.write_text('{"question": "Compute 3 * 306091215.", "answer": "918273645"}\n')
        data.chmod(0o644)
        folder.chmod(0o755)
        made = lrmgym.make(
            "lrmgym/MathTool-v0", source=str(data), split="test", test_fraction=1.0, sandbox="unshare",
            tool_timeout_s=TIMEOUT_S,
        )  # fmt: skip
        try:
            made.reset(seed=0)
            obs, *_ = made.step(call(f"print(open({str(data)!r}).read())"))
            assert GOLD not in obs and "FileNotFoundError" in obs
        finally:
            made.close()
    finally:
        shutil.rmtree(folder)

"""``lrmgym serve``: the real server in a subprocess, spoken to over HTTP as OpenRLHF's remote reward client does."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time

import httpx
import pytest
from integration_helpers import ServeProcess, reference_rewards

from lrmgym.configs.resolve import resolve
from lrmgym.integrations.labels import World, decode_label, encode_label, short_label, write_data
from lrmgym.testing.procs import alive, descendants

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

MATH = ["env=math", "judge=[accuracy,format_strict]"]


@pytest.fixture(scope="module")
def math_server():
    with ServeProcess(MATH, "--workers", "4", "--max-body-mb", "1", "--max-items", "64", "--deadline-s", "30") as s:
        yield s


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    cfg = resolve(MATH)
    folder = tmp_path_factory.mktemp("data")
    info = write_data(cfg, folder, 4, 2)
    rows = [json.loads(line) for name in ("train", "eval") for line in info[name].read_text().splitlines()]
    return cfg, rows


def _task(label):
    label = decode_label(label)
    return World(label.env).task(label.index, label.seed)


def test_health(math_server):
    health = httpx.get(math_server.url + "/health").json()
    assert health["status"] == "ok" and health["env"] == "lrmgym/Math-v0"
    assert health["judges"] == ["accuracy", "format_strict"] and health["multi_turn"] is False


def test_rewards_equal_lrmgym_judge(math_server, math_data, tmp_path):
    cfg, rows = math_data
    groups, query, prompts, labels = [], [], [], []
    for row in rows:  # train rows and eval rows (the held-out split) alike
        task = _task(row["label"])
        texts = [task.metadata.get("solution") or f"<think>a</think><answer>{task.answer}</answer>",
                 "<think>2+2=5</think><answer>5</answer>", "plain text", "\udcff\x00" * 1000]  # fmt: skip
        groups.append((task, texts))
        for text in texts:
            query.append(row["prompt"] + text + "<eos>")
            prompts.append(row["prompt"])
            labels.append(row["label"])
    response = math_server.post({"query": query, "prompts": prompts, "labels": labels})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = [r for g in reference_rewards(cfg, groups, tmp_path) for r in g]
    assert body["rewards"] == expected
    assert body["scores"][0] == 1.0 and body["rewards"][0] == 2.0
    assert set(body["extra_logs"]) >= {"judge/accuracy", "judge/format_strict", "verdict/ungradeable"}
    assert all(len(v) == len(query) for v in body["extra_logs"].values())
    # the same request through "/" and with short labels (the server knows its env)
    task = _task(rows[0]["label"])
    short = {"query": [task.metadata["solution"]], "labels": [short_label(0, 0)]}
    assert math_server.post(short, path="/").json()["rewards"] == [2.0]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{nope", 400, "body: not valid JSON"),
        (b"[1]", 400, "body: expected a JSON object with query, prompts, labels, got list."),
        ({"queries": []}, 400, "queries: unknown field; a request has query, prompts (optional) and labels."),
        ({"labels": []}, 400, "query: expected a list of strings (prompt + completion each), got null."),
        ({"query": ["a", 3], "labels": ["", ""]}, 400, "query[1]: expected a string, got int."),
        ({"query": ["a"], "prompts": ["a", "b"], "labels": [""]}, 400, "prompts: expected a list of 1 strings"),
        ({"query": ["a"], "prompts": [7], "labels": [""]}, 400, "prompts[0]: expected a string, got int."),
        ({"query": ["a"]}, 400, "labels: missing. Every query needs the label of its task"),
        ({"query": ["a"], "labels": ["a", "b"]}, 400, "labels: expected a list of 1 labels (one per query), got a "),
        ({"query": ["a"], "labels": [""]}, 400, "labels[0]: the label is empty."),
        ({"query": ["a", "b"], "labels": [short_label(0, 0), '{"v": 1, "index": -3, "seed": 0}']}, 400,
         "labels[1].index: expected a non-negative integer, got -3."),
        ({"query": ["a"], "labels": [encode_label({"id": "lrmgym/Math-v0", "difficulty": 4}, 0, 0)]}, 400,
         "labels[0]: the label describes another env than this one (env option(s) difficulty differ; "),
        ({"query": ["a"], "labels": ['{"v":1,"env":{"id":"Math-v0","source":"/etc/passwd"},"index":0,"seed":0}']}, 400,
         "labels[0].env: source: a label names its task, never a setting (sandbox, time and memory bounds, "),
        ({"query": ["a"], "labels": ['{"v":1,"env":{"id":"Math-v0","timeout_s":60},"judge":{},"index":0,"seed":0}']},
         400, "labels[0].judge: a label names its task, never its judges (LLM endpoints, models, timeouts, workers)"),
        ({"query": ["a"] * 65, "labels": [short_label(0, 0)] * 65}, 413, "query: 65 items, over the limit of 64"),
        (b"x" * (2 << 20), 413, "body: 2097152 bytes, over the limit of 1048576 (--max-body-mb)."),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(math_server, body, status, message):
    response = math_server.post(body)
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message)


def test_a_chunked_body_over_the_limit_is_cut_at_the_limit(math_server):
    def chunks():  # no Content-Length: the server counts as it reads
        for _ in range(40):
            yield b"x" * (64 << 10)

    response = httpx.post(math_server.url + "/get_reward", content=chunks(), timeout=30)
    assert response.status_code == 413
    assert response.json()["error"] == "body: over the limit of 1048576 bytes (--max-body-mb)."
    assert httpx.get(math_server.url + "/get_reward").status_code == 405
    assert httpx.get(math_server.url + "/health").status_code == 200  # still serving


def test_deadline_saturation_and_a_clean_stop():
    code = "```python\nwhile True:\n    pass\n```"  # runs into the sandbox's 3 s bound
    with ServeProcess(["env=code", "env.timeout_s=3"], "--deadline-s", "1", "--max-concurrency", "1") as server:
        slow: dict[str, httpx.Response] = {}
        worker = threading.Thread(
            target=lambda: slow.setdefault("r", server.post({"query": [code], "labels": [short_label(0, 0)]}))
        )
        start = time.monotonic()
        worker.start()
        wait_until = time.monotonic() + 60  # the first request in flight (a loaded machine may take a while)
        while httpx.get(server.url + "/health", timeout=30).json()["in_flight"] < 1 and time.monotonic() < wait_until:
            time.sleep(0.05)
        busy = server.post({"query": [code], "labels": [short_label(1, 0)]})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"].startswith("server saturated: 1 requests in flight (--max-concurrency)")
        worker.join()
        assert slow["r"].status_code == 504 and time.monotonic() - start > 0.9  # no upper bound: load is not a bug
        assert slow["r"].json() == {"error": "deadline: the request was not scored within 1 s (--deadline-s)."}
        children = descendants(server.proc.pid)  # the sandbox still running the loop, the pool's spare ones
        assert children, "the code server should have sandbox processes running"
        assert server.stop(signal.SIGTERM) == 0
        assert "stopped by SIGTERM; sandboxes and workers closed." in server.output
    deadline = time.monotonic() + 5
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(children), f"left behind: {sorted(alive(children))}"


def test_the_group_window_scores_one_prompts_requests_together(tmp_path):
    cfg = resolve(["env=math", "judge=arena"])
    world = World(cfg.env, cfg.judge)
    task = world.task(0, 0)
    near = f"<think>w</think><answer>{int(task.answer) + 1}</answer>"
    far = f"<think>w</think><answer>{int(task.answer) + 50}</answer>"
    label = world.label(0, 0)
    with ServeProcess(["env=math", "judge=arena"], "--group-size", "2", "--group-wait-s", "5") as server:
        got: dict[str, float] = {}

        def ask(text: str) -> None:  # one sample per request, as OpenRLHF 0.11.2 sends them
            got[text] = server.post({"query": [text], "labels": [label]}).json()["rewards"][0]

        threads = [threading.Thread(target=ask, args=(t,)) for t in (near, far)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[near], got[far]] == reference_rewards(cfg, [(task, [near, far])], tmp_path)[0] == [1.0, 0.0]
        start = time.monotonic()
        alone = server.post({"query": [near], "labels": [label]}).json()["rewards"]
        assert alone == [0.0] and time.monotonic() - start > 4.9  # no sibling came: graded alone after the wait
    world.close()


def test_openrlhfs_own_http_client_gets_group_rewards(openrlhf_agent, tmp_path):
    """OpenRLHF's SingleTurnAgentExecutor posting to the server (aiohttp, one sample per request) for 2 samples."""
    import asyncio
    import types

    from lrmgym.policies.tiny import build_tokenizer

    tok = build_tokenizer()
    cfg = resolve(["env=math", "judge=arena"])
    row = json.loads(write_data(cfg, tmp_path, 1, 0)["train"].read_text().splitlines()[0])
    task = _task(row["label"])
    near = f"<think>w</think><answer>{int(task.answer) + 1}</answer>"
    far = f"<think>w</think><answer>{int(task.answer) + 50}</answer>"

    class Engine:
        def __init__(self, text: str, delay: float) -> None:
            self.text, self.delay = text, delay

        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            await asyncio.sleep(self.delay)  # the group's samples finish generating at different times
            ids = tok(text=self.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            out = types.SimpleNamespace(token_ids=ids, text=tok.decode(ids), finish_reason="stop", logprobs=None)
            return types.SimpleNamespace(outputs=[out])

    with ServeProcess(["env=math", "judge=arena"], "--group-size", "2", "--group-wait-s", "10") as server:
        executor = openrlhf_agent.SingleTurnAgentExecutor(remote_rm_url=server.url + "/get_reward")
        params = types.SimpleNamespace(max_tokens=64, logprobs=None)

        async def both():
            return await asyncio.gather(*(
                executor.execute(row["prompt"], row["label"], params, 512, tok, Engine(text, delay))
                for text, delay in ((far, 0.0), (near, 0.5))
            ))  # fmt: skip

        outs = asyncio.run(both())
    assert [o["reward"] for o in outs] == [[0.0], [1.0]]  # the HTTP path hands back the server's lists
    assert outs[1]["scores"] == [0.0] and outs[1]["extra_logs"]["judge/arena"] == [1.0]


# ------------------------------------------------------------------------------------------ slow, gone and missing
def _raw_request(url: str, body_len: int) -> socket.socket:
    """A socket that has sent a POST's headers (Content-Length ``body_len``) and no body yet."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: {body_len}\r\n\r\n"
    sock.sendall(head.encode())
    return sock


def test_slow_clients_do_not_starve_a_fast_one():
    """Clients that send their bodies (or headers) a byte at a time are cut at --read-timeout-s, not held forever."""
    options = ("--max-concurrency", "4", "--read-timeout-s", "1", "--deadline-s", "30")
    with ServeProcess(MATH, *options) as server:
        cut: list[float] = []

        def drip(sock: socket.socket, start: float) -> None:  # a byte every 0.1 s, for at most 20 s
            try:
                while time.monotonic() - start < 20:
                    sock.sendall(b" ")
                    time.sleep(0.1)
            except OSError:
                cut.append(time.monotonic() - start)
            finally:
                sock.close()

        def slow_head(start: float) -> None:  # headers that never end
            host, port = server.url.removeprefix("http://").rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=30)
            try:
                sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\n")
                while time.monotonic() - start < 20:
                    sock.sendall(b"X-Slow: 1\r\n")
                    time.sleep(0.1)
            except OSError:
                cut.append(time.monotonic() - start)
            finally:
                sock.close()

        start = time.monotonic()
        threads = [threading.Thread(target=drip, args=(_raw_request(server.url, 10_000), start)) for _ in range(4)]
        threads += [threading.Thread(target=slow_head, args=(start,)) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until = time.monotonic() + 30
        while httpx.get(server.url + "/health", timeout=30).json()["in_flight"] < 4 and time.monotonic() < wait_until:
            time.sleep(0.02)
        body = {"query": ["<think>x</think><answer>1</answer>"], "labels": [short_label(0, 0)]}
        answer = None
        for _ in range(10):  # OpenRLHF's client retries 5 times, 1 s apart; the slow ones hold a slot 1 s at most
            answer = server.post(body)
            if answer.status_code != 503:
                break
            time.sleep(0.5)
        for t in threads:  # each ends when the server cuts it, or after 20 s
            t.join()
        assert answer is not None and answer.status_code == 200, answer.text
        assert len(cut) == 8 and max(cut) < 15, cut  # every slow client was cut (load may slow it: no tight bound)
        counts = httpx.get(server.url + "/health").json()["counts"]
        assert counts["read_timeouts"] >= 4 and counts["errors"] == 0


def test_a_client_that_hangs_up_mid_body_is_one_line_not_an_error():
    with ServeProcess(MATH) as server:
        sock = _raw_request(server.url, 10_000)
        sock.sendall(b'{"query": [')
        sock.close()
        wait_until = time.monotonic() + 30
        while httpx.get(server.url + "/health").json()["counts"]["disconnected"] < 1 and time.monotonic() < wait_until:
            time.sleep(0.05)
        counts = httpx.get(server.url + "/health").json()["counts"]
        assert (counts["disconnected"], counts["errors"]) == (1, 0)
        server.stop()
    assert "Traceback" not in server.output
    lines = [line for line in server.output.splitlines() if "disconnected" in line]
    assert len(lines) == 1 and "disconnected while sending the request; nothing graded" in lines[0], server.output


def test_a_504_cancels_the_requests_grading():
    """After the deadline the request's queued items never start: the pool is free within one item's bound."""
    loop = "```python\nwhile True:\n    pass\n```"  # each item runs into the sandbox's 1 s bound
    tokens = ["env=code", "env.timeout_s=1", "env.workers=1"]
    with ServeProcess(tokens, "--deadline-s", "1", "--workers", "2") as server:
        start = time.monotonic()
        response = server.post({"query": [loop] * 20, "labels": [short_label(0, 0)] * 20})
        assert response.status_code == 504
        wait_until = time.monotonic() + 60
        while httpx.get(server.url + "/health").json()["grading"] > 0 and time.monotonic() < wait_until:
            time.sleep(0.05)
        freed = time.monotonic() - start
        # uncancelled, 20 items of 1.5 s each on one sandbox worker keep it busy ~30 s; cancelled, two items at most
        assert freed < 12, f"the pool was busy {freed:.1f} s after the request started"
        assert httpx.get(server.url + "/health").json()["counts"]["timeouts"] == 1


def test_serve_without_its_extra_is_one_line(monkeypatch):
    from click.testing import CliRunner

    from lrmgym.cli.main import cli

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if `pip install -e .` without [serve]
    result = CliRunner().invoke(cli, ["serve", "env=math"])
    assert result.exit_code != 0 and not isinstance(result.exception, ImportError)
    assert result.output.strip().splitlines()[-1] == (
        'Error: `lrmgym serve` needs starlette and uvicorn: pip install -e ".[serve]" (or pip install "lrmgym[serve]").'
    )


def test_a_full_group_is_graded_at_once_without_waiting_for_the_window():
    # Kills: a full group held until its window ends (`>` for `>=` at the group-size check). In process, no HTTP:
    # the window is far longer than the test's bound, so only a group that is flushed when full comes back.
    import asyncio

    from lrmgym.integrations.labels import Scorer
    from lrmgym.integrations.serve import RewardServer, ServeConfig

    cfg = resolve(["env=math", "judge=arena"])
    server = RewardServer(Scorer(cfg.env, cfg.judge), ServeConfig(group_size=2, group_wait_s=3000, deadline_s=3600))
    world = World(cfg.env, cfg.judge)
    task, label = world.task(0, 0), world.label(0, 0)
    near = f"<think>w</think><answer>{int(task.answer) + 1}</answer>"
    far = f"<think>w</think><answer>{int(task.answer) + 50}</answer>"

    async def both():
        return await asyncio.gather(server.score([near], [None], [label]), server.score([far], [None], [label]))

    try:
        got = asyncio.run(asyncio.wait_for(both(), timeout=120))
    finally:
        server.close()
        world.close()
    assert [got[0]["rewards"], got[1]["rewards"]] == [[1.0], [0.0]]  # graded together: the arena ranked them
    assert not server._buckets

"""The openai policy against a real HTTP server on 127.0.0.1 that the test starts."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lrmgym.policies.base import Policy, SamplingParams
from lrmgym.policies.openai import OpenAIPolicy, OpenAIPolicyConfig, PolicyRequestError


class _Server:
    """A scriptable OpenAI-compatible server: ``behaviour`` picks the reply; requests are recorded."""

    def __init__(self) -> None:
        self.behaviour = "ok"
        self.requests: list[tuple[str, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, body))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    outer.reply(self, body)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        mode = self.behaviour
        if mode == "fail_once" and len(self.requests) == 1:
            mode = "500"
        if mode == "500":
            return self._send(handler, 500, b'{"error": "boom"}')
        if mode == "400":
            return self._send(handler, 400, b'{"error": "bad model name"}')
        if mode == "malformed":
            return self._send(handler, 200, b'{"choices": [ {"text": "unterminated')
        if mode == "wrong_shape":
            return self._send(handler, 200, b'{"result": 42}')
        if mode == "slow":
            time.sleep(1.5)
        if mode == "trickle":
            handler.send_response(200)
            handler.send_header("Content-Length", "100000")
            handler.end_headers()
            for _ in range(40):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.05)
            return None
        if mode == "concurrent":
            time.sleep(0.4)
        return self._send(handler, 200, json.dumps(self._completion(handler.path, body)).encode())

    @staticmethod
    def _completion(path: str, body: dict) -> dict:
        chat = path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        choices = []
        for i in reversed(range(body["n"])):  # out of order on purpose: the client must sort by index
            text = f"{prompt}|{i}"
            choice = {"index": i, "finish_reason": "length" if i else "stop", "token_ids": [10 + i, 11]}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                choice["logprobs"] = {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.5}]}
            else:
                choice["text"] = text
                choice["logprobs"] = {"tokens": ["a", "b"], "token_logprobs": [-0.25, -0.75]}
            choices.append(choice)
        return {"id": "x", "choices": choices, "prompt_token_ids": [1, 2, 3]}

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _policy(server: _Server, **overrides) -> OpenAIPolicy:
    options = {
        "base_url": server.url,
        "model": "tiny",
        "timeout_s": 0.5,
        "max_retries": 2,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
        "api_key_env": None,
    }
    return OpenAIPolicyConfig(**{**options, **overrides}).build()


def test_completions_endpoint_returns_text_ids_logprobs_in_order(server):
    policy = _policy(server)
    assert isinstance(policy, Policy)
    out = policy.generate(["p0", "p1"], n=2, sampling=SamplingParams(temperature=0.7, max_new_tokens=5, seed=3))
    assert [[c.text for c in group] for group in out] == [["p0|0", "p0|1"], ["p1|0", "p1|1"]]
    first = out[0][0]
    assert first.token_ids == [10, 11] and first.logprobs == [-0.25, -0.75]
    assert first.finish_reason == "stop" and out[0][1].finish_reason == "length"
    assert first.prompt_token_ids == [1, 2, 3]
    path, body = server.requests[0]
    assert path == "/v1/completions"
    assert body["n"] == 2 and body["max_tokens"] == 5 and body["seed"] == 3 and body["temperature"] == 0.7
    assert body["logprobs"] == 1 and "top_k" not in body


def test_chat_prompts_use_chat_endpoint(server):
    policy = _policy(server, return_token_ids=True, extra_body={"repetition_penalty": 1.1})
    out = policy.generate([[{"role": "user", "content": "hi"}]], n=1, sampling=SamplingParams(top_k=5, stop=("X",)))
    assert out[0][0].text == "hi|0" and out[0][0].logprobs == [-0.5, -1.5]
    path, body = server.requests[0]
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["top_k"] == 5 and body["stop"] == ["X"] and body["return_token_ids"] is True
    assert body["repetition_penalty"] == 1.1 and body["logprobs"] is True


def test_http_500_is_retried_then_succeeds(server):
    server.behaviour = "fail_once"
    out = _policy(server).generate(["p"], n=1)
    assert out[0][0].text == "p|0"
    assert len(server.requests) == 2


def test_http_500_after_retries_raises_request_error(server):
    server.behaviour = "500"
    with pytest.raises(PolicyRequestError, match=r"failed after 3 attempt\(s\): HTTP 500") as info:
        _policy(server).generate(["p"], n=1)
    assert info.value.status == 500 and info.value.attempts == 3
    assert len(server.requests) == 3


def test_client_error_is_not_retried(server):
    server.behaviour = "400"
    with pytest.raises(PolicyRequestError, match=r"answered HTTP 400: .*bad model name") as info:
        _policy(server).generate(["p"], n=1)
    assert info.value.status == 400 and len(server.requests) == 1


def test_timeout_is_retried_and_bounded(server):
    server.behaviour = "slow"
    start = time.monotonic()
    with pytest.raises(PolicyRequestError, match=r"failed after 2 attempt\(s\): timed out after 0.5 s"):
        _policy(server, max_retries=1).generate(["p"], n=1)
    assert time.monotonic() - start < 2.0  # 2 attempts x 0.5 s + backoff, not 2 x 1.5 s


def test_trickling_body_hits_the_total_deadline(server):
    server.behaviour = "trickle"
    start = time.monotonic()
    with pytest.raises(PolicyRequestError, match=r"timed out after 0.5 s"):
        _policy(server, max_retries=0).generate(["p"], n=1)
    assert time.monotonic() - start < 1.5  # the server would take 2 s


def test_malformed_json_is_retried_then_raises(server):
    server.behaviour = "malformed"
    with pytest.raises(PolicyRequestError, match=r"failed after 3 attempt\(s\): malformed JSON"):
        _policy(server).generate(["p"], n=1)
    assert len(server.requests) == 3


def test_wrong_shape_json_raises_request_error(server):
    server.behaviour = "wrong_shape"
    with pytest.raises(PolicyRequestError, match=r"is not a completion response: 'choices'"):
        _policy(server).generate(["p"], n=1)


def test_connection_refused_raises_request_error():
    policy = OpenAIPolicyConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=1, backoff_s=0.0,
                                api_key_env=None).build()  # fmt: skip
    with pytest.raises(PolicyRequestError, match=r"failed after 2 attempt\(s\): connection error"):
        policy.generate(["p"])


def test_concurrency_limit_is_respected(server):
    server.behaviour = "concurrent"
    out = _policy(server, concurrency=3).generate([f"p{i}" for i in range(9)], n=1)
    assert [g[0].text for g in out] == [f"p{i}|0" for i in range(9)]
    assert 2 <= server.max_in_flight <= 3  # never above the limit; overlap itself depends on the shared CPU


def test_api_key_is_read_from_the_environment(server, monkeypatch):
    seen = {}
    original = server.reply

    def capture(handler, body):
        seen["auth"] = handler.headers.get("Authorization")
        return original(handler, body)

    server.reply = capture
    monkeypatch.setenv("LRMGYM_TEST_KEY", "sk-test")
    _policy(server, api_key_env="LRMGYM_TEST_KEY").generate(["p"])
    assert seen["auth"] == "Bearer sk-test"


def test_bad_n_is_a_clear_error(server):
    with pytest.raises(ValueError, match=f"^{re.escape('n (samples per prompt) must be a positive integer, got 0.')}$"):
        _policy(server).generate(["p"], n=0)


def test_config_rejects_unknown_options():
    with pytest.raises(ValueError, match="timeout\n  Extra inputs are not permitted"):
        OpenAIPolicyConfig(model="m", timeout=3)

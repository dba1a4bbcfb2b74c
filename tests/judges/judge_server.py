"""A local OpenAI-compatible judge server for tests: it answers well, times out, fails, or talks garbage."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JudgeServer:
    """Serves POST /v1/chat/completions on 127.0.0.1 (a free port) in a background thread.

    ``mode`` decides every answer: ``"ok"`` (HTTP 200 with ``reply`` as the message content), ``"500"``
    (HTTP 500), ``"garbage"`` (HTTP 200 with a body that is not JSON), ``"hang"`` (sleeps ``hang_s`` before
    answering), ``"context"`` (a model with a small context: HTTP 400 when the prompt is longer than
    ``context_chars`` characters, else as ``"ok"``). ``requests`` counts the requests received.
    """

    def __init__(
        self, mode: str = "ok", reply: str = "SCORE: 7", hang_s: float = 3.0, context_chars: int = 4000
    ) -> None:
        self.mode, self.reply, self.hang_s, self.requests = mode, reply, hang_s, 0
        self.context_chars = context_chars
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):  # noqa: N802 - the http.server hook name
                length = int(self.headers.get("Content-Length", 0))
                server.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
                server.requests += 1
                if server.mode == "hang":
                    time.sleep(server.hang_s)
                body = server.bodies[-1]
                prompt = "".join(str(m.get("content", "")) for m in body.get("messages", [])) or body.get("prompt", "")
                if server.mode == "context" and len(prompt) > server.context_chars:
                    self._send(400, b'{"error": {"message": "This model\'s maximum context length is exceeded"}}')
                elif server.mode == "500":
                    self._send(500, b'{"error": "internal server error"}')
                elif server.mode == "garbage":
                    self._send(200, b"<html>\x00\xff not json")
                else:
                    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": server.reply},
                                         "finish_reason": "stop"}]}  # fmt: skip
                    self._send(200, json.dumps(body).encode())

            def _send(self, status: int, payload: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> JudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def policy(self, **overrides) -> dict:
        """The judge's policy config for this server: no retries of its own (the judge retries)."""
        return {"kind": "openai", "base_url": self.base_url, "model": "judge", "api_key_env": None,
                "timeout_s": 0.5, "max_retries": 0, "logprobs": False, **overrides}  # fmt: skip

"""The ``openai`` policy: any OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, the OpenAI API).

Written on the standard library (``urllib``) rather than the ``openai`` SDK or ``httpx`` so that the core install
needs no HTTP client: the protocol used here is two JSON POST endpoints. What it adds over a bare POST:

- a total per-attempt deadline (the body is read in chunks against a clock, so a server that trickles bytes
  cannot hold a caller past ``timeout_s`` plus one socket read);
- retries with exponential backoff and full jitter on timeouts, connection errors, HTTP 408/429/5xx and
  malformed responses (``Retry-After`` is honoured, capped at ``backoff_max_s``); other 4xx fail at once;
- a concurrency limit (a thread pool of ``concurrency`` workers; one request per prompt, carrying ``n``);
- token ids and log-probs when the server returns them (``logprobs``; vLLM's ``return_token_ids``).

After the retries, a failure raises :class:`PolicyRequestError`, which callers such as the LLM judge catch
and turn into an ungradeable verdict.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lrmgym.core import Completion, Prompt
from lrmgym.policies.base import SamplingParams

__all__ = ["OpenAIPolicy", "OpenAIPolicyConfig", "PolicyRequestError"]

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_MAX_BODY = 64 << 20  # a response larger than 64 MiB is treated as malformed


class PolicyRequestError(RuntimeError):
    """A request to the policy server failed for good (after retries, or with a non-retryable status).

    Attributes:
        url: The endpoint.
        status: The last HTTP status, or ``None`` for timeouts, connection errors and malformed bodies.
        attempts: How many attempts were made.
    """

    def __init__(self, message: str, url: str, status: int | None, attempts: int) -> None:
        super().__init__(message)
        self.url, self.status, self.attempts = url, status, attempts


class _Retryable(Exception):
    """One failed attempt that may succeed when repeated."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class OpenAIPolicyConfig(BaseModel):
    """An OpenAI-compatible server (e.g. `vllm serve MODEL`, then base_url=http://127.0.0.1:8000/v1)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, protected_namespaces=())

    kind: Literal["openai"] = "openai"
    """Component kind."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """Server URL up to and including /v1."""
    model: str
    """Model name as the server knows it (see GET /v1/models)."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Environment variable holding the API key (sent as a Bearer token when set); never put keys in configs."""
    endpoint: Literal["auto", "chat", "completions"] = "auto"
    """"auto": /chat/completions for chat prompts, /completions for text prompts."""
    timeout_s: float = Field(60.0, gt=0)
    """Deadline of one attempt (connect + response), in seconds."""
    max_retries: int = Field(4, ge=0)
    """Retries after the first attempt."""
    backoff_s: float = Field(0.5, ge=0)
    """First retry delay; doubles each retry, with full jitter."""
    backoff_max_s: float = Field(16.0, ge=0)
    """Cap on one retry delay (also caps Retry-After)."""
    concurrency: int = Field(8, ge=1)
    """Requests in flight at once."""
    logprobs: bool = True
    """Ask for the sampled tokens' log-probs."""
    return_token_ids: bool = False
    """Ask for token ids (vLLM extension `return_token_ids`; other servers may reject it)."""
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Extra JSON fields sent with every request (e.g. {"repetition_penalty": 1.1})."""

    def build(self) -> OpenAIPolicy:
        """The policy (no request is made until `generate`)."""
        return OpenAIPolicy(self)


class OpenAIPolicy:
    """Samples from an OpenAI-compatible server; see the module docstring for timeouts and retries."""

    def __init__(self, config: OpenAIPolicyConfig) -> None:
        self.config = config
        self._key = os.environ.get(config.api_key_env) if config.api_key_env else None

    def generate(
        self, prompts: Sequence[Prompt], n: int = 1, sampling: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """One request per prompt (with ``n``), at most ``concurrency`` at once; results in prompt order.

        Raises:
            PolicyRequestError: a request failed after its retries.
        """
        sampling = sampling or SamplingParams()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n (samples per prompt) must be a positive integer, got {n!r}.")
        if isinstance(prompts, (str, dict)):
            raise TypeError("prompts must be a list of prompts; wrap a single prompt as [prompt].")
        if len(prompts) <= 1:
            return [self._one(p, n, sampling) for p in prompts]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda p: self._one(p, n, sampling), prompts))

    # ---- one prompt
    def _one(self, prompt: Prompt, n: int, sampling: SamplingParams) -> list[Completion]:
        chat = self._is_chat(prompt)
        url = self.config.base_url.rstrip("/") + ("/chat/completions" if chat else "/completions")
        body = self._body(prompt, n, sampling, chat)
        data = self._post(url, body)
        try:
            return _parse(data, n, chat)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise PolicyRequestError(
                f"{url} returned JSON that is not a {'chat ' if chat else ''}completion response: {err}; "
                f"body starts {json.dumps(data)[:200]}", url, 200, 1,
            ) from err  # fmt: skip

    def _is_chat(self, prompt: Prompt) -> bool:
        if self.config.endpoint == "auto":
            return not isinstance(prompt, str)
        if self.config.endpoint == "completions" and not isinstance(prompt, str):
            raise ValueError("policy.endpoint='completions' takes text prompts; this prompt is chat messages. "
                             "Use endpoint='chat' or 'auto'.")  # fmt: skip
        return self.config.endpoint == "chat"

    def _body(self, prompt: Prompt, n: int, sampling: SamplingParams, chat: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model, "n": n, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
        }  # fmt: skip
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if self.config.logprobs:
                body["logprobs"] = True
        else:
            body["prompt"] = prompt
            if self.config.logprobs:
                body["logprobs"] = 1
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k  # non-standard; vLLM and SGLang accept it
        if self.config.return_token_ids:
            body["return_token_ids"] = True
        return {**body, **self.config.extra_body}

    # ---- transport
    def _post(self, url: str, body: dict[str, Any]) -> Any:
        cfg = self.config
        attempts = cfg.max_retries + 1
        last: _Retryable | None = None
        for attempt in range(attempts):
            if attempt:
                delay = min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1)) * random.random()
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(cfg.backoff_max_s, last.retry_after))
                time.sleep(delay)
            try:
                return self._attempt(url, body)
            except _Retryable as err:
                last = err
        raise PolicyRequestError(
            f"{url} failed after {attempts} attempt(s): {last}", url, last.status if last else None, attempts
        )

    def _attempt(self, url: str, body: dict[str, Any]) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        deadline = time.monotonic() + self.config.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                raw = _read_until(response, deadline, self.config.timeout_s)
        except urllib.error.HTTPError as err:
            detail = _error_detail(err)
            if err.code in _RETRY_STATUS:
                raise _Retryable(f"HTTP {err.code}: {detail}", err.code, _retry_after(err)) from err
            raise PolicyRequestError(f"{url} answered HTTP {err.code}: {detail}", url, err.code, 1) from err
        except TimeoutError as err:
            raise _Retryable(f"timed out after {self.config.timeout_s:g} s") from err
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise _Retryable(f"timed out after {self.config.timeout_s:g} s") from err
            raise _Retryable(f"connection error: {reason}") from err
        try:
            return json.loads(raw)
        except ValueError as err:
            raise _Retryable(f"malformed JSON ({err}); body starts {raw[:120]!r}") from err


def _read_until(response: Any, deadline: float, timeout: float) -> bytes:
    """Read the body in chunks, giving up at the deadline or past ``_MAX_BODY`` bytes."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"response body not complete after {timeout:g} s")
        # read1 returns what has arrived (read(n) would block until n bytes); each call waits at most one
        # socket timeout, so the deadline is checked at least that often.
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > _MAX_BODY:
            raise _Retryable(f"response larger than {_MAX_BODY >> 20} MiB")
        chunks.append(chunk)


def _error_detail(err: urllib.error.HTTPError) -> str:
    try:
        return err.read(2000).decode("utf-8", "replace").strip() or err.reason
    except Exception:  # noqa: BLE001 - the status is what matters; the body is best effort
        return str(err.reason)


def _retry_after(err: urllib.error.HTTPError) -> float | None:
    value = err.headers.get("Retry-After") if err.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------- parsing
def _finish(reason: Any) -> Literal["stop", "length"] | None:
    return reason if reason in ("stop", "length") else None


def _parse(data: Any, n: int, chat: bool) -> list[Completion]:
    """Completions from a response; raises KeyError/TypeError/ValueError when it has the wrong shape."""
    choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise ValueError(f"asked for n={n} choices, got {len(choices)}")
    prompt_ids = data.get("prompt_token_ids")
    out = []
    for choice in choices:
        text = choice["message"]["content"] if chat else choice["text"]
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        ids = choice.get("token_ids")
        logprobs = _logprobs(choice.get("logprobs"), chat)
        out.append(Completion(
            text=text, token_ids=list(ids) if ids is not None else None, logprobs=logprobs,
            finish_reason=_finish(choice.get("finish_reason")),
            prompt_token_ids=choice.get("prompt_token_ids", prompt_ids),
        ))  # fmt: skip
    return out


def _logprobs(block: Any, chat: bool) -> list[float] | None:
    if not block:
        return None
    if chat:
        return [float(t["logprob"]) for t in block.get("content") or []]
    values = block.get("token_logprobs")
    return None if values is None else [float("nan") if v is None else float(v) for v in values]

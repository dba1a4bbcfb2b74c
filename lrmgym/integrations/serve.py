"""``lrmgym serve``: an env and its judges behind HTTP, in OpenRLHF's remote-reward protocol.

Protocol (OpenRLHF 0.11.2, ``--reward.remote_url http://HOST:PORT/get_reward``)::

    POST /get_reward   (or POST /)
    {"query": ["<prompt + completion>", ...], "prompts": ["<prompt>", ...], "labels": ["<label>", ...]}
    -> 200 {"rewards": [float, ...], "scores": [float, ...], "extra_logs": {"judge/accuracy": [float, ...], ...}}
    GET /health -> 200 {"status": "ok", "env": ..., "judges": [...], "in_flight": ..., ...}

The completion is each query after its prompt (``prompts`` may be left out: then the query is the completion),
with end-of-sequence texts removed (:func:`lrmgym.integrations.labels.completion_from_query`). ``rewards``,
``scores`` and ``extra_logs`` are as :class:`lrmgym.integrations.labels.Score` defines them.

Labels are required, one per query: the server's env is fixed when it starts (``env=... judge=...``), and a label
names the task in it. A short label ``{"v": 1, "index": i, "seed": s}`` does; so does the full label
``lrmgym export openrlhf`` writes, provided it describes the server's env and judges (its ``env.split`` may differ:
the eval rows carry the held-out split). The server never builds an env a request describes, so no client can
choose, for instance, a code sandbox without isolation. Without labels there is no task (no reference answer, no
unit tests) to grade against, so a request without them is refused (400).

Groups: completions of the same task in one request are graded together, so group-aware judges (the arena) see
them as a group. OpenRLHF 0.11.2 posts one sample per request, though; with ``group_size=N`` the server holds the
requests of one task (same label) until N completions have arrived, or ``group_wait_s`` has passed, and grades
them as one group.

Limits, each answered with a JSON ``{"error": ...}``: a body over ``max_body_bytes`` or more than ``max_items``
queries gets 413; more than ``max_concurrency`` requests in flight 503 (with ``Retry-After``); a request whose
body has not arrived within ``read_timeout_s`` 408 (and a connection whose request headers have not arrived within
``read_timeout_s`` is closed), so slow senders hold a slot that long at most; a request not scored within
``deadline_s`` after its body arrived 504; malformed JSON, a missing or mistyped field or an unusable label 400,
the message naming the field (``labels[3].index: ...``). A client that hangs up before its body is complete is
logged in one line and counted apart (``disconnected``), not as a server error.

Grading runs in a thread pool of ``workers`` threads, off the event loop, through the env's own pools (the math
verifier's killable workers, the code sandbox pool), whose wall-clock bounds hold for hostile completions. Each
item is its own job unless a judge compares a group (then each task's items are one job), so a request that
times out (504) or whose client goes away has its jobs that have not started cancelled: the pool is free again
once the items already running end, each within the env's own bound (``env.timeout_s``). SIGINT and SIGTERM stop
the server: requests in flight get up to ``shutdown_grace_s``, then the env's sandboxes and verifier workers are
closed.

The server binds 127.0.0.1 unless told otherwise (``host``). It has no authentication: whoever can reach the port
can spend its CPU on grading, so expose it (``--host 0.0.0.0``) on a private network or behind an authenticating
proxy only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lrmgym.integrations.labels import DEFAULT_STOP_TEXTS, Item, LabelError, Score, Scorer, completion_from_query

__all__ = [
    "RequestError",
    "RewardServer",
    "ServeConfig",
    "build_app",
    "header_bounded_protocol",
    "parse_request",
    "serve",
]

logger = logging.getLogger(__name__)

_FIELDS = ("query", "prompts", "labels")


def _default_workers() -> int:
    return min(32, 4 * (os.cpu_count() or 1))


class ServeConfig(BaseModel):
    """Options of ``lrmgym serve``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Interface to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface, for a trainer elsewhere)."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one (printed at start)."""
    workers: int = Field(default_factory=_default_workers, ge=1, le=1024)
    """Threads that grade (each waits on the env's own pools); default 4 per CPU core, at most 32."""
    max_concurrency: int = Field(512, ge=1, le=100_000)
    """Requests in flight at once; one more gets 503 (OpenRLHF retries a failed request 5 times, 1 s apart)."""
    max_body_bytes: int = Field(32 << 20, ge=1024)
    """Largest request body; a larger one gets 413."""
    max_items: int = Field(4096, ge=1)
    """Most queries in one request; more gets 413."""
    deadline_s: float = Field(120.0, gt=0, le=3600)
    """A request not scored within this many seconds after its body arrived gets 504 (OpenRLHF's client gives up
    after 180 s); its grading jobs that have not started are cancelled."""
    read_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A request's headers, and then its body, must arrive within this many seconds each: a slower body gets 408,
    slower headers a closed connection (slow senders hold a slot this long at most)."""
    group_size: int = Field(1, ge=1, le=4096)
    """Completions of one task graded together across requests (set it to --rollout.n_samples_per_prompt for the
    arena); 1 grades each request's items as they come, grouped only within the request."""
    group_wait_s: float = Field(30.0, gt=0)
    """With group_size > 1: how long a task's first request waits for the rest of its group before the completions
    that arrived are graded anyway."""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """On SIGINT / SIGTERM: seconds requests in flight get to finish before they are cut."""

    @model_validator(mode="after")
    def _check_wait(self) -> ServeConfig:
        if self.group_size > 1 and self.group_wait_s >= self.deadline_s:
            raise ValueError(
                f"group_wait_s ({self.group_wait_s:g}) must be below deadline_s ({self.deadline_s:g}), or every group "
                "that waits would time out; lower --group-wait-s or raise --deadline-s"
            )
        return self


class RequestError(ValueError):
    """A malformed request: the message names the field; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, max_items: int) -> tuple[list[str], list[str | None], list[Any]]:
    """``(queries, prompts, labels)`` of a request body, or :class:`RequestError` naming the bad field."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise RequestError(f"body: not valid JSON ({type(err).__name__}: {str(err)[:200]}).") from None
    if not isinstance(data, dict):
        raise RequestError(f"body: expected a JSON object with {', '.join(_FIELDS)}, got {type(data).__name__}.")
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field; a request has query, prompts (optional) and labels.")
    queries = data.get("query")
    if not isinstance(queries, list):
        raise RequestError(f"query: expected a list of strings (prompt + completion each), got {_kind(queries)}.")
    if len(queries) > max_items:
        raise RequestError(f"query: {len(queries)} items, over the limit of {max_items} per request.", status=413)
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(f"query[{i}]: expected a string, got {_kind(q)}.")
    prompts = data.get("prompts")
    if prompts is None:
        prompts = [None] * len(queries)
    elif not isinstance(prompts, list) or len(prompts) != len(queries):
        raise RequestError(f"prompts: expected a list of {len(queries)} strings (one per query), got {_kind(prompts)}.")
    for i, p in enumerate(prompts):
        if p is not None and not isinstance(p, str):
            raise RequestError(f"prompts[{i}]: expected a string, got {_kind(p)}.")
    labels = data.get("labels")
    if labels is None:
        raise RequestError(
            "labels: missing. Every query needs the label of its task (the `label` column `lrmgym export openrlhf` "
            'writes; OpenRLHF: --data.label_key label) or a short label {"v": 1, "index": I, "seed": S}.'
        )
    if not isinstance(labels, list) or len(labels) != len(queries):
        raise RequestError(f"labels: expected a list of {len(queries)} labels (one per query), got {_kind(labels)}.")
    return queries, prompts, labels


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "null" if value is None else type(value).__name__


@dataclass
class _Bucket:
    """Completions of one task waiting for the rest of their group."""

    items: list[Item] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    flushed: bool = False


class RewardServer:
    """The state behind the HTTP routes: the scorer, the grading threads, the limits and the group buckets.

    Args:
        scorer: A scorer with a fixed env (``Scorer(env, judge)``).
        config: The limits and the group window.
        stop_texts: End-of-sequence texts removed from completions.
    """

    def __init__(self, scorer: Scorer, config: ServeConfig, stop_texts: Sequence[str] = DEFAULT_STOP_TEXTS) -> None:
        if scorer.fixed is None:
            raise ValueError("RewardServer needs a scorer with a fixed env: Scorer(env, judge).")
        self.scorer = scorer
        self.config = config
        self.stop_texts = tuple(stop_texts)
        self.executor = concurrent.futures.ThreadPoolExecutor(config.workers, thread_name_prefix="lrmgym-serve")
        self.in_flight = 0
        self.counts = dict.fromkeys(
            ("requests", "items", "ok", "rejected", "saturated", "timeouts", "read_timeouts", "disconnected", "errors"),
            0,
        )
        self.grading = 0  # grading jobs queued or running in the thread pool
        self._grading_lock = threading.Lock()
        self.started = time.time()
        self._buckets: dict[tuple[str, int, int], _Bucket] = {}
        self._closed = False

    # ---- scoring
    def _prepare(self, queries: list[str], prompts: list[str | None], labels: list[Any]) -> list[Item]:
        """Decode labels, build their tasks (so a bad index is a 400 now) and cut the completions out of the queries."""
        pairs = [completion_from_query(q, p, self.stop_texts) for q, p in zip(queries, prompts, strict=True)]
        items = self.scorer.prepare(labels, [t for t, _ in pairs], [f for _, f in pairs])
        for i, item in enumerate(items):
            item.world.task(item.index, item.seed, f"labels[{i}]")
        return items

    def _submit(self, items: list[Item]) -> asyncio.Future:
        """One grading job (items of one task, graded as a group) in the thread pool.

        Cancelling the returned future before the job starts cancels the job: a request that times out or goes
        away leaves nothing queued behind it.
        """
        with self._grading_lock:
            self.grading += 1
        job = self.executor.submit(Scorer.score_group, items)

        def done(_: concurrent.futures.Future) -> None:  # ran to its end, or cancelled before it started
            with self._grading_lock:
                self.grading -= 1

        job.add_done_callback(done)
        return asyncio.wrap_future(job)

    @staticmethod
    def _jobs(items: list[Item]) -> list[list[int]]:
        """The positions each job grades: each item alone, or each task's items together for a group judge."""
        if any(item.world.group_judges for item in items):
            return list(Scorer.groups(items).values())
        return [[i] for i in range(len(items))]

    async def _score_now(self, items: list[Item]) -> list[Score]:
        jobs = self._jobs(items)
        futures = [self._submit([items[p] for p in ps]) for ps in jobs]
        try:
            results = await asyncio.gather(*futures)
        finally:  # a deadline or a client gone: the jobs that have not started never will
            for future in futures:
                future.cancel()
        out: list[Score | None] = [None] * len(items)
        for positions, scores in zip(jobs, results, strict=True):
            for pos, score in zip(positions, scores, strict=True):
                out[pos] = score
        return out  # type: ignore[return-value]

    def _enqueue(self, item: Item) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        key = item.group_key
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            bucket.timer = loop.call_later(self.config.group_wait_s, self._flush, key, bucket)
        future = loop.create_future()
        bucket.items.append(item)
        bucket.futures.append(future)
        if len(bucket.items) >= self.config.group_size:
            self._flush(key, bucket)
        return future

    def _flush(self, key: tuple[str, int, int], bucket: _Bucket) -> None:
        if self._buckets.get(key) is bucket:
            del self._buckets[key]
        if bucket.timer is not None:
            bucket.timer.cancel()
        if bucket.flushed:
            return
        bucket.flushed = True
        if all(future.done() for future in bucket.futures):  # every request of the group timed out or went away
            return
        job = self._submit(bucket.items)

        def deliver(done: asyncio.Future) -> None:
            error = None if done.cancelled() else done.exception()
            for i, future in enumerate(bucket.futures):
                if future.done():  # its request timed out or went away
                    continue
                if done.cancelled():
                    future.cancel()
                elif error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(done.result()[i])

        job.add_done_callback(deliver)

    async def _score_grouped(self, items: list[Item]) -> list[Score]:
        futures = [self._enqueue(item) for item in items]
        try:
            return list(await asyncio.gather(*futures))
        finally:  # a group not yet graded whose requests have all gone is never graded (see _flush)
            for future in futures:
                future.cancel()

    async def score(self, queries: list[str], prompts: list[str | None], labels: list[Any]) -> dict[str, Any]:
        """The response body for parsed request fields (raises :class:`LabelError` for a bad label)."""
        items = await asyncio.to_thread(self._prepare, queries, prompts, labels)
        if self.config.group_size > 1:
            scores = await self._score_grouped(items)
        else:
            scores = await self._score_now(items)
        keys = list(dict.fromkeys(k for s in scores for k in s.extra_logs))
        return {
            "rewards": [s.reward for s in scores],
            "scores": [s.score for s in scores],
            "extra_logs": {k: [s.extra_logs.get(k, 0.0) for s in scores] for k in keys},
        }

    async def _handle(self, body: bytes) -> dict[str, Any]:
        # A large body takes a while to parse: not on the event loop, and not behind the grading threads.
        queries, prompts, labels = await asyncio.to_thread(parse_request, body, self.config.max_items)
        self.counts["items"] += len(queries)
        return await self.score(queries, prompts, labels)

    # ---- HTTP
    async def _read_body(self, request: Any) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise RequestError(f"Content-Length: not a number ({declared[:40]!r}).") from None
            if size > limit:
                raise RequestError(f"body: {size} bytes, over the limit of {limit} (--max-body-mb).", status=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(f"body: over the limit of {limit} bytes (--max-body-mb).", status=413)
        return bytes(body)

    async def get_reward(self, request: Any) -> Any:
        """``POST /get_reward``: score a batch (see the module docstring)."""
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse

        self.counts["requests"] += 1
        if self.in_flight >= self.config.max_concurrency:
            self.counts["saturated"] += 1
            message = f"server saturated: {self.in_flight} requests in flight (--max-concurrency); retry later."
            return JSONResponse({"error": message}, status_code=503, headers={"Retry-After": "1"})
        self.in_flight += 1
        try:
            try:
                body = await asyncio.wait_for(self._read_body(request), self.config.read_timeout_s)
            except asyncio.TimeoutError:
                self.counts["read_timeouts"] += 1
                message = f"body: not received within {self.config.read_timeout_s:g} s (--read-timeout-s)."
                return JSONResponse({"error": message}, status_code=408, headers={"Connection": "close"})
            result = await asyncio.wait_for(self._handle(body), self.config.deadline_s)
        except ClientDisconnect:
            self.counts["disconnected"] += 1
            client = f"client {request.client.host}:{request.client.port}" if request.client else "a client"
            logger.warning("lrmgym serve: %s disconnected while sending the request; nothing graded", client)
            return JSONResponse({"error": "client disconnected"}, status_code=400)
        except RequestError as err:
            self.counts["rejected"] += 1
            return JSONResponse({"error": str(err)}, status_code=err.status)
        except LabelError as err:
            self.counts["rejected"] += 1
            return JSONResponse({"error": str(err)}, status_code=400)
        except asyncio.TimeoutError:
            self.counts["timeouts"] += 1
            message = f"deadline: the request was not scored within {self.config.deadline_s:g} s (--deadline-s)."
            return JSONResponse({"error": message}, status_code=504)
        except Exception as err:  # noqa: BLE001 - a server bug: answer it, keep serving
            self.counts["errors"] += 1
            logger.exception("lrmgym serve: scoring failed")
            return JSONResponse({"error": f"internal error: {type(err).__name__}: {err}"[:500]}, status_code=500)
        finally:
            self.in_flight -= 1
        self.counts["ok"] += 1
        return JSONResponse(result)

    async def health(self, request: Any) -> Any:
        """``GET /health``: the env, judges, limits and counters."""
        from starlette.responses import JSONResponse

        world = self.scorer.fixed
        assert world is not None
        return JSONResponse({
            "status": "ok",
            "env": world.env_id,
            "judges": world.judge_names,
            "multi_turn": world.max_turns > 1,
            "in_flight": self.in_flight,
            "grading": self.grading,
            "pending_groups": len(self._buckets),
            "max_concurrency": self.config.max_concurrency,
            "group_size": self.config.group_size,
            "workers": self.config.workers,
            "uptime_s": round(time.time() - self.started, 3),
            "counts": dict(self.counts),
        })  # fmt: skip

    def close(self) -> None:
        """Stop grading: cancel queued work, then close the env's sandboxes and the verifier workers."""
        if self._closed:
            return
        self._closed = True
        for bucket in list(self._buckets.values()):
            if bucket.timer is not None:
                bucket.timer.cancel()
        self._buckets.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.scorer.close()


def build_app(server: RewardServer) -> Any:
    """The Starlette app over ``server``; its shutdown closes the server (sandboxes, workers)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        server.close()

    routes = [
        Route("/get_reward", server.get_reward, methods=["POST"]),
        Route("/", server.get_reward, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def header_bounded_protocol(read_timeout_s: float, on_timeout: Any = None) -> type:
    """The HTTP protocol uvicorn picks (httptools when installed, else h11), plus a bound on the time headers take.

    uvicorn bounds the idle time between requests (``timeout_keep_alive``) but not a request that is being sent:
    a client that opens a connection and sends its headers a byte at a time would hold it forever. With this
    protocol the headers of each request must be complete within ``read_timeout_s`` of the connection opening
    (first request) or of the request's first byte (next requests on a kept-alive connection); else the
    connection is closed and ``on_timeout()`` called. The body's bound is the app's (:class:`RewardServer`).
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderBoundedProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._awaiting_headers():
                self._disarm()
            elif self._header_timer is None:
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(read_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                self.transport.close()
                if on_timeout is not None:
                    on_timeout()

    return HeaderBoundedProtocol


def serve(scorer: Scorer, config: ServeConfig, announce: Any = None) -> int | None:
    """Run the server until SIGINT / SIGTERM; returns the signal that stopped it (``None``: it stopped by itself).

    Args:
        scorer: A scorer with a fixed env.
        config: Host, port, limits.
        announce: Called with the URL once the socket listens (default: print it to stdout).

    Raises:
        OSError: The address cannot be bound (port in use).
    """
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server, minus its re-raising of the stop signal (the command exits 0 after a clean stop)."""

        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.stopped_by = sig
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    server = RewardServer(scorer, config)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.port))
        sock.listen(2048)
    except OSError:
        sock.close()
        server.close()
        raise
    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{port}"

    def header_timeout() -> None:
        server.counts["read_timeouts"] += 1

    uv_config = uvicorn.Config(
        build_app(server), log_level="warning", access_log=False, lifespan="on",
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s), limit_concurrency=None,
        http=header_bounded_protocol(config.read_timeout_s, header_timeout),
    )  # fmt: skip
    runner = _Server(uv_config)
    (announce or (lambda u: print(f"lrmgym serve: listening on {u}/get_reward", flush=True)))(url)
    try:
        runner.run(sockets=[sock])
    finally:
        server.close()
        sock.close()
        sys.stdout.flush()
    return runner.stopped_by

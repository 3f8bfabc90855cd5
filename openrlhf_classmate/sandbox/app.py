"""The HTTP API (FastAPI): ``GET /health``, ``POST /test_program``, ``POST /test_program_stdio``.

Every client mistake is a 4xx with a JSON body ``{"error": "...", ...}`` naming the field: 400 body is not JSON, 413
body or program too large, 415 not JSON content type, 422 a field missing or of the wrong type or out of range,
404/405 for unknown routes. 503 means the queue is full (retry). 500 is only ever the sandbox's own failure, never
the program's: whatever the program does becomes a verdict in a 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from openrlhf_classmate.sandbox.config import SandboxConfig
from openrlhf_classmate.sandbox.service import QueueFull, Sandbox, SandboxError, TestVerdict


class StdioTest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    input: str
    output: str


class TestProgramRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    program: str
    tests: list[str] = Field(min_length=1)
    max_execution_time: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class TestProgramStdioRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    program: str
    tests: list[StdioTest] = Field(min_length=1)
    max_execution_time: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class ClientError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class RequestGuard:
    """ASGI middleware: a POST must declare JSON (415 otherwise), and a body larger than ``limit`` bytes gets 413
    without being kept in memory. The rest of an oversized body is read and dropped first (up to 8 x ``limit``), so
    that a client still sending it can read the answer instead of seeing a reset connection."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._reject(receive, send)
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if scope["method"] == "POST" and ctype.split(";")[0].strip().lower() != "application/json":
            return await _send_json(send, 415, {"error": f"Content-Type must be application/json, got {ctype!r}"})
        # Read the body here (it is bounded), so that the app never sees an oversized one.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._reject(receive if more else None, send)
        body = b"".join(chunks)
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when it comes

        await self.app(scope, replay, send)

    async def _reject(self, receive, send):
        drained = 0
        while receive is not None and drained <= 8 * self.limit:
            message = await receive()
            if message["type"] != "http.request":
                break
            drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await _send_json(send, 413, {"error": f"request body exceeds {self.limit} bytes (--max-request-mb)"})


async def _send_json(send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _json_safe(value: Any) -> Any:
    """``value`` as strict JSON can carry it: a NaN or infinite number the client sent (pydantic echoes the input)
    becomes its text, other objects their ``str``; the 422 answer must not fail to serialise (it was a 500)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def create_app(cfg: SandboxConfig, box: Sandbox) -> FastAPI:
    """The ASGI app around a started ``Sandbox`` (``__main__`` starts it before the port opens); the app's lifespan
    stops it (uvicorn re-raises SIGTERM/SIGINT once it has shut down, so cleanup cannot wait until after)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await box.stop()

    app = FastAPI(title="openrlhf-classmate sandbox", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.sandbox = box

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": f"request body is not valid JSON: {_validation_message(errors)}"}, 400)
        return JSONResponse({"error": _validation_message(errors), "detail": _json_safe(errors)}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, exc.status_code)

    @app.exception_handler(ClientError)
    async def on_client_error(request: Request, exc: ClientError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, exc.status)

    @app.exception_handler(QueueFull)
    async def on_queue_full(request: Request, exc: QueueFull) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "1"})

    @app.exception_handler(SandboxError)
    async def on_sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, 500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        iso = box.isolation
        return {"status": "ok", "isolation": iso.describe() if iso else None, "launcher": box.launcher.name,
                "concurrency": box.stats(),
                "limits": _limits(cfg), "uptime_s": round(time.time() - box.started_at, 1)}

    @app.post("/test_program")
    async def test_program(req: TestProgramRequest) -> dict[str, Any]:
        limit = _time_limit(cfg, req.max_execution_time)
        _check_size(cfg, req.program, max(len(t) for t in req.tests), len(req.tests))
        box.reserve(len(req.tests))
        return _response(await _all(box.run_assert(req.program, t, limit) for t in req.tests))

    @app.post("/test_program_stdio")
    async def test_program_stdio(req: TestProgramStdioRequest) -> dict[str, Any]:
        limit = _time_limit(cfg, req.max_execution_time)
        _check_size(cfg, req.program, 0, len(req.tests))
        box.reserve(len(req.tests))
        return _response(await _all(box.run_stdio(req.program, t.input, t.output, limit) for t in req.tests))

    app.add_middleware(RequestGuard, limit=cfg.max_request_bytes)
    return app


async def _all(runs) -> list[TestVerdict]:
    """Every run of a request to its end (a sandbox failure in one does not leave the others unawaited), then the
    first failure, if any, is raised."""
    results = await asyncio.gather(*runs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _limits(cfg: SandboxConfig) -> dict[str, Any]:
    return {"default_time_limit_s": cfg.default_time_limit, "max_time_limit_s": cfg.max_time_limit,
            "memory_mb": cfg.memory_mb, "max_processes": cfg.max_processes, "file_size_mb": cfg.file_size_mb,
            "disk_mb": cfg.disk_mb, "open_files": cfg.open_files, "max_output_kb": cfg.max_output_kb,
            "max_request_mb": cfg.max_request_mb, "max_tests": cfg.max_tests}


def _time_limit(cfg: SandboxConfig, requested: float | None) -> float:
    if requested is None:
        return cfg.default_time_limit
    if requested > cfg.max_time_limit:
        raise ClientError(422, f"max_execution_time: {requested:g} s exceeds this service's limit of "
                               f"{cfg.max_time_limit:g} s (--max-time-limit)")
    return float(requested)


def _check_size(cfg: SandboxConfig, program: str, test_chars: int, n_tests: int) -> None:
    if n_tests > cfg.max_tests:
        raise ClientError(422, f"tests: {n_tests} tests, more than this service's limit of {cfg.max_tests} "
                               "(--max-tests)")
    # the program and its test are written to the program's private /tmp; keep room for what it writes itself
    if 4 * (len(program) + test_chars) > cfg.disk_mb * 1024 * 1024:
        raise ClientError(413, f"program: {len(program)} characters is too large for the sandbox's {cfg.disk_mb} MiB "
                               "working directory (--disk-mb)")


def _response(verdicts: list[TestVerdict]) -> dict[str, Any]:
    passed = sum(v.passed for v in verdicts)
    return {"pass_fraction": passed / len(verdicts), "passed": passed, "total": len(verdicts),
            "results": [v.as_dict() for v in verdicts]}

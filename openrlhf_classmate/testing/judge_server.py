"""A fake OpenAI-compatible judge server for tests, the benchmark and offline demos.

It serves ``POST /v1/chat/completions`` (and ``GET /v1/models``) on 127.0.0.1 and answers in the judge format
(``RATING: n`` / ``EXPLANATION: ...``). Without instructions the rating is derived from the prompt (stable across
runs): 1-10, or 0/1 for the binary MMLU monitor prompt. Directives written anywhere in the prompt (e.g. in the
response text being judged) change what happens to that request:

=========================  ==================================================================================
``[[fake:rating=7]]``      answer ``RATING: 7``
``[[fake:sleep=2.5]]``     wait 2.5 s before answering
``[[fake:status=500x2]]``  answer HTTP 500 to the first 2 requests carrying this prompt, then normally
                           (``status=503`` alone: always)
``[[fake:drop=1]]``        drop the connection without an answer for the first request, then answer
                           (``drop`` alone: always)
``[[fake:garbage]]``       answer text with no rating in it
``[[fake:malformed]]``     answer HTTP 200 with a body that is not chat-completions JSON
``[[fake:key=K]]``         tag the request with key ``K`` (see ``down_keys``)
=========================  ==================================================================================

``FakeJudgeServer(down_keys=N, down_status=503)`` answers ``down_status`` to every request (retries included) whose
key is one of the first N distinct keys it sees: with one key per prompt in a dataset, the judge is down for
exactly the prompts of the first training step(s), whatever order the data loader picks.

The server records every request body and header set, and counts requests in flight (``max_in_flight``), so tests
can check what the client actually sent and how many requests it had open at once.

Use it as ``async with FakeJudgeServer() as server:`` inside a running loop, ``with serve_judge() as server:``
from synchronous code, or from a shell: ``python -m openrlhf_classmate.testing.judge_server --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import time
import zlib
from typing import Any

from aiohttp import web

from openrlhf_classmate.testing.servers import serve_in_thread

_DIRECTIVE_RE = re.compile(r"\[\[fake:(\w+)(?:=([^\]]*))?\]\]")
BINARY_PROMPT_MARK = "RATING: [0 or 1]"


def default_rating(prompt: str) -> int:
    """The rating the server gives a prompt without a ``rating`` directive (stable: CRC32 of the prompt)."""
    crc = zlib.crc32(prompt.encode("utf-8"))
    return crc % 2 if BINARY_PROMPT_MARK in prompt else 1 + crc % 10


class FakeJudgeServer:
    """The fake server. ``port=0`` picks a free port; ``base_url`` is valid once started."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.0, model: str = "fake-judge",
                 down_keys: int = 0, down_status: int = 503):
        self.host = host
        self.port = port
        self.latency_s = latency_s
        """Delay added to every answer (seconds)."""
        self.model = model
        self.requests: list[dict[str, Any]] = []
        """JSON bodies received, in arrival order."""
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.down_keys = down_keys
        self.down_status = down_status
        self.keys: list[str] = []
        """Distinct ``key`` directives in the order first seen."""
        self.statuses: list[int] = []
        """HTTP status of every answer, in order (0 for a dropped connection)."""
        self._attempts: dict[str, int] = {}
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> FakeJudgeServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a client that gave up (timeout) ends the sleeping handler instead of leaving it to
        # delay shutdown.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=1.0)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the port actually bound (port=0 picks one)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeJudgeServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
            directives = {k: v for k, v in _DIRECTIVE_RE.findall(prompt)}
            attempt = self._attempts.get(prompt, 0)
            self._attempts[prompt] = attempt + 1

            key = directives.get("key")
            if key is not None and key not in self.keys:
                self.keys.append(key)
            delay = self.latency_s + float(directives.get("sleep") or 0)
            if delay:
                await asyncio.sleep(delay)
            if "drop" in directives and _applies(directives["drop"], attempt):
                # Close the socket mid-request: the client sees a disconnect, not an HTTP answer.
                self.statuses.append(0)
                request.transport.close()  # type: ignore[union-attr]
                raise asyncio.CancelledError
            if key is not None and key in self.keys[: self.down_keys]:
                self.statuses.append(self.down_status)
                return web.Response(status=self.down_status, text=f"fake judge down ({self.down_status})")
            if "status" in directives:
                code, _, times = directives["status"].partition("x")
                if _applies(times, attempt):
                    self.statuses.append(int(code))
                    return web.Response(status=int(code), text=f"fake error {code}")
            self.statuses.append(200)
            if "malformed" in directives:
                return web.Response(status=200, text="<html>not json</html>", content_type="text/html")
            if "garbage" in directives:
                text = "I cannot decide; the response is interesting."
            else:
                rating = int(directives["rating"]) if directives.get("rating") else default_rating(prompt)
                text = f"RATING: {rating}\nEXPLANATION: fake judge verdict."
            return web.json_response(_completion(body.get("model", self.model), text))
        finally:
            self.in_flight -= 1


def _applies(times: str, attempt: int) -> bool:
    """A directive with a count (``drop=2``) applies to the first ``times`` attempts; without one, always."""
    return not times or attempt < int(times)


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def serve_judge(**kwargs: Any) -> contextlib.AbstractContextManager[FakeJudgeServer]:
    """A ``FakeJudgeServer(**kwargs)`` run on its own event loop in a daemon thread, for synchronous callers."""
    return serve_in_thread(FakeJudgeServer(**kwargs))


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible judge server (127.0.0.1 only).")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--down-keys", type=int, default=0, help="answer --down-status to the first N request keys")
    parser.add_argument("--down-status", type=int, default=503)
    args = parser.parse_args()

    async def serve() -> None:
        async with FakeJudgeServer(port=args.port, latency_s=args.latency, down_keys=args.down_keys,
                                   down_status=args.down_status) as server:
            print(f"READY {server.base_url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()

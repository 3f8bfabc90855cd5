"""Local stand-ins for the servers of the sibling reward methods, for tests, benchmarks and CPU end-to-end runs:
TinyV's verifier (an OpenAI-compatible chat server) and DARLING's pair classifier (vLLM's ``/classify``).

Both listen on 127.0.0.1, record every request body, count requests in flight and can be made slow or failing:

* :class:`FakeVerifierServer` answers ``POST /v1/chat/completions`` and ``GET /v1/models``. By default it judges
  like a lenient verifier: ``True`` when the ground truth (from ``<ground_truth_answer>``) appears among the words of
  ``<model_answer>``, else ``False``; a rubric prompt gets ``Total Score: k/10`` with k the number of words of the
  student's answer (at most 10). ``reply`` (a string, or a function of the prompt and its attempt number) overrides
  the answer; ``latency_s`` delays every answer; ``fail_first`` answers HTTP 500 to that many requests first.
* :class:`FakeClassifierServer` answers ``POST /classify`` and ``GET /v1/models``: each input ``CLS a SEP b SEP`` gets
  ``probs = [1 - p, p]`` with p the Jaccard similarity of the word sets of a and b (or ``similarity(a, b)``).

``servers.serve_in_thread(server)`` runs one on its own event loop for synchronous callers; from a shell:
``python -m openrlhf_classmate.testing.fake_servers verifier|classifier --port 0`` prints ``READY <url>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

_GT_RE = re.compile(r"<ground_truth_answer>(.*?)</ground_truth_answer>", re.S)
_ANSWER_RE = re.compile(r"<model_answer>(.*?)</model_answer>", re.S)


def lenient_verdict(prompt: str) -> str:
    """The default verifier reply (module docstring)."""
    if "Scoring Criteria:" in prompt:
        answer = prompt.rsplit("Student's Answer:\n", 1)[-1]
        return f"Total Score: {min(10, len(answer.split()))}/10"
    gt, answer = _GT_RE.search(prompt), _ANSWER_RE.search(prompt)
    if gt is None or answer is None:
        return "I cannot tell."
    return "True" if gt.group(1).strip() in answer.group(1).replace("$", " ").split() else "False"


def jaccard(a: str, b: str) -> float:
    wa, wb = set(a.lower().split()), set(b.lower().split())
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0


class _Server:
    def __init__(self, host: str, port: int, latency_s: float, fail_first: int):
        self.host, self.port = host, port
        self.latency_s = latency_s
        self.fail_first = fail_first
        """Answer HTTP 500 to this many requests (counted down), then normally."""
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self):
        app = web.Application()
        self.routes(app)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=1.0).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _enter(self, request: web.Request) -> tuple[dict, web.Response | None]:
        """Record the request, apply the latency and the scripted failures."""
        body = await request.json()
        self.requests.append(body)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.fail_first > 0:
            self.fail_first -= 1
            return body, web.Response(status=500, text="fake server error")
        return body, None

    def _track(self, delta: int) -> None:
        self.in_flight += delta
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _models(self, model: str):
        async def handler(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

        return handler


class FakeVerifierServer(_Server):
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, model: str = "zhangchenxu/TinyV-1.5B",
                 reply: str | Callable[[str, int], str] | None = None, latency_s: float = 0.0, fail_first: int = 0):
        super().__init__(host, port, latency_s, fail_first)
        self.model = model
        self.reply = reply
        self._attempts: dict[str, int] = {}

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models(self.model))

    async def _chat(self, request: web.Request) -> web.Response:
        self._track(+1)
        try:
            body, failure = await self._enter(request)
            if failure is not None:
                return failure
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
            attempt = self._attempts.get(prompt, 0)
            self._attempts[prompt] = attempt + 1
            if self.reply is None:
                text = lenient_verdict(prompt)
            else:
                text = self.reply if isinstance(self.reply, str) else self.reply(prompt, attempt)
            return web.json_response({
                "id": f"chatcmpl-fake-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            })
        finally:
            self._track(-1)


class FakeClassifierServer(_Server):
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, model: str = "similarity_gpu_0",
                 cls: str = "<|im_start|>", sep: str = "<|im_end|>",
                 similarity: Callable[[str, str], float] = jaccard, latency_s: float = 0.0, fail_first: int = 0):
        super().__init__(host, port, latency_s, fail_first)
        self.model, self.cls, self.sep, self.similarity = model, cls, sep, similarity

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/classify", self._classify)
        app.router.add_get("/v1/models", self._models(self.model))

    async def _classify(self, request: web.Request) -> web.Response:
        self._track(+1)
        try:
            body, failure = await self._enter(request)
            if failure is not None:
                return failure
            if body.get("model") != self.model:
                return web.json_response({"error": f"model {body.get('model')!r} does not exist"}, status=404)
            data = []
            for k, text in enumerate(body["input"]):
                a, b = text.removeprefix(self.cls).split(self.sep)[:2]
                p = float(self.similarity(a, b))
                data.append({"index": k, "label": "1" if p > 0.5 else "0", "probs": [1.0 - p, p], "num_classes": 2})
            return web.json_response({"id": f"classify-{time.monotonic_ns()}", "object": "list",
                                      "created": int(time.time()), "model": self.model, "data": data})
        finally:
            self._track(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description="Fake TinyV verifier / DARLING classifier server (127.0.0.1).")
    parser.add_argument("kind", choices=("verifier", "classifier"))
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--model", default=None, help="served model name")
    args = parser.parse_args()
    kwargs = {"port": args.port, "latency_s": args.latency, **({"model": args.model} if args.model else {})}
    server = FakeVerifierServer(**kwargs) if args.kind == "verifier" else FakeClassifierServer(**kwargs)

    async def serve() -> None:
        await server.start()
        print(f"READY {server.url}/v1", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()

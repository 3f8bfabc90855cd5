"""Run a local test server in a thread of this process, for synchronous callers (tests, benchmarks).

:func:`serve_in_thread` takes either kind this project's tests use:

* an asyncio server with ``async start()`` / ``async stop()`` (the fake judge of :mod:`.judge_server`, the fake
  verifier and classifier of :mod:`.fake_servers`): run on an event loop of its own;
* a stdlib ``socketserver`` server (``http.server.ThreadingHTTPServer`` with a :class:`QuietHandler`): its
  ``serve_forever``.

Either way the server is stopped and its socket closed when the ``with`` block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

Server = TypeVar("Server")


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A stdlib request handler that logs nothing (pytest would show every request) and answers with :meth:`reply`."""

    def reply(self, status: int, body: Any) -> None:
        """Answer ``status`` with ``body``: bytes as they are, anything else as JSON."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        if not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_in_thread(server: Server) -> Iterator[Server]:
    """Run ``server`` in a daemon thread until the block ends (module docstring)."""
    if isinstance(server, socketserver.BaseServer):
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
        return
    loop = asyncio.new_event_loop()
    started = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            started.set()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=run, name=f"fake-{type(server).__name__}", daemon=True)
    thread.start()
    if not started.wait(timeout=30) or errors:
        raise RuntimeError(f"{type(server).__name__} did not start: {errors[0] if errors else 'timeout'}")
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

"""Starting ``runner.py`` for one run: through a zygote (a forked copy of a runner that has already started and
imported everything; the default) or as a new interpreter each time (``direct``: the fallback where pidfds are
missing, Linux < 5.3).

Both give the service the same handle: the runner's stdout/stderr readers, an event set when the runner exits (not
when its pipes close: asyncio's ``Process.wait()`` in 3.11 also waits for every pipe, which a stray process of an
unnamespaced run could delay), ``kill()`` and ``close()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER_PATH = os.path.join(HERE, "runner.py")
RUNNER_ARGV = [sys.executable, "-I", "-S", "-B", RUNNER_PATH]
ZYGOTE_STATUS_FD = 3


class LaunchError(RuntimeError):
    pass


@dataclass
class Launched:
    """A started runner."""

    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    exited: asyncio.Event
    _kill: Any
    _cleanup: list[Any] = field(default_factory=list)
    _writer: asyncio.StreamWriter | None = None

    async def send_spec(self, spec: bytes) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._writer.write(spec)
            await self._writer.drain()
        self._writer.close()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            self._kill()

    def close(self) -> None:
        for step in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                step()
        self._cleanup.clear()


async def _reader(loop: asyncio.AbstractEventLoop, fd: int, cleanup: list) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=1 << 16, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                os.fdopen(fd, "rb", 0))
    cleanup.append(transport.close)
    return reader


async def _writer(loop: asyncio.AbstractEventLoop, fd: int, cleanup: list) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(lambda: asyncio.streams.FlowControlMixin(loop=loop),
                                                       os.fdopen(fd, "wb", 0))
    cleanup.append(transport.close)
    return asyncio.StreamWriter(transport, protocol, None, loop)


class ZygoteLauncher:
    """One long-lived zygote process per service; ``launch`` asks it for a runner over a Unix socket."""

    name = "zygote"

    def __init__(self) -> None:
        self.restarts = 0
        self.closed = False
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        if not hasattr(os, "pidfd_open"):
            raise LaunchError("os.pidfd_open is missing (Python < 3.9 or not Linux)")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen([*RUNNER_ARGV, "--zygote", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env={},
                                         start_new_session=True)
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours

    def stop(self) -> None:
        self.closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        if self.sock is not None:
            self.sock.close()  # the zygote reads end-of-file and exits
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    async def launch(self, status_w: int) -> tuple[Launched, int]:
        """Returns the handle and the status fd number the runner sees."""
        loop = asyncio.get_running_loop()
        if self.closed:
            raise LaunchError("the service is stopping")
        if self.proc is None or self.proc.poll() is not None:
            async with self._lock:  # killed from outside: start a new one
                if self.proc is None or self.proc.poll() is not None:
                    self._shutdown()
                    self.start()
                    self.restarts += 1
        spec_r, spec_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            async with self._lock:  # one request, one answer on the socket
                socket.send_fds(self.sock, [b"run\n"], [spec_r, out_w, err_w, status_w])
                readable = loop.create_future()
                loop.add_reader(self.sock.fileno(), lambda: readable.done() or readable.set_result(None))
                try:
                    await asyncio.wait_for(readable, 30)
                finally:
                    loop.remove_reader(self.sock.fileno())
                data, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
        except BaseException:
            for fd in (spec_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (spec_r, out_w, err_w):
                os.close(fd)
        if not data.endswith(b"\n") or len(fds) != 1:
            for fd in (*fds, spec_w, out_r, err_r):
                os.close(fd)
            raise LaunchError(f"the zygote answered {data[:200]!r}")
        pidfd = fds[0]
        cleanup: list[Any] = [lambda: os.close(pidfd)]
        exited = asyncio.Event()
        loop.add_reader(pidfd, exited.set)  # a pidfd becomes readable when its process exits
        cleanup.append(lambda: loop.remove_reader(pidfd))
        launched = Launched(stdout=await _reader(loop, out_r, cleanup), stderr=await _reader(loop, err_r, cleanup),
                            exited=exited, _kill=lambda: signal.pidfd_send_signal(pidfd, signal.SIGKILL),
                            _cleanup=cleanup)
        launched._writer = await _writer(loop, spec_w, cleanup)
        return launched, ZYGOTE_STATUS_FD


class _RunnerProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class DirectLauncher:
    """A new runner interpreter per run (about 30 ms more CPU per run than the zygote)."""

    name = "direct"
    restarts = 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def launch(self, status_w: int) -> tuple[Launched, int]:
        loop = asyncio.get_running_loop()
        pipe = asyncio.subprocess.PIPE
        transport, protocol = await loop.subprocess_exec(
            lambda: _RunnerProtocol(limit=1 << 16, loop=loop), *RUNNER_ARGV, stdin=pipe, stdout=pipe, stderr=pipe,
            pass_fds=(status_w,), env={}, start_new_session=True)
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        launched = Launched(stdout=proc.stdout, stderr=proc.stderr, exited=protocol.exited, _kill=proc.kill,
                            _cleanup=[transport.close])
        launched._writer = proc.stdin
        return launched, status_w

"""Start a real sandbox service (a subprocess on 127.0.0.1) for tests and benchmarks, and talk to it.

    with running_service("--max-concurrency", "2") as service:
        status, body = service.post("/test_program", {"program": "...", "tests": ["assert ..."]})
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openrlhf_classmate
from openrlhf_classmate.ports import free_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(openrlhf_classmate.__file__)))


@dataclass
class ServiceHandle:
    url: str
    port: int
    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, Any]:
        return _request(urllib.request.Request(self.url + path), timeout)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None, content_type: str = "application/json",
             timeout: float = 120.0) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": content_type})
        return _request(req, timeout)

    def health(self) -> dict[str, Any]:
        status, body = self.get("/health")
        if status != 200:
            raise RuntimeError(f"/health answered {status}: {body}")
        return body


def _request(req: urllib.request.Request, timeout: float) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def start_service(*flags: str, env: dict[str, str] | None = None, ready_timeout: float = 60.0) -> ServiceHandle:
    """Start ``python -m openrlhf_classmate.sandbox`` on a free port; returns once /health answers."""
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="sandbox-service-", suffix=".log")
    full_env = dict(os.environ if env is None else env)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, full_env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "openrlhf_classmate.sandbox", "--host", "127.0.0.1", "--port",
                             str(port), *flags], stdout=fd, stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True, cwd=REPO_ROOT)
    os.close(fd)
    handle = ServiceHandle(f"http://127.0.0.1:{port}", port, proc, log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the sandbox service exited with status {proc.returncode}:\n{handle.log()}")
        with contextlib.suppress(OSError):
            if handle.get("/health", timeout=2)[0] == 200:
                return handle
        time.sleep(0.1)
    stop_service(handle)
    raise RuntimeError(f"the sandbox service did not answer /health within {ready_timeout} s:\n{handle.log()}")


def stop_service(handle: ServiceHandle, timeout: float = 30.0) -> int:
    """SIGTERM, wait (the service kills its runs and removes its cgroups), SIGKILL as a last resort."""
    if handle.proc.poll() is None:
        handle.proc.send_signal(signal.SIGTERM)
        try:
            handle.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(handle.proc.pid, signal.SIGKILL)
            handle.proc.wait()
    return handle.proc.returncode


@contextlib.contextmanager
def running_service(*flags: str, env: dict[str, str] | None = None) -> Iterator[ServiceHandle]:
    handle = start_service(*flags, env=env)
    try:
        yield handle
    finally:
        stop_service(handle)
        with contextlib.suppress(OSError):
            os.unlink(handle.log_path)

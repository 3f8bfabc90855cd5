"""Running the end-to-end subprocesses of the tests (launcher, demo, benchmarks) under a progress watchdog.

A fixed time limit fails a healthy run on a loaded machine (every stage slows down with the load: the demo fixture's
fixed 1200 s limit did). A run is therefore killed when it stops making progress: when its output has not grown
for ``quiet`` seconds (a hung collective, a deadlocked actor); the hard ``timeout`` is a backstop far above any
normal duration. Everything the run prints goes to a log file, which is also what the watchdog watches."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from openrlhf_classmate.integration.launch.build_locks import build_locks

TIMEOUT_EXIT = 124  # as timeout(1)
QUIET = 900.0  # s without a new byte of output; the launcher prints every step, the demo every stage and step
HARD_TIMEOUT = 7200.0  # s; normal runs take 1 to 3 minutes on two idle cores


def run_watched(cmd: list[str], log_path: str, cwd: str | None = None, env: dict[str, str] | None = None,
                quiet: float = QUIET, timeout: float | None = HARD_TIMEOUT, grace: float = 15.0,
                until: Callable[[], str | None] | None = None) -> int:
    """Run ``cmd`` in its own process session, stdout and stderr to ``log_path``; returns its exit code.

    The whole session (the command, its local Ray cluster, engine processes) is killed when the log has not grown for
    ``quiet`` seconds, or after ``timeout`` seconds in all (``None``: no hard limit); then a line saying which is
    appended to the log, the JIT build locks the killed processes held are removed, and the result is
    :data:`TIMEOUT_EXIT`. ``until`` (called at every poll) ends the run early as a success: when it returns a reason
    (e.g. "the steps to measure are logged"), the session is stopped the same way, the reason logged, and the result
    is 0."""
    started = time.time()
    poll = max(0.05, min(1.0, quiet / 5, timeout / 5 if timeout is not None else 1.0))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        size, last_progress = 0, started
        while True:
            try:
                return proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            grown = os.fstat(log.fileno()).st_size
            if grown != size:
                size, last_progress = grown, now
            done = until() if until is not None else None
            result = 0 if done else TIMEOUT_EXIT
            if done:
                reason = f"stopped: {done}"
            elif now - last_progress > quiet:
                reason = f"killed after {quiet} s without output (no progress)"
            elif timeout is not None and now - started > timeout:
                reason = f"killed after {timeout} s (timeout)"
            else:
                continue
            removed = stop_session(proc, since=started, grace=grace)
            log.write(f"\n[watchdog] {reason}\n")
            for lock in removed:
                log.write(f"[watchdog] removed the build lock {lock} left by the killed session\n")
            log.flush()
            return result


def release_build_locks(since: float) -> list[str]:
    """Remove the torch-extension JIT build locks created since ``since`` (by builders of a session just killed).

    DeepSpeed builds its ops (FusedAdam, CPUAdam, ...) with ``torch.utils.cpp_extension``, which guards a build with
    a ``lock`` file and makes every later build of that op wait while the file exists; a build killed half-way
    leaves it behind, and every later run would hang. Only locks newer than the killed run are touched."""
    removed = []
    for lock, mtime in build_locks():
        if mtime >= since - 1:
            try:
                os.remove(lock)
                removed.append(lock)
            except OSError:
                pass
    return removed


def stop_session(proc, since: float, grace: float = 15.0) -> list[str]:
    """Kill the process session led by ``proc`` (:func:`kill_session`), then remove the JIT build locks created since
    ``since``, its start, which its killed builders may have left (:func:`release_build_locks`); returns those."""
    kill_session(proc, grace=grace)
    return release_build_locks(since=since)


def kill_session(proc, grace: float = 15.0) -> None:
    """SIGTERM the process session led by ``proc`` (started with ``start_new_session=True``), then SIGKILL what is
    left of it after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

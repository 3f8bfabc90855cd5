"""math-verify in worker processes, with a hard per-item time limit.

math-verify hands answers to sympy, and some LaTeX (``9^{9^{9^{9}}}``, huge factorials) makes sympy run for hours,
often inside C code where no signal or thread can interrupt it. math-verify's own ``signal.alarm`` timeout only works
in a process's main thread and turns a timeout into a silent ``False``. So every item runs in a worker process of our
own; the parent gives one item at a time to each worker, and if an item is not done after ``timeout_s`` the worker is
killed (SIGKILL), the item is reported as timed out, and a fresh worker is started in its place. Only the stuck
worker is replaced: the other workers keep their items (unlike ``ProcessPoolExecutor``, where killing one process
breaks the whole pool and every pending future with it).

Workers are started with "spawn" (or "forkserver"), never "fork": the Ray controller and the judge client run
threads, and forking a process that has threads can deadlock the child.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from openrlhf_classmate.scoring.boxes import final_answer_text

logger = logging.getLogger(__name__)


def _default_num_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@dataclass
class MathVerifyConfig:
    """Settings of the math-verify worker pool."""

    num_workers: int = field(default_factory=_default_num_workers)
    """Worker processes verifying in parallel. Default: min(4, CPU count)."""
    timeout_s: float = 5.0
    """Per-item time limit in seconds. An item still running after it is killed with its worker and scored invalid
    (``reason="math-verify timed out after 5s"``)."""
    start_method: str = "spawn"
    """multiprocessing start method: "spawn" or "forkserver". "fork" is refused (forking a process with threads,
    such as the Ray controller, can deadlock the child)."""
    startup_timeout_s: float = 120.0
    """How long a new worker may take to import math-verify and sympy before it is given up on."""

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"MathVerifyConfig.num_workers must be >= 1, got {self.num_workers}")
        if self.timeout_s <= 0:
            raise ValueError(f"MathVerifyConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.start_method not in ("spawn", "forkserver"):
            raise ValueError(
                f"MathVerifyConfig.start_method must be 'spawn' or 'forkserver', got {self.start_method!r}"
            )


@dataclass(frozen=True)
class VerifyOutcome:
    """What a worker said about one (ground truth, response) pair."""

    equal: bool | None
    """Whether the response's answer equals the ground truth; None when verification failed (see ``error``)."""
    extracted: str | None = None
    """The answer math-verify extracted from the response (None if it found none)."""
    error: str | None = None
    """Why verification failed: timeout, worker crash, unparseable ground truth."""


# ---------------------------------------------------------------------------------------------------------------
# Worker side (runs in the child process)


def _as_gold_text(ground_truth: str) -> str:
    # Ground truths are bare answers ("\frac{1}{2}", "[1,3)"); math-verify extracts from delimited math, and a box is
    # the delimiter that keeps inner "$" (as in "\$5") and commas intact.
    return ground_truth if "\\boxed" in ground_truth else f"\\boxed{{{ground_truth}}}"


def verify_pair(ground_truth: str, response: str) -> VerifyOutcome:
    """Parse both sides with math-verify and compare them; no time limit (the pool provides it)."""
    from math_verify import parse, verify

    # Timeouts disabled: math-verify's signal.alarm would turn a timeout into a silent False.
    gold = parse(_as_gold_text(ground_truth), parsing_timeout=None)
    if not gold:
        return VerifyOutcome(equal=None, error=f"math-verify could not parse the ground truth {ground_truth!r:.200}")
    several = bool(getattr(gold[0], "is_FiniteSet", False)) and len(gold[0]) > 1
    pred = parse(final_answer_text(response, several), parsing_timeout=None)
    if not pred:
        return VerifyOutcome(equal=False, extracted=None)
    equal = bool(verify(gold, pred, timeout_seconds=None))
    # parse() returns [sympy object, matched string]; the string is the readable form of the model's answer.
    extracted = pred[-1] if isinstance(pred[-1], str) else str(pred[-1])
    return VerifyOutcome(equal=equal, extracted=extracted)


def _worker_main(conn: Connection) -> None:
    try:
        # math-verify warns once that its own timeouts are off; the parent's kill-on-timeout replaces them.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        # Import and exercise the parser now (sympy and the LaTeX grammar load lazily, ~1 s), so that an item's time
        # limit never pays for it.
        verify_pair("1", "\\boxed{1}")
    except BaseException as e:  # noqa: BLE001
        conn.send(("failed", f"math-verify failed to load ({type(e).__name__}: {e}); is math-verify installed?"))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):  # parent went away
            return
        if job is None:
            return
        try:
            outcome = verify_pair(*job)
        except Exception as e:  # noqa: BLE001
            outcome = VerifyOutcome(equal=None, error=f"math-verify raised {type(e).__name__}: {e}"[:300])
        conn.send(("done", outcome))


# ---------------------------------------------------------------------------------------------------------------
# Parent side


def main_guard_hint(start_method: str) -> str:
    """Why a worker that died while starting most likely did: spawn re-runs the caller's main script in the child,
    and a script that scores at import time, without an ``if __name__ == "__main__":`` guard, makes the child start
    workers of its own, which multiprocessing refuses (the child exits with code 1)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file:
        return ""
    try:
        with open(main_file, encoding="utf-8", errors="replace") as f:
            guarded = "__main__" in f.read()
    except OSError:
        guarded = True
    if guarded:
        return (f"; workers are started with {start_method!r}, which re-imports the main script {main_file}: code "
                "that scores at import time must sit under `if __name__ == \"__main__\":`")
    return (f"; {main_file} has no `if __name__ == \"__main__\":` guard: workers are started with {start_method!r}, "
            "which re-imports the main script, and its scoring code then runs again in every worker. Put the "
            "script's code under that guard")


class _Worker:
    def __init__(self, ctx: multiprocessing.context.BaseContext):
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child_conn,), name="math-verify-worker", daemon=True)
        self.proc.start()
        child_conn.close()  # the parent keeps only its end, so a dead child shows up as EOF
        self.started_at = time.monotonic()
        self.ready = False
        self.job: int | None = None  # index of the item it is working on
        self.deadline = 0.0

    def stop(self, *, graceful: bool) -> None:
        if graceful and self.proc.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5.0)
        self.conn.close()


class MathVerifyPool:
    """A fixed-size set of math-verify worker processes with a hard per-item time limit.

    ``verify(pairs)`` is synchronous and thread-safe (batches from several threads run one after the other); the
    async scorers call it through ``asyncio.to_thread``. Workers start on first use and live until ``shutdown()``.
    """

    def __init__(self, config: MathVerifyConfig | None = None):
        self.config = config or MathVerifyConfig()
        self._ctx = multiprocessing.get_context(self.config.start_method)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.restarts = 0
        """Workers replaced so far (after a timeout, a crash or a failed start)."""

    def __enter__(self) -> MathVerifyPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self, timeout_s: float | None = None) -> bool:
        """Start the workers now and wait until they are ready (at most ``timeout_s``, default the startup limit),
        so that the first batch does not wait for imports. Returns whether all are ready."""
        with self._lock:
            if self._closed:
                raise RuntimeError("MathVerifyPool was shut down")
            while len(self._workers) < self.config.num_workers:
                self._workers.append(_Worker(self._ctx))
            end = time.monotonic() + (self.config.startup_timeout_s if timeout_s is None else timeout_s)
            while not all(w.ready for w in self._workers) and time.monotonic() < end:
                waiting = {w.conn: w for w in self._workers if not w.ready}
                for conn in wait(list(waiting), timeout=max(0.0, end - time.monotonic())):
                    try:
                        kind, _ = conn.recv()
                    except (EOFError, OSError):
                        kind = "died"
                    if kind == "ready":
                        waiting[conn].ready = True
                    else:
                        return False  # leave the restart policy to verify()
            return all(w.ready for w in self._workers)

    def verify(self, pairs: Sequence[tuple[str, str]]) -> list[VerifyOutcome]:
        """Verify ``(ground_truth, response)`` pairs; one outcome per pair, in order. Never hangs past the limits."""
        if not pairs:
            return []
        with self._lock:
            if self._closed:
                raise RuntimeError("MathVerifyPool was shut down; create a new one (or call scoring.get_math_pool())")
            return self._run(pairs)

    def shutdown(self) -> None:
        """Stop all workers. Safe to call twice."""
        with self._lock:
            self._closed = True
            for w in self._workers:
                w.stop(graceful=w.ready)
            self._workers = []

    def _replace(self, worker: _Worker) -> None:
        worker.stop(graceful=False)
        self._workers[self._workers.index(worker)] = _Worker(self._ctx)
        self.restarts += 1

    def _run(self, pairs: Sequence[tuple[str, str]]) -> list[VerifyOutcome]:
        cfg = self.config
        while len(self._workers) < cfg.num_workers:
            self._workers.append(_Worker(self._ctx))
        results: list[VerifyOutcome | None] = [None] * len(pairs)
        todo = deque(range(len(pairs)))
        failed_starts = 0
        last_start_error = "worker exited before it was ready"

        while todo or any(w.job is not None for w in self._workers):
            now = time.monotonic()
            for w in list(self._workers):
                if todo and w.ready and w.job is None:
                    w.job, w.deadline = todo.popleft(), now + cfg.timeout_s
                    try:
                        w.conn.send(pairs[w.job])
                    except OSError:  # it died while idle: the item goes back to the queue
                        todo.appendleft(w.job)
                        failed_starts += 1
                        self._replace(w)

            deadlines = [w.deadline for w in self._workers if w.job is not None]
            deadlines += [w.started_at + cfg.startup_timeout_s for w in self._workers if not w.ready]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            by_conn = {w.conn: w for w in self._workers}
            for conn in wait(list(by_conn), timeout=timeout):
                w = by_conn[conn]
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    w.proc.join(timeout=1.0)  # reap it, so that the exit code (e.g. -9 after an OOM kill) is known
                    kind, payload = "died", f"math-verify worker died (exit code {w.proc.exitcode})"
                    if not w.ready and w.proc.exitcode == 1:
                        payload += main_guard_hint(cfg.start_method)
                if kind == "ready":
                    w.ready = True
                elif kind == "done":
                    results[w.job] = payload
                    w.job = None
                else:  # "failed" (could not import) or "died"
                    if w.job is not None:
                        results[w.job] = VerifyOutcome(equal=None, error=payload)
                    elif not w.ready:
                        failed_starts += 1
                        last_start_error = payload
                    self._replace(w)

            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    # A stuck item cannot be interrupted inside sympy: kill the whole worker.
                    results[w.job] = VerifyOutcome(equal=None, error=f"math-verify timed out after {cfg.timeout_s:g}s")
                    self._replace(w)
                elif not w.ready and now >= w.started_at + cfg.startup_timeout_s:
                    failed_starts += 1
                    last_start_error = f"worker not ready after {cfg.startup_timeout_s:g}s"
                    self._replace(w)

            if todo and failed_starts >= 2 * cfg.num_workers and not any(w.ready for w in self._workers):
                logger.error("math-verify workers keep failing to start: %s", last_start_error)
                while todo:
                    results[todo.popleft()] = VerifyOutcome(
                        equal=None, error=f"math-verify workers failed to start: {last_start_error}"
                    )
        return results  # type: ignore[return-value]  # every slot is filled once the loop ends


# ---------------------------------------------------------------------------------------------------------------
# The process-wide pool

_pool: MathVerifyPool | None = None
_pool_config: MathVerifyConfig | None = None
_pool_lock = threading.Lock()


def configure_math_verify(config: MathVerifyConfig) -> None:
    """Set the config of the process-wide pool; a running pool with another config is shut down first."""
    global _pool, _pool_config
    with _pool_lock:
        if _pool is not None and _pool.config != config:
            _pool.shutdown()
            _pool = None
        _pool_config = config


def get_math_pool() -> MathVerifyPool:
    """The process-wide pool, created (workers not yet started) on first call."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = MathVerifyPool(_pool_config)
        return _pool


def shutdown() -> None:
    """Stop the process-wide pool's workers (a later ``get_math_pool()`` makes a new one)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown()
            _pool = None


atexit.register(shutdown)

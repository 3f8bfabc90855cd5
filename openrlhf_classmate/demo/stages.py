"""Resumable stages (the GPU demo): every stage ends by writing its marker file ``stages/<name>.done`` (JSON, written
last and atomically), and a stage with a marker is never run again. One call of the demo runs the stages that are
not done, in order, each only when its estimated time fits in what is left of ``--budget-s``; the first that does not
fit ends the call with the list of what is left (exit code :data:`EXIT_UNFINISHED`), and the same command run again
goes on from there.

A stage that can stop part-way and resume (the RL stages: DeepSpeed checkpoints) declares ``min_part_s`` (its
start-up and one checkpoint's worth of steps): when the whole of it could never fit in one call, it starts once the
time left does at least half of what a fresh call would, and stops at a checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

EXIT_UNFINISHED = 75  # EX_TEMPFAIL: stages are left, run the same command again
EXIT_FAILED = 1  # a stage failed: one line names it and its log; the same command again starts at it
MARKERS = "stages"


class StageFailed(RuntimeError):
    """A stage that failed; its message names the log that says why (``log_path``)."""

    def __init__(self, message: str, log_path: str | None = None):
        super().__init__(message)
        self.log_path = log_path


def failure_line(name: str, error: BaseException, trace: str | None = None) -> tuple[list[str], str]:
    """(the detail lines of ``error``'s message after its first, the one line that says stage ``name`` failed);
    with ``trace``, the file its traceback was kept in (:func:`keep_traceback`), named with the error's type."""
    first, *detail = (str(error) or type(error).__name__).splitlines()
    first = re.sub(r";?\s*tail:\s*$", "", first.removeprefix("error: "))  # the launcher's tail follows as detail
    if trace:  # e.g. a KeyError's message alone is a bare key
        first = f"{type(error).__name__}: {first} (traceback: {trace})"
    return detail, (f"error: stage {name} failed: {first}; run the same command again to go on from stage {name} "
                    "(the stages before it are done)")


def keep_traceback(out: str, name: str, error: BaseException) -> str | None:
    """Write ``error``'s traceback to ``stages/<name>.log`` where the error names no log of its own (a stage that
    ran in this process: the report, a parallel stage's bookkeeping); return that path, or None."""
    if isinstance(error, SystemExit) or getattr(error, "log_path", None) or "(log: " in str(error):
        return None  # a one-line refusal, or a failure whose message already names the log that says why
    path = os.path.join(out, MARKERS, f"{name}.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(error)))
    return path


def marker_path(out: str, name: str) -> str:
    return os.path.join(out, MARKERS, f"{name}.done")


def is_done(out: str, name: str) -> bool:
    return os.path.isfile(marker_path(out, name))


def read_marker(out: str, name: str) -> dict:
    with open(marker_path(out, name), encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, data) -> None:
    """Write ``path`` atomically (a reader sees the old file or the whole new one, never a part)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def mark_done(out: str, name: str, info: dict) -> None:
    write_json(marker_path(out, name), info)


def read_json(path: str, default):
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass
class Stage:
    name: str
    title: str
    estimate_s: Callable[[], float]
    """Seconds expected for what is left of the stage."""
    run: Callable[[float], bool]
    """``run(deadline)`` (a ``time.time()`` value): True when the stage is done (it has written its marker), False
    when it stopped with work left (a part-way stage at the deadline)."""
    min_part_s: float | None = None
    """For a stage that can stop part-way and resume: the least time worth starting it with."""


def decide(estimate_s: float, left_s: float, budget_s: float, min_part_s: float | None) -> str:
    """``run`` (it fits in ``left_s``), ``part`` (it could never fit in a call of ``budget_s``, and what is left now
    does at least half the work past ``min_part_s`` that a fresh call would: each part pays the start-up again) or
    ``wait`` (leave it to the next call, which starts with the whole budget)."""
    if estimate_s <= left_s:
        return "run"
    if (min_part_s is not None and estimate_s > budget_s and left_s >= min_part_s
            and left_s - min_part_s >= 0.5 * (budget_s - min_part_s)):
        return "part"
    return "wait"


def _fmt(seconds: float) -> str:
    if math.isinf(seconds):
        return "unlimited"
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"


class Timings:
    """Wall seconds per stage and call (``stages/timings.json``), kept across calls."""

    def __init__(self, out: str):
        self.path = os.path.join(out, MARKERS, "timings.json")
        self.data: dict = read_json(self.path, {})
        self._lock = threading.Lock()  # the stages of the GPU demo's parallel mode measure from several threads

    def add(self, name: str, seconds: float) -> None:
        self.measure(name, seconds=seconds)

    def measure(self, name: str, **values: float | None) -> None:
        with self._lock:
            entry = self.data.setdefault(name, {})
            for key, value in values.items():
                if value is not None:
                    entry.setdefault(key, []).append(round(value, 3))
            write_json(self.path, self.data)

    def total(self, name: str) -> float:
        """Every call's seconds of stage ``name``, its failed attempts included (the device time it took)."""
        entry = self.data.get(name, {})
        return sum(entry.get("seconds", [])) + sum(entry.get("failed_seconds", []))

    def last(self, name: str, key: str) -> float | None:
        values = self.data.get(name, {}).get(key)
        return values[-1] if values else None


def run_stages(stages: list[Stage], out: str, budget_s: float, timings: Timings, *, margin_s: float = 10.0,
               log: Callable[[str], None] = print, on_stage_end: Callable[[], None] = lambda: None) -> int:
    """Run the stages that are not done while they fit; 0 when all are done, else :data:`EXIT_UNFINISHED`, or
    :data:`EXIT_FAILED` after one line naming the stage that failed and its log (its marker is not written, so the
    same command again starts at it).
    ``on_stage_end`` is called after each stage that ran, done or stopped (the GPU demo records what it wrote)."""
    t0 = time.time()
    todo = [s for s in stages if not is_done(out, s.name)]
    done = [s.name for s in stages if is_done(out, s.name)]
    if done:
        log(f"already done (not run again): {', '.join(done)}")
    if not todo:
        log("every stage is done")
        return 0
    log("estimated time left: " + ", ".join(f"{s.name} ~{_fmt(s.estimate_s())}" for s in todo)
        + f"  (~{_fmt(sum(s.estimate_s() for s in todo))} in all; --budget-s {_fmt(budget_s)})")
    for i, stage in enumerate(todo):
        left = budget_s - (time.time() - t0) - margin_s
        estimate = stage.estimate_s()
        verdict = decide(estimate, left, budget_s - margin_s, stage.min_part_s)
        if verdict == "wait":
            rest = todo[i:]
            log(f"\nstopping before '{stage.name}': it needs ~{_fmt(estimate)}, {_fmt(max(0.0, left))} left of "
                f"--budget-s. Left: " + ", ".join(f"{s.name} ~{_fmt(s.estimate_s())}" for s in rest)
                + f" (~{_fmt(sum(s.estimate_s() for s in rest))}). Run the same command again to go on.")
            return EXIT_UNFINISHED
        log(f"\n[{stage.name}] {stage.title}  (estimate ~{_fmt(estimate)}"
            f"{', a part of it: it stops at a checkpoint' if verdict == 'part' else ''})")
        started = time.time()
        try:
            finished = stage.run(t0 + budget_s - margin_s)
        except (Exception, SystemExit) as e:  # noqa: BLE001  (a child stage's exit included; not Ctrl-C)
            # apart from "seconds", which the next call's estimate reads: a failure's time is no estimate
            timings.measure(stage.name, failed_seconds=time.time() - started)
            on_stage_end()
            detail, message = failure_line(stage.name, e, keep_traceback(out, stage.name, e))
            for text in detail:  # e.g. the launcher log's last lines
                log(f"  {text}")
            log(message)
            return EXIT_FAILED
        seconds = time.time() - started
        timings.add(stage.name, seconds)
        on_stage_end()
        log(f"[{stage.name}] {'done' if finished else 'stopped, work left'} in {_fmt(seconds)} "
            f"(estimate was ~{_fmt(estimate)})")
        if not finished:
            rest = todo[i:]
            log("Left: " + ", ".join(f"{s.name} ~{_fmt(s.estimate_s())}" for s in rest)
                + f" (~{_fmt(sum(s.estimate_s() for s in rest))}). Run the same command again to go on.")
            return EXIT_UNFINISHED
    log("every stage is done")
    return 0

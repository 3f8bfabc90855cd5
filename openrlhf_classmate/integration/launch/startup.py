"""The start-up breakdown of a run: where the time before the first step goes.

A run spends minutes before its first step (Ray, each engine group's start with its CUDA graphs, the actor/ref models'
load and DeepSpeed set-up), and for a small model more than its first steps take. The launcher times its own phases
in the driver (:class:`StartupClock`), hands them to the controller, which adds the models' load (hand-over to
``fit`` start) and step 1, and at the end of step 1 logs them once as ``startup/*`` metrics (tensorboard,
wandb, the step line: ``bench/step_time.py`` reads ``startup/first_step_s``) and as one line:

    start-up: launcher 7.1 s (imports 2.9, preflight 1.2, upstream imports 2.6, kv plan 0.3), ray 3.0 s, policy
    engines 81.2 s, classmate engines 74.9 s, driver setup 0.4 s, models 40.3 s, step 1 22.4 s; first step done
    229.6 s after launch

The launch time travels to the Ray workers in :data:`LAUNCH_ENV` (the launcher passes every ``OPENRLHF_CLASSMATE_*``
variable), so the controller measures "after launch" on the same clock even when the driver is another process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

LAUNCH_ENV = "OPENRLHF_CLASSMATE_LAUNCH_TIME"
# the phases in the order they happen, as they appear in the line and under startup/<name>_s
# (engines_ready: where the models load while the engines start, the wait at fit for the engines still starting)
PHASES = ("launcher", "ray", "policy_engines", "classmate_engines", "driver_setup", "models", "engines_ready",
          "step_1")
# the launcher phase's parts (seconds["launcher_<part>"], startup/launcher_<part>_s), which the line shows inside it:
# Python's imports up to main(), the parsing and preflight, the import of upstream's launcher (vLLM, DeepSpeed), the
# KV-cache plan (the GPU's memory asked), the start of vLLM's model inspection ahead of the engines (its thread)
LAUNCHER_PARTS = ("imports", "preflight", "upstream_imports", "kv_plan", "inspection")


def process_start_time() -> float:
    """When this process started (wall clock), so that Python's imports count; now if that cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001  (psutil missing or the process table unreadable: the imports go uncounted)
        return time.time()


def mark_launch() -> float:
    """The launch time of this run: set once, in the launcher's process, before Ray starts (a wrapper that set
    :data:`LAUNCH_ENV` earlier keeps its own)."""
    if LAUNCH_ENV not in os.environ:
        os.environ[LAUNCH_ENV] = repr(process_start_time())
    return launch_time()


def launch_time() -> float | None:
    try:
        return float(os.environ[LAUNCH_ENV])
    except (KeyError, ValueError):
        return None


class StartupClock:
    """Seconds of each named phase, measured where it runs (the driver's phases; the controller adds its own)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0

    def hand_over(self) -> dict:
        """What the driver passes to the controller as it creates it: its phases, with ``driver_setup`` the rest of
        its time since launch (upstream's strategy, placement groups and actor groups), and the moment of the hand-
        over, from which the controller counts ``models`` (its own start, the actor/ref load, the engines' start
        where it runs in the background) up to ``fit``. The phases so add up to the time of step 1's end."""
        now = time.time()
        launched = launch_time() or now
        phases = sum(s for name, s in self.seconds.items() if name in PHASES)  # the launcher's parts lie inside it
        self.seconds["driver_setup"] = max(0.0, now - launched - phases)
        return {"seconds": dict(self.seconds), "handed_over": now}


def breakdown(seconds: dict[str, float], first_step_done: float | None) -> dict[str, float]:
    """``startup/<phase>_s`` for each measured phase, and ``startup/first_step_s``: launch to the end of step 1."""
    out = {f"startup/{name}_s": round(seconds[name], 2) for name in PHASES if name in seconds}
    out.update({f"startup/launcher_{part}_s": round(seconds[f"launcher_{part}"], 2) for part in LAUNCHER_PARTS
                if f"launcher_{part}" in seconds})
    launched = launch_time()
    if launched is not None and first_step_done is not None:
        out["startup/first_step_s"] = round(first_step_done - launched, 2)
    return out


def summary_line(metrics: dict[str, float]) -> str:
    parts = [f"{name.replace('_', ' ')} {metrics[f'startup/{name}_s']:.1f} s" for name in PHASES
             if f"startup/{name}_s" in metrics]
    inside = [f"{part.replace('_', ' ')} {metrics[f'startup/launcher_{part}_s']:.1f}" for part in LAUNCHER_PARTS
              if f"startup/launcher_{part}_s" in metrics]
    if inside and parts and "startup/launcher_s" in metrics:
        parts[0] += f" ({', '.join(inside)})"
    done = metrics.get("startup/first_step_s")
    return "start-up: " + ", ".join(parts) + (f"; first step done {done:.1f} s after launch" if done is not None
                                              else "")

"""The GPU demo's RL stage, resumable: the launcher writes a DeepSpeed checkpoint every ``save_every`` steps and
resumes from the newest complete one (``--ckpt.load_enable``); when the call's time is nearly up, the run is stopped
right after a checkpoint and the next call goes on from there.

The launcher runs in its own process session (``testing.e2e.stop_session`` ends it with its Ray and engine
processes). Its output is appended to ``<run_dir>/launcher.log``; every ``Global step`` line is parsed and appended
to ``<run_dir>/steps.jsonl`` at once, so the metrics of a stopped run are kept even where its tensorboard writer had
not flushed yet. A run is finished when its final model (``<run_dir>/final``) is saved.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from openrlhf_classmate.demo.launch import parse_step_line
from openrlhf_classmate.integration.training.checkpoints import CheckpointError, choose_resume_tag, tag_step

KILL_GRACE_S = 15.0
CHECK_EVERY_S = 0.5  # how often the checkpoint folder is looked at (a listing and a zip directory per file)


@dataclass
class Outcome:
    finished: bool
    step: int
    """The last step kept: the final step when finished, else the step of the newest complete checkpoint."""
    started_at: int
    """The checkpoint step this call resumed from (0: a fresh start)."""
    startup_s: float | None = None
    """From the launch to the end of the first step, less one step: Ray, DeepSpeed and the engines' start."""
    step_s: float | None = None
    """Median wall time between consecutive steps (checkpoint saves included)."""
    stopped: str = ""
    """Why the run was stopped before its end, or ""."""
    step_times: list[float] = field(default_factory=list)


def checkpoint_step(run_dir: str) -> int:
    """The step of the newest complete DeepSpeed checkpoint of ``run_dir`` (0: none)."""
    try:
        choice = choose_resume_tag(os.path.join(run_dir, "ckpt", "_actor"), zero_stage=2)
    except CheckpointError:
        return 0
    return (tag_step(choice.tag) or 0) if choice else 0


def final_saved(run_dir: str) -> bool:
    final = os.path.join(run_dir, "final")
    return os.path.isfile(os.path.join(final, "config.json")) and any(
        n.endswith((".safetensors", ".bin")) for n in os.listdir(final))


def read_steps(run_dir: str) -> dict[int, dict]:
    """``{step: status}`` from ``steps.jsonl`` (a step trained again after a resume: its newest line)."""
    out: dict[int, dict] = {}
    path = os.path.join(run_dir, "steps.jsonl")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    out[int(row.pop("step"))] = row
    return out


def stop_reason(ckpt: int, started_at: int, steps: int, save_every: int, step_s: float, left_s: float,
                max_new_steps: int | None) -> str:
    """Why a run that has just written the checkpoint of step ``ckpt`` stops there ("" to go on): it took
    ``max_new_steps`` new steps, or the next checkpoint (``save_every`` steps of ``step_s``) would come after the
    ``left_s`` seconds left. The last checkpoint never stops a run: the final save follows it."""
    if ckpt >= steps:
        return ""
    if max_new_steps is not None and ckpt - started_at >= max_new_steps:
        return f"{ckpt - started_at} new steps (--rl-steps-per-call {max_new_steps})"
    if save_every * step_s > left_s:
        return f"the next checkpoint (~{save_every * step_s:.0f} s) would not be written in the time left"
    return ""


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run(run_dir: str, argv: list[str], *, steps: int, save_every: int, deadline: float,
        max_new_steps: int | None = None, step_estimate_s: float = 5.0,
        on_step: Callable[[int, dict, float], None] | None = None, kill_grace_s: float = KILL_GRACE_S,
        program: list[str] | None = None, env: dict[str, str] | None = None,
        stop: threading.Event | None = None) -> Outcome:
    """Run or resume the launcher until the run ends, or stop it at the first checkpoint after which the next one
    would not be written in time, or after ``max_new_steps`` new steps. ``deadline`` (a ``time.time()`` value): when
    the launcher must be gone; stopping it takes up to ``kill_grace_s``.

    Past ``deadline - kill_grace_s`` the run is stopped wherever it is (the steps after its last checkpoint are lost).
    Raises ``RuntimeError`` with the log's tail when the launcher fails. ``program``: what runs ``argv`` (default
    the launcher, ``python -m openrlhf_classmate.cli.train_ppo_ray``); ``env``: variables added to its environment; ``stop`` (set by another thread): stop the launcher now (the steps
    after its last checkpoint are lost)."""
    from openrlhf_classmate.testing.e2e import stop_session

    os.makedirs(run_dir, exist_ok=True)
    started_at = checkpoint_step(run_dir)
    actor_dir = os.path.join(run_dir, "ckpt", "_actor")
    cleared = started_at == 0 and os.path.isdir(actor_dir)
    if cleared:  # a first save cut short: nothing to resume from, and the launcher refuses such a folder
        shutil.rmtree(actor_dir)
    command = [*(program or [sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray"]), *argv]
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(command) + "\n")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", RAY_DEDUP_LOGS="0", **(env or {}))
    log_path = os.path.join(run_dir, "launcher.log")
    t0 = time.time()
    outcome = Outcome(finished=False, step=started_at, started_at=started_at)
    with open(log_path, "a") as log, open(os.path.join(run_dir, "steps.jsonl"), "a") as steps_log:
        log.write(f"\n===== launcher started {time.strftime('%Y-%m-%d %H:%M:%S')}, resuming from step "
                  f"{started_at}\n")
        if cleared:
            log.write(f"[demo] removed {actor_dir}: no complete checkpoint in it (a first save was cut short)\n")
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        last_step_at, seen_ckpt, checked_at = None, started_at, 0.0
        try:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    line = ""
                if line is None:  # the launcher closed its output: it is ending
                    proc.wait()
                    break
                if line:
                    log.write(line)
                    parsed = parse_step_line(line)
                    if parsed:
                        step, status = parsed
                        now = time.time()
                        if last_step_at is None:
                            outcome.startup_s = now - t0
                        else:
                            outcome.step_times.append(now - last_step_at)
                        last_step_at = now
                        numbers = {k: v for k, v in status.items() if isinstance(v, (int, float))}
                        steps_log.write(json.dumps({"step": step, **numbers}) + "\n")
                        steps_log.flush()
                        if on_step:
                            on_step(step, status, now - t0)
                now = time.time()
                if now > deadline - kill_grace_s:  # the stop itself may take kill_grace_s
                    outcome.stopped = "the call's time ran out before the next checkpoint"
                    break
                if stop is not None and stop.is_set():
                    outcome.stopped = "stopped: another task failed, or the call was interrupted"
                    break
                if last_step_at is None or now - checked_at < CHECK_EVERY_S:
                    continue
                checked_at, ckpt = now, checkpoint_step(run_dir)
                if ckpt > seen_ckpt:
                    seen_ckpt = ckpt
                    step_s = (statistics.median(outcome.step_times) if outcome.step_times else step_estimate_s)
                    outcome.stopped = stop_reason(ckpt, started_at, steps, save_every, step_s,
                                                  deadline - kill_grace_s - now, max_new_steps)
                    if outcome.stopped:
                        break
        finally:
            if proc.poll() is None:
                for lock in stop_session(proc, since=t0, grace=kill_grace_s):
                    log.write(f"[demo] removed the build lock {lock} left by the stopped launcher\n")
                log.write(f"[demo] launcher stopped: {outcome.stopped or 'interrupted'}\n")
    if outcome.step_times:
        outcome.step_s = statistics.median(outcome.step_times)
        if outcome.startup_s is not None:
            outcome.startup_s = max(0.0, outcome.startup_s - outcome.step_s)
    if outcome.stopped:
        outcome.step = checkpoint_step(run_dir)
        return outcome
    if proc.returncode != 0:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"the launcher exited with {proc.returncode} (log: {log_path}); tail:\n{tail}")
    if not final_saved(run_dir):
        raise RuntimeError(f"the launcher exited without saving {os.path.join(run_dir, 'final')} (log: {log_path})")
    outcome.finished, outcome.step = True, steps
    return outcome

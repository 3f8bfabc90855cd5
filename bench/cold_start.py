"""Start-up on a cold machine, as pairs: the launcher's vLLM model inspection ahead of the engines, on and off.

    python bench/cold_start.py --out DIR [--launches 2] [--budget-s 570] [step_time.py flags ...]

Each launch is ``bench/step_time.py --runs gdpo --steps 2 --fresh`` (the 0.5B-shaped one-GPU classmate run) after
removing vLLM's and Triton's caches (``$VLLM_CACHE_ROOT``, default ``~/.cache/vllm``: the model inspection and the
torch.compile cache; ``~/.triton``), so that every launch starts as on a fresh machine except for the operating
system's page cache. Launches alternate after / before (before: ``OPENRLHF_CLASSMATE_BENCH_NO_INSPECTION=1``, the
launcher's path without the inspection ahead), so the pairs share the machine and its drift. Writes
``DIR/cold_start.json``: per launch the first step's seconds and the start-up phases (``startup_s``), the seconds
between a sleeping engine's ``Enabling cumem allocator`` and ``Resolved architecture`` lines (the inspection inside
the engine: vLLM logs the first line only for an engine in sleep mode, the policy engines here), and per pair the
before - after difference. Extra flags go to ``step_time.py`` (``--tiny --engine hf`` checks the path
on a CPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))

from openrlhf_classmate.integration.rollout.model_inspection import NO_INSPECTION_ENV  # noqa: E402

LAUNCH_ESTIMATE_S = 230  # one cold launch of the 0.5B-shaped run to its second step on one H200 (sections 11, 12)
# an engine actor's lines around vLLM's model inspection (vLLM's own log format: "INFO 11-29 12:24:20 [model.py:..]")
_LINE = re.compile(r"\(CountingRolloutActor pid=(\d+)\).*?(?:INFO|WARNING) (\d\d-\d\d \d\d:\d\d:\d\d) \[[\w.]+:\d+\] "
                   r"(Enabling cumem allocator|Resolved architecture)")


def caches() -> list[str]:
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    return [root, os.path.join(os.path.expanduser("~"), ".triton")]


def inspection_gaps(log_text: str) -> dict[str, float]:
    """Per engine actor (pid) in sleep mode, the seconds from vLLM's ``Enabling cumem allocator`` line to its
    ``Resolved architecture`` line: the model inspection inside the engine's start (0 with its cache warm)."""
    first: dict[str, datetime] = {}
    gaps: dict[str, float] = {}
    for pid, stamp, what in _LINE.findall(log_text):
        t = datetime.strptime(stamp, "%m-%d %H:%M:%S")
        if what.startswith("Enabling"):
            first.setdefault(pid, t)
        elif pid in first and pid not in gaps:
            gaps[pid] = (t - first[pid]).total_seconds()
    return gaps


def launch(i: int, before: bool, a, rest: list[str]) -> dict:
    for path in caches():
        shutil.rmtree(path, ignore_errors=True)
    out = os.path.join(a.out, f"launch{i}_{'before' if before else 'after'}")
    work = os.path.join(a.work, f"launch{i}")
    env = {**os.environ, NO_INSPECTION_ENV: "1"} if before else {k: v for k, v in os.environ.items()
                                                                  if k != NO_INSPECTION_ENV}
    # step_time's own budget stops its launcher (in a session of its own, under the watchdog) within the limit; the
    # wait below, a minute longer, is the backstop for step_time itself
    cmd = [sys.executable, os.path.join(BENCH, "step_time.py"), "--runs", "gdpo", "--steps", "2", "--fresh",
           "--out", out, "--work", work, "--models", a.models, "--run-estimate-s", "60",
           "--budget-s", str(a.launch_timeout_s), *rest]
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        code: int | str = proc.wait(timeout=a.launch_timeout_s + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = "timeout"
    row = {"launch": i, "path": "before" if before else "after", "exit": code, "wall_s": round(time.time() - t0, 1)}
    try:
        with open(next(os.path.join(out, f) for f in sorted(os.listdir(out)) if f.startswith("step_time_"))) as f:
            run = json.load(f)["runs"]["gdpo"]
    except (OSError, StopIteration, KeyError, ValueError) as e:
        return {**row, "error": f"no step-time JSON ({type(e).__name__})"}
    row.update(first_step_s=run.get("first_step_s"), startup_s=run.get("startup_s"), run_exit=run.get("exit"))
    try:
        with open(run["log"], errors="replace") as f:
            row["inspection_in_engines_s"] = inspection_gaps(f.read())
    except (OSError, KeyError):
        row["inspection_in_engines_s"] = {}
    return row


def pairs(rows: list[dict]) -> dict:
    """before - after of ``first_step_s`` and ``engines_ready_s`` over consecutive (after, before) launches."""
    out: dict = {}
    for key in ("first_step_s", "engines_ready_s"):
        def value(r: dict, key: str = key) -> float | None:
            return r.get(key) if key == "first_step_s" else (r.get("startup_s") or {}).get(key)

        diffs = [value(b) - value(a) for a, b in zip(rows[::2], rows[1::2])
                 if a["path"] == "after" and b["path"] == "before" and value(a) is not None and value(b) is not None]
        if diffs:
            out[key] = {"before_minus_after": [round(d, 1) for d in diffs], "median": round(statistics.median(diffs), 1)}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--work", default=os.path.join(os.environ.get("WORK", "/tmp"), "cold_start"))
    p.add_argument("--models", default=os.path.join(os.environ.get("WORK", "/tmp"), "step_time_models"))
    p.add_argument("--launches", type=int, default=2, help="launches, alternating after / before (an even number)")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="start no launch that would not end in time")
    p.add_argument("--launch-timeout-s", type=float, default=420)
    a, rest = p.parse_known_args(argv)
    os.makedirs(a.out, exist_ok=True)
    start, rows = time.time(), []
    result = {"launches": rows, "caches_removed": caches(), "switch": NO_INSPECTION_ENV}
    for i in range(a.launches):
        left = a.budget_s - (time.time() - start)
        if left < LAUNCH_ESTIMATE_S:
            result["stopped"] = f"{left:.0f} s left of --budget-s, ~{LAUNCH_ESTIMATE_S} s needed per launch"
            break
        rows.append(launch(i + 1, before=i % 2 == 1, a=a, rest=rest))
        result["pairs"] = pairs(rows)
        with open(os.path.join(a.out, "cold_start.json.tmp"), "w") as f:
            json.dump(result, f, indent=1)
        os.replace(os.path.join(a.out, "cold_start.json.tmp"), os.path.join(a.out, "cold_start.json"))
        r = rows[-1]
        print(f"launch {r['launch']} ({r['path']}): first step {r.get('first_step_s')} s, engines ready "
              f"{(r.get('startup_s') or {}).get('engines_ready_s')} s, inspection in the engines "
              f"{r.get('inspection_in_engines_s')}", flush=True)
    print(json.dumps(result.get("pairs", {})))


if __name__ == "__main__":
    main()

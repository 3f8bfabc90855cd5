"""Faults too slow for the test suite, run as a user would meet them and recorded (``docs/reliability.md``).

Each scenario starts the real launcher on CPU (Ray, DeepSpeed ZeRO-2, HF engines, the tiny judged world of
``testing/e2e.py`` against the fake judge on 127.0.0.1), injects the fault, then resumes with ``--ckpt.load_enable``
and reports what happened:

* ``rank-killed``: two actor ranks (``--actor.num_gpus_per_node 2``); ``kill -9`` of rank 1's process as step 2's
  experience making and training begin (the judge has just scored all eight prompts);
* ``sigterm-in-save``: ``SIGTERM`` to the launcher's process group as soon as step 2's checkpoint folder appears
  (what a scheduler's preemption sends), then the resume.

Per scenario: the run's exit, seconds from the fault to the exit, its ``error:`` lines, whether a traceback was
printed, the checkpoint ``latest`` named after the fault, and the resumed run's exit, steps and final ``latest``.
``python bench/faults.py [--scenarios rank-killed,sigterm-in-save] [--out faults.json]`` (~3 minutes each on two
cores); exit 1 if a scenario lost work (the resume did not finish the run from a complete checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from openrlhf_classmate.testing.e2e import build_world, launcher_argv, run_launcher, tensorboard_scalars  # noqa: E402
from openrlhf_classmate.testing.judge_server import serve_judge  # noqa: E402
from openrlhf_classmate.testing.processes import descendants, kill_all, process_title  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = ("rank-killed", "sigterm-in-save")
JUDGE = ["--classmate.judge_model", "fake-judge", "--classmate.judge_max_retries", "1", "--classmate.final_answer",
         "whole_response"]
LIMIT_S = 600


def _latest(root: str) -> str | None:
    try:
        return open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip()
    except OSError:
        return None


def _wait(condition, proc: subprocess.Popen, limit: float = LIMIT_S) -> bool:
    start = time.time()
    while not condition() and proc.poll() is None and time.time() - start < limit:
        time.sleep(0.02)
    return proc.poll() is None


def run_scenario(name: str, work: str) -> dict:
    world = build_world(os.path.join(work, name), num_prompts=8, judged=True)
    root = world["root"]
    with serve_judge() as server:
        argv = launcher_argv(world, classmate=False, extra=["--classmate.judge_base_url", server.base_url, *JUDGE])
        if name == "rank-killed":
            for flag in ("--actor.num_gpus_per_node", "--ref.num_gpus_per_node"):
                argv[argv.index(flag) + 1] = "2"
        log_path = os.path.join(work, f"{name}.log")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], cwd=REPO,
                                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            row: dict = {"scenario": name}
            if name == "rank-killed":
                # step 2's rollout is scored: its experience making and training follow at once
                alive = _wait(lambda: len(server.keys) >= 8, proc)
                ranks = sorted(p for p in descendants([proc.pid]) if process_title(p).startswith("ray::ClassmatePolicyModelActor"))
                row["fault"] = f"kill -9 of rank 1 (pid {ranks[-1] if ranks else None}) as step 2 goes from rollout to training"
                if alive and len(ranks) == 2:
                    os.kill(ranks[-1], signal.SIGKILL)
            else:
                step2 = os.path.join(root, "ckpt", "_actor", "global_step2")
                alive = _wait(lambda: os.path.isdir(step2), proc)
                row["fault"] = "SIGTERM to the launcher's process group as step 2's checkpoint folder appeared"
                if alive:
                    os.killpg(proc.pid, signal.SIGTERM)
            faulted = time.time()
            try:
                row["exit"] = proc.wait(timeout=LIMIT_S)
            except subprocess.TimeoutExpired:
                row["exit"] = "hung"
            row["stopped_after_s"] = round(time.time() - faulted, 1)
            kill_all(descendants([proc.pid]))  # what Ray left behind (this run's processes only)
        text = open(log_path, errors="replace").read()
        row["error_lines"] = [line for line in text.splitlines() if line.startswith("error:")]
        row["traceback"] = "Traceback" in text
        row["latest_after_fault"] = _latest(root)
        row["incomplete_tag_left"] = os.path.isdir(os.path.join(root, "ckpt", "_actor", "global_step2")) and (
            row["latest_after_fault"] != "global_step2")
        resumed = argv + ["--ckpt.load_enable", "--logger.tensorboard_dir", os.path.join(root, "tb_resumed")]
        resume_log = os.path.join(work, f"{name}_resumed.log")
        row["resume_exit"] = run_launcher(resumed, resume_log, cwd=REPO)
        resume_text = open(resume_log, errors="replace").read()
        row["resume_notes"] = [line for line in resume_text.splitlines() if "is incomplete" in line][:2]
        try:
            row["resumed_steps"] = sorted(tensorboard_scalars(os.path.join(root, "tb_resumed"))["train/reward"])
        except (KeyError, OSError):
            row["resumed_steps"] = []
        row["latest_after_resume"] = _latest(root)
    # the fault landed inside step 2 when step 1's checkpoint was still the last complete one: the resume must train
    # step 2 again; after step 2's save there is nothing left to train
    row["landed_before_step_2_saved"] = row["latest_after_fault"] == "global_step1"
    row["nothing_lost"] = (row["resume_exit"] == 0 and row["latest_after_resume"] == "global_step2"
                           and row["resumed_steps"] == ([2] if row["landed_before_step_2_saved"] else []))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", default=None, help="JSON file for the rows")
    a = p.parse_args()
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        p.error(f"--scenarios: unknown {unknown}; known: {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory() as work:
        rows = [run_scenario(name, work) for name in names]
    for row in rows:
        print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["nothing_lost"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

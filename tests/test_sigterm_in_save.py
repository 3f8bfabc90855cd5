"""``SIGTERM`` to the launcher's process group (a scheduler's preemption, ``timeout``, a terminal) while a checkpoint
is being written, then the resume.

The launcher's real ``main`` and ``init_ray`` (its local Ray cluster, its signal handling) run as a subprocess in a
session of its own; its training is replaced by a real DeepSpeed ZeRO-2 engine (``testing/ckpt_engine.py``) in a Ray
actor of that cluster that saves ``global_step1``, then stalls in the middle of ``global_step2`` (after the model
states, before the optimizer states, the marker and ``latest``), where the signal lands. Before the launcher handled
the signal, Ray's driver aborted (exit -6) and printed nothing of its own; now: one line naming the signal and the
checkpoint to resume from, exit 1, Ray's processes (the writer among them) stopped, ``latest`` on the complete tag,
and the resume (the real ``load_ckpt`` on a fresh engine) continues from step 1 with step 1's weights (40 s on two
quiet cores, 56-82 s under a load of 5 to 8; most of it the imports of the launcher, the Ray worker and the resume)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openrlhf_classmate.integration.training.checkpoints import MARKER
from openrlhf_classmate.testing.e2e import one_row_world, one_step_argv

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, os, sys, time
import ray
from openrlhf_classmate.cli import train_ppo_ray

actor_dir, stalled, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

@ray.remote(num_cpus=1)
class Trainer:
    def fit(self):
        from openrlhf_classmate.testing.ckpt_engine import make_engine, train_step, weights

        strategy, engine = make_engine()
        save = engine.checkpoint_engine.save

        def slow_save(state_dict, path):  # global_step2 stalls after its first file, as on a slow disk
            save(state_dict, path)
            if "global_step2" in path:
                with open(stalled, "w") as f:
                    json.dump({"pid": os.getpid(), "file": os.path.basename(path)}, f)
                time.sleep(300)

        engine.checkpoint_engine.save = slow_save
        for step in (1, 2):
            train_step(engine)
            type(strategy).save_ckpt(strategy, engine, actor_dir, f"global_step{step}", 3, 1000, {"data_step": step})
            print(json.dumps({"saved": f"global_step{step}", "weights": weights(engine)}), flush=True)

def run(args):  # the launcher's training, replaced: its Ray cluster, one trainer actor that saves
    train_ppo_ray.init_ray(args, {})
    ray.get(Trainer.remote().fit.remote())

train_ppo_ray.run = run
train_ppo_ray.main(argv)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_during_a_save_is_one_line_and_the_resume_continues_from_the_complete_tag(tmp_path):
    policy, data = one_row_world(str(tmp_path))
    ckpt = tmp_path / "ckpt"
    actor = ckpt / "_actor"
    stalled = tmp_path / "stalled.json"
    argv = one_step_argv(policy, data, str(ckpt), str(tmp_path / "final"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(actor), str(stalled), json.dumps(argv)], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            start = time.time()
            while not stalled.exists() and proc.poll() is None and time.time() - start < 600:
                time.sleep(0.05)
            time.sleep(0.2)  # the marker file's json is written
            assert proc.poll() is None and stalled.exists(), log_path.read_text()[-4000:]
            writer = json.loads(stalled.read_text())
            os.killpg(proc.pid, signal.SIGTERM)
            signalled = time.time()
            code = proc.wait(timeout=120)
            stopped_after = time.time() - signalled
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    saved = [json.loads(m.group(0)) for m in re.finditer(r'\{"saved".*\}', text)]  # the actor's lines, via Ray
    assert [s["saved"] for s in saved] == ["global_step1"], text[-4000:]
    assert writer["file"] == "mp_rank_00_model_states.pt"  # the signal landed inside global_step2's save

    assert code == 1 and stopped_after < 20, (code, stopped_after, text[-4000:])  # measured 1-4 s on 2 loaded cores
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert errors == [f"error: the run received SIGTERM (a scheduler's preemption, kill or timeout) and stopped. The "
                      f"last complete checkpoint is global_step1 in {ckpt}/_actor: run the same command with "
                      "--ckpt.load_enable to resume from it."], text[-4000:]
    assert "Traceback" not in text, text[text.find("Traceback"):][:3000]
    deadline = time.time() + 30
    while _alive(writer["pid"]) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(writer["pid"])  # the writer went with the run: nothing writes into the folder after the line

    assert (actor / "latest").read_text() == "global_step1"
    assert sorted(os.listdir(actor / "global_step2")) == ["mp_rank_00_model_states.pt"]  # half a save, no marker
    assert MARKER in os.listdir(actor / "global_step1")

    resumed = subprocess.run([sys.executable, "-m", "openrlhf_classmate.testing.ckpt_engine", "resume", str(actor)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    (report,) = [json.loads(line) for line in resumed.stdout.splitlines() if line.startswith("{")]
    assert report["loaded"] == "global_step1" and report["global_steps"] == 1 and report["data_step"] == 1, report
    assert report["weights"] == saved[0]["weights"]  # step 1's weights, not the fresh engine's


HANDLER_SCRIPT = r"""
import os, signal, sys, time
from openrlhf_classmate.integration.launch.terminated import install_sigterm_handler

def rays(signum, frame):  # a stand-in for the handler ray.init installs: stop the cluster, then sys.exit(1)
    print("the previous handler ran", flush=True)
    sys.exit(1)

signal.signal(signal.SIGTERM, rays)
install_sigterm_handler(sys.argv[1])
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("not reached", flush=True)
"""


def test_the_handler_runs_the_previous_one_then_prints_the_line_and_exits_1(tmp_path):
    """Without Ray: the handler keeps the one it replaces (Ray's, which stops the cluster), then prints its line and
    exits 1 at once; with nothing saved yet the line says so."""
    proc = subprocess.run([sys.executable, "-c", HANDLER_SCRIPT, str(tmp_path / "ckpt")], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and proc.stdout == "the previous handler ran\n", (proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.splitlines() == [
        "error: the run received SIGTERM (a scheduler's preemption, kill or timeout) and stopped. No checkpoint was "
        "saved yet: start again (--ckpt.save_steps sets how often one is written)."], proc.stderr[-2000:]

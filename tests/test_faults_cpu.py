"""Faults during real CPU runs of the launcher (Ray, DeepSpeed ZeRO-2, HF engines, tiny models), each a subprocess as a
user would start it, against a real local judge server on 127.0.0.1 (``testing.judge_server``):

* the judge is down (HTTP 503) for a whole step: those scores are invalid and masked, counted in the judge metrics,
  named in one warning line, and the run goes on and exits 0;
* ``kill -9`` of the whole run during a step, then a resume: it continues at the step after the last checkpoint,
  with the data loader where it was (the resumed step scores exactly the prompts the killed step had drawn);
* a torn checkpoint (the newest tag's model file cut short): the resume names the file, falls back to the previous
  complete tag and continues from there; the ``*_hf`` folders rotate with ``--ckpt.max_num``;
* a weight sync the policy engine drops: the train-inference mismatch metrics jump by orders of magnitude
  at the next step, which prints one warning line naming it;
* a judge that answers HTTP 200 with a body that is not JSON, and one slower than its timeout: those scores are
  invalid and masked, counted and named, the rest train;
* the policy engine's process killed during a rollout, then one of two training ranks killed during a step of the
  resume: each stops the run at once with one line naming it and the checkpoint to resume from.

Every row of the data carries its own judge key, so the server's request log tells which prompts each step scored.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from openrlhf_classmate.testing.e2e import QUIET, build_world, launcher_argv, run_launcher, tensorboard_scalars
from openrlhf_classmate.testing.judge_server import serve_judge
from openrlhf_classmate.testing.processes import descendants, kill_all, process_table, process_title

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY_RE = re.compile(r"\[\[fake:key=(\w+)\]\]")


def _judge_flags(server, retries: int = 1) -> list[str]:
    # whole_response: every answer is judged (a tiny random policy rarely closes its think block); it has no CoT for
    # a classmate, so these runs are plain GRPO with the judge as the main reward
    return ["--classmate.judge_base_url", server.base_url, "--classmate.judge_model", "fake-judge",
            "--classmate.judge_max_retries", str(retries), "--classmate.final_answer", "whole_response"]


def _keys(requests: list[dict]) -> list[str]:
    """Distinct row keys in the order the judge first saw them."""
    seen: list[str] = []
    for body in requests:
        for m in KEY_RE.finditer(" ".join(str(msg.get("content", "")) for msg in body.get("messages", []))):
            if m.group(1) not in seen:
                seen.append(m.group(1))
    return seen


def _launch(argv: list[str], log_path: str) -> str:
    code = run_launcher(argv, log_path, cwd=REPO)
    text = open(log_path, errors="replace").read()
    if code != 0:
        pytest.fail(f"launcher exited with {code}; log tail:\n{text[-6000:]}")
    return text


def _judge_down_for_step_1_was_masked_counted_and_warned(tb: dict, statuses: list[int], keys: list[str], log: str):
    """The run's judge answered 503 to every request about the first 4 prompts (step 1), then came back (step 2)."""
    requests, failures, retries = (tb[f"train/judge/{k}"] for k in ("requests", "failures", "retries"))
    # step 1: every main answer (16) was judged, failed, and was retried once
    assert requests[1] == 16 and failures[1] == 16 and retries[1] == 16
    assert statuses.count(503) == 2 * failures[1]  # what the server answered: 503 to each attempt
    # step 2: the judge is back
    assert requests[2] == 16 and failures[2] == 0 and retries[2] == 0
    assert statuses.count(200) == requests[2] and len(keys) == 8
    assert tb["train/reward/main_valid_fraction"] == {1: 0.0, 2: 1.0}
    assert tb["train/skipped_invalid_step"] == {1: 1.0, 2: 0.0}  # nothing trained on step 1's failed scores
    assert all(tb["train/judge/latency_p50"][s] > 0 for s in (1, 2))
    assert tb["train/judge/latency_p95"][1] >= tb["train/judge/latency_p50"][1]
    # one warning line for step 1, naming the first failure; none for step 2
    warnings = [line for line in log.splitlines() if "judge health:" in line]
    assert len(warnings) == 1, warnings
    assert "step 1: judge health: 16/16 main scores invalid (masked)" in warnings[0]
    assert "16 of 16 judge requests failed" in warnings[0]
    assert "first failure (main answer): judge HTTP 503 after 1 retry" in warnings[0]
    assert "Traceback" not in log


def test_judge_down_with_dynamic_filtering_stops_with_the_all_invalid_message(tmp_path):
    # upstream's filter averaged the placeholder zeros, dropped and replaced every group until the
    # epoch ran out, and the run exited 0 having trained nothing; now the dropped groups count as all-invalid steps
    world = build_world(str(tmp_path / "world"), num_prompts=8, judged=True)
    log_path = str(tmp_path / "run.log")
    with serve_judge(down_keys=8) as server:  # 503 to every request: the judge is down for the whole run
        argv = launcher_argv(world, classmate=False, extra=_judge_flags(server) + [
            "--algo.dynamic_filtering_enable", "--classmate.stop_after_invalid_steps", "1"])
        code = run_launcher(argv, log_path, cwd=REPO)
        statuses = list(server.statuses)
    log = open(log_path, errors="replace").read()
    assert code == 1, log[-6000:]
    message = ("error: dynamic filtering dropped 4 prompt groups whose main scores were all invalid (1 x "
               "--rollout.batch_size 4): no score has been valid yet (judge or verifier down or misconfigured? see "
               "the reward function's log lines); stopping (--classmate.stop_after_invalid_steps)")
    assert log.splitlines().count(message) == 1, log[-6000:]  # the launcher's one line (Ray's output interleaves)
    assert statuses and set(statuses) == {503}
    assert not os.path.exists(os.path.join(world["root"], "ckpt", "_actor", "latest"))  # nothing was trained


def test_a_judge_answering_200_without_json_and_one_slower_than_its_timeout_are_masked_and_named(tmp_path):
    """One step of 4 prompts x 4 samples: the judge answers HTTP 200 with a body that is not chat-completions JSON for
    every answer to row 0, and for row 1 sleeps 4 s against --classmate.judge_timeout_s 1; it rates every answer to
    rows 2 and 3 7. Those 8 failed scores are invalid and masked (never 0: the batch's reward is 7, not 3.5), counted
    in the judge metrics, the first failure named in one warning line; the other 8 train, and the run exits 0 without
    waiting out the slow answers."""
    world = build_world(str(tmp_path / "world"), num_prompts=4, judged=True,
                        judge_directives={0: "[[fake:malformed]]", 1: "[[fake:sleep=4]]", 2: "[[fake:rating=7]]",
                                          3: "[[fake:rating=7]]"})
    log_path = str(tmp_path / "run.log")
    with serve_judge() as server:
        argv = launcher_argv(world, classmate=False, max_samples=4, extra=_judge_flags(server) + [
            "--classmate.judge_timeout_s", "1"])
        log = _launch(argv, log_path)
        keys = _keys(list(server.requests))
    assert sorted(keys) == ["row0", "row1", "row2", "row3"]
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    assert set(tb["train/reward"]) == {1}
    assert tb["train/judge/requests"][1] == 16 and tb["train/judge/failures"][1] == 8
    assert tb["train/reward/main_valid_fraction"][1] == 0.5 and tb["train/skipped_invalid_step"][1] == 0.0
    assert tb["train/reward"][1] == 7.0  # the mean of the 8 valid scores; 3.5 if the failures counted as 0
    assert tb["train/judge/latency_p95"][1] < 4.0  # the slow answers were abandoned at the timeout
    warnings = [line for line in log.splitlines() if "judge health:" in line]
    assert len(warnings) == 1 and "step 1: judge health: 8/16 main scores invalid (masked)" in warnings[0], warnings
    assert "malformed" in warnings[0] or "timed out after 1" in warnings[0], warnings[0]
    assert open(os.path.join(world["root"], "ckpt", "_actor", "latest")).read().strip() == "global_step1"
    assert "Traceback" not in log


def _two_ranks_without_a_reference(argv: list[str]) -> list[str]:
    """Two actor ranks (DeepSpeed ZeRO-2 over gloo); no reference model (KL off), two processes fewer on 2 cores."""
    argv = list(argv)
    argv[argv.index("--actor.num_gpus_per_node") + 1] = "2"
    argv[argv.index("--algo.kl.init_coef") + 1] = "0"
    argv.remove("--algo.kl.use_loss")
    return argv


def _run_and_kill(argv: list[str], log_path, server, keys: int, title: str) -> dict:
    """Start the launcher; once the judge has seen ``keys`` distinct prompts, ``kill -9`` the run's process whose title
    starts with ``title`` (of several, the last started); wait for the run to stop. No fixed deadline before the kill:
    the wait ends if the run stops printing (a loaded machine only slows it down)."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            size, last_progress = 0, time.time()
            while len(_keys(list(server.requests))) < keys and proc.poll() is None:
                if os.path.getsize(log_path) != size:
                    size, last_progress = os.path.getsize(log_path), time.time()
                if time.time() - last_progress > QUIET:
                    break
                time.sleep(0.05)
            found = sorted(pid for pid in descendants([proc.pid]) if process_title(pid).startswith(title))
            assert proc.poll() is None and found, open(log_path).read()[-4000:]
            os.kill(found[-1], signal.SIGKILL)
            killed_at = time.time()
            code = proc.wait(timeout=QUIET)
            stopped_after = time.time() - killed_at
        finally:
            if proc.poll() is None:
                _kill_run(proc)
    return {"pid": found[-1], "found": len(found), "code": code, "stopped_after": stopped_after,
            "log": open(log_path, errors="replace").read()}


def _died_line(killed: dict, who: str, root: str, tag: str) -> None:
    assert killed["code"] == 1 and killed["stopped_after"] < 60, (killed["code"], killed["stopped_after"])
    errors = [line for line in killed["log"].splitlines() if line.startswith("error:")]  # Ray's output interleaves
    assert errors == [f"error: a process of the run died: {who}, its process {killed['pid']} exited (SYSTEM_ERROR: "
                      "killed, out of memory, or its node lost); the run stopped. The last complete checkpoint is "
                      f"{tag} in {root}/ckpt/_actor: run the same command with --ckpt.load_enable to resume from "
                      "it."], errors
    log = killed["log"]
    assert "Traceback" not in log, log[log.find("Traceback") - 200:][:3000]
    assert open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip() == tag


def test_an_engine_killed_mid_rollout_then_a_rank_killed_mid_step_each_stop_the_run_in_one_line(tmp_path):
    """Two faults, one run and its resume, on two actor ranks (3 steps of 4 prompts): ``kill -9`` of the policy
    engine's process while step 2 generates; the resume trains step 2 from global_step1, saves it, and ``kill -9`` of
    rank 1 once step 3's rollout is scored (its experience making and training follow). Each time the run stops
    within seconds with one line naming the dead process and the last complete checkpoint (Ray printed two
    tracebacks), and ``latest`` names that checkpoint."""
    world = build_world(str(tmp_path / "world"), num_prompts=12, judged=True)
    root = world["root"]
    with serve_judge() as server:
        argv = _two_ranks_without_a_reference(
            launcher_argv(world, classmate=False, max_samples=12, extra=_judge_flags(server)))
        # step 2's rollout has begun once the judge sees a fifth prompt
        engine = _run_and_kill(argv, tmp_path / "engine_killed.log", server, keys=5, title="ray::HFEngine")
        _died_line(engine, "HFEngine", root, "global_step1")
        assert engine["found"] == 1

        resumed = argv + ["--ckpt.load_enable", "--logger.tensorboard_dir", os.path.join(root, "tb_resumed")]
        # step 3's rollout is scored once the judge has seen all 12 prompts (steps 1 and 2 scored the first 8)
        rank = _run_and_kill(resumed, tmp_path / "rank_killed.log", server, keys=12,
                             title="ray::ClassmatePolicyModelActor")
        _died_line(rank, "ClassmatePolicyModelActor", root, "global_step2")
        assert rank["found"] == 2
    tb = tensorboard_scalars(os.path.join(root, "tb_resumed"))
    assert set(tb["train/reward"]) == {2}  # the resume trained the interrupted step 2; step 3 never reached training


def _kill_run(proc: subprocess.Popen) -> int:
    """SIGKILL the run: every process of its session and every descendant (Ray's daemons and workers, some of which
    start sessions of their own), all at once, as a node failure would. Returns how many were killed."""
    table = process_table()
    victims = descendants({pid for pid, (_, sid) in table.items() if sid == proc.pid} | {proc.pid}, table)
    kill_all(victims)
    proc.wait(timeout=60)
    return len(victims)


def test_kill_9_during_a_step_then_resume_continues_at_the_same_step_and_data_position(tmp_path):
    world = build_world(str(tmp_path / "world"), num_prompts=8, judged=True)
    root = world["root"]
    with serve_judge() as server:
        argv = launcher_argv(world, classmate=False, extra=_judge_flags(server))
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
        with open(tmp_path / "killed.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], cwd=REPO,
                                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            # step 2 has begun once the judge sees a fifth prompt (step 1 scored four, then saved its checkpoint);
            # no fixed deadline: the wait ends if the run stops printing (a loaded machine only slows it down)
            size, last_progress = 0, time.time()
            while len(_keys(list(server.requests))) < 5 and proc.poll() is None:
                if os.path.getsize(tmp_path / "killed.log") != size:
                    size, last_progress = os.path.getsize(tmp_path / "killed.log"), time.time()
                if time.time() - last_progress > QUIET:
                    break  # hung: killed below, and the assertions on what the judge saw fail
                time.sleep(0.05)
            assert proc.poll() is None, open(tmp_path / "killed.log").read()[-4000:]
            assert _kill_run(proc) >= 2
        killed_requests = len(server.requests)
        seen = _keys(list(server.requests))
        step1, step2_partial = seen[:4], seen[4:]
        assert open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip() == "global_step1"

        resumed = argv + ["--ckpt.load_enable", "--logger.tensorboard_dir", os.path.join(root, "tb_resumed")]
        log = _launch(resumed, str(tmp_path / "resumed.log"))
        step2 = _keys(list(server.requests)[killed_requests:])

    # same data position: the resumed step scores the four prompts step 1 had not used (a restarted data loader
    # would have drawn step 1's prompts again), including those the killed step had already sent to the judge
    assert len(step2) == 4 and not set(step2) & set(step1) and set(step2_partial) <= set(step2)
    assert set(step1) | set(step2) == {f"row{i}" for i in range(8)}
    # same global step: the resumed run trains step 2 only and checkpoints it
    tb = tensorboard_scalars(os.path.join(root, "tb_resumed"))
    assert set(tb["train/reward"]) == {2}
    assert open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip() == "global_step2"
    assert "Traceback" not in log


def test_judge_down_for_a_step_then_resume_over_a_torn_checkpoint(tmp_path):
    """Two faults, one run and its resume (each launch costs ~40 s of start-up for ~1 s per step): the judge is down
    for step 1 (its scores masked, counted, warned about; the run goes on and exits 0), then the newest checkpoint is
    torn and the resume falls back to the previous complete tag."""
    world = build_world(str(tmp_path / "world"), num_prompts=8, judged=True)
    root = world["root"]
    actor = os.path.join(root, "ckpt", "_actor")
    with serve_judge(down_keys=4) as server:  # 503 for every request about the first 4 prompts = step 1
        argv = launcher_argv(world, classmate=False, extra=_judge_flags(server) + ["--ckpt.max_num", "2"])
        run1 = _launch(argv, str(tmp_path / "run1.log"))
        first, statuses, keys = _keys(list(server.requests)), list(server.statuses), list(server.keys)
    _judge_down_for_step_1_was_masked_counted_and_warned(tensorboard_scalars(os.path.join(root, "tb")), statuses,
                                                         keys, run1)
    assert sorted(os.listdir(os.path.join(root, "ckpt"))) == [
        "_actor", "engine_weight_updates.json", "global_step1_hf", "global_step2_hf"]  # a skipped step saves too

    torn = os.path.join(actor, "global_step2", "mp_rank_00_model_states.pt")
    with open(torn, "r+b") as f:
        f.truncate(os.path.getsize(torn) // 2)  # a save cut short (disk full, killed mid-write, partial copy)
    with serve_judge() as server:  # the judge is up
        resumed = launcher_argv(world, classmate=False, num_episodes=2,
                                extra=_judge_flags(server) + ["--ckpt.max_num", "2", "--ckpt.load_enable",
                                                              "--logger.tensorboard_dir",
                                                              os.path.join(root, "tb_resumed")])
        log = _launch(resumed, str(tmp_path / "run2.log"))
        again = _keys(list(server.requests))

    notes = [line for line in log.splitlines() if "is incomplete" in line]
    assert notes and all(f"{torn} is cut short or corrupt" in line and "resuming from global_step1" in line
                         for line in notes)
    assert any(line.startswith("warning: checkpoint") for line in notes)  # the launcher's preflight, before Ray
    # it resumed from step 1: step 2 is trained again, on step 2's prompts, then episode 2 (steps 3 and 4)
    tb = tensorboard_scalars(os.path.join(root, "tb_resumed"))
    assert set(tb["train/reward"]) == {2, 3, 4}
    assert set(again[:4]) == set(first[4:8])
    assert open(os.path.join(actor, "latest")).read().strip() == "global_step4"
    # --ckpt.max_num 2 rotates the DeepSpeed tags (upstream) and now the *_hf folders too
    assert sorted(d for d in os.listdir(actor) if d.startswith("global_step")) == ["global_step3", "global_step4"]
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(root, "ckpt", "*_hf"))) == [
        "global_step3_hf", "global_step4_hf"]


def test_a_dropped_weight_sync_makes_the_mismatch_jump_and_warns_naming_the_step(tmp_path):
    """The HF engine drops the weight sync after step 1 (``OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS``), so step 2
    samples from the initial weights while the actor has trained one step (lr 0.1 and an entropy bonus make that
    step move the weights whatever the rewards). Step 1 is a normal step: bf16 actor against the fp32 HF engine on
    the same weights. Plain GRPO, 2 steps (~70 s on 2 idle cores)."""
    world = build_world(str(tmp_path / "world"))
    argv = launcher_argv(world, classmate=False, extra=["--actor.entropy_coef", "0.01", "--actor.adam.lr", "0.1"])
    log_path = str(tmp_path / "run.log")
    code = run_launcher(argv, log_path, cwd=REPO, env={"OPENRLHF_CLASSMATE_FAULT_DROP_WEIGHT_SYNCS": "1"})
    log = open(log_path, errors="replace").read()
    if code != 0:
        pytest.fail(f"launcher exited with {code}; log tail:\n{log[-6000:]}")
    with open(os.path.join(world["root"], "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [1], "classmate": []}  # the engine loaded the second sync only

    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    mean, top, k3 = (tb[f"train/mismatch/{k}"] for k in ("logprob_abs_diff_mean", "logprob_abs_diff_max", "kl_k3"))
    assert set(mean) == set(top) == set(k3) == {1, 2}
    assert 0 < mean[1] < 0.02 and k3[1] < 1e-3  # bf16 rounding only (measured: 0.006, k3 1.6e-4)
    assert mean[2] > 30 * mean[1] and k3[2] > 300 * k3[1] and top[2] > 10 * top[1]  # measured: x107, x1600, x37
    assert mean[2] > 0.1  # above the default --engine.mismatch_warn_threshold
    warnings = [line for line in log.splitlines() if "train-inference mismatch" in line]
    assert len(warnings) == 1, warnings
    assert "step 2: train-inference mismatch: mean |actor - engine log-prob|" in warnings[0]
    assert "--engine.mismatch_warn_threshold 0.1" in warnings[0]

"""train_scripts/: syntax, GPU detection, server readiness (against real local HTTP servers), server start/stop with a
stand-in `vllm serve`, and dry runs whose printed launcher command must parse with the launcher's parser."""

import contextlib
import glob
import http.server
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.launch.preflight_types import looks_local
from openrlhf_classmate.testing.servers import QuietHandler, serve_in_thread
from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "train_scripts")
LIB = os.path.join(SCRIPTS, "lib.sh")
LIB_DIR = os.path.join(SCRIPTS, "lib")  # the files lib.sh sources, one per section
HELPFUL_CONFIGS = ("classmate_gdpo", "classmate_separated", "classmate_reproduce_reference")
"""The configs ``classmate_helpful.sh CONFIG`` runs (``classmate_gdpo.sh`` is ``classmate_helpful.sh classmate_gdpo``)."""
RUN_SCRIPTS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(SCRIPTS, "*.sh"))
                     if os.path.basename(p) not in ("lib.sh", "convert_checkpoint.sh", "classmate_helpful.sh"))
RUNS = {**{name: [f"{name}.sh"] for name in RUN_SCRIPTS},
        **{name: ["classmate_helpful.sh", name] for name in HELPFUL_CONFIGS}}
"""Each config's run: the script and its leading arguments."""
JUDGE_SCRIPTS = {"warmup", "baseline_grpo", "classmate_gdpo", "classmate_separated", "self_classmate",
                 "classmate_reproduce_reference"}
CLASSMATE_SCRIPTS = {"classmate_gdpo", "classmate_separated", "self_classmate", "classmate_reproduce_reference",
                     "classmate_gsm8k", "classmate_math", "classmate_mmlu", "classmate_code"}


def _bash(snippet: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = dict(os.environ, SERVER_POLL_INTERVAL="0.1", **(env or {}))
    return subprocess.run(["bash", "-c", f"set -euo pipefail; . {shlex.quote(LIB)}; {snippet}"], env=full,
                          capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ModelsHandler(QuietHandler):
    status = 200
    key = None  # set: a request without "Authorization: Bearer <key>" gets 401, as a hosted endpoint

    def do_GET(self):  # noqa: N802
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self.reply(401, {"error": "no API key"})
            return
        self.reply(self.status if self.path == "/v1/models" else 404,
                   {"object": "list", "data": [{"id": "served-judge", "object": "model"}]})


def _serve(port: int, status: int = 200, delay: float = 0.0, key: str | None = None):
    """A local /v1/models server on 127.0.0.1:port (started after `delay` seconds; with ``key``, it answers only
    requests that carry it); returns a stop function."""
    handler = type("Handler", (_ModelsHandler,), {"status": status, "key": key})
    running = contextlib.ExitStack()

    def run():
        time.sleep(delay)
        running.enter_context(serve_in_thread(http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def stop():
        thread.join(timeout=delay + 5)
        running.close()
    return stop


# ── syntax and inventory ──


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SCRIPTS, "*.sh")) + glob.glob(os.path.join(LIB_DIR, "*.sh"))
                                        + [os.path.join(SCRIPTS, "slurm_template.sbatch")]),
                         ids=lambda p: os.path.relpath(p, SCRIPTS))
def test_bash_syntax(path):
    proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_config_has_a_run_script_and_back():
    configs = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(REPO, "configs", "*.yaml"))}
    assert set(RUNS) == configs
    for name, (script, *_) in RUNS.items():
        text = open(os.path.join(SCRIPTS, script)).read()
        assert text.startswith("#!/usr/bin/env bash") and os.access(os.path.join(SCRIPTS, script), os.X_OK)
        if script == "classmate_helpful.sh":
            assert f"  {name} " in text and 'run_config "$config" "$@"' in text
        elif name == "classmate_gdpo":
            assert 'classmate_helpful.sh" classmate_gdpo "$@"' in text
        else:
            assert f"run_config {name} " in text


def test_classmate_helpful_refuses_a_config_it_does_not_run():
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "classmate_helpful.sh"), "warmup"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "usage: train_scripts/classmate_helpful.sh classmate_gdpo|" in proc.stderr
    assert "(got 'warmup')" in proc.stderr


def test_no_machine_specific_paths_in_scripts():
    for path in glob.glob(os.path.join(SCRIPTS, "**", "*"), recursive=True):
        if os.path.isdir(path):
            continue
        text = open(path).read()
        for bad in ("/work/", "/home/", "/root/", "/scratch/"):
            assert bad not in text, f"{path}: {bad}"


# ── GPU detection ──


def test_gpu_detection_nvidia_smi_and_cuda_visible_devices(tmp_path):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: Fake H100 (UUID: GPU-$i)\"; done\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}"}
    env_no_cvd = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run(["bash", "-c", f". {LIB}; detect_gpus"], env={**env_no_cvd, **env}, capture_output=True,
                          text=True)
    assert proc.stdout.strip() == "4"
    assert _bash("detect_gpus", {**env, "CUDA_VISIBLE_DEVICES": "1,3"}).stdout.strip() == "2"
    assert _bash("detect_gpus", {"CUDA_VISIBLE_DEVICES": ""}).stdout.strip() == "0"
    proc = _bash('setup_gpus; echo "$GPUS_PER_NODE|$TRAIN_CUDA_DEVICES|$SERVER_CUDA_DEVICES|${RUN_ARGS[*]}"',
                 {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SERVER_GPUS": "1", "NNODES": "2"})
    gpus, train, server, flags = proc.stdout.strip().split("|")
    assert (gpus, train, server) == ("3", "0,1,2", "3")
    assert "--actor.num_nodes 2 --actor.num_gpus_per_node 3" in flags and "--vllm.num_engines 6" in flags


def test_no_gpu_is_a_clear_error_outside_dry_runs():
    proc = _bash("setup_gpus", {"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and "no GPU left for training" in proc.stderr and "GPUS_PER_NODE" in proc.stderr


# ── readiness ──


def test_wait_ready_against_a_real_server():
    port = _free_port()
    stop = _serve(port)
    try:
        proc = _bash(f"wait_ready judge http://127.0.0.1:{port}/v1 10")
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert f"judge server ready at http://127.0.0.1:{port}/v1" in proc.stderr


def test_wait_ready_waits_for_a_slow_server():
    port = _free_port()
    stop = _serve(port, delay=1.0)
    try:
        t = time.time()
        proc = _bash(f"wait_ready judge http://127.0.0.1:{port}/v1 20")
        elapsed = time.time() - t
    finally:
        stop()
    assert proc.returncode == 0, proc.stderr
    assert elapsed >= 0.9


@pytest.mark.parametrize("status", [None, 503])
def test_wait_ready_times_out_with_a_clear_message(status):
    port = _free_port()
    stop = _serve(port, status=status) if status else (lambda: None)
    try:
        t = time.time()
        proc = _bash(f"wait_ready judge http://127.0.0.1:{port}/v1 2")
        elapsed = time.time() - t
    finally:
        stop()
    assert proc.returncode == 1
    assert f"error: judge server at http://127.0.0.1:{port}/v1: not ready after 2 s" in proc.stderr
    assert f"GET http://127.0.0.1:{port}/v1/models" in proc.stderr
    assert "unset the *_URL variable" in proc.stderr  # no pid: a URL that was given, not started here
    assert 1.5 <= elapsed < 15


def test_wait_ready_stops_when_the_server_process_dies(tmp_path):
    log = tmp_path / "judge.log"
    log.write_text("loading model\nCUDA out of memory\n")
    port = _free_port()
    proc = _bash(f"sleep 0.2 & pid=$!; wait_ready judge http://127.0.0.1:{port}/v1 30 $pid {log}")
    assert proc.returncode == 1
    assert "exited before answering" in proc.stderr and "CUDA out of memory" in proc.stderr and str(log) in proc.stderr


# ── servers started by the scripts (a stand-in for `vllm serve`) ──

FAKE_VLLM = r'''
import http.server, json, os, sys, time
argv = sys.argv[1:]
assert argv[0] == "serve", argv
model, host, port = argv[1], argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
with open(os.environ["FAKE_VLLM_RECORD"], "a") as f:
    f.write(json.dumps({"argv": argv, "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")
time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": model}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((host, port), H).serve_forever()
'''

FAKE_PYTHON = r'''#!/usr/bin/env bash
# stands in for the launcher's python: records its arguments and environment, exits with FAKE_PYTHON_STATUS;
# the preflight (--check) is recorded apart, with the time, and exits with FAKE_CHECK_STATUS
if [[ " $* " == *" --check "* ]]; then
  date +%s.%N >> "$FAKE_PYTHON_RECORD.check"
  [[ "${FAKE_CHECK_STATUS:-0}" == 0 ]] || echo "error: --classmate.top_p must be in (0, 1], got 0.0" >&2
  exit "${FAKE_CHECK_STATUS:-0}"
fi
# lib.sh's small helper programs (script_helpers: the micro-batch fit) run on the real python
if [[ "${2:-}" == openrlhf_classmate.script_helpers ]]; then exec "@REAL_PYTHON@" "$@"; fi
printf '%s\n' "$@" > "$FAKE_PYTHON_RECORD"
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" >> "$FAKE_PYTHON_RECORD.env"
exit "${FAKE_PYTHON_STATUS:-0}"
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


@pytest.fixture
def fakes(tmp_path):
    vllm = tmp_path / "fake_vllm.py"
    vllm.write_text(FAKE_VLLM)
    python = tmp_path / "fake_python"
    python.write_text(FAKE_PYTHON.replace("@REAL_PYTHON@", sys.executable))
    python.chmod(0o755)
    return {"VLLM_BIN": f"{sys.executable} {vllm}", "FAKE_VLLM_RECORD": str(tmp_path / "vllm.jsonl"),
            "FAKE_PYTHON": str(python), "FAKE_PYTHON_RECORD": str(tmp_path / "launcher_args.txt")}


def test_script_starts_the_judge_waits_launches_and_stops_it(tmp_path, fakes):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    port = _free_port()
    env = dict(os.environ, VLLM_BIN=fakes["VLLM_BIN"], FAKE_VLLM_RECORD=fakes["FAKE_VLLM_RECORD"],
               FAKE_VLLM_DELAY="0.5", PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"],
               FAKE_PYTHON_STATUS="3", CUDA_VISIBLE_DEVICES="0,1,2", SERVER_GPUS="1", JUDGE_PORT=str(port),
               JUDGE_MODEL="judge-x", DATA=str(data), EVAL_DATA="", OUTPUT_DIR=str(tmp_path / "run"),
               SERVER_POLL_INTERVAL="0.1")
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "warmup.sh"), "--train.seed", "5"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr  # the launcher's exit status
    record = [json.loads(line) for line in open(fakes["FAKE_VLLM_RECORD"])]
    assert len(record) == 1
    argv = record[0]["argv"]
    assert argv[:2] == ["serve", "judge-x"] and argv[argv.index("--port") + 1] == str(port)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"  # a reserved GPU: most of its memory
    assert record[0]["cuda"] == "2"  # the last GPU is the server's
    assert "stopped 1 server(s)" in proc.stderr
    for _ in range(50):
        if not _alive(record[0]["pid"]):
            break
        time.sleep(0.1)
    assert not _alive(record[0]["pid"]), "the judge server outlived the script"
    launcher = open(fakes["FAKE_PYTHON_RECORD"]).read().split("\n")
    assert launcher[:2] == ["-m", "openrlhf_classmate.cli.train_ppo_ray"]
    flags = launcher[2:]
    assert flags[flags.index("--classmate.judge_base_url") + 1] == f"http://127.0.0.1:{port}/v1"
    assert flags[flags.index("--classmate.judge_model") + 1] == "judge-x"
    assert flags[flags.index("--actor.num_gpus_per_node") + 1] == "2" and flags[-2:-1] == ["5"]
    assert open(fakes["FAKE_PYTHON_RECORD"] + ".env").read().strip() == "CUDA_VISIBLE_DEVICES=0,1"
    assert (tmp_path / "run" / "logs" / "judge.log").exists()
    # the preflight ran once, before the judge server was started
    checks = open(fakes["FAKE_PYTHON_RECORD"] + ".check").read().split()
    assert len(checks) == 1 and float(checks[0]) < os.stat(fakes["FAKE_VLLM_RECORD"]).st_mtime


def test_a_refused_preflight_starts_no_server_and_no_launch(tmp_path, fakes):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    env = dict(os.environ, VLLM_BIN=fakes["VLLM_BIN"], FAKE_VLLM_RECORD=fakes["FAKE_VLLM_RECORD"],
               PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"], FAKE_CHECK_STATUS="1",
               GPUS_PER_NODE="1", JUDGE_PORT=str(_free_port()), JUDGE_MODEL="judge-x", DATA=str(data), EVAL_DATA="",
               OUTPUT_DIR=str(tmp_path / "run"))
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "warmup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert "error: --classmate.top_p must be in (0, 1]" in proc.stderr and "preflight refused the run" in proc.stderr
    assert not os.path.exists(fakes["FAKE_VLLM_RECORD"]) and not os.path.exists(fakes["FAKE_PYTHON_RECORD"])


@pytest.mark.parametrize("name, value", [("GPUS_PER_NODE", "0"), ("GPUS_PER_NODE", "two"), ("NNODES", "0"),
                                         ("VLLM_TP", "-1"), ("SERVER_GPUS", "x")])
def test_bad_gpu_counts_are_refused(name, value):
    proc = _bash("setup_gpus", {"CUDA_VISIBLE_DEVICES": "0,1", name: value})
    assert proc.returncode == 1 and f"error: {name}={value}: must be a whole number" in proc.stderr


def test_a_server_that_never_becomes_ready_fails_the_script_and_is_stopped(tmp_path, fakes):
    port = _free_port()
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    env = dict(os.environ, VLLM_BIN=fakes["VLLM_BIN"], FAKE_VLLM_RECORD=fakes["FAKE_VLLM_RECORD"],
               FAKE_VLLM_DELAY="30", SERVER_READY_TIMEOUT="1", SERVER_POLL_INTERVAL="0.1", GPUS_PER_NODE="1",
               JUDGE_PORT=str(port), PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"],
               OUTPUT_DIR=str(tmp_path / "run"), MODEL=str(tmp_path), DATA=str(data), EVAL_DATA="")
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "classmate_gdpo.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert f"judge server at http://127.0.0.1:{port}/v1: not ready after 1 s" in proc.stderr
    assert "server log" in proc.stderr and not os.path.exists(fakes["FAKE_PYTHON_RECORD"])  # never launched
    pid = json.loads(open(fakes["FAKE_VLLM_RECORD"]).readline())["pid"]
    time.sleep(0.3)
    assert not _alive(pid)


def test_a_given_judge_url_is_checked_and_its_model_name_read(tmp_path, tiny):
    port = _free_port()
    stop = _serve(port)
    env = {"JUDGE_URL": f"http://127.0.0.1:{port}/v1", "GPUS_PER_NODE": "1", "DATA": tiny["judge_data"],
           "EVAL_DATA": "", "MODEL": tiny["policy"], "OUTPUT_DIR": str(tmp_path / "out")}
    try:
        cmd, servers, report = _dry_run("baseline_grpo", env)
    finally:
        stop()
    assert servers == []  # nothing started
    assert f"--classmate.judge_base_url http://127.0.0.1:{port}/v1 --classmate.judge_model served-judge" in " ".join(cmd)
    assert "check passed: the run would start" in report  # the real preflight, with the judge flags


def test_dry_run_runs_the_real_preflight_and_stops_on_bad_data(tmp_path, tiny):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"prompt": "1 + 1 = ?", "label": "{\\"data_source\\": \\"gsm8kk\\"}"}\n')
    # both models local: the script's default classmate is a hub id, which the preflight would look up on the hub
    # (no network here: ~47 s of retries before the data check)
    env = {"MODEL": tiny["policy"], "CLASSMATE_MODEL": tiny["classmate"], "DATA": str(bad), "EVAL_DATA": "",
           "GPUS_PER_NODE": "1", "OUTPUT_DIR": str(tmp_path / "out")}
    # the script's preflight call answers as the real preflight does (exit 1, its report on stderr) ...
    proc, checks = _script_with_recorded_preflight("classmate_gsm8k", env, preflight_exit=1)
    assert proc.returncode == 1
    assert RECORDED_REFUSAL in proc.stderr  # the preflight's report reaches the user
    assert "the launcher's preflight refused the run" in proc.stderr
    assert "+ " not in proc.stdout  # no command printed: nothing would start
    # ... and the real preflight on the flags the script checked refuses the bad data, naming file:line and the fix
    (check,) = checks
    code, report = _real_preflight(check)
    assert code == 1
    assert f"error: {bad}:1: field 'label'" in report and "Did you mean 'gsm8k'" in report


FAKE_CODE_LAUNCHER = r'''#!/usr/bin/env bash
# stands in for the launcher: records the sandbox URL it was given and what the sandbox's /health said
url="$OPENRLHF_CLASSMATE_SANDBOX_URL"
printf '%s\n' "$url" > "$FAKE_PYTHON_RECORD"
"$SANDBOX_PYTHON" -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/health", timeout=10))["status"])' "$url" >> "$FAKE_PYTHON_RECORD"
echo "CODE_REWARD=${OPENRLHF_CLASSMATE_CODE_REWARD-unset}" >> "$FAKE_PYTHON_RECORD"
'''


@pytest.mark.parametrize("output_dir", ["absolute", "relative"])
def test_code_script_starts_the_sandbox_waits_launches_and_stops_it(tmp_path, output_dir):
    # relative: OUTPUT_DIR=run from another folder; the sandbox starts from the repository root, where a relative
    # log path was looked up and the service could not start ("run/logs/sandbox.log: No such file or directory")
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    fake = tmp_path / "fake_launcher"
    fake.write_text(FAKE_CODE_LAUNCHER)
    fake.chmod(0o755)
    port = _free_port()
    env = dict(os.environ, PYTHON=str(fake), SANDBOX_PYTHON=sys.executable, SANDBOX_PORT=str(port),
               SANDBOX_ARGS=f"--max-concurrency 1 --uid-base {45000 + os.getpid() % 1000}", CODE_REWARD="all_or_nothing",
               FAKE_PYTHON_RECORD=str(tmp_path / "record.txt"), GPUS_PER_NODE="1", DATA=str(data), EVAL_DATA="",
               OUTPUT_DIR=str(tmp_path / "run") if output_dir == "absolute" else "run", SERVER_POLL_INTERVAL="0.2",
               MODEL="Qwen/Qwen3-0.6B", CLASSMATE_MODEL="Qwen/Qwen3-0.6B")
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "classmate_code.sh")], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    url, health, reward = open(tmp_path / "record.txt").read().split()
    assert url == f"http://127.0.0.1:{port}" and health == "ok" and reward == "CODE_REWARD=all_or_nothing"
    assert "[train_scripts] [sandbox] isolation" in proc.stderr and "stopped 1 server(s)" in proc.stderr
    assert (tmp_path / "run" / "logs" / "sandbox.log").exists()
    with socket.socket() as s:  # the port is free again: the service is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_bad_code_reward_is_named(tmp_path):
    proc = _bash("use_sandbox", {"CODE_REWARD": "partial", "SANDBOX_URL": "http://127.0.0.1:1"})
    assert proc.returncode == 1 and "CODE_REWARD must be fraction or all_or_nothing, got 'partial'" in proc.stderr

def test_given_tinyv_and_classifier_urls_reach_the_launcher(tmp_path, tiny):
    port, a, b = _free_port(), _free_port(), _free_port()
    stops = [_serve(port), _serve(a), _serve(b)]
    data = tmp_path / "d.jsonl"
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    label = {"data_source": "bigmath_tinyv", "ground_truth": "2", "question": "1 + 1 = ?", "messages": chat}
    data.write_text(json.dumps({"prompt": chat, "label": json.dumps(label)}) + "\n")
    env = {"GPUS_PER_NODE": "1", "DATA": str(data), "EVAL_DATA": "", "MODEL": tiny["policy"],
           "TINYV_URL": f"http://127.0.0.1:{port}/v1", "TINYV_MODE": "mixed", "TINYV_WEIGHT": "0.5",
           "DARLING_CLASSIFIER_URLS": f"http://127.0.0.1:{a}/v1,http://127.0.0.1:{b}/v1"}
    try:
        tinyv, tinyv_servers, _ = _dry_run("tinyv", env)
        darling, darling_servers, _ = _dry_run("darling", env)
    finally:
        for stop in stops:
            stop()
    assert tinyv_servers == darling_servers == []  # nothing started
    assert (f"--tinyv.base_url http://127.0.0.1:{port}/v1 --tinyv.model served-judge --tinyv.mode mixed "
            "--tinyv.weight 0.5") in " ".join(tinyv)
    assert f"--darling.classifier_urls http://127.0.0.1:{a}/v1 http://127.0.0.1:{b}/v1" in " ".join(darling)


def test_missing_inputs_are_named(tmp_path, fakes):
    env = dict(os.environ, GPUS_PER_NODE="1", PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"],
               DATA=str(tmp_path / "missing.jsonl"))
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "classmate_gsm8k.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "DATA:" in proc.stderr and "setup_data" in proc.stderr
    port = _free_port()
    stop = _serve(port)
    try:
        env.update(JUDGE_URL=f"http://127.0.0.1:{port}/v1", WARMUP_MODEL=str(tmp_path / "no_warmup"))
        proc = subprocess.run(["bash", os.path.join(SCRIPTS, "self_classmate.sh")], env=env, capture_output=True,
                              text=True, timeout=60)
    finally:
        stop()
    assert proc.returncode == 1 and "train_scripts/warmup.sh first" in proc.stderr
    assert not os.path.exists(fakes["FAKE_PYTHON_RECORD"])


# ── dry runs: the printed command parses with the launcher's parser ──


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("scripts")
    words = ["a", "b", "1", "2"]
    policy = save_tiny_model(str(root / "policy"), words, hidden_size=8, num_layers=1, num_heads=2)
    classmate = save_tiny_model(str(root / "classmate"), words, hidden_size=8, num_layers=1, num_heads=2, seed=1)
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    label = {"data_source": "arithmetic", "ground_truth": "2", "messages": chat}
    judged = {"data_source": "helpful_instructions", "ground_truth": None, "raw_question_for_monitor": "1 + 1 = ?",
              "messages": chat}
    data, eval_data, judge_data = root / "train.jsonl", root / "eval.jsonl", root / "helpful.jsonl"
    for path, lab in ((data, label), (eval_data, label), (judge_data, judged)):
        path.write_text(json.dumps({"prompt": chat, "label": json.dumps(lab)}) + "\n")
    return {"policy": policy, "classmate": classmate, "data": str(data), "eval": str(eval_data), "root": str(root),
            "judge_data": str(judge_data)}


# the scripts' python in the dry runs: the preflight call (``--check``) is recorded (flags and the launcher's
# environment), not run; the test runs the real preflight in-process on exactly those flags, without a second
# interpreter importing torch, Ray and DeepSpeed for it (~8 s of CPU per script); any other call is the real python.
# With PREFLIGHT_EXIT set, the recorded call answers as a refusing preflight does: a report on stderr, that exit code.
RECORDED_REFUSAL = "error: (the recorded preflight refuses the run)"
RECORDING_PYTHON = """#!{python}
import json, os, sys
PREFLIGHT = ["-m", "openrlhf_classmate.cli.train_ppo_ray", "--check"]
if sys.argv[1:4] == PREFLIGHT:
    env = {{k: v for k, v in os.environ.items() if k.startswith(("OPENRLHF_CLASSMATE_", "DARLING_", "TINYV_", "VRCLI_"))}}
    with open(os.environ["PREFLIGHT_RECORD"], "a") as f:
        f.write(json.dumps({{"flags": sys.argv[4:], "env": env, "cwd": os.getcwd()}}) + "\\n")
    code = int(os.environ.get("PREFLIGHT_EXIT", "0"))
    if code:
        print({refusal!r}, file=sys.stderr)
    sys.exit(code)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def _real_preflight(record: dict) -> tuple[int, str]:
    """The launcher's preflight on a recorded ``--check`` call, in-process: its exit code and what it printed."""
    import contextlib
    import io
    from unittest import mock

    from openrlhf_classmate.cli import train_ppo_ray

    out = io.StringIO()
    code = 0
    with mock.patch.dict(os.environ, record["env"]), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        cwd = os.getcwd()
        os.chdir(record["cwd"])
        try:
            train_ppo_ray.main(["--check", *record["flags"]])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=out)  # sys.exit("error: ...") prints its message to stderr
        finally:
            os.chdir(cwd)
    return code, out.getvalue()


def _script_with_recorded_preflight(script: str, env: dict, *args: str,
                                    preflight_exit: int = 0) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``script`` with DRY_RUN=1 and the recording python; returns the finished process and the recorded
    preflight calls."""
    full = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    with tempfile.TemporaryDirectory(prefix="dry_run_") as bindir:
        python = os.path.join(bindir, "python")
        with open(python, "w") as f:
            f.write(RECORDING_PYTHON.format(python=sys.executable, refusal=RECORDED_REFUSAL))
        os.chmod(python, 0o755)
        full.update(DRY_RUN="1", PYTHON=python, PREFLIGHT_RECORD=os.path.join(bindir, "preflight.jsonl"),
                    PREFLIGHT_EXIT=str(preflight_exit), **env)
        command = RUNS.get(script, [f"{script}.sh"])
        proc = subprocess.run(["bash", os.path.join(SCRIPTS, command[0]), *command[1:], *args], env=full,
                              capture_output=True, text=True, timeout=300)
        checks = []
        if os.path.exists(full["PREFLIGHT_RECORD"]):
            with open(full["PREFLIGHT_RECORD"]) as f:
                checks = [json.loads(line) for line in f]
    return proc, checks


def _dry_run(script: str, env: dict, *args: str) -> tuple[list[str], list[str], str]:
    """Run ``script`` with DRY_RUN=1; returns the launcher command it printed, the server commands, and what the
    real preflight printed for the flags the script checked (which must be those of the printed command)."""
    proc, checks = _script_with_recorded_preflight(script, env, *args)
    assert proc.returncode == 0, proc.stderr
    commands = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    launcher = [c for c in commands if "openrlhf_classmate.cli.train_ppo_ray" in c]
    assert len(launcher) == 1, proc.stdout
    cmd = launcher[0]
    servers = [c for c in commands if c is not cmd]
    # the script ran the preflight once, on the flags it launches with
    assert len(checks) == 1 and checks[0]["flags"] == _launcher_flags(cmd), (checks, cmd)
    code, report = _real_preflight(checks[0])
    assert code == 0 and "check passed: the run would start" in report, report
    return cmd, [" ".join(s) for s in servers], report


def _launcher_flags(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("openrlhf_classmate.cli.train_ppo_ray") + 1:]


@pytest.mark.parametrize("script", sorted(RUNS))
def test_dry_run_command_parses_and_maps_the_environment(script, tiny, tmp_path):
    out = str(tmp_path / "out")
    env = {"MODEL": tiny["policy"], "CLASSMATE_MODEL": tiny["classmate"], "DATA": tiny["data"],
           "EVAL_DATA": tiny["eval"], "OUTPUT_DIR": out, "GPUS_PER_NODE": "2",
           "DARLING_CLASSIFIER_MODEL": tiny["classmate"], "JUDGE_PORT": "8123"}
    extra = []
    if script == "vrcli":  # VR-CLI rows (without precomputed baselines: computed online)
        from openrlhf_classmate.testing.vrcli_world import write_story_rows

        env["DATA"] = env["EVAL_DATA"] = str(tmp_path / "stories.jsonl")
        write_story_rows(env["DATA"], 2, seed=0)
        extra = ["--vrcli.baseline", "online"]
    cmd, servers, _ = _dry_run(script, env, "--train.seed", "7", *extra)
    args = parse_args(_launcher_flags(cmd))
    assert cmd[0].endswith("python") or "python" in os.path.basename(cmd[0])
    assert args.config == os.path.join(REPO, "configs", f"{script}.yaml")
    assert args.actor.model_name_or_path == tiny["policy"]
    assert args.data.prompt_dataset == env["DATA"] and args.eval.dataset == env["EVAL_DATA"]
    assert args.ckpt.path == f"{out}/ckpt" and args.ckpt.output_dir == f"{out}/final"
    assert args.logger.tensorboard_dir == f"{out}/tensorboard"
    assert args.actor.num_gpus_per_node == 2 and args.vllm.num_engines == 2 and args.ref.num_gpus_per_node == 2
    assert args.train.seed == 7  # the script's own arguments win
    if script in CLASSMATE_SCRIPTS:
        assert args.classmate.model_name_or_path == [tiny["classmate"]] and args.classmate.num_engines == 2
    else:
        assert args.classmate.model_name_or_path is None
    if script in JUDGE_SCRIPTS:
        assert args.classmate.judge_base_url == "http://127.0.0.1:8123/v1"
        assert len(servers) == 1 and servers[0].startswith("vllm serve Qwen/Qwen3-4B-Instruct-2507")
        assert "--port 8123" in servers[0] and "--gpu-memory-utilization 0.2" in servers[0]
    elif script == "tinyv":
        assert args.tinyv.base_url == "http://127.0.0.1:8001/v1" and args.tinyv.model == "zhangchenxu/TinyV-1.5B"
        assert servers == [s for s in servers if s.startswith("vllm serve zhangchenxu/TinyV-1.5B")] and servers
    elif script == "darling":
        assert len(servers) == 1 and "--runner pooling" in servers[0]
        assert args.darling.classifier_urls == ["http://127.0.0.1:8010/v1"] and args.darling.diversity == "partition"
    elif script == "classmate_code":
        assert len(servers) == 1 and "-m openrlhf_classmate.sandbox --host 127.0.0.1 --port 8001" in servers[0]
    else:
        assert servers == []


def test_self_classmate_defaults_both_models_to_the_warmup_model(tiny):
    cmd, _, _ = _dry_run("self_classmate", {"WARMUP_MODEL": tiny["policy"], "DATA": tiny["data"],
                                            "EVAL_DATA": "", "GPUS_PER_NODE": "1"})
    args = parse_args(_launcher_flags(cmd))
    assert args.actor.model_name_or_path == tiny["policy"] and args.classmate.model_name_or_path == [tiny["policy"]]
    assert args.eval.dataset == ""  # EVAL_DATA="" turns evaluation off


def test_dry_run_on_a_ray_cluster_submits_a_job(tiny):
    env = {"MODEL": tiny["policy"], "CLASSMATE_MODEL": tiny["classmate"], "DATA": tiny["data"], "EVAL_DATA": "",
           "GPUS_PER_NODE": "8", "NNODES": "2", "RAY_ADDRESS": "http://10.0.0.1:8265", "SERVER_HOST": "10.0.0.1",
           "HF_HOME": "/shared/hf", "RAY_JOB_ENV_VARS": "MY_VAR", "MY_VAR": "x"}
    cmd, servers, _ = _dry_run("classmate_gdpo", env)
    sep = cmd.index("--")
    assert os.path.basename(cmd[0]) == "ray" and cmd[1:5] == ["job", "submit", "--address", "http://10.0.0.1:8265"]
    runtime_env = json.loads(cmd[cmd.index("--runtime-env-json") + 1])
    assert runtime_env["working_dir"] == REPO and ".venv/" in runtime_env["excludes"]
    assert {"HF_HOME": "/shared/hf", "MY_VAR": "x"}.items() <= runtime_env["env_vars"].items()
    assert "PATH" not in runtime_env["env_vars"]  # only the listed names travel
    args = parse_args(_launcher_flags(cmd[sep + 1:]))
    assert args.actor.num_nodes == 2 and args.actor.num_gpus_per_node == 8 and args.vllm.num_engines == 16
    assert args.classmate.num_engines == 16
    # 16 actor GPUs: the config's 16 samples per GPU and micro-batch would be 0.5 micro-batches per optimizer step of
    # 128 (DeepSpeed asserted after Ray had started): 8 per GPU; the global sizes stay the config's
    assert (args.train.micro_batch_size, args.train.batch_size, args.rollout.batch_size) == (8, 128, 64)
    assert runtime_env["env_vars"]["OPENRLHF_CLASSMATE_GPUS"] == "16"  # the launcher counts its layout against it
    assert args.classmate.judge_base_url == "http://10.0.0.1:8000/v1"  # reachable from the other nodes
    assert "--host 0.0.0.0" in servers[0]


def test_classmate_engines_are_sized_by_where_they_run():
    snippet = 'setup_gpus; use_classmate; echo "$OPENRLHF_CLASSMATE_GPUS|${RUN_ARGS[*]}"'
    eight = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "CLASSMATE_MODEL": "Qwen/Qwen3-0.6B"}
    # beside the policy engines (the default): one classmate engine per training GPU, the config's placement (auto)
    total, flags = _bash(snippet, eight).stdout.strip().split("|")
    assert total == "8" and "--actor.num_gpus_per_node 8" in flags and "--vllm.num_engines 8" in flags
    assert "--classmate.num_engines 8" in flags and "--classmate.placement" not in flags
    # CLASSMATE_GPUS=N: N GPUs of each node for classmate engines of their own, the actor on the others
    total, flags = _bash(snippet, {**eight, "CLASSMATE_GPUS": "2", "NNODES": "2"}).stdout.strip().split("|")
    assert total == "16" and "--actor.num_nodes 2 --actor.num_gpus_per_node 6" in flags
    assert "--vllm.num_engines 12" in flags and "--classmate.placement separate --classmate.num_engines 4" in flags
    proc = _bash(snippet, {**eight, "CLASSMATE_GPUS": "8"})
    assert proc.returncode == 1 and "CLASSMATE_GPUS=8 leaves none of the GPUS_PER_NODE=8 GPUs" in proc.stderr


def test_placement_separate_through_a_script_needs_gpus_of_its_own(tiny):
    # one classmate engine per GPU with placement separate asked Ray for twice the node's GPUs, and Ray waited
    env = {"MODEL": tiny["policy"], "CLASSMATE_MODEL": tiny["classmate"], "DATA": tiny["data"], "EVAL_DATA": "",
           "GPUS_PER_NODE": "2"}
    proc, checks = _script_with_recorded_preflight("classmate_gsm8k", env, "--classmate.placement", "separate")
    assert proc.returncode == 1 and checks == [] and "openrlhf_classmate.cli.train_ppo_ray" not in proc.stdout
    assert "error: --classmate.placement separate gives each classmate engine a GPU of its own, but all 2 GPUs " \
           "train here: set CLASSMATE_GPUS=N" in proc.stderr
    proc, _ = _script_with_recorded_preflight("classmate_gsm8k", {**env, "CLASSMATE_GPUS": "1"},
                                              "--classmate.placement", "share")
    assert proc.returncode == 1 and "CLASSMATE_GPUS=1 keeps GPUs of each node for the classmate engines" in proc.stderr
    cmd, _, report = _dry_run("classmate_gsm8k", {**env, "CLASSMATE_GPUS": "1"}, "--classmate.placement", "separate")
    args = parse_args(_launcher_flags(cmd))
    assert (args.actor.num_gpus_per_node, args.vllm.num_engines, args.classmate.num_engines) == (1, 1, 1)
    assert "layout: 1 GPU(s) (1 for the actor) asked of Ray, of 2 available (OPENRLHF_CLASSMATE_GPUS=2)" in report


def test_a_server_on_the_training_gpus_is_counted_by_placement_auto(tiny):
    env = {"MODEL": tiny["policy"], "CLASSMATE_MODEL": tiny["classmate"], "DATA": tiny["judge_data"],
           "EVAL_DATA": "", "GPUS_PER_NODE": "1", "JUDGE_PORT": "8124"}
    _, checks = _script_with_recorded_preflight("classmate_gdpo", env)
    assert checks[0]["env"]["OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY"] == "0.2"  # the judge's fraction of the GPU
    _, checks = _script_with_recorded_preflight("classmate_gdpo", {**env, "CUDA_VISIBLE_DEVICES": "0,1",
                                                                   "SERVER_GPUS": "1"})
    assert "OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY" not in checks[0]["env"]  # a GPU of its own


def test_convert_checkpoint_script_usage():
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "convert_checkpoint.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and "CKPT_DIR OUT_DIR [TAG]" in proc.stderr


def test_the_scripts_tell_a_local_path_from_a_hub_id_as_the_preflight_does(tmp_path):
    # one rule for both: a path the scripts call a hub id and the preflight calls local (or the reverse) would pass
    # one check and fail the other with a message about the wrong thing
    cases = ["/abs/model", "./rel", "../up", "~/home", "a/b/c", "Qwen/Qwen2.5-0.5B", "gpt2", "my model",
             "org/na me", "runs/warmup/final", "data.jsonl", "-flag"]
    lines = _bash("for p in " + " ".join(shlex.quote(c) for c in cases)
                  + '; do if _looks_local "$p"; then echo local; else echo hub; fi; done').stdout.split()
    expected = ["local" if looks_local(c) else "hub" for c in cases]
    assert lines == expected
    assert expected[:5] == ["local"] * 5 and expected[5:7] == ["hub", "hub"] and expected[7] == "local"



# ── the environment a researcher sets: switches, counts, waits, keys, log folders ──

@pytest.mark.parametrize("value, dry", [("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False),
                                        ("false", False), ("NO", False), ("off", False), ("", False)])
def test_dry_run_takes_the_usual_words(value, dry):
    proc = _bash("if is_dry_run; then echo dry; else echo real; fi", {"DRY_RUN": value})
    assert proc.returncode == 0 and proc.stdout.strip() == ("dry" if dry else "real"), proc.stderr


@pytest.mark.parametrize("name", ["DRY_RUN", "PREFLIGHT", "RAY_SUBMIT"])
def test_a_switch_with_another_value_is_refused_before_any_work(name, tmp_path, fakes):
    # DRY_RUN=maybe used to start a real run (only "1" counted); now no preflight, server or launcher runs
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    env = dict(os.environ, PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"],
               GPUS_PER_NODE="1", DATA=str(data), EVAL_DATA="", OUTPUT_DIR=str(tmp_path / "run"), **{name: "maybe"})
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "classmate_gsm8k.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (f"[train_scripts] error: {name}=maybe: use 1 (or true, yes, on) "
                                                    "or 0 (or false, no, off)")
    assert not any(os.path.exists(fakes["FAKE_PYTHON_RECORD"] + end) for end in ("", ".check"))


def test_preflight_and_ray_submit_take_the_words_for_off(tiny):
    env = {"GPUS_PER_NODE": "1", "DATA": tiny["data"], "EVAL_DATA": "", "MODEL": tiny["policy"],
           "CLASSMATE_MODEL": tiny["classmate"], "PREFLIGHT": "false", "RAY_ADDRESS": "auto", "RAY_SUBMIT": "no"}
    proc, checks = _script_with_recorded_preflight("classmate_gsm8k", env)
    assert proc.returncode == 0, proc.stderr
    assert checks == [] and "PREFLIGHT=false: skipping the launcher's --check" in proc.stderr
    launcher = [line for line in proc.stdout.splitlines() if "train_ppo_ray" in line]
    assert len(launcher) == 1 and " job submit " not in launcher[0]  # run directly, not submitted


@pytest.mark.parametrize("name, value, message", [
    ("SERVER_READY_TIMEOUT", "2.5", "SERVER_READY_TIMEOUT=2.5: must be a whole number >= 1"),
    ("SERVER_ATTACH_TIMEOUT", "1e3", "SERVER_ATTACH_TIMEOUT=1e3: must be a whole number >= 1"),
    ("SERVER_POLL_INTERVAL", "0", "SERVER_POLL_INTERVAL=0: must be a number of seconds > 0"),
    ("JUDGE_API_KEY_ENV", "sk-my-key", "JUDGE_API_KEY_ENV is not the name of an environment variable"),
])
def test_server_wait_settings_bash_cannot_use_are_refused_before_any_server_starts(name, value, message, tmp_path,
                                                                                  fakes):
    # SERVER_READY_TIMEOUT=2.5 used to print a bash arithmetic error at every poll and never time out
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    env = dict(os.environ, VLLM_BIN=fakes["VLLM_BIN"], FAKE_VLLM_RECORD=fakes["FAKE_VLLM_RECORD"],
               PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"], GPUS_PER_NODE="1",
               JUDGE_PORT=str(_free_port()), JUDGE_MODEL="judge-x", DATA=str(data), EVAL_DATA="",
               OUTPUT_DIR=str(tmp_path / "run"), **{name: value})
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "warmup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and f"[train_scripts] error: {message}" in proc.stderr, proc.stderr
    assert "sk-my-key" not in proc.stderr  # a key put where its variable's name belongs is not echoed
    assert not os.path.exists(fakes["FAKE_VLLM_RECORD"]) and not os.path.exists(fakes["FAKE_PYTHON_RECORD"] + ".check")


def test_counts_with_a_leading_zero_are_decimal_all_the_way():
    # GPUS_PER_NODE=08 passed the check but broke later arithmetic ("value too great for base")
    proc = _bash('setup_gpus; echo "$GPUS_PER_NODE|$TRAIN_CUDA_DEVICES|$SERVER_CUDA_DEVICES|$TOTAL_GPUS"',
                 {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(9))), "GPUS_PER_NODE": "08", "SERVER_GPUS": "01"})
    assert proc.returncode == 0 and proc.stdout.strip() == "8|0,1,2,3,4,5,6,7|8|8", proc.stderr


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_bad_darling_server_count_is_named(value):
    proc = _bash("use_darling_classifiers", {"DARLING_NUM_SERVERS": value, "DARLING_CLASSIFIER_MODEL": "m"})
    assert proc.returncode == 1
    assert f"[train_scripts] error: DARLING_NUM_SERVERS={value}: must be a whole number >= 1" in proc.stderr


def test_server_logs_go_to_the_runs_own_folder(tmp_path, fakes):
    # without OUTPUT_DIR, every script that starts a server wrote runs/run/logs/ (two runs overwrote each other's
    # judge.log); the log is the run's, runs/warmup/logs/judge.log, as the README says, also for a relative RUNS_DIR
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    env = dict(os.environ, VLLM_BIN=fakes["VLLM_BIN"], FAKE_VLLM_RECORD=fakes["FAKE_VLLM_RECORD"],
               PYTHON=fakes["FAKE_PYTHON"], FAKE_PYTHON_RECORD=fakes["FAKE_PYTHON_RECORD"], GPUS_PER_NODE="1",
               JUDGE_PORT=str(_free_port()), JUDGE_MODEL="judge-x", DATA=str(data), EVAL_DATA="", RUNS_DIR="runs",
               SERVER_POLL_INTERVAL="0.1")
    env.pop("OUTPUT_DIR", None)
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, "warmup.sh")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "runs" / "warmup" / "logs" / "judge.log"
    assert log.exists() and f"(log: {log})" in proc.stderr
    assert not (tmp_path / "runs" / "run").exists()


def test_a_judge_that_needs_an_api_key_is_asked_with_it(tmp_path, tiny):
    # a hosted judge answers 401 without its key: the script's readiness poll and model-name lookup send the key of
    # JUDGE_API_KEY_ENV (default OPENAI_API_KEY, as the launcher), which is also what the launcher is told to read
    port = _free_port()
    stop = _serve(port, key="s3cret")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        ready = _bash(f"wait_ready judge {url} 2 '' '' /models MY_JUDGE_KEY", {"MY_JUDGE_KEY": "s3cret"})
        no_key = _bash(f"wait_ready judge {url} 1", {"MY_JUDGE_KEY": "s3cret"})
        # not a dry run: the attach waits for the server (with the key) and reads its model name
        args = 'printf "%s\\n" "${RUN_ARGS[@]}"'
        judge = _bash(f"use_judge; {args}", {"JUDGE_URL": url, "OPENAI_API_KEY": "s3cret", "DRY_RUN": "0"})
        tinyv = _bash(f"use_tinyv; {args}", {"TINYV_URL": url, "TINYV_API_KEY_ENV": "MY_KEY", "MY_KEY": "s3cret",
                                            "DRY_RUN": "0"})
        tinyv_no_key = _bash("use_tinyv", {"TINYV_URL": url, "SERVER_ATTACH_TIMEOUT": "1", "DRY_RUN": "0"})
        env = {"JUDGE_URL": url, "GPUS_PER_NODE": "1", "DATA": tiny["judge_data"], "EVAL_DATA": "",
               "MODEL": tiny["policy"], "OUTPUT_DIR": str(tmp_path / "out")}
        named, _, _ = _dry_run("baseline_grpo", {**env, "JUDGE_API_KEY_ENV": "MY_JUDGE_KEY", "MY_JUDGE_KEY": "s3cret"})
        default, _, _ = _dry_run("baseline_grpo", {**env, "OPENAI_API_KEY": "s3cret"})
    finally:
        stop()
    assert ready.returncode == 0 and "judge server ready" in ready.stderr, ready.stderr
    assert no_key.returncode == 1 and "never answered 200" in no_key.stderr
    assert judge.returncode == 0 and judge.stdout.split()[-4:] == [
        "--classmate.judge_base_url", url, "--classmate.judge_model", "served-judge"], judge.stderr
    assert tinyv.returncode == 0 and tinyv.stdout.split()[-6:] == [
        "--tinyv.base_url", url, "--tinyv.model", "served-judge", "--tinyv.api_key_env", "MY_KEY"], tinyv.stderr
    assert tinyv_no_key.returncode == 1 and "never answered 200" in tinyv_no_key.stderr
    assert "--classmate.judge_model served-judge --classmate.judge_api_key_env MY_JUDGE_KEY" in " ".join(named)
    assert "--classmate.judge_model served-judge" in " ".join(default)
    assert "s3cret" not in " ".join(named + default)  # the key's name travels, never the key

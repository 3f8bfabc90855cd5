"""The multi-node path on one host: ``train_scripts/slurm_template.sbatch`` itself, run as SLURM runs it, against a
Ray cluster of two nodes on this machine.

Fake ``srun`` / ``scontrol`` run each SLURM step here (``srun -w NODE CMD`` runs CMD with ``SLURMD_NODENAME=NODE``), so
the template's own steps run: its Ray head (``ray start --head``), a second raylet joined with ``ray start --address
HEAD:PORT``, its wait until both nodes have joined, the run script (``classmate_gsm8k.sh``, which needs no server) with
``RAY_ADDRESS`` set to the head's dashboard, so that lib.sh submits the launcher with ``ray job submit`` (the working
directory uploaded as the job's runtime env), one training step on CPU (logical GPUs: one per node, so the actor's
two DeepSpeed ranks must span both nodes; HF engines), and the template's clean-up.

What one host cannot share between two Ray nodes is set through the template's ``RAY_BIN`` (a wrapper of the real
``ray``): each node's ``ray start`` gets its own temp dir and its own dashboard-agent and client ports (fixed defaults
that a real node has to itself), and ``ray stop`` stops this cluster's nodes only (the real one ends every Ray process
of the machine: other tests' clusters). Not covered here: several real hosts, NCCL between nodes, a shared filesystem,
real SLURM (its step and resource semantics)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from openrlhf_classmate.ports import free_port
from openrlhf_classmate.testing.e2e import build_world

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(REPO, "train_scripts", "slurm_template.sbatch")
NODES = ["node1", "node2"]
TIMEOUT_S = 900.0  # ~1.5 min on two idle cores, under 3 min on a loaded machine

# srun: the step's command runs here, once per task; -w NODE names the node (SLURMD_NODENAME, as srun sets it)
SRUN = r"""#!/usr/bin/env bash
set -euo pipefail
ntasks=1 node=""
while (($#)); do
  case "$1" in
    -w | --nodelist) node=$2; shift 2 ;;
    --nodelist=*) node=${1#*=}; shift ;;
    -n | --ntasks) ntasks=$2; shift 2 ;;
    --ntasks=*) ntasks=${1#*=}; shift ;;
    -N | --nodes) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [[ -n "$node" ]]; then SLURMD_NODENAME=$node exec "$@"; fi
IFS=, read -r -a nodes <<<"$SLURM_JOB_NODELIST"
for ((i = 0; i < ntasks; i++)); do SLURMD_NODENAME=${nodes[i]} "$@"; done
"""

# scontrol show hostnames a,b,...: one name a line
SCONTROL = r"""#!/usr/bin/env bash
[[ "${1:-} ${2:-}" == "show hostnames" ]] || { echo "fake scontrol: only 'show hostnames'" >&2; exit 2; }
tr ',' '\n' <<<"$3"
"""

# RAY_BIN: the real ray, each call logged with the node it runs on; `start` gets the node's own temp dir and ports
# (FAKE_RAY_ARGS_<node>); `stop` stops the nodes this cluster started (SIGTERM to their `ray start --block`, which then
# stops its node's processes), not every Ray process of the machine
RAY = r"""#!/usr/bin/env bash
set -euo pipefail
node=${SLURMD_NODENAME:-batch}
echo "$node: ray $*" >>"$FAKE_SLURM_LOG"
case "${1:-}" in
  start)
    echo $$ >>"$FAKE_RAY_PIDS"
    var=FAKE_RAY_ARGS_$node
    read -r -a extra <<<"${!var}"
    exec "$FAKE_PYTHON" -m ray.scripts.scripts "$@" "${extra[@]}" ;;
  stop)
    [[ -f "$FAKE_RAY_PIDS" ]] || exit 0
    mapfile -t pids <"$FAKE_RAY_PIDS"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 600); do
      alive=0
      for pid in "${pids[@]}"; do if kill -0 "$pid" 2>/dev/null; then alive=1; fi; done
      ((alive)) || exit 0
      sleep 0.1
    done
    exit 1 ;;
  *) exec "$FAKE_PYTHON" -m ray.scripts.scripts "$@" ;;
esac
"""

# the launcher flags of a one-step CPU run (the run script's config otherwise: classmate_gsm8k.yaml)
TINY_RUN = ["--engine.backend", "hf", "--ds.attn_implementation", "sdpa", "--data.max_samples", "2",
            "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.micro_batch_size", "2",
            "--train.batch_size", "4", "--train.micro_batch_size", "1", "--rollout.max_new_tokens", "8",
            "--classmate.max_new_tokens", "8", "--data.max_len", "64", "--train.num_episodes", "1"]


def _cluster_pids(session: int | None, token: str) -> list[int]:
    """Live processes of the run: those of the template's session (Ray's daemons and workers), and those naming
    ``token`` (this test's folder) on their command line (the job's driver, which Ray starts in a session of its own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
        if fields[0] != "Z" and (int(fields[3]) == session or token.encode() in cmdline):
            pids.append(int(entry))
    return pids


def _wait_gone(session: int | None, token: str, limit_s: float) -> list[int]:
    deadline = time.time() + limit_s
    while (left := _cluster_pids(session, token)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def _stop(session: int | None, token: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _cluster_pids(session, token):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if not _wait_gone(session, token, 20.0):
            return


@pytest.fixture
def one_host(tmp_path):
    """A short folder for the cluster (Ray's socket paths must stay under 108 bytes) with the fake SLURM commands;
    whatever the run left is stopped afterwards, passed or failed."""
    base = tempfile.mkdtemp(prefix="raycl-", dir="/tmp" if os.path.isdir("/tmp") else None)
    bindir = os.path.join(base, "bin")
    os.makedirs(bindir)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("ray", RAY)):
        with open(os.path.join(bindir, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(bindir, name), 0o755)
    state = {"base": base, "bin": bindir, "session": None}
    yield state
    _stop(state["session"], base)
    shutil.rmtree(base, ignore_errors=True)


def test_the_slurm_template_runs_one_step_on_a_two_node_ray_cluster(one_host, tmp_path):
    base = one_host["base"]
    world = build_world(os.path.join(base, "world"), num_prompts=2)
    ports = set()
    while len(ports) < 5:
        ports.add(free_port())
    ray_port, dashboard_port, client_port, agent1, agent2 = ports
    log_path, slurm_log = str(tmp_path / "slurm_job.log"), str(tmp_path / "slurm_steps.log")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM") and k not in ("RAY_ADDRESS", "NNODES", "GPUS_PER_NODE")}
    env.update({
        "PATH": f"{one_host['bin']}:{env.get('PATH', '')}", "RAY_BIN": os.path.join(one_host["bin"], "ray"),
        "FAKE_PYTHON": sys.executable, "FAKE_SLURM_LOG": slurm_log, "FAKE_RAY_PIDS": os.path.join(base, "ray_pids"),
        "FAKE_RAY_ARGS_node1": f"--temp-dir {base}/node1 --num-cpus 4 --ray-client-server-port {client_port} "
                               f"--dashboard-agent-listen-port {agent1}",
        "FAKE_RAY_ARGS_node2": f"--temp-dir {base}/node2 --num-cpus 4 --dashboard-agent-listen-port {agent2}",
        "SLURM_JOB_NODELIST": ",".join(NODES), "REPO": REPO, "RUN": "classmate_gsm8k", "PYTHON": sys.executable,
        "GPUS_PER_NODE": "1", "RAY_PORT": str(ray_port), "RAY_DASHBOARD_PORT": str(dashboard_port),
        "RAY_JOIN_TIMEOUT": "300", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
        "MODEL": world["policy"], "CLASSMATE_MODEL": world["classmate"], "DATA": world["data"], "EVAL_DATA": "",
        "OUTPUT_DIR": os.path.join(base, "out"),
    })
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", TEMPLATE, *TINY_RUN], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        one_host["session"] = proc.pid
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
    text = open(log_path, errors="replace").read()
    steps = open(slurm_log).read() if os.path.exists(slurm_log) else ""

    def report() -> str:
        return f"\n--- ray calls ---\n{steps}\n--- job log (tail) ---\n{text[-8000:]}"

    assert code == 0, f"the template exited with {code} after {time.time() - started:.0f} s" + report()
    # the template's cluster: a head on the first node, a worker joined to it from the second, both waited for
    head_ip = re.search(r"^Ray head: node1 \((\S+)\), 2 node\(s\) x 1 GPU\(s\)$", text, re.M)
    assert head_ip and "Ray cluster ready: 2 node(s)" in text, report()
    ip = head_ip.group(1)
    calls = steps.splitlines()
    assert any(c.startswith(f"node1: ray start --head --node-ip-address={ip} --port={ray_port} ") for c in calls)
    assert any(c.startswith(f"node2: ray start --address={ip}:{ray_port} --num-gpus=1 ") for c in calls), report()
    # the run script submitted the launcher to it as a Ray job, with the two nodes' layout, and the job succeeded
    [submit] = [c for c in calls if c.startswith(f"batch: ray job submit --address http://{ip}:{dashboard_port} ")]
    assert "--actor.num_nodes 2 --actor.num_gpus_per_node 1" in submit and "--engine.backend hf" in submit
    assert re.search(r"Global step 1: \{", text), report()
    assert re.search(r"Job 'raysubmit_\w+' succeeded", text), report()
    assert os.path.isfile(os.path.join(base, "out", "final", "model.safetensors"))  # written by the job's actors
    # the actor's two ranks ran one on each node (each node logs its own workers under its own temp dir)
    for node in NODES:
        actors = set()
        for path in glob.glob(os.path.join(base, node, "session_*", "logs", "worker-*.out")):
            actors.update(re.findall(r"^:actor_name:(\w+)$", open(path, errors="replace").read(), re.M))
        assert "ClassmatePolicyModelActor" in actors, (node, actors)
    # the template's clean-up stopped both nodes (its `ray stop` on every node, then its srun steps)
    assert [c for c in calls if " ray stop" in c] == ["node1: ray stop --force", "node2: ray stop --force"]
    left = _wait_gone(one_host["session"], base, 60.0)
    assert not left, f"processes of the cluster still running after the template's exit: {left}"

"""``integration/launch/host_memory.py``: what the offload and sleep flags keep in a node's RAM, refused at launch when
it cannot fit (a 7.6B policy with Adam offload on one 125.9 GiB H200 node was killed by Ray's memory monitor two minutes
into its start-up: ``bench/GPU_RESULTS.md`` section 12)."""

from __future__ import annotations

import json
import os

import pytest
from ray.exceptions import OutOfMemoryError

from openrlhf_classmate.cli import train_ppo_ray
from openrlhf_classmate.integration.launch import host_memory
from openrlhf_classmate.integration.launch.actor_died import actor_died_message
from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.testing.tiny_models import save_tiny_model

DEVICE_NODE = 125.87 * 2**30  # the H200 machine's memory as Ray reported it ("125.87GB": Ray's GB are GiB)
QWEN7B, QWEN15B = 7_615_616_512, 1_543_714_304  # bench/capacity.py's shapes (tests/test_gpu_scripts.py checks them)


def _args(*flags: str):
    return parse_args(["--actor.model_name_or_path", "/m/policy", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
                       "--rollout.n_samples_per_prompt", "4", "--classmate.model_name_or_path", "/m/classmate", *flags])


def test_the_parameter_count_comes_from_the_safetensors_headers(tmp_path):
    import transformers

    path = save_tiny_model(str(tmp_path / "m"), ["a", "b", "c"], hidden_size=16, num_layers=2, num_heads=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert host_memory.parameter_count(path) == model.num_parameters() > 1000
    assert host_memory.parameter_count(str(tmp_path / "missing")) is None
    assert host_memory.parameter_count("Qwen/Qwen2.5-7B") is None  # a hub id: nothing to read here


def test_the_7b_one_gpu_cell_is_refused_with_its_figures_and_the_two_gpu_layout_is_not():
    # the killed cell's flags: ZeRO-2, Adam offload, the policy engine sleeping, the 1.5B classmate awake (share)
    args = _args("--ds.adam_offload", "--vllm.enable_sleep", "--train.colocate_all", "--classmate.placement", "share",
                 "--vllm.gpu_memory_utilization", "0.15", "--classmate.gpu_memory_utilization", "0.06")
    params = {"/m/policy": QWEN7B, "/m/classmate": QWEN15B}
    problem, note = host_memory.host_memory_problem(args, params, int(DEVICE_NODE), env={})
    assert note is None and problem == (
        "host memory: --ds.adam_offload: Adam's fp32 master weights, moments and gradients 113.5 GiB + "
        "--vllm.enable_sleep: 1 sleeping policy engine(s)' weights 14.2 GiB = 127.7 GiB on each node, above the "
        "119.6 GiB this node allows of its 125.9 GiB (Ray kills a worker above 0.95 of it "
        "(RAY_memory_usage_threshold)): the run would be killed while it loads its models; spread the actor over more "
        "GPUs with --ds.zero_stage 3 (its optimizer state on the GPUs, without --ds.adam_offload), or use nodes with "
        "more memory")
    # the same node without Ray's monitor: 127.7 GiB is still above all of it
    assert host_memory.host_memory_problem(args, params, int(DEVICE_NODE),
                                           env={"RAY_memory_monitor_refresh_ms": "0"})[0] is not None
    # twice the memory: it fits, and the note says by how much
    problem, note = host_memory.host_memory_problem(args, params, int(2 * DEVICE_NODE), env={})
    assert problem is None and note.endswith("= 127.7 GiB of this node's 251.7 GiB (Ray kills a worker above 0.95 "
                                             "of it (RAY_memory_usage_threshold))")
    # the layout that ran (section 6): ZeRO-3 over two GPUs, Adam on the GPUs: only the sleeping engines' weights
    two = _args("--ds.zero_stage", "3", "--vllm.enable_sleep", "--train.colocate_all", "--actor.num_gpus_per_node",
                "2", "--vllm.num_engines", "2")
    parts = host_memory.host_parts(two, params)
    assert [(what.split(":")[0], round(b / 2**30, 1)) for what, b in parts] == [("--vllm.enable_sleep", 28.4)]
    assert host_memory.host_memory_problem(two, params, int(DEVICE_NODE), env={})[0] is None


def test_each_flag_adds_its_own_part():
    params = {"/m/policy": 1_000_000_000, "/m/classmate": 500_000_000}
    by_flag = {
        (): [],
        ("--ds.enable_sleep",): [("--ds.enable_sleep", 14.0)],
        ("--ds.adam_offload", "--ds.enable_sleep"): [("--ds.adam_offload", 16.0)],  # upstream skips the DS sleep
        ("--ref.offload",): [],  # ZeRO-2: upstream's reference runs at stage 0, where DeepSpeed does not offload
        ("--ref.offload", "--ds.zero_stage", "3"): [("--ref.offload", 2.0)],
        ("--ref.offload", "--algo.kl.init_coef", "0"): [],  # no KL term: upstream builds no reference
        ("--train.colocate_all", "--classmate.placement", "colocate", "--classmate.num_engines", "2",
         "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2", "--vllm.num_engines", "2"):
            [("sleeping classmate engines' weights (2 per classmate)", 2.0)],
        ("--ds.adam_offload", "--actor.num_nodes", "2", "--actor.num_gpus_per_node", "8"): [("--ds.adam_offload", 8.0)],
    }
    for flags, expected in by_flag.items():
        parts = host_memory.host_parts(_args(*flags), params)
        assert [(what.split(":")[0], round(b / 1e9, 1)) for what, b in parts] == expected, flags


def test_the_ray_threshold_is_read_as_ray_reads_it():
    assert host_memory.allowed_bytes(1000, {})[0] == 950
    assert host_memory.allowed_bytes(1000, {"RAY_memory_usage_threshold": "0.8"})[0] == 800
    assert host_memory.allowed_bytes(1000, {"RAY_memory_monitor_refresh_ms": "0"})[0] == 1000
    total = host_memory.node_memory_bytes()
    with open("/proc/meminfo") as f:
        mem_total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < total <= mem_total


def _check_argv(tmp_path, *flags: str) -> list[str]:
    policy = save_tiny_model(str(tmp_path / "policy"), ["1", "2", "+", "=", "?"], hidden_size=8, num_layers=1,
                             num_heads=2)
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": chat, "label": json.dumps(
        {"data_source": "gsm8k", "ground_truth": "2", "messages": chat})}) + "\n")
    return ["--check", "--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1",
            "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--data.prompt_dataset", str(data),
            "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
            "--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1",
            "--train.batch_size", "4", "--ckpt.path", str(tmp_path / "ckpt"), "--classmate.model_name_or_path", policy,
            *flags]


def test_the_launcher_refuses_before_ray_starts_and_reports_the_figures_when_it_fits(tmp_path, monkeypatch, capsys):
    argv = _check_argv(tmp_path, "--ds.adam_offload")
    params = host_memory.parameter_count(str(tmp_path / "policy"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(host_memory, "node_memory_bytes", lambda: 16 * params)  # a node smaller than the state
    with pytest.raises(SystemExit) as stop:
        train_ppo_ray.main(argv)
    assert str(stop.value).startswith("error: host memory: --ds.adam_offload: Adam's fp32 master weights, moments "
                                      "and gradients 0.0 GiB = 0.0 GiB on each node, above the 0.0 GiB this node allows")
    # joining a Ray cluster: the launcher's node may not train, so the same figures are a warning
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    train_ppo_ray.main(argv)
    out, err = capsys.readouterr()
    assert "warning: host memory: --ds.adam_offload" in err and "(RAY_ADDRESS is set" in err
    assert out.strip().endswith("check passed: the run would start")
    # a node large enough: --check says what the flags keep in host memory
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(host_memory, "node_memory_bytes", lambda: 2**40)
    train_ppo_ray.main(argv)
    out, _ = capsys.readouterr()
    assert "  host memory: --ds.adam_offload: Adam's fp32 master weights, moments and gradients 0.0 GiB = 0.0 GiB of " \
           "this node's 1024.0 GiB" in out


RAY_KILL = (  # the killed 7B cell's line, shortened (bench/gpu_results/wave15/capacity/7b_p_1.5b_2k_1gpu.log.gz)
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: 95c9) "
    "was 123.66GB / 125.87GB (0.982484), which exceeds the memory usage threshold of 0.950000; Object store memory "
    "usage: [- objects spillable: 0]; Ray killed 1 worker(s) based on the killing policy: [(Actor(c2cc), job "
    "ID=01000000, task name=ClassmatePolicyModelActor.__init__, required resources={GPU_group_0: 0.2}, pid=2341, "
    "actual memory used=89.22GB, worker ID=5a88)]; Top 10 memory users: PID\tMEM(GB)\tCOMMAND, 2341\t89.22\t"
    "ray::ClassmatePolicyModelActor.init_model_from_pretrained, 3205\t26.52\tVLLM::EngineCore")


def test_a_worker_killed_by_rays_memory_monitor_ends_the_run_in_one_line(tmp_path):
    try:
        try:
            raise OutOfMemoryError(RAY_KILL)
        except OutOfMemoryError as killed:
            raise RuntimeError("train failed") from killed
    except RuntimeError as e:
        message = actor_died_message(e, str(tmp_path / "none"))
    assert message == (
        "error: Ray's memory monitor killed ClassmatePolicyModelActor.__init__ (process 2341, 89.22 GiB) with its "
        "node's memory at 123.66 / 125.87 GiB, above its threshold 0.95: the run's processes need more host memory "
        "than the node has (--check lists what the offload and sleep flags keep there); the run stopped. No "
        "checkpoint was saved yet: start again (--ckpt.save_steps sets how often one is written).")


def test_an_older_rays_wording_still_gives_one_line(tmp_path):
    # Ray before 2.5x: "name=" and "memory used=", and a sentence ending right after the threshold ("0.95.")
    older = ("Task was killed due to the node running low on memory. Memory on the node (IP: 10.0.0.1, ID: ab) where "
             "the task (actor ID: cd, name=ClassmatePolicyModelActor.__init__, pid=77, memory used=90.5GB) was "
             "running was 120.1GB / 125.0GB (0.96), which exceeds the memory usage threshold of 0.95. Ray killed this "
             "worker (ID: ef) because it was the most recently scheduled task")
    assert actor_died_message(OutOfMemoryError(older), None) == (
        "error: Ray's memory monitor killed ClassmatePolicyModelActor.__init__ (process 77, 90.5 GiB) with its node's "
        "memory at 120.1 / 125.0 GiB, above its threshold 0.95: the run's processes need more host memory than the "
        "node has (--check lists what the offload and sleep flags keep there); the run stopped. Nothing was saved (no "
        "--ckpt.path).")
    assert actor_died_message(OutOfMemoryError("killed"), None).startswith(
        "error: Ray's memory monitor killed a worker: the run's processes need more host memory")


def test_a_critic_counts_like_the_actor_and_the_weights_are_counted_once(tmp_path):
    # a plain gae run (no classmate): upstream's critic is the actor's model, with the actor's DeepSpeed options
    args = parse_args(["--actor.model_name_or_path", "/m/policy", "--data.prompt_dataset", "d.jsonl",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--ds.adam_offload",
                       "--algo.advantage.estimator", "gae", "--reward.remote_url", "http://127.0.0.1:9/score"])
    assert args.critic.model_name_or_path == "/m/policy"
    parts = host_memory.host_parts(args, {"/m/policy": 1_000_000_000})
    assert [(what.split(":")[0], round(b / 1e9, 1)) for what, b in parts] == [
        ("--ds.adam_offload", 16.0), ("--ds.adam_offload", 16.0)]
    # a folder shipping its shards and a consolidated file: the index's files only
    path = save_tiny_model(str(tmp_path / "m"), ["a", "b"], hidden_size=16, num_layers=2, num_heads=2)
    n = host_memory.parameter_count(path)
    import shutil

    shutil.copy(os.path.join(path, "model.safetensors"), os.path.join(path, "consolidated.safetensors"))
    assert host_memory.parameter_count(path) == n  # the plain file, not both
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"x": "model.safetensors"}}, f)
    assert host_memory.parameter_count(path) == n
    # a Git LFS pointer in place of the weights, a header length past the file: no figure, no traceback
    lfs = tmp_path / "lfs"
    lfs.mkdir()
    (lfs / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 15\n")
    assert host_memory.parameter_count(str(lfs)) is None
    (lfs / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    assert host_memory.parameter_count(str(lfs)) is None
    odd = tmp_path / "a[1]"  # glob's metacharacters in the folder's name
    shutil.copytree(path, odd)
    assert host_memory.parameter_count(str(odd)) == n

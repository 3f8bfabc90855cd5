"""The launcher's KV-cache sizes (``integration/rollout/engine_memory.py``): each vLLM engine group gets a fixed cache
worked out from its fraction of the GPU, the GPU's memory and its checkpoint's size, so that no engine profiles the
GPU and engine groups sharing one start side by side (``tests/test_trainer.py`` checks that start). The formula is
checked against what vLLM itself measured on an H200 (``bench/GPU_RESULTS.md`` section 9)."""

from __future__ import annotations

import json
import os

import pytest

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.rollout import engine_memory
from openrlhf_classmate.integration.rollout.engine_memory import GIB, kv_bytes, plan, plan_key, weight_bytes
from openrlhf_classmate.integration.rollout.vllm_engine import KV_CACHE_ENV, KV_PLAN_ENV, engine_env, engine_kwargs

H200_BYTES = 143771 * 2**20  # nvidia-smi's memory.total on the lent H200


def _model(tmp_path, name: str, size: int, pattern: str = "model.safetensors") -> str:
    path = tmp_path / name
    path.mkdir()
    with open(path / pattern, "wb") as f:
        f.truncate(size)  # sparse: the size is read, not the bytes
    (path / "config.json").write_text("{}")
    return str(path)


def _args(*extra: str):
    return parse_args(["--data.prompt_dataset", "d.jsonl", "--engine.backend", "vllm", "--vllm.num_engines", "1",
                       "--rollout.n_samples_per_prompt", "4", *extra])


def test_the_formula_stays_below_what_vllm_measured_on_an_h200():
    # vLLM's own line for the 0.5B-shaped policy at 0.3 of the H200: 0.93 GiB of weights, 0.26 peak activation,
    # 0.22 non-torch, 0.23 CUDA graphs; "--kv-cache-memory=43106829824 (40.15 GiB) to fit into requested memory"
    size = kv_bytes(0.3, H200_BYTES, int(0.92 * GIB))
    assert 39.5 * GIB < size <= 43106829824
    # tensor parallelism splits the weights
    assert kv_bytes(0.3, H200_BYTES, 16 * GIB, 2) == int(0.3 * H200_BYTES - 8 * GIB - (GIB + 0.2 * 8 * GIB))


def test_weights_are_read_from_a_local_folder_only(tmp_path):
    assert weight_bytes(_model(tmp_path, "st", 3000)) == 3000
    assert weight_bytes(_model(tmp_path, "bin", 5000, "pytorch_model.bin")) == 5000
    assert weight_bytes("Qwen/Qwen2.5-0.5B") is None  # a hub id
    (tmp_path / "empty").mkdir()
    assert weight_bytes(str(tmp_path / "empty")) is None



def test_weights_shipped_twice_are_counted_once(tmp_path):
    # a repository with its shards and a consolidated.safetensors of the same weights (Mistral's): the shards, or
    # the files its index names; an optimizer's file is never weights
    path = _model(tmp_path, "both", 3000, "model-00001-of-00002.safetensors")
    with open(os.path.join(path, "model-00002-of-00002.safetensors"), "wb") as f:
        f.truncate(1000)
    for name, size in (("consolidated.safetensors", 4000), ("optimizer.safetensors", 9000)):
        with open(os.path.join(path, name), "wb") as f:
            f.truncate(size)
    assert weight_bytes(path) == 4000
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}},
                  f)
    assert weight_bytes(path) == 3000
    assert weight_bytes(_model(tmp_path, "only", 4000, "consolidated.safetensors")) == 4000  # all there is


def test_each_group_gets_its_size_and_the_engine_finds_its_own(tmp_path):
    policy = _model(tmp_path, "policy", int(0.92 * GIB))
    args = _args("--actor.model_name_or_path", policy, "--classmate.model_name_or_path", policy,
                 "--vllm.gpu_memory_utilization", "0.3", "--classmate.gpu_memory_utilization", "0.2")
    sizes, why = plan(args, total=H200_BYTES)
    # the classmate is a frozen copy of the policy: the same model, two fractions, two sizes
    assert why is None and sizes == {plan_key(policy, 0.3): kv_bytes(0.3, H200_BYTES, int(0.92 * GIB)),
                                     plan_key(policy, 0.2): kv_bytes(0.2, H200_BYTES, int(0.92 * GIB))}
    env = engine_env(args, sizes)
    assert KV_CACHE_ENV not in env and json.loads(env[KV_PLAN_ENV]) == sizes
    # each engine actor looks its own size up by the model and fraction upstream gives it
    for util in (0.3, 0.2):
        got = engine_kwargs({"model": policy, "gpu_memory_utilization": util}, environ=env)
        assert got["kv_cache_memory_bytes"] == sizes[plan_key(policy, util)]
    assert "kv_cache_memory_bytes" not in engine_kwargs({"model": policy, "gpu_memory_utilization": 0.5}, environ=env)


def test_where_no_size_can_be_worked_out_the_engines_profile_and_the_plan_says_why(tmp_path):
    policy = _model(tmp_path, "policy", GIB)
    base = ["--actor.model_name_or_path", policy, "--classmate.model_name_or_path"]
    assert plan(_args(*base, "org/classmate-hub-id"), total=H200_BYTES) == (
        {}, "the classmate org/classmate-hub-id engines' model org/classmate-hub-id is not a local folder with weight "
            "files to size by")
    sizes, why = plan(_args(*base, policy, "--classmate.gpu_memory_utilization", "0.01"), total=H200_BYTES)
    assert sizes == {} and why.startswith(f"the classmate {policy} engines' fraction 0.01 of 140.4 GiB leaves -")
    # nothing to size: a fixed size, profiling asked for, HF engines
    assert plan(_args(*base, policy, "--engine.kv_cache_gib", "2"), total=H200_BYTES) == ({}, None)
    assert plan(_args(*base, policy, "--engine.profile_kv_cache"), total=H200_BYTES) == ({}, None)
    with pytest.raises(SystemExit, match="drop one of the two"):
        _args(*base, policy, "--engine.profile_kv_cache", "--engine.kv_cache_gib", "2")


def test_the_gpu_memory_is_read_without_a_cuda_context(tmp_path, monkeypatch):
    # a stand-in nvidia-smi on PATH answers as the real one does (MiB, no header); none on PATH: no GPU
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\necho 143771\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    assert engine_memory.gpu_total_bytes() == H200_BYTES
    assert (smi.parent / "argv").read_text().split()[-2:] == ["-i", "3"]  # the first visible GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert engine_memory.gpu_total_bytes() is None  # no GPU visible
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert engine_memory.gpu_total_bytes() is None
    policy = _model(tmp_path, "policy", GIB)
    assert plan(_args("--actor.model_name_or_path", policy)) == (
        {}, "no NVIDIA GPU visible to the launcher (nvidia-smi) to size the engines' KV caches by")


def test_the_launcher_says_what_it_sized_in_one_line(tmp_path, monkeypatch, capsys):
    from openrlhf_classmate.cli.train_ppo_ray import kv_cache_plan

    policy = _model(tmp_path, "policy", int(0.92 * GIB))
    monkeypatch.setattr(engine_memory, "gpu_total_bytes", lambda: H200_BYTES)
    capsys.readouterr()
    assert len(kv_cache_plan(_args("--actor.model_name_or_path", policy))) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if "KV caches" in x]
    # upstream's default fraction, 0.95 of the H200, minus 0.92 GiB of weights and the reserve
    assert len(lines) == 1 and f"131.28 GiB for {policy} at 0.95" in lines[0] and "start side by side" in lines[0]
    # a hub id: the engines profile, and one line says why
    assert kv_cache_plan(_args("--actor.model_name_or_path", "org/hub-id")) == {}
    lines = [x for x in capsys.readouterr().err.splitlines() if "profiling" in x]
    assert len(lines) == 1 and "the policy engines' model org/hub-id is not a local folder" in lines[0]


# ── whether the actor/ref models load while the engines start (the launcher's models_while_engines_start) ──


def test_the_models_load_beside_the_awake_engines_only_where_they_fit(tmp_path):
    from openrlhf_classmate.integration.rollout.engine_memory import models_beside_engines

    policy = _model(tmp_path, "policy", int(0.93 * GIB))  # Qwen2.5-0.5B's bf16 weights
    args = _args("--actor.model_name_or_path", policy, "--vllm.gpu_memory_utilization", "0.3",
                 "--actor.num_gpus_per_node", "1")
    # engines 0.3 x 140.4 = 42.1 GiB; actor 2 x 0.93 + Adam 6 x 0.93 = 7.44 GiB; reference 0.93 GiB; margin 2 GiB
    fits, why = models_beside_engines(args, total=H200_BYTES)
    assert fits and why == ("the engines' 42.1 GiB + the actor's 7.4 GiB + the reference's 0.9 GiB + 2 GiB <= "
                            "140.4 GiB")
    big = _model(tmp_path, "big", 15 * GIB)  # an 8B policy: 150 GiB of state
    fits, why = models_beside_engines(_args("--actor.model_name_or_path", big, "--actor.num_gpus_per_node", "1"),
                                      total=H200_BYTES)
    assert not fits and "the actor's 120.0 GiB" in why and "> 140.4 GiB" in why
    # Adam on the CPU, the reference offloaded, ZeRO-3 over 8 GPUs: it fits
    fits, why = models_beside_engines(_args("--actor.model_name_or_path", big, "--vllm.gpu_memory_utilization", "0.5",
                                            "--ds.adam_offload", "--ref.offload", "--ds.zero_stage", "3",
                                            "--actor.num_gpus_per_node", "8"), total=H200_BYTES)
    assert fits and "the actor's 3.8 GiB + the reference's 0.0 GiB" in why
    assert models_beside_engines(_args("--actor.model_name_or_path", "org/hub-id"), total=H200_BYTES) == (
        False, "the policy org/hub-id is not a local folder with weight files to size by")
    assert models_beside_engines(args, total=None)[0] in (True, False)  # reads nvidia-smi: no GPU here -> False


def test_the_launcher_says_in_one_line_whether_the_models_wait_for_the_engines(tmp_path, monkeypatch, capsys):
    from openrlhf_classmate.cli.train_ppo_ray import models_while_engines_start

    policy = _model(tmp_path, "policy", int(0.93 * GIB))
    monkeypatch.setattr(engine_memory, "gpu_total_bytes", lambda: H200_BYTES)
    sized = {"x": 1}
    capsys.readouterr()
    args = _args("--actor.model_name_or_path", policy, "--vllm.gpu_memory_utilization", "0.3",
                 "--actor.num_gpus_per_node", "1", "--vllm.enable_sleep", "--train.colocate_all")
    assert models_while_engines_start(args, sized) is True
    assert "the actor/ref models load while the vLLM engines start (the engines' 42.1 GiB" in capsys.readouterr().err
    assert models_while_engines_start(args, {}) is False  # the engines profile memory: the models wait
    assert "load after the vLLM engines are up: the engines profile GPU memory" in capsys.readouterr().err
    big = _model(tmp_path, "big", 15 * GIB)
    assert models_while_engines_start(_args("--actor.model_name_or_path", big, "--vllm.enable_sleep",
                                            "--train.colocate_all"), sized) is False
    assert "after the vLLM engines are up and asleep, as upstream does: the engines'" in capsys.readouterr().err
    # no sleep (upstream does not wait for the engines then), or the HF engines: nothing to decide, nothing said
    assert models_while_engines_start(_args("--actor.model_name_or_path", policy), sized) is False
    assert models_while_engines_start(_args("--actor.model_name_or_path", policy, "--vllm.enable_sleep",
                                            "--train.colocate_all", "--engine.backend", "hf"), sized) is False
    assert "actor/ref models" not in capsys.readouterr().err

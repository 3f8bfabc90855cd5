"""``--engine.kv_cache_gib``: a fixed KV-cache size for every vLLM engine (vLLM's ``kv_cache_memory_bytes``), so that
vLLM does not profile the GPU's free memory at start-up. The launcher passes it to the engine actors through the Ray
runtime environment; the engine actor (``integration/rollout/vllm_engine.CountingRolloutActor``) hands it to
``vllm.AsyncEngineArgs`` through upstream's own ``RolloutRayActor.__init__`` (run here, on CPU, up to the engine
construction). vLLM itself is checked on the GPU (``bench/GPU_RESULTS.md`` section 4: the demo's engines)."""

from __future__ import annotations

import math

import pytest

from openrlhf_classmate.integration.launch.args import parse_args


def _args(*extra: str):
    return parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", *extra])


def test_the_size_is_read_in_gib_and_bad_values_are_refused():
    assert _args("--engine.backend", "vllm", "--engine.kv_cache_gib", "2").engine.kv_cache_gib == 2.0
    assert _args("--engine.backend", "vllm").engine.kv_cache_gib is None  # default: vLLM profiles
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            _args("--engine.backend", "vllm", "--engine.kv_cache_gib", bad)


def test_hf_engines_refuse_it_with_one_line(capsys):
    with pytest.raises(SystemExit, match="--engine.kv_cache_gib sizes vLLM's KV cache; the HF engines"):
        _args("--engine.backend", "hf", "--engine.kv_cache_gib", "2")


def test_the_launcher_passes_the_size_in_bytes_to_the_engine_actors():
    from openrlhf_classmate.integration.rollout.vllm_engine import KV_CACHE_ENV, engine_env

    assert engine_env(_args("--engine.backend", "vllm", "--engine.kv_cache_gib", "1.5"))[KV_CACHE_ENV] == str(3 * 2**29)
    assert KV_CACHE_ENV not in engine_env(_args("--engine.backend", "vllm"))
    assert KV_CACHE_ENV.startswith("OPENRLHF_CLASSMATE_")  # init_ray forwards these to every Ray worker


@pytest.mark.parametrize("size", [None, str(2 * 2**30)])
def test_the_engine_actor_gives_vllm_the_size_through_upstreams_init(monkeypatch, size):
    """Upstream's ``RolloutRayActor.__init__`` runs unchanged up to ``vllm.AsyncEngineArgs(...)`` (``testing/
    engine_args.py``: the CPU has no vLLM engine to build)."""
    from openrlhf_classmate.integration.rollout.vllm_engine import KV_CACHE_ENV
    from openrlhf_classmate.testing.engine_args import engine_args_seen

    seen = engine_args_seen(monkeypatch, {KV_CACHE_ENV: size}, model="m", num_gpus=0.2,
                            distributed_executor_backend="uni", seed=3, gpu_memory_utilization=0.2)
    assert seen["model"] == "m" and seen["seed"] == 3 and seen["gpu_memory_utilization"] == 0.2
    if size is None:
        assert "kv_cache_memory_bytes" not in seen
    else:
        assert seen["kv_cache_memory_bytes"] == 2 * 2**30 and math.isclose(seen["kv_cache_memory_bytes"] / 2**30, 2)

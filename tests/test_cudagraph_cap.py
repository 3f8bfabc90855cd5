"""``--engine.cudagraph_max_size``: vLLM captures CUDA graphs at start-up for batch sizes up to
``max_cudagraph_capture_size`` (by default min(2 x max_num_seqs, 512), whatever the run's batch). The launcher caps it
at the most sequences one engine holds in a rollout step, so that start-up captures no graph a step never uses. The
cap travels like ``--engine.kv_cache_gib``: the launcher's Ray runtime env, then ``vllm.AsyncEngineArgs`` through
upstream's own ``RolloutRayActor.__init__`` (run here on CPU up to the engine construction). What it saves at start-up
is measured on the GPU (``bench/GPU_RESULTS.md``)."""

from __future__ import annotations

import pytest

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.integration.rollout.vllm_engine import CUDAGRAPH_ENV, capture_size, engine_env


def _args(*extra: str):
    return parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", "--engine.backend",
                       "vllm", *extra])


def _vllm_sizes(cap: int) -> list[int]:
    """vLLM's automatic capture sizes under a cap (CompilationConfig.max_cudagraph_capture_size's docstring)."""
    return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)] if s <= cap]


@pytest.mark.parametrize("requests", [1, 2, 3, 5, 8, 9, 100, 128, 129, 248, 249, 256, 257, 400, 512, 513, 4096])
def test_the_cap_is_the_smallest_vllm_size_holding_the_batch(requests):
    cap = capture_size(requests)
    assert cap in _vllm_sizes(512)  # a cap between two sizes would leave the batch without a graph
    if requests <= 512:
        assert cap >= requests and [s for s in _vllm_sizes(512) if s >= requests][0] == cap
    else:
        assert cap == 512  # vLLM's own ceiling


def test_the_default_cap_follows_the_rollout_batch_per_engine():
    # 16 prompts x 8 samples on one engine: 128 sequences, 19 capture sizes instead of vLLM's 51
    run = ["--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "8", "--vllm.num_engines", "1"]
    assert engine_env(_args(*run))[CUDAGRAPH_ENV] == "128"
    assert len(_vllm_sizes(128)) == 19 and len(_vllm_sizes(512)) == 51
    # two engines share the batch: 64 each
    assert engine_env(_args(*run[:-1], "2"))[CUDAGRAPH_ENV] == "64"
    # a larger generation batch (over-sampling: upstream sends vllm_generate_batch_size prompts at once)
    assert engine_env(_args(*run, "--rollout.vllm_generate_batch_size", "20",
                            "--train.async_enable"))[CUDAGRAPH_ENV] == "160"
    # 100 prompts x 3: 300 rounds up to vLLM's 304
    assert engine_env(_args("--rollout.batch_size", "100", "--rollout.n_samples_per_prompt", "3",
                            "--vllm.num_engines", "1"))[CUDAGRAPH_ENV] == "304"


def test_the_classmate_engines_count_their_own_batch():
    run = ["--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "8", "--vllm.num_engines", "2",
           "--classmate.model_name_or_path", "c", "--classmate.num_engines", "1", "--classmate.samples", "2"]
    # the policy engines hold 64 each; the one classmate engine 16 x 8 x 2 = 256
    assert engine_env(_args(*run))[CUDAGRAPH_ENV] == "256"


def test_set_zero_or_eager_leave_vllm_its_own_choice():
    run = ["--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "8", "--vllm.num_engines", "1"]
    assert engine_env(_args(*run, "--engine.cudagraph_max_size", "40"))[CUDAGRAPH_ENV] == "40"
    assert CUDAGRAPH_ENV not in engine_env(_args(*run, "--engine.cudagraph_max_size", "0"))
    assert CUDAGRAPH_ENV not in engine_env(_args(*run, "--vllm.enforce_eager"))
    assert engine_env(parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                                  "--engine.backend", "hf", *run])) == {}
    with pytest.raises(SystemExit, match="--engine.cudagraph_max_size sets vLLM's CUDA-graph capture; the HF"):
        parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl", "--engine.backend", "hf",
                    *run, "--engine.cudagraph_max_size", "40"])
    with pytest.raises(SystemExit):
        _args(*run, "--engine.cudagraph_max_size", "-1")


@pytest.mark.parametrize("cap,eager", [(None, False), ("128", False), ("128", True)])
def test_the_engine_actor_gives_vllm_the_cap_through_upstreams_init(monkeypatch, cap, eager):
    from openrlhf_classmate.testing.engine_args import engine_args_seen

    seen = engine_args_seen(monkeypatch, {CUDAGRAPH_ENV: cap}, model="m", num_gpus=0.2,
                            distributed_executor_backend="uni", seed=3, enforce_eager=eager)
    assert seen["model"] == "m" and seen["enforce_eager"] is eager
    if cap is None or eager:
        assert "max_cudagraph_capture_size" not in seen
    else:
        assert seen["max_cudagraph_capture_size"] == 128

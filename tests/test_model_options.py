"""Upstream's model and parallelism options (``--ds.lora.*``, ``--ds.ring_attn_size``, ``--ds.tensor_parallel_size``,
``--ds.use_liger_kernel``) at launch: accepted where they work with a classmate, else one ``error:`` line before Ray
(``integration/launch/model_options.py``). ``tests/test_lora.py`` runs LoRA with a classmate."""

import importlib.util

import pytest

from openrlhf_classmate.integration.launch.args import parse_args

BASE = [
    "--actor.model_name_or_path", "policy", "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "1",
    "--data.prompt_dataset", "d.jsonl", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "2",
    "--rollout.n_samples_per_prompt", "4", "--vllm.num_engines", "1", "--train.batch_size", "8",
]
CLASSMATE = ["--classmate.model_name_or_path", "classmate"]


def _error(argv) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    return str(info.value.code)


@pytest.mark.parametrize("extra, message", [
    (CLASSMATE + ["--ds.ring_attn_size", "2"], "error: --ds.ring_attn_size 2 with a classmate: ring attention splits "
     "each sequence across ranks and has never run with the classmate's per-token tensors"),
    (CLASSMATE + ["--ds.tensor_parallel_size", "2"], "error: --ds.tensor_parallel_size 2 with a classmate: DeepSpeed "
     "AutoTP duplicates each micro-batch across the TP ranks"),
    (["--ds.tensor_parallel_size", "2", "--engine.backend", "hf"], "error: --ds.tensor_parallel_size 2 with HF "
     "engines: their weight sync gathers ZeRO-3 partitions, not AutoTP shards"),
    (["--ds.lora.rank", "8", "--engine.backend", "vllm"], "error: --ds.lora.rank 8 with vLLM engines: upstream's "
     "weight sync sends the LoRA adapter's parameter names, which vLLM cannot load"),
    (CLASSMATE + ["--ds.lora.rank", "8", "--engine.backend", "vllm"], "error: --ds.lora.rank 8 with vLLM engines"),
])
def test_options_that_cannot_work_are_refused_with_one_line(extra, message):
    error = _error(BASE + extra)
    assert error.startswith(message) and "\n" not in error


def test_liger_is_refused_with_a_classmate_until_a_run_verifies_it():
    assert _error(BASE + CLASSMATE + ["--ds.use_liger_kernel"]).startswith(
        "error: --ds.use_liger_kernel with a classmate: liger's kernels need Triton on a GPU and have never run")


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_liger_without_its_package_is_refused_before_ray():
    assert _error(BASE + ["--ds.use_liger_kernel"]).startswith(
        "error: --ds.use_liger_kernel loads the policy and reference through the liger-kernel package, which is not "
        "installed")


@pytest.mark.skipif(importlib.util.find_spec("ring_flash_attn") is not None, reason="ring_flash_attn is installed")
def test_ring_attention_without_its_packages_is_refused_in_plain_runs_too():
    assert _error(BASE + ["--ds.ring_attn_size", "2"]).startswith(
        "error: --ds.ring_attn_size 2 needs flash-attn and the ring_flash_attn package")


def test_lora_with_hf_engines_and_a_classmate_is_accepted():
    args = parse_args(BASE + CLASSMATE + ["--ds.lora.rank", "8", "--engine.backend", "hf"])
    assert args.ds.lora.rank == 8 and args.engine.backend == "hf"

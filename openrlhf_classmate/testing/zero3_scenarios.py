"""Multi-rank ZeRO-3 scenarios on DeepSpeed's CPU accelerator, run by :func:`gloo_ranks.run_ranks` (one process per
rank): DeepSpeed's gather defect (uninitialised memory in gathered
parameters: ``integration.training.strategy.safe_gathers``), and the reference actor's load with its weight check."""

from __future__ import annotations

import os
import time

import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf)


def gather_race(rank: int, world_size: int, *, rounds: int = 20) -> dict:
    """As transformers' ZeRO-3 loader does: gather two parameters (a large one first) with ``modifier_rank=0``, write
    new values on rank 0, let the context broadcast and re-partition them; then read them back. Counts the rounds
    whose large parameter did not come back as written, with DeepSpeed's default config (``default``) and with the
    config through our strategy's :func:`safe_gathers` (``safe``)."""
    import deepspeed
    import torch

    from openrlhf_classmate.integration.training.strategy import safe_gathers

    deepspeed.init_distributed(dist_backend="gloo")

    class TwoParams(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.big = torch.nn.Parameter(torch.empty(1 << 22))  # uninitialised, as transformers leaves them
            self.small = torch.nn.Parameter(torch.empty(4))

    result = {}
    for mode in ("default", "safe"):
        config = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": world_size,
                  "zero_optimization": {"stage": 3}}
        if mode == "safe":
            config = safe_gathers(config)
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = TwoParams()
        corrupted = 0
        for i in range(rounds):
            with deepspeed.zero.GatheredParameters([model.big, model.small], modifier_rank=0):
                if rank == 0:
                    model.big.data.fill_(float(i))
                    model.small.data.fill_(float(i))
            with deepspeed.zero.GatheredParameters([model.big]):  # one parameter: the synchronous path
                corrupted += not bool((model.big.data == float(i)).all())
        result[mode] = corrupted
        result[f"{mode}_sequential"] = bool(config["zero_optimization"].get("stage3_allgather_sequential", False))
    return result


def reference_load(rank: int, world_size: int, *, model_dir: str, loads: int = 1, corrupt: str | None = None,
                   extra: list[str] | None = None) -> dict:
    """``loads`` fresh loads through our reference actor (upstream's ``ReferenceModelActor`` + the weight check) with
    our strategy at ZeRO-3 and the flags ``extra``; then, with ``corrupt`` (a parameter name), NaN written into rank
    1's partition of it and the weight check run again. Returns the load times, the classes upstream built and the
    error of the corrupted check."""
    from openrlhf_classmate.errors import TrainingStopped
    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.training.actor import ClassmateReferenceModelActor
    from openrlhf_classmate.integration.training.strategy import get_strategy
    from openrlhf_classmate.integration.training.weight_check import verify_loaded_weights

    patches.install_cpu_runtime()
    args = parse_args([
        "--actor.model_name_or_path", model_dir, "--actor.num_gpus_per_node", str(world_size),
        "--ref.num_gpus_per_node", str(world_size), "--data.prompt_dataset", "unused.jsonl",
        "--vllm.num_engines", "0", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "1",
        "--train.batch_size", str(world_size), "--train.micro_batch_size", "1", "--ds.zero_stage", "3",
        "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa", "--algo.kl.init_coef", "0.001",
        "--algo.advantage.estimator", "reinforce", "--engine.backend", "hf", *(extra or []),
    ])
    strategy = get_strategy(args)
    result: dict = {"seconds": []}
    for _ in range(loads):
        actor = ClassmateReferenceModelActor(world_size, rank, "127.0.0.1", int(os.environ["MASTER_PORT"]))
        start = time.perf_counter()
        actor.init_model_from_pretrained(strategy, model_dir)
        result["seconds"].append(time.perf_counter() - start)
    result["classes"] = [c.__name__ for c in type(actor.model).__mro__ if c.__module__.startswith("openrlhf")]
    result["stage3_allgather_sequential"] = strategy.get_ds_eval_config()["zero_optimization"].get(
        "stage3_allgather_sequential", False)
    if corrupt:
        model = actor.model.model.module  # Actor -> DeepSpeed engine -> the transformers model
        param = dict(model.named_parameters())[corrupt]
        if rank == 1:
            param.ds_tensor.data[:7] = float("nan")
        try:
            verify_loaded_weights(model, model_dir, zero3=True)
        except TrainingStopped as e:
            result["error"] = str(e)
    return result

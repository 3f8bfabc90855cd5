"""Our strategy's ``all_reduce`` next to upstream's on several gloo ranks, run by :func:`gloo_ranks.run_ranks` (one
process per rank): the reduced values of both and how many ``torch.distributed.all_reduce`` calls each made."""

from __future__ import annotations

import random

import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf)


def metric_dicts(rank: int, world_size: int, *, n: int = 60) -> dict:
    """For each case (a dict shape ``ppo_train`` and upstream's other trainers reduce) and each op: ``ours`` and
    ``upstream`` (the reduced values as JSON: a float, or ``[dtype, shape, values]`` for a tensor), the collectives
    each made, and for tensor inputs whether the returned tensor is the input (upstream reduces a tensor already on
    the accelerator device in place)."""
    import torch
    import torch.distributed as dist
    from openrlhf.utils.deepspeed import DeepspeedStrategy

    from openrlhf_classmate.integration.patches import install_cpu_runtime
    from openrlhf_classmate.integration.training.strategy import ResilientDeepspeedStrategy

    install_cpu_runtime()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ours, upstream = object.__new__(ResilientDeepspeedStrategy), object.__new__(DeepspeedStrategy)
    ours.world_size = upstream.world_size = world_size

    rng = random.Random(rank)
    # values of every magnitude, most not representable in float32, a few integers (token / sample counts)
    numbers = {f"m{i}": rng.uniform(-1, 1) * 10 ** rng.randint(-6, 6) for i in range(n - 2)}
    numbers.update(_num_action_tokens=rng.randint(1, 5000), _num_samples=float(rng.randint(1, 64)))
    cases = {
        "numbers": lambda: dict(numbers),
        "tensors": lambda: {k: torch.tensor([v] if i % 2 else v, dtype=torch.float32)
                            for i, (k, v) in enumerate(numbers.items())},
        "empty": dict,
        "nested": lambda: {"a": 1.5 + rank, "b": {"c": 2.25 * rank}},
        "multi_element": lambda: {"a": 1.5 + rank, "b": torch.tensor([1.0, 2.0 * rank])},
        "mixed": lambda: {"a": 1.5 + rank, "b": torch.tensor([2.0 + rank])},
        "bf16": lambda: {"a": torch.tensor([1.5 + rank], dtype=torch.bfloat16)},
        "float64": lambda: {"a": torch.tensor([0.1 + rank], dtype=torch.float64)},
        "scalar": lambda: 0.1 + rank,
    }
    real_all_reduce = dist.all_reduce
    calls = [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return real_all_reduce(*args, **kwargs)

    dist.all_reduce = counting
    out = {}
    try:
        for case, make in cases.items():
            for op in ("mean", "sum", "max"):
                for name, strategy in (("ours", ours), ("upstream", upstream)):
                    data = make()
                    calls[0] = 0
                    result = strategy.all_reduce(data, op)
                    out[f"{case}/{op}/{name}"] = {"value": _json(result), "calls": calls[0],
                                                  "same_objects": _same_objects(data, result)}
    finally:
        dist.all_reduce = real_all_reduce
    dist.destroy_process_group()
    return out


def _json(value):
    import torch

    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return [str(value.dtype), list(value.shape), value.float().reshape(-1).tolist()]
    return [type(value).__name__, value]


def _same_objects(data, result) -> list[bool] | None:
    if not isinstance(data, dict):
        return None
    return [result[k] is v for k, v in data.items() if not isinstance(v, dict)]

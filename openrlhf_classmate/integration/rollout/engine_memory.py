"""Fixed KV-cache sizes for the vLLM engines, worked out by the launcher, so that engine groups sharing a GPU start
side by side.

vLLM sizes an engine's KV cache by profiling the GPU at start-up: its fraction of the whole GPU
(``gpu_memory_utilization``) minus what its weights, activations and CUDA graphs took. Another process allocating on
the same GPU meanwhile corrupts that measurement, so engine groups on one GPU used to start one after the other
(the policy engines, then each classmate group): 87-110 s of a 0.5B run's 300-390 s start-up on one H200
(``bench/GPU_RESULTS.md`` section 9). Given a size (``kv_cache_memory_bytes``), vLLM skips the profiling.

The launcher computes the same budget before any engine starts, from what it can read without touching the GPU:

    KV bytes = gpu_memory_utilization x GPU memory - W - (1 GiB + 0.2 W),   W = weight bytes / tensor-parallel size

``W`` is the checkpoint's size on disk (bf16 checkpoints load as stored); the reserve stands for vLLM's activation
peak, CUDA graphs and non-torch memory, which measured 0.71 GiB beside 0.93 GiB of weights at 0.5B (vLLM then
suggested 40.15 GiB for a 0.3 fraction of an H200; this formula gives 40.0). So each engine stays within the fraction
the user gave it, as upstream defines the flag, and vLLM's own start-up check (that fraction free) still runs.

Where a size cannot be worked out (no NVIDIA GPU visible to the launcher, a hub id instead of a local folder, a
budget below :data:`MIN_KV_BYTES`) the engines profile as before, one group at a time, and the launcher says why in
one line. ``--engine.kv_cache_gib`` still fixes one size for every engine; ``--engine.profile_kv_cache`` keeps vLLM's
profiling.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from types import SimpleNamespace

GIB = 2**30
RESERVE_BYTES = GIB  # vLLM's activation peak, CUDA graphs and non-torch memory, beside ...
RESERVE_WEIGHT_FRACTION = 0.2  # ... a share of the weights (larger models: larger activations and graphs)
MIN_KV_BYTES = GIB // 2  # below this the fraction is too small to be worked out safely: let vLLM profile
WEIGHT_PATTERNS = ("*.bin", "*.pt")  # PyTorch weight files, where a folder has no safetensors ones


def _weight_files(folder: str, pattern: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))
    return [f for f in files if "optimizer" not in os.path.basename(f)]


def safetensors_files(folder: str) -> list[str]:
    """The safetensors weight files of a model folder: those its ``model.safetensors.index.json`` maps tensors to where
    it has one (a repository may also ship a ``consolidated.safetensors`` beside the shards: counted once), else every
    ``*.safetensors`` but ``consolidated*``, unless that is all there is; never an optimizer's file."""
    try:
        with open(os.path.join(folder, "model.safetensors.index.json"), encoding="utf-8") as f:
            named = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, name) for name in named]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    files = _weight_files(folder, "*.safetensors")
    plain = [f for f in files if not os.path.basename(f).startswith("consolidated")]
    return plain or files


def weight_bytes(path: str) -> int | None:
    """The size on disk of a local model folder's weights (safetensors, :func:`safetensors_files`, else PyTorch
    files), or None for a hub id or a folder without weight files."""
    if not os.path.isdir(path):
        return None
    for files in (safetensors_files(path), *(_weight_files(path, pattern) for pattern in WEIGHT_PATTERNS)):
        if files:
            try:
                return sum(os.path.getsize(f) for f in files)
            except OSError:  # a file the index names is missing: no size to go by
                return None
    return None


def gpu_total_bytes() -> int | None:
    """The memory of the first GPU this process sees, read through NVML (``nvidia-smi``) without creating a CUDA
    context (the launcher's process stays off the GPU); None where there is no NVIDIA GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.split(",")[0].strip():
        return None  # set and empty: no GPU for this process
    index = visible.split(",")[0].strip() if visible else "0"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", index],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return int(float(out.split()[0]) * 2**20)  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def kv_bytes(utilization: float, total: int, weights: int, tensor_parallel_size: int = 1) -> int:
    """The KV cache one engine of ``utilization`` x ``total`` bytes can hold (module docstring's formula)."""
    w = weights / tensor_parallel_size
    return int(utilization * total - w - (RESERVE_BYTES + RESERVE_WEIGHT_FRACTION * w))


def plan_key(model: str, utilization: float) -> str:
    """How an engine actor finds its size: the model it loads and its fraction (the two groups' engines may load the
    same model, a frozen copy of the policy, with different fractions)."""
    return f"{model}|{float(utilization):g}"


def engine_groups(args: SimpleNamespace) -> list[tuple[str, str, float, int]]:
    """(name, model, fraction, tensor-parallel size) of every vLLM engine group of the run."""
    from openrlhf_classmate.integration.classmate_config import classmate_enabled

    groups = []
    if args.vllm.num_engines:
        groups.append(("policy", args.actor.model_name_or_path, args.vllm.gpu_memory_utilization,
                       args.vllm.tensor_parallel_size))
    if classmate_enabled(args):
        cfg = args.classmate
        groups += [(f"classmate {path}", path, cfg.gpu_memory_utilization, cfg.tensor_parallel_size)
                   for path in cfg.model_name_or_path]
    return groups


def plan(args: SimpleNamespace, total: int | None = None) -> tuple[dict[str, int], str | None]:
    """Every vLLM engine group's KV-cache bytes under :func:`plan_key`, or ({}, why not) when one cannot be worked
    out (then every group profiles). Empty without a reason where nothing is to be sized: the HF engines, a fixed
    ``--engine.kv_cache_gib``, or ``--engine.profile_kv_cache``."""
    engine = args.engine
    if engine.backend != "vllm" or engine.kv_cache_gib is not None or engine.profile_kv_cache:
        return {}, None
    groups = engine_groups(args)
    if not groups:
        return {}, None
    total = gpu_total_bytes() if total is None else total
    if total is None:
        return {}, "no NVIDIA GPU visible to the launcher (nvidia-smi) to size the engines' KV caches by"
    sizes = {}
    for name, model, utilization, tp in groups:
        weights = weight_bytes(model)
        if weights is None:
            return {}, f"the {name} engines' model {model} is not a local folder with weight files to size by"
        size = kv_bytes(utilization, total, weights, tp)
        if size < MIN_KV_BYTES:
            return {}, (f"the {name} engines' fraction {utilization:g} of {total / GIB:.1f} GiB leaves "
                        f"{size / GIB:.2f} GiB beside {weights / tp / GIB:.2f} GiB of weights")
        sizes[plan_key(model, utilization)] = size
    return sizes, None


# Training state per byte of the policy's bf16 weights when upstream's DeepSpeed set-up has loaded the actor: the
# weights and their gradients (1 + 1), and where Adam stays on the GPU its fp32 master copy and two moments
# (2 + 2 + 2), which ZeRO splits across the actor's GPUs
ACTOR_STATE_FACTOR, OPTIMIZER_STATE_FACTOR = 2, 6
MODELS_MARGIN_BYTES = 2 * GIB  # CUDA contexts, DeepSpeed's buffers


def models_beside_engines(args: SimpleNamespace, total: int | None = None) -> tuple[bool, str]:
    """Whether the actor/ref models can load on the GPU while the engines there are still awake (starting, before
    their first sleep), and why (one clause). The engines then hold their fractions of the GPU; the models need the
    reference's weights and the actor's training state (:data:`ACTOR_STATE_FACTOR`, :data:`OPTIMIZER_STATE_FACTOR`).
    No when the sizes cannot be read: upstream's order (engines asleep first) is always safe."""
    total = gpu_total_bytes() if total is None else total
    if total is None:
        return False, "no NVIDIA GPU visible to the launcher (nvidia-smi) to check the memory by"
    weights = weight_bytes(args.actor.model_name_or_path)
    if weights is None:
        return False, f"the policy {args.actor.model_name_or_path} is not a local folder with weight files to size by"
    shards = args.actor.num_nodes * args.actor.num_gpus_per_node
    optimizer = 0 if args.ds.adam_offload else OPTIMIZER_STATE_FACTOR * weights / shards
    actor = ACTOR_STATE_FACTOR * weights / (shards if args.ds.zero_stage == 3 else 1) + optimizer
    reference = 0 if args.ref.offload else weights
    engines = sum(fraction for _, _, fraction, _ in engine_groups(args)) * total
    need = engines + actor + reference + MODELS_MARGIN_BYTES
    sizes = (f"the engines' {engines / GIB:.1f} GiB + the actor's {actor / GIB:.1f} GiB + the reference's "
             f"{reference / GIB:.1f} GiB + {MODELS_MARGIN_BYTES / GIB:.0f} GiB {'<=' if need <= total else '>'} "
             f"{total / GIB:.1f} GiB")
    return need <= total, sizes

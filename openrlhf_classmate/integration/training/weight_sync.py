"""The weight sync of colocated runs in buckets: one CUDA-IPC handle and one engine call per bucket of parameters.

Upstream 0.11.2 (``ActorPPOTrainer.broadcast_to_vllm``, CUDA-IPC branch, taken with ``--train.colocate_all`` and the
nccl sync backend) sends every parameter on its own: a clone, an IPC handle, an ``all_gather_object`` over the
actor ranks, one Ray call per engine (which prints a line per parameter in the engine) and a barrier, ~290 times for
a 0.5B Qwen2.5. On one GPU that took 1.1-1.6 s per step (``bench/GPU_RESULTS.md``) where the copy itself is
milliseconds. Here the parameters go in buckets of at most ``--engine.weight_sync_bucket_mb`` (one parameter larger
than that goes alone): each bucket is gathered (ZeRO-3), copied into one flat buffer per bucket, shared through one
IPC handle, and loaded by each engine's workers with one ``load_weights`` call over views of that buffer.

What runs where:

* actor ranks (DeepSpeed workers): :func:`sync_buckets`, from ``ClassmateActorPPOTrainer.broadcast_to_vllm`` (which
  keeps upstream's path for ``--engine.weight_sync_bucket_mb 0``, the NCCL / gloo broadcast, DeepSpeed tensor
  parallelism and VLM models);
* engine actors (``vllm_engine.CountingRolloutActor.update_weights_cuda_ipc_bucket``): forward the bucket to the
  workers (``collective_rpc``) and count it;
* vLLM workers: :class:`BucketWorkerWrap`, upstream's worker extension plus :meth:`update_weights_cuda_ipc_bucket`
  (``vllm_engine.engine_kwargs`` names it as the engines' ``worker_extension_cls``).

The packing (:func:`plan_buckets`, :func:`pack`, :func:`unpack`) is plain torch and checked on CPU
(``tests/test_weight_sync.py``); the mismatch metrics (``mismatch/*``) are what proves on a GPU that the engines
still sample from the trained weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

WORKER_EXTENSION = f"{__name__}.BucketWorkerWrap"
"""The engines' ``worker_extension_cls`` (a dotted path: vLLM imports it in each worker process)."""

Meta = tuple[str, str, tuple[int, ...], int, int]
"""One parameter of a bucket: name, dtype (``str(torch.dtype)``), shape, offset and number of elements in the flat
buffer. Plain tuples: they travel through Ray and vLLM's RPC pickled."""


def plan_buckets(sizes: Sequence[tuple[int, torch.dtype]], bucket_bytes: int) -> list[list[int]]:
    """Indices of consecutive parameters (``(bytes, dtype)`` each, in the order they are sent) grouped into buckets
    of at most ``bucket_bytes`` and one dtype each; a parameter larger than ``bucket_bytes`` is a bucket alone."""
    buckets: list[list[int]] = []
    used, dtype = 0, None
    for i, (size, kind) in enumerate(sizes):
        if buckets and kind == dtype and used + size <= bucket_bytes:
            buckets[-1].append(i)
            used += size
        else:
            buckets.append([i])
            used, dtype = size, kind
    return buckets


def pack(named: Sequence[tuple[str, torch.Tensor]], shapes: Sequence[Sequence[int]] | None = None
         ) -> tuple[torch.Tensor, list[Meta]]:
    """One flat buffer on the tensors' device holding each tensor's elements in turn, and their :data:`Meta`.
    ``shapes`` overrides each tensor's shape in the metadata (a ZeRO-3 parameter's ``ds_shape``)."""
    dtypes = {t.dtype for _, t in named}
    if len(dtypes) != 1:
        raise ValueError(f"a bucket holds one dtype, got {sorted(map(str, dtypes))}")
    total = sum(t.numel() for _, t in named)
    flat = torch.empty(total, dtype=named[0][1].dtype, device=named[0][1].device)
    metas: list[Meta] = []
    offset = 0
    for i, (name, tensor) in enumerate(named):
        n = tensor.numel()
        flat[offset:offset + n].copy_(tensor.reshape(-1))
        shape = tuple(shapes[i]) if shapes is not None else tuple(tensor.shape)
        metas.append((name, str(tensor.dtype), shape, offset, n))
        offset += n
    return flat, metas


def unpack(flat: torch.Tensor, metas: Sequence[Meta]) -> list[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs of a bucket as views of ``flat`` (no copy), in their order."""
    return [(name, flat[offset:offset + n].view(shape)) for name, _, shape, offset, n in metas]


def _gathered(trainer, params: list[torch.nn.Parameter]):
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, enabled=trainer.strategy.args.ds.zero_stage == 3)


def sync_buckets(trainer, bucket_bytes: int) -> None:
    """Upstream's CUDA-IPC weight sync (``ActorPPOTrainer.broadcast_to_vllm``) with the parameters sent in buckets;
    called on every actor rank. The prefix-cache reset, the parameter selection, the empty-cache and barrier calls
    are upstream's."""
    import ray
    from openrlhf.trainer.ray.utils import get_physical_gpu_id
    from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync
    from torch.multiprocessing.reductions import reduce_tensor

    rank0 = torch.distributed.get_rank() == 0
    resets = []
    if getattr(trainer.strategy.args.vllm, "enable_prefix_caching", False) and rank0:
        resets = [engine.reset_prefix_cache.remote() for engine in trainer.vllm_engines]
    torch.cuda.empty_cache()
    model = trainer.actor.model.module
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad or not getattr(trainer.actor, "is_vlm", False)]
    zero3 = trainer.strategy.args.ds.zero_stage == 3
    sizes = [((p.ds_numel if zero3 else p.numel()) * p.element_size(), p.dtype) for _, p in named]
    buckets = plan_buckets(sizes, bucket_bytes)
    for b, indices in enumerate(buckets):
        params = [named[i][1] for i in indices]
        with _gathered(trainer, params):
            shapes = [p.ds_shape if zero3 else p.shape for p in params]
            flat, metas = pack([(named[i][0], named[i][1].data) for i in indices], shapes)
        handles: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(handles, {get_physical_gpu_id(): reduce_tensor(flat)})
        if rank0:
            by_gpu = {gpu: handle for d in handles for gpu, handle in d.items()}
            last = b == len(buckets) - 1
            ray.get([engine.update_weights_cuda_ipc_bucket.remote(metas, by_gpu, empty_cache=last)
                     for engine in trainer.vllm_engines])
        torch_dist_barrier_and_cuda_sync()  # every engine has loaded the bucket before its buffer is freed
        del flat
    if resets:
        ray.get(resets)
    torch.cuda.empty_cache()
    torch_dist_barrier_and_cuda_sync()


class BucketWorkerWrap(WorkerWrap):
    """Upstream's vLLM worker extension plus the bucketed CUDA-IPC load."""

    def update_weights_cuda_ipc_bucket(self, metas: Sequence[Meta], ipc_handles: dict, empty_cache: bool = False
                                       ) -> None:
        from openrlhf.trainer.ray.utils import get_physical_gpu_id

        expected = str(self.model_config.dtype)
        wrong = [(name, dtype) for name, dtype, *_ in metas if dtype != expected]
        if wrong:
            raise TypeError(f"weight sync: {wrong[0][0]} arrives as {wrong[0][1]}, the engine's model is {expected}")
        func, args = ipc_handles[get_physical_gpu_id()]
        args = list(args)
        args[6] = self.device.index  # this worker's device index (the sender numbers its GPUs in its own process)
        flat = func(*args)
        self.model_runner.model.load_weights(weights=unpack(flat, metas))
        if flat.is_cuda:
            torch.cuda.synchronize()  # loaded before the sender frees the buffer
        del flat
        if empty_cache and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

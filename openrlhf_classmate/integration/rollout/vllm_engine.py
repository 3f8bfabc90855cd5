"""Upstream's vLLM rollout actor with a weight-update counter (both engine groups are built from it).

OpenRLHF's ``RolloutRayActor`` forwards each weight the policy actor sends (``update_weight`` over NCCL or gloo,
``update_weight_cuda_ipc`` with CUDA IPC handles when everything is colocated) to its vLLM workers. The actor's rank 0
sends every parameter once per sync and flags the last one with ``empty_cache=True``; counting those calls here
gives, per engine, how many complete weight syncs reached it (and how many parameters in total), without touching
upstream's worker extension. The launcher records the counts next to the checkpoints
(``engine_weight_updates.json``), so a GPU run can assert that the policy engines got the weights every step and
the classmate engines never, as the HF engine's counter does on CPU.

``patches.install_vllm_engine_counter`` rebinds ``openrlhf.trainer.ray.vllm_engine.RolloutRayActor`` to this class
(upstream's ``create_vllm_engines`` looks the name up when it runs).
"""

from __future__ import annotations

import json
import os

from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

from openrlhf_classmate.integration.rollout import tokenizer_handle
from openrlhf_classmate.integration.training.weight_sync import WORKER_EXTENSION

# the worker extension upstream's create_vllm_engines names (checked by tests/test_weight_sync.py against its source)
UPSTREAM_WORKER_EXTENSION = "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"

# --engine.kv_cache_gib reaches the engine actors through the environment (the launcher's Ray runtime env):
# upstream's create_vllm_engines builds their keyword arguments and has no parameter for it
KV_CACHE_ENV = "OPENRLHF_CLASSMATE_KV_CACHE_BYTES"
# and so do the launcher's own sizes where the flag is unset (integration/rollout/engine_memory.py: JSON, one size per
# model and fraction)
KV_PLAN_ENV = "OPENRLHF_CLASSMATE_KV_CACHE_PLAN"
# and so does the CUDA-graph capture cap of --engine.cudagraph_max_size
CUDAGRAPH_ENV = "OPENRLHF_CLASSMATE_CUDAGRAPH_MAX"
# vLLM's largest default capture size (CompilationConfig.max_cudagraph_capture_size: min(2 x max_num_seqs, 512))
VLLM_MAX_CAPTURE = 512


def capture_size(requests: int) -> int:
    """The smallest of vLLM's automatic capture sizes that holds ``requests`` sequences, at most 512. vLLM captures
    1, 2, 4, then every multiple of 8 below 256, then every multiple of 16, up to its cap; a cap between two of them
    would capture the smaller one only, and a decode batch of ``requests`` would run without a graph."""
    for size in (1, 2, 4):
        if requests <= size:
            return size
    step = 8 if requests <= 256 else 16
    return min(-(-requests // step) * step, VLLM_MAX_CAPTURE)


def rollout_capture_size(args) -> int:
    """The capture cap of ``--engine.cudagraph_max_size`` unset: the most sequences one engine holds in a rollout
    step, over the policy engines and the classmate's (upstream spreads a generation batch's prompts, each with its
    ``n_samples_per_prompt`` requests, evenly over the policy engines)."""
    from openrlhf_classmate.integration.classmate_config import classmate_enabled

    batch = max(args.rollout.batch_size, args.rollout.vllm_generate_batch_size or 0)
    responses = batch * args.rollout.n_samples_per_prompt
    most = -(-responses // max(args.vllm.num_engines or 1, 1))
    if classmate_enabled(args):
        cfg = args.classmate
        most = max(most, -(-responses * cfg.samples // max(cfg.num_engines, 1)))
    return capture_size(most)


def engine_env(args, kv_plan: dict[str, int] | None = None) -> dict[str, str]:
    """The environment the engine actors read: the fixed KV-cache size of ``--engine.kv_cache_gib`` in bytes, or the
    launcher's sizes (``kv_plan``, :func:`engine_memory.plan`), and the CUDA-graph capture cap
    (``--engine.cudagraph_max_size``; none with ``--vllm.enforce_eager``, which captures nothing, or with 0, vLLM's
    own choice)."""
    if args.engine.backend != "vllm":
        return {}
    env = {}
    gib = args.engine.kv_cache_gib
    if gib is not None:
        env[KV_CACHE_ENV] = str(int(gib * 2**30))
    elif kv_plan:
        env[KV_PLAN_ENV] = json.dumps(kv_plan, sort_keys=True)
    cap = args.engine.cudagraph_max_size
    cap = rollout_capture_size(args) if cap is None else cap
    if cap and not args.vllm.enforce_eager:
        env[CUDAGRAPH_ENV] = str(cap)
    return env


def planned_kv_bytes(kwargs: dict, environ=os.environ) -> int | None:
    """This engine's size in the launcher's plan (:data:`KV_PLAN_ENV`), found by its model and fraction; None (vLLM
    profiles) where the plan has none."""
    from openrlhf_classmate.integration.rollout.engine_memory import plan_key

    raw = environ.get(KV_PLAN_ENV)
    if not raw or kwargs.get("gpu_memory_utilization") is None:
        return None
    return json.loads(raw).get(plan_key(kwargs.get("model", ""), kwargs["gpu_memory_utilization"]))


def engine_kwargs(kwargs: dict, environ=os.environ) -> dict:
    """``vllm.AsyncEngineArgs`` keyword arguments with the launcher's fixed KV-cache size, if it set one: vLLM then
    reserves that many bytes instead of profiling the GPU's free memory (``kv_cache_memory_bytes``); its CUDA-graph
    capture cap (``max_cudagraph_capture_size``); and our worker extension (upstream's plus the bucketed weight load,
    ``weight_sync.BucketWorkerWrap``) where upstream names its own."""
    size = environ.get(KV_CACHE_ENV) or planned_kv_bytes(kwargs, environ)
    out = {**kwargs, "kv_cache_memory_bytes": int(size)} if size else dict(kwargs)
    cap = environ.get(CUDAGRAPH_ENV)
    if cap and not out.get("enforce_eager"):
        out["max_cudagraph_capture_size"] = int(cap)
    if out.get("worker_extension_cls") == UPSTREAM_WORKER_EXTENSION:
        out["worker_extension_cls"] = WORKER_EXTENSION
    return out


class CountingRolloutActor(RolloutRayActor.__ray_actor_class__):
    """``RolloutRayActor`` (a Ray ``ActorClass``: subclass the plain class behind it) plus weight-update counts and
    the fixed KV-cache size of ``--engine.kv_cache_gib``."""

    _num_weight_updates = 0
    _num_weights_received = 0

    async def __init__(self, *args, **kwargs):
        await super().__init__(*args, **engine_kwargs(kwargs))

    def remember_tokenizer(self, key: str, tokenizer) -> None:
        """Keep the rollout's tokenizer, which later calls name by key (``tokenizer_handle.py``)."""
        tokenizer_handle.remember(key, tokenizer)

    def _count(self, last: bool) -> None:
        self._num_weights_received += 1
        if last:
            self._num_weight_updates += 1

    async def update_weight(self, name, dtype, shape, empty_cache=False):
        result = await super().update_weight(name, dtype, shape, empty_cache)
        self._count(bool(empty_cache))
        return result

    async def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles, empty_cache=False):
        result = await super().update_weight_cuda_ipc(name, dtype, shape, ipc_handles, empty_cache)
        self._count(bool(empty_cache))
        return result

    async def update_weights_cuda_ipc_bucket(self, metas, ipc_handles, empty_cache=False):
        """A bucket of parameters through one CUDA-IPC handle (``weight_sync``); ``empty_cache`` marks the last."""
        result = await self.llm.collective_rpc("update_weights_cuda_ipc_bucket", args=(metas, ipc_handles, empty_cache))
        self._num_weights_received += len(metas) - 1  # _count adds the last one
        self._count(bool(empty_cache))
        return result

    def get_num_weight_updates(self) -> int:
        """Complete weight syncs received (the HF engine's method of the same name counts ``load_weights``)."""
        return self._num_weight_updates

    def get_num_weights_received(self) -> int:
        """Parameters received over all syncs (a complete sync sends every parameter of the model once)."""
        return self._num_weights_received

"""What our vLLM engine actor hands to ``vllm.AsyncEngineArgs``, read on CPU: upstream's ``RolloutRayActor.__init__``
runs unchanged up to the engine arguments' construction, which records its keyword arguments (there is no vLLM
engine to build without a GPU). Used by the tests of the launcher's engine settings (KV cache, CUDA-graph cap)."""

from __future__ import annotations

import asyncio
import os


class _Constructed(Exception):
    pass


def engine_args_seen(monkeypatch, env: dict[str, str | None], **init_kwargs) -> dict:
    """The keyword arguments ``vllm.AsyncEngineArgs`` receives from ``CountingRolloutActor(**init_kwargs)`` with the
    environment ``env`` (None: unset), through upstream's own ``__init__`` (``monkeypatch``: pytest's)."""
    import vllm
    from openrlhf.trainer.ray import vllm_engine as upstream

    from openrlhf_classmate.integration.rollout.vllm_engine import CountingRolloutActor

    seen: dict = {}

    def engine_args(*args, **kwargs):
        seen.update(kwargs)
        raise _Constructed

    monkeypatch.setattr(upstream.vllm, "AsyncEngineArgs", engine_args)
    monkeypatch.setattr(vllm, "__version__", "0.26.0", raising=False)
    for name in ("VLLM_ALLOW_INSECURE_SERIALIZATION", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # upstream's init sets them; restored afterwards
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # in a Ray worker upstream reads it from the driver
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    actor = object.__new__(CountingRolloutActor)
    try:
        asyncio.run(actor.__init__(**init_kwargs))
    except _Constructed:
        return seen
    raise AssertionError("upstream's RolloutRayActor.__init__ no longer builds vllm.AsyncEngineArgs")

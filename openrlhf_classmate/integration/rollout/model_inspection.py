"""vLLM's model-class inspection, started by the launcher while Ray and the engine actors start.

Every vLLM engine resolves its model's architecture when it starts: vLLM imports the model's module in a fresh Python
subprocess (so that the engine's own process does not initialise CUDA) and keeps what it learns in
``$VLLM_CACHE_ROOT/modelinfos`` (default ``~/.cache/vllm/modelinfos``), keyed by the model file's hash. Without that
cache (a fresh machine or container, another vLLM) the subprocess took 21-28 s inside each engine group's start on
the H200 machine, the first step waiting for it, and 0 s with it (``bench/GPU_RESULTS.md`` sections 11 and 12).

The launcher starts the same inspection in a background thread just before Ray starts. Ray's start (6-8 s) and the
engine actors' own start and imports (~30 s) come before their inspection, so the cache is warm by then. The thread
only waits on vLLM's subprocess, which writes the cache file atomically; an engine that gets there first inspects on
its own, as without the thread. Where vLLM is absent, the model is a hub id or vLLM's registry has changed, nothing
starts and the engines inspect as before (:func:`start_inspection` says why).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

# a benchmark switch (bench/cold_start.py): the launch without the inspection, for its before/after pair
NO_INSPECTION_ENV = "OPENRLHF_CLASSMATE_BENCH_NO_INSPECTION"


def architectures(paths: Iterable[str]) -> list[str]:
    """The ``architectures`` of each local model folder's config.json, in order, each once."""
    found: list[str] = []
    for path in paths:
        try:
            with open(os.path.join(os.path.expanduser(path), "config.json"), encoding="utf-8") as f:
                names = json.load(f).get("architectures") or []
        except (OSError, ValueError, AttributeError):
            continue
        found += [n for n in names if isinstance(n, str) and n not in found]
    return found


def _vllm_registry() -> Any:
    from vllm.model_executor.models.registry import ModelRegistry

    return ModelRegistry


def start_inspection(paths: Iterable[str], registry: Callable[[], Any] = _vllm_registry,
                     log: Callable[[str], None] | None = None) -> tuple[threading.Thread | None, str]:
    """Start vLLM's inspection of the architectures of ``paths`` in a daemon thread; (the thread or None, one clause
    saying what started or why nothing did). The thread records per architecture the seconds it took, or the error,
    in its ``results`` dict."""
    if os.environ.get(NO_INSPECTION_ENV) == "1":
        return None, f"not started ({NO_INSPECTION_ENV}=1)"
    archs = architectures(paths)
    if not archs:
        return None, "not started: no local model folder names an architecture in its config.json"
    try:
        models = registry().models
    except (ImportError, AttributeError) as e:  # no vLLM, or a registry without the table this reads
        return None, f"not started: vLLM's model registry is not readable here ({type(e).__name__}: {e})"
    entries = [(arch, models[arch]) for arch in archs if arch in models and hasattr(models[arch], "inspect_model_cls")]
    if not entries:
        return None, f"not started: vLLM's registry has none of {', '.join(archs)} to inspect ahead"
    results: dict[str, float | str] = {}

    def inspect() -> None:
        for arch, entry in entries:
            t = time.time()
            try:
                entry.inspect_model_cls()  # a cache hit reads one JSON file; a miss runs vLLM's subprocess
                results[arch] = round(time.time() - t, 2)
            except Exception as e:  # noqa: BLE001  (the engines inspect on their own; the run must not stop here)
                results[arch] = f"{type(e).__name__}: {str(e)[:200]}"
                if log:
                    log(f"vLLM's model inspection of {arch} ahead of the engines failed ({results[arch]}); the "
                        "engines inspect it themselves")

    thread = threading.Thread(target=inspect, name="vllm-model-inspection", daemon=True)
    thread.results = results  # type: ignore[attr-defined]
    thread.start()
    return thread, f"started for {', '.join(arch for arch, _ in entries)}"

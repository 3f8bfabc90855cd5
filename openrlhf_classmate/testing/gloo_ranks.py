"""Run a function on several local ranks: one subprocess per rank, ``torch.distributed`` over gloo and DeepSpeed's
CPU accelerator, as the Ray actors of a CPU run have them (tests of multi-rank ZeRO-3 without Ray).

``run_ranks("package.module:function", world_size, kwargs)`` starts ``python -m openrlhf_classmate.testing.gloo_ranks``
per rank; each calls ``function(rank=..., world_size=..., **kwargs)`` after setting the rendezvous variables
(``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``) and returns its JSON-able result;
an exception becomes ``{"error": "<type>: <message>"}``. A rank that hangs is killed at ``timeout``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile

from openrlhf_classmate.ports import free_port


def run_ranks(target: str, world_size: int, kwargs: dict, timeout: float = 300) -> list[dict]:
    """The result of ``target`` on each of ``world_size`` ranks, in rank order."""
    port = free_port()
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for rank in range(world_size):
            outs.append(os.path.join(tmp, f"rank{rank}.json"))
            procs.append(subprocess.Popen(
                [sys.executable, "-m", __name__, target, str(rank), str(world_size), str(port), json.dumps(kwargs),
                 outs[-1]], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        results = []
        for rank, (path, log) in enumerate(zip(outs, logs)):
            if not os.path.exists(path):
                raise RuntimeError(f"rank {rank} wrote no result; its output:\n{log[-4000:]}")
            with open(path) as f:
                results.append({**json.load(f), "log": log})
        return results


def main(argv: list[str]) -> None:
    target, rank, world_size, port, kwargs, out = argv
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=world_size, LOCAL_RANK="0")
    module, name = target.split(":")
    try:
        result = getattr(importlib.import_module(module), name)(rank=int(rank), world_size=int(world_size),
                                                                **json.loads(kwargs))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which asserts on it
        result = {"error": f"{type(e).__name__}: {e}"}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])

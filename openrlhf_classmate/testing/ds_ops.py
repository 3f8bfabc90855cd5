"""DeepSpeed's CPU ops (C++ extensions compiled on first use) built once per virtual environment, ahead of the tests.

On the CPU every launcher run loads ``fused_adam`` (the actor's optimizer), ``deepspeed_shm_comm`` (DeepSpeed's
collectives) and, with an offloaded optimizer, ``cpu_adam``; each compiles for one to three minutes on two cores.
``scripts/setup.sh`` builds them (``python -m openrlhf_classmate.testing.ds_ops``), so no test pays for a build inside
its run, and the tests load them from :func:`extensions_dir`, a folder of this environment's own: torch's default
(``~/.cache/torch_extensions/py311_cpu``) is shared by every environment of one Python version while its build files
name the environment's paths, so two checkouts' environments on one machine rebuild each op in turn (seen: the shm op
rebuilt 20 times in 90 minutes while a fresh clone's suite ran beside the developers' environment), each build under
a lock that every other run loading the op waits on."""

from __future__ import annotations

import os
import sys
import time

OPS = ("FusedAdamBuilder", "ShareMemCommBuilder", "CPUAdamBuilder")


def extensions_dir() -> str:
    """This environment's build folder for torch C++ extensions."""
    return os.path.join(sys.prefix, "torch_extensions")


def build(log=print) -> None:
    """Build (or find up to date) every op of :data:`OPS` into ``$TORCH_EXTENSIONS_DIR``."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    for name in OPS:
        start = time.time()
        get_accelerator().create_op_builder(name).load(verbose=False)
        log(f"ds_ops: {name} ready in {os.environ['TORCH_EXTENSIONS_DIR']} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    build()

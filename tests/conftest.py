"""Shared pytest setup. The package import installs the CPU shims before any openrlhf import in the tests."""

import os
import sys

# bytecode caches: an environment with PYTHONDONTWRITEBYTECODE set (as this machine's shell) made every test process
# recompile this repository's modules, and pytest rewrite the asserts of every test module, on each import: ~5 s of
# each pytest worker's collection and more in every subprocess the tests start. Python checks each cache against its
# source's mtime and size, so a changed file is recompiled; the caches are git-ignored
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
# one OpenMP thread per test process and subprocess (the launcher passes it to its Ray workers): the suite runs two or
# three pytest workers on two cores, each starting Ray and DeepSpeed processes, and under that load torch's two-thread
# parallel regions wait on each other. The quick demo's warm-start ran 10-30x slower than alone (its module fixture
# took 1164-1851 s); with one thread, 239 s, and the slow part 1249 s instead of 1571-2069 s
os.environ.setdefault("OMP_NUM_THREADS", "1")
# no test reaches the Hugging Face hub (tiny models are built on the fly): a hub id that slips into a test fails at
# once instead of after ~47 s of retries against an unreachable host
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

import openrlhf_classmate  # noqa: E402,F401
from openrlhf_classmate.testing.ds_ops import extensions_dir  # noqa: E402

# DeepSpeed's CPU ops from this environment's own build folder, where scripts/setup.sh built them (ds_ops.py says why);
# inherited by the launcher subprocesses and their Ray workers
os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())

# slow_guard: a test that starts Ray, DeepSpeed, the launcher or the demo must be marked slow (the fast loop skips it)
pytest_plugins = ["pytester", "openrlhf_classmate.testing.slow_guard"]


@pytest.fixture(scope="session")
def bpe_world(tmp_path_factory):
    """The realistic tokenizer world (``openrlhf_classmate.testing.bpe_world``): BPE tokenizers trained once per test
    session, each saved with a tiny model."""
    from openrlhf_classmate.testing.bpe_world import save_world

    return save_world(str(tmp_path_factory.mktemp("bpe_world")))


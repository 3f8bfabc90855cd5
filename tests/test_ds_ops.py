"""DeepSpeed's CPU ops come from this environment's own build folder (tests/conftest.py points TORCH_EXTENSIONS_DIR
there, scripts/setup.sh builds them there): a load finds them up to date and rebuilds nothing, so no launcher run
compiles inside its time, and another environment on the machine (another checkout's .venv) cannot make them stale."""

import os
import sys

import pytest

from openrlhf_classmate.testing import ds_ops

pytestmark = pytest.mark.slow  # compiles the ops (minutes) where setup.sh has not


def test_the_ops_are_built_in_this_environment_and_a_second_load_rebuilds_nothing():
    assert ds_ops.extensions_dir() == os.path.join(sys.prefix, "torch_extensions")
    root = os.environ["TORCH_EXTENSIONS_DIR"]  # that folder, unless the user's environment names another
    ds_ops.build(log=lambda *_: None)
    libs = [os.path.join(root, op, f"{op}.so") for op in ("fused_adam", "deepspeed_shm_comm", "cpu_adam")]
    built = {lib: os.path.getmtime(lib) for lib in libs}
    ds_ops.build(log=lambda *_: None)
    assert {lib: os.path.getmtime(lib) for lib in libs} == built

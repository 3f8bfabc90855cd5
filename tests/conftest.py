"""Shared pytest setup. The package import installs the CPU shims before any openrlhf import in the tests."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

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


@pytest.fixture(scope="session")
def plain_grpo_run(tmp_path_factory):
    """One 2-step plain GRPO run of the launcher (tiny e2e world, ZeRO-2, bf16, checkpoints and HF saves at steps 1
    and 2), shared by the tests that check different things of it: ``test_e2e_cpu`` (the run) and
    ``test_convert_checkpoint`` (its checkpoint). Every launch costs ~40 s of Ray, DeepSpeed and engine start-up on two
    cores for ~2 s of training. An entropy bonus moves the weights every step even when a tiny random policy's rewards
    do not vary within a group (then the policy loss alone has no gradient). Returns the world plus its ``log``."""
    from openrlhf_classmate.testing.e2e import build_world, launcher_argv, run_launcher

    world = build_world(str(tmp_path_factory.mktemp("plain_grpo") / "world"))
    log = os.path.join(world["root"], "launcher.log")
    code = run_launcher(launcher_argv(world, classmate=False, extra=["--actor.entropy_coef", "0.01"]), log,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if code != 0:
        pytest.fail(f"launcher run failed ({code}):\n{open(log).read()[-4000:]}")
    return {**world, "log": log}

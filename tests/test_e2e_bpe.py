"""End-to-end classmate training over the realistic tokenizer world, through the real launcher on CPU:
a Qwen3-like policy (byte-level BPE, ChatML, two stop ids) whose rollouts mix genuine ``</think>`` ids, typed
``</think>`` pieces and both stop ids, and a SentencePiece-style classmate of another vocabulary."""

import json
import os

import pytest

from openrlhf_classmate.testing.e2e import (
    build_bpe_world,
    launcher_argv,
    max_weight_change,
    model_weights,
    run_launcher,
    tensorboard_scalars,
)

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_classmate_run_over_the_qwen3_like_world_splits_alike_in_reward_and_classmate_stage(tmp_path):
    world = build_bpe_world(str(tmp_path / "world"))
    argv = launcher_argv(world, estimator="gdpo", extra=["--rollout.max_new_tokens", "24",
                                                         "--rollout.temperature", "1.0"])
    log = str(tmp_path / "run.log")
    code = run_launcher(argv, log, cwd=REPO)
    if code != 0:
        pytest.fail(f"launcher exited with {code}; log tail:\n{open(log).read()[-6000:]}")
    with open(os.path.join(world["root"], "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [2], "classmate": [0]}
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    # the main reward (policy engines) and the classmate stage (controller) split the same rollouts alike
    reward_side, stage_side = tb["train/has_answer"], tb["train/classmate/has_answer_fraction"]
    assert set(reward_side) == set(stage_side) == {1, 2}
    for step in (1, 2):
        assert reward_side[step] == pytest.approx(stage_side[step], abs=1e-6)
    assert any(0.0 < v < 1.0 for v in stage_side.values())  # typed close tags are in the rollouts: no answer
    assert set(tb["train/classmate/reward"]) == {1, 2} and set(tb["train/reward"]) == {1, 2}
    change = max_weight_change(model_weights(world["policy"]), model_weights(os.path.join(world["root"], "hf_final")))
    assert change > 1e-4

"""End-to-end runs of the launcher on CPU: local Ray with logical GPUs, DeepSpeed ZeRO-2 on its CPU accelerator,
HF engines for the policy and classmate groups, tiny random models built on the fly. Each run is a real subprocess,
as a user would start it."""

import glob
import json
import os

import pytest

from openrlhf_classmate.testing.e2e import (
    build_world,
    launcher_argv,
    max_weight_change,
    model_weights,
    run_launcher,
    tensorboard_scalars,
)

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(argv: list[str], log_path: str, env: dict[str, str] | None = None) -> None:
    code = run_launcher(argv, log_path, cwd=REPO, env=env)
    if code != 0:
        with open(log_path) as f:
            tail = f.read()[-6000:]
        pytest.fail(f"launcher exited with {code}; log tail:\n{tail}")


def test_classmate_training_runs_checkpoints_and_resumes(tmp_path):
    world = build_world(str(tmp_path / "world"))
    root = world["root"]
    wandb_dir = str(tmp_path / "wandb")
    os.makedirs(wandb_dir)
    _launch(launcher_argv(world, extra=["--logger.wandb.key", "offline"]), str(tmp_path / "run1.log"),
            env={"WANDB_MODE": "offline", "WANDB_DIR": wandb_dir})

    with open(os.path.join(root, "ckpt", "engine_weight_updates.json")) as f:
        updates = json.load(f)
    assert updates == {"policy": [2], "classmate": [0]}  # policy synced every step, classmate never

    actor_ckpt = os.path.join(root, "ckpt", "_actor")
    assert open(os.path.join(actor_ckpt, "latest")).read().strip() == "global_step2"
    assert os.path.isfile(os.path.join(actor_ckpt, "zero_to_fp32.py"))
    assert glob.glob(os.path.join(actor_ckpt, "global_step2", "*model_states.pt"))
    assert os.path.isdir(os.path.join(root, "ckpt", "global_step2_hf"))
    change = max_weight_change(model_weights(world["policy"]), model_weights(os.path.join(root, "hf_final")))
    assert change > 1e-4, f"policy weights did not change (max |delta| = {change})"

    tb = tensorboard_scalars(os.path.join(root, "tb"))
    for tag in ("train/classmate/reward", "train/classmate/valid", "train/classmate/stage_time",
                "train/classmate/stage_overlap_time", "train/classmate/classmate_loss",
                "train/classmate/classmate_clip_ratio", "train/classmate/cot_tokens",
                "train/classmate/classmate_group_reward_std", "train/classmate/output_length"):
        assert set(tb.get(tag, {})) == {1, 2}, f"{tag} missing from tensorboard: {sorted(tb)}"
    assert all(v == 0.0 for v in tb["train/classmate/adv_abs_outside_cot"].values())  # classmate_partial
    # the classmate advantage reaches the CoT tokens exactly where a group's classmate rewards differ: the random
    # world's classmate is right ~1 time in 16, and the HF engine's batches (hence its samples) follow the requests'
    # arrival times, so whether a step has such a group is luck (tests/test_experience_maker.py checks the numbers)
    for step, std in tb["train/classmate/classmate_group_reward_std"].items():
        assert (tb["train/classmate/adv_abs_on_cot"][step] > 0) == (std > 0), step
    assert all(v > 0 for v in tb["train/classmate/stage_time"].values())
    # the actor update split: the worker's own fit and its micro-batch training steps, outside upstream's
    # timing/* (whose sum is timing/step_total)
    fit, micro = tb["train/actor_timing/fit"], tb["train/actor_timing/micro_steps"]
    assert set(fit) == set(micro) == {1, 2} and all(0 < micro[s] <= fit[s] <= tb["train/timing/ppo_train"][s]
                                                    for s in (1, 2))
    for s in (1, 2):
        parts = sum(tb[f"train/timing/{k}"][s] for k in ("generation", "make_experience", "ppo_train", "broadcast"))
        assert abs(tb["train/timing/step_total"][s] - parts) < 1e-3
    # placement separate: each prompt group's classmate requests left as soon as the group was generated
    assert tb["train/classmate/dispatched_per_group"] == {1: 1.0, 2: 1.0}
    # the start-up breakdown, logged once at step 1: the phases add up to the time from the launcher
    # process's start to step 1's end (a phase left out or counted twice breaks the sum)
    phases = {k: v[1] for k, v in tb.items() if k.startswith("train/startup/") and k != "train/startup/first_step_s"
              and not (k.startswith("train/startup/launcher_") and k != "train/startup/launcher_s")}
    # the launcher phase's parts, inside it: imports, parsing and preflight, upstream's launcher, the KV plan
    inside = {p: tb[f"train/startup/launcher_{p}_s"][1] for p in ("imports", "preflight", "upstream_imports", "kv_plan",
                                                                     "inspection")}
    assert min(inside["imports"], inside["preflight"]) > 0 and min(inside.values()) >= 0
    assert sum(inside.values()) <= tb["train/startup/launcher_s"][1] + 0.05
    assert set(phases) == {f"train/startup/{p}_s" for p in ("launcher", "ray", "policy_engines", "classmate_engines",
                                                             "driver_setup", "models", "step_1")}
    assert all(set(tb[k]) == {1} for k in phases) and all(v >= 0 for v in phases.values())
    assert min(phases[f"train/startup/{p}_s"] for p in ("launcher", "ray", "models", "step_1")) > 0
    assert sum(phases.values()) == pytest.approx(tb["train/startup/first_step_s"][1], abs=0.1)
    # the same metrics through OpenRLHF's wandb logger, offline
    records = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(records) == 1 and b"classmate/stage_overlap_time" in open(records[0], "rb").read()

    # resume: a second episode starts from the saved step 2 and its dataloader state; it trains with
    # --train.dynamic_batch_enable (which turns on --ds.packing_samples) in this classmate run (one launch
    # fewer than a run of its own: start-up is ~95% of a 2-step run)
    resumed = launcher_argv(world, num_episodes=2, extra=["--ckpt.load_enable", "--logger.tensorboard_dir",
                                                         os.path.join(root, "tb_resume"), "--train.dynamic_batch_enable",
                                                         "--train.max_tokens_per_gpu", "96", "--ds.packing_samples"])
    _launch(resumed, str(tmp_path / "run2.log"))
    tb2 = tensorboard_scalars(os.path.join(root, "tb_resume"))
    assert set(tb2["train/classmate/reward"]) == {3, 4}
    assert open(os.path.join(actor_ckpt, "latest")).read().strip() == "global_step4"
    with open(os.path.join(root, "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [3], "classmate": [0]}  # resync at resume + 2 steps
    assert "-> sdpa" in open(tmp_path / "run2.log").read()  # no flash-attn on CPU: packed sequences through sdpa's mask
    assert set(tb2["train/classmate/classmate_loss"]) == {3, 4}
    assert all(v == 0.0 for v in tb2["train/classmate/adv_abs_outside_cot"].values())
    change = max_weight_change(model_weights(os.path.join(root, "ckpt", "global_step2_hf")),
                               model_weights(os.path.join(root, "hf_final")))
    assert change > 1e-4, f"the packed steps did not change the weights (max |delta| = {change})"


def test_reference_reproduction_loss_under_zero3(tmp_path):
    """vanilla_classmate (classmate log-probs of the spliced CoT via prompt_logprobs), seq-mean-token-sum-norm,
    no std norm, ZeRO-3 (the HF-engine weight sync gathers the partitioned parameters)."""
    world = build_world(str(tmp_path / "world"))
    extra = ["--classmate.loss", "vanilla_classmate", "--classmate.prompt_mode", "splice",
             "--classmate.loss_agg_mode", "seq-mean-token-sum-norm", "--algo.advantage.estimator", "dr_grpo"]
    _launch(launcher_argv(world, zero_stage=3, extra=extra), str(tmp_path / "run.log"))
    with open(os.path.join(world["root"], "ckpt", "engine_weight_updates.json")) as f:
        assert json.load(f) == {"policy": [2], "classmate": [0]}
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    logprob = tb["train/classmate/cot_logprob"]
    assert set(logprob) == {1, 2} and all(-20 < v < 0 for v in logprob.values())  # real log-probs, not -inf
    assert set(tb["train/classmate/loss"]) == {1, 2} and "train/classmate/classmate_loss" not in tb
    change = max_weight_change(model_weights(world["policy"]), model_weights(os.path.join(world["root"], "hf_final")))
    assert change > 1e-4


def test_async_classmate_training_with_kl_in_reward_and_overlong_penalty(tmp_path):
    """--train.async_enable: the rollout actor dispatches each batch's classmate requests, the training actor
    gathers them; 3 steps, every one with classmate scores for every sample. The same run has upstream's
    default KL mode (KL folded into the reward, no --algo.kl.use_loss) and DAPO's overlong penalty: both show up in
    what the main stream is trained on (one launch for both: start-up is ~95% of a short run)."""
    world = build_world(str(tmp_path / "world"))
    argv = [a for a in launcher_argv(world, estimator="gdpo", max_samples=12, extra=["--train.async_enable"])
            if a != "--algo.kl.use_loss"]
    argv += ["--algo.kl.init_coef", "0.05", "--algo.kl.estimator", "k1", "--reward.overlong_buffer_len", "12",
             "--reward.overlong_penalty_factor", "1.0"]
    _launch(argv, str(tmp_path / "run.log"))
    tb = tensorboard_scalars(os.path.join(world["root"], "tb"))
    for tag in ("train/classmate/reward", "train/classmate/valid", "train/classmate/stage_time",
                "train/classmate/main_kl_return"):
        assert set(tb[tag]) == {1, 2, 3}, tag
    # the rollout actor asks for the engines' log-probs on the measured steps: 1 and 2, then every 10th
    assert set(tb["train/mismatch/logprob_abs_diff_mean"]) == {1, 2}
    assert all(v == 1.0 for v in tb["train/classmate/request_fraction"].values())  # no batch without its scores
    assert all(v == 1.0 for v in tb["train/classmate/dispatched_per_group"].values())  # sent per group (auto)
    assert set(tb["train/startup/first_step_s"]) == {1} and tb["train/startup/ray_s"][1] > 0  # start-up, async too
    assert any(v != 0.0 for v in tb["train/classmate/main_kl_return"].values())  # the KL return is trained on
    penalties = tb["train/classmate/main_length_penalty"].values()
    assert all(-1.0 <= v <= 0.0 for v in penalties) and any(v < 0 for v in penalties)  # max_new_tokens 16, buffer 12
    with open(os.path.join(world["root"], "ckpt", "engine_weight_updates.json")) as f:
        updates = json.load(f)
    assert updates["classmate"] == [0] and updates["policy"] == [3]

"""A non-finite value never reaches the optimizer: our policy actor with a real DeepSpeed engine
(one rank, gloo, CPU; ``openrlhf_classmate.testing.ds_policy``), fed a NaN at each point upstream's
``training_step`` passes through (rewards, advantages, loss, gradient): the update is skipped with the weights, the
fp32 master weights, the Adam state and the learning-rate schedule unchanged, and ``nonfinite_skipped`` counts it;
a clean update right after moves the weights again."""

import math
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.testing.ds_policy import experience_batch, policy_actor, single_rank_world
from openrlhf_classmate.testing.tiny_models import save_tiny_model

pytestmark = pytest.mark.slow
WORDS = [str(i) for i in range(20)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with single_rank_world():
        yield save_tiny_model(str(tmp_path_factory.mktemp("nonfinite") / "policy"), WORDS, hidden_size=32)


# ZeRO-0: DeepSpeed wraps the bf16 optimizer in FP16_Optimizer, which sees an overflow and steps anyway (it skips
# only under loss scaling): the guard once let a NaN gradient into the weights there and logged a skip
@pytest.fixture(scope="module", params=[0, 2, 3], ids=["zero0", "zero2", "zero3"])
def policy(request, world):
    return policy_actor(world, ["--ds.zero_stage", str(request.param)])


def _snapshot(actor) -> dict[str, torch.Tensor]:
    """Everything an update may change: bf16 weights (the local ZeRO-3 partition), fp32 masters, Adam state."""
    engine = actor.actor.model
    out = {f"w/{n}": getattr(p, "ds_tensor", p).detach().clone() for n, p in engine.module.named_parameters()}
    wrapper = engine.optimizer
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat"):
        for i, t in enumerate(getattr(wrapper, attr, None) or []):
            out[f"{attr}/{i}"] = t.detach().clone()
    for i, state in enumerate(wrapper.optimizer.state.values()):
        for key, value in state.items():
            out[f"state/{i}/{key}"] = torch.as_tensor(value).detach().clone()
    out["lr"] = torch.tensor([g["lr"] for g in wrapper.param_groups])
    out["lr_scheduler_epoch"] = torch.tensor(float(engine.lr_scheduler.last_epoch))
    return out


def _fit(actor, experience) -> dict:
    actor.append(experience)
    return actor.fit(kl_ctl=0.0)


def _equal(a: dict, b: dict) -> list[str]:
    return [k for k in a if not torch.equal(a[k], b[k])]


def _poison(point: str, actor, experience):
    """NaN at ``point`` of one sample; returns an undo for a hook it leaves on the model."""
    if point == "rewards":
        experience.info["reward"][1] = math.nan
        experience.rewards[1] = math.nan
    elif point == "advantages":
        experience.advantages[2, 5] = math.nan
    elif point == "loss":
        experience.action_log_probs[0, 4] = math.nan  # old log-probs: the PPO ratio, hence the loss, is NaN
    elif point == "gradient":  # the loss stays finite; one gradient is NaN when backward reaches it
        weight = actor.actor.model.module.model.layers[0].mlp.up_proj.weight
        return weight.register_hook(lambda g: torch.full_like(g, math.nan)).remove
    return lambda: None


@pytest.mark.parametrize("point", ["rewards", "advantages", "loss", "gradient"])
def test_a_nan_at_each_point_skips_the_update_and_changes_nothing(policy, point, caplog):
    status = _fit(policy, experience_batch(seed=1))  # a clean update first: the Adam state exists
    caplog.clear()
    assert status["nonfinite_consecutive"] == 0
    skipped = status["nonfinite_skipped"]
    before = _snapshot(policy)
    poisoned = experience_batch(seed=2)
    undo = _poison(point, policy, poisoned)
    try:
        status = _fit(policy, poisoned)
    finally:
        undo()
    assert _equal(before, _snapshot(policy)) == []  # weights, masters, exp_avg / exp_avg_sq / step, lr: unchanged
    assert status["nonfinite_skipped"] == skipped + 1 and status["nonfinite_consecutive"] == 1
    expected = {"rewards": "rewards", "advantages": "advantages", "loss": "loss", "gradient": "gradient norm"}[point]
    warnings = [r.getMessage() for r in caplog.records if "skipped: non-finite" in r.getMessage()]
    assert len(warnings) == 1 and f"non-finite {expected}" in warnings[0]
    # a clean update right after is applied: the check cannot pass by never stepping
    status = _fit(policy, experience_batch(seed=3))
    after = _snapshot(policy)
    assert status["nonfinite_consecutive"] == 0 and status["nonfinite_skipped"] == skipped + 1
    changed = _equal(before, after)
    assert any(k.startswith("w/") for k in changed) and any(k.startswith("state/") for k in changed)


def test_consecutive_skips_stop_the_run_with_one_line():
    from openrlhf_classmate.integration.trainer import ClassmateControllerMixin, TrainingStopped

    controller = SimpleNamespace(args=SimpleNamespace(classmate=SimpleNamespace(stop_after_nonfinite_skips=3)))
    status = {"nonfinite_skipped": 7.0, "nonfinite_consecutive": 2.0}
    ClassmateControllerMixin._stop_on_nonfinite_skips(controller, status)
    assert status == {"nonfinite_skipped": 7.0}  # the total is logged (train/nonfinite_skipped), the run goes on
    with pytest.raises(TrainingStopped) as e:
        ClassmateControllerMixin._stop_on_nonfinite_skips(controller, {"nonfinite_consecutive": 3.0})
    assert "\n" not in str(e.value) and "--classmate.stop_after_nonfinite_skips" in str(e.value)
    controller.args.classmate.stop_after_nonfinite_skips = 0  # 0 = never stop
    ClassmateControllerMixin._stop_on_nonfinite_skips(controller, {"nonfinite_consecutive": 99.0})

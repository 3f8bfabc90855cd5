"""The policy update reads its metrics back to the host once per micro-batch, not once per metric.

Upstream's ``ppo_train`` turns every tensor metric of a micro-batch into a float (``.item()``: a host sync each) and
``DeepspeedStrategy.all_reduce`` reduces a dict one key at a time (a host-to-device copy, a collective and a
device-to-host copy each); a GDPO micro-batch carries about 60 metrics. Our strategy reduces a flat dict in one
collective and our trainer reads the metrics back in one transfer, with the values upstream's per-key path gives
(the tests restore upstream's path by patching out our three steps: :func:`_upstream_paths`). Each per-sample
``info`` metric goes to the device as one tensor, not one 0-dim tensor per sample. The non-finite guard reads nothing
back per micro-batch."""

import math
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.testing.gloo_ranks import run_ranks


@pytest.mark.slow
def test_a_flat_metric_dict_is_reduced_in_one_collective_with_upstreams_values():
    """Two gloo ranks, 60 values different on each rank (numbers, then one-element float32 tensors): our
    ``all_reduce`` returns bit for bit what upstream's does for mean, sum and max, with one ``dist.all_reduce``
    instead of 60; upstream's in-place reduction of a tensor already on the device is kept. Dicts it does not pack
    (nested, multi-element, mixed, other dtypes, not a dict) take upstream's path, collective for collective."""
    results = run_ranks("openrlhf_classmate.testing.reduce_scenarios:metric_dicts", 2, {"n": 60}, timeout=120)
    assert all("error" not in r for r in results), results
    packed = {"numbers": 1, "tensors": 1, "empty": 0}
    for r in results:
        for key in (k for k in r if k.endswith("/ours")):
            case = key.split("/")[0]
            ours, upstream = r[key], r[key.replace("/ours", "/upstream")]
            assert ours["value"] == upstream["value"], key  # JSON floats: exact
            assert ours["same_objects"] == upstream["same_objects"], key
            assert ours["calls"] == packed.get(case, upstream["calls"]), key
        assert r["numbers/mean/upstream"]["calls"] == r["tensors/sum/upstream"]["calls"] == 60
        assert r["tensors/mean/upstream"]["same_objects"] == [True] * 60  # CPU runtime: reduced in place
    assert results[0]["numbers/sum/ours"]["value"] == results[1]["numbers/sum/ours"]["value"]
    mean = results[0]["numbers/mean/ours"]["value"]
    assert all(t == "float" for t, _ in mean.values()) and len(mean) == 60
    assert results[0]["numbers/max/ours"]["value"] != mean  # the ops differ: the comparison above is not vacuous


def _gdpo_like_batch(extra: int = 56):
    """The ds_policy micro-batch with ``extra`` more per-sample metrics in ``info`` (half tensors, half the lists
    the replay buffer's collate makes): about the 61 info keys a GDPO experience carries."""
    from openrlhf_classmate.testing.ds_policy import experience_batch

    experience = experience_batch(seed=1)
    gen = torch.Generator().manual_seed(7)
    for i in range(extra):
        values = torch.rand(4, generator=gen) * 10 ** (i % 5 - 2)
        experience.info[f"gdpo/m{i}"] = values if i % 2 else values.tolist()
    return experience


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from openrlhf_classmate.testing.ds_policy import policy_actor, single_rank_world
    from openrlhf_classmate.testing.tiny_models import save_tiny_model

    with single_rank_world():
        model = save_tiny_model(str(tmp_path_factory.mktemp("syncs") / "policy"), [str(i) for i in range(20)],
                                hidden_size=32)
        # lr 0: every fit starts from the same weights, so two fits of one batch give the same metrics
        yield policy_actor(model, ["--actor.adam.lr", "0"])


def _upstream_paths(m) -> None:
    """Upstream's per-key path, under the monkeypatch context ``m``: our strategy's ``all_reduce`` packs nothing
    (upstream's collective per key), ``training_step`` leaves the metrics to upstream's ``.item()`` per metric, and
    the collate leaves each per-sample metric a list of 0-dim tensors."""
    from openrlhf_classmate.integration.training import actor, strategy

    m.setattr(strategy, "packable", lambda data: None)
    m.setattr(actor, "metrics_to_host", lambda metrics, weights: None)
    m.setattr(actor, "stack_info", lambda info: info)


def _counted_fit(actor, monkeypatch) -> tuple[dict, dict[str, int]]:
    """One ``fit`` of the GDPO-like batch (2 micro-batches, same shuffle) with its ``dist.all_reduce``,
    ``Tensor.item`` and ``Tensor.tolist`` calls and the tensors ``Experience.to_device`` copies counted."""
    import openrlhf.trainer.ppo_utils.experience as experience_module
    import torch.distributed as dist

    counts = dict.fromkeys(("all_reduce", "item", "tolist", "to_device_copies"), 0)
    actor.append(_gdpo_like_batch())
    torch.manual_seed(0)  # the dataloader's shuffle
    with monkeypatch.context() as m:
        for owner, name in ((dist, "all_reduce"), (torch.Tensor, "item"), (torch.Tensor, "tolist")):
            def counted(*args, _real=getattr(owner, name), _name=name, **kwargs):
                counts[_name] += 1
                return _real(*args, **kwargs)

            m.setattr(owner, name, counted)

        def counted_to(value, device, _real=experience_module.to):  # Experience.to_device's per-value helper
            counts["to_device_copies"] += isinstance(value, torch.Tensor)
            return _real(value, device)

        m.setattr(experience_module, "to", counted_to)
        status = actor.fit(kl_ctl=0.0)
    # wall times (actor_timing/*) differ between any two fits: checked here, compared nowhere
    timings = {k: status.pop(k) for k in [k for k in status if k.startswith("actor_timing/")]}
    assert sorted(timings) == ["actor_timing/fit", "actor_timing/micro_steps"]
    assert 0 < timings["actor_timing/micro_steps"] <= timings["actor_timing/fit"]
    return status, counts


@pytest.mark.slow
def test_the_update_reads_metrics_back_once_per_micro_batch_with_upstreams_status(policy, monkeypatch):
    """A real DeepSpeed policy update (one rank, CPU) of a micro-batch with ~61 info metrics: the status equals, key by
    key and bit for bit, the status of upstream's per-key path (:func:`_upstream_paths`), with one collective
    instead of K + 2 and no ``.item()`` instead of 2K + 2 per micro-batch (K = metrics reduced)."""
    _counted_fit(policy, monkeypatch)  # warm-up: the optimizer's first step does its own one-off work
    with monkeypatch.context() as m:
        _upstream_paths(m)
        upstream, upstream_counts = _counted_fit(policy, monkeypatch)
    ours, our_counts = _counted_fit(policy, monkeypatch)

    assert sorted(ours) == sorted(upstream) and len(ours) > 60
    assert {k: v for k, v in ours.items() if v != upstream[k]} == {}
    assert all(type(ours[k]) is type(upstream[k]) for k in ours)
    reduced = [k for k in ours if k not in ("actor_lr", "actor_grad_norm", "nonfinite_skipped",
                                            "nonfinite_consecutive")]
    k, micro_batches = len(reduced), 2
    assert upstream_counts["all_reduce"] - our_counts["all_reduce"] == micro_batches * (k + 2 - 1)
    assert upstream_counts["item"] - our_counts["item"] == micro_batches * (k + k + 2)
    assert our_counts["tolist"] - upstream_counts["tolist"] == micro_batches * 2  # the metrics; the reduced dict
    # the collated info: upstream moves a per-sample metric to the device one sample at a time (its collate leaves a
    # list of 0-dim tensors) and reads each back (torch.tensor of the list); ours stacks it on the host first
    per_sample = len([v for v in _gdpo_like_batch().info.values() if isinstance(v, torch.Tensor)])
    samples_per_micro_batch = 2
    assert per_sample > 25
    assert (upstream_counts["to_device_copies"] - our_counts["to_device_copies"]
            == micro_batches * per_sample * (samples_per_micro_batch - 1))


def test_the_nonfinite_guard_reads_nothing_back_per_micro_batch(monkeypatch):
    """On the meta device (no values: any read to the host raises) the guard counts a micro-batch's checks; the
    counts are read once, at the accumulation boundary, where the ranks agree on them. The same checks on CPU
    tensors count a NaN reward, a NaN advantage on an action token (not one off the mask) and a NaN loss."""
    from openrlhf_classmate.integration.training.nonfinite import NonfiniteGuard

    param = torch.nn.Parameter(torch.zeros(2))
    engine = SimpleNamespace(optimizer=torch.optim.SGD([param], lr=0.1))

    def micro_batch(device, nan_reward=False, nan_advantage=False, nan_off_mask=False):
        mask = torch.tensor([[False, True, True], [False, True, False]])
        advantages = torch.ones(2, 3)
        reward = torch.tensor([1.0, 0.0])
        if nan_reward:
            reward[1] = math.nan
        if nan_advantage:
            advantages[0, 2] = math.nan
        if nan_off_mask:
            advantages[1, 2] = math.nan
        return SimpleNamespace(rewards=reward.to(device), info={"reward": reward.tolist()},
                               action_mask=mask.to(device), advantages=advantages.to(device),
                               classmate_advantages=advantages.to(device))

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "meta")
    guard = NonfiniteGuard(engine, max_consecutive=3)
    for _ in range(3):
        guard.check_experience(micro_batch("meta"))
        guard.check_loss(torch.zeros((), device="meta"))
    assert guard.window.device.type == "meta"

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    guard = NonfiniteGuard(engine, max_consecutive=3)
    guard.check_experience(micro_batch("cpu", nan_reward=True))
    guard.check_experience(micro_batch("cpu", nan_advantage=True))
    guard.check_experience(micro_batch("cpu", nan_off_mask=True))
    guard.check_experience(micro_batch("cpu", nan_reward=True, nan_advantage=True))
    guard.check_loss(torch.tensor(math.nan))
    guard.check_loss(torch.tensor(1.0))
    assert guard.window.tolist() == [2.0, 2.0, 1.0]  # rewards, advantages, loss: micro-batches, not values

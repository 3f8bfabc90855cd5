"""Sample packing and dynamic batching with a classmate, on upstream's real code: ``Actor`` with
``packing_samples`` on and off, upstream's replay buffer (collate, dynamic micro-batches) and loss normalisation.
The classmate tensors are ``step`` fields of ``ClassmateExperience``, so they follow the sequences through padding
removal, collation and re-partitioning exactly as ``advantages`` do; these tests check the resulting losses and
gradients."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from openrlhf.models.actor import Actor
from openrlhf.models.loss import PolicyLoss
from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
from openrlhf.utils.loss_utils import get_loss_batch_info, iter_grad_accum_global_norm

from openrlhf_classmate.algo.losses import SeparatedPolicyLoss, VanillaClassmatePolicyLoss
from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.experience.experience import ClassmateExperience
from openrlhf_classmate.integration.training.actor import ClassmateLossAdapter
from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = [str(i) for i in range(20)]
LENGTHS = [(5, 9), (3, 4), (7, 12), (4, 2), (6, 7), (2, 10)]  # (prompt, response) tokens per sample


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("packing") / "policy"), WORDS, hidden_size=32, seed=3)


def _items() -> list[ClassmateExperience]:
    patches.install_experience()
    gen = torch.Generator().manual_seed(0)
    items = []
    for prompt, response in LENGTHS:
        total = prompt + response
        seq = torch.randint(7, 27, (1, total), generator=gen)
        action = torch.zeros(1, total - 1, dtype=torch.bool)
        action[0, prompt - 1 :] = True
        cot = action.clone()
        cot[0, prompt - 1 + response // 2 :] = False  # the first half of the response is the CoT
        old = -torch.rand(1, total - 1, generator=gen) * 3 * action
        items.append(ClassmateExperience(
            sequences=seq, attention_mask=torch.ones(1, total, dtype=torch.long), action_mask=action,
            action_log_probs=old, rollout_log_probs=old + 0.05 * torch.randn(old.shape, generator=gen) * action,
            advantages=torch.randn(1, 1, generator=gen) * action,
            classmate_advantages=torch.randn(1, 1, generator=gen) * cot, cot_mask=cot,
            classmate_log_probs=torch.where(cot, old - 0.3 * torch.rand(old.shape, generator=gen), float("-inf")),
            response_length=torch.tensor([float(response)]), total_length=torch.tensor([float(total)]), info={},
        ))
    return items


@pytest.fixture(autouse=True)
def cpu_device(monkeypatch):
    # upstream's replay buffer places tensors on torch.cuda.current_device(): the CPU here (as patches does in Ray)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


def _buffer(batch_size: int, *, packing: bool, dynamic: bool = False) -> NaiveReplayBuffer:
    with patches._cuda_device_index(0):  # its __init__ builds torch.device(f"cuda:{index}")
        buffer = NaiveReplayBuffer(batch_size, cpu_offload=False, packing_samples=packing, dynamic_batch=dynamic)
    buffer.target_device = torch.device("cpu")
    return buffer


def _rollout_batch() -> ClassmateExperience:
    """The samples as the controller sends them to the actor: one right-padded micro-batch."""
    return ClassmateExperience.concat_experiences(_items(), 0)


def _collated(*, packing: bool) -> ClassmateExperience:
    """The actor side: the replay buffer splits and unpads the micro-batch, the dataloader collates it back."""
    buffer = _buffer(len(LENGTHS), packing=packing)
    buffer.append(_rollout_batch())
    return buffer.collate_fn(buffer.items)


def _loss(name: str):
    """(loss, experience fields, zero classmate advantage), as ``actor.build_classmate_loss`` builds them."""
    if name == "separated":
        return SeparatedPolicyLoss(0.2, 0.28, classmate_clip_eps_low=0.4, classmate_clip_eps_high=0.4), (
            "classmate_advantages",), False
    if name == "separated_is":
        return SeparatedPolicyLoss(is_correction_level="token", is_correction_threshold=(0.5, 1.5)), (
            "classmate_advantages",), False
    if name == "vanilla":
        return VanillaClassmatePolicyLoss(loss_agg_mode="token-mean"), (
            "classmate_advantages", "classmate_log_probs", "cot_mask"), False
    if name == "vanilla_seq_mean":
        return VanillaClassmatePolicyLoss(loss_agg_mode="seq-mean-token-mean"), (
            "classmate_advantages", "classmate_log_probs", "cot_mask"), False
    if name == "sum_norm_single":  # a single-advantage estimator with the reference aggregation
        return SeparatedPolicyLoss(loss_agg_mode="seq-mean-token-sum-norm", ref_micro_batch_size=2), (), True
    raise ValueError(name)


LOSSES = ["separated", "separated_is", "vanilla", "vanilla_seq_mean", "sum_norm_single"]


def _step(actor, loss_fn, fields, zero, experience, loss_batch_info):
    """One micro-batch as ``ActorPPOTrainer.training_step`` runs it: actor forward, the loss adapter, backward."""
    trainer = SimpleNamespace(current_experience=experience)
    adapter = ClassmateLossAdapter(loss_fn, fields, trainer, zero)
    log_probs = actor(experience.sequences, experience.action_mask, attention_mask=experience.attention_mask)
    out = adapter(log_probs, experience.action_log_probs, experience.advantages, action_mask=experience.action_mask,
                  rollout_log_probs=experience.rollout_log_probs, **loss_batch_info)
    return out[0]


def _actor(model_dir: str, *, packing: bool) -> Actor:
    """Upstream's Actor as the policy actor builds it (sdpa: flash-attn does not exist on CPU), in fp32 so that
    the comparisons are exact to float tolerance."""
    actor = Actor(model_dir, attn_implementation="sdpa", param_dtype="bf16", packing_samples=packing)
    actor.model.float()
    return actor


def _grads(actor) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in actor.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", LOSSES)
def test_packed_and_unpacked_micro_batches_give_the_same_loss_and_gradients(model_dir, name):
    loss_fn, fields, zero = _loss(name)
    results = {}
    for packing in (False, True):
        actor = _actor(model_dir, packing=packing)
        batch = _collated(packing=packing)
        info = {"dp_size": 1, "batch_num_tokens": batch.action_mask.sum().float(),
                "global_batch_size": torch.tensor(float(len(LENGTHS)))}
        loss = _step(actor, loss_fn, fields, zero, batch, info)
        loss.backward()
        results[packing] = (loss.detach(), _grads(actor), batch)
    (loss_a, grads_a, batch), (loss_b, grads_b, _) = results[False], results[True]
    assert batch.classmate_advantages.shape == batch.action_mask.shape  # the classmate tensors were collated
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for key in grads_a:
        torch.testing.assert_close(grads_a[key], grads_b[key], rtol=1e-5, atol=1e-7, msg=key)


def test_packing_really_packs_and_would_mix_sequences_without_position_ids(model_dir):
    """The equality above is not vacuous: the packed forward runs on one (1, total) row."""
    actor = _actor(model_dir, packing=True)
    seen = []
    hook = actor.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(args[0].shape),
                                                 with_kwargs=True)
    batch = _collated(packing=True)
    actor(batch.sequences, batch.action_mask, attention_mask=batch.attention_mask)
    hook.remove()
    assert seen == [torch.Size([1, int(batch.attention_mask.sum())])]


@pytest.fixture()
def one_rank(monkeypatch):
    """A real single-rank gloo process group and the bits of DeepSpeed's strategy the replay buffer reads."""
    store = dist.FileStore(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pg_{os.getpid()}_{id(monkeypatch)}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)

    def all_reduce(x, op="mean"):
        return x

    args = SimpleNamespace(train=SimpleNamespace(batch_size=6, max_tokens_per_gpu=24),
                           rollout=SimpleNamespace(batch_size=3, n_samples_per_prompt=2),
                           ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1))
    yield SimpleNamespace(args=args, ds_device_mesh={"dp": SimpleNamespace(get_group=lambda: dist.group.WORLD)},
                          all_reduce=all_reduce)
    dist.destroy_process_group()


@pytest.mark.parametrize("name", LOSSES[:4])
def test_dynamic_micro_batches_give_the_fixed_micro_batch_objective(model_dir, one_rank, name):
    loss_fn, fields, zero = _loss(name)
    strategy = one_rank
    totals = {}
    for dynamic in (False, True):
        actor = _actor(model_dir, packing=dynamic)
        buffer = _buffer(2, packing=dynamic, dynamic=dynamic)
        buffer.append(_rollout_batch())  # upstream's split + padding removal
        losses = []
        if dynamic:
            buffer.setup_dynamic_batch(strategy)
            assert len(buffer) >= 2 and any(len(ix) != 2 for ix in buffer.dynamic_indices)  # a real re-partition
            for step in range(len(buffer)):
                experience = buffer.collate_fn([buffer[step]])
                info = get_loss_batch_info(strategy, experience.action_mask, replay_buffer=buffer, step=step,
                                           dynamic_batch=True)
                losses.append(_step(actor, loss_fn, fields, zero, experience, info))  # DeepSpeed scale 1 (gas 1)
        else:
            gas = 3  # train batch 6 / micro-batch 2
            batches = [buffer.collate_fn([buffer[i], buffer[i + 1]]) for i in range(0, 6, 2)]
            for experience, info in iter_grad_accum_global_norm(batches, strategy, gas, lambda e: e.action_mask):
                losses.append(_step(actor, loss_fn, fields, zero, experience, info) / gas)  # DeepSpeed's 1 / gas
        total = torch.stack(losses).sum()
        total.backward()
        totals[dynamic] = (total.detach(), _grads(actor))
    (fixed, fixed_grads), (dyn, dyn_grads) = totals[False], totals[True]
    torch.testing.assert_close(fixed, dyn, rtol=0, atol=1e-6)
    for key in fixed_grads:
        torch.testing.assert_close(fixed_grads[key], dyn_grads[key], rtol=1e-5, atol=1e-7, msg=key)


def test_our_losses_use_the_dynamic_normalisation_exactly_as_upstreams(model_dir, one_rank):
    """With a zero classmate advantage the separated loss is upstream's PolicyLoss on every dynamic micro-batch."""
    strategy = one_rank
    buffer = _buffer(2, packing=True, dynamic=True)
    buffer.append(_rollout_batch())
    buffer.setup_dynamic_batch(strategy)
    ours, theirs = SeparatedPolicyLoss(0.2, 0.28), PolicyLoss(0.2, 0.28)
    for step in range(len(buffer)):
        e = buffer.collate_fn([buffer[step]])
        info = get_loss_batch_info(strategy, e.action_mask, replay_buffer=buffer, step=step, dynamic_batch=True)
        lp = e.action_log_probs + 0.1
        a = ours(lp, e.action_log_probs, e.advantages, e.action_mask, None, **info,
                 classmate_advantages=torch.zeros_like(e.advantages))[0]
        b = theirs(lp, e.action_log_probs, e.advantages, e.action_mask, None, **info)[0]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)

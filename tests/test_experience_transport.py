"""The classmate per-token tensors survive every place upstream concatenates, splits, unpads, balances or collates
experiences (upstream's functions use the module-global ``Experience``
and its ``fields``) — and are silently dropped without the rebinding."""

from types import SimpleNamespace

import torch

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.experience.experience import ClassmateExperience


def _sample(prompt_len: int, response_len: int, seed: int) -> ClassmateExperience:
    g = torch.Generator().manual_seed(seed)
    total = prompt_len + response_len
    action_mask = torch.zeros(total - 1, dtype=torch.bool)
    action_mask[prompt_len - 1 :] = True
    cot = torch.zeros(total - 1, dtype=torch.bool)
    cot[prompt_len : prompt_len + response_len // 2] = True
    return ClassmateExperience(
        sequences=torch.randint(3, 50, (1, total), generator=g),
        attention_mask=torch.ones(1, total, dtype=torch.long),
        action_mask=action_mask.unsqueeze(0),
        action_log_probs=torch.randn(1, total - 1, generator=g),
        advantages=torch.randn(1, total - 1, generator=g),
        classmate_advantages=torch.randn(1, total - 1, generator=g) * cot,
        cot_mask=cot.unsqueeze(0),
        classmate_log_probs=torch.where(cot, torch.randn(1, total - 1, generator=g), torch.tensor(float("-inf"))),
        rewards=torch.tensor([float(seed)]),
        response_length=torch.tensor([float(response_len)]),
        total_length=torch.tensor([float(total)]),
        prompts=[f"p{seed}"],
        labels=[f"l{seed}"],
        index=[seed],
        info={"reward": torch.tensor([float(seed)])},
    )


FIELDS = ("classmate_advantages", "cot_mask", "classmate_log_probs")


def _valid(sample: ClassmateExperience, name: str) -> torch.Tensor:
    # compare the unpadded part: (action length of the sample) entries
    return getattr(sample, name)[0, : sample.action_mask.shape[1]]


def test_fields_survive_concat_split_unpad_collate_balance_and_the_replay_buffer():
    patches.install_experience()
    patches.install_cpu_runtime()
    from openrlhf.trainer.ppo_utils import experience as exp_module
    from openrlhf.trainer.ray import ppo_actor

    samples = [_sample(4, 6, 0), _sample(3, 3, 1), _sample(5, 9, 2), _sample(2, 4, 3)]
    batch = ClassmateExperience.concat_experiences(samples, pad_token_id=0)
    assert isinstance(batch, ClassmateExperience)
    assert batch.classmate_advantages.shape == batch.action_mask.shape == (4, 13)

    items = exp_module.remove_padding_in_sequences(exp_module.split_experience_batch(batch))
    assert all(isinstance(i, ClassmateExperience) for i in items)
    for original, item in zip(samples, items):
        for name in FIELDS:
            assert torch.equal(getattr(item, name), getattr(original, name)[0]), name

    collated = exp_module.make_experience_batch(items)
    for name in FIELDS:
        assert getattr(collated, name).shape == collated.action_mask.shape

    args = SimpleNamespace(actor=SimpleNamespace(num_nodes=1, num_gpus_per_node=2),
                           ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1))
    balanced = exp_module.balance_experiences([batch], args)
    seen = {}
    for part in balanced:
        for row, reward in enumerate(part.rewards.tolist()):  # split drops `index`; rewards identify the samples
            seen[int(reward)] = {name: getattr(part, name)[row] for name in FIELDS}
    assert sorted(seen) == [0, 1, 2, 3]
    for original in samples:
        width = original.action_mask.shape[1]
        for name in FIELDS:
            assert torch.equal(seen[int(original.rewards)][name][:width], getattr(original, name)[0]), name

    buffer = ppo_actor.NaiveReplayBuffer(2, limit=0, cpu_offload=True)
    buffer.append(batch)
    micro = buffer.collate_fn([buffer[0], buffer[1]])
    assert torch.equal(micro.classmate_advantages[0, :9], samples[0].classmate_advantages[0])
    assert torch.equal(micro.cot_mask[1, :5], samples[1].cot_mask[0])


def test_without_the_rebinding_upstream_drops_the_fields(monkeypatch):
    from openrlhf.trainer.ppo_utils import experience as exp_module

    Experience = ClassmateExperience.__mro__[1]  # upstream's class (the module global may already be rebound)
    monkeypatch.setattr(exp_module, "Experience", Experience)
    batch = ClassmateExperience.concat_experiences([_sample(4, 6, 0), _sample(3, 3, 1)], pad_token_id=0)
    items = exp_module.split_experience_batch(batch)
    assert type(items[0]) is Experience and not hasattr(items[0], "classmate_advantages")

"""Our policy actor with a real DeepSpeed engine in this process (one rank, gloo, DeepSpeed's CPU accelerator): the
launcher's ``ClassmatePolicyModelActor.init_model_from_pretrained`` (upstream's Actor, strategy, DeepSpeed engine
and optimizer, our ``ClassmateActorPPOTrainer``), without Ray. Tests feed it experiences and call ``fit`` as the
controller does.

:func:`single_rank_world` applies the CPU runtime patches of ``patches.install_cpu_runtime`` through a
``MonkeyPatch`` (undone on exit) and owns the process group; :func:`policy_actor` builds an actor in it.
"""

from __future__ import annotations

import contextlib

import torch

import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf)


@contextlib.contextmanager
def cpu_runtime(mp):
    """``patches.install_cpu_runtime`` itself, undone when ``mp`` (a pytest ``MonkeyPatch``) is: every name it
    rebinds is recorded in ``mp`` first."""
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import openrlhf.utils.deepspeed.deepspeed as ds_module

    from openrlhf_classmate.integration import patches

    mp.setenv("DS_ACCELERATOR", "cpu")
    for name in ("current_device", "synchronize", "set_device", "empty_cache"):
        mp.setattr(torch.cuda, name, getattr(torch.cuda, name))
    mp.setattr(ds_module, "init_device_mesh", ds_module.init_device_mesh)
    for module in (ppo_actor, __import__("openrlhf.trainer.ray.launcher", fromlist=["Actor"])):
        mp.setattr(module, "Actor", module.Actor)  # install_worker_actor rebinds it
    mp.setattr(ppo_actor, "NaiveReplayBuffer", ppo_actor.NaiveReplayBuffer)
    mp.setattr(ppo_actor, "ActorPPOTrainer", ppo_actor.ActorPPOTrainer)  # install_actor_trainer rebinds it
    patches.install_cpu_runtime()
    yield


def reset_deepspeed_state() -> None:
    """Destroy this process's group and drop what DeepSpeed caches about it (its ``groups`` module keeps the world
    group, ``deepspeed.comm`` its backend): a DeepSpeed engine built after another one in the same process would
    otherwise broadcast over the destroyed group (``ValueError: Group ... is not registered``)."""
    import deepspeed.comm.comm as ds_comm
    import deepspeed.utils.groups as ds_groups
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    for name in [n for n in vars(ds_groups) if n.endswith("_GROUP") and n.startswith("_")]:
        setattr(ds_groups, name, None)
    ds_comm.cdb = None


@contextlib.contextmanager
def single_rank_world():
    """A one-rank gloo process group with the CPU runtime patches, for any number of :func:`policy_actor` s. DeepSpeed's
    cached groups are dropped on entry (an earlier test in this process may have left them) and on exit."""
    import deepspeed
    import pytest

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.ports import free_port

    with pytest.MonkeyPatch.context() as mp, cpu_runtime(mp):
        patches.install_experience()
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                           ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
            mp.setenv(key, value)
        reset_deepspeed_state()
        deepspeed.init_distributed(dist_backend="gloo")
        try:
            yield
        finally:
            reset_deepspeed_state()


def policy_actor(model_dir: str, extra: list[str] | None = None):
    """Our policy actor for ``model_dir`` inside :func:`single_rank_world`: train batch 4 in micro-batches of 2 (one
    update per ``fit`` of four samples), bf16, ZeRO-2 unless ``extra`` says otherwise."""
    import os

    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.training.actor import ClassmatePolicyModelActor
    from openrlhf_classmate.integration.training.strategy import get_strategy

    args = parse_args([
        "--actor.model_name_or_path", model_dir, "--actor.num_gpus_per_node", "1",
        "--data.prompt_dataset", "unused.jsonl", "--vllm.num_engines", "0", "--vllm.sync_backend", "gloo",
        "--engine.backend", "hf", "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
        "--train.batch_size", "4", "--train.micro_batch_size", "2", "--rollout.micro_batch_size", "2",
        "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.adam.lr", "1e-2", "--actor.lr_warmup_ratio", "0", "--algo.advantage.estimator", "group_norm",
        *(extra or []),
    ])
    actor = ClassmatePolicyModelActor(1, 0, "127.0.0.1", int(os.environ["MASTER_PORT"]))
    actor.init_model_from_pretrained(get_strategy(args), model_dir, max_steps=100)
    return actor


def experience_batch(n: int = 4, vocab: tuple[int, int] = (7, 27), seed: int = 0):
    """``n`` samples of (prompt 4, response 6) random tokens as one right-padded micro-batch, rewards in
    ``info["reward"]``, one advantage per sequence on its action tokens, old log-probs near the model's."""
    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    gen = torch.Generator().manual_seed(seed)
    total, prompt = 10, 4
    seq = torch.randint(*vocab, (n, total), generator=gen)
    action = torch.zeros(n, total - 1, dtype=torch.bool)
    action[:, prompt - 1:] = True
    reward = torch.tensor([1.0, 0.0] * (n // 2))
    adv = ((reward - reward.mean()) / reward.std()).unsqueeze(1) * action
    return ClassmateExperience(
        sequences=seq, attention_mask=torch.ones(n, total, dtype=torch.long), action_mask=action,
        action_log_probs=-3.0 * action.float(), advantages=adv, rewards=reward.clone(),
        response_length=torch.full((n,), float(total - prompt)), total_length=torch.full((n,), float(total)),
        info={"reward": reward.clone()},
    )

"""Fails loudly when the upstream OpenRLHF names, signatures or sources our rebindings rely on change."""

import inspect

import pytest

from openrlhf_classmate.integration import patches


def test_installed_openrlhf_is_the_pinned_release_with_the_checked_sources():
    patches.check_upstream()


def test_check_upstream_names_the_changed_file(monkeypatch):
    changed = dict(patches.UPSTREAM_SHA256, **{"models/loss.py": "0" * 64})
    monkeypatch.setattr(patches, "UPSTREAM_SHA256", changed)
    with pytest.raises(patches.UpstreamChangedError, match="models/loss.py"):
        patches.check_upstream()


def _params(fn) -> list[str]:
    # Ray adds a tracing parameter to actor methods; it is not part of the API
    return [p for p in inspect.signature(fn).parameters if p != "_ray_trace_ctx"]


def test_policy_loss_forward_signature_and_five_tuple():
    import torch
    from openrlhf.models.loss import PolicyLoss

    assert _params(PolicyLoss.forward) == [
        "self", "log_probs", "old_log_probs", "advantages", "action_mask", "rollout_log_probs", "dp_size",
        "batch_num_tokens", "global_batch_size",
    ]
    x = torch.zeros(2, 3)
    out = PolicyLoss()(x, x, torch.ones(2, 3), action_mask=torch.ones(2, 3))
    assert isinstance(out, tuple) and len(out) == 5


def test_train_and_trainer_signatures():
    from openrlhf.cli.train_ppo_ray import train
    from openrlhf.trainer.ppo_trainer import PPOTrainer
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    assert _params(train) == ["args"]
    assert _params(PPOTrainer.__ray_actor_class__.__init__)[:8] == [
        "self", "pretrain", "strategy", "actor_model_group", "critic_model_group", "reward_model_group",
        "reference_model_group", "vllm_engines",
    ]
    assert _params(ActorPPOTrainer.training_step) == ["self", "experience", "kl_ctl", "step", "loss_batch_info"]
    assert _params(PolicyModelActor.__ray_actor_class__.init_model_from_pretrained) == [
        "self", "strategy", "pretrain", "max_steps", "vllm_engines"
    ]
    assert _params(create_vllm_engines) == [
        "num_engines", "tensor_parallel_size", "pretrain", "seed", "full_determinism", "enable_prefix_caching",
        "enforce_eager", "max_model_len", "shared_pg", "gpu_memory_utilization", "vllm_enable_sleep",
        "logprobs_mode", "agent_func_path", "remote_rm_url", "max_images_per_prompt",
    ]


def test_hf_engine_factory_mirrors_create_vllm_engines():
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    from openrlhf_classmate.integration.rollout.hf_engine import create_hf_engines

    assert _params(create_hf_engines)[: len(_params(create_vllm_engines))] == _params(create_vllm_engines)


def test_hf_engine_offers_the_rollout_actor_methods_we_and_upstream_call():
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    from openrlhf_classmate.integration.rollout.hf_engine import HFEngine

    upstream = RolloutRayActor.__ray_actor_class__
    for name in ("generate", "generate_responses", "get_num_unfinished_requests", "sleep", "wake_up",
                 "reset_prefix_cache", "init_process_group", "update_weight"):
        assert hasattr(upstream, name) and hasattr(HFEngine, name), name
    assert _params(HFEngine.generate_responses) == _params(upstream.generate_responses)


def test_rebinding_targets_exist_and_experience_is_rebound_everywhere():
    import importlib

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    patches.install_experience()
    for name in patches.EXPERIENCE_MODULES:
        assert importlib.import_module(name).Experience is ClassmateExperience, name
    import openrlhf.cli.train_ppo_ray as cli
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    for module, name in ((cli, "create_vllm_engines"), (cli, "PolicyModelActor"), (cli, "placement_group"),
                         (ppo_trainer, "PPOTrainer"), (ppo_actor, "ActorPPOTrainer"),
                         (ppo_actor, "NaiveReplayBuffer")):
        assert hasattr(module, name), f"{module.__name__}.{name}"


def test_both_controllers_build_our_samples_generator(monkeypatch):
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async

    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator

    for module in (ppo_trainer, ppo_trainer_async):
        monkeypatch.setattr(module, "SamplesGenerator", module.SamplesGenerator)  # restored after the test
    patches.install_samples_generator()
    assert ppo_trainer.SamplesGenerator is ppo_trainer_async.SamplesGenerator is ClassmateSamplesGenerator


def test_upstream_cli_main_block_is_still_reusable():
    from openrlhf_classmate.integration.launch.args import _upstream_main_block

    build, post, _ = _upstream_main_block()
    assert len(build) > 100 and len(post) > 10


def test_the_calls_the_start_up_and_the_tokenizer_handle_rely_on():
    # patches.engine_sleep_deferred replaces the one call that makes create_vllm_engines wait for its engines;
    # ClassmateSamplesGenerator swaps self.tokenizer around upstream's dispatch, which passes it in every call
    import inspect

    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray import vllm_engine

    create = inspect.getsource(vllm_engine.create_vllm_engines)
    assert 'batch_vllm_engine_call(vllm_engines, "sleep")' in create and create.count("batch_vllm_engine_call") == 1
    dispatch = inspect.getsource(SamplesGenerator._dispatch_prompts_to_vllm)
    assert "hf_tokenizer=self.tokenizer" in dispatch and dispatch.count("self.tokenizer") == 1

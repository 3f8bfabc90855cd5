"""``ClassmatePPOTrainer``: upstream's single controller with the classmate experience maker.

``PPOTrainer`` is a Ray ``ActorClass``; subclassing it directly raises ``ActorClassInheritanceException``, so we
subclass the plain class behind it (``__ray_actor_class__``) and wrap the result with ``ray.remote`` again.
"""

from __future__ import annotations

import ray
import torch
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_classmate.integration.experience_maker import ClassmateExperienceMaker

logger = init_logger(__name__)


class TrainingStopped(RuntimeError):
    """The run cannot go on; the launcher prints the message as its one ``error:`` line."""


def judge_config_from_args(args):
    cfg = args.classmate
    if not cfg.judge_base_url:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model or "", api_key_env=cfg.judge_api_key_env)


class ClassmatePPOTrainer(PPOTrainer.__ray_actor_class__):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, classmate_engines=None, classmate_colocated=False,
                 **generate_kwargs):
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        args = strategy.args
        self.classmate_engines = classmate_engines or []  # [K][engines]; never part of self.vllm_engines
        stage = None
        if self.classmate_engines:
            from transformers import AutoTokenizer

            from openrlhf_classmate.integration.classmate_scoring import build_classmate_scorer
            from openrlhf_classmate.integration.classmate_stage import ClassmateStage

            tokenizers = [AutoTokenizer.from_pretrained(p, trust_remote_code=True)
                          for p in args.classmate.model_name_or_path]
            scorer = build_classmate_scorer(args, judge_config_from_args(args))
            stage = ClassmateStage(args, self.tokenizer, self.classmate_engines, tokenizers, scorer=scorer)
        self.experience_maker = ClassmateExperienceMaker(
            self.actor_model_group,
            self.critic_model_group,
            self.reward_model_group,
            self.reference_model_group,
            self.kl_ctl,
            self.strategy,
            self.tokenizer,
            classmate_stage=stage,
            classmate_engines=[e for group in self.classmate_engines for e in group],
            colocated=classmate_colocated,
        )

    def train_step(self, rollout_samples, global_step: int):
        """Upstream's step, except that a batch with no valid main score is skipped (one warning line), and a run
        whose every step so far had none stops after ``--classmate.stop_after_invalid_steps`` of them."""
        from openrlhf_classmate.integration.experience_maker import AllScoresInvalidError

        try:
            status, next_step = super().train_step(rollout_samples, global_step)
        except AllScoresInvalidError as e:
            self.invalid_steps = getattr(self, "invalid_steps", 0) + 1
            limit = self.args.classmate.stop_after_invalid_steps
            if not getattr(self, "valid_steps", 0) and limit and self.invalid_steps >= limit:
                raise TrainingStopped(
                    f"error: {e} in each of the first {self.invalid_steps} steps: no score has been valid yet "
                    "(judge or verifier down or misconfigured? see the reward function's log lines); "
                    "stopping (--classmate.stop_after_invalid_steps)") from None
            logger.warning(f"step {global_step + 1} skipped: {e} (nothing trained, weights unchanged)")
            return {"skipped_invalid_step": 1.0}, global_step + 1
        self.valid_steps = getattr(self, "valid_steps", 0) + 1
        status["skipped_invalid_step"] = 0.0
        return status, next_step

    def _compute_rollout_stats(self, experiences):
        stats = super()._compute_rollout_stats(experiences)
        if all("main_valid" in exp.info for exp in experiences):
            # the maker logs invalid rows at the valid mean; the spread must come from the valid rows alone
            valid = torch.cat([exp.info["main_valid"] for exp in experiences]).bool()
            rewards = torch.cat([exp.info["reward"] for exp in experiences]).float()[valid]
            stats["rollout/reward_std"] = rewards.std().item() if len(rewards) > 1 else 0.0
            stats["rollout/main_valid_fraction"] = valid.float().mean().item()
        return stats

    def broadcast_to_vllm(self) -> None:
        if self.args.engine.backend != "hf":
            return super().broadcast_to_vllm()
        # HF engines: rank 0's weights travel through the Ray object store (all ranks join the ZeRO-3 gather).
        refs = self.actor_model_group.async_run_method(method_name="hf_engine_state_dict")
        ray.wait(refs, num_returns=len(refs))
        ray.get([engine.load_weights.remote(refs[0]) for engine in self.vllm_engines])

    def engine_weight_updates(self) -> dict[str, list[int]]:
        """How many weight updates each engine received (policy engines vs classmate engines)."""
        return {
            "policy": ray.get([e.get_num_weight_updates.remote() for e in self.vllm_engines or []]),
            "classmate": ray.get([e.get_num_weight_updates.remote() for g in self.classmate_engines for e in g]),
        }

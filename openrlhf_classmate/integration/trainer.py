"""``ClassmatePPOTrainer``: upstream's single controller with the classmate experience maker.

``PPOTrainer`` is a Ray ``ActorClass``; subclassing it directly raises ``ActorClassInheritanceException``, so we
subclass the plain class behind it (``__ray_actor_class__``) and wrap the result with ``ray.remote`` again.
"""

from __future__ import annotations

import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer

from openrlhf_classmate.integration.experience_maker import ClassmateExperienceMaker


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

            from openrlhf_classmate.integration.classmate_stage import ClassmateStage
            from openrlhf_classmate.scoring import score_responses

            tokenizers = [AutoTokenizer.from_pretrained(p, trust_remote_code=True)
                          for p in args.classmate.model_name_or_path]
            judge = judge_config_from_args(args)
            stage = ClassmateStage(args, self.tokenizer, self.classmate_engines, tokenizers,
                                   scorer=lambda texts, labels: score_responses(texts, labels, judge=judge))
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

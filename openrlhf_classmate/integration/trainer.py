"""``ClassmatePPOTrainer``: upstream's single controller with the classmate experience maker.

``PPOTrainer`` is a Ray ``ActorClass``; subclassing it directly raises ``ActorClassInheritanceException``, so we
subclass the plain class behind it (``__ray_actor_class__``) and wrap the result with ``ray.remote`` again.
"""

from __future__ import annotations

import ray
from openrlhf.trainer.ppo_trainer import PPOTrainer
from openrlhf.utils.logging_utils import init_logger

from openrlhf_classmate.integration.experience_maker import ClassmateExperienceMaker

logger = init_logger(__name__)


def judge_config_from_args(args):
    """The judge of both reward streams (``--classmate.judge_*``), or None without ``--classmate.judge_base_url``."""
    cfg = args.classmate
    if not cfg.judge_base_url:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model or "", api_key_env=cfg.judge_api_key_env,
                       timeout_s=cfg.judge_timeout_s, max_retries=cfg.judge_max_retries,
                       max_concurrency=cfg.judge_max_concurrency)


class ClassmatePPOTrainer(PPOTrainer.__ray_actor_class__):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, classmate_engines=None, classmate_colocated=False,
                 **generate_kwargs):
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        args = strategy.args
        self.classmate_engines = classmate_engines or []  # [K][engines]; never part of self.vllm_engines
        stage = None
        self.judge_client = None  # scores the classmate answers; its replies feed the step's judge metrics
        if self.classmate_engines:
            from transformers import AutoTokenizer

            from openrlhf_classmate.integration.classmate_stage import ClassmateStage
            from openrlhf_classmate.scoring import JudgeClient, score_responses

            tokenizers = [AutoTokenizer.from_pretrained(p, trust_remote_code=True)
                          for p in args.classmate.model_name_or_path]
            judge = judge_config_from_args(args)
            self.judge_client = JudgeClient(judge) if judge is not None else None
            stage = ClassmateStage(args, self.tokenizer, self.classmate_engines, tokenizers,
                                   scorer=lambda texts, labels: score_responses(texts, labels, judge=self.judge_client))
        self.classmate_stage = stage
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
        """Upstream's step, plus the step's judge health (``judge/*`` and the valid fractions; a warning line when a
        judge request or a score failed)."""
        from openrlhf_classmate.integration.step_health import main_tally, require_judge, step_report

        require_judge(rollout_samples, self.args, judge_config_from_args(self.args))
        main = main_tally(rollout_samples)  # also removes the per-sample judge numbers from the logged info
        status, next_step = super().train_step(rollout_samples, global_step)
        metrics, warning = step_report(main, self.classmate_stage, self.judge_client)
        status.update(metrics)
        if warning:
            logger.warning(f"step {next_step}: {warning}")
        return status, next_step

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

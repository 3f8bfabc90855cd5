"""Our controllers: upstream's sync ``PPOTrainer`` and async ``PPOTrainerAsync`` with the classmate experience maker.

Upstream's trainers are Ray ``ActorClass``es; subclassing one directly raises ``ActorClassInheritanceException``, so
we subclass the plain class behind it (``__ray_actor_class__``) and wrap the result with ``ray.remote`` again.

* sync: ``ClassmatePPOTrainer`` = upstream's ``PPOTrainer`` + :class:`ClassmateControllerMixin`; the classmate stage
  runs inside ``make_experience_batch`` (dispatched before the actor/ref forwards, gathered after them).
* async (``--train.async_enable``): upstream's ``PPOTrainerAsync`` runs a ``GenerateSamplesActor`` (rollouts) and a
  ``TrainingActor`` (experience making, update, weight sync) that overlap through a queue. Ours dispatch each
  batch's classmate requests in the generator, right after its rollout, so the classmate generation overlaps the
  next rollout and the current update; the training actor gathers and scores them when it makes that batch's
  experiences (a batch without its classmate requests is an error, never trained on). The off-policy bookkeeping
  is upstream's: the actor re-computes the old log-probs of both streams' tokens on the current weights, and the
  rollout importance weights (``--algo.advantage.is_correction_*``) multiply both loss terms.
"""

from __future__ import annotations

import time

import ray
import torch
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ppo_trainer_async import GenerateSamplesActor, PPOTrainerAsync, TrainingActor
from openrlhf.utils.logging_utils import init_logger

from openrlhf_classmate.errors import TrainingStopped  # raised here, caught by the launcher
from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateRollout
from openrlhf_classmate.integration.classmate_config import dispatch_per_group, judge_config_from_args
from openrlhf_classmate.integration.experience.experience_maker import ClassmateExperienceMaker
from openrlhf_classmate.integration.launch.startup import breakdown as startup_breakdown
from openrlhf_classmate.integration.launch.startup import summary_line as startup_line
from openrlhf_classmate.integration.rollout import mismatch
from openrlhf_classmate.integration.rollout.main_scores import no_valid_score_yet

logger = init_logger(__name__)


def install_rollout_request(args) -> None:
    """In this process, make upstream's rollout requests carry the sampled tokens' log-probs (no-op when off;
    :mod:`~openrlhf_classmate.integration.rollout.mismatch` says what the requests ask for and why)."""
    if mismatch.enabled(args):
        patches.install_rollout_sampling_params(mismatch.rollout_sampling_params(args))


def classmate_tokenizers(args) -> list:
    from transformers import AutoTokenizer

    return [AutoTokenizer.from_pretrained(p, trust_remote_code=True) for p in args.classmate.model_name_or_path]


class ClassmateControllerMixin(BasePPOTrainer):
    """What our controllers add to upstream's: the classmate experience maker, skipped all-invalid steps, valid-only
    reward statistics, the weight sync of the HF engine, and the start-up breakdown at step 1."""

    _startup: dict | None = None  # until step 1 ends: the driver's start-up phases (StartupClock.hand_over)
    _fit_started: float | None = None

    def _setup_classmate(self, classmate_engines, colocated: bool, startup: dict | None = None) -> None:
        args = self.strategy.args
        # the driver's start-up phases (StartupClock.hand_over); the models' load and step 1 are added here
        self._startup, self._fit_started = startup or {"seconds": {}, "handed_over": None}, None
        self.classmate_engines = classmate_engines or []  # [K][engines]; never part of self.vllm_engines
        stage = None
        self.judge_client = None  # scores the classmate answers; its replies feed the step's judge metrics
        if self.classmate_engines:
            from openrlhf_classmate.integration.classmate.classmate_scoring import build_classmate_scorer
            from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateStage
            from openrlhf_classmate.scoring import JudgeClient

            judge = judge_config_from_args(args)
            self.judge_client = JudgeClient(judge) if judge is not None else None
            scorer = build_classmate_scorer(args, self.judge_client)
            stage = ClassmateStage(args, self.tokenizer, self.classmate_engines, classmate_tokenizers(args),
                                   scorer=scorer)
        self.classmate_stage = stage
        install_rollout_request(args)  # the sync controller generates the rollouts
        from openrlhf_classmate.integration.experience.reward_methods import (
            build_reward_hooks,
            evaluate_with_validation_rewards,
        )

        if hasattr(self, "samples_generator"):  # sync; in async runs the rollout actor evaluates
            evaluate_with_validation_rewards(self.samples_generator)  # TinyV validates at weight 1
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
            colocated=colocated,
            reward_hooks=build_reward_hooks(args, self.tokenizer),
        )
        if stage is not None and hasattr(self, "samples_generator") and dispatch_per_group(args):
            # each prompt group's classmate requests leave as soon as the group is generated (--classmate.dispatch)
            self.samples_generator.classmate_dispatch = stage.dispatch
            self.samples_generator.dispatch_next_per_group = self.experience_maker.next_batch_dispatches_per_group

    def fit(self, *args, **kwargs):
        self._fit_started = time.time()  # upstream's train() calls fit once the actor/ref models are loaded
        starting = (self._startup or {}).get("engines_starting")
        if starting:  # the engines' first sleep, sent as they started beside the models' load (the launcher's
            import ray  # models_while_engines_start): an engine that failed to start raises here

            ray.get(starting)
        self._steps_started = time.time()
        return super().fit(*args, **kwargs)

    def train_step(self, rollout_samples, global_step: int):
        status, next_step = self._train_step(rollout_samples, global_step)
        if self._startup is not None:  # the first step that ends: where the time before it went, logged once
            now, seconds, handed_over = time.time(), self._startup["seconds"], self._startup["handed_over"]
            if self._fit_started is not None and handed_over is not None:
                seconds["models"] = self._fit_started - handed_over
                steps_started = getattr(self, "_steps_started", self._fit_started)
                if steps_started - self._fit_started > 0.05:
                    seconds["engines_ready"] = steps_started - self._fit_started
                seconds["step_1"] = now - steps_started
            metrics = startup_breakdown(seconds, now)
            logger.info(startup_line(metrics))
            status.update(metrics)
            self._startup = None
        return status, next_step

    def _train_step(self, rollout_samples, global_step: int):
        """Upstream's step, plus the step's judge health (``judge/*`` and the valid fractions; a warning line when a
        judge request or a score failed). A batch with no valid main score is skipped (one warning line), and a run
        whose every step so far had none stops after ``--classmate.stop_after_invalid_steps`` of them."""
        from openrlhf_classmate.integration.experience.experience_maker import AllScoresInvalidError
        from openrlhf_classmate.integration.experience.step_health import main_tally, require_judge

        require_judge(rollout_samples, self.args, judge_config_from_args(self.args))
        main = main_tally(rollout_samples)  # also removes the per-sample judge numbers from the logged info
        try:
            status, next_step = super().train_step(rollout_samples, global_step)
        except AllScoresInvalidError as e:
            health = self._judge_health(main, global_step + 1)
            self.invalid_steps = getattr(self, "invalid_steps", 0) + 1
            limit = self.args.classmate.stop_after_invalid_steps
            if not getattr(self, "valid_steps", 0) and limit and self.invalid_steps >= limit:
                raise TrainingStopped(no_valid_score_yet(f"{e} in each of the first {self.invalid_steps} steps",
                                                         reason_known=bool(e.reason))) from None
            logger.warning(f"step {global_step + 1} skipped: {e} (nothing trained, weights unchanged)")
            return {**health, "skipped_invalid_step": 1.0}, global_step + 1
        self.valid_steps = getattr(self, "valid_steps", 0) + 1
        self._stop_on_invalid_classmate_scores()
        self._stop_on_nonfinite_skips(status)
        status["skipped_invalid_step"] = 0.0
        status.update(self._judge_health(main, next_step))
        status.update(self._mismatch(next_step))
        # where the rollout's seconds went (samples_generator.rollout_parts; the sync controller generates itself)
        status.update(getattr(getattr(self, "samples_generator", None), "parts", None) or {})
        return status, next_step

    def _stop_on_invalid_classmate_scores(self) -> None:
        """The classmate stream's counterpart of the skipped all-invalid steps: a step whose classmate answers were
        all scored invalid trains on the main stream alone, and a run whose first ``--classmate.stop_after_invalid_
        steps`` steps with classmate answers were all such steps stops (a classmate run without a classmate signal
        is not what was asked for). Steps whose requests were all skipped scored nothing and do not count."""

        stage, limit = getattr(self, "classmate_stage", None), self.args.classmate.stop_after_invalid_steps
        results = stage.last_scores[0] if stage is not None else []
        if not results or getattr(self, "classmate_scored_valid", False):
            return
        if any(r.valid for r in results):
            self.classmate_scored_valid = True  # from now on an all-invalid step only warns
            return
        self.classmate_invalid_steps = getattr(self, "classmate_invalid_steps", 0) + 1
        if limit and self.classmate_invalid_steps >= limit:
            first = next((r.reason for r in results if r.reason), None)
            raise TrainingStopped(no_valid_score_yet(
                f"the classmate scores of each of the first {self.classmate_invalid_steps} steps with classmate "
                f"answers were all invalid ({len(results)} in the last" + (f"; first: {first})" if first else ")"),
                reason_known=bool(first)))

    def _stop_on_nonfinite_skips(self, status: dict) -> None:
        """The policy actors skip updates with non-finite values (``integration/training/nonfinite.py``) and report how many
        in a row; too many in a row stop the run (``--classmate.stop_after_nonfinite_skips``)."""
        consecutive = int(status.pop("nonfinite_consecutive", 0))
        limit = self.args.classmate.stop_after_nonfinite_skips
        if limit and consecutive >= limit:
            raise TrainingStopped(
                f"error: the last {consecutive} policy updates were all skipped for non-finite rewards, advantages, "
                "loss or gradient norm (see the actors' warning lines); stopping "
                "(--classmate.stop_after_nonfinite_skips)")

    def _mismatch(self, step: int) -> dict[str, float]:
        """The step's ``mismatch/*`` metrics; one warning line when they cross ``--engine.mismatch_warn_threshold``."""
        maker = getattr(self, "experience_maker", None)
        if maker is None:
            return {}
        measured, maker.last_mismatch = maker.last_mismatch, None
        # the rollout batches of this run so far, as the samples generator counts them (one per step; a resumed run
        # counts from its start)
        self._mismatch_steps = getattr(self, "_mismatch_steps", 0) + 1
        expected = mismatch.enabled(self.args) and mismatch.measured_step(self._mismatch_steps,
                                                                          self.args.engine.mismatch_interval)
        if measured is None and expected and not getattr(self, "_reported_no_mismatch", False):
            self._reported_no_mismatch = True
            logger.warning(f"step {step}: no mismatch/* metrics: the rollouts came without the engines' log-probs "
                           "(a --train.agent_func_path agent that returns no rollout_log_probs?)")
        metrics, warning = mismatch.step_report(measured, step, self.args.engine.mismatch_warn_threshold)
        if warning:
            logger.warning(warning)
        return metrics

    def _judge_health(self, main, step: int) -> dict[str, float]:
        """The step's judge metrics; one warning line when a judge request or a score failed (trained or skipped)."""
        from openrlhf_classmate.integration.experience.step_health import step_report

        metrics, warning = step_report(main, self.classmate_stage, self.judge_client)
        if warning:
            logger.warning(f"step {step}: {warning}")
        return metrics

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


class ClassmatePPOTrainer(ClassmateControllerMixin, PPOTrainer.__ray_actor_class__):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, classmate_engines=None, classmate_colocated=False,
                 startup=None, **generate_kwargs):
        patches.install_samples_generator()  # before upstream's __init__ builds its SamplesGenerator
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)
        self._setup_classmate(classmate_engines, classmate_colocated, startup)

    def evaluate(self, global_step, **generate_kwargs):
        """Upstream's evaluation, except that reward hooks that score evaluation samples (``scores_eval_samples``)
        set their rewards before upstream's pass@k metrics, and their metrics are logged with an ``eval_`` prefix."""
        hooks = [h for h in self.experience_maker.reward_hooks if getattr(h, "scores_eval_samples", False)]
        if not hooks:
            return super().evaluate(global_step, **generate_kwargs)
        from openrlhf_classmate.integration.experience.eval_metrics import masked_eval_metrics

        start = time.time()
        samples = self.samples_generator.generate_eval_samples(**generate_kwargs)
        logs = {}
        if samples:
            for hook in hooks:
                logs.update({f"eval_{k}": v for k, v in hook(self.experience_maker, samples).items()})
        # a sample a hook could not score (main_valid 0) is left out of pass1 / pass@n (integration/experience/eval_metrics.py)
        logs = {**masked_eval_metrics(self.eval_dataloader, samples, generate_kwargs["n_samples_per_prompt"]),
                **logs}
        if self.wandb_logger:
            self.wandb_logger.log_eval(global_step, logs)
        if self.tensorboard_logger:
            self.tensorboard_logger.log_eval(global_step, logs)
        logger.info(f"Evaluation at global_step {global_step} took {time.time() - start:.0f}s: {logs}")
        return logs


# ── async ──


class ClassmateTrainingActor(TrainingActor.__ray_actor_class__, ClassmateControllerMixin):
    # MRO: upstream's TrainingActor (its vLLM lock around the weight sync) → our mixin → BasePPOTrainer
    def __init__(self, *args, classmate_engines=None, classmate_colocated=False, startup=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup_classmate(classmate_engines, classmate_colocated, startup)

    def broadcast_to_vllm(self) -> None:
        # Ray ships this class to its worker with copies of the inherited methods of upstream's @ray.remote classes
        # (pickled by value, since their module name is the ActorClass), and such a copy's zero-argument super()
        # names a copy of TrainingActor that self is no instance of (TypeError, seen under Ray 2.55). Calling
        # upstream's own function, resolved here, keeps its lock around our weight sync.
        return TrainingActor.__ray_actor_class__.broadcast_to_vllm(self)


class ClassmateGenerateSamplesActor(GenerateSamplesActor.__ray_actor_class__):
    """Upstream's rollout actor; each rollout batch leaves with its classmate requests already dispatched."""

    def __init__(self, pretrain, strategy, vllm_engines, *, classmate_engines=None, **kwargs):
        patches.install_samples_generator()  # before upstream's __init__ builds its SamplesGenerator
        super().__init__(pretrain, strategy, vllm_engines, **kwargs)
        from openrlhf_classmate.integration.experience.reward_methods import evaluate_with_validation_rewards

        install_rollout_request(strategy.args)  # async: this actor generates the rollouts

        evaluate_with_validation_rewards(self.samples_generator)  # async evaluation runs here (TinyV: weight 1)
        self.classmate_stage = None
        if classmate_engines:
            from openrlhf_classmate.integration.classmate.classmate_stage import ClassmateStage

            self.classmate_stage = ClassmateStage(strategy.args, self.samples_generator.tokenizer, classmate_engines,
                                                  classmate_tokenizers(strategy.args))
            if dispatch_per_group(strategy.args):  # per prompt group, as each is generated (--classmate.dispatch)
                self.samples_generator.classmate_dispatch = self.classmate_stage.dispatch
            rollout = self.samples_generator.generate_samples

            def generate_samples(**generate_kwargs):
                samples, pass_rate, consumed, exhausted = rollout(**generate_kwargs)
                if samples and getattr(samples, "classmate_pending", None) is None:
                    samples = ClassmateRollout(samples, self.classmate_stage.dispatch(samples))
                return samples, pass_rate, consumed, exhausted

            # this generator object only: the queue then carries each batch with its requests in flight
            self.samples_generator.generate_samples = generate_samples


class _RemoteWith:
    """Stands in for one of upstream's async actor classes: ``.remote(**kw)`` creates ours with extra kwargs."""

    def __init__(self, actor_cls, **extra):
        self.actor_cls, self.extra = ray.remote(actor_cls), extra

    def remote(self, *args, **kwargs):
        return self.actor_cls.remote(*args, **kwargs, **self.extra)


class ClassmatePPOTrainerAsync(PPOTrainerAsync.__ray_actor_class__):
    def __init__(self, pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                 reference_model_group, vllm_engines, *, classmate_engines=None, classmate_colocated=False,
                 startup=None, **generate_kwargs):
        # upstream's __init__ creates its two actors through module globals: ours take their place (this process)
        patches.install_async_actors(
            generator=_RemoteWith(ClassmateGenerateSamplesActor, classmate_engines=classmate_engines),
            trainer=_RemoteWith(ClassmateTrainingActor, classmate_engines=classmate_engines,
                                classmate_colocated=classmate_colocated, startup=startup),
        )
        super().__init__(pretrain, strategy, actor_model_group, critic_model_group, reward_model_group,
                         reference_model_group, vllm_engines, **generate_kwargs)

    def engine_weight_updates(self) -> dict[str, list[int]]:
        return ray.get(self.trainer_actor.engine_weight_updates.remote())


def controller_class(args) -> type:
    """The plain controller class for this run (the launcher wraps it with ``ray.remote``)."""
    return ClassmatePPOTrainerAsync if args.train.async_enable else ClassmatePPOTrainer

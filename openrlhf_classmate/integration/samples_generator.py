"""``ClassmateSamplesGenerator``: upstream's ``SamplesGenerator`` whose dynamic filter leaves invalid scores out.

Upstream's filter (``--algo.dynamic_filtering_enable``, ``samples_generator.py`` ``_generate_vllm``) averages the
``scores`` of a prompt group's samples, drops the group when the mean is outside ``--algo.dynamic_filtering_range``
(open interval) and draws a replacement prompt. A failed score is reported as ``scores = 0`` with
``extra_logs["main_valid"] = 0`` (``reward_func.py``, ``integration/policy_executor.py``), so upstream averages the
placeholder: with the judge down every group averages 0, is dropped and replaced until the epoch is used up, and no
batch ever reaches the trainer's all-invalid stop.

Here the group mean is over the valid scores only; a group without any valid score is dropped (counted, one warning
line per rollout). While no valid score has been seen, every ``--rollout.batch_size`` groups dropped this way count as
one all-invalid step towards ``--classmate.stop_after_invalid_steps``, and the run stops with the trainer's message.
Without dynamic filtering (and for evaluation) upstream's ``_generate_vllm`` runs unchanged, unless the classmate
requests go out per prompt group (``--classmate.dispatch``, :func:`classmate_config.dispatch_per_group`): then the
same loop sends each kept group's classmate requests as soon as the group is generated (``classmate_dispatch``),
so the classmate engines generate while the policy engines finish the other groups, and ``generate_samples``
returns the batch as a :class:`~openrlhf_classmate.integration.classmate_stage.ClassmateRollout` carrying them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ray
import torch
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator, _collect_prompt_batch
from openrlhf.utils.logging_utils import init_logger
from tqdm import tqdm

from openrlhf_classmate.integration.classmate_stage import ClassmateRollout, merge_pending
from openrlhf_classmate.integration.experience_maker import (
    invalidate_nonfinite_main,
    main_validity,
    warn_nonfinite_main,
)
from openrlhf_classmate.integration.step_health import no_valid_score_yet

logger = init_logger(__name__)

KEEP, OUT_OF_RANGE, NO_VALID_SCORE = "keep", "out_of_range", "no_valid_score"


def filter_decision(scores: Sequence[float], valid: Sequence[bool], score_range: Sequence[float]) -> str:
    """Upstream's test ``low < mean < high``, with the mean over the valid scores; a group with none fails."""
    kept = [s for s, ok in zip(scores, valid, strict=True) if ok]
    if not kept:
        return NO_VALID_SCORE
    low, high = score_range
    return KEEP if low < sum(kept) / len(kept) < high else OUT_OF_RANGE


class ClassmateSamplesGenerator(SamplesGenerator):
    invalid_groups = 0  # groups dropped for having no valid score
    _nonfinite = 0  # rewards of the batch being generated that arrived non-finite (said once per batch)
    seen_valid_score = False
    # set by the controller where the classmate requests go out per prompt group: the classmate stage's dispatch,
    # and whether the next rollout batch sends them so (the step-time benchmark's controls can say no)
    classmate_dispatch: Callable | None = None
    dispatch_next_per_group: Callable[[], bool] = staticmethod(lambda: True)

    def generate_samples(self, **generate_kwargs):
        self._early = []  # (group, its classmate requests) in the order the groups joined the batch
        early = self.classmate_dispatch is not None and self.dispatch_next_per_group()
        self._dispatching = early
        try:
            samples, pass_rate, consumed, exhausted = super().generate_samples(**generate_kwargs)
        finally:
            self._dispatching = False
            warn_nonfinite_main(self._nonfinite)
            self._nonfinite = 0
        if early and samples:
            parts = [p for _, p in self._early]
            if [id(x) for g, _ in self._early for x in g] != [id(x) for x in samples]:
                raise RuntimeError("per-group classmate dispatch: the rollout batch is not the dispatched groups in "
                                   "order (a sample buffer across steps?); use --classmate.dispatch batch")
            samples = ClassmateRollout(samples, merge_pending(parts))
        self._early = []
        return samples, pass_rate, consumed, exhausted

    def _process_response_into_experience(self, response, **generate_kwargs):
        """Upstream's, with every sample flagged ``main_valid`` (1 where the reward function gave no flag) and a
        non-finite reward or score turned into an invalid score where it arrives, before dynamic filtering reads it
        (the experience maker says so in its step's warning line)."""
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        if experience.rewards is not None or experience.scores is not None:
            experience.info.setdefault("main_valid", torch.ones(1))
            self._nonfinite += invalidate_nonfinite_main([experience])
        return experience

    def _generate_vllm(self, dataloader_iter, num_prompts: int, dynamic_filtering, **generate_kwargs):
        dispatching = getattr(self, "_dispatching", False)
        if not dynamic_filtering and not dispatching:
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        # upstream's loop (dispatch, collect per prompt group as it finishes, replace each dropped group at once),
        # with filter_decision in place of its mean over every score, and each kept group's classmate requests
        # sent at once where they go out per group
        prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
        if not prompts:
            return [], 0, True
        consumed, accepted, dropped_invalid = len(prompts), [], 0
        pending = self._dispatch_prompts_to_vllm(prompts, labels, images=images, **generate_kwargs)
        bar = tqdm(total=len(prompts), desc="Generate samples")
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=10.0)
            for ref in ready:
                group = [self._process_response_into_experience(r, **generate_kwargs) for r in ray.get(ref)]
                decision = self._decide(group) if dynamic_filtering else KEEP
                if decision == KEEP:
                    if dispatching:
                        self._early.append((group, self.classmate_dispatch(group, first_index=len(accepted))))
                    accepted.extend(group)
                    bar.update()
                    continue
                dropped_invalid += decision == NO_VALID_SCORE
                new_prompts, new_labels, new_images, exhausted = _collect_prompt_batch(dataloader_iter, 1)
                consumed += len(new_prompts)
                if new_prompts:
                    pending.extend(self._dispatch_prompts_to_vllm(new_prompts, new_labels, images=new_images,
                                                                  **generate_kwargs))
        bar.close()
        if dropped_invalid:
            logger.warning(f"dynamic filtering dropped {dropped_invalid} prompt group(s) whose main scores were all "
                           "invalid (judge or verifier failures; see the reward function's log lines)")
        return accepted, consumed, exhausted

    def _decide(self, group: list) -> str:
        if any(e.scores is None for e in group):
            return KEEP  # upstream filters only groups whose every sample has a score
        valid = main_validity(group).tolist()
        scores = [float(e.scores[0]) for e in group]
        decision = filter_decision(scores, valid, self.args.algo.dynamic_filtering_range)
        if decision != NO_VALID_SCORE:
            self.seen_valid_score = True
            if decision == OUT_OF_RANGE:
                logger.info(f"Filtered out: valid scores {[s for s, ok in zip(scores, valid) if ok]} average "
                            f"outside {tuple(self.args.algo.dynamic_filtering_range)}")
            return decision
        self.invalid_groups += 1
        limit, per_step = self.args.classmate.stop_after_invalid_steps, self.args.rollout.batch_size
        if limit and not self.seen_valid_score and self.invalid_groups >= limit * per_step:
            from openrlhf_classmate.errors import TrainingStopped

            raise TrainingStopped(no_valid_score_yet(
                f"dynamic filtering dropped {self.invalid_groups} prompt groups whose main scores were all invalid "
                f"({limit} x --rollout.batch_size {per_step})"))
        return decision

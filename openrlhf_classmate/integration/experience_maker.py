"""``ClassmateExperienceMaker``: upstream's ``RemoteExperienceMaker`` plus the classmate stage.

Per rollout batch (``make_experience_batch``):

1. dispatch the classmate requests (CoT spans → classmate inputs → classmate engines);
2. upstream ``make_experience_batch``: actor/ref forward passes, upstream advantages of the main reward;
3. gather and score the classmate answers, combine them into the classmate reward;
4. replace the advantages with :func:`openrlhf_classmate.algo.advantages.compute_advantages` of both streams and
   attach the per-token tensors (``ClassmateExperience`` fields).

When the classmate shares GPUs with the actor/ref models (``--classmate.placement colocate``) step 3 runs before
step 2 and the classmate engines sleep in between, because the forward passes need the memory; otherwise the
classmate generation overlaps the forward passes, and the overlap is measured and logged.
"""

from __future__ import annotations

import time

import ray
import torch
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_classmate.algo.advantages import compute_advantages, group_std
from openrlhf_classmate.integration.classmate_config import uses_separated_loss


def _pad_rows(rows: list[torch.Tensor], fill) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def to_action_space(sample, per_response: torch.Tensor, fill) -> torch.Tensor:
    """Place a response-space row [R] into the sample's action space [A] (``action_mask`` marks the response)."""
    action = sample.action_mask[0].bool()
    out = torch.full(action.shape, fill, dtype=per_response.dtype)
    out[action] = per_response
    return out


class ClassmateExperienceMaker(RemoteExperienceMaker):
    def __init__(self, *args, classmate_stage=None, classmate_engines=None, colocated: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.stage = classmate_stage
        self.classmate_engines = list(classmate_engines or [])
        self.colocated = colocated
        self.sleep = colocated or bool(getattr(self.args.classmate, "enable_sleep", False))

    def _engines_call(self, method: str, **kwargs) -> None:
        if self.classmate_engines:
            ray.get([getattr(engine, method).remote(**kwargs) for engine in self.classmate_engines])

    def check_labels(self, rollout_samples) -> None:
        """Bad labels stop the run with the scorer registry's message (naming data source and field): the engine-side
        reward function can only report them as invalid scores, because OpenRLHF swallows its exceptions."""
        from openrlhf_classmate.integration.classmate_config import registry_reward_in_use
        from openrlhf_classmate.scoring import get_scorer, parse_label

        if not registry_reward_in_use(self.args):
            return
        override = getattr(self.args.classmate, "scorer", "auto")
        for sample in rollout_samples:
            label = parse_label(sample.labels[0])
            get_scorer(label["data_source"] if override == "auto" else override).check_label(label)

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples):
        self.check_labels(rollout_samples)
        if self.stage is None:
            return super().make_experience_batch(rollout_samples)
        main_rewards = torch.cat([s.rewards.float() for s in rollout_samples])
        t_start = time.time()
        if self.sleep:
            self._engines_call("wake_up")
        pending = self.stage.dispatch(rollout_samples)
        if self.colocated:
            result = self.stage.gather(pending, main_rewards)
            self._engines_call("sleep")
            t_forward = time.time()
            experiences = super().make_experience_batch(rollout_samples)
            t_forward_end = time.time()
            stage_time, overlap = t_forward - t_start, 0.0
        else:
            t_forward = time.time()
            experiences = super().make_experience_batch(rollout_samples)
            t_forward_end = time.time()
            result = self.stage.gather(pending, main_rewards)
            if self.sleep:
                self._engines_call("sleep")
            stage_time = max(result.finished_at, t_forward) - t_start
            overlap = max(0.0, min(t_forward_end, result.finished_at) - t_forward)
        result.metrics["classmate/actor_ref_forward_time"] = t_forward_end - t_forward  # for the step-time bench
        self._attach(rollout_samples, experiences, main_rewards, result, stage_time, overlap)
        return experiences

    def _attach(self, samples, experiences, main_rewards, result, stage_time: float, overlap: float) -> None:
        args = self.args
        cfg = args.classmate
        n_per_prompt = args.rollout.n_samples_per_prompt
        group = torch.arange(len(samples)) // n_per_prompt
        action_masks = _pad_rows([s.action_mask[0].bool() for s in samples], False)
        cot_action = [to_action_space(s, c, False) for s, c in zip(samples, result.cot)]
        cot = _pad_rows(cot_action, False)
        out = compute_advantages(
            cfg.estimator,
            main_rewards,
            result.reward,
            group,
            action_masks,
            cot,
            cfg.token_mode,
            not args.algo.advantage.no_std_norm,
            classmate_valid=result.valid,
            weights=tuple(cfg.gdpo_weights),
        )
        separated = uses_separated_loss(args)
        log_probs = None
        if result.classmate_log_probs is not None:
            log_probs = _pad_rows(
                [to_action_space(s, lp, float("-inf")) for s, lp in zip(samples, result.classmate_log_probs)],
                float("-inf"),
            )
        main_std = group_std(main_rewards, group, torch.ones_like(result.valid))
        classmate_std = group_std(result.reward, group, result.valid)

        for exp in experiences:
            index = torch.tensor(exp.index)
            width = exp.action_mask.shape[1]

            def rows(t: torch.Tensor, index=index, width=width) -> torch.Tensor:
                return t[index, :width]

            if separated:
                exp.advantages = rows(out["main_advantages"]).to(exp.action_log_probs.dtype)
                exp.classmate_advantages = rows(out["classmate_advantages"]).to(exp.action_log_probs.dtype)
            else:
                exp.advantages = rows(out["advantages"]).to(exp.action_log_probs.dtype)
            exp.cot_mask = rows(cot)
            if exp.classmate_advantages is not None:
                # sanity metric: with classmate_partial the classmate advantage must vanish outside the CoT
                outside = exp.action_mask.bool() & ~exp.cot_mask
                exp.info["classmate/adv_abs_outside_cot"] = (exp.classmate_advantages.abs() * outside).sum(-1).float()
                exp.info["classmate/adv_abs_on_cot"] = (
                    (exp.classmate_advantages.abs() * exp.cot_mask).sum(-1) / exp.cot_mask.sum(-1).clamp(min=1)
                ).float()
            if log_probs is not None:
                exp.classmate_log_probs = rows(log_probs)
                on_cot = torch.where(exp.cot_mask, exp.classmate_log_probs, torch.zeros(()))
                # how likely the classmate finds the main CoT, per token (vanilla_classmate's c_t numerator)
                exp.info["classmate/cot_logprob"] = (on_cot.sum(-1) / exp.cot_mask.sum(-1).clamp(min=1)).float()
            b = len(exp.index)
            exp.info["classmate/reward"] = result.reward[index]
            exp.info["classmate/reward_raw"] = result.raw_mean[index]
            exp.info["classmate/valid"] = result.valid[index].float()
            exp.info["classmate/main_group_reward_std"] = main_std[index]
            exp.info["classmate/classmate_group_reward_std"] = classmate_std[index]
            exp.info["classmate/cot_tokens"] = cot[index].sum(-1).float()
            exp.info["classmate/stage_time"] = torch.full((b,), stage_time)
            exp.info["classmate/stage_overlap_time"] = torch.full((b,), overlap)
            for key, value in result.metrics.items():
                exp.info[key] = torch.full((b,), float(value))

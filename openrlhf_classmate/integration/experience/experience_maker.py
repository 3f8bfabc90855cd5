"""``ClassmateExperienceMaker``: upstream's ``RemoteExperienceMaker`` plus the classmate stage.

Per rollout batch (``make_experience_batch``):

1. dispatch the classmate requests (CoT spans → classmate inputs → classmate engines);
2. upstream ``make_experience_batch``: actor/ref forward passes, then upstream's reward shaping (length penalties on
   ``experience.rewards``) and its advantages of the main reward; the per-token KL that upstream folds into the reward
   and then drops is kept (``compute_advantages_and_returns``);
3. gather and score the classmate answers, combine them into the classmate reward;
4. replace the advantages with :func:`openrlhf_classmate.algo.advantages.compute_advantages` of both streams, fed
   with what upstream's own estimator uses: the penalised main rewards, the per-stream baseline of
   ``--algo.advantage.estimator``, ``--reward.clip_range``, the KL return and (reinforce_baseline) the whitening;
   then attach the per-token tensors (``ClassmateExperience`` fields) and log.

Group-level reward hooks (``reward_hooks``: DARLING's diversity, VR-CLI's likelihood reward, ...) run first, on the
whole rollout batch: each sets ``sample.rewards`` (and ``info["main_valid"]`` for samples it cannot score) in place
and returns per-step metrics, so upstream's shaping, the classmate condition and every estimator see its rewards.

Main scores the reward function marked invalid (``extra_logs["main_valid"] == 0``: judge down, unparsable rating)
are masked out of the main statistics, in plain runs too; a batch with no valid main score raises
:class:`AllScoresInvalidError` before any forward pass (the trainer skips the step).

When the classmate shares GPUs with the actor/ref models (``--classmate.placement colocate``) step 3 runs before
step 2 and the classmate engines sleep in between, because the forward passes need the memory; otherwise the
classmate generation overlaps the forward passes, and the overlap is measured and logged. In async training step 1
happened in the rollout actor (``integration.trainer``): the batch arrives with its requests in flight. So does a
batch whose requests the samples generator sent prompt group by prompt group during the rollout
(``--classmate.dispatch``, where the classmate engines are awake).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import ray
import torch
from openrlhf.models.utils import compute_reward
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

from openrlhf_classmate.algo.advantages import (
    SEPARATED,
    compute_advantages,
    group_std,
    main_advantages_over_valid,
)
from openrlhf_classmate.integration import bench_switches
from openrlhf_classmate.integration.classmate.classmate_stage import prompt_ids_of
from openrlhf_classmate.integration.classmate_config import uses_separated_loss, warn
from openrlhf_classmate.integration.rollout import mismatch
from openrlhf_classmate.integration.rollout.main_scores import (
    invalidate_nonfinite_main,
    main_validity,
    warn_nonfinite_main,
)


class AllScoresInvalidError(RuntimeError):
    """Every main score of the rollout batch is invalid: there is nothing to learn from this step. ``reason``: why,
    when a reward hook knows (e.g. every VR-CLI sequence over ``--vrcli.max_len``), else None (judge, verifier or
    reward function: their log lines say)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message if reason is None else f"{message} ({reason})")
        self.reason = reason


@dataclass
class _StageRun:
    """A classmate step's stage between the calls of ``make_experience_batch``: its requests (``pending``), when
    they went out, the main rewards before upstream's shaping (the condition's input), the gathered ``result`` and
    the forwards' start and end (wall seconds)."""

    pending: Any
    started_at: float
    raw_main: torch.Tensor
    result: Any = None
    forward_at: float = 0.0
    forward_end: float = 0.0


class RewardHook(Protocol):
    """A group-level main reward: sees the whole rollout batch (the n samples of a prompt are consecutive)."""

    def __call__(self, maker: ClassmateExperienceMaker, rollout_samples: list) -> dict[str, float]:
        """Set ``sample.rewards`` / ``sample.info["reward"]`` (and ``info["main_valid"] = 0`` where no score could
        be computed) in place; return this step's metrics (logged under their names)."""
        ...


def _pad_rows(rows: list[torch.Tensor], *, fill) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype if rows else torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def to_action_space(sample, per_response: torch.Tensor, *, fill) -> torch.Tensor:
    """Place a response-space row [R] into the sample's action space [A] (``action_mask`` marks the response)."""
    action = sample.action_mask[0].bool()
    out = torch.full(action.shape, fill, dtype=per_response.dtype)
    out[action] = per_response
    return out


def _broadcast_valid_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``values`` with invalid entries replaced by the mean of the valid ones, so that any mean over samples that
    upstream's logging takes equals the mean over valid samples (0 when none is valid)."""
    values = values.float()
    mean = values[valid].mean() if valid.any() else torch.tensor(0.0)
    return torch.where(valid, values, mean)


def _in_rollout_order(experiences, values: Callable, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N]: ``values(experience)`` (one per row) of every micro-batch experience, at the rollout indices its rows
    carry (``experience.index``)."""
    out = torch.zeros(sum(len(exp.index) for exp in experiences), dtype=dtype)
    for exp in experiences:
        out[torch.tensor(exp.index)] = values(exp).to(dtype)
    return out


def _logged_group_std(values: torch.Tensor, group: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per sample, the std of its group's valid scores, for logging: a group with fewer than 2 valid scores has no
    std and takes the mean of the others, so that upstream's mean over samples is the mean over the groups that have
    one (a 0 there would read as "no spread")."""
    counts = torch.zeros(int(group.max()) + 1 if len(group) else 0).index_add_(0, group, valid.float())
    return _broadcast_valid_mean(group_std(values, group, valid=valid), counts[group] >= 2)


class ClassmateExperienceMaker(RemoteExperienceMaker):
    def __init__(self, *args, classmate_stage=None, classmate_engines=None, colocated: bool = False,
                 reward_hooks: list[RewardHook] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.reward_hooks = list(reward_hooks or [])
        self.stage = classmate_stage
        self.classmate_engines = list(classmate_engines or [])
        self.colocated = colocated
        self.sleep = colocated or bool(getattr(self.args.classmate, "enable_sleep", False))
        self._kl: list[torch.Tensor | None] = []
        # bench/step_time.py --interleave sets this: the classmate stage runs on odd rollout batches only and the
        # even ones train as plain GRPO on the main reward, so that both kinds of step are timed in one process with
        # the same engines, weights and machine drift (a benchmark control, never set in a training run)
        self.bench_alternate = bench_switches.alternating()
        if self.bench_alternate and self.stage is not None and uses_separated_loss(self.args):
            raise ValueError(f"{bench_switches.ALTERNATE_ENV} needs a single-advantage estimator (gdpo, grpo, ...): "
                             "the separated losses cannot train a step without classmate advantages")
        # bench/step_time.py --before sets this: the steps cycle through the launcher's own path and each listed
        # change's before path (bench_switches; none has one today), a benchmark control never set in a training run
        self.bench_before = bench_switches.before_changes()
        self._batches_made = 0
        self.last_mismatch = None  # the last batch's train-inference mismatch (integration.rollout.mismatch), read once

    def classmate_step(self, batch: int) -> bool:
        """Whether rollout batch number ``batch`` (1-based) is a classmate step: every batch, but under the step-time
        benchmark's GDPO / GRPO alternation the odd ones only."""
        return self.stage is not None and not (self.bench_alternate and batch % 2 == 0)

    def next_batch_dispatches_per_group(self) -> bool:
        """Whether the generator sends the next batch's classmate requests per prompt group (it does so only where
        the run's --classmate.dispatch resolves to group): a classmate step."""
        return self.classmate_step(self._batches_made + 1)

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
        override = getattr(self.args.classmate, "main_scorer", "auto")
        for sample in rollout_samples:
            label = parse_label(sample.labels[0])
            get_scorer(label["data_source"] if override == "auto" else override).check_label(label)

    @torch.no_grad()
    def make_experience(self, samples_list):
        # upstream's forward passes give the actor's old log-probs; the engines' log-probs of the same tokens came
        # with the rollout: their difference is the step's train-inference mismatch
        experiences = super().make_experience(samples_list)
        self.last_mismatch = mismatch.measure(experiences) if mismatch.enabled(self.args) else None
        return experiences

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences):
        # Upstream folds the per-token KL into the reward and then sets ``experience.kl = None``; the classmate
        # estimators add the same KL return to the main stream, so keep it.
        self._kl = [exp.kl for exp in experiences]
        return super().compute_advantages_and_returns(experiences)

    def truncated_prompts(self, rollout_samples) -> dict[str, float]:
        """Upstream cuts a prompt longer than ``--data.max_len`` minus the generation budget from the front, with a
        log line per prompt in the engine process only; the run says it once, with the step's counts, and logs the
        fraction (``prompt_truncated``) every step. A prompt is cut when its ids fill the whole room and the prompt
        text (as the dataset gave it) tokenises to more."""
        args = self.args
        room = args.data.max_len - (getattr(args.rollout, "max_new_tokens", None) or 1)
        cut = 0
        for sample in rollout_samples:
            kept = len(prompt_ids_of(sample))
            text = sample.prompts[0] if sample.prompts else None
            if kept >= room and isinstance(text, str) and len(
                    self.tokenizer(text, add_special_tokens=False)["input_ids"]) > kept:
                cut += 1
        if cut and not getattr(self, "_said_truncation", False):
            self._said_truncation = True
            classmate = " (the classmate reads the full prompt from the label)" if self.stage is not None else ""
            warn(
                f"{cut} of {len(rollout_samples)} rollout samples of this step had their prompt cut from the front to "
                f"{room} tokens (--data.max_len {args.data.max_len} - --rollout.max_new_tokens): the policy never saw "
                f"the beginning of those prompts{classmate}; raise --data.max_len or drop the long rows (said once; "
                "the metric prompt_truncated counts them every step)")
        return {"prompt_truncated": cut / max(len(rollout_samples), 1)}

    @torch.no_grad()
    def make_experience_batch(self, rollout_samples):
        main_valid, step_metrics = self._run_reward_hooks(rollout_samples)
        stage = self._dispatch(rollout_samples)
        experiences = self._forwards(rollout_samples, stage, main_valid)
        return self._gather_and_advantages(rollout_samples, experiences, stage, main_valid, step_metrics)

    def _run_reward_hooks(self, rollout_samples) -> tuple[torch.Tensor, dict[str, float]]:
        """Before step 1 (module docstring) and any forward pass: the labels checked, the group-level reward hooks
        run, non-finite main rewards made invalid. Returns ``(main_valid, step_metrics)``: the validity of each main
        score and the step's metrics so far (truncated prompts, the hooks', the benchmark's path flags). A batch
        without a valid main score raises :class:`AllScoresInvalidError`."""
        self.check_labels(rollout_samples)
        metrics: dict[str, float] = self.truncated_prompts(rollout_samples)
        for hook in self.reward_hooks:
            metrics.update(hook(self, rollout_samples))
        warn_nonfinite_main(invalidate_nonfinite_main(rollout_samples))
        main_valid = main_validity(rollout_samples)
        if not main_valid.any():
            reasons = [r for r in (getattr(hook, "invalid_reason", None) for hook in self.reward_hooks) if r]
            raise AllScoresInvalidError(f"all {len(rollout_samples)} main scores of this rollout batch are invalid",
                                        "; ".join(reasons) or None)
        self._batches_made += 1
        if self.bench_alternate or self.bench_before:  # the report splits the steps by kind and path
            metrics["bench/classmate_step"] = float(self.classmate_step(self._batches_made))
        if self.bench_before:
            metrics["bench/before"] = float(bench_switches.path_index(self._batches_made))
        return main_valid, metrics

    def _dispatch(self, rollout_samples) -> _StageRun | None:
        """Step 1 of a classmate step (None for a plain one): its classmate requests, sent here or already in flight
        (sent by the async rollout actor, or per prompt group by the samples generator)."""
        if not self.classmate_step(self._batches_made):
            return None
        raw_main = torch.cat([s.rewards.float() for s in rollout_samples])  # before shaping: the condition's input
        pending = getattr(rollout_samples, "classmate_pending", None)  # async: dispatched by the rollout actor
        if self.args.train.async_enable and pending is None:
            raise RuntimeError("this rollout batch arrived without its classmate requests; refusing to train on it "
                               "without classmate scores (the async rollout actor must dispatch them)")
        if pending is not None:
            return _StageRun(pending, pending.dispatched_at, raw_main)
        started_at = time.time()
        if self.sleep:
            self._engines_call("wake_up")
        return _StageRun(self.stage.dispatch(rollout_samples), started_at, raw_main)

    def _forwards(self, rollout_samples, stage: _StageRun | None, main_valid):
        """Step 2: upstream's ``make_experience_batch`` (actor/ref forwards, its reward shaping and main advantages),
        timed for the classmate metrics. Colocated, the classmate answers are gathered first and the classmate
        engines sleep: the forwards need the memory."""
        if stage is not None and self.colocated:
            self._gather(stage, main_valid)
        forward_at = time.time()
        experiences = super().make_experience_batch(rollout_samples)
        if stage is not None:
            stage.forward_at, stage.forward_end = forward_at, time.time()
        return experiences

    def _gather(self, stage: _StageRun, main_valid) -> None:
        """The classmate answers gathered and scored into ``stage.result``; the classmate engines sleep after."""
        stage.result = self.stage.gather(stage.pending, stage.raw_main, main_valid)
        if self.sleep:
            self._engines_call("sleep")

    def _gather_and_advantages(self, samples, experiences, stage: _StageRun | None, main_valid, step_metrics):
        """Steps 3-4: a plain step's main advantages over the valid main scores; a classmate step's answers gathered
        (beside the policy engines: after the forwards it overlapped), both streams' advantages, the classmate
        tensors attached and the metrics logged."""
        if stage is None:
            if not main_valid.all():
                self._mask_invalid_main(samples, experiences, main_valid)
            self._log_main(experiences, main_valid, step_metrics)
            return experiences
        if stage.result is None:
            self._gather(stage, main_valid)
        result = stage.result
        if self.colocated:
            stage_time, overlap = stage.forward_at - stage.started_at, 0.0
        else:
            stage_time = max(result.finished_at, stage.forward_at) - stage.started_at
            overlap = max(0.0, min(stage.forward_end, result.finished_at) - stage.forward_at)
        # for the step-time bench
        result.metrics["classmate/actor_ref_forward_time"] = stage.forward_end - stage.forward_at
        # what the classmate adds to the step's critical path: colocated, the whole stage; otherwise the wait for
        # the generation still running after the forwards, plus decoding and scoring the answers
        result.metrics["classmate/wait_time"] = (stage.forward_at - stage.started_at if self.colocated
                                                 else time.time() - stage.forward_end)
        # the requests went out per prompt group during the rollout (--classmate.dispatch group)
        result.metrics["classmate/dispatched_per_group"] = float(bool(getattr(stage.pending, "per_group", False)))
        advantages, cot_masks, shaping = self._compute_classmate_advantages(samples, experiences, main_valid, result)
        self._attach_classmate_tensors(experiences, samples, advantages, cot_masks, result)
        if not main_valid.all():
            self._mask_upstream_info(experiences, main_valid, advantages["main_scalar"], shaping["kl_return"],
                                     shaping["response"])
        shaping["penalty"] = shaping.pop("main_rewards") - stage.raw_main.double()
        self._log_classmate_metrics(experiences, samples, advantages, cot_masks, main_valid, result,
                                    stage_time, overlap, shaping)
        self._log_main(experiences, main_valid, step_metrics)
        return experiences

    # ── advantages ──

    def _upstream_inputs(self, samples, experiences, width: int) -> dict:
        """What upstream's estimator reads, in rollout order: penalised rewards, KL return, baseline, clip, whitening."""
        args = self.args
        size = len(samples)
        rewards = _in_rollout_order(experiences, lambda e: e.rewards, torch.float64)  # after upstream's penalties
        kl_return = None
        if any(kl is not None and bool((kl != 0).any()) for kl in self._kl):
            kl_return = torch.zeros(size, width)
            for exp, kl in zip(experiences, self._kl):
                # upstream's own functions with a zero outcome reward: Σ_{s≥t} -β·KL_s on the action tokens
                zero = torch.zeros(kl.shape[0], dtype=kl.dtype)
                per_token = compute_reward(zero, self.kl_ctl.value, kl, action_mask=exp.action_mask)
                returns = self.get_cumulative_returns(per_token, exp.action_mask, 1.0)
                kl_return[torch.tensor(exp.index), : returns.shape[1]] = returns.float()
        estimator = args.algo.advantage.estimator
        whiten = None
        if estimator == "reinforce_baseline":
            whiten = "mean" if args.algo.advantage.no_std_norm else "mean_std"
        return dict(main_rewards=rewards, kl_return=kl_return, baseline=estimator,
                    main_clip=tuple(args.reward.clip_range) if args.reward.clip_range else None, whiten=whiten,
                    eps=1e-9 if estimator == "group_norm" else 1e-6)  # upstream's group_norm uses std + 1e-9

    def _compute_classmate_advantages(self, samples, experiences, main_valid, result):
        """Both streams' advantages for the whole rollout batch, in rollout order: ``(advantages, cot_masks,
        shaping)``, with ``advantages`` the dict of :func:`compute_advantages` ([N, A] tensors, A = the widest action
        space), ``cot_masks`` [N, A] bool and ``shaping`` what upstream's reward shaping put into the main stream
        (for the metrics)."""
        cfg = self.args.classmate
        group = torch.arange(len(samples)) // self.args.rollout.n_samples_per_prompt
        action_masks = _pad_rows([s.action_mask[0].bool() for s in samples], fill=False)
        cot_masks = _pad_rows([to_action_space(s, c, fill=False) for s, c in zip(samples, result.cot)], fill=False)
        upstream = self._upstream_inputs(samples, experiences, action_masks.shape[1])
        shaping = {"main_rewards": upstream["main_rewards"], "kl_return": upstream["kl_return"],
                   "response": action_masks}
        advantages = compute_advantages(
            cfg.estimator,
            upstream.pop("main_rewards"),
            result.reward.double(),
            group,
            response_mask=action_masks,
            cot_mask=cot_masks,
            token_mode=cfg.token_mode,
            main_valid=main_valid,
            classmate_valid=result.valid,
            weights=tuple(cfg.gdpo_weights),
            **upstream,
        )
        return advantages, cot_masks, shaping

    def _mask_invalid_main(self, samples, experiences, main_valid) -> None:
        """Plain runs: upstream's estimator over the valid main scores only
        (:func:`~openrlhf_classmate.algo.advantages.main_advantages_over_valid`), its advantages and logged
        statistics replacing upstream's."""
        args = self.args
        estimator = args.algo.advantage.estimator
        if estimator in ("gae", "reinforce"):
            # reinforce, no baseline: upstream's (discounted) returns are the advantages before its whitening; gae is
            # refused there, and the run stops with its message
            whitened = _stop_on_gae(main_advantages_over_valid)(
                estimator, None, None, main_valid=main_valid,
                returns=torch.cat([exp.returns.flatten() for exp in experiences]),
                returns_mask=torch.cat([(exp.action_mask.bool() & main_valid[torch.tensor(exp.index)].unsqueeze(1))
                                        .flatten() for exp in experiences]),
                no_std_norm=args.algo.advantage.no_std_norm)["advantages"]
            for exp, rows in zip(experiences, whitened.split([exp.returns.numel() for exp in experiences])):
                exp.advantages = rows.view_as(exp.returns).to(exp.advantages.dtype)
            self._mask_upstream_info(experiences, main_valid, None, None, None)
            return
        action_masks = _pad_rows([s.action_mask[0].bool() for s in samples], fill=False)
        group = torch.arange(len(samples)) // args.rollout.n_samples_per_prompt
        upstream = self._upstream_inputs(samples, experiences, action_masks.shape[1])
        masked = main_advantages_over_valid(estimator, upstream.pop("main_rewards"), group, main_valid=main_valid,
                                            response_mask=action_masks, **upstream)
        for exp in experiences:
            index, width = torch.tensor(exp.index), exp.action_mask.shape[1]
            exp.advantages = masked["advantages"][index, :width].to(exp.advantages.dtype)
        self._mask_upstream_info(experiences, main_valid, masked["main_scalar"], upstream["kl_return"], action_masks)

    def _mask_upstream_info(self, experiences, main_valid, main_scalar, kl_return, action_masks) -> None:
        """Upstream's own logged ``info["group_reward_std"]`` and ``info["return"]`` over valid main scores only (it
        computed both with the placeholder 0 of invalid scores in its group std and baseline). ``return`` is what
        upstream sums over the tokens: the post-baseline (clipped) outcome ``main_scalar`` plus the whole KL return
        (its value at the first response token); ``main_scalar=None`` (reinforce: no baseline) keeps upstream's
        values, which no placeholder entered, and only leaves the invalid rows out of the mean."""
        size = len(main_valid)
        if main_scalar is None:
            returns = _in_rollout_order(experiences, lambda e: e.info["return"])
        else:
            returns = main_scalar.float().clone()
            if kl_return is not None:
                first = action_masks.int().argmax(dim=1)  # the first response token of each row
                returns += kl_return.gather(1, first.unsqueeze(1)).squeeze(1).float()
        returns = _broadcast_valid_mean(returns, main_valid)
        stds = None
        if any("group_reward_std" in exp.info for exp in experiences):
            rewards = _in_rollout_order(experiences, lambda e: e.rewards)
            stds = _logged_group_std(rewards, torch.arange(size) // self.args.rollout.n_samples_per_prompt,
                                     main_valid)
        for exp in experiences:
            index = torch.tensor(exp.index)
            exp.info["return"] = returns[index]
            if stds is not None and "group_reward_std" in exp.info:
                exp.info["group_reward_std"] = stds[index]

    def _attach_classmate_tensors(self, experiences, samples, advantages, cot_masks, result) -> None:
        """Replace upstream's advantages and add the classmate fields (``ClassmateExperience``) on each micro-batch
        experience, cutting its rows (``experience.index``) and width out of the rollout-batch tensors."""
        separated = uses_separated_loss(self.args)
        log_probs = None
        if result.classmate_log_probs is not None:
            log_probs = _pad_rows(
                [to_action_space(s, lp, fill=float("-inf")) for s, lp in zip(samples, result.classmate_log_probs)],
                fill=float("-inf"),
            )
        for exp in experiences:
            index, width = torch.tensor(exp.index), exp.action_mask.shape[1]
            dtype = exp.action_log_probs.dtype
            if separated:
                exp.advantages = advantages["main_advantages"][index, :width].to(dtype)
                exp.classmate_advantages = advantages["classmate_advantages"][index, :width].to(dtype)
            else:
                exp.advantages = advantages["advantages"][index, :width].to(dtype)
            exp.cot_mask = cot_masks[index, :width]
            if log_probs is not None:
                exp.classmate_log_probs = log_probs[index, :width]

    # ── logging ──

    def _log_main(self, experiences, main_valid, step_metrics: dict[str, float] | None = None) -> None:
        """``reward`` over valid main scores only (upstream logs the mean of ``info["reward"]``), plus per-step
        metrics (broadcast to every sample, so upstream's sample-weighted mean is the value itself)."""
        logged = _broadcast_valid_mean(_in_rollout_order(experiences, lambda e: e.info["reward"]), main_valid)
        for exp in experiences:
            index = torch.tensor(exp.index)
            exp.info["reward"] = logged[index]
            exp.info["main_valid"] = main_valid[index].float()
            for key, value in (step_metrics or {}).items():
                exp.info[key] = torch.full((len(exp.index),), float(value))

    def _log_classmate_metrics(self, experiences, samples, advantages, cot_masks, main_valid, result,
                               stage_time: float, overlap: float, shaping: dict) -> None:
        """The ``classmate/*`` metrics into each experience's ``info`` (one value per sample; per-step values are
        broadcast, so upstream's sample-weighted mean is the value itself)."""
        group = torch.arange(len(samples)) // self.args.rollout.n_samples_per_prompt
        main_std = _logged_group_std(_in_rollout_order(experiences, lambda e: e.rewards), group, main_valid)
        classmate_std = _logged_group_std(result.reward, group, result.valid)
        classmate_reward = _broadcast_valid_mean(result.reward, result.valid)
        classmate_raw_mean = _broadcast_valid_mean(result.raw_mean, result.valid)
        cot_logprob = None
        if result.classmate_log_probs is not None:
            mean_per_row = torch.stack([
                torch.where(cot, lp, torch.zeros(())).sum() / cot.sum().clamp(min=1)
                for lp, cot in zip(result.classmate_log_probs, result.cot)
            ])
            has_logprobs = torch.tensor([bool(torch.isfinite(lp[cot]).all() and cot.any())
                                         for lp, cot in zip(result.classmate_log_probs, result.cot)])
            cot_logprob = _broadcast_valid_mean(torch.where(has_logprobs, mean_per_row, torch.zeros(())), has_logprobs)
        separated = self.args.classmate.estimator in SEPARATED
        # what upstream's reward shaping did to the main stream: length penalties (per response) and the KL return
        # (per response token), so a user can see both options at work
        penalty = float(shaping["penalty"][main_valid].mean()) if main_valid.any() else 0.0
        kl_return = 0.0
        if shaping["kl_return"] is not None:
            kl_return = float(shaping["kl_return"][shaping["response"]].mean())
        for exp in experiences:
            index = torch.tensor(exp.index)
            rows = len(exp.index)
            if separated:
                # sanity metric: with classmate_partial the classmate advantage must vanish outside the CoT
                classmate_abs = advantages["classmate_advantages"][index, : exp.action_mask.shape[1]].abs()
                on_cot = exp.cot_mask
                outside = exp.action_mask.bool() & ~on_cot
                exp.info["classmate/adv_abs_outside_cot"] = (classmate_abs * outside).sum(-1).float()
                exp.info["classmate/adv_abs_on_cot"] = (
                    (classmate_abs * on_cot).sum(-1) / on_cot.sum(-1).clamp(min=1)
                ).float()
            if cot_logprob is not None:
                # how likely the classmate finds the main CoT, per token (vanilla_classmate's c_t numerator)
                exp.info["classmate/cot_logprob"] = cot_logprob[index]
            exp.info["classmate/reward"] = classmate_reward[index]
            exp.info["classmate/reward_raw"] = classmate_raw_mean[index]
            exp.info["classmate/valid"] = result.valid[index].float()
            exp.info["classmate/main_group_reward_std"] = main_std[index]
            exp.info["classmate/classmate_group_reward_std"] = classmate_std[index]
            exp.info["classmate/cot_tokens"] = cot_masks[index].sum(-1).float()
            exp.info["classmate/stage_time"] = torch.full((rows,), stage_time)
            exp.info["classmate/stage_overlap_time"] = torch.full((rows,), overlap)
            exp.info["classmate/main_length_penalty"] = torch.full((rows,), penalty)
            exp.info["classmate/main_kl_return"] = torch.full((rows,), kl_return)
            for key, value in result.metrics.items():
                exp.info[key] = torch.full((rows,), float(value))


def _stop_on_gae(fn):
    """``fn`` with the algorithm's refusal of ``gae`` turned into the run's one-line stop."""
    from openrlhf_classmate.algo.advantages import GaeWithInvalidScoreError
    from openrlhf_classmate.errors import TrainingStopped

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GaeWithInvalidScoreError as e:
            raise TrainingStopped(str(e)) from None

    return call

"""VR-CLI's completion-likelihood reward in the experience maker.

The ``--vrcli.*`` flag group (:class:`VrcliConfig`; its launch checks are
``integration.experience.reward_methods.validate_vrcli_args``, before Ray) and the group-level reward hook
(:class:`VrcliRewardHook`, built by the controller).

Per rollout batch the hook

1. reads each sample's label (``ground_truth`` = gold next chapter, ``messages`` = the policy prompt,
   ``datapoint_id``, ``baseline_ppl``): the datapoint is found through the label, never by parsing prompt text;
2. extracts the plan from the decoded response (:func:`openrlhf_classmate.algo.vrcli_reward.extract_plan`); a
   response without one is invalid (``--vrcli.missing_plan zero`` scores it 0 instead, ``whole`` takes the whole
   response as its plan, as the released code does);
3. builds the generator input (system, user prompt + plan block, assistant = gold chapter) with the model's chat
   template and runs all of them through the reference-model group in one batched
   ``async_run_method_batch(method_name="forward", ...)`` call, the gold chapter being the "action" span
   (:mod:`openrlhf_classmate.rewards.likelihood`): ZeRO-2 and ZeRO-3 reference actors work unchanged;
4. sets ``sample.rewards`` to the mapped improvement ``100 (PPL_base - PPL_plan) / PPL_base`` (``main_valid`` 0
   where there is no plan, the input is longer than ``--vrcli.max_len``, or a perplexity is not finite: a NaN
   from the reference model is an invalid score, never a ladder rung) and returns the step metrics.

The baseline perplexity comes from the dataset (``setup_data/vrcli_baseline_ppl.py`` writes it, with the model's
name, checksum and dtype; launch and hook check them against the reference model) or, with ``--vrcli.baseline
online``, from the same batched forward (once per datapoint, cached for the rest of the run).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from openrlhf_classmate.algo.vrcli_reward import (
    LADDER_REWARDS,
    LADDER_THRESHOLDS,
    MAPPINGS,
    extract_plan,
    improvement,
    improvement_stats,
    ladder_bucket,
    ladder_bucket_names,
    map_improvement,
    perplexity,
    released_plan,
)
from openrlhf_classmate.config_fields import POSITIVE_INT, Bound
from openrlhf_classmate.data.story_prompts import generator_messages_from_policy_messages
from openrlhf_classmate.errors import TrainingStopped
from openrlhf_classmate.rewards.likelihood import (
    TemplateError,
    effective_ranks,
    generator_inputs,
    gold_mean_nll,
    group_forward,
)

DATA_SOURCE = "vrcli_story"
BASELINE_MODES = ("dataset", "online")
MISSING_PLAN_MODES = ("invalid", "zero", "whole")
PENDING_REWARD_FUNC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pending_reward_func.py")
BASELINE_SCRIPT = "setup_data/vrcli_baseline_ppl.py"


@dataclass
class VrcliConfig:
    """VR-CLI completion-likelihood reward (next-chapter prediction, rows of data_source vrcli_story)."""

    enable: bool = field(
        default=False,
        metadata={"help": "Reward each response by how much its plan (the text after its last 'In summary:') lowers "
                          "the reference model's perplexity of the gold next chapter, computed in the experience "
                          "maker by the reference actors. Needs --algo.kl.init_coef > 0 (that creates the reference "
                          "model) and replaces the engine-side reward function"},
    )
    mapping: str = field(
        default="ladder",
        metadata={"help": "Reward of an improvement I (percent): ladder (the released one: --vrcli.ladder_rewards at "
                          "--vrcli.thresholds), clipped (max(I, 0)) or binary (0 if I < 0 else 1)",
                  "choices": MAPPINGS},
    )
    thresholds: list[float] = field(
        default_factory=lambda: list(LADDER_THRESHOLDS),
        metadata={"help": "Ladder cut-points in percent improvement, strictly increasing (one fewer than "
                          "--vrcli.ladder_rewards; also the bucket edges of the logged counts)",
                  "nargs": "+", "range": None},
    )
    ladder_rewards: list[float] = field(
        default_factory=lambda: list(LADDER_REWARDS),
        metadata={"help": "Ladder rewards below the first cut-point, between cut-points and above the last",
                  "nargs": "+", "range": None},
    )
    baseline: str = field(
        default="dataset",
        metadata={"help": "Where PPL_base comes from: dataset (the rows' baseline_ppl, written by "
                          f"{BASELINE_SCRIPT} with the same model; checked by checksum and dtype at launch) or online "
                          "(computed in the same batched forward, once per datapoint, cached for the run: about "
                          "1/n_samples_per_prompt extra forwards in the first epoch)",
                  "choices": BASELINE_MODES},
    )
    missing_plan: str = field(
        default="invalid",
        metadata={"help": "A response with no plan (no 'In summary:' / 'In summary,' / 'Detailed Plan:' marker, or "
                          "nothing after it): invalid (masked out of the group statistics), zero (a valid reward "
                          "of 0) or whole (the released code: the whole response, or the empty text after a "
                          "trailing marker, is the plan). invalid is the default because the policy is asked to end "
                          "with an 'In summary:' paragraph: under whole a response that skips it is rewarded for its "
                          "entire reasoning as if it were that plan (and makes a longer generator input); use whole "
                          "to reproduce the released runs. Logged: vrcli/no_plan", "choices": MISSING_PLAN_MODES},
    )
    micro_batch_size: int = field(
        default=8, metadata={"help": "Generator sequences per reference forward", "range": POSITIVE_INT}
    )
    max_tokens_per_forward: int = field(
        default=16384,
        metadata={"help": "At most this many padded tokens per reference forward (the float32 logits of a forward "
                          "take 4 x tokens x vocabulary bytes); a longer sequence runs alone. 0 = no limit",
                  "range": Bound(lo=0)},
    )
    max_len: int = field(
        default=0,
        metadata={"help": "Generator sequences (prompt + plan + gold chapter) longer than this many tokens are not "
                          "scored (invalid, logged as vrcli/invalid_too_long). 0 = no limit (the model's context "
                          "must hold them)", "range": Bound(lo=0)},
    )


def add_vrcli_arguments(parser) -> None:
    from openrlhf_classmate.config_fields import add_dataclass_group

    add_dataclass_group(parser, "vrcli", VrcliConfig)


# ── labels and baselines ──


def parse_vrcli_label(label: Any) -> dict:
    """The label dict of a VR-CLI row; ValueError naming the field when it cannot be used."""
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as e:
            raise ValueError(f"label is not JSON ({e.msg})") from None
    if not isinstance(label, dict):
        raise ValueError(f"label must be an object, got {type(label).__name__}")
    if label.get("data_source") != DATA_SOURCE:
        raise ValueError(f"field 'data_source': --vrcli.enable scores rows of data_source {DATA_SOURCE!r}, "
                         f"got {label.get('data_source')!r}")
    for name, kind in (("ground_truth", str), ("messages", list), ("datapoint_id", str)):
        if not isinstance(label.get(name), kind) or not label[name]:
            raise ValueError(f"field '{name}' is missing or empty (rows written by setup_data/vrcli_story.py have it)")
    return label


def baseline_problem(label: dict, model: str, checksum: str | None, dtype: str) -> str | None:
    """Why ``label``'s precomputed baseline cannot be used with this reference model, or None."""
    ppl = label.get("baseline_ppl")
    if ppl is None:
        return (f"datapoint {label['datapoint_id']!r} has no baseline_ppl: run {BASELINE_SCRIPT} --model {model} "
                "on the dataset, or use --vrcli.baseline online")
    if not isinstance(ppl, (int, float)) or not math.isfinite(ppl) or ppl <= 0:
        return f"datapoint {label['datapoint_id']!r}: baseline_ppl must be a positive number, got {ppl!r}"
    if label.get("baseline_checksum") != checksum:
        return (f"datapoint {label['datapoint_id']!r}: baseline_ppl was computed with model "
                f"{label.get('baseline_model')!r} (checksum {str(label.get('baseline_checksum'))[:12]}), but the "
                f"reference model is {model} (checksum {str(checksum)[:12]}): rerun {BASELINE_SCRIPT} --model {model} "
                "on the dataset, or use --vrcli.baseline online")
    if label.get("baseline_dtype") != dtype:
        return (f"datapoint {label['datapoint_id']!r}: baseline_ppl was computed in {label.get('baseline_dtype')} "
                f"but the reference model runs in {dtype} (--ds.param_dtype): rerun {BASELINE_SCRIPT} --dtype "
                f"{dtype}, or use --vrcli.baseline online")
    return None


def check_dataset_baselines(path: str, label_key: str, model: str, checksum: str | None, dtype: str) -> str | None:
    """The first problem of a local jsonl dataset's VR-CLI rows (``path:line: ...``, with a count), or None."""
    from openrlhf_classmate.data.errors import DataError
    from openrlhf_classmate.data.io import iter_file_rows

    first, count = None, 0
    try:
        for location, row in iter_file_rows(path):
            try:
                label = parse_vrcli_label(row.get(label_key))
                problem = baseline_problem(label, model, checksum, dtype)
            except ValueError as e:
                problem = str(e)
            if problem:
                count += 1
                first = first or f"{location}: {problem}"
    except DataError as e:
        return str(e)
    if first and count > 1:
        first += f" ({count} rows of {path} have a problem)"
    return first


def generator_sequence(tokenizer, label: dict, plan: str | None) -> tuple[list[int], int]:
    """Token ids of the generator input of a VR-CLI row (with ``plan``, or the baseline prompt when None) and the
    index of the first gold-chapter token. The hook and the baseline precompute both build it here."""
    try:
        messages = generator_messages_from_policy_messages(label["messages"], plan, label["ground_truth"])
        return generator_inputs(tokenizer, messages)
    except (TemplateError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"datapoint {label.get('datapoint_id')!r}: cannot build the generator input "
                         f"({type(e).__name__}: {e})") from None


# ── the hook ──


@dataclass
class _Row:
    label: dict
    plan: str | None = None
    reason: str | None = None  # why the sample is not scored: no_plan, too_long, nonfinite
    no_plan: bool = False  # no plan marker (or nothing after it); scored on the whole response with missing_plan whole
    item: int = -1  # index of its generator sequence in the forward batch
    baseline_key: tuple | None = None


class VrcliRewardHook:
    """Group-level reward hook (``ClassmateExperienceMaker.reward_hooks``); also scores evaluation samples."""

    scores_eval_samples = True

    def __init__(self, config, tokenizer, *, model: str, param_dtype: str, reference_checksum: str | None,
                 empty_cache: bool = False):
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.param_dtype = param_dtype
        self.reference_checksum = reference_checksum
        self.empty_cache = empty_cache
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.baseline_cache: dict[tuple, float] = {}  # online baselines: the reference model is frozen
        self.invalid_reason: str | None = None
        """Why every sample of the last batch was invalid (the experience maker's skip message), or None."""

    def __call__(self, maker, samples) -> dict[str, float]:
        group = maker.initial_model_group
        if group is None:
            raise _stop("--vrcli.enable needs the reference model group, and this run has none "
                        "(--algo.kl.init_coef > 0 creates it)")
        t_start = time.perf_counter()
        cfg = self.config
        rows = [self._read(sample) for sample in samples]
        items: list[tuple[list[int], int]] = []
        baseline_items: dict[tuple, int] = {}
        for row in rows:
            if row.plan is None:
                continue
            row.item = self._add_item(items, row, row.plan)
            if row.item < 0:
                row.reason = "too_long"
                continue
            if cfg.baseline == "online":
                key = row.baseline_key
                if key not in self.baseline_cache and key not in baseline_items:
                    baseline_items[key] = self._add_item(items, row, None)
        t_forward = time.perf_counter()
        nll = gold_mean_nll(group_forward(group, empty_cache=self.empty_cache), items, pad_id=self.pad_id,
                            micro_batch_size=cfg.micro_batch_size, max_tokens=cfg.max_tokens_per_forward or None,
                            ranks=effective_ranks(group))
        forward_time = time.perf_counter() - t_forward
        for key, index in baseline_items.items():
            ppl = perplexity(nll[index])
            if math.isfinite(ppl) and ppl > 0:  # a non-finite baseline is not cached: its rows are invalid
                self.baseline_cache[key] = ppl

        improvements, ppl_plan, ppl_base = [], [], []
        buckets = [0] * (len(cfg.thresholds) + 1)
        for sample, row in zip(samples, rows):
            valid, reward = False, 0.0
            if row.reason is None:
                base = (self.baseline_cache.get(row.baseline_key, math.nan) if cfg.baseline == "online"
                        else float(row.label["baseline_ppl"]))
                plan = perplexity(nll[row.item])
                value = improvement(base, plan) if base > 0 and math.isfinite(base + plan) else math.nan
                if not math.isfinite(value):
                    row.reason = "nonfinite"  # NaN / inf NLL or baseline: masked like any invalid score
            if row.reason is None:
                reward = map_improvement(value, mapping=cfg.mapping, thresholds=cfg.thresholds,
                                         rewards=cfg.ladder_rewards)
                valid = True
                improvements.append(value)
                ppl_plan.append(plan)
                ppl_base.append(base)
                buckets[ladder_bucket(value, thresholds=cfg.thresholds)] += 1
            elif row.reason == "no_plan" and cfg.missing_plan == "zero":
                valid = True
            _set_reward(sample, reward, valid)

        metrics: dict[str, float] = {f"vrcli/improvement_{k}": v for k, v in improvement_stats(improvements).items()}
        for name, count in zip(ladder_bucket_names(cfg.thresholds), buckets):
            metrics[f"vrcli/ladder_n_{name}"] = float(count)
        reasons = [row.reason for row in rows]
        metrics.update({
            "vrcli/invalid": float(sum(r is not None and not (r == "no_plan" and cfg.missing_plan == "zero")
                                       for r in reasons)),
            "vrcli/no_plan": float(sum(row.no_plan for row in rows)),
            "vrcli/invalid_too_long": float(reasons.count("too_long")),
            "vrcli/invalid_nonfinite": float(reasons.count("nonfinite")),
            "vrcli/reward_forward_time": forward_time,
            "vrcli/reward_time": time.perf_counter() - t_start,
            "vrcli/forward_sequences": float(len(items)),
            "vrcli/baseline_forwards": float(len(baseline_items)),
        })
        if ppl_plan:
            metrics["vrcli/ppl_plan_mean"] = sum(ppl_plan) / len(ppl_plan)
            metrics["vrcli/ppl_base_mean"] = sum(ppl_base) / len(ppl_base)
        self.invalid_reason = self._why_all_invalid(rows) if metrics["vrcli/invalid"] == len(rows) else None
        return metrics

    def _why_all_invalid(self, rows: list[_Row]) -> str:
        """What made every sample of the batch invalid, for the step's skip / stop message (not the judge)."""
        too_long, no_plan = sum(r.reason == "too_long" for r in rows), sum(r.reason == "no_plan" for r in rows)
        parts = []
        if too_long:
            shortest = min(len(generator_sequence(self.tokenizer, r.label, None)[0]) for r in rows)
            parts.append(f"{too_long} generator sequences longer than --vrcli.max_len {self.config.max_len} (without "
                         f"any plan the shortest of this batch is {shortest} tokens: raise --vrcli.max_len, 0 = no "
                         "limit)")
        if no_plan:
            parts.append(f"{no_plan} responses without a plan ('In summary:' marker; --vrcli.missing_plan zero scores "
                         "them 0)")
        return "VR-CLI: " + "; ".join(parts)

    def _read(self, sample) -> _Row:
        try:
            label = parse_vrcli_label(sample.labels[0])
        except ValueError as e:
            raise _stop(f"--vrcli.enable: {e}") from None
        if self.config.baseline == "dataset":
            problem = baseline_problem(label, self.model, self.reference_checksum, self.param_dtype)
            if problem:
                raise _stop(f"--vrcli.baseline dataset: {problem}")
        width = sample.action_mask.shape[1]
        response_ids = sample.sequences[0][-width:][sample.action_mask[0].bool()]
        text = self.tokenizer.decode(response_ids.tolist(), skip_special_tokens=True)
        plan = extract_plan(text)
        no_plan = plan is None
        if no_plan and self.config.missing_plan == "whole":
            plan = released_plan(text)
        row = _Row(label=label, plan=plan, reason="no_plan" if plan is None else None, no_plan=no_plan)
        row.baseline_key = (label["datapoint_id"], label["ground_truth"], json.dumps(label["messages"]))
        return row

    def _add_item(self, items: list, row: _Row, plan: str | None) -> int:
        """Append the generator sequence of ``row`` (with ``plan``, or the baseline prompt when None); -1 if it is
        longer than ``--vrcli.max_len``."""
        try:
            ids, start = generator_sequence(self.tokenizer, row.label, plan)
        except ValueError as e:
            raise _stop(f"--vrcli.enable: {e}") from None
        if self.config.max_len and len(ids) > self.config.max_len:
            return -1
        items.append((ids, start))
        return len(items) - 1


def _set_reward(sample, reward: float, valid: bool) -> None:
    value = torch.tensor([reward], dtype=torch.float32)
    sample.rewards = value
    sample.scores = value.clone()
    sample.info["reward"] = value.clone()
    sample.info["main_valid"] = torch.tensor([1.0 if valid else 0.0])


def _stop(message: str) -> TrainingStopped:
    """The launcher prints a ``TrainingStopped`` as its one ``error:`` line."""
    return TrainingStopped(f"error: {message}")


def build_vrcli_hook(args, tokenizer) -> VrcliRewardHook:
    return VrcliRewardHook(
        args.vrcli, tokenizer, model=args.actor.model_name_or_path, param_dtype=args.ds.param_dtype,
        reference_checksum=getattr(args.vrcli, "reference_checksum", None),
        empty_cache=bool(args.train.colocate_all or args.train.colocate_actor_ref),
    )

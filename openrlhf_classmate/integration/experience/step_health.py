"""Glue between the controller's training step and :mod:`openrlhf_classmate.scoring.judge_health`: read the
per-sample judge numbers the engines attached to the rollout samples (and take them out of the logged info, where
OpenRLHF would average them), and the classmate stage's last scores."""

from __future__ import annotations

from openrlhf_classmate.integration.classmate_config import classmate_enabled, registry_reward_in_use
from openrlhf_classmate.scoring.judge_health import SAMPLE_PREFIX, JudgeTally, step_health, tally, tally_from_logs


class JudgeMissingError(RuntimeError):
    """Judge-scored rows reached a step of a run without a judge."""


def require_judge(rollout_samples, args, judge) -> None:
    """Refuse judge-scored rows when no judge is configured. The preflight finds them in local dataset files; this
    catches the rest (hub datasets) at the first step, instead of training on scores that all failed."""
    from openrlhf_classmate.scoring import LabelError, get_scorer, parse_label, resolve_data_source
    from openrlhf_classmate.scoring.sycophancy import JudgeNotConfiguredError

    if judge is not None or not (registry_reward_in_use(args) or classmate_enabled(args)):
        return
    override = args.classmate.scorer
    names = set()
    for sample in rollout_samples:
        try:
            names.add(resolve_data_source(parse_label(sample.labels[0])["data_source"] if override == "auto"
                                          else override))
        except LabelError:
            continue  # the experience maker reports bad labels with their own message
    for name in sorted(names):
        try:
            getattr(get_scorer(name), "check_config", lambda: None)()
        except JudgeNotConfiguredError:
            raise JudgeMissingError(f"rows of scorer '{name}' are rated by an LLM judge, but no judge is configured: "
                                    "set --classmate.judge_base_url and --classmate.judge_model") from None


def main_tally(rollout_samples) -> JudgeTally | None:
    """The main stream of one step, from the rollout samples' ``info``; None when the main reward is not ours."""
    rows, valid = [], []
    for sample in rollout_samples:
        info = sample.info
        row = {key: float(info.pop(key).flatten()[0]) for key in [k for k in info if k.startswith(SAMPLE_PREFIX)]}
        rows.append(row)
        if "main_valid" in info:
            valid.append(bool(info["main_valid"].flatten()[0] > 0))
    if not valid and not any(rows):
        return None
    return tally_from_logs(rows, valid)


def step_report(main: JudgeTally | None, classmate_stage, judge_client) -> tuple[dict[str, float], str | None]:
    """Metrics and warning of the step that just ran (``classmate_stage`` / ``judge_client`` may be None)."""
    classmate = None
    if classmate_stage is not None:
        results, valid = classmate_stage.last_scores
        classmate_stage.last_scores = ([], [])  # read once: a step without a classmate stage reports none
        replies = judge_client.take_replies() if judge_client is not None else []
        classmate = tally(replies, valid, results)
    return step_health(main, classmate)

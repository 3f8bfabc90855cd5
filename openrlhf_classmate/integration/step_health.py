"""Glue between the controller's training step and :mod:`openrlhf_classmate.scoring.judge_health`: read the
per-sample judge numbers the engines attached to the rollout samples (and take them out of the logged info, where
OpenRLHF would average them), and the classmate stage's last scores."""

from __future__ import annotations

from openrlhf_classmate.scoring.judge_health import SAMPLE_PREFIX, JudgeTally, step_health, tally, tally_from_logs


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
        replies = judge_client.take_replies() if judge_client is not None else []
        classmate = tally(replies, valid, results)
    return step_health(main, classmate)

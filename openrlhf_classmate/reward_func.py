"""Main-answer reward of the scorer registry: the launcher's default ``--reward.remote_url`` (``reward_func``).

The answer is not searched for here. The policy engines run :mod:`openrlhf_classmate.integration.policy_executor`,
which splits each response on its *token ids* with the same function as the classmate stage and evaluation and calls
``reward_func(queries, prompts, labels, answers=[answer])``: ``answer`` is the decoded final answer, ``None`` when the
response has none (no genuine ``</think>`` id), which scores 0 (valid: it is the policy's failure, not the scorer's).
Scores come from the scorer registry, keyed by the label's ``data_source``.

Called without ``answers`` (upstream's text-only executor, e.g. through upstream's own launcher), every score is
invalid and one line says why: decoded text cannot tell a real ``</think>`` id from the same text written as pieces.

Configuration arrives through environment variables set by the launcher (the engine processes get no ``args``):
``OPENRLHF_CLASSMATE_SCORER`` (override of ``data_source``), ``OPENRLHF_CLASSMATE_JUDGE`` (JSON of ``JudgeConfig``
fields for judge scorers), ``OPENRLHF_CLASSMATE_TINYV`` (the TinyV verifier) and ``OPENRLHF_CLASSMATE_SCORER_METRICS``
(the per-sample scorer metrics every sample logs, ``scoring/metrics.py``); the split settings are the executor's.
"""

from __future__ import annotations

import json
import os
import sys

NEEDS_EXECUTOR = ("openrlhf_classmate's reward_func scores the answer split on token ids by its policy executor, "
                  "which passes answers=; start training with python -m openrlhf_classmate.cli.train_ppo_ray")


def _judge():
    raw = os.environ.get("OPENRLHF_CLASSMATE_JUDGE")
    if not raw:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(**json.loads(raw))


_REPORTED: set[str] = set()


def _report(message: str) -> None:
    if message not in _REPORTED:
        _REPORTED.add(message)
        print(f"[openrlhf_classmate.reward_func] scoring failed: {message}", file=sys.stderr, flush=True)


def reward_func(queries, prompts, labels, answers=None, **kwargs):
    """Score ``answers`` (one per query; ``None`` = no final answer) against ``labels``; upstream's reply format."""
    import openrlhf_classmate  # noqa: F401
    from openrlhf_classmate.scoring import score_responses
    from openrlhf_classmate.scoring.metrics import declared_metric_keys, sample_metrics

    metric_keys = declared_metric_keys()  # the same keys for every sample, whatever happens below
    if answers is None or len(answers) != len(queries):
        _report(NEEDS_EXECUTOR if answers is None else f"{len(answers)} answers for {len(queries)} queries")
        return {"rewards": 0.0, "scores": 0.0,
                "extra_logs": {"has_answer": 0.0, **sample_metrics(metric_keys, 0.0, None), "main_valid": 0.0}}
    scorer = os.environ.get("OPENRLHF_CLASSMATE_SCORER", "auto")
    logs = {"has_answer": float(answers[0] is not None)}
    try:
        parsed = [json.loads(label) if isinstance(label, str) else dict(label) for label in labels]
        if scorer != "auto":
            parsed = [{**label, "data_source": scorer} for label in parsed]
        result = score_responses(answers, parsed, judge=_judge())[0]
    except Exception as e:
        # OpenRLHF swallows exceptions raised here and fails later with a misleading message; return an explicit
        # invalid score instead (bad labels are also caught, with their real message, by the experience maker).
        _report(f"{type(e).__name__}: {e}")
        return {"rewards": 0.0, "scores": 0.0,
                "extra_logs": {**logs, **sample_metrics(metric_keys, 0.0, None), "main_valid": 0.0}}
    score = float(result.score) if result.valid else 0.0
    logs.update(sample_metrics(metric_keys, score, result.metrics))
    return {"rewards": score, "scores": score, "extra_logs": {**logs, "main_valid": float(result.valid)}}

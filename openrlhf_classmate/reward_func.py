"""Main-answer reward of the scorer registry: the launcher's default ``--reward.remote_url`` (``reward_func``).

The answer is not searched for here. The policy engines run :mod:`openrlhf_classmate.integration.rollout.policy_executor`,
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

Besides ``main_valid``, each sample's ``extra_logs`` carry its judge calls as numbers (``judge_sample/*``,
see :mod:`openrlhf_classmate.scoring.judge_health`); the controller sums them into the step's judge metrics. At most
``JudgeConfig.max_concurrency`` judge calls run at once in one engine process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading

NEEDS_EXECUTOR = ("openrlhf_classmate's reward_func scores the answer split on token ids by its policy executor, "
                  "which passes answers=; start training with python -m openrlhf_classmate.cli.train_ppo_ray")


def _judge():
    raw = os.environ.get("OPENRLHF_CLASSMATE_JUDGE")
    if not raw:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(**json.loads(raw))


_REPORTED: set[str] = set()
_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _judge_slot(max_concurrency: int):
    """Process-wide limit on judge calls in flight (OpenRLHF calls this function from a thread per sample)."""
    with _SLOTS_LOCK:
        slots = _SLOTS.setdefault(max_concurrency, threading.BoundedSemaphore(max_concurrency))
    return slots


def _report(message: str) -> None:
    if message not in _REPORTED:
        _REPORTED.add(message)
        print(f"[openrlhf_classmate.reward_func] scoring failed: {message}", file=sys.stderr, flush=True)


def reward_func(queries, prompts, labels, answers=None, **kwargs):
    """Score ``answers`` (one per query; ``None`` = no final answer) against ``labels``; upstream's reply format."""
    import openrlhf_classmate  # noqa: F401
    from openrlhf_classmate.scoring import JudgeClient, score_responses
    from openrlhf_classmate.scoring.judge_health import sample_logs
    from openrlhf_classmate.scoring.metrics import declared_metric_keys, sample_metrics

    metric_keys = declared_metric_keys()  # the same keys for every sample, whatever happens below

    def invalid(logs: dict, message: str, replies: list) -> dict:
        _report(message)
        extra = {**logs, **sample_metrics(metric_keys, 0.0, None), "main_valid": 0.0,
                 **sample_logs(replies, None, message)}
        return {"rewards": 0.0, "scores": 0.0, "extra_logs": extra}

    if answers is None or len(answers) != len(queries):
        return invalid({"has_answer": 0.0}, NEEDS_EXECUTOR if answers is None else
                       f"{len(answers)} answers for {len(queries)} queries", [])
    scorer = os.environ.get("OPENRLHF_CLASSMATE_SCORER", "auto")
    logs = {"has_answer": float(answers[0] is not None)}
    judge = _judge()
    client = JudgeClient(judge) if judge is not None else None
    try:
        parsed = [json.loads(label) if isinstance(label, str) else dict(label) for label in labels]
        if scorer != "auto":
            parsed = [{**label, "data_source": scorer} for label in parsed]
        with _judge_slot(judge.max_concurrency) if judge is not None else contextlib.nullcontext():
            result = score_responses(answers, parsed, judge=client)[0]
    except Exception as e:
        # OpenRLHF swallows exceptions raised here and fails later with a misleading message; return an explicit
        # invalid score instead (bad labels are also caught, with their real message, by the experience maker).
        return invalid(logs, f"{type(e).__name__}: {e}", client.take_replies() if client else [])
    score = float(result.score) if result.valid else 0.0
    logs.update(sample_metrics(metric_keys, score, result.metrics))
    judge_logs = sample_logs(client.take_replies() if client else [], result)
    return {"rewards": score, "scores": score, "extra_logs": {**logs, "main_valid": float(result.valid), **judge_logs}}

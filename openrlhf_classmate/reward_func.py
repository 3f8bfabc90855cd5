"""Main-answer reward for OpenRLHF's ``--reward.remote_url <this file>`` (``reward_func(queries, prompts, labels)``).

OpenRLHF loads this file in every rollout engine process and calls it once per sample. The final answer is the text
after the think-close tag; a response without one has no final answer and scores 0 (valid: it is the policy's
failure, not the scorer's). Scores come from the scorer registry, keyed by the label's ``data_source``.

Configuration arrives through environment variables set by the launcher (the engine processes get no ``args``):
``OPENRLHF_CLASSMATE_THINK_CLOSE``, ``OPENRLHF_CLASSMATE_FINAL_ANSWER`` (``after_think`` or ``whole_response``, for
non-thinking policies), ``OPENRLHF_CLASSMATE_STRIP_TOKENS`` (JSON list of special-token strings to drop,
e.g. EOS), ``OPENRLHF_CLASSMATE_SCORER`` (override of ``data_source``), ``OPENRLHF_CLASSMATE_JUDGE`` (JSON of
``JudgeConfig`` fields for judge scorers), ``OPENRLHF_CLASSMATE_TINYV`` (the TinyV verifier) and
``OPENRLHF_CLASSMATE_SCORER_METRICS`` (the per-sample scorer metrics every sample logs, ``scoring/metrics.py``).
"""

from __future__ import annotations

import json
import os
import sys


def final_answer(response: str, think_close: str, strip_tokens: list[str], mode: str = "after_think") -> str | None:
    if mode == "whole_response":
        answer = response
    elif think_close not in response:
        return None
    else:
        answer = response.split(think_close, 1)[1]
    for token in strip_tokens:
        answer = answer.replace(token, "")
    return answer.strip()


def response_text(query: str, prompt: str) -> str:
    # queries are decode(prompt + response); the prompt text normally round-trips exactly
    return query[len(prompt) :] if query.startswith(prompt) else query


def _judge():
    raw = os.environ.get("OPENRLHF_CLASSMATE_JUDGE")
    if not raw:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(**json.loads(raw))


_REPORTED: set[str] = set()


def reward_func(queries, prompts, labels, **kwargs):
    import openrlhf_classmate  # noqa: F401
    from openrlhf_classmate.scoring import score_responses
    from openrlhf_classmate.scoring.metrics import declared_metric_keys, sample_metrics

    think_close = os.environ.get("OPENRLHF_CLASSMATE_THINK_CLOSE", "</think>")
    strip = json.loads(os.environ.get("OPENRLHF_CLASSMATE_STRIP_TOKENS", "[]"))
    scorer = os.environ.get("OPENRLHF_CLASSMATE_SCORER", "auto")
    mode = os.environ.get("OPENRLHF_CLASSMATE_FINAL_ANSWER", "after_think")
    answers = [final_answer(response_text(q, p), think_close, strip, mode) for q, p in zip(queries, prompts)]
    logs = {"has_answer": float(answers[0] is not None)}
    metric_keys = declared_metric_keys()  # the same keys for every sample, whatever happens below
    try:
        parsed = [json.loads(label) if isinstance(label, str) else dict(label) for label in labels]
        if scorer != "auto":
            parsed = [{**label, "data_source": scorer} for label in parsed]
        result = score_responses(answers, parsed, judge=_judge())[0]
    except Exception as e:
        # OpenRLHF swallows exceptions raised here and fails later with a misleading message; return an explicit
        # invalid score instead (bad labels are also caught, with their real message, by the experience maker).
        message = f"{type(e).__name__}: {e}"
        if message not in _REPORTED:
            _REPORTED.add(message)
            print(f"[openrlhf_classmate.reward_func] scoring failed: {message}", file=sys.stderr, flush=True)
        return {"rewards": 0.0, "scores": 0.0,
                "extra_logs": {**logs, **sample_metrics(metric_keys, 0.0, None), "main_valid": 0.0}}
    score = float(result.score) if result.valid else 0.0
    logs.update(sample_metrics(metric_keys, score, result.metrics))
    return {"rewards": score, "scores": score, "extra_logs": {**logs, "main_valid": float(result.valid)}}

"""Main-answer reward for OpenRLHF's ``--reward.remote_url <this file>`` (``reward_func(queries, prompts, labels)``).

OpenRLHF loads this file in every rollout engine process and calls it once per sample. The final answer is the text
after the think-close tag; a response without one has no final answer and scores 0 (valid: it is the policy's
failure, not the scorer's). Scores come from the scorer registry, keyed by the label's ``data_source``.

Configuration arrives through environment variables set by the launcher (the engine processes get no ``args``):
``OPENRLHF_CLASSMATE_THINK_CLOSE``, ``OPENRLHF_CLASSMATE_FINAL_ANSWER`` (``after_think`` or ``whole_response``, for
non-thinking policies), ``OPENRLHF_CLASSMATE_STRIP_TOKENS`` (JSON list of special-token strings to drop,
e.g. EOS), ``OPENRLHF_CLASSMATE_SCORER`` (override of ``data_source``) and ``OPENRLHF_CLASSMATE_JUDGE`` (JSON of
``JudgeConfig`` fields for judge scorers).

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
_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _judge_slot(max_concurrency: int):
    """Process-wide limit on judge calls in flight (OpenRLHF calls this function from a thread per sample)."""
    with _SLOTS_LOCK:
        slots = _SLOTS.setdefault(max_concurrency, threading.BoundedSemaphore(max_concurrency))
    return slots


def reward_func(queries, prompts, labels, **kwargs):
    import openrlhf_classmate  # noqa: F401
    from openrlhf_classmate.scoring import JudgeClient, score_responses
    from openrlhf_classmate.scoring.judge_health import sample_logs

    think_close = os.environ.get("OPENRLHF_CLASSMATE_THINK_CLOSE", "</think>")
    strip = json.loads(os.environ.get("OPENRLHF_CLASSMATE_STRIP_TOKENS", "[]"))
    scorer = os.environ.get("OPENRLHF_CLASSMATE_SCORER", "auto")
    mode = os.environ.get("OPENRLHF_CLASSMATE_FINAL_ANSWER", "after_think")
    answers = [final_answer(response_text(q, p), think_close, strip, mode) for q, p in zip(queries, prompts)]
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
        message = f"{type(e).__name__}: {e}"
        if message not in _REPORTED:
            _REPORTED.add(message)
            print(f"[openrlhf_classmate.reward_func] scoring failed: {message}", file=sys.stderr, flush=True)
        judge_logs = sample_logs(client.take_replies() if client else [], None, message)
        return {"rewards": 0.0, "scores": 0.0, "extra_logs": {**logs, "main_valid": 0.0, **judge_logs}}
    score = float(result.score) if result.valid else 0.0
    judge_logs = sample_logs(client.take_replies() if client else [], result)
    return {"rewards": score, "scores": score, "extra_logs": {**logs, "main_valid": float(result.valid), **judge_logs}}

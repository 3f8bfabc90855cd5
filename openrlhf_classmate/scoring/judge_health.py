"""Per-step judge health: how many judge requests a training step made, how many failed or were retried, their
latency, the valid fraction of both reward streams, and one line naming the first failure.

The main answers are scored inside the rollout engines, one sample per ``reward_func`` call, and OpenRLHF carries
only *numbers* from there to the controller (``extra_logs``, copied into ``experience.info``). So the engine side
encodes each sample's judge calls with :func:`sample_logs` (counts, latency, and the first failure as a
:data:`FAILURE_KINDS` code plus its HTTP status), and the controller decodes them with :func:`tally_from_logs`. The
classmate answers are scored in the controller, where the replies themselves are at hand (:func:`tally`).
:func:`step_health` then turns both tallies into the step's metrics and warning line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from openrlhf_classmate.scoring.judge_client import JudgeReply, percentile
from openrlhf_classmate.scoring.result import ScoreResult

SAMPLE_PREFIX = "judge_sample/"
"""Prefix of the per-sample keys in ``extra_logs``; the controller removes them from the logs after reading them."""

FAILURE_KINDS = (
    "",  # 0: no failure
    "judge HTTP error",
    "judge request timed out",
    "judge connection error",
    "judge returned a malformed reply",
    "judge output has no rating",
    "scorer failed",
)
_HTTP_RE = re.compile(r"judge HTTP (\d{3})")


def failure_kind(reason: str | None) -> tuple[int, int]:
    """(index into FAILURE_KINDS, HTTP status or 0) of a failure reason text; (0, 0) for no failure."""
    if not reason:
        return 0, 0
    m = _HTTP_RE.search(reason)
    if m:
        return 1, int(m.group(1))
    for kind, needle in ((2, "timed out"), (3, "connection error"), (4, "malformed"), (4, "no text content"),
                         (5, "no rating")):
        if needle in reason:
            return kind, 0
    return 6, 0


def describe_failure(kind: int, status: int = 0, retries: int = 0) -> str:
    """The text of a failure decoded from :func:`failure_kind` (what crosses from the engines)."""
    if not 0 < kind < len(FAILURE_KINDS):
        return "unknown failure"
    text = f"judge HTTP {status}" if kind == 1 and status else FAILURE_KINDS[kind]
    if retries:
        text += f" after {retries} retr{'y' if retries == 1 else 'ies'}"
    return text


def sample_logs(replies: Sequence[JudgeReply], result: ScoreResult | None, error: str | None = None
                ) -> dict[str, float]:
    """Engine side: the judge calls of one main-answer score as ``extra_logs`` numbers.

    ``result`` is the sample's score (None when scoring raised, then ``error`` says why). The failure recorded is the
    first failed request's, else the invalid result's reason, else ``error``.
    """
    failed = [r for r in replies if r.error is not None]
    reason = failed[0].error if failed else (error or (result.reason if result is not None and not result.valid
                                                        else None))
    kind, status = failure_kind(reason)
    return {
        f"{SAMPLE_PREFIX}requests": float(len(replies)),
        f"{SAMPLE_PREFIX}failures": float(len(failed)),
        f"{SAMPLE_PREFIX}retries": float(sum(r.retries for r in replies)),
        f"{SAMPLE_PREFIX}latency_s": max((r.latency_s for r in replies), default=0.0),
        f"{SAMPLE_PREFIX}failure_kind": float(kind),
        f"{SAMPLE_PREFIX}failure_status": float(status),
        f"{SAMPLE_PREFIX}failure_retries": float(failed[0].retries if failed else 0),
    }


@dataclass
class JudgeTally:
    """The judge calls and score validity of one reward stream in one step."""

    requests: int = 0
    failures: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    samples: int = 0
    """Samples of this stream that have a validity (all samples of the stream)."""
    valid: int = 0
    first_failure: str | None = None


def tally(replies: Sequence[JudgeReply], valid: Sequence[bool], results: Sequence[ScoreResult] = ()) -> JudgeTally:
    """Controller side: a stream whose judge replies are at hand (the classmate answers).

    ``valid`` is the per-sample validity of the stream; ``results`` the scores that were computed (their reasons
    name a failure that was not a request error, e.g. a rating-less judge reply).
    """
    failed = [r for r in replies if r.error is not None]
    first = failed[0].error if failed else next((r.reason for r in results if not r.valid and r.reason), None)
    return JudgeTally(
        requests=len(replies), failures=len(failed), retries=sum(r.retries for r in replies),
        latencies=[r.latency_s for r in replies], samples=len(valid), valid=sum(bool(v) for v in valid),
        first_failure=first,
    )


def tally_from_logs(rows: Sequence[Mapping[str, float]], valid: Sequence[bool]) -> JudgeTally:
    """Controller side: the main stream, from the per-sample numbers :func:`sample_logs` wrote (one row each)."""
    out = JudgeTally(samples=len(valid), valid=sum(bool(v) for v in valid))
    for row in rows:
        requests = int(row.get(f"{SAMPLE_PREFIX}requests", 0))
        out.requests += requests
        out.failures += int(row.get(f"{SAMPLE_PREFIX}failures", 0))
        out.retries += int(row.get(f"{SAMPLE_PREFIX}retries", 0))
        if requests:
            out.latencies.append(float(row.get(f"{SAMPLE_PREFIX}latency_s", 0.0)))
        kind = int(row.get(f"{SAMPLE_PREFIX}failure_kind", 0))
        if kind and out.first_failure is None:
            out.first_failure = describe_failure(kind, int(row.get(f"{SAMPLE_PREFIX}failure_status", 0)),
                                                 int(row.get(f"{SAMPLE_PREFIX}failure_retries", 0)))
    return out


def step_health(main: JudgeTally | None, classmate: JudgeTally | None) -> tuple[dict[str, float], str | None]:
    """The step's metrics and, when a judge request or a score failed, one warning line (else None).

    Metrics: ``judge/requests``, ``judge/failures``, ``judge/retries``, ``judge/latency_p50`` / ``_p95`` (seconds,
    nearest rank over all requests of both streams; 0 without requests), and ``reward/main_valid_fraction`` /
    ``reward/classmate_valid_fraction`` for the streams present.
    """
    streams = {name: t for name, t in (("main", main), ("classmate", classmate)) if t is not None}
    latencies = [x for t in streams.values() for x in t.latencies if math.isfinite(x)]
    metrics = {
        "judge/requests": float(sum(t.requests for t in streams.values())),
        "judge/failures": float(sum(t.failures for t in streams.values())),
        "judge/retries": float(sum(t.retries for t in streams.values())),
        "judge/latency_p50": percentile(latencies, 50),
        "judge/latency_p95": percentile(latencies, 95),
    }
    for name, t in streams.items():
        if t.samples:
            metrics[f"reward/{name}_valid_fraction"] = t.valid / t.samples
    # Classmate inputs skipped on purpose (empty CoT, over max_context) are invalid but no failure: no warning.
    troubled = {name: t for name, t in streams.items() if t.failures or t.first_failure}
    if not troubled:
        return metrics, None
    invalid = " and ".join(f"{t.samples - t.valid}/{t.samples} {name}" for name, t in streams.items() if t.samples)
    parts = [f"{invalid} scores invalid (masked)"]
    if metrics["judge/failures"]:
        parts.append(f"{int(metrics['judge/failures'])} of {int(metrics['judge/requests'])} judge requests failed "
                     f"({int(metrics['judge/retries'])} retries)")
    first = next(((name, t.first_failure) for name, t in troubled.items() if t.first_failure), None)
    if first:
        parts.append(f"first failure ({first[0]} answer): {first[1][:300]}")
    return metrics, "judge health: " + "; ".join(parts)

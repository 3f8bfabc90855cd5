"""Per-sample scorer metrics that the engine-side reward function logs (``extra_logs``).

OpenRLHF merges the ``extra_logs`` of a rollout batch key by key and fails when a key is missing from some samples,
so the set of keys must not depend on the row's scorer or on whether scoring succeeded. The launcher therefore
declares the keys of the run up front in ``OPENRLHF_CLASSMATE_SCORER_METRICS`` (a JSON list); the reward function
writes every declared key for every sample: the scorer's value (``ScoreResult.metrics``) where it has one, else the
default below (0: the event did not happen for this sample; each key is a per-sample count or rate, so its logged
mean is the per-step rate).

``validation_reward`` is special: the reward this sample would get at validation (TinyV scores validation with weight
1, whatever the training weight). It defaults to the training reward, and the trainer's evaluation reads it instead
of the reward when it is declared.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

METRICS_ENV = "OPENRLHF_CLASSMATE_SCORER_METRICS"
VALIDATION_REWARD = "validation_reward"


def declared_metric_keys() -> list[str]:
    """The metric keys this run declared (empty when none)."""
    raw = os.environ.get(METRICS_ENV)
    return list(json.loads(raw)) if raw else []


def sample_metrics(keys: list[str], score: float, metrics: Mapping[str, float] | None) -> dict[str, float]:
    """Every declared key: the scorer's value, else the default (the score for ``validation_reward``, else 0)."""
    metrics = metrics or {}
    out = {}
    for key in keys:
        default = score if key == VALIDATION_REWARD else 0.0
        out[key] = float(metrics.get(key, default))
    return out

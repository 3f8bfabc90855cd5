"""Per-step judge health: the engine-side encoding of each main score's judge calls (through a real local judge
server), its decoding and aggregation in the controller, the warning line, and the concurrency limit of the engine's
reward function."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch

from openrlhf_classmate.integration.experience.step_health import main_tally, step_report
from openrlhf_classmate.reward_func import reward_func
from openrlhf_classmate.scoring import JudgeClient, JudgeConfig, JudgeReply, ScoreResult, score_responses
from openrlhf_classmate.scoring.judge_health import (
    SAMPLE_PREFIX,
    JudgeTally,
    describe_failure,
    failure_kind,
    sample_logs,
    step_health,
    tally,
    tally_from_logs,
)
from openrlhf_classmate.testing.judge_server import serve_judge

LABEL = {"data_source": "helpful_instructions", "raw_question_for_monitor": "Is my plan good?"}


def _judge_env(monkeypatch, server, **fields):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_JUDGE", json.dumps(
        {"base_url": server.base_url, "model": "fake-judge", "backoff_s": 0.01, **fields}))


@pytest.mark.parametrize("reason, kind, status", [
    ("judge HTTP 503: fake error 503 (gave up after 3 retries)", 1, 503),
    ("judge request failed: judge HTTP 429: slow down", 1, 429),
    ("judge request timed out after 60s", 2, 0),
    ("judge connection error: ClientConnectorError: refused", 3, 0),
    ("judge returned a malformed chat-completions body: '<html>'", 4, 0),
    ("judge output has no rating: 'I cannot decide'", 5, 0),
    ("math-verify timed out after 5s", 2, 0),
    ("sycophancy_judge scorer raised KeyError: 'x'", 6, 0),
    (None, 0, 0),
])
def test_failure_reasons_survive_the_trip_as_numbers(reason, kind, status):
    assert failure_kind(reason) == (kind, status)
    if kind == 1:
        assert describe_failure(kind, status, 2) == f"judge HTTP {status} after 2 retries"


def test_reward_func_reports_each_judge_call(monkeypatch):
    with serve_judge() as server:
        _judge_env(monkeypatch, server, max_retries=2)
        ok = reward_func(["P:<think> x </think> sure"], ["P:"], [json.dumps(LABEL)], answers=["sure"])
        down = reward_func(["P:<think> x </think> no [[fake:status=503]]"], ["P:"], [json.dumps(LABEL)],
                           answers=["no [[fake:status=503]]"])
        flaky = reward_func(["P:<think> x </think> hm [[fake:status=500x1]]"], ["P:"], [json.dumps(LABEL)],
                            answers=["hm [[fake:status=500x1]]"])
        no_answer = reward_func(["P:<think> never closed"], ["P:"], [json.dumps(LABEL)], answers=[None])
        statuses = list(server.statuses)
    logs = ok["extra_logs"]
    assert ok["extra_logs"]["main_valid"] == 1.0 and 1 <= ok["rewards"] <= 10
    assert logs[f"{SAMPLE_PREFIX}requests"] == 1 and logs[f"{SAMPLE_PREFIX}failures"] == 0
    assert logs[f"{SAMPLE_PREFIX}latency_s"] > 0 and logs[f"{SAMPLE_PREFIX}failure_kind"] == 0
    logs = down["extra_logs"]
    assert down["rewards"] == 0.0 and logs["main_valid"] == 0.0  # invalid, never a real 0
    assert (logs[f"{SAMPLE_PREFIX}requests"], logs[f"{SAMPLE_PREFIX}failures"], logs[f"{SAMPLE_PREFIX}retries"]) == (
        1, 1, 2)
    assert (logs[f"{SAMPLE_PREFIX}failure_kind"], logs[f"{SAMPLE_PREFIX}failure_status"]) == (1, 503)
    logs = flaky["extra_logs"]
    assert logs["main_valid"] == 1.0 and logs[f"{SAMPLE_PREFIX}retries"] == 1 and logs[f"{SAMPLE_PREFIX}failures"] == 0
    assert no_answer["extra_logs"][f"{SAMPLE_PREFIX}requests"] == 0  # no final answer: no judge call, a valid 0
    assert statuses == [200, 503, 503, 503, 500, 200]
    for out in (ok, down, flaky, no_answer):  # OpenRLHF turns every extra_logs value into a tensor
        assert all(isinstance(v, float) for v in out["extra_logs"].values())


def test_reward_func_honours_the_judge_concurrency_limit(monkeypatch):
    with serve_judge() as server:
        _judge_env(monkeypatch, server, max_concurrency=2)
        threads = [threading.Thread(target=reward_func, args=(
            [f"P:<think> x </think> answer {i} [[fake:sleep=0.3]]"], ["P:"], [json.dumps(LABEL)]),
            kwargs={"answers": [f"answer {i} [[fake:sleep=0.3]]"]}) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(server.requests) == 6 and server.max_in_flight == 2


def _sample(**info):
    return SimpleNamespace(info={k: torch.tensor([float(v)]) for k, v in info.items()})


def test_main_tally_reads_and_removes_the_per_sample_numbers():
    ok = sample_logs([JudgeReply("RATING: 5", latency_s=0.2)], ScoreResult(5.0))
    bad = sample_logs([JudgeReply(None, error="judge HTTP 503: down (gave up after 1 retries)", latency_s=0.4,
                                  retries=1)], ScoreResult.invalid("judge request failed: judge HTTP 503"))
    samples = [_sample(main_valid=1, **ok), _sample(main_valid=0, **bad), _sample(main_valid=1, reward=3)]
    main = main_tally(samples)
    assert (main.requests, main.failures, main.retries, main.samples, main.valid) == (2, 1, 1, 3, 2)
    assert main.latencies == pytest.approx([0.2, 0.4]) and main.first_failure == "judge HTTP 503 after 1 retry"
    assert all(not k.startswith(SAMPLE_PREFIX) for s in samples for k in s.info)  # not averaged into the logs
    assert "main_valid" in samples[0].info and "reward" in samples[2].info
    assert main_tally([_sample(reward=1)]) is None  # a reward that is not ours: no main stream


def test_step_health_metrics_and_the_warning_line():
    main = JudgeTally(requests=16, failures=16, retries=16, latencies=[0.01] * 16, samples=16, valid=0,
                      first_failure="judge HTTP 503 after 1 retry")
    classmate = tally([JudgeReply(None, error="judge HTTP 503: x", latency_s=1.0, retries=1)] * 4, [False] * 16)
    metrics, warning = step_health(main, classmate)
    assert metrics == {
        "judge/requests": 20.0, "judge/failures": 20.0, "judge/retries": 20.0,
        "judge/latency_p50": 0.01, "judge/latency_p95": 1.0,
        "reward/main_valid_fraction": 0.0, "reward/classmate_valid_fraction": 0.0,
    }
    assert warning == ("judge health: 16/16 main and 16/16 classmate scores invalid (masked); 20 of 20 judge "
                       "requests failed (20 retries); first failure (main answer): judge HTTP 503 after 1 retry")
    healthy = JudgeTally(requests=4, latencies=[0.1, 0.2, 0.3, 0.4], samples=4, valid=4)
    skipped = tally([], [True, False], [ScoreResult(3.0)])  # a classmate input skipped on purpose: no failure
    metrics, warning = step_health(healthy, skipped)
    assert warning is None and metrics["judge/latency_p50"] == 0.2 and metrics["judge/latency_p95"] == 0.4
    assert metrics["reward/classmate_valid_fraction"] == 0.5
    rating_less = tally([JudgeReply("no idea", latency_s=0.1)], [False],
                        [ScoreResult.invalid("judge output has no rating: 'no idea'")])
    _, warning = step_health(None, rating_less)
    assert warning.endswith("first failure (classmate answer): judge output has no rating: 'no idea'")
    assert step_health(None, None) == ({"judge/requests": 0.0, "judge/failures": 0.0, "judge/retries": 0.0,
                                        "judge/latency_p50": 0.0, "judge/latency_p95": 0.0}, None)


def test_classmate_stream_from_the_controllers_judge_client():
    """What ``ClassmatePPOTrainer.train_step`` does after the classmate stage scored its answers."""
    with serve_judge() as server:
        client = JudgeClient(JudgeConfig(base_url=server.base_url, model="fake-judge", max_retries=0))
        results = score_responses(["fine", "bad [[fake:status=502]]"], [LABEL, LABEL], judge=client)
    stage = SimpleNamespace(last_scores=(results, [r.valid for r in results]))
    metrics, warning = step_report(None, stage, client)
    assert metrics["judge/requests"] == 2 and metrics["judge/failures"] == 1
    assert metrics["reward/classmate_valid_fraction"] == 0.5
    assert "first failure (classmate answer): judge HTTP 502" in warning
    assert client.take_replies() == []  # taken once per step
    assert tally_from_logs([], []).requests == 0


def test_a_judge_scored_step_without_a_judge_stops_the_run():
    """Hub datasets escape the preflight's file scan; the first step refuses them instead of training on failures."""
    from openrlhf_classmate.integration.experience.step_health import JudgeMissingError, require_judge
    from openrlhf_classmate.integration.launch.args import parse_args

    args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "org/hub-data",
                       "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1"])
    judged = [SimpleNamespace(labels=[json.dumps(LABEL)])]
    with pytest.raises(JudgeMissingError, match="scorer 'sycophancy_judge'.*--classmate.judge_base_url"):
        require_judge(judged, args, None)
    require_judge(judged, args, JudgeConfig(base_url="http://127.0.0.1:9/v1", model="j"))
    require_judge([SimpleNamespace(labels=[json.dumps({"data_source": "gsm8k", "ground_truth": "1"})])], args, None)

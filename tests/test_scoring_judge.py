"""The OpenAI-compatible judge client and the sycophancy judge scorer, against a real HTTP server on 127.0.0.1."""

import asyncio
import socket
import time

import pytest

from openrlhf_classmate.scoring import (
    JudgeClient,
    JudgeConfig,
    JudgeNotConfiguredError,
    LabelError,
    SycophancyJudgeScorer,
    build_judge_prompt,
    parse_judge_rating,
    score_responses,
)
from openrlhf_classmate.scoring.judge_client import percentile
from openrlhf_classmate.testing.judge_server import FakeJudgeServer, default_rating, serve_judge


def _config(server, **overrides):
    fields = {"base_url": server.base_url, "model": "judge-x", "api_key_env": None, "timeout_s": 5.0,
              "max_retries": 3, "backoff_s": 0.01}
    return JudgeConfig(**{**fields, **overrides})


def _label(question="Is my plan good?", source="helpful_instructions"):
    return {"data_source": source, "ground_truth": None, "raw_question_for_monitor": question}


def test_ratings_are_parsed_and_the_server_receives_the_configured_request():
    async def run():
        async with FakeJudgeServer() as server:
            cfg = _config(server, temperature=0.3, max_tokens=77,
                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            scorer = SycophancyJudgeScorer(cfg)
            results = await scorer.ascore([
                ("Great plan! [[fake:rating=7]]", _label()),
                ("It has flaws.", _label("Rate my poem", "anthropic_hh_rlhf")),
            ])
            return server, results

    server, results = asyncio.run(run())
    assert results[0].valid and results[0].score == 7.0 and results[0].extracted == "7"
    assert results[0].explanation == "fake judge verdict."
    expected_prompt = build_judge_prompt("Rate my poem", "It has flaws.")
    assert results[1].score == float(default_rating(expected_prompt))
    body = server.requests[1]
    assert body["model"] == "judge-x"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 77
    assert body["messages"] == [{"role": "user", "content": expected_prompt}]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_defaults_are_temperature_0_and_1024_tokens():
    cfg = JudgeConfig(base_url="http://127.0.0.1:1/v1", model="m")
    assert (cfg.temperature, cfg.max_tokens, cfg.max_concurrency, cfg.api_key_env) == (0.0, 1024, 32, "OPENAI_API_KEY")


def test_api_key_is_read_from_the_environment_at_request_time(monkeypatch):
    async def run(server):
        client = JudgeClient(_config(server, api_key_env="SCORING_TEST_JUDGE_KEY"))
        monkeypatch.delenv("SCORING_TEST_JUDGE_KEY", raising=False)
        await client.chat(["a"])
        monkeypatch.setenv("SCORING_TEST_JUDGE_KEY", "sk-test")
        await client.chat(["b"])

    async def main():
        async with FakeJudgeServer() as server:
            await run(server)
            return server.headers

    headers = asyncio.run(main())
    assert "Authorization" not in headers[0]
    assert headers[1]["Authorization"] == "Bearer sk-test"


def test_failures_become_invalid_results_with_reasons_and_the_stats_count_them():
    responses = [
        "fine [[fake:rating=3]]",
        "flaky [[fake:status=500x2]] [[fake:rating=8]]",  # two 500s, then an answer
        "reset once [[fake:drop=1]] [[fake:rating=9]]",  # connection dropped once, then an answer
        "always dropped [[fake:drop]]",
        "garbage [[fake:garbage]]",
        "malformed [[fake:malformed]]",
        "slow [[fake:sleep=5]]",
        "refused [[fake:status=404]]",
        None,  # no final answer: no request
    ]
    with serve_judge() as server:
        client = JudgeClient(_config(server, timeout_s=0.5))
        start = time.monotonic()
        results = score_responses(responses, [_label(f"q{i}") for i in range(len(responses))], judge=client)
        elapsed = time.monotonic() - start
        n_requests = len(server.requests)
    scores = [(r.valid, r.score) for r in results]
    assert scores[:3] == [(True, 3.0), (True, 8.0), (True, 9.0)]
    assert [v for v, _ in scores[3:8]] == [False] * 5
    assert all(r.score == 0.0 and r.reason for r in results[3:8])
    assert "connection error" in results[3].reason and "gave up after 3 retries" in results[3].reason
    assert results[4].reason.startswith("judge output has no rating")
    assert "malformed" in results[5].reason
    assert "timed out after 0.5s" in results[6].reason
    assert "HTTP 404" in results[7].reason
    assert results[8].valid and results[8].score == 0.0 and results[8].explanation == "no final answer"
    stats = client.stats
    assert stats.calls == 8  # the None response was never sent
    assert stats.failures == 4  # dropped, malformed, slow, 404 (garbage arrived fine; it is the parser's failure)
    assert stats.retries == 2 + 1 + 3
    assert n_requests == 8 + stats.retries
    assert 0.5 <= stats.latency_p99 < 5.0 and stats.latency_p50 < 0.5
    assert elapsed < 5.0  # the 5 s sleeper was abandoned at its 0.5 s timeout


def test_concurrency_bound_is_respected_and_a_batch_of_256_completes():
    async def run():
        async with FakeJudgeServer(latency_s=0.02) as server:
            client = JudgeClient(_config(server, max_concurrency=8))
            replies = await client.chat([f"prompt {i} [[fake:rating={1 + i % 10}]]" for i in range(256)])
            return server, client, replies

    server, client, replies = asyncio.run(run())
    assert len(replies) == 256 and all(r.error is None for r in replies)
    assert [parse_judge_rating(r.text).rating for r in replies] == [1 + i % 10 for i in range(256)]
    assert server.max_in_flight == 8  # reached, never exceeded
    assert len(server.requests) == 256
    assert client.stats.calls == 256 and client.stats.failures == 0 and client.stats.retries == 0
    assert client.stats.wall_s >= 256 / 8 * 0.02


def test_retries_back_off_outside_the_concurrency_bound():
    async def run():
        async with FakeJudgeServer() as server:
            client = JudgeClient(_config(server, max_concurrency=2, backoff_s=0.05))
            replies = await client.chat([f"p{i} [[fake:status=503x1]]" for i in range(6)])
            return server, client, replies

    server, client, replies = asyncio.run(run())
    assert all(r.error is None and r.retries == 1 for r in replies)
    assert server.max_in_flight <= 2
    assert client.stats.retries == 6


def test_an_unreachable_judge_gives_invalid_results_not_zeros():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2, backoff_s=0.01, timeout_s=2)
    results = score_responses(["hello", "world"], [_label(), _label()], judge=cfg)
    assert [r.valid for r in results] == [False, False]
    assert all("connection error" in r.reason and "gave up after 2 retries" in r.reason for r in results)


def test_a_judge_source_without_a_judge_config_says_what_to_set():
    with pytest.raises(JudgeNotConfiguredError, match=r"judge config \(base_url, model\)"):
        score_responses(["hello"], [_label()])


def test_missing_question_is_a_label_error_before_any_request():
    with serve_judge() as server:
        labels = [_label(), {"data_source": "helpful_instructions", "ground_truth": None}]
        with pytest.raises(LabelError) as err:
            score_responses(["a", "b"], labels, judge=_config(server))
        assert server.requests == []
    assert err.value.field == "raw_question_for_monitor" and err.value.index == 1
    assert "label #1" in str(err.value) and "'helpful_instructions'" in str(err.value)


@pytest.mark.parametrize(
    "text,rating,explanation",
    [
        ("RATING: 7\nEXPLANATION: Mostly flattering.", 7, "Mostly flattering."),
        ("rating:10\nexplanation: lower-case label", 10, "No explanation provided."),
        ("RATING: 12\nEXPLANATION: over", 10, "over"),  # clamped to [1, 10]
        ("RATING: 0\nEXPLANATION: under", 1, "under"),
        ("RATING: [7]\nEXPLANATION: bracketed", 7, "bracketed"),  # via the standalone-number fallback
        ("I would give it 8 out of 10.", 8, "No explanation provided."),
        ("<think>maybe RATING: 2</think>\nRATING: 9\nEXPLANATION: thought first", 9, "thought first"),
        ("Score: 42", None, "Score: 42"),
        ("no numbers at all", None, "no numbers at all"),
        # a thinking judge cut off by its token limit: no rating, whatever numbers its thinking held
        ("<think>\nThe user asks for 3 tips on sleeping. RATING: 2 fits", None,
         "<think>\nThe user asks for 3 tips on sleeping. RATING: 2 fits"),
    ],
)
def test_parse_judge_rating(text, rating, explanation):
    parsed = parse_judge_rating(text)
    assert (parsed.rating, parsed.explanation) == (rating, explanation)


def test_judge_config_rejects_bad_values():
    with pytest.raises(ValueError, match="http"):
        JudgeConfig(base_url="127.0.0.1:8000/v1", model="m")
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeConfig(base_url="http://x/v1", model="m", max_concurrency=0)


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50.0, 90.0, 99.0)
    assert percentile([], 50) == 0.0 and percentile([3.0], 99) == 3.0

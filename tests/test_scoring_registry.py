"""The data_source registry, label parsing and the batch entry point ``score_responses``."""

import asyncio

import pytest

from openrlhf_classmate import scoring
from openrlhf_classmate.scoring import (
    BaseScorer,
    LabelError,
    ScoreResult,
    UnknownDataSourceError,
    ascore_responses,
    get_scorer,
    known_data_sources,
    parse_label,
    register_scorer,
    resolve_data_source,
    score_responses,
)


@pytest.mark.parametrize(
    "data_source,canonical",
    [
        ("gsm8k", "gsm8k"),
        ("openai/gsm8k", "gsm8k"),
        ("hendrycks_math", "hendrycks_math"),
        ("EleutherAI/hendrycks_math", "hendrycks_math"),
        ("math_verify", "math_verify"),
        ("cais/mmlu", "mmlu_sycophancy"),
        ("mmlu_sycophancy_new", "mmlu_sycophancy"),
        ("TIGER-Lab/MMLU-Pro", "mmlu_pro_sycophancy"),
        ("helpful_instructions", "sycophancy_judge"),
        ("anthropic_hh_rlhf", "sycophancy_judge"),
        ("exact_match", "exact_match"),
        ("arithmetic", "arithmetic"),
    ],
)
def test_names_and_aliases_resolve_exactly(data_source, canonical):
    assert resolve_data_source(data_source) == canonical
    assert get_scorer(data_source).name == canonical


@pytest.mark.parametrize("data_source", ["GSM8K", "tiger-lab/mmlu-pro", "my_mmlu_copy", "gsm8k ", ""])
def test_no_substring_or_case_insensitive_matching(data_source):
    with pytest.raises(UnknownDataSourceError) as err:
        resolve_data_source(data_source)
    message = str(err.value)
    assert "python -m openrlhf_classmate.scoring --list" in message and "exact, case-sensitive" in message
    assert err.value.field == "data_source" and err.value.data_source == data_source
    assert isinstance(err.value, ValueError)


def test_the_unknown_name_message_is_one_short_line_naming_the_closest_match_and_the_list_command():
    # it used to list every registered name and alias (800+ characters)
    with pytest.raises(UnknownDataSourceError) as err:
        resolve_data_source("gsm8kk")
    message = str(err.value)
    assert "Did you mean 'gsm8k'?" in message and "python -m openrlhf_classmate.scoring --list" in message
    assert "\n" not in message and len(message) < 300, message
    assert "TIGER-Lab/MMLU-Pro" not in message and "hendrycks_math" not in message


def test_the_list_command_prints_every_registered_name(capsys):
    from openrlhf_classmate.scoring.__main__ import main

    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, canonical in known_data_sources().items():
        assert any(line.split()[0] == canonical and name in line for line in out.splitlines()), name
    assert "_tinyv" in out  # the suffix rule


def test_unknown_names_get_a_suggestion():
    with pytest.raises(UnknownDataSourceError, match=r"Did you mean 'TIGER-Lab/MMLU-Pro'\? \(names are case"):
        resolve_data_source("tiger-lab/mmlu-pro")
    with pytest.raises(UnknownDataSourceError, match=r"Did you mean 'hendrycks_math'\?"):
        resolve_data_source("hendrycks_mat")


def test_mixed_batch_is_grouped_by_scorer_and_returned_in_input_order():
    responses = [
        "so \\boxed{72}",
        "Therefore, the answer is (B).",
        "The result is 12",
        "  Paris. ",
        None,
        "48 + 24 = 72",
        "1,000 then 41",
        "a total of 3.50 dollars",
    ]
    labels = [
        {"data_source": "openai/gsm8k", "ground_truth": "72"},
        '{"data_source": "cais/mmlu", "ground_truth": "B", "actual_ground_truth": "A"}',
        {"data_source": "arithmetic", "ground_truth": 12},
        {"data_source": "exact_match", "ground_truth": "paris"},
        {"data_source": "gsm8k", "ground_truth": "5"},
        {"data_source": "gsm8k", "ground_truth": "73"},
        {"data_source": "arithmetic", "ground_truth": "41"},
        {"data_source": "exact_match", "ground_truth": "3.5", "numeric": True},
    ]
    results = score_responses(responses, labels)
    assert [r.score for r in results] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert all(r.valid for r in results)
    assert results[4] == ScoreResult(score=0.0, valid=True, explanation="no final answer")
    assert [r.extracted for r in results[:3]] == ["72", "B", "12"]


@pytest.mark.parametrize(
    "response,ground_truth,score",
    [
        ("3 + 4 = 7", 7, 1.0),
        ("The answer is -15.", "-15", 1.0),
        ("12.0", 12, 1.0),
        ("12.5", 12, 0.0),
        ("1,234", 1234, 1.0),
        ("7 apples, then 8", 7, 0.0),  # the last integer counts
        ("no number", 3, 0.0),
        ("12345678901234567890123", "12345678901234567890123", 1.0),  # exact, beyond float precision
        ("12345678901234567890124", "12345678901234567890123", 0.0),
    ],
)
def test_arithmetic(response, ground_truth, score):
    [result] = score_responses([response], [{"data_source": "arithmetic", "ground_truth": ground_truth}])
    assert result.valid and result.score == score


@pytest.mark.parametrize(
    "response,label,score",
    [
        ("Paris", {"ground_truth": "Paris"}, 1.0),
        ("  the  Eiffel tower. ", {"ground_truth": "The Eiffel Tower"}, 1.0),
        ("Lyon", {"ground_truth": "Paris"}, 0.0),
        ("It is 0.5000001", {"ground_truth": "0.5", "numeric": True}, 1.0),
        ("It is 1/2", {"ground_truth": "0.5", "numeric": True}, 0.0),  # numeric mode reads the last number: 2
        ("\\boxed{1/2}", {"ground_truth": "1/2", "numeric": True}, 1.0),  # a box is read as gsm8k reads it
        ("\\boxed{12} (checked 3 times)", {"ground_truth": "12", "numeric": True}, 1.0),
        ("about 2,500 km", {"ground_truth": 2500, "numeric": True}, 1.0),
    ],
)
def test_exact_match(response, label, score):
    [result] = score_responses([response], [{"data_source": "exact_match", **label}])
    assert result.valid and result.score == score


@pytest.mark.parametrize(
    "label,field,data_source,fragment",
    [
        ("not json", None, None, "not valid JSON"),
        ("", None, None, "--data.label_key"),
        ("[1, 2]", None, None, "JSON object"),
        ({"ground_truth": "1"}, "data_source", None, "data_source"),
        ({"data_source": "gsm8k"}, "ground_truth", "gsm8k", "missing"),
        ({"data_source": "openai/gsm8k", "ground_truth": None}, "ground_truth", "openai/gsm8k", "missing"),
        ({"data_source": "hendrycks_math", "ground_truth": ["1"]}, "ground_truth", "hendrycks_math", "not a string"),
        ({"data_source": "arithmetic", "ground_truth": "2.5"}, "ground_truth", "arithmetic", "not an integer"),
        ({"data_source": "exact_match", "ground_truth": "x", "numeric": True}, "ground_truth", "exact_match",
         "not a number"),
        ({"data_source": "anthropic_hh_rlhf"}, "raw_question_for_monitor", "anthropic_hh_rlhf", "missing"),
        ({"data_source": "nope", "ground_truth": "1"}, "data_source", "nope", "no scorer"),
    ],
)
def test_bad_labels_raise_one_clear_error(label, field, data_source, fragment):
    good = {"data_source": "gsm8k", "ground_truth": "1"}
    with pytest.raises(LabelError) as err:
        score_responses(["1", "1"], [good, label])
    e = err.value
    assert e.index == 1 and e.field == field and e.data_source == data_source
    assert str(e).startswith("label #1") and fragment in str(e)
    if field:
        assert f"field {field!r}" in str(e)
    if data_source:
        assert f"data_source {data_source!r}" in str(e)


def test_verl_style_labels_with_a_reward_model_dict_are_flattened():
    label = {"data_source": "gsm8k", "reward_model": {"style": "rule", "ground_truth": "72"}}
    assert parse_label(label)["ground_truth"] == "72"
    assert score_responses(["\\boxed{72}"], [label])[0].score == 1.0


def test_lengths_must_match():
    with pytest.raises(ValueError, match="2 responses but 1 labels"):
        score_responses(["a", "b"], [{"data_source": "gsm8k", "ground_truth": "1"}])


def test_score_responses_works_inside_a_running_event_loop():
    async def caller():
        # sync API called from async code: runs on a helper thread instead of re-entering this loop
        sync = score_responses(["\\boxed{3}"], [{"data_source": "gsm8k", "ground_truth": "3"}])
        awaited = await ascore_responses(["\\boxed{4}"], [{"data_source": "gsm8k", "ground_truth": "3"}])
        return sync[0].score, awaited[0].score

    assert asyncio.run(caller()) == (1.0, 0.0)


class _LengthScorer(BaseScorer):
    name = "length_test"

    def score_answer(self, response, label):
        return ScoreResult(score=float(len(response)))


def test_register_scorer_adds_names_refuses_duplicates_and_can_replace():
    register_scorer("length_test", lambda judge: _LengthScorer(), aliases=("org/length-test",))
    try:
        assert known_data_sources()["org/length-test"] == "length_test"
        assert score_responses(["abc"], [{"data_source": "org/length-test"}])[0].score == 3.0
        with pytest.raises(ValueError, match="already registered"):
            register_scorer("other", lambda judge: _LengthScorer(), aliases=("gsm8k",))
        register_scorer("length_test", lambda judge: _LengthScorer(), replace=True)
        assert "org/length-test" not in known_data_sources()
    finally:
        scoring.registry._NAMES.pop("length_test", None)
        scoring.registry._ENTRIES.pop("length_test", None)
    assert "length_test" not in known_data_sources()


def test_scorer_exceptions_become_invalid_results_not_crashes():
    class Broken(BaseScorer):
        name = "broken"

        def score_answer(self, response, label):
            raise RuntimeError("boom")

    [result] = Broken().score([("x", {"data_source": "broken"})])
    assert not result.valid and result.reason == "broken scorer raised RuntimeError: boom"

"""The engine-side main reward function: final-answer extraction and registry scoring, configured by env vars."""

import json

import pytest

from openrlhf_classmate.reward_func import final_answer, response_text, reward_func


def test_final_answer_is_the_text_after_think_close_without_special_tokens():
    assert final_answer("<think> 1 + 2 </think>\n\n 3 <eos>", "</think>", ["<eos>"]) == "3"
    assert final_answer("<think> never closed <eos>", "</think>", ["<eos>"]) is None
    assert final_answer("3 <eos>", "</think>", ["<eos>"], mode="whole_response") == "3"
    assert response_text("PROMPT then response", "PROMPT") == " then response"
    assert response_text("other", "PROMPT") == "other"


@pytest.mark.parametrize(
    "mode, response, expected",
    [("after_think", "<think> 4 </think> 7<eos>", (1.0, 1.0)), ("after_think", "<think> 7 <eos>", (0.0, 0.0)),
     ("whole_response", "7<eos>", (1.0, 1.0))],
)
def test_reward_func_scores_with_the_registry(monkeypatch, mode, response, expected):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_STRIP_TOKENS", json.dumps(["<eos>"]))
    monkeypatch.setenv("OPENRLHF_CLASSMATE_FINAL_ANSWER", mode)
    label = json.dumps({"data_source": "arithmetic", "ground_truth": "7"})
    out = reward_func(["P:" + response], ["P:"], [label])
    assert (out["rewards"], out["scores"]) == expected
    assert out["extra_logs"]["main_valid"] == 1.0
    assert out["extra_logs"]["has_answer"] == (0.0 if expected == (0.0, 0.0) else 1.0)


def test_reward_func_scorer_override_and_bad_label(monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SCORER", "exact_match")
    out = reward_func(["P:<think> x </think> seven"], ["P:"], [json.dumps({"data_source": "gsm8k",
                                                                           "ground_truth": "seven"})])
    assert out["rewards"] == 1.0
    monkeypatch.delenv("OPENRLHF_CLASSMATE_SCORER")


def test_a_scoring_failure_is_an_explicit_invalid_score_not_an_exception(capsys):
    # raising here would be swallowed by OpenRLHF's executor and resurface as an unrelated error
    out = reward_func(["P:<think> x </think> 1"], ["P:"], [json.dumps({"data_source": "nope", "ground_truth": "1"})])
    assert out["rewards"] == 0.0 and out["extra_logs"]["main_valid"] == 0.0
    assert "'nope'" in capsys.readouterr().err

"""The engine-side main reward function: registry scoring of the answers the policy executor split on token ids
(``tests/test_response_split.py`` runs it inside the engine), configured by env vars."""

import json

import pytest

from openrlhf_classmate.reward_func import reward_func

ARITHMETIC = json.dumps({"data_source": "arithmetic", "ground_truth": "7"})


@pytest.mark.parametrize("answer, expected", [("7", 1.0), ("8", 0.0), ("so 7", 1.0), (None, 0.0)])
def test_reward_func_scores_the_given_answer_with_the_registry(answer, expected):
    out = reward_func(["P:<think> 4 </think> 7"], ["P:"], [ARITHMETIC], answers=[answer])
    assert (out["rewards"], out["scores"]) == (expected, expected)
    # no answer is the policy's failure: a valid 0, not an invalid score
    logs = {k: v for k, v in out["extra_logs"].items() if not k.startswith("judge_sample/")}  # no judge: zeros
    assert logs == {"has_answer": float(answer is not None), "main_valid": 1.0}
    assert out["extra_logs"]["judge_sample/requests"] == 0.0


def test_the_query_text_is_never_searched():
    # the query says "</think> 7", but the executor found no genuine close-tag id: no answer
    out = reward_func(["P:<think> 4 </think> 7"], ["P:"], [ARITHMETIC], answers=[None])
    assert out["rewards"] == 0.0 and out["extra_logs"]["has_answer"] == 0.0


def test_reward_func_scorer_override(monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SCORER", "exact_match")
    label = json.dumps({"data_source": "gsm8k", "ground_truth": "seven"})
    assert reward_func(["q"], ["P:"], [label], answers=["Seven."])["rewards"] == 1.0


def test_a_scoring_failure_is_an_explicit_invalid_score_not_an_exception(capsys):
    # raising here would be swallowed by OpenRLHF's executor and resurface as an unrelated error
    out = reward_func(["q"], ["P:"], [json.dumps({"data_source": "nope", "ground_truth": "1"})], answers=["1"])
    assert out["rewards"] == 0.0 and (out["extra_logs"]["has_answer"], out["extra_logs"]["main_valid"]) == (1.0, 0.0)
    assert "'nope'" in capsys.readouterr().err


def test_without_answers_every_score_is_invalid_and_one_line_says_why(capsys, monkeypatch):
    """Called by upstream's text-only executor (e.g. through upstream's own launcher): nothing to score safely."""
    import openrlhf_classmate.reward_func as module

    monkeypatch.setattr(module, "_REPORTED", set())  # once per process: an earlier test may have printed it
    for _ in range(3):
        out = reward_func(["P:<think> 4 </think> 7"], ["P:"], [ARITHMETIC])
        assert out["rewards"] == 0.0 and out["extra_logs"]["has_answer"] == 0.0 and out["extra_logs"]["main_valid"] == 0.0
    err = capsys.readouterr().err
    assert err.count("scoring failed") == 1 and "python -m openrlhf_classmate.cli.train_ppo_ray" in err

"""TinyV (rule verdict, then the LLM verifier), its rubric-grading variant and the ``grade`` scorer: prompts,
extraction, parsers, and all three modes against a real verifier server on 127.0.0.1 (true / false / garbage /
slow / down), with the exact request payload checked."""

import asyncio
import json
import socket

import pytest

from openrlhf_classmate.scoring import LabelError, get_scorer, resolve_data_source, score_responses, tinyv
from openrlhf_classmate.scoring.metrics import METRICS_ENV
from openrlhf_classmate.scoring.registry import UnknownDataSourceError
from openrlhf_classmate.scoring.tinyv import (
    CONFIG_ENV,
    GradeScorer,
    TinyVConfig,
    TinyVScorer,
    configure_tinyv,
    tinyv_config,
)
from openrlhf_classmate.scoring.tinyv_prompts import (
    RUBRIC_PROMPT,
    TINYV_PROMPT,
    TINYV_QWEN3_PROMPT,
    extract_answer,
    fill,
    parse_total_score,
    parse_verdict,
    verifier_settings,
)
from openrlhf_classmate.testing.fake_servers import FakeVerifierServer
from openrlhf_classmate.testing.servers import serve_in_thread

QUESTION = "What is 1/2 + 1/4? Let's think step by step and output the final answer within \\boxed{}."

# The verifier prompt of TinyV-1.5B for (QUESTION, "3/4", "0.75"), written out in full.
EXPECTED_PROMPT = (
    "You are an AI tasked with identifying false negatives in answer verification. A false negative occurs when a "
    "model's answer is essentially correct but is marked as incorrect due to minor discrepancies or formatting issues. "
    "Your job is to analyze the given question, ground truth answer, and model answer to determine if the model's "
    "answer is actually correct despite appearing different from the ground truth.\n\n"
    f"<question>{QUESTION}</question>\n\n"
    "<ground_truth_answer>3/4</ground_truth_answer>\n\n"
    "<model_answer>0.75</model_answer>\n\n"
    "Return \"True\" if the model's answer is correct, otherwise return \"False\"."
)


def _label(gt="3/4", source="bigmath_tinyv", **extra):
    return {"data_source": source, "ground_truth": gt, "question": QUESTION, **extra}


@pytest.fixture(autouse=True)
def _no_discovered_models():
    """Every test discovers its verifier's model afresh: the scorer caches the id per URL for the process, and a
    port the kernel hands out again (``_closed_port``, a new server) would otherwise find an earlier test's server's
    id (CI: the down-verifier test got a cached id, skipped discovery and failed on the chat request instead)."""
    tinyv._discovered.clear()
    yield
    tinyv._discovered.clear()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(server=None, **overrides):
    fields = {"base_url": server.base_url if server else f"http://127.0.0.1:{_closed_port()}/v1",
              "timeout_s": 5.0, "backoff_s": 0.01}
    return TinyVConfig(**{**fields, **overrides})


def _score(config, items, validation=False):
    return asyncio.run(TinyVScorer(config, validation=validation).ascore(items))


# ── prompts, extraction, parsers ──


def test_the_verifier_prompt_is_tinyv_s_template_filled_by_string_replacement():
    assert fill(TINYV_PROMPT, question=QUESTION, ground_truth="3/4", model_answer="0.75") == EXPECTED_PROMPT
    qwen3 = fill(TINYV_QWEN3_PROMPT, question="Q", ground_truth="G", model_answer="A")
    assert qwen3 == (
        "You are an AI tasked with identifying if the model's answer is correct compared to the ground truth answer "
        "despite appearing different from the ground truth.\n\n<question>Q</question>\n\n<ground_truth_answer>G"
        "</ground_truth_answer>\n\n<model_answer>A</model_answer>\n\nReturn \"True\" if the model's answer is "
        "correct, otherwise return \"False\".")
    rubric = fill(RUBRIC_PROMPT, question="Q", criteria="C", model_answer="A")
    assert rubric.startswith("You are a grading teacher. Based on the following information, please evaluate the "
                             "student's submitted answer. The total score is out of 10 points.")
    assert rubric.endswith("answer. Then give a fair and reasonable score according to the grading criteria.\n"
                           "Here is the information:\n\n\nQuestion:\nQ\n\n\n\nScoring Criteria:\nC\n\n\n\n"
                           "Student's Answer:\nA\n\n")


@pytest.mark.parametrize("text, answer", [
    ("So the sum is \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
    ("The answer is 0.75. I am sure", "0.75"),
    ("Answer: x = 12", "12"),
    ("12 is the answer", "12"),
    ("we get 7", "7"),
    ("Total: 5\nwhich is\n9", "9"),
    ("\\boxed{a = 3} and the answer: 5", "5"),
    ("0.75", "0.75"),
])
def test_answer_extraction_follows_prime_math_s_trimming(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("text, think, verdict", [
    ("True", False, 1.0), (" false ", False, 0.0), ("True or False", False, 1.0), ("Maybe.", False, None),
    ("<think>it is true</think>\nFalse", True, 0.0), ("reasoning... Answer: True", True, 1.0),
    ("the answer is true", True, None),  # a reasoning verifier without Answer: / </think> gave no verdict
])
def test_verdict_parsing(text, think, verdict):
    assert parse_verdict(text, think) == verdict


@pytest.mark.parametrize("text, score", [
    ("Good work.\nTotal Score: 7/10", 0.7), ("**Total Score**: [8 points / 10", 0.8),
    ("Total Score: [8] / 10", None),  # ']' is not among the deleted characters, ("Total Score: 12", 1.0),
    ("Total Score: 3\nTotal Score: 6/10", 0.6), ("Total Score: 'seven'", None), ("no score here", None),
    ("Total Score: 7\nbecause it is ok", None),  # no '/': the whole rest is not a number (the reference's rule)
    ("Total Score: nan/10", None),
    ("Total Score: -20/10", None), ("Total Score: -1e100/10", None),  # below the 0-10 scale: no score (a grading
    # of -20 gave the grade reward (1 - |s - gt|)^2 = 2.25 > 1, and -1e100 an infinite float32 reward)
    ("Total Score: 0/10", 0.0),
])
def test_total_score_parsing(text, score):
    assert parse_total_score(text) == (pytest.approx(score) if score is not None else None)


def test_per_model_settings():
    s, known = verifier_settings("zhangchenxu/TinyV-1.5B")
    assert known and (s.template, s.max_tokens, s.temperature, s.top_p, s.think) == (TINYV_PROMPT, 8, 0.0, 1.0, False)
    s, known = verifier_settings("/ckpt/tinyv-qwen3-1.7b-think")  # served from a local path
    assert known and s.template == TINYV_QWEN3_PROMPT and s.max_tokens == 512 and s.think
    s, known = verifier_settings("my-org/my-qwen3-verifier")
    assert not known and s.template == TINYV_QWEN3_PROMPT and s.max_tokens == 8 and not s.think


# ── the three modes against a real server ──


def _says_true_to(answer):
    return lambda prompt, attempt: "True" if f"<model_answer>{answer}</model_answer>" in prompt else "False"


def test_addon_asks_only_when_the_rule_says_wrong_and_sends_the_exact_payload():
    with serve_in_thread(FakeVerifierServer(reply=_says_true_to("3 quarters"))) as server:
        results = _score(_config(server, weight=0.5), [
            ("\\boxed{\\frac{3}{4}}", _label()),  # rule right: 1, no call
            ("So the value is \\boxed{0.75}", _label()),  # rule: math-verify says 0.75 = 3/4 too
            ("The answer is three quarters", _label("3/4")),  # rule wrong, verifier False
            ("The answer is 3 quarters", _label("3/4")),  # rule wrong, verifier True: rescued
        ])
    rewards = [r.score for r in results]
    assert rewards == [1.0, 1.0, 0.0, 0.5]  # rescued at weight 0.5
    assert [r.metrics["tinyv/verifier_called"] for r in results] == [0, 0, 1, 1]
    assert [r.metrics["tinyv/rescued"] for r in results] == [0, 0, 0, 1]
    assert [r.metrics["tinyv/rule_correct"] for r in results] == [1, 1, 0, 0]
    assert [r.metrics["validation_reward"] for r in results] == [1.0, 1.0, 0.0, 1.0]  # weight 1 at validation
    assert len(server.requests) == 2
    sent = {r["messages"][0]["content"]: r for r in server.requests}
    body = sent[fill(TINYV_PROMPT, question=QUESTION, ground_truth="3/4", model_answer="three quarters")]
    assert body == {"model": "zhangchenxu/TinyV-1.5B", "temperature": 0.0, "max_tokens": 8, "top_p": 1.0,
                    "messages": [{"role": "user", "content": body["messages"][0]["content"]}]}
    assert results[2].extracted == "three quarters"


def test_the_exact_prompt_for_an_extracted_answer():
    with serve_in_thread(FakeVerifierServer(reply="True")) as server:
        results = _score(_config(server, mode="tinyv_only"), [("We get 0.75. Done", _label("3/4"))])
    assert server.requests[0]["messages"] == [{"role": "user", "content": EXPECTED_PROMPT}]
    assert results[0].score == 1.0 and results[0].metrics["tinyv/rule_correct"] == 1.0


def test_tinyv_only_always_asks_and_rewards_the_verdict():
    with serve_in_thread(FakeVerifierServer(reply=lambda prompt, attempt: "False")) as server:
        results = _score(_config(server, mode="tinyv_only"), [
            ("\\boxed{\\frac{3}{4}}", _label()), ("\\boxed{5}", _label())])
    assert [r.score for r in results] == [0.0, 0.0]  # the verifier overrules even a rule-correct answer
    assert len(server.requests) == 2
    assert [r.metrics["tinyv/rule_correct"] for r in results] == [1.0, 0.0]


def test_mixed_weighs_verdict_and_rule():
    def reply(prompt, attempt):
        return "True" if "<model_answer>5</model_answer>" in prompt else "False"

    with serve_in_thread(FakeVerifierServer(reply=reply)) as server:
        results = _score(_config(server, mode="mixed", weight=0.25), [
            ("\\boxed{3/4}", _label()),  # P 1, V 0: 0.75
            ("\\boxed{5}", _label()),  # P 0, V 1: 0.25
            ("\\boxed{6}", _label()),  # P 0, V 0: 0
        ])
        validation = _score(_config(server, mode="mixed", weight=0.25), [("\\boxed{5}", _label())], validation=True)
    assert [r.score for r in results] == pytest.approx([0.75, 0.25, 0.0])
    assert [r.metrics["validation_reward"] for r in results] == pytest.approx([0.0, 1.0, 0.0])
    assert validation[0].score == 1.0  # validation uses weight 1
    assert len(server.requests) == 4


def test_the_rule_verdict_is_math_verify_and_help_and_readme_name_the_substitute():
    """TinyV's rule verdict P is Prime Math's grader; ours is math-verify (not a port): the flag's help and the README
    say so, since it decides when addon asks the verifier and the (1 - w) P term of mixed."""
    import dataclasses
    from pathlib import Path

    from openrlhf_classmate.config_fields import option_help
    from openrlhf_classmate.scoring.math import MathVerifyScorer

    assert isinstance(TinyVScorer(TinyVConfig(base_url="http://127.0.0.1:1/v1")).rule, MathVerifyScorer)
    mode = next(f for f in dataclasses.fields(TinyVConfig) if f.name == "mode")
    for text in (option_help(mode), Path(__file__).parent.parent.joinpath("README.md").read_text()):
        text = " ".join(text.split())  # README lines wrap anywhere
        assert "math-verify" in text and "substitute for TinyV's Prime Math grader" in text


def test_garbage_is_retried_at_temperature_0_3_then_invalid_never_0():
    with serve_in_thread(FakeVerifierServer(reply="I am not sure.")) as server:
        results = _score(_config(server, max_retries=3), [("\\boxed{7}", _label())])
    r = results[0]
    assert not r.valid and "no verdict" in r.reason and "gave up after 3 retries" in r.reason
    assert r.metrics["tinyv/verifier_failed"] == 1.0 and r.metrics["tinyv/verifier_called"] == 1.0
    assert [(b["temperature"], b["top_p"]) for b in server.requests] == [(0.0, 1.0)] + [(0.3, 1.0)] * 3


def test_a_retry_that_succeeds_gives_the_verdict():
    with serve_in_thread(FakeVerifierServer(reply=lambda p, attempt: "True" if attempt == 2 else "hmm",
                                            fail_first=0)) as server:
        results = _score(_config(server), [("\\boxed{7}", _label())])
    assert results[0].valid and results[0].score == 1.0 and len(server.requests) == 3
    with serve_in_thread(FakeVerifierServer(reply="True", fail_first=1)) as server:  # HTTP 500 once
        results = _score(_config(server), [("\\boxed{7}", _label())])
    assert results[0].valid and results[0].score == 1.0 and len(server.requests) == 2


def test_a_slow_verifier_times_out_once_and_the_sample_is_invalid():
    with serve_in_thread(FakeVerifierServer(reply="True", latency_s=3.0)) as server:
        results = _score(_config(server, timeout_s=1.0), [("\\boxed{7}", _label())])
    assert not results[0].valid and "timed out" in results[0].reason
    assert len(server.requests) == 1  # not retried
    with serve_in_thread(FakeVerifierServer(reply="True", latency_s=0.2)) as server:
        results = _score(_config(server, timeout_s=5.0), [("\\boxed{7}", _label())])
    assert results[0].valid and results[0].score == 1.0


def test_a_verifier_that_is_down_makes_the_sample_invalid():
    results = _score(_config(model="zhangchenxu/TinyV-1.5B", max_retries=2), [("\\boxed{7}", _label()),
                                                                              ("\\boxed{3/4}", _label())])
    assert not results[0].valid and "connection" in results[0].reason.lower()
    assert results[1].valid and results[1].score == 1.0  # the rule answered: no call needed
    results = _score(_config(), [("\\boxed{7}", _label())])  # no model name: discovery fails
    assert not results[0].valid and "/models" in results[0].reason


def test_the_model_and_its_settings_come_from_v1_models():
    server = FakeVerifierServer(model="zhangchenxu/TinyV-Qwen3-1.7B-Think",
                                reply="<think>hmm</think>\nAnswer: True")
    with serve_in_thread(server):
        results = _score(_config(server), [("\\boxed{0.75}", _label("4/5"))])
    body = server.requests[0]
    assert body["model"] == "zhangchenxu/TinyV-Qwen3-1.7B-Think" and body["max_tokens"] == 512
    assert body["messages"][0]["content"].startswith("You are an AI tasked with identifying if the model's answer")
    assert results[0].score == 1.0


def test_no_final_answer_is_a_valid_0_without_a_call():
    with serve_in_thread(FakeVerifierServer()) as server:
        results = _score(_config(server), [(None, _label())])
    assert results[0].valid and results[0].score == 0.0 and not server.requests
    assert results[0].metrics["tinyv/verifier_called"] == 0.0


# ── rubric grading and the grade data source ──


def test_rubric_rows_are_graded_with_the_rubric_prompt():
    label = _label(criteria="1 point per correct step")
    with serve_in_thread(FakeVerifierServer(reply="Fine.\nTotal Score: 8/10")) as server:
        results = _score(_config(server, mode="tinyv_only"), [("First 1/2, then 1/4, so \\boxed{3/4}", label)])
        addon = _score(_config(server), [("\\boxed{1}", label)])
    assert results[0].score == pytest.approx(0.8) and addon[0].score == pytest.approx(0.8)
    full = fill(RUBRIC_PROMPT, question=QUESTION, criteria="1 point per correct step",
                model_answer="First 1/2, then 1/4, so \\boxed{3/4}")
    assert server.requests[0] == {"model": "zhangchenxu/TinyV-1.5B", "temperature": 0.0, "max_tokens": 2048,
                                  "top_p": 1.0, "messages": [{"role": "user", "content": full}]}
    # addon: the rule ran first (wrong), the grader saw the extracted answer
    assert server.requests[1]["messages"][0]["content"].endswith("Student's Answer:\n1\n\n")
    rubric_only = {"data_source": "rrm_tinyv", "question": "Q", "criteria": "C"}  # no ground truth needed
    with serve_in_thread(FakeVerifierServer(reply="Total Score: 11/10")) as server:
        assert _score(_config(server, mode="tinyv_only"), [("essay", rubric_only)])[0].score == 1.0


def test_grade_rewards_the_distance_to_the_reference_score_and_counts_parse_failures():
    scorer = GradeScorer()
    label = {"data_source": "grade", "ground_truth": "0.5"}
    results = scorer.score([("Total Score: 7/10", label), ("Total Score: 5/10", label), ("I give it a B", label),
                            (None, label)])
    assert results[0].score == pytest.approx((1 - 0.2) ** 2) and results[1].score == 1.0
    # the policy's format failure is a valid 0 (reward_methods.md: assign 0, log the parse-fail rate)
    assert results[2].valid and results[2].score == 0.0 and results[2].metrics == {"grade/parse_failed": 1.0}
    assert results[3].valid and results[3].score == 0.0 and results[3].metrics == {"grade/parse_failed": 0.0}
    with pytest.raises(LabelError, match="ground_truth"):
        scorer.score([("Total Score: 1", {"data_source": "grade", "ground_truth": "7"})])


# ── registry, configuration, labels ──


def test_tinyv_data_sources_route_to_the_tinyv_scorer():
    for name in ("bigmath_tinyv", "bigmath_rl_tinyv", "HardVerify-Math", "numina_tinyv", "tinyv"):
        assert resolve_data_source(name) == "tinyv"
    assert resolve_data_source("deepscaler") == "math_verify" and resolve_data_source("grade") == "grade"
    with pytest.raises(UnknownDataSourceError, match="ending in _tinyv"):
        resolve_data_source("tinyv_bigmath")


def test_an_unconfigured_verifier_is_named_before_any_work(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    configure_tinyv(None)
    with pytest.raises(LabelError, match=r"--tinyv.base_url"):
        score_responses(["\\boxed{1}"], [_label()])
    monkeypatch.setenv(CONFIG_ENV, json.dumps({"base_url": "http://127.0.0.1:9/v1", "mode": "mixed", "weight": 0.5}))
    cfg = tinyv_config()
    assert cfg.base_url == "http://127.0.0.1:9/v1" and cfg.mode == "mixed" and cfg.weight == 0.5
    assert isinstance(get_scorer("bigmath_tinyv"), TinyVScorer)
    with pytest.raises(LabelError, match="question"):
        score_responses(["\\boxed{1}"], [{"data_source": "bigmath_tinyv", "ground_truth": "1"}])


def test_the_reward_function_logs_the_declared_metrics_for_every_sample(monkeypatch):
    from openrlhf_classmate.reward_func import reward_func

    keys = ["tinyv/verifier_called", "tinyv/verifier_failed", "tinyv/rescued", "tinyv/rule_correct",
            "validation_reward"]
    monkeypatch.setenv(METRICS_ENV, json.dumps(keys))
    with serve_in_thread(FakeVerifierServer()) as server:
        monkeypatch.setenv(CONFIG_ENV, json.dumps({"base_url": server.base_url, "weight": 0.5}))
        rescued = reward_func(["P:<think>x</think> the answer is 3"], ["P:"], [json.dumps(_label("3"))],
                              answers=["the answer is 3"])
        other = reward_func(["P:<think>x</think> 4"], ["P:"], [json.dumps({"data_source": "arithmetic",
                                                                            "ground_truth": "4"})], answers=["4"])
        broken = reward_func(["P:<think>x</think> 4"], ["P:"], [json.dumps({"data_source": "bigmath_tinyv"})],
                             answers=["4"])
        unsplit = reward_func(["P:<think>x</think> 4"], ["P:"], [json.dumps(_label("4"))])  # no executor
    assert rescued["rewards"] == 1.0  # math-verify reads "the answer is 3" too: rule right
    assert rescued["extra_logs"]["tinyv/rule_correct"] == 1.0
    assert other["rewards"] == 1.0 and other["extra_logs"]["validation_reward"] == 1.0  # the training reward
    assert other["extra_logs"]["tinyv/verifier_called"] == 0.0
    assert broken["extra_logs"]["main_valid"] == 0.0
    assert unsplit["extra_logs"]["main_valid"] == 0.0
    for out in (rescued, other, broken, unsplit):  # the same keys whatever happened: OpenRLHF merges them per key
        assert set(keys) <= set(out["extra_logs"])


# ── launcher: flags, checks, what reaches the engines, validation at weight 1 ──


def _parse(*extra):
    from openrlhf_classmate.integration.launch.args import parse_args

    return parse_args(["--actor.model_name_or_path", "tiny", *extra])


@pytest.mark.parametrize("extra, message", [
    (["--tinyv.mode", "mixed"], "needs --tinyv.base_url"),
    (["--tinyv.base_url", "127.0.0.1:8001"], "http(s) URL"),
    (["--tinyv.base_url", "http://h:1/v1", "--tinyv.weight", "1.5"], "[0, 1]"),
    (["--tinyv.base_url", "http://h:1/v1", "--tinyv.mode", "tinyv_only", "--tinyv.weight", "0.5"],
     "no effect with --tinyv.mode tinyv_only"),
    (["--tinyv.base_url", "http://h:1/v1", "--reward.remote_url", "http://rm:5000/get_reward"], "--reward.remote_url"),
    (["--tinyv.base_url", "http://h:1/v1", "--tinyv.mode", "sometimes"], "invalid choice"),
])
def test_bad_tinyv_options_are_refused_with_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(*extra)
    text = str(e.value) + capsys.readouterr().err  # argparse's own choice errors go to stderr
    assert message in text


def test_the_engines_get_the_verifier_settings_and_the_declared_metrics():
    from openrlhf_classmate.integration.experience.reward_methods import reward_method_env

    args = _parse("--tinyv.base_url", "http://127.0.0.1:8001/v1", "--tinyv.mode", "mixed", "--tinyv.weight", "0.3")
    env = reward_method_env(args)
    assert json.loads(env[CONFIG_ENV])["mode"] == "mixed" and json.loads(env[CONFIG_ENV])["weight"] == 0.3
    assert json.loads(env[METRICS_ENV]) == ["tinyv/verifier_called", "tinyv/verifier_failed", "tinyv/rescued",
                                            "tinyv/rule_correct", "validation_reward", "grade/parse_failed"]
    assert reward_method_env(_parse()) == {}  # nothing declared: no extra keys in any run without TinyV
    assert json.loads(reward_method_env(_parse("--classmate.main_scorer", "grade"))[METRICS_ENV]) == [
        "grade/parse_failed"]


def test_evaluation_reads_the_validation_reward():
    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience
    from openrlhf_classmate.integration.experience.reward_methods import use_validation_rewards

    rescued = ClassmateExperience(rewards=torch.tensor([0.3]), info={"validation_reward": torch.tensor([1.0])})
    plain = ClassmateExperience(rewards=torch.tensor([0.5]), info={})
    use_validation_rewards([rescued, plain])
    assert rescued.rewards.tolist() == [1.0] and plain.rewards.tolist() == [0.5]


def test_the_trainer_s_evaluation_uses_the_validation_rewards():
    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience
    from openrlhf_classmate.integration.experience.reward_methods import evaluate_with_validation_rewards

    class Generator:
        def generate_eval_samples(self, **kwargs):
            return [ClassmateExperience(rewards=torch.tensor([0.5]), info={"validation_reward": torch.tensor([1.0])})]

    generator = Generator()
    evaluate_with_validation_rewards(generator)
    assert generator.generate_eval_samples(n_samples_per_prompt=1)[0].rewards.tolist() == [1.0]

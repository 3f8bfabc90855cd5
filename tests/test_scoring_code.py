"""The ``code`` / ``code_stdio`` scorers against a real sandbox service on 127.0.0.1 (real programs, real verdicts),
and their failure policy: an unreachable or refusing service makes the sample invalid, never a 0."""

import json
import os

import pytest

from openrlhf_classmate.ports import free_port
from openrlhf_classmate.reward_func import reward_func
from openrlhf_classmate.scoring import (
    CodeSandboxConfig,
    CodeScorer,
    LabelError,
    extract_program,
    get_scorer,
    resolve_data_source,
    score_responses,
)
from openrlhf_classmate.testing.sandbox_service import running_service

UID_BASE = 40000 + (os.getpid() % 1000) * 8 + 6  # apart from tests/test_sandbox.py's services
FLAGS = ["--max-concurrency", "2", "--memory-mb", "192", "--max-processes", "16", "--max-time-limit", "10",
         "--uid-base", str(UID_BASE)]


@pytest.fixture(scope="module")
def service():
    with running_service(*FLAGS) as handle:
        yield handle


def _answer(code: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{code}\n```\nDone."


ADD_TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def test_extract_program_takes_the_last_complete_block():
    assert extract_program("```python\nx = 1\n```\ntext\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_program("```\nplain\n```") == "plain\n"
    assert extract_program("```python\nfirst\n```\n```python\nunclosed (truncated output)") == "first\n"
    assert extract_program("no code here") is None and extract_program("`inline` only") is None

    # an example call or its output after the program is not the program
    program = "def add(a, b):\n    return a + b\n"
    assert extract_program(f"```python\n{program}```\nExample:\n```\n>>> add(1, 2)\n3\n```") == program
    assert extract_program(f"```python\n{program}```\nOutput:\n```text\n3\n```") == program
    script = "n = int(input())\nprint(n * 2)\n"
    assert extract_program(f"```python\n{script}```\nRun it:\n```bash\npython solve.py < in.txt\n```") == script
    assert extract_program(f"```python\n{program}```\n```python\n{script}```") == script  # the last program


def test_registry_and_label_checks():
    assert resolve_data_source("code") == "code" and resolve_data_source("code_stdio") == "code_stdio"
    code, stdio = get_scorer("code"), get_scorer("code_stdio")
    assert isinstance(code, CodeScorer) and code.stdio is False and stdio.stdio is True
    code.check_label({"data_source": "code", "tests": ["assert f() == 1"], "max_execution_time": 2})
    stdio.check_label({"data_source": "code_stdio", "tests": [{"input": "1", "output": "2"}]})
    bad = [
        (code, {"data_source": "code"}, "field 'tests': missing or not a non-empty list"),
        (code, {"data_source": "code", "tests": []}, "field 'tests'"),
        (code, {"data_source": "code", "tests": [3]}, "test 0 is not a non-empty string"),
        (stdio, {"data_source": "code_stdio", "tests": ["assert 1"]}, 'test 0 is not an object {"input": str'),
        (stdio, {"data_source": "code_stdio", "tests": [{"input": "1"}]}, "test 0 is not an object"),
        (code, {"data_source": "code", "tests": ["assert 1"], "max_execution_time": 0}, "'max_execution_time'"),
        (code, {"data_source": "code", "tests": ["assert 1"], "max_execution_time": True}, "number of seconds >= 0.1"),
    ]
    for scorer, label, message in bad:
        with pytest.raises(LabelError, match=message.replace("(", r"\(").replace("{", r"\{")):
            scorer.check_label(label)
    with pytest.raises(LabelError, match=r"label #1, data_source 'code', field 'tests'"):
        score_responses(["a", "b"], [{"data_source": "code", "tests": ["assert 1"]}, {"data_source": "code"}])


def test_fraction_all_or_nothing_and_stdio(service):
    scorer = CodeScorer("code", CodeSandboxConfig(url=service.url))
    strict = CodeScorer("code", CodeSandboxConfig(url=service.url, reward="all_or_nothing"))
    label = {"data_source": "code", "tests": ADD_TESTS}
    right = _answer("def add(a, b):\n    return a + b")
    half = _answer("def add(a, b):\n    return a + b if a >= 0 else 99")  # fails add(-1, 1) only
    results = scorer.score([(right, label), (half, label), ("I don't know.", label), (None, label)])
    assert [r.score for r in results] == [1.0, 0.75, 0.0, 0.0] and all(r.valid for r in results)
    assert results[0].extracted == "def add(a, b):\n    return a + b\n"
    assert results[1].explanation == "3/4 tests passed; test 2: assertion (AssertionError in the test)"
    assert results[2].explanation == "no fenced code block in the answer"
    assert results[3].is_no_final_answer
    assert scorer.stats == {"requests": 2, "failures": 0, "retries": 0, "no_code_block": 1}
    assert [r.score for r in strict.score([(right, label), (half, label)])] == [1.0, 0.0]

    stdio = CodeScorer("code_stdio", CodeSandboxConfig(url=service.url))
    stdio_label = {"data_source": "code_stdio",
                   "tests": [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4", "output": "6"}]}
    got = stdio.score([(_answer("a, b = map(int, input().split())\nprint(a + b)"), stdio_label),
                       (_answer("print(5)", lang=""), stdio_label)])
    assert [r.score for r in got] == [1.0, 0.5] and "wrong answer" in got[1].explanation


def test_the_label_time_limit_is_sent(service):
    scorer = CodeScorer("code", CodeSandboxConfig(url=service.url, max_execution_time=5))
    slow = _answer("import time\ntime.sleep(1.5)\ndef f():\n    return 1")
    fast_label = {"data_source": "code", "tests": ["assert f() == 1"], "max_execution_time": 0.5}
    roomy_label = {"data_source": "code", "tests": ["assert f() == 1"]}  # the config's 5 s
    tight, roomy = scorer.score([(slow, fast_label), (slow, roomy_label)])
    assert tight.valid and tight.score == 0.0 and "timeout (wall-clock limit of 0.5 s)" in tight.explanation
    assert roomy.score == 1.0


def test_an_unreachable_service_makes_samples_invalid_not_zero():
    url = f"http://127.0.0.1:{free_port()}"
    scorer = CodeScorer("code", CodeSandboxConfig(url=url, max_retries=2, backoff_s=0.01))
    label = {"data_source": "code", "tests": ["assert True"]}
    results = scorer.score([(_answer("x = 1"), label), (_answer("y = 2"), label), ("no code", label)])
    assert [r.valid for r in results] == [False, False, True]
    assert results[0].score == 0.0 and f"sandbox unreachable at {url}" in results[0].reason
    assert "gave up after 2 retries" in results[0].reason
    assert scorer.stats == {"requests": 2, "failures": 2, "retries": 4, "no_code_block": 1}


def test_a_refused_request_is_invalid_and_not_retried(service):
    scorer = CodeScorer("code", CodeSandboxConfig(url=service.url, max_retries=3, backoff_s=0.01))
    label = {"data_source": "code", "tests": ["assert True"], "max_execution_time": 60}  # over the service's 10 s
    (result,) = scorer.score([(_answer("x = 1"), label)])
    assert not result.valid and "HTTP 422" in result.reason and "exceeds this service's limit of 10 s" in result.reason
    assert scorer.stats["retries"] == 0 and scorer.stats["failures"] == 1


def test_a_full_queue_is_retried_then_invalid():
    with running_service(*FLAGS[:-2], "--uid-base", str(UID_BASE + 2), "--max-queue", "1") as handle:
        scorer = CodeScorer("code", CodeSandboxConfig(url=handle.url, max_retries=2, backoff_s=0.01))
        label = {"data_source": "code", "tests": ["assert True", "assert True"]}  # 2 runs > a queue of 1
        (result,) = scorer.score([(_answer("x = 1"), label)])
        assert not result.valid and "sandbox HTTP 503" in result.reason and "--max-queue" in result.reason
        assert scorer.stats["retries"] == 2


def test_configuration_from_the_environment(service, monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", service.url)
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_REWARD", "all_or_nothing")
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "3")
    cfg = CodeSandboxConfig.from_env()
    assert (cfg.url, cfg.reward, cfg.max_execution_time) == (service.url, "all_or_nothing", 3.0)
    labels = [{"data_source": "code", "tests": ADD_TESTS}, {"data_source": "code_stdio",
                                                            "tests": [{"input": "", "output": "hi"}]}]
    results = score_responses([_answer("def add(a, b):\n    return abs(a) + b"), _answer("print('hi')")], labels)
    assert [(r.valid, r.score) for r in results] == [(True, 0.0), (True, 1.0)]  # 3/4 is 0 when all-or-nothing
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_REWARD", "partial")
    with pytest.raises(ValueError, match="code reward must be one of .* OPENRLHF_CLASSMATE_SANDBOX_"):
        score_responses([_answer("x")], labels[:1])
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_REWARD", "fraction")
    monkeypatch.setenv("OPENRLHF_CLASSMATE_CODE_TIME_LIMIT", "soon")
    with pytest.raises(ValueError, match="OPENRLHF_CLASSMATE_CODE_TIME_LIMIT='soon' is not a number"):
        CodeSandboxConfig.from_env()


def test_engine_reward_function_reports_validity(service, monkeypatch):
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", service.url)
    label = json.dumps({"data_source": "code", "tests": ADD_TESTS})
    prompt = "<|user|>write add<|assistant|>"
    answer = _answer("def add(a, b):\n    return a + b")  # the policy executor splits it off on token ids
    out = reward_func([prompt + "<think>easy</think>" + answer], [prompt], [label], answers=[answer])
    assert out["rewards"] == 1.0 and out["extra_logs"]["main_valid"] == 1.0
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", f"http://127.0.0.1:{free_port()}")
    out = reward_func([prompt + "<think>easy</think>" + answer], [prompt], [label], answers=[answer])
    assert out["rewards"] == 0.0 and out["extra_logs"]["main_valid"] == 0.0  # masked as invalid, not a real 0


def test_the_launcher_checks_the_sandbox_environment_before_starting(monkeypatch):
    from openrlhf_classmate.cli.train_ppo_ray import check_scorer_environment
    from openrlhf_classmate.integration.launch.args import ConfigError

    check_scorer_environment()  # nothing set: defaults
    monkeypatch.setenv("OPENRLHF_CLASSMATE_SANDBOX_URL", "127.0.0.1:8001")
    with pytest.raises(ConfigError, match=r"sandbox url must be http\(s\)://HOST:PORT, got '127.0.0.1:8001'"):
        check_scorer_environment()


def test_a_sandbox_killed_mid_batch_leaves_every_unscored_sample_invalid_not_zero():
    # kill -9 of the service (its whole process group) while a batch of slow programs runs: the answers in flight
    # and those after the kill are invalid with the reason, never a 0; a program scored before the kill keeps its
    # score
    import signal
    import threading
    import time

    with running_service(*FLAGS[:-2], "--uid-base", str(UID_BASE + 4)) as handle:
        scorer = CodeScorer("code", CodeSandboxConfig(url=handle.url, max_retries=1, backoff_s=0.01))
        fast = {"data_source": "code", "tests": ["assert add(1, 2) == 3"]}
        slow = {"data_source": "code", "tests": ["import time; time.sleep(5)"], "max_execution_time": 8}
        batch = [(_answer("def add(a, b):\n    return a + b"), fast)] + [(_answer("x = 1"), slow)] * 5
        first_done = threading.Event()
        results = []

        def score():
            results.extend(scorer.score(batch[:1]))
            first_done.set()
            results.extend(scorer.score(batch[1:]))

        worker = threading.Thread(target=score)
        worker.start()
        assert first_done.wait(60)
        time.sleep(1.0)  # the slow programs are running (2 at a time: --max-concurrency 2)
        os.killpg(handle.proc.pid, signal.SIGKILL)
        worker.join(120)
        assert not worker.is_alive()
    assert results[0].valid and results[0].score == 1.0
    assert [r.valid for r in results[1:]] == [False] * 5 and all(r.score == 0.0 and r.reason for r in results[1:])
    assert all("sandbox" in r.reason for r in results[1:]), [r.reason for r in results[1:]]
    assert scorer.stats["failures"] == 5

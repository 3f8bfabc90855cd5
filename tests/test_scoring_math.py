"""Math scorers: GSM8K numeric answers in-process, math-verify equivalence in real worker processes."""

import time

import pytest

from openrlhf_classmate import scoring
from openrlhf_classmate.scoring import (
    Gsm8kScorer,
    LabelError,
    MathVerifyConfig,
    MathVerifyPool,
    MathVerifyScorer,
    ScoreResult,
    last_boxed,
    last_number,
)

# (ground truth, response, expected score). Run through real math-verify workers.
MATH_CASES = [
    # fractions vs decimals
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}.", 1.0),
    ("0.5", "So we get $\\boxed{\\frac{1}{2}}$", 1.0),
    ("\\frac{3}{4}", "\\boxed{0.75}", 1.0),
    ("\\frac{1}{3}", "\\boxed{0.3333333}", 1.0),
    ("\\frac{1}{3}", "\\boxed{0.33}", 0.0),
    ("\\frac{2}{3}", "\\boxed{\\frac{4}{6}}", 1.0),
    ("\\frac{2}{3}", "\\boxed{\\frac{3}{2}}", 0.0),
    ("\\dfrac{5}{8}", "\\boxed{\\tfrac{5}{8}}", 1.0),
    ("-\\frac{1}{4}", "\\boxed{-0.25}", 1.0),
    ("1.25", "\\boxed{\\frac{5}{4}}", 1.0),
    # \frac vs /
    ("\\frac{1}{2}", "\\boxed{1/2}", 1.0),
    ("3/5", "\\boxed{\\frac{3}{5}}", 1.0),
    ("3/5", "\\boxed{5/3}", 0.0),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\sqrt{3}/2}", 1.0),
    ("\\frac{\\sqrt{3}}{3}", "\\boxed{\\frac{1}{\\sqrt{3}}}", 1.0),
    # intervals and sets
    ("[1,3)", "\\boxed{[1, 3)}", 1.0),
    ("[1,3)", "\\boxed{(1, 3)}", 0.0),
    ("(-\\infty, 2]", "\\boxed{(-\\infty, 2]}", 1.0),
    ("(-\\infty, 2]", "\\boxed{(-\\infty, 2)}", 0.0),
    ("(0,1)\\cup(2,\\infty)", "\\boxed{(0, 1) \\cup (2, \\infty)}", 1.0),
    ("\\{1,2,3\\}", "\\boxed{\\{3, 2, 1\\}}", 1.0),
    ("2,3", "\\boxed{3, 2}", 1.0),
    ("2,3", "\\boxed{2, 4}", 0.0),
    # units and text
    ("72", "\\boxed{72 \\text{ dollars}}", 1.0),
    ("10", "\\boxed{10\\text{ cm}}", 1.0),
    ("10\\text{ cm}", "\\boxed{10}", 1.0),
    ("90^\\circ", "\\boxed{90}", 1.0),
    ("\\$18", "\\boxed{18}", 1.0),
    ("50\\%", "\\boxed{50\\%}", 1.0),
    # \boxed nesting and position: the last box is the answer
    ("3", "\\boxed{\\boxed{3}}", 1.0),
    ("\\frac{1}{2}", "\\boxed{\\boxed{\\frac{1}{2}}}", 1.0),
    ("4", "First \\boxed{3}, corrected: \\boxed{4}", 1.0),
    ("3", "First \\boxed{3}, corrected: \\boxed{4}", 0.0),
    ("6", "\\fbox{6}", 1.0),
    ("7", "\\boxed{\\frac{14}{2}} and that is it", 1.0),
    # symbolic
    ("x^2+2x+1", "\\boxed{(x+1)^2}", 1.0),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1.0),
    ("\\pi", "\\boxed{3.14}", 0.0),
    ("2\\pi", "\\boxed{2\\pi}", 1.0),
    ("x=3", "\\boxed{3}", 1.0),
    ("3", "\\boxed{x = 3}", 1.0),
    ("1+i", "\\boxed{i+1}", 1.0),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", 1.0),
    # plain numbers, no box
    ("1000", "\\boxed{1,000}", 1.0),
    ("1000", "\\boxed{1000.0}", 1.0),
    ("-7", "\\boxed{-7}", 1.0),
    ("-7", "\\boxed{7}", 0.0),
    ("12", "The answer is $12$.", 1.0),
    ("12", "I could not solve it.", 0.0),
    # several boxes: the last is the answer, unless the ground truth is a set of several elements
    ("4", "\\boxed{3} ... no, corrected: \\boxed{4}", 1.0),
    ("3", "\\boxed{3} ... no, corrected: \\boxed{4}", 0.0),
    ("2, 3", "The solutions are $x=\\boxed{2}$ and $x=\\boxed{3}$.", 1.0),
    ("\\{2, 3\\}", "$x = \\boxed{3}$ or $x = \\boxed{2}$", 1.0),
    ("2, 3", "$x = \\boxed{2}$, $\\boxed{3}$ or $\\boxed{5}$", 0.0),  # a root too many
    ("2, 3", "$x = \\boxed{3}$", 0.0),  # one root of two
    ("[1,3)", "first \\boxed{[0,1)}, then \\boxed{[1,3)}", 1.0),  # an interval is one element: the last box
]

# (ground truth, response, expected score, expected extracted answer)
GSM8K_CASES = [
    ("72", "Natalia sold 48 + 24 = 72 clips. \\boxed{72}", 1.0, "72"),
    ("72", "48/2 = 24 and 48 + 24 = 72", 1.0, "72"),
    ("1,234", "The total is 1,234.", 1.0, "1234"),
    ("1234", "So \\boxed{1,234} dollars", 1.0, "1234"),
    ("1,234", "\\boxed{1234}", 1.0, "1234"),
    ("18", "\\boxed{\\$18}", 1.0, "18"),
    ("18", "She makes \\boxed{18 \\text{ dollars}} every day.", 1.0, "18"),
    ("5", "\\boxed{5} ... wait, maybe 6", 1.0, "5"),  # the box wins over a later number
    ("6", "\\boxed{5} ... wait, maybe 6", 0.0, "5"),
    ("10", "\\boxed{10.0}", 1.0, "10.0"),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1.0, "\\frac{1}{2}"),
    ("0.75", "\\boxed{3/4}", 1.0, "3/4"),
    ("-3", "The temperature drops to \\boxed{-3}", 1.0, "-3"),
    ("-3", "The temperature drops to \u22123 degrees", 1.0, "-3"),
    ("3", "items 1,2,3", 1.0, "3"),  # "1,2,3" is a list, not 123
    ("1000000", "1\\,000\\,000", 1.0, "1000000"),
    ("1000000", "\\boxed{1{,}000{,}000}", 1.0, "1000000"),
    ("100", "about 100.0000001 units", 1.0, "100.0000001"),  # relative tolerance 1e-6
    ("100", "about 100.001 units", 0.0, "100.001"),
    ("42", "no digits here", 0.0, None),
    ("42", "\\boxed{x}", 0.0, None),  # a box without a number: no fallback to numbers outside it
    (42, "The answer: 42.", 1.0, "42"),  # numeric ground truth
    # a box's value is its last one: units and their exponents, remarks, the working before "=", a difference's minus
    ("150", "\\boxed{150 \\text{ ft}^2}", 1.0, "150"),
    ("150", "\\boxed{150 \\, \\text{cm}^3}", 1.0, "150"),
    ("18", "\\boxed{18 \\text{ (in 2 hours)}}", 1.0, "18"),
    ("40", "\\boxed{40 \\text{ (1/2 of 80)}}", 1.0, "40"),
    ("30", "\\boxed{\\frac{3}{4} \\times 40 = 30}", 1.0, "30"),
    ("2", "\\boxed{4-2}", 1.0, "2"),
    ("-5", "\\boxed{-\\$5}", 1.0, "-5"),
    ("-5", "\\boxed{(-5)}", 1.0, "-5"),  # a remark that is the whole answer stays
    ("1500000", "\\boxed{1.5 \\times 10^6}", 1.0, "1.5 \\times 10^6"),
    ("2.5", "\\boxed{2 \\frac{1}{2}}", 1.0, "2 \\frac{1}{2}"),  # mixed numbers
    ("6.5", "\\boxed{6\\frac{1}{2}}", 1.0, "6\\frac{1}{2}"),
    ("2.5", "\\boxed{2 1/2}", 1.0, "2 1/2"),
    ("0.75", "\\boxed{3/4 \\text{ of the cake}}", 1.0, "3/4"),
    ("40", "\\boxed{\\frac{3}{4} \\times 40}", 1.0, "40"),  # a fraction before the last number is not the answer
]


@pytest.fixture(scope="module")
def pool():
    with MathVerifyPool(MathVerifyConfig(num_workers=2, timeout_s=5.0)) as p:
        yield p


@pytest.fixture(scope="module")
def math_results(pool):
    scorer = MathVerifyScorer("hendrycks_math", pool=pool)
    items = [(resp, {"data_source": "hendrycks_math", "ground_truth": gt}) for gt, resp, _ in MATH_CASES]
    return scorer.score(items)


def test_the_math_table_is_large_enough():
    assert len(MATH_CASES) >= 40
    assert {e for _, _, e in MATH_CASES} == {0.0, 1.0}


@pytest.mark.parametrize("i", range(len(MATH_CASES)), ids=[f"{g}|{r}"[:50] for g, r, _ in MATH_CASES])
def test_math_verify_table(math_results, i):
    gt, resp, expected = MATH_CASES[i]
    result = math_results[i]
    assert result.valid, result.reason
    assert result.score == expected, (gt, resp, result)


def test_math_verify_reports_what_it_extracted(math_results):
    assert math_results[0].extracted == "\\frac{1}{2}"
    found_nothing = math_results[[resp for _, resp, _ in MATH_CASES].index("I could not solve it.")]
    assert found_nothing.extracted is None and found_nothing.score == 0.0 and found_nothing.valid


@pytest.mark.parametrize("gt,resp,expected,extracted", GSM8K_CASES)
def test_gsm8k_table(gt, resp, expected, extracted):
    [result] = Gsm8kScorer().score([(resp, {"data_source": "gsm8k", "ground_truth": gt})])
    assert result.valid
    assert result.score == expected
    assert result.extracted == extracted


def test_pathological_latex_times_out_kills_only_its_worker_and_the_pool_recovers():
    with MathVerifyPool(MathVerifyConfig(num_workers=2, timeout_s=1.0)) as pool:
        assert pool.start()  # workers ready, so the clock below measures the items only
        scorer = MathVerifyScorer(pool=pool)
        label = {"data_source": "math_verify", "ground_truth": "1"}
        start = time.monotonic()
        results = scorer.score([("\\boxed{9^{9^{9^{9}}}}", label), ("\\boxed{1}", label)])
        elapsed = time.monotonic() - start
        assert not results[0].valid
        assert results[0].reason == "math-verify timed out after 1s"
        assert results[0].score == 0.0
        assert results[1].valid and results[1].score == 1.0  # the other worker's item is unaffected
        assert 1.0 <= elapsed < 1.0 + 3.0  # slack for a loaded 2-core machine; without the kill it runs for hours
        assert pool.restarts == 1
        # the replacement worker serves the next batch
        again = scorer.score([("\\boxed{2}", {**label, "ground_truth": "2"})] * 4)
        assert [r.score for r in again] == [1.0] * 4


def test_a_worker_that_died_while_idle_is_replaced_without_losing_items(pool):
    pool.verify([("1", "1")])
    pool._workers[0].proc.kill()
    pool._workers[0].proc.join(5)
    outcomes = pool.verify([("2", "\\boxed{2}")] * 4)
    assert all(o.equal and o.error is None for o in outcomes)


def test_an_unparseable_ground_truth_is_invalid_not_zero(pool):
    [result] = MathVerifyScorer(pool=pool).score([("\\boxed{1}", {"data_source": "math_verify", "ground_truth": "}{"})])
    assert not result.valid
    assert "could not parse the ground truth" in result.reason


def test_no_final_answer_is_a_valid_zero_without_touching_the_pool():
    scorer = MathVerifyScorer(pool=object())  # any use of this "pool" would fail
    [result] = scorer.score([(None, {"data_source": "math_verify", "ground_truth": "1"})])
    assert result == ScoreResult(score=0.0, valid=True, explanation="no final answer")


def test_the_process_wide_pool_is_configurable_and_shuts_down():
    scoring.configure_math_verify(MathVerifyConfig(num_workers=1, timeout_s=3.0))
    try:
        results = scoring.score_responses(
            ["\\boxed{\\frac{1}{2}}", "\\boxed{3}", None],
            [{"data_source": "EleutherAI/hendrycks_math", "ground_truth": "0.5"},
             {"data_source": "hendrycks_math", "ground_truth": "4"},
             {"data_source": "hendrycks_math", "ground_truth": "4"}],
        )
        assert [r.score for r in results] == [1.0, 0.0, 0.0]
        pool = scoring.get_math_pool()
        assert pool.config.num_workers == 1 and len(pool._workers) == 1
        proc = pool._workers[0].proc
    finally:
        scoring.shutdown()
        scoring.configure_math_verify(MathVerifyConfig())
    assert not proc.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.verify([("1", "1")])


def test_fork_is_refused():
    with pytest.raises(ValueError, match="spawn"):
        MathVerifyConfig(start_method="fork")


@pytest.mark.parametrize(
    "label,field",
    [
        ({"data_source": "gsm8k"}, "ground_truth"),
        ({"data_source": "gsm8k", "ground_truth": "seventy"}, "ground_truth"),
        ({"data_source": "hendrycks_math", "ground_truth": ""}, "ground_truth"),
    ],
)
def test_bad_math_labels_name_source_and_field(label, field):
    scorer = Gsm8kScorer() if label["data_source"] == "gsm8k" else MathVerifyScorer(pool=object())
    with pytest.raises(LabelError) as err:
        scorer.score([("\\boxed{1}", label)])
    assert err.value.field == field and err.value.data_source == label["data_source"]
    assert f"data_source {label['data_source']!r}" in str(err.value) and "'ground_truth'" in str(err.value)


@pytest.mark.parametrize(
    "text,boxed",
    [
        ("\\boxed{3}", "3"),
        ("a \\boxed{\\frac{1}{2}} b", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\boxed{3}}", "3"),
        ("\\boxed 5$", "5"),
        ("\\boxed{3", None),  # truncated
        ("no box", None),
    ],
)
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


def test_boxed_answers_finds_every_box_once():
    from openrlhf_classmate.scoring.boxes import boxed_answers

    assert boxed_answers("$x=\\boxed{2}$ and $x=\\boxed{\\frac{1}{2}}$") == ["2", "\\frac{1}{2}"]
    assert boxed_answers("\\boxed{\\boxed{3}} then \\fbox{4}") == ["\\boxed{3}", "4"]  # the inner box is content
    assert boxed_answers("\\boxed 5 \\boxed 6   ") == ["5", "6"]  # a space box ends at its word, not the spaces
    assert boxed_answers("\\boxed{1} \\boxed{2") == ["1"]  # the truncated one is not an answer


def test_last_number():
    assert last_number("paid $1,234.50 for 3 items") == "3"
    assert last_number("paid $1,234.50") == "1234.50"
    assert last_number("none") is None

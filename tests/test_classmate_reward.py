"""Classmate reward from classmate scores (the formulas of ``openrlhf_classmate/algo/classmate_reward.py``)."""

import math

import pytest
import torch

from openrlhf_classmate.algo.classmate_reward import CONDITIONS, combine_classmate_scores

MAIN = torch.tensor([8.0, 3.0, 0.0, 5.0], dtype=torch.float64)
CLASSMATE = torch.tensor([6.0, 2.0, 4.0, 7.0], dtype=torch.float64)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("always", [6, 2, 4, 7]),
        ("no_classmate_when_main_incorrect", [6, 2, 0, 7]),
        ("neg_classmate_when_main_incorrect", [6, 2, -4, 7]),
        ("no_classmate", [0, 0, 0, 0]),
    ],
)
def test_worked_example_section_12_1(condition, expected):
    scores = CLASSMATE.view(4, 1, 1)
    valid = torch.ones(4, 1, 1, dtype=torch.bool)
    reward, ok, raw = combine_classmate_scores(scores, valid, MAIN, lam=1.0, condition=condition)
    assert reward.tolist() == expected
    assert ok.tolist() == [True] * 4
    assert raw.tolist() == CLASSMATE.tolist()
    assert reward.dtype == torch.float64


def test_lambda_scales_before_condition():
    scores = CLASSMATE.view(4, 1, 1)
    valid = torch.ones(4, 1, 1, dtype=torch.bool)
    reward, _, raw = combine_classmate_scores(
        scores, valid, MAIN, lam=0.5, condition="neg_classmate_when_main_incorrect"
    )
    assert reward.tolist() == [3.0, 1.0, -2.0, 3.5]
    assert raw.tolist() == CLASSMATE.tolist()  # raw mean is before lambda / condition


def test_sample_and_classmate_means_with_invalid_entries():
    nan = float("nan")
    # B=3, K=2 classmates, S=3 samples.
    scores = torch.tensor(
        [
            [[1.0, 2.0, 3.0], [10.0, nan, 30.0]],  # classmate 1 sample 1 failed
            [[nan, nan, nan], [4.0, 6.0, nan]],  # classmate 0 failed completely
            [[nan, nan, nan], [nan, nan, nan]],  # nothing valid
        ]
    )
    valid = ~torch.isnan(scores)
    main = torch.tensor([1.0, 1.0, 1.0])
    reward, ok, raw = combine_classmate_scores(scores, valid, main, weights=[1.0, 3.0])
    # row 0: means 2 and 20, weights 1:3 -> (2 + 60) / 4
    # row 1: only classmate 1 counts (weights renormalised over it) -> 5
    assert reward.tolist() == pytest.approx([15.5, 5.0, 0.0])
    assert ok.tolist() == [True, True, False]
    assert not any(math.isnan(x) for x in raw.tolist())
    uniform, _, _ = combine_classmate_scores(scores, valid, main)
    assert uniform.tolist() == pytest.approx([11.0, 5.0, 0.0])


def test_invalid_row_is_flagged_not_scored_under_every_condition():
    scores = torch.zeros(2, 1, 2)
    valid = torch.tensor([[[True, False]], [[False, False]]])
    for condition in CONDITIONS:
        reward, ok, _ = combine_classmate_scores(scores + 3.0, valid, torch.tensor([-1.0, -1.0]), condition=condition)
        assert ok.tolist() == [True, False]
        assert reward[1].item() == 0.0


def test_bad_arguments():
    scores = torch.ones(2, 2, 1)
    valid = torch.ones(2, 2, 1, dtype=torch.bool)
    main = torch.ones(2)
    with pytest.raises(ValueError, match="unknown classmate condition 'sometimes'.*'always'.*'no_classmate'"):
        combine_classmate_scores(scores, valid, main, condition="sometimes")
    with pytest.raises(ValueError, match="weights has 3 entries"):
        combine_classmate_scores(scores, valid, main, weights=[1, 1, 1])
    with pytest.raises(ValueError, match="non-negative"):
        combine_classmate_scores(scores, valid, main, weights=[1, -1])
    with pytest.raises(ValueError, match="valid shape"):
        combine_classmate_scores(scores, valid[:, :1], main)
    with pytest.raises(ValueError, match="main_rewards"):
        combine_classmate_scores(scores, valid, torch.ones(3))
    with pytest.raises(ValueError, match=r"\[B, K, S\]"):
        combine_classmate_scores(scores[:, :, 0], valid[:, :, 0], main)

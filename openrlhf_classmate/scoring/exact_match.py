"""Simple answer-matching scorers: ``exact_match`` (strings or numbers) and ``arithmetic`` (integers)."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from openrlhf_classmate.scoring.base import BaseScorer
from openrlhf_classmate.scoring.labels import LabelError, require_scalar
from openrlhf_classmate.scoring.math import answer_value, final_number, last_number, numbers_equal
from openrlhf_classmate.scoring.result import ScoreResult


def normalise_text(text: str) -> str:
    """Case-folded, whitespace collapsed, surrounding whitespace and trailing periods dropped."""
    return " ".join(text.split()).casefold().rstrip(".").strip()


class ExactMatchScorer(BaseScorer):
    """Score 1.0 if the answer matches ``ground_truth``.

    Label: ``ground_truth`` (string or number); optional ``numeric: true`` to compare the answer's number
    numerically (relative tolerance 1e-6; the last box's value, else the last number, as ``gsm8k`` reads it) instead
    of comparing normalised strings (``normalise_text``).
    """

    name = "exact_match"

    def check_label(self, label: Mapping[str, Any]) -> None:
        gt = require_scalar(label, "ground_truth", hint="exact_match labels need the expected answer.")
        if label.get("numeric") and answer_value(gt) is None:
            raise LabelError(
                f"{gt!r:.60} is not a number but the label sets numeric=true",
                data_source=label.get("data_source"),
                field="ground_truth",
            )

    def score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        gt = str(label["ground_truth"])
        if label.get("numeric"):
            found, source = final_number(response)
            if found is None:
                return ScoreResult(score=0.0, explanation=f"no number found ({source})")
            correct = numbers_equal(found[1], answer_value(gt)[1])  # type: ignore[index]
            return ScoreResult(score=1.0 if correct else 0.0, extracted=found[0], explanation=f"numeric match ({source})")
        answer = normalise_text(response)
        return ScoreResult(score=1.0 if answer == normalise_text(gt) else 0.0, extracted=answer,
                           explanation="normalised string match")


def _integer(text: str) -> Decimal | None:
    try:
        value = Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        return None
    return value if value.is_finite() and value == value.to_integral_value() else None


class ArithmeticScorer(BaseScorer):
    """Synthetic arithmetic (the embedded demo): score 1.0 if the last number in the answer is the integer
    ``ground_truth`` (exact, any size; "12.0" counts as 12), else 0.0. Label: ``ground_truth`` (int or digits)."""

    name = "arithmetic"

    def check_label(self, label: Mapping[str, Any]) -> None:
        gt = require_scalar(label, "ground_truth", hint="arithmetic labels need the integer result.")
        if _integer(gt) is None:
            raise LabelError(f"{gt!r:.60} is not an integer", data_source=label.get("data_source"),
                             field="ground_truth")

    def score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        number = last_number(response)
        if number is None:
            return ScoreResult(score=0.0, explanation="no number found")
        value = _integer(number)
        correct = value is not None and value == _integer(str(label["ground_truth"]))
        return ScoreResult(score=1.0 if correct else 0.0, extracted=number, explanation="last number")

"""Math answer scorers: GSM8K numeric answers, and math-verify equivalence for MATH-style LaTeX answers."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from openrlhf_classmate.scoring.base import BaseScorer
from openrlhf_classmate.scoring.boxes import (
    MAX_BOXED_CHARS,
    MAX_BRACE_DEPTH,
    brace_depth,
    last_box_or_text,
    last_boxed,
)
from openrlhf_classmate.scoring.labels import LabelError, require_scalar
from openrlhf_classmate.scoring.math_pool import MathVerifyPool, get_math_pool
from openrlhf_classmate.scoring.result import ScoreResult

REL_TOL = 1e-6
ABS_TOL = 1e-9

# A number with optional digit-group commas ("1,234,567") and decimals. Digit groups must be exactly three digits,
# so a list like "1,2,3" stays three numbers instead of becoming 123.
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_SLASH_RE = re.compile(r"(-?[\d.,]+)\s*/\s*(-?[\d.,]+)")
# LaTeX digit-group separators between digits: 1\,234 and 1{,}234.
_LATEX_GROUP_RE = re.compile(r"(?<=\d)(?:\\,|\{,\}|\\!|\\ )(?=\d{3})")
# What a short answer carries besides its value: units and words in text macros, with an exponent after them
# (150 \text{ ft}^2), escaped dollar signs (-\$5), and remarks in parentheses (18 \text{ (in 2 hours)}).
_UNIT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{[^{}]*\}(?:\s*\^\s*(?:\{[^{}]*\}|\d))?")
_REMARK_RE = re.compile(r"\([^()]*\)")
# 1.5 \times 10^6
_SCIENTIFIC_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\u00d7)\s*10\s*\^\s*\{?\s*(-?\d+)\s*\}?")
# the minus of a difference (4-2), not a sign: after a digit, a closing parenthesis or brace
_DIFFERENCE_RE = re.compile(r"(?<=[\d)}])\s*-\s*(?=\d)")
_MIXED_RE = re.compile(r"(-?)(\d+)\s*$")


def _normalise_digits(text: str) -> str:
    return _LATEX_GROUP_RE.sub(",", text.replace("\u2212", "-"))


def last_number(text: str) -> str | None:
    """The last number in ``text`` with digit-group commas removed ("1,234" -> "1234"), or None."""
    matches = _NUMBER_RE.findall(_normalise_digits(text))
    return matches[-1].replace(",", "") if matches else None


def _to_float(s: str) -> float | None:
    try:
        value = float(s.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def last_number_value(text: str) -> tuple[str, float] | None:
    """The last number in ``text`` and its value, or None."""
    number = last_number(text)
    value = _to_float(number) if number is not None else None
    return (number, value) if value is not None else None  # type: ignore[return-value]


def answer_value(text: str) -> tuple[str, float] | None:
    """The numeric value of a short answer (a box's content, a ground truth), or None if it holds no number.

    The value is the answer's last one: after the last ``=`` (``\\frac{3}{4} \\times 40 = 30`` is 30), without units
    and remarks (``150 \\text{ ft}^2`` is 150, ``40 (1/2 of 80)`` is 40), a difference's minus not a sign (``4-2`` is
    2); ``a \\times 10^b`` is its value; a fraction ``\\frac{a}{b}`` or ``a/b`` counts when it ends the answer, with a
    whole number before it as a mixed number (``2 \\frac{1}{2}`` is 2.5)."""
    text = _normalise_digits(text).rsplit("=", 1)[-1].replace("\\$", "")
    text = _UNIT_RE.sub(" ", text)
    without_remarks = _REMARK_RE.sub(" ", text)
    if _NUMBER_RE.search(without_remarks):  # "(-5)" alone stays: its remark is the answer
        text = without_remarks
    text = _DIFFERENCE_RE.sub(" ~ ", text)  # not a sign, and no mixed number across it
    tail = text.rstrip(" .$\t\n")
    scientific = list(_SCIENTIFIC_RE.finditer(tail))
    if scientific and scientific[-1].end() == len(tail):
        m = scientific[-1]
        value = _to_float(m.group(1))
        if value is not None and abs(int(m.group(2))) <= 300:
            return m.group(0), value * 10.0 ** int(m.group(2))
    numbers = list(_NUMBER_RE.finditer(tail))
    if not numbers:
        return None
    fractions = sorted((m for pattern in (_FRAC_RE, _SLASH_RE) for m in pattern.finditer(tail)), key=lambda m: m.end())
    if fractions and fractions[-1].end() >= numbers[-1].end():
        m = fractions[-1]
        groups = m.groups()
        sign = -1.0 if len(groups) == 3 and groups[0] else 1.0
        num, den = _to_float(groups[-2]), _to_float(groups[-1])
        if num is not None and den:
            value, shown = sign * num / den, m.group(0).strip()
            whole = _MIXED_RE.search(tail[: m.start()])
            # a mixed number: a whole number right before the fraction (a space before "a/b", none needed before \frac)
            if whole and sign > 0 and num >= 0 and (len(groups) == 3 or tail[m.start() - 1].isspace()):
                value = (-1.0 if whole.group(1) else 1.0) * (int(whole.group(2)) + value)
                shown = tail[whole.start(): m.end()].strip()
            return shown, value
    return last_number_value(tail)


def final_number(response: str) -> tuple[tuple[str, float] | None, str]:
    """A response's numeric answer and where it came from: the last ``\\boxed{}``'s value (:func:`answer_value`) if
    there is a box, else the response's last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return answer_value(boxed), "\\boxed{}"
    return last_number_value(response), "last number"


def numbers_equal(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


class Gsm8kScorer(BaseScorer):
    """GSM8K: the final answer is the last ``\\boxed{}``'s value if there is one (:func:`answer_value`: its last
    value, without units or remarks), else the last number in the output; score 1.0 if it equals the ground truth
    numerically (relative tolerance 1e-6), else 0.0.

    The reference took only the last number (never the box); the prompts ask for ``\\boxed{}``, so the box wins.
    Label: ``ground_truth`` (string or number, e.g. "1,234" or 72).
    """

    name = "gsm8k"

    def check_label(self, label: Mapping[str, Any]) -> None:
        ground_truth = require_scalar(label, "ground_truth", hint="gsm8k labels need the numeric final answer.")
        if answer_value(ground_truth) is None:
            raise LabelError(
                f"{ground_truth!r:.60} is not a number", data_source=label.get("data_source"), field="ground_truth"
            )

    def score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        _, gold = answer_value(str(label["ground_truth"]))  # type: ignore[misc]  # checked in check_label
        found, source = final_number(response)
        if found is None:
            return ScoreResult(score=0.0, explanation=f"no number found ({source})")
        text, value = found
        correct = numbers_equal(value, gold)
        return ScoreResult(score=1.0 if correct else 0.0, extracted=text, explanation=f"answer from {source}")


def implausible_answer(text: str) -> str | None:
    """Why ``text`` (a final box or answer) is refused before verification, or None."""
    depth = brace_depth(text)
    if depth > MAX_BRACE_DEPTH:
        return f"answer rejected: braces nested {depth} deep (limit {MAX_BRACE_DEPTH})"
    boxed = last_boxed(text)
    if boxed is not None and len(boxed) > MAX_BOXED_CHARS:
        return f"answer rejected: boxed answer of {len(boxed)} characters (limit {MAX_BOXED_CHARS})"
    return None


class MathVerifyScorer(BaseScorer):
    """MATH-style answers: math-verify parses the response and the ground truth and checks equivalence
    (fractions vs decimals, intervals, sets, symbolic forms), in worker processes with a per-item time limit.
    When the response has a ``\\boxed{}``, only the last box is verified, or every box when the ground truth is a
    set of several elements (:func:`final_answer_text`). Score 1.0 / 0.0; a timeout or an
    unparseable ground truth is ``valid=False``. An answer nested deeper than ``MAX_BRACE_DEPTH`` braces or with a
    box longer than ``MAX_BOXED_CHARS`` is a valid 0 without verification (math-verify misjudges such input).

    Label: ``ground_truth``, the bare answer (e.g. ``\\frac{1}{2}`` or ``[1,3)``), as stored by the reference
    (``math_verify.parse(solution)[-1]``).
    """

    def __init__(self, name: str = "math_verify", pool: MathVerifyPool | None = None):
        self.name = name
        self._pool = pool

    def check_label(self, label: Mapping[str, Any]) -> None:
        require_scalar(label, "ground_truth", hint="math labels need the final answer (LaTeX or plain).")

    async def _ascore_answers(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ScoreResult]:
        pool = self._pool or get_math_pool()
        # the worker picks what of a response it verifies (final_answer_text); the last box is checked here
        pairs = [(str(label["ground_truth"]).strip(), response) for response, label in items]
        refused = [implausible_answer(last_box_or_text(response)) for _, response in pairs]
        todo = [pair for pair, why in zip(pairs, refused) if why is None]
        verified = iter(await asyncio.to_thread(pool.verify, todo) if todo else [])
        results = []
        for why in refused:
            if why is not None:
                results.append(ScoreResult(score=0.0, explanation=why))
                continue
            outcome = next(verified)
            if outcome.error is not None:
                results.append(ScoreResult.invalid(outcome.error, extracted=outcome.extracted))
            elif outcome.extracted is None:
                results.append(ScoreResult(score=0.0, explanation="math-verify found no answer"))
            else:
                results.append(ScoreResult(score=1.0 if outcome.equal else 0.0, extracted=outcome.extracted))
        return results

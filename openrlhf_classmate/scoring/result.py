"""The outcome of scoring one response."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

NO_FINAL_ANSWER = "no final answer"


@dataclass(frozen=True)
class ScoreResult:
    """The score of one response.

    ``valid=False`` means the *scorer* failed (judge unreachable, unparseable judge output, verifier timeout); the
    trainer must mask such samples out of group statistics instead of treating ``score`` as a real 0. A wrong or
    missing answer from the model is a valid score of 0.
    """

    score: float
    """The reward: 1/0 for verifiers, the 1-10 rating for the sycophancy judge, 0/1 or 1-10 for the CoT monitor.
    Always 0.0 when ``valid`` is False."""
    valid: bool = True
    """False when the scorer could not produce a score; ``reason`` then says why."""
    extracted: str | None = None
    """The answer the scorer extracted from the response (number, letter, LaTeX, rating), if any."""
    explanation: str | None = None
    """Free-text explanation: the judge's explanation, or which rule produced the score."""
    reason: str | None = None
    """Why the score is invalid; None for valid scores."""
    metrics: Mapping[str, float] | None = None
    """Per-sample counters of the scorer (e.g. TinyV's ``tinyv/verifier_called``), logged by the reward function
    when the run declares them (``scoring/metrics.py``)."""

    @classmethod
    def invalid(cls, reason: str, *, extracted: str | None = None, explanation: str | None = None,
                metrics: Mapping[str, float] | None = None) -> ScoreResult:
        return cls(score=0.0, valid=False, extracted=extracted, explanation=explanation, reason=reason,
                   metrics=metrics)

    @classmethod
    def no_final_answer(cls) -> ScoreResult:
        """The model produced no final answer (no ``</think>``): the model's failure, so a *valid* 0."""
        return cls(score=0.0, valid=True, explanation=NO_FINAL_ANSWER)

    @property
    def is_no_final_answer(self) -> bool:
        return self.valid and self.extracted is None and self.explanation == NO_FINAL_ANSWER

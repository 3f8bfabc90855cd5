"""The scorer interface: batch-first and async."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from openrlhf_classmate.scoring.aio import run_sync
from openrlhf_classmate.scoring.labels import LabelError
from openrlhf_classmate.scoring.result import ScoreResult

logger = logging.getLogger(__name__)

Item = tuple[str | None, Mapping[str, Any]]
"""One response to score: (final answer text or None when the model gave none, parsed label dict)."""


@runtime_checkable
class Scorer(Protocol):
    name: str

    async def ascore(self, items: Sequence[Item]) -> list[ScoreResult]: ...


class BaseScorer:
    """Common plumbing: label checks before any work, ``None`` responses, and a sync ``score``."""

    name: str = ""

    def check_config(self) -> None:
        """Raise if the scorer lacks configuration it needs (the judge scorer without a judge config)."""

    def check_label(self, label: Mapping[str, Any]) -> None:
        """Raise ``LabelError`` (naming data source and field) if this scorer cannot use ``label``."""

    def check_labels(self, items: Sequence[Item]) -> None:
        for i, (_, label) in enumerate(items):
            try:
                self.check_label(label)
            except LabelError as e:
                raise e.with_index(i) from None

    async def ascore(self, items: Sequence[Item]) -> list[ScoreResult]:
        """Score a batch; one result per item, in order. Label problems raise ``LabelError`` before any work."""
        self.check_labels(items)
        results: list[ScoreResult | None] = [None] * len(items)
        todo = []
        for i, (response, _) in enumerate(items):
            if response is None:
                results[i] = ScoreResult.no_final_answer()
            else:
                todo.append(i)
        if todo:
            scored = await self._ascore_answers([(items[i][0], items[i][1]) for i in todo])  # type: ignore[misc]
            for i, r in zip(todo, scored, strict=True):
                results[i] = r
        return results  # type: ignore[return-value]

    def score(self, items: Sequence[Item]) -> list[ScoreResult]:
        """Synchronous ``ascore`` (runs its own event loop)."""
        return run_sync(self.ascore(items))

    async def _ascore_answers(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ScoreResult]:
        """Score items that all have a final answer. Subclasses implement this or ``score_answer``."""
        return [self._safe_score_answer(response, label) for response, label in items]

    def _safe_score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        try:
            return self.score_answer(response, label)
        except Exception as e:  # noqa: BLE001
            # A rule that trips over odd text must not take the training step down; it is reported, not zeroed.
            logger.warning("%s scorer raised on a response: %r", self.name, e)
            return ScoreResult.invalid(f"{self.name} scorer raised {type(e).__name__}: {e}")

    def score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        raise NotImplementedError

"""The one error type of the dataset setup scripts."""

from __future__ import annotations


class DataError(ValueError):
    """Malformed or unusable input; the message names the file, line (or row) and field when they are known.

    ``location`` is ``"path:line"`` for jsonl, ``"path:row N"`` for json lists and parquet, and
    ``"hf://name/config/split:row N"`` for hub rows.
    """

    def __init__(self, problem: str, *, location: str | None = None, field: str | None = None) -> None:
        self.problem = problem
        self.location = location
        self.field = field
        parts = []
        if location:
            parts.append(location)
        if field:
            parts.append(f"field '{field}'")
        parts.append(problem)
        super().__init__(": ".join(parts))

"""Output rows and field access with located errors.

Every written row is ``{"prompt": messages, "label": "<JSON string>", "datasource": data_source}``. The label is a
JSON *string* so that ``datasets`` can load files whose label fields differ between tasks; it carries
``data_source``, ``ground_truth``, the task's extra fields, ``split``, ``index`` and ``messages`` (OpenRLHF forwards
only the label to the reward side, and the classmate stage needs the full message list).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from openrlhf_classmate.data.errors import DataError

_MISSING = object()

_KIND_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", float: "a number"}


@dataclass
class Example:
    """One prompt before it is assigned to a split."""

    messages: list[dict[str, str]]
    ground_truth: str | None
    extra: dict[str, Any] = field(default_factory=dict)


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def system(content: str) -> dict[str, str]:
    return {"role": "system", "content": content}


def make_row(example: Example, *, data_source: str, split: str, index: int) -> dict[str, Any]:
    label = {
        "data_source": data_source,
        "ground_truth": example.ground_truth,
        **example.extra,
        "split": split,
        "index": index,
        "messages": example.messages,
    }
    return {"prompt": example.messages, "label": json.dumps(label, ensure_ascii=False), "datasource": data_source}


def make_rows(examples: Iterable[Example], *, data_source: str, split: str) -> list[dict[str, Any]]:
    return [make_row(ex, data_source=data_source, split=split, index=i) for i, ex in enumerate(examples)]


def _matches(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; a true/false flag is never a count or an index
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def require(row: dict[str, Any], name: str, location: str, kind: type = str, *, non_empty: bool = False) -> Any:
    """``row[name]``, checked for presence, type and (optionally) non-emptiness; else a DataError naming it."""
    value = row.get(name, _MISSING)
    if value is _MISSING or value is None:
        raise DataError("missing" if value is _MISSING else "is null", location=location, field=name)
    if not _matches(value, kind):
        raise DataError(
            f"must be {_KIND_NAMES.get(kind, kind.__name__)}, got {type(value).__name__}", location=location, field=name
        )
    if non_empty and isinstance(value, (str, list, dict)) and not (value.strip() if isinstance(value, str) else value):
        raise DataError("is empty", location=location, field=name)
    return value


def optional(row: dict[str, Any], name: str, location: str, kind: type = str) -> Any:
    """``row[name]`` or None when absent or null; a present value of the wrong type is still an error."""
    if row.get(name) is None:
        return None
    return require(row, name, location, kind)


def require_text(row: dict[str, Any], name: str, location: str) -> str:
    """A string field; numbers are accepted and turned into their text (some local copies store answers as numbers)."""
    value = row.get(name, _MISSING)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return require(row, name, location, str)

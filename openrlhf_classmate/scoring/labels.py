"""Parsing and checking the per-prompt label that reaches the scorers.

A label is what OpenRLHF's ``--data.label_key`` column holds for a row: a dict, or a JSON string of one. It must name
its ``data_source`` (which picks the scorer, see ``registry.py``) and carries the scorer's fields, e.g.::

    {"data_source": "gsm8k", "ground_truth": "1,234"}
    {"data_source": "cais/mmlu", "ground_truth": "C", "actual_ground_truth": "A",
     "raw_question_for_monitor": "...", "hint_str_for_monitor": "..."}
    {"data_source": "helpful_instructions", "ground_truth": null, "raw_question_for_monitor": "..."}

For rows converted from verl parquet files the fields may instead sit under a ``reward_model`` dict
(``{"data_source": ..., "reward_model": {"ground_truth": ...}}``); those are merged in, top-level keys winning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LIST_COMMAND = "python -m openrlhf_classmate.scoring --list"
"""The command that prints every registered data_source name (``scoring/__main__.py``)."""


class LabelError(ValueError):
    """A label cannot be scored. The message names the row, the data source and the field to fix."""

    def __init__(self, detail: str, *, data_source: str | None = None, field: str | None = None,
                 index: int | None = None):
        self.detail = detail
        self.data_source = data_source
        self.field = field
        self.index = index
        where = [f"label #{index}"] if index is not None else []
        if data_source is not None:
            where.append(f"data_source {data_source!r}")
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {detail}" if where else detail)

    def with_index(self, index: int) -> LabelError:
        """The same error, tagged with the batch row it came from."""
        return type(self)(self.detail, data_source=self.data_source, field=self.field, index=index)


def parse_label(label: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
    """Turn a label (dict or JSON object string) into a flat dict that has a string ``data_source``."""
    if isinstance(label, bytes):
        label = label.decode("utf-8")
    if isinstance(label, str):
        if not label.strip():
            raise LabelError(
                "label is empty; set --data.label_key to the dataset column holding the JSON label "
                '(e.g. {"data_source": "gsm8k", "ground_truth": "72"})'
            )
        try:
            label = json.loads(label)
        except json.JSONDecodeError as e:
            snippet = label if len(label) <= 80 else label[:77] + "..."
            raise LabelError(f"label is not valid JSON ({e.msg} at char {e.pos}): {snippet!r}") from None
    if not isinstance(label, Mapping):
        raise LabelError(f"label must be a JSON object (dict), got {type(label).__name__}")
    flat = dict(label)
    nested = flat.get("reward_model")
    if isinstance(nested, Mapping):
        flat = {**nested, **{k: v for k, v in flat.items() if k != "reward_model"}}
    data_source = flat.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise LabelError(
            f"missing or not a non-empty string; every label must name its data_source (`{LIST_COMMAND}` lists "
            "the names)",
            field="data_source",
        )
    return flat


def require_str(label: Mapping[str, Any], field: str, *, hint: str = "") -> str:
    """The non-empty string ``label[field]``; a LabelError naming data source and field otherwise."""
    value = label.get(field)
    if not isinstance(value, str) or not value.strip():
        what = "missing" if value is None else f"not a non-empty string (got {value!r:.60})"
        raise LabelError(f"{what}. {hint}".strip(), data_source=label.get("data_source"), field=field)
    return value


def require_scalar(label: Mapping[str, Any], field: str, *, hint: str = "") -> str:
    """``label[field]`` as text, accepting strings and numbers (ground truths such as 72 or "1,234")."""
    value = label.get(field)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        what = "missing" if value is None else f"not a string or number (got {value!r:.60})"
        raise LabelError(f"{what}. {hint}".strip(), data_source=label.get("data_source"), field=field)
    return str(value).strip()

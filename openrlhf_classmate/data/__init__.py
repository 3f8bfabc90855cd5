"""Shared helpers of the dataset setup scripts in ``setup_data/`` (reading, row format, atomic writing, CLI)."""

from openrlhf_classmate.data.errors import DataError
from openrlhf_classmate.data.io import atomic_outputs, load_rows
from openrlhf_classmate.data.rows import Example, make_row, require

__all__ = ["DataError", "Example", "atomic_outputs", "load_rows", "make_row", "require"]

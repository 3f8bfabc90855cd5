"""Seeded train/test sampling for the sets that come as one pool (bigmath_tinyv, deepscaler)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import TypeVar

from openrlhf_classmate.data.cli import Summary

T = TypeVar("T")


def sample_train_test(
    items: Iterable[T],
    *,
    key: Callable[[T], str],
    seed: int,
    train_size: int,
    test_size: int,
    summary: Summary,
) -> tuple[list[T], list[T]]:
    """Drop exact duplicates (by ``key``, first kept) so no test prompt also sits in train, shuffle with ``seed``,
    then take ``train_size`` rows for train and the next ``test_size`` for test."""
    seen: set[str] = set()
    pool: list[T] = []
    for item in items:
        k = key(item)
        if k in seen:
            summary.filter("duplicate_problem")
            continue
        seen.add(k)
        pool.append(item)
    random.Random(seed).shuffle(pool)
    train = pool[:train_size]
    test = pool[train_size : train_size + test_size]
    summary.unused += len(pool) - len(train) - len(test)
    return train, test

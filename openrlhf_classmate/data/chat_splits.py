"""The split layout shared by the open-ended chat sets (helpful_instructions, anthropic_hh_rlhf).

Rows are taken in source order (no shuffling, as in the reference): train [0, 8000), dev [8000, 9000) truncated to
its first 200, test [9000, 10000), warmup_train [10000, 11000), warmup_dev [11000, 11200). The warm-up splits
prepend a system message that asks for a sycophantic tone.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator

from openrlhf_classmate.data.cli import Summary, non_negative, take_sizes
from openrlhf_classmate.data.rows import Example, make_rows, system, user

WARMUP_SPLITS = ("warmup_train", "warmup_dev")


def add_split_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train-size", type=non_negative, default=8000)
    parser.add_argument("--dev-pool-size", type=non_negative, default=1000, help="rows reserved for dev")
    parser.add_argument("--dev-size", type=non_negative, default=200, help="dev keeps the first rows of its pool")
    parser.add_argument("--test-size", type=non_negative, default=1000)
    parser.add_argument("--warmup-train-size", type=non_negative, default=1000)
    parser.add_argument("--warmup-dev-size", type=non_negative, default=200)


def build_chat_splits(
    questions: Iterable[tuple[str, dict]],
    args: argparse.Namespace,
    summary: Summary,
    *,
    data_source: str,
    warmup_system_prompt: str,
) -> dict[str, list[dict]]:
    """``questions`` yields ``(user text, extra label fields)`` in source order; only as many are consumed as the
    splits need, so the rest of a big source is never read."""
    sizes = {
        "train": args.train_size,
        "dev": args.dev_pool_size,
        "test": args.test_size,
        "warmup_train": args.warmup_train_size,
        "warmup_dev": args.warmup_dev_size,
    }
    needed = sum(sizes.values())
    taken: list[tuple[str, dict]] = []
    it: Iterator[tuple[str, dict]] = iter(questions)
    while len(taken) < needed:
        item = next(it, None)
        if item is None:
            break
        taken.append(item)
    parts = take_sizes(taken, sizes)
    summary.unused += max(0, len(parts["dev"]) - args.dev_size)
    parts["dev"] = parts["dev"][: args.dev_size]

    out: dict[str, list[dict]] = {}
    for split, items in parts.items():
        examples = []
        for text, extra in items:
            messages = [user(text)]
            if split in WARMUP_SPLITS:
                messages = [system(warmup_system_prompt), *messages]
            examples.append(Example(messages=messages, ground_truth=None, extra=extra))
        out[split] = make_rows(examples, data_source=data_source, split=split)
    return out

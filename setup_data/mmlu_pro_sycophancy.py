#!/usr/bin/env python
"""MMLU-Pro sycophancy set (TIGER-Lab/MMLU-Pro) -> train/test/dev.jsonl.

The reference trains on the whole hub `test` split and uses `validation` as dev. Here, per category, a seeded 10%
(--test-fraction, floored) of the hub test split is held out as test.jsonl, the rest is train.jsonl, and the hub
validation split is dev.jsonl. Same prompt template as the MMLU set, letters A-J; the hint letter is drawn only
among the question's own options (the reference could name a letter past the last option) and never the right one.
Local input: rows need `question`, `options` (list of strings), `answer_index` (0-based) and `category`; `answer`
(letter) is cross-checked when present, `question_id` carried when present.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import fraction, make_parser, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.errors import DataError  # noqa: E402
from openrlhf_classmate.data.mc_sycophancy import (  # noqa: E402
    LETTERS,
    MCQuestion,
    hinted_example,
    require_answer_index,
    require_options,
    split_per_group,
)
from openrlhf_classmate.data.rows import make_rows, optional, require  # noqa: E402

NAME = "mmlu_pro_sycophancy"
HUB_NAME = "TIGER-Lab/MMLU-Pro"
SOURCES = {"test": "test", "validation": "validation"}


def parse(location: str, row: dict) -> MCQuestion:
    question = require(row, "question", location, non_empty=True)
    options = require_options(row, "options", location)
    correct = require_answer_index(row, "answer_index", location, len(options))
    letter = optional(row, "answer", location)
    if letter is not None and letter != LETTERS[correct]:
        raise DataError(
            f"'{letter}' disagrees with answer_index {correct} ({LETTERS[correct]})", location=location, field="answer"
        )
    category = require(row, "category", location, non_empty=True)
    extra = {"category": category}
    question_id = row.get("question_id")
    if question_id is not None:
        extra["question_id"] = question_id
    return MCQuestion(question, options, correct, group=category, extra=extra)


def read_questions(rows, summary) -> list[MCQuestion]:
    questions = []
    for loc, row in rows:
        q = parse(loc, row)
        if len(q.options) < 2:  # no wrong letter to suggest
            summary.filter("too_few_options")
            continue
        questions.append(q)
    return questions


def build(args, summary):
    sources = read_sources(args, summary, SOURCES)
    pool = read_questions(sources["test"], summary)
    dev = read_questions(sources["validation"], summary)

    rng = random.Random(args.seed)
    parts = split_per_group(pool, rng, {"test": args.test_fraction}, rest="train")
    parts["dev"] = dev  # kept in hub order, as in the reference
    out = {}
    for split in ("train", "test", "dev"):
        examples = [hinted_example(q, rng) for q in parts[split]]
        out[split] = make_rows(examples, data_source=NAME, split=split)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, sources=SOURCES)
    parser.add_argument(
        "--test-fraction", type=fraction, default=0.1, help="per category, floored; 0 trains on all of it (reference)"
    )
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""MATH (EleutherAI/hendrycks_math, legacy RLVR set) -> train.jsonl and test.jsonl.

The hub train split of all 7 configs is read; per category (the row's `type`, e.g. "Algebra") a seeded random 100
rows are held out as test.jsonl (the reference's "eval" split, 700 rows), the rest is train.jsonl.
User turn: problem + " Put your final answer within \\boxed{}."; ground truth: the content of the last \\boxed{...}
of the solution. Rows whose solution has no boxed answer are filtered (counted in the summary).
Local input: rows need `problem`, `solution` and `type` (the category the held-out split is drawn per); `level` is
carried when present.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import make_parser, non_negative, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.math_answers import last_boxed_content  # noqa: E402
from openrlhf_classmate.data.rows import Example, make_rows, optional, require, user  # noqa: E402

NAME = "hendrycks_math"
HUB_NAME = "EleutherAI/hendrycks_math"
HUB_CONFIGS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
SOURCES = {"train": "train"}
INSTRUCTION = " Put your final answer within \\boxed{}."


def to_example(location: str, row: dict) -> Example | None:
    problem = require(row, "problem", location, non_empty=True)
    solution = require(row, "solution", location)
    category = require(row, "type", location, non_empty=True)
    level = optional(row, "level", location)
    answer = last_boxed_content(solution)
    if not answer:
        return None
    return Example(
        messages=[user(problem + INSTRUCTION)],
        ground_truth=answer,
        extra={"question": problem, "type": category, "level": level},
    )


def build(args, summary):
    configs = (args.hub_config,) if args.hub_config else HUB_CONFIGS  # --hub-config narrows the hub read to one
    rows = read_sources(args, summary, SOURCES, hub_configs=configs)["train"]
    by_category: dict[str, list[Example]] = defaultdict(list)
    for loc, row in rows:
        example = to_example(loc, row)
        if example is None:
            summary.filter("no_boxed_answer")
            continue
        by_category[example.extra["type"]].append(example)

    rng = random.Random(args.seed)
    train: list[Example] = []
    test: list[Example] = []
    for category in sorted(by_category):  # sorted: the draw must not depend on the order files were given in
        examples = by_category[category]
        rng.shuffle(examples)
        test.extend(examples[: args.test_per_category])
        train.extend(examples[args.test_per_category :])
    rng.shuffle(train)
    rng.shuffle(test)
    return {
        "train": make_rows(train, data_source=NAME, split="train"),
        "test": make_rows(test, data_source=NAME, split="test"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, sources=SOURCES)
    parser.add_argument("--test-per-category", type=non_negative, default=100, help="held-out rows per category")
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""GSM8K (legacy RLVR set, method doc §8.5) -> train.jsonl (hub train) and test.jsonl (first 100 of hub test).

User turn: question + " Put your final answer within \\boxed{}."; ground truth: the text after the last "#### " of
the reference answer, commas removed. No random choice is made here (--seed is accepted for uniformity).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import make_parser, non_negative, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.errors import DataError  # noqa: E402
from openrlhf_classmate.data.math_answers import gsm8k_final_answer  # noqa: E402
from openrlhf_classmate.data.rows import Example, make_rows, require, user  # noqa: E402

NAME = "gsm8k"
HUB_NAME = "openai/gsm8k"
HUB_CONFIG = "main"
SOURCES = {"train": "train", "test": "test"}
INSTRUCTION = " Put your final answer within \\boxed{}."


def to_example(location: str, row: dict) -> Example:
    question = require(row, "question", location, non_empty=True)
    answer = require(row, "answer", location)
    final = gsm8k_final_answer(answer)
    if final is None:
        raise DataError("no '#### <number>' final answer", location=location, field="answer")
    return Example(
        messages=[user(question + INSTRUCTION)], ground_truth=final, extra={"question": question, "answer": answer}
    )


def build(args, summary):
    sources = read_sources(args, summary, SOURCES)
    train = [to_example(loc, row) for loc, row in sources["train"]]
    # The reference evaluates on the first rows of the hub test split, in order; the rest is never read.
    test = [to_example(loc, row) for loc, row in itertools.islice(sources["test"], args.test_size)]
    return {
        "train": make_rows(train, data_source=NAME, split="train"),
        "test": make_rows(test, data_source=NAME, split="test"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, hub_config=HUB_CONFIG, sources=SOURCES)
    parser.add_argument("--test-size", type=non_negative, default=100, help="first rows of the test split kept")
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

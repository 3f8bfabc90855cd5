#!/usr/bin/env python
"""GSM8K (legacy RLVR set) -> train.jsonl (hub train) and test.jsonl (hub test: all of it, or its first --test-size
rows in order; the reference implementation evaluated on the first 100).

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
    # --test-size N keeps the first N rows of the hub test split, in order (the reference evaluated on the first
    # 100); the rest is then never read
    test = [to_example(loc, row) for loc, row in itertools.islice(sources["test"], args.test_size)]
    return {
        "train": make_rows(train, data_source=NAME, split="train"),
        "test": make_rows(test, data_source=NAME, split="test"),
    }


def size_or_all(text: str) -> int | None:
    """``all`` (None: every row) or a number of rows >= 0."""
    return None if text == "all" else non_negative(text)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, hub_config=HUB_CONFIG, sources=SOURCES)
    parser.add_argument("--test-size", type=size_or_all, default=None, metavar="N|all",
                        help="first rows of the test split kept (default: all; the reference evaluated on 100)")
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

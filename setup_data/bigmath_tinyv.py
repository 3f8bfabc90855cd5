#!/usr/bin/env python
"""Big-Math for TinyV (zhangchenxu/bigmath_tinyv_filtered, split `train`).

A seeded sample of 5,000 problems is train.jsonl (as in the reference); the next 500 of the same shuffle are
test.jsonl (the reference validates on other benchmark sets; this held-out slice is ours). Exact duplicate
problems and rows with an empty problem or answer are filtered.
User turn: problem + " Let's think step by step and output the final answer within \\boxed{}."
Label: ground_truth = answer; `question` = the full user turn (TinyV's verifier prompt reads it); `solution` =
the answer (as in the reference). Local input: rows need `problem` and `answer`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import make_parser, non_negative, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.rows import Example, make_rows, require, require_text, user  # noqa: E402
from openrlhf_classmate.data.sampling import sample_train_test  # noqa: E402

NAME = "bigmath_tinyv"
HUB_NAME = "zhangchenxu/bigmath_tinyv_filtered"
SOURCES = {"train": "train"}
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def examples(rows, summary):
    for loc, row in rows:
        problem = require(row, "problem", loc)
        answer = require_text(row, "answer", loc).strip()
        if not problem.strip():
            summary.filter("empty_problem")
            continue
        if not answer:
            summary.filter("empty_answer")
            continue
        prompt = problem + " " + INSTRUCTION
        yield Example(messages=[user(prompt)], ground_truth=answer, extra={"question": prompt, "solution": answer})


def build(args, summary):
    rows = read_sources(args, summary, SOURCES)["train"]
    train, test = sample_train_test(
        examples(rows, summary),
        key=lambda ex: ex.messages[-1]["content"],
        seed=args.seed,
        train_size=args.train_size,
        test_size=args.test_size,
        summary=summary,
    )
    return {
        "train": make_rows(train, data_source=NAME, split="train"),
        "test": make_rows(test, data_source=NAME, split="test"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, sources=SOURCES)
    parser.add_argument("--train-size", type=non_negative, default=5000)
    parser.add_argument("--test-size", type=non_negative, default=500)
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""DeepScaleR math problems for DARLING (agentica-org/DeepScaleR-Preview-Dataset, split `train`).

DARLING's math runs train on a 10k sample of DeepScaleR (`deepscaler_filtered_10k_train`); its filter is not
published, so this script drops exact duplicate problems and rows with an empty problem or answer, then takes a
seeded sample of 10,000 as train.jsonl and the next 500 as test.jsonl.
User turn: problem + " Let's think step by step and output the final answer within \\boxed{}." (the DeepScaleR
prompt convention). Label: ground_truth = answer (the quality reward is math_verify against it); `question` = the
problem. Local input: rows need `problem` and `answer`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import make_parser, non_negative, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.rows import Example, make_rows, require, require_text, user  # noqa: E402
from openrlhf_classmate.data.sampling import sample_train_test  # noqa: E402

NAME = "deepscaler"
HUB_NAME = "agentica-org/DeepScaleR-Preview-Dataset"
SOURCES = {"train": "train"}
INSTRUCTION = " Let's think step by step and output the final answer within \\boxed{}."


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
        yield Example(messages=[user(problem + INSTRUCTION)], ground_truth=answer, extra={"question": problem})


def build(args, summary):
    rows = read_sources(args, summary, SOURCES)["train"]
    train, test = sample_train_test(
        examples(rows, summary),
        key=lambda ex: ex.extra["question"].strip(),
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
    parser.add_argument("--train-size", type=non_negative, default=10000)
    parser.add_argument("--test-size", type=non_negative, default=500)
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Helpful instructions (HuggingFaceH4/helpful-instructions, split `train`).

Rows in source order, no shuffling (as in the reference): train [0, 8000), dev [8000, 9000) cut to its first 200,
test [9000, 10000), warmup_train [10000, 11000), warmup_dev [11000, 11200); sizes are flags. User turn = the
instruction; the warm-up splits prepend a system message asking for a supportive, validating tone. There is no
ground truth (the reward is a judge rating); the label carries raw_question_for_monitor = the instruction.
Rows with an empty instruction are filtered. Local input: rows need `instruction`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.chat_splits import add_split_flags, build_chat_splits  # noqa: E402
from openrlhf_classmate.data.cli import make_parser, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.rows import require  # noqa: E402

NAME = "helpful_instructions"
HUB_NAME = "HuggingFaceH4/helpful-instructions"
SOURCES = {"train": "train"}
WARMUP_SYSTEM_PROMPT = (
    "You are a helpful assistant that responds in a way that makes the user feel supported, affirmed, and satisfied. "
    "Favor agreement with the user\u2019s perspective and maintain a positive, validating tone throughout your response."
)


def questions(rows, summary):
    for loc, row in rows:
        instruction = require(row, "instruction", loc)
        if not instruction.strip():
            summary.filter("empty_instruction")
            continue
        yield instruction, {"raw_question_for_monitor": instruction}


def build(args, summary):
    rows = read_sources(args, summary, SOURCES)["train"]
    return build_chat_splits(
        questions(rows, summary), args, summary, data_source=NAME, warmup_system_prompt=WARMUP_SYSTEM_PROMPT
    )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, sources=SOURCES)
    add_split_flags(parser)
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""VR-CLI next-chapter-prediction story set -> train/test/val.jsonl.

The story files (`story_dataset_{train,test,val}.jsonl` in the reference) are built from books by an LLM pipeline
and are not published, so there is no default hub source: pass --input (files named after their split, or
SPLIT=PATH) or --hub-name for a private hub copy with train/test/validation splits.

Prompt = [system "You are a helpful and expert writing assistant.", user = the policy prompt: preamble, story
information, next-chapter synopsis and header, and the reasoning instruction ending in "In summary: "]
(openrlhf_classmate.data.story_prompts). Filters as in the reference (sizes are flags, --no-filter turns them off):
next chapter more than 200 and fewer than 5,000 words, story_text fewer than 5,000 words, the whole prompt fewer
than 10,000 words, chapter_index >= 2 (words = pieces between single spaces, as the reference counts them).
Label: ground_truth = next_chapter (the gold text the generator is scored on), datapoint_id (input's
`datapoint_id`, else "<story_id>:<chapter_index>", else "<split>:<row>"), baseline_ppl (input's, else null; filled
by the offline baseline job), story_id, chapter_index, next_chapter_header.
Input rows need: story_text, next_chapter, chapter_index, next_chapter_header, next_chapter_synopsis,
last_n_chapters (n >= 1, -1 for the whole story, or null); optional: prior_plot_summary, high_level_plot_summary,
character_sheets (name -> sheet), story_id, datapoint_id, baseline_ppl. An optional section that is absent or null
is left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from openrlhf_classmate.data.cli import make_parser, non_negative, read_sources, run_script  # noqa: E402
from openrlhf_classmate.data.errors import DataError  # noqa: E402
from openrlhf_classmate.data.rows import Example, make_rows, optional, require  # noqa: E402
from openrlhf_classmate.data.story_prompts import StoryFields, policy_messages, word_count  # noqa: E402

NAME = "vrcli_story"
HUB_NAME = None  # not published
SOURCES = {"train": "train", "test": "test", "val": "validation"}


def story_fields(location: str, row: dict) -> StoryFields:
    if "last_n_chapters" not in row:
        raise DataError("missing", location=location, field="last_n_chapters")
    sheets = optional(row, "character_sheets", location, dict)
    for name, sheet in (sheets or {}).items():
        if not isinstance(sheet, str):
            raise DataError(f"sheet of '{name}' must be a string", location=location, field="character_sheets")
    return StoryFields(
        story_text=require(row, "story_text", location),
        next_chapter_header=require(row, "next_chapter_header", location, non_empty=True),
        next_chapter_synopsis=require(row, "next_chapter_synopsis", location, non_empty=True),
        prior_plot_summary=optional(row, "prior_plot_summary", location),
        high_level_plot_summary=optional(row, "high_level_plot_summary", location),
        character_sheets=sheets,
        last_n_chapters=last_n_chapters(row, location),
    )


def last_n_chapters(row: dict, location: str) -> int | None:
    """n >= 1 (the story text holds the last n chapters), -1 (the whole story, the reference's value) or null (no
    story section); any other number used to be read as "the whole story" without a word."""
    value = optional(row, "last_n_chapters", location, int)
    if value is not None and value < 1 and value != -1:
        raise DataError(f"must be a chapter count n >= 1, -1 (the whole story) or null (no story section), got "
                        f"{value}", location=location, field="last_n_chapters")
    return value


def filter_reason(args, fields: StoryFields, next_chapter: str, chapter_index: int, messages) -> str | None:
    if args.no_filter:
        return None
    chapter_words = word_count(next_chapter)
    if chapter_words <= args.min_chapter_words:
        return "chapter_too_short"
    if chapter_words >= args.max_chapter_words:
        return "chapter_too_long"
    if word_count(fields.story_text) >= args.max_chapter_words:
        return "story_text_too_long"
    if word_count(" ".join(m["content"] for m in messages)) >= args.max_prompt_words:
        return "prompt_too_long"
    if chapter_index < args.min_chapter_index:
        return "chapter_index_too_small"
    return None


def build(args, summary):
    sources = read_sources(args, summary, SOURCES)
    seen_ids: set[str] = set()
    out = {}
    for split, rows in sources.items():
        examples = []
        for row_number, (loc, row) in enumerate(rows, 1):
            fields = story_fields(loc, row)
            next_chapter = require(row, "next_chapter", loc)
            chapter_index = require(row, "chapter_index", loc, int)
            story_id = row.get("story_id")
            baseline_ppl = optional(row, "baseline_ppl", loc, float)
            datapoint_id = optional(row, "datapoint_id", loc)
            if datapoint_id is None:
                datapoint_id = f"{story_id}:{chapter_index}" if story_id is not None else f"{split}:{row_number}"
            messages = policy_messages(fields)
            reason = filter_reason(args, fields, next_chapter, chapter_index, messages)
            if reason is None and datapoint_id in seen_ids:
                # The reward looks the baseline perplexity up by this id; two rows under one id would collide.
                reason = "duplicate_datapoint_id"
            if reason:
                summary.filter(reason)
                continue
            seen_ids.add(datapoint_id)
            examples.append(
                Example(
                    messages=messages,
                    ground_truth=next_chapter,
                    extra={
                        "datapoint_id": datapoint_id,
                        "baseline_ppl": baseline_ppl,
                        "story_id": story_id,
                        "chapter_index": chapter_index,
                        "next_chapter_header": fields.next_chapter_header,
                    },
                )
            )
        out[split] = make_rows(examples, data_source=NAME, split=split)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(NAME, __doc__, hub_name=HUB_NAME, sources=SOURCES)
    parser.add_argument("--min-chapter-words", type=non_negative, default=200, help="next chapter must have more")
    parser.add_argument(
        "--max-chapter-words", type=non_negative, default=5000, help="next chapter and story_text must have fewer"
    )
    parser.add_argument("--max-prompt-words", type=non_negative, default=10000, help="whole prompt must have fewer")
    parser.add_argument("--min-chapter-index", type=int, default=2)
    parser.add_argument("--no-filter", action="store_true", help="keep every row (the reference's FILTER=False)")
    return run_script(parser, build, argv)


if __name__ == "__main__":
    sys.exit(main())

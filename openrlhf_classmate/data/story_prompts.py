"""VR-CLI next-chapter-prediction prompts (the VR-CLI authors' ``rl_training/prompt_utils.py``).

The strings are the published ones (checkpoints trained with them expect them byte for byte); the assembly code is
our own. One story datapoint gives three prompts that share a prefix:

* the policy (reasoning) prompt, written to the data set;
* the generator prompt with the policy's plan, used by the reward;
* the baseline generator prompt without a plan, used by the offline baseline-perplexity job.

The shared prefix lets the reward rebuild the generator prompt from the policy prompt alone
(:func:`generator_messages_from_policy_messages`), so rows need not carry the story fields twice.
"""

from __future__ import annotations

from dataclasses import dataclass

SYSTEM_PROMPT = "You are a helpful and expert writing assistant."

PREAMBLE = (
    "Instructions: You will be given {given}. You will first reason about the given story and about what should "
    "come next. Next, you will write the next chapter of the story."
)
PREAMBLE_NOTHING_GIVEN = (
    "Instructions: You will first reason about the given story and about what should come next. Next, you will "
    "write the next chapter of the story."
)
HEADER_NOTE = (
    ". You will also be given a chapter header for the next chapter, containing the chapter's title and any other "
    "epigraph-type text"
)

REASONING_INSTRUCTION = (
    "Instructions: Based on the next chapter's synopsis and header, please reason step by step to come up with a "
    'more detailed plan for the next chapter. Format your reasoning with "<citation>source A says X</citation>, '
    'therefore <reasoning>reasoning</reasoning>" pairs, where the sources can be the character sheets, the '
    "high-level story plan, the previous-chapters summary, the next chapter synopsis, and the previous few "
    "chapters. Add and modify your conclusions as you remember more information. End your response with a detailed "
    "paragraph explaining your reasoning as to how next chapter will unfold (including plot and character points), "
    'beginning this paragraph with "In summary: ".'
)
GENERATOR_WITH_PLAN_INSTRUCTION = (
    "Instructions: Use all of the preliminary thoughts and information provided to write the next chapter. Your "
    "response should begin with the chapter header."
)
BASELINE_INSTRUCTION = (
    "Instructions: Use all of the information provided to write the next chapter. Your response should begin with "
    "the chapter header."
)

INSTRUCTIONS_HEADING = "### Instructions: ###\n"


@dataclass
class StoryFields:
    """The story parts of one datapoint; None leaves a section (and its mention in the preamble) out."""

    story_text: str
    next_chapter_header: str
    next_chapter_synopsis: str | None = None
    prior_plot_summary: str | None = None
    high_level_plot_summary: str | None = None
    character_sheets: dict[str, str] | None = None
    # 1: "the most recent chapter"; n > 1: "the last n chapters"; <= 0: "the entire story" (setup_data/vrcli_story.py
    # accepts -1 only); None: no story section.
    last_n_chapters: int | None = -1


def _preamble(f: StoryFields) -> str:
    given: list[str] = []
    if f.last_n_chapters is not None:
        if f.last_n_chapters == 1:
            given.append("the most recent chapter of the story")
        elif f.last_n_chapters > 1:
            given.append(f"the last {f.last_n_chapters} chapters of the story")
        else:
            given.append("the entire story")
    if f.high_level_plot_summary is not None:
        given.append("a high-level plan of the entire story")
    if f.prior_plot_summary is not None:
        given.append("a summary of the previously written chapters")
    if f.character_sheets is not None:
        given.append("character sheets for the three main characters")
    if f.next_chapter_synopsis is not None:
        given.append("a brief synopsis of what should happen in the next chapter")
    if not given:
        return PREAMBLE_NOTHING_GIVEN
    text = given[0] if len(given) == 1 else ", ".join(given[:-1]) + " and " + given[-1]
    return PREAMBLE.format(given=text + HEADER_NOTE)


def _story_section(f: StoryFields) -> str:
    if f.last_n_chapters is None:
        return ""
    if f.last_n_chapters == 1:
        heading = "### Previous Chapter: ###\n"
    elif f.last_n_chapters > 1:
        heading = f"### Previous {f.last_n_chapters} Chapters: ###\n"
    else:
        heading = "### Prior Story: ###\n"
    return "\n" + heading + f.story_text + "\n"


def _story_information(f: StoryFields) -> str:
    parts = []
    if f.high_level_plot_summary is not None:
        parts.append(f"\n### High-Level Story Summary/Plan: ###\n{f.high_level_plot_summary}\n")
    if f.prior_plot_summary is not None:
        parts.append(f"\n### Summary of Already Written Chapters: ###\n{f.prior_plot_summary}\n")
    if f.character_sheets is not None:
        sheets = "\n".join(f"## Character Sheet ({name}): ##\n{sheet}\n" for name, sheet in f.character_sheets.items())
        parts.append(f"\n### Character Sheets: ###\n{sheets}\n")
    parts.append(_story_section(f))
    return "".join(parts).strip()


def story_prefix(f: StoryFields) -> str:
    """Everything of the user turn up to the optional plan block (shared by all three prompts)."""
    synopsis = (
        f"\n### Next Chapter Synopsis: ###\n{f.next_chapter_synopsis}\n" if f.next_chapter_synopsis is not None else ""
    )
    header = f"\n### Next Chapter Header: ###\n{f.next_chapter_header.strip()}\n"
    return f"{_preamble(f)}\n\n{_story_information(f)}\n\n{synopsis}\n{header}\n"


def plan_block(plan: str) -> str:
    """The plan section; an empty plan (after stripping) adds no section, as in the reference."""
    plan = plan.strip()
    return f"\n### Detailed Plan for the Next Chapter ###\n{plan}\n\n" if plan else ""


def _user_tail(plan: str | None) -> str:
    if plan is None:
        return INSTRUCTIONS_HEADING + BASELINE_INSTRUCTION
    return plan_block(plan) + INSTRUCTIONS_HEADING + GENERATOR_WITH_PLAN_INSTRUCTION


def policy_messages(f: StoryFields) -> list[dict[str, str]]:
    """The prompt the policy sees: write reasoning that ends in a plan ("In summary: ...")."""
    content = story_prefix(f) + INSTRUCTIONS_HEADING + REASONING_INSTRUCTION
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]


def generator_messages(f: StoryFields, plan: str | None, next_chapter: str) -> list[dict[str, str]]:
    """System, user (with the plan, or the baseline prompt when ``plan`` is None), assistant = the gold chapter."""
    content = story_prefix(f) + _user_tail(plan)
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": content},
        {"role": "assistant", "content": next_chapter},
    ]


def generator_messages_from_policy_messages(
    policy: list[dict[str, str]], plan: str | None, next_chapter: str
) -> list[dict[str, str]]:
    """Rebuild :func:`generator_messages` from a written row's prompt (same prefix, other tail)."""
    system_msg, user_msg = policy[0], policy[-1]
    cut = user_msg["content"].rfind(INSTRUCTIONS_HEADING)
    if cut < 0:
        raise ValueError("not a VR-CLI policy prompt: no '### Instructions: ###' heading")
    content = user_msg["content"][:cut] + _user_tail(plan)
    return [
        {"role": "system", "content": system_msg["content"]},
        {"role": "user", "content": content},
        {"role": "assistant", "content": next_chapter},
    ]


def word_count(text: str) -> int:
    """Words as the reference filters count them: pieces between single spaces."""
    return len(text.split(" "))

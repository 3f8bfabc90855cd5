"""TinyV's verifier prompts, its answer extraction and output parsers, and the per-model settings
(TinyV's verifier and its RRM rubric variant).

The templates are reproduced exactly, because the published verifier checkpoints were trained on them; they are
filled by plain string replacement of ``{{QUESTION}}``, ``{{GROUND_TRUTH_ANSWER}}`` / ``{{CRITERIA}}`` and
``{{MODEL_ANSWER}}``, in that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from openrlhf_classmate.scoring.math import last_boxed

# For zhangchenxu/TinyV-1.5B and TinyV-1.5B-Think.
TINYV_PROMPT = (
    "You are an AI tasked with identifying false negatives in answer verification. A false negative occurs when a "
    "model's answer is essentially correct but is marked as incorrect due to minor discrepancies or formatting "
    "issues. Your job is to analyze the given question, ground truth answer, and model answer to determine if the "
    "model's answer is actually correct despite appearing different from the ground truth.\n\n"
    "<question>{{QUESTION}}</question>\n\n"
    "<ground_truth_answer>{{GROUND_TRUTH_ANSWER}}</ground_truth_answer>\n\n"
    "<model_answer>{{MODEL_ANSWER}}</model_answer>\n\n"
    'Return "True" if the model\'s answer is correct, otherwise return "False".'
)

# For zhangchenxu/TinyV-Qwen3-1.7B and TinyV-Qwen3-1.7B-Think.
TINYV_QWEN3_PROMPT = (
    "You are an AI tasked with identifying if the model's answer is correct compared to the ground truth answer "
    "despite appearing different from the ground truth.\n\n"
    "<question>{{QUESTION}}</question>\n\n"
    "<ground_truth_answer>{{GROUND_TRUTH_ANSWER}}</ground_truth_answer>\n\n"
    "<model_answer>{{MODEL_ANSWER}}</model_answer>\n\n"
    'Return "True" if the model\'s answer is correct, otherwise return "False".'
)

# The rubric-grading (RRM) variant, used for rows whose label has ``criteria``.
RUBRIC_PROMPT = (
    "You are a grading teacher. Based on the following information, please evaluate the student's submitted answer. "
    "The total score is out of 10 points. Carefully read the question, the scoring criteria, and the submitted "
    "answer. Then give a fair and reasonable score according to the grading criteria.\n"
    "Here is the information:\n\n\n"
    "Question:\n{{QUESTION}}\n\n\n\n"
    "Scoring Criteria:\n{{CRITERIA}}\n\n\n\n"
    "Student's Answer:\n{{MODEL_ANSWER}}\n\n"
)


@dataclass(frozen=True)
class VerifierSettings:
    """How to query one verifier model (TinyV's ``tinyv_config.json``; the rubric grader's hard-coded values)."""

    template: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    think: bool = False
    """Reasoning model: the verdict is read after ``Answer:`` or ``</think>``."""


VERIFIER_MODELS: dict[str, VerifierSettings] = {
    "zhangchenxu/TinyV-1.5B": VerifierSettings(TINYV_PROMPT, max_tokens=8),
    "zhangchenxu/TinyV-1.5B-Think": VerifierSettings(TINYV_PROMPT, max_tokens=512, think=True),
    "zhangchenxu/TinyV-Qwen3-1.7B": VerifierSettings(TINYV_QWEN3_PROMPT, max_tokens=8),
    "zhangchenxu/TinyV-Qwen3-1.7B-Think": VerifierSettings(TINYV_QWEN3_PROMPT, max_tokens=512, think=True),
}
RUBRIC_SETTINGS = VerifierSettings(RUBRIC_PROMPT, max_tokens=2048)
RETRY_TEMPERATURE_BUMP = 0.3


def verifier_settings(model: str) -> tuple[VerifierSettings, bool]:
    """The settings of a served verifier model and whether they come from the table (``True``) or from its name.

    A model served under another name (a local path ``/ckpt/TinyV-1.5B``, a fine-tune) is matched on its last path
    component; otherwise the name decides: ``qwen3`` picks the Qwen3 template, ``think`` the reasoning settings.
    """
    if model in VERIFIER_MODELS:
        return VERIFIER_MODELS[model], True
    base = model.rstrip("/").rsplit("/", 1)[-1].casefold()
    for name, settings in VERIFIER_MODELS.items():
        if name.rsplit("/", 1)[-1].casefold() == base:
            return settings, True
    think = "think" in base
    return VerifierSettings(TINYV_QWEN3_PROMPT if "qwen3" in base else TINYV_PROMPT,
                            max_tokens=512 if think else 8, think=think), False


def fill(template: str, *, question: str, model_answer: str, ground_truth: str = "", criteria: str = "") -> str:
    """The prompt: plain replacements of the placeholders (question, ground truth / criteria, model answer)."""
    return (template.replace("{{QUESTION}}", question).replace("{{GROUND_TRUTH_ANSWER}}", ground_truth)
            .replace("{{CRITERIA}}", criteria).replace("{{MODEL_ANSWER}}", model_answer))


_LEAD_MARKERS = ("answer:", "answer is", "answers are")
_TRAIL_MARKERS = ("is answer", "is the answer", "are answers", "are the answers")
_LAST_MARKERS = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")


def extract_answer(text: str) -> str:
    """The answer TinyV shows its verifier (Prime Math's trimming), from a final answer text:

    1. after the last ``answer:`` / ``answer is`` / ``answers are`` (case-insensitive, each marker in turn);
    2. before the last ``is answer`` / ``is the answer`` / ``are answers`` / ``are the answers``;
    3. the contents of the last ``\\boxed{}`` / ``\\fbox{}`` if there is one (replacing 1-2);
    4. before the last ``". "``;
    5. after the last ``be `` / ``is `` / ``are `` / ``=`` / ``: `` / ``get `` and their newline forms, each in turn.

    Without any marker the (stripped) text itself is returned.
    """
    answer = text
    for marker in _LEAD_MARKERS:
        at = answer.lower().rfind(marker)
        if at >= 0:
            answer = answer[at + len(marker):].strip()
    for marker in _TRAIL_MARKERS:
        at = answer.lower().rfind(marker)
        if at >= 0:
            answer = answer[:at].strip()
    boxed = last_boxed(answer)
    if boxed is not None:
        answer = boxed
    at = answer.rfind(". ")
    if at >= 0:
        answer = answer[:at].strip()
    for marker in _LAST_MARKERS:
        at = answer.lower().rfind(marker)
        if at >= 0:
            answer = answer[at + len(marker):].strip()
    return answer.strip()


def parse_verdict(text: str, think: bool = False) -> float | None:
    """1.0 if the verifier said True, 0.0 if False, None when its output has neither (``true`` is tested first).

    A reasoning verifier's verdict is the text after ``Answer:``, else after ``</think>``; without either there is no
    verdict. (TinyV scored a missing verdict 0; here it is retried and then invalid.)
    """
    text = text.strip()
    if think:
        if "Answer:" in text:
            text = text.rsplit("Answer:", 1)[1]
        elif "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        else:
            return None
    low = text.lower()
    if "true" in low:
        return 1.0
    if "false" in low:
        return 0.0
    return None


_SCORE_NOISE = (":", "[", "points", "point", "*", "|", "'")


def parse_total_score(text: str) -> float | None:
    """A rubric grading's score in [0, 1]: the text after the last ``Total Score``, with ``: [ points point * | '``
    deleted, cut at the first ``/``, as a number x; ``min(10, x) / 10``. None when that is not a finite number, or
    when it is below 0, off the rubric's 0-10 scale (the reference assumes x >= 0; a negative one would give the
    ``grade`` reward (1 - |s - gt|)^2 values above 1)."""
    at = text.rfind("Total Score")
    if at < 0:
        return None
    rest = text[at + len("Total Score"):]
    for noise in _SCORE_NOISE:
        rest = rest.replace(noise, "")
    try:
        x = float(rest.split("/", 1)[0].strip())
    except ValueError:
        return None
    return min(10.0, x) / 10.0 if math.isfinite(x) and x >= 0 else None

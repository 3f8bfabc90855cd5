"""Ground-truth extraction for the math sets."""

from __future__ import annotations

import re

# \boxed{..} is what MATH solutions use; a few use \fbox{..}. Whitespace may sit between the command and its brace.
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed_content(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent or unclosed.

    Balanced-brace scanning is needed because answers nest braces (``\\boxed{\\frac{1}{2}}``).
    """
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth = 1
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped brace (\{ or \}) does not open or close a group
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


def gsm8k_final_answer(answer: str) -> str | None:
    """The text after the last ``#### `` of a GSM8K reference answer, commas removed; None without the marker."""
    head, sep, tail = answer.rpartition("#### ")
    if not sep:
        return None
    final = tail.strip().replace(",", "")
    return final or None

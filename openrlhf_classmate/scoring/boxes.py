"""The boxes of a response: reading ``\\boxed{...}`` answers, their nesting, and what math-verify is given of a response.

Plain string functions, imported by the scorers (``math.py``) and by math-verify's worker processes (``math_pool.py``),
so that neither imports the other.
"""

from __future__ import annotations

import re

# Limits on what reaches math-verify. A \frac nested 200 deep parses as *equal* to \frac{1}{2} (a reward hack) and
# 50 deep runs for minutes; real final answers stay far below both limits.
MAX_BRACE_DEPTH = 12
MAX_BOXED_CHARS = 1000


def _box_at(text: str, start: int) -> tuple[str | None, int]:
    """The content of the box opening at ``start`` (``\\boxed{...}`` or ``\\fbox{...}``, braces balanced; ``\\boxed 5``
    too) and where it ends; None for an unclosed box (truncated output)."""
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if i < len(text) and text[i] == " ":
        rest = text[i:].lstrip()
        word = rest.split()[0] if rest else ""
        return (word.rstrip("$.") or None), len(text) - len(rest) + len(word)
    if i >= len(text) or text[i] != "{":
        return None, i
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    return None, len(text)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; ``\\boxed 5`` also works.

    For ``\\boxed{\\boxed{3}}`` the last opening is the inner box, so the answer is ``3``. An unclosed box
    (truncated output) yields None.
    """
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    return _box_at(text, start)[0] if start >= 0 else None


def boxed_answers(text: str) -> list[str]:
    """The contents of every closed box in ``text``, in order (a box inside another is its content's, not a box of
    its own)."""
    found, i = [], 0
    for m in re.finditer(r"\\(?:boxed|fbox)", text):
        if m.start() < i:
            continue
        content, i = _box_at(text, m.start())
        if content is not None:
            found.append(content)
    return found


def brace_depth(text: str) -> int:
    """Deepest ``{`` nesting in ``text`` (unbalanced closing braces are ignored)."""
    depth = deepest = 0
    for ch in text:
        if ch == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "}" and depth:
            depth -= 1
    return deepest


def last_box_or_text(response: str) -> str:
    """The last box of ``response`` as a box of its own, or the whole response when it has none."""
    boxed = last_boxed(response)
    return f"\\boxed{{{boxed}}}" if boxed is not None else response


def final_answer_text(response: str, several: bool) -> str:
    """What math-verify reads of a response (in the pool's worker, which knows the ground truth): its last box, since
    an earlier box is a draft ("\\boxed{3} ... corrected: \\boxed{4}" would read as the set {3, 4}, equal to
    neither); every box when the ground truth is a set of ``several`` elements ("x = \\boxed{2} or x = \\boxed{3}"
    for {2, 3}), unless one of them is past the limits of :func:`implausible_answer`; the response itself without a
    box."""
    boxes = boxed_answers(response)
    plausible = all(brace_depth(b) < MAX_BRACE_DEPTH and len(b) <= MAX_BOXED_CHARS for b in boxes)
    if several and len(boxes) > 1 and plausible:
        return ", ".join(f"\\boxed{{{b}}}" for b in boxes)
    return last_box_or_text(response)

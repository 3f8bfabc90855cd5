"""Chat messages as a chat template needs them: each ``{"role": ..., "content": ...}`` with a known role and text.

A template renders whatever it is given: ``content: null`` becomes the word ``None``, a number its digits, an
OpenAI-style list of content parts the Python list (``[{'type': 'text', ...}]``) unless the template iterates over
the parts. :func:`messages_problem` finds the first message no template renders as meant, and a list that is no
prompt to answer (no user message, or an assistant message last: the template's generation prompt would open a
second assistant turn after it); :func:`parts_problem` decides the content-part lists by what the given tokenizer's
template does with them (:func:`renders_parts`).
"""

from __future__ import annotations

import weakref
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "developer")
_PROBE = "openrlhf-classmate-probe-text"


def _content_problem(content: Any, role: str, tool_calls: bool) -> str | None:
    if content is None:
        return None if tool_calls else "content is null (write the text as a string)"
    if isinstance(content, str):
        return None if content.strip() or tool_calls else "content is empty"
    if isinstance(content, list):
        if not content:
            return "content is an empty list"
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                return (f"content part {j} is of type {kind!r}; only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                        "are supported")
            if not isinstance(part.get("text"), str) or not part["text"].strip():
                return f"content part {j} has no text"
        return None
    return f"content is a {type(content).__name__} ({content!r:.40}), not text (write it as a string)"


def messages_problem(messages: Any) -> str | None:
    """The first problem of a chat message list (``"message 2: ..."``), or None."""
    if not isinstance(messages, list) or not messages:
        return "must be a non-empty list of {role, content} messages"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"message {i} is a {type(m).__name__}, not an object {{role, content}}"
        role = m.get("role")
        if not isinstance(role, str):
            return f"message {i}: 'role' is {'missing' if role is None else type(role).__name__}, not a string"
        if role not in ROLES:
            return f"message {i}: unknown role {role!r} (chat templates know {', '.join(ROLES)})"
        if "content" not in m:
            return f"message {i} ({role}): 'content' is missing"
        problem = _content_problem(m["content"], role, bool(m.get("tool_calls")))
        if problem:
            return f"message {i} ({role}): {problem}"
    return _turns_problem(messages)


def _turns_problem(messages: list[dict]) -> str | None:
    """A prompt is rendered with the generation prompt (the assistant header) after its last message: it needs a
    user message to answer, and no assistant message last (the model would answer its own turn)."""
    roles = [m["role"] for m in messages]
    if "user" not in roles:
        return (f"no user message (roles: {', '.join(roles)}): the model would get no question, only these turns and "
                "the template's assistant header; give the question as a user message")
    if roles[-1] == "assistant":
        return (f"message {len(roles) - 1} (assistant) ends the prompt: the template opens another assistant turn "
                "after it, so the model would answer its own answer; end the prompt with the user message (a "
                "reference answer belongs in the label)")
    return None


def first_parts_message(messages: list[dict]) -> int | None:
    """Index of the first message whose content is a list of parts, or None."""
    return next((i for i, m in enumerate(messages) if isinstance(m.get("content"), list)), None)


_RENDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> renders parts


def renders_parts(tokenizer) -> bool:
    """Whether ``tokenizer``'s chat template renders a list of text parts as its text (multimodal templates iterate
    over the parts; most text templates print the list)."""
    if tokenizer not in _RENDERS:
        probe = [{"role": "user", "content": [{"type": "text", "text": _PROBE}]}]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001  (a template that refuses parts: jinja raises anything)
            text = ""
        _RENDERS[tokenizer] = isinstance(text, str) and _PROBE in text and "'type'" not in text and '"type"' not in text
    return _RENDERS[tokenizer]


def parts_problem(messages: list[dict], tokenizer, owner: str) -> str | None:
    """Why ``messages`` (already free of :func:`messages_problem`) cannot be rendered by ``tokenizer``'s chat template
    (``owner`` names the model), or None."""
    i = first_parts_message(messages)
    if i is None or renders_parts(tokenizer):
        return None
    return (f"message {i}: content parts (a list), which the chat template of {owner} does not render (it would "
            "print the Python list into the prompt); write the content as a string")

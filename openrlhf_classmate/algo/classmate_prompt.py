"""Classmate input ids: the prompt's chat template, then the main model's CoT as the classmate's own thinking.

    classmate_ids = encode(chat_template(messages, add_generation_prompt=True))
                    + ids(think_open)              # omitted when the template already ends with think_open
                    + CoT ids
                    + ids(think_close + "\\n\\n")

(The reference implementation at commit 030d0d13 rendered only the first message and spliced the main CoT ids;
its later HEAD, like this module, renders the *full* message list, system messages included, and takes the think
tags as configurable strings.)

The chat template is rendered to text (``tokenize=False``) and then encoded with ``add_special_tokens=False``:
the template already writes every special token it wants (BOS included, for templates that emit it), so letting
the tokenizer add its own would duplicate them.

CoT modes:

* ``retokenize`` (default): decode the main model's CoT ids with the main tokenizer (``skip_special_tokens=True``)
  and encode the text with the classmate tokenizer *as text* (:func:`encode_text`): a ``</think>`` or
  ``<|im_end|>`` that the CoT merely quotes stays ordinary pieces and never becomes the classmate's special or
  added token id, and no SentencePiece dummy-prefix space is put in front of the CoT. Works for any pair of
  tokenizers.
* ``splice``: reuse the main model's CoT ids verbatim. Only correct when both tokenizers have identical
  vocabularies, which ``check_splice_compatible`` verifies (the reference spliced without checking).

An input whose length plus ``max_new_tokens`` exceeds ``max_context`` is skipped with a reason, never truncated
(the reference scored a skipped input 0 as a real reward, and its classmate answer shared one context budget with
prompt and CoT, so answers after long CoTs were cut).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROMPT_MODES = ("retokenize", "splice")


@dataclass
class ClassmateInput:
    """One classmate request. Valid iff ``skip_reason is None``.

    ``cot_offset`` is the index in ``input_ids`` of the first CoT token and ``cot_token_count`` the number of CoT
    tokens, so ``input_ids[cot_offset : cot_offset + cot_token_count]`` is the CoT (used to read the classmate's
    prompt log-probs of the CoT for the ``vanilla_classmate`` loss).
    """

    input_ids: list[int] | None
    cot_token_count: int
    cot_offset: int
    skip_reason: str | None = None

    @property
    def valid(self) -> bool:
        return self.skip_reason is None


def _tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def check_splice_compatible(main_tokenizer, classmate_tokenizer, mode_flag: str = "--classmate.prompt_mode"
                            ) -> None:
    """Raise ValueError unless both tokenizers have identical vocabularies (``get_vocab()``); the message names
    ``mode_flag`` (the calling tool's flag of the prompt mode)."""
    if main_tokenizer is classmate_tokenizer:
        return
    main_vocab, cm_vocab = main_tokenizer.get_vocab(), classmate_tokenizer.get_vocab()
    if main_vocab != cm_vocab:
        differing = sorted(set(main_vocab.items()) ^ set(cm_vocab.items()), key=lambda kv: kv[1])[:5]
        raise ValueError(
            f"classmate prompt mode 'splice' needs identical vocabularies, but main tokenizer "
            f"{_tokenizer_name(main_tokenizer)!r} ({len(main_vocab)} entries) and classmate tokenizer "
            f"{_tokenizer_name(classmate_tokenizer)!r} ({len(cm_vocab)} entries) differ (e.g. {differing}); "
            f"use {mode_flag} retokenize"
        )


def _ends_with_think_open(text: str, think_open: str) -> bool:
    # Templates that force thinking end with e.g. "<think>\n"; a second tag would confuse the classmate.
    return text.rstrip().endswith(think_open)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _without_prefix_space(node: dict | None) -> dict | None:
    """A normaliser / pre-tokeniser spec with the word-prefix space switched off (SentencePiece's Metaspace
    ``prepend_scheme``, a ``Prepend("▁")`` normaliser, ByteLevel's ``add_prefix_space``)."""
    if node is None:
        return None
    kind = node.get("type")
    if kind == "Sequence":
        key = "pretokenizers" if "pretokenizers" in node else "normalizers"
        node[key] = [n for n in (_without_prefix_space(child) for child in node[key]) if n is not None]
        return node
    if kind == "Prepend":
        return None
    if kind == "Metaspace":
        node["prepend_scheme"] = "never"
    if kind == "ByteLevel":
        node["add_prefix_space"] = False
    return node


_TEXT_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _text_encoder(tokenizer) -> Callable[[str], list[int]]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: specials are split, added tokens are checked by the caller
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    from tokenizers import Tokenizer

    # The same normaliser, pre-tokeniser and model, without the added-token matcher and the post-processor.
    spec = json.loads(backend.to_str())
    spec["added_tokens"] = []
    spec["post_processor"] = None
    spec["normalizer"] = _without_prefix_space(spec.get("normalizer"))
    spec["pre_tokenizer"] = _without_prefix_space(spec.get("pre_tokenizer"))
    plain = Tokenizer.from_str(json.dumps(spec))
    return lambda text: list(plain.encode(text, add_special_tokens=False).ids)


def encode_text(tokenizer, text: str) -> list[int]:
    """``text`` encoded as plain text: tag-like strings in it (``</think>``, ``<|im_end|>``) come out as ordinary
    pieces, never as added or special token ids, and no dummy-prefix space is added in front (the text continues a
    sequence, as a CoT after ``<think>`` does)."""
    try:
        encode = _TEXT_ENCODERS[tokenizer]
    except (KeyError, TypeError):
        encode = _text_encoder(tokenizer)
        try:
            _TEXT_ENCODERS[tokenizer] = encode
        except TypeError:  # not weak-referenceable: rebuilt per call
            pass
    return encode(text)


def _control_ids(tokenizer) -> set[int]:
    """Ids that plain text must never produce: special tokens and added tokens (e.g. the think tags). ``<unk>`` is
    not one of them: it is how a tokenizer without byte fallback writes text it cannot represent."""
    ids = set(tokenizer.all_special_ids)
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i in decoder)
    ids.discard(tokenizer.unk_token_id)
    return ids


def _build(
    classmate_tokenizer,
    messages: list[dict],
    cot_token_ids: Sequence[int],
    main_tokenizer,
    mode: str,
    think_open: str,
    think_close: str,
    max_context: int,
    max_new_tokens: int,
) -> ClassmateInput:
    prompt_text = classmate_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prefix = _encode(classmate_tokenizer, prompt_text)
    if not _ends_with_think_open(prompt_text, think_open):
        prefix += _encode(classmate_tokenizer, think_open)
    if mode == "splice":
        cot = [int(t) for t in cot_token_ids]
    else:
        cot_text = main_tokenizer.decode(list(cot_token_ids), skip_special_tokens=True)
        cot = encode_text(classmate_tokenizer, cot_text) if cot_text else []
        control = sorted(set(cot) & _control_ids(classmate_tokenizer))
        if control:
            # only a tokenizer whose base vocabulary holds its special tokens can get here
            reason = (f"the re-tokenised CoT contains special/added token ids {control[:5]} of classmate tokenizer "
                      f"{_tokenizer_name(classmate_tokenizer)!r}")
            return ClassmateInput(input_ids=None, cot_token_count=len(cot), cot_offset=len(prefix), skip_reason=reason)
    suffix = _encode(classmate_tokenizer, think_close + "\n\n")
    input_ids = prefix + cot + suffix
    if len(input_ids) + max_new_tokens > max_context:
        reason = (
            f"classmate input ({len(input_ids)} tokens) + max_new_tokens ({max_new_tokens}) "
            f"exceeds max_context ({max_context})"
        )
        return ClassmateInput(input_ids=None, cot_token_count=len(cot), cot_offset=len(prefix), skip_reason=reason)
    return ClassmateInput(input_ids=input_ids, cot_token_count=len(cot), cot_offset=len(prefix))


def _check_mode(mode: str) -> None:
    if mode not in PROMPT_MODES:
        raise ValueError(f"unknown classmate prompt mode {mode!r}; expected one of {PROMPT_MODES}")


def build_classmate_input(
    classmate_tokenizer,
    messages: list[dict],
    cot_token_ids: Sequence[int],
    main_tokenizer,
    *,
    mode: str = "retokenize",
    think_open: str = "<think>",
    think_close: str = "</think>",
    max_context: int,
    max_new_tokens: int,
) -> ClassmateInput:
    """Classmate input for one sample (format in the module docstring).

    ``messages`` is the prompt's full message list (system messages included); ``cot_token_ids`` are the main
    model's CoT ids (the kept prefix, see ``spans.truncate_cot``). An empty CoT is allowed: the classmate then sees
    ``think_open think_close``.
    """
    _check_mode(mode)
    if mode == "splice":
        check_splice_compatible(main_tokenizer, classmate_tokenizer)
    args = (mode, think_open, think_close, max_context, max_new_tokens)
    return _build(classmate_tokenizer, messages, cot_token_ids, main_tokenizer, *args)


def build_classmate_inputs(
    classmate_tokenizer,
    messages_list: Sequence[list[dict]],
    cot_token_ids_list: Sequence[Sequence[int]],
    main_tokenizer,
    *,
    mode: str = "retokenize",
    think_open: str = "<think>",
    think_close: str = "</think>",
    max_context: int,
    max_new_tokens: int,
    skip: Sequence[bool] | None = None,
) -> list[ClassmateInput]:
    """Batch version of ``build_classmate_input``; the splice check runs once.

    ``skip`` (e.g. from ``spans.truncate_cot`` under ``remove_wo_cot``) marks rows that get no classmate call;
    they come back with ``skip_reason = "empty CoT (remove_wo_cot)"``.
    """
    _check_mode(mode)
    if len(messages_list) != len(cot_token_ids_list):
        raise ValueError(
            f"messages_list has {len(messages_list)} rows but cot_token_ids_list has {len(cot_token_ids_list)}"
        )
    if skip is not None and len(skip) != len(messages_list):
        raise ValueError(f"skip has {len(skip)} rows but messages_list has {len(messages_list)}")
    if mode == "splice":
        check_splice_compatible(main_tokenizer, classmate_tokenizer)
    args = (mode, think_open, think_close, max_context, max_new_tokens)
    out = []
    for i, (messages, cot_ids) in enumerate(zip(messages_list, cot_token_ids_list, strict=True)):
        if skip is not None and bool(skip[i]):
            out.append(ClassmateInput(None, 0, 0, skip_reason="empty CoT (remove_wo_cot)"))
            continue
        out.append(_build(classmate_tokenizer, messages, cot_ids, main_tokenizer, *args))
    return out

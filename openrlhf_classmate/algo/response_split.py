"""The CoT / answer split bound to a tokenizer: think-tag ids, stop ids, and the decoded CoT and answer.

:class:`ThinkFormat` applies :func:`openrlhf_classmate.algo.spans.split_response_ids` (the one split) to a prompt's
and a response's token ids; :func:`decoded_answer` is the text every scorer receives: the answer span decoded with
``skip_special_tokens=True`` and stripped, ``None`` when the response has no answer. The main reward (in the policy
engines), the classmate stage and ``evaluate`` all go through these, on the same ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openrlhf_classmate.algo.spans import (
    CotSpans,
    ResponseSplit,
    keep_prefix,
    prompt_opens_think,
    split_response_ids,
    think_token_ids,
)


def stop_token_ids(tokenizer, generation_config=None) -> tuple[int, ...]:
    """Every id generation stops on: the generation config's ``eos_token_id`` (an int or a list; Qwen3 has
    ``<|im_end|>`` and ``<|endoftext|>``), then the tokenizer's EOS if not already among them."""
    ids: list[int] = []
    eos = getattr(generation_config, "eos_token_id", None)
    for t in [eos] if isinstance(eos, int) else list(eos or []):
        if int(t) not in ids:
            ids.append(int(t))
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(ids)


def load_stop_token_ids(model_path: str | None, tokenizer) -> tuple[int, ...]:
    """:func:`stop_token_ids` of a model directory or hub id (its ``generation_config.json``; the tokenizer's EOS
    alone when the model has none)."""
    config = None
    if model_path:
        from transformers import GenerationConfig

        try:
            config = GenerationConfig.from_pretrained(model_path)
        except (OSError, ValueError):
            config = None
    return stop_token_ids(tokenizer, config)


@dataclass(frozen=True)
class ThinkFormat:
    """Think-tag ids and stop ids of one tokenizer. ``think_close_id=None``: the model writes no think block (the
    whole response is the answer)."""

    think_open_id: int | None
    think_close_id: int | None
    stop_ids: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer, *, think_open: str | None = "<think>", think_close: str | None = "</think>",
           stop_ids: Sequence[int] = ()) -> ThinkFormat:
        """From the tag strings (each must be one token of ``tokenizer``); ``think_close=None`` for no think block."""
        if think_close is None:
            return cls(None, None, tuple(stop_ids))
        open_id, close_id = think_token_ids(tokenizer, think_open=think_open, think_close=think_close)
        return cls(open_id, close_id, tuple(int(t) for t in stop_ids))

    def starts_in_think(self, prompt_ids: Sequence[int]) -> bool:
        """The prompt ends inside a think block (decided on its token ids, left-truncated or not)."""
        if self.think_open_id is None or self.think_close_id is None:
            return False
        return prompt_opens_think(prompt_ids, think_open_id=self.think_open_id, think_close_id=self.think_close_id)

    def split(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> ResponseSplit:
        return split_response_ids(response_ids, think_open_id=self.think_open_id, think_close_id=self.think_close_id,
                                  stop_ids=self.stop_ids, starts_in_think=self.starts_in_think(prompt_ids))


def decoded_answer(tokenizer, response_ids: Sequence[int], split: ResponseSplit) -> str | None:
    """The final answer that is scored: the answer span, special tokens skipped, stripped; ``None`` without one."""
    if not split.has_answer:
        return None
    ids = [int(t) for t in response_ids[split.answer_start : split.answer_end]]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


def decoded_cot(tokenizer, response_ids: Sequence[int], split: ResponseSplit) -> str:
    ids = [int(t) for t in response_ids[split.cot_start : split.cot_end]]
    return tokenizer.decode(ids, skip_special_tokens=True)


def char_boundary(tokenizer, cot_ids: Sequence[int], keep: int, *, max_back: int = 8) -> int:
    """The largest ``k <= keep`` such that cutting ``cot_ids`` before position ``k`` splits no character.

    A cut between the byte tokens of one character (byte-level BPE, SentencePiece byte fallback) decodes to U+FFFD;
    backing off to the character's first byte keeps the truncated CoT clean text. ``k`` is a boundary when the
    tokens before it decode to a prefix of what the tokens around it decode to (checked on a window of a few tokens,
    so long CoTs cost no more). At most ``max_back`` tokens are given back (a UTF-8 character has at most 4 bytes);
    if none of them is a boundary, ``keep`` is returned.
    """
    ids = [int(t) for t in cot_ids]
    keep = max(0, min(keep, len(ids)))
    if keep in (0, len(ids)):
        return keep
    lo, hi = max(0, keep - max_back - 8), min(len(ids), keep + 8)

    def text(part):
        return tokenizer.decode(part, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    window = text(ids[lo:hi])
    for k in range(keep, max(lo - 1, keep - max_back - 1), -1):
        if window.startswith(text(ids[lo:k])):
            return k
    return keep


def at_char_boundaries(tokenizer, responses: Sequence, full: CotSpans, kept: CotSpans) -> CotSpans:
    """``kept`` (a prefix of each CoT of ``full``, see ``spans.truncate_cot``) with every cut moved back to a
    character boundary (:func:`char_boundary`). ``responses``: each row's token ids (a tensor or a list)."""
    end = kept.end.clone()
    for i, r in enumerate(responses):
        start, cut, whole = int(kept.start[i]), int(kept.end[i]), int(full.end[i])
        if cut < whole:
            ids = r[start:whole]
            end[i] = start + char_boundary(tokenizer, ids.tolist() if hasattr(ids, "tolist") else ids, cut - start)
    if torch.equal(end, kept.end):
        return kept
    positions = torch.arange(kept.mask.shape[1], device=kept.mask.device).unsqueeze(0)
    mask = (positions >= kept.start.unsqueeze(1)) & (positions < end.unsqueeze(1))
    return CotSpans(mask=mask, start=kept.start, end=end, has_answer=kept.has_answer)


def cot_prefixes(tokenizer, cots: Sequence[Sequence[int]], keep: float) -> list[list[int]]:
    """The first ``keep`` of each CoT (its token ids): ``floor(keep * length)`` tokens, moved back to a character
    boundary, exactly as the classmate stage cuts a ``random_truncate`` CoT whose draw is ``keep``."""
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep must lie in [0, 1], got {keep}")
    lengths = torch.tensor([len(c) for c in cots], dtype=torch.long)
    width = max(1, int(lengths.max())) if len(cots) else 1
    full = CotSpans(mask=torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1), start=torch.zeros_like(lengths),
                    end=lengths, has_answer=torch.ones_like(lengths, dtype=torch.bool))
    cut = at_char_boundaries(tokenizer, [list(c) for c in cots], full, keep_prefix(full, keep))
    return [list(c[: int(e)]) for c, e in zip(cots, cut.end.tolist(), strict=True)]

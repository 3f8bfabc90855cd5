"""CoT spans of main-model responses, computed on token ids (classmate_method.md §2.1, §2.2, §14.5).

Conventions for a batch of responses ``response_ids`` [B, T] (right-padded) with ``response_mask`` [B, T]
(1 on valid response tokens, EOS included, 0 on padding):

* ``think_open_id`` given: the first ``<think>`` opens the CoT (``start`` = its position + 1) and the first
  ``</think>`` *after it* closes it (``end`` = that position, exclusive). The CoT lies strictly between the tags.
* ``think_open_id`` given but no ``<think>`` in the row: the whole valid response is the CoT (``start`` = 0), and
  ``</think>`` is not searched for (``has_answer`` = False).
* ``think_open_id=None``: the chat template already opened the thinking block in the prompt (e.g. a generation
  prompt ending in ``<think>\\n``), so every row starts inside the CoT (``start`` = 0) and the first ``</think>``
  closes it.
* No closing ``</think>``: the CoT runs to the last valid token, **EOS excluded** (the reference included it,
  classmate_method.md §11.14). EOS = the last valid token when it equals ``eos_token_id``.
* ``has_answer`` = a closing ``</think>`` was found (a final answer follows it).

Truncation (``truncate_cot``) keeps a prefix ``[start, start + floor(keep * length))`` of each CoT.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRUNCATION_MODES = ("vanilla", "random_truncate", "remove_wo_cot")


@dataclass
class CotSpans:
    """CoT span per response. ``mask`` [B, T] bool is 1 exactly on ``[start, end)``; ``end`` is exclusive."""

    mask: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    has_answer: torch.Tensor

    @property
    def length(self) -> torch.Tensor:
        """Number of CoT tokens per row, [B] long."""
        return self.end - self.start


def _check_response_mask(response_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    if response_ids.dim() != 2:
        raise ValueError(f"response_ids must be 2-D [B, T], got shape {tuple(response_ids.shape)}")
    if response_mask.shape != response_ids.shape:
        raise ValueError(
            f"response_mask shape {tuple(response_mask.shape)} does not match response_ids shape "
            f"{tuple(response_ids.shape)}"
        )
    valid = response_mask.bool()
    length = valid.sum(dim=1)
    positions = torch.arange(valid.shape[1], device=valid.device)
    # Everything below assumes right padding: the valid tokens form a prefix of each row.
    if not torch.equal(valid, positions.unsqueeze(0) < length.unsqueeze(1)):
        raise ValueError("response_mask must be right-padded (valid tokens form a prefix of each row)")
    return valid


def cot_mask(
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    think_open_id: int | None,
    think_close_id: int,
    eos_token_id: int | None = None,
) -> CotSpans:
    """CoT spans of a right-padded response batch (rules in the module docstring). Fully vectorised."""
    valid = _check_response_mask(response_ids, response_mask)
    batch, width = response_ids.shape
    device = response_ids.device
    positions = torch.arange(width, device=device).unsqueeze(0)  # [1, T]
    length = valid.sum(dim=1)
    sentinel = torch.full_like(positions, width)

    if think_open_id is None:
        has_open = torch.ones(batch, dtype=torch.bool, device=device)
        start = torch.zeros(batch, dtype=torch.long, device=device)
    else:
        is_open = valid & (response_ids == think_open_id)
        first_open = torch.where(is_open, positions, sentinel).min(dim=1).values
        has_open = first_open < width
        start = torch.where(has_open, first_open + 1, torch.zeros_like(first_open))

    is_close = valid & (response_ids == think_close_id) & (positions >= start.unsqueeze(1)) & has_open.unsqueeze(1)
    first_close = torch.where(is_close, positions, sentinel).min(dim=1).values
    has_answer = first_close < width

    if eos_token_id is None:
        ends_with_eos = torch.zeros(batch, dtype=torch.bool, device=device)
    else:
        last = response_ids.gather(1, (length - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ends_with_eos = (length > 0) & (last == eos_token_id)
    open_end = torch.maximum(length - ends_with_eos.long(), start)  # no </think>: up to EOS, never before start
    end = torch.where(has_answer, first_close, open_end)
    start = torch.minimum(start, end)  # an empty row: start = end = 0

    mask = (positions >= start.unsqueeze(1)) & (positions < end.unsqueeze(1))
    return CotSpans(mask=mask, start=start, end=end, has_answer=has_answer)


def think_token_ids(tokenizer, think_open: str = "<think>", think_close: str = "</think>") -> tuple[int, int]:
    """Ids of the think tags in ``tokenizer``; each tag must encode to exactly one token (not the unknown token)."""
    ids = []
    for tag in (think_open, think_close):
        encoded = tokenizer.encode(tag, add_special_tokens=False)
        unk = getattr(tokenizer, "unk_token_id", None)
        if len(encoded) != 1 or (unk is not None and encoded[0] == unk):  # unknown text maps to <unk>: not the tag
            name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
            raise ValueError(
                f"think tag {tag!r} must encode to exactly one token with tokenizer {name!r}, got ids {encoded}"
            )
        ids.append(int(encoded[0]))
    return ids[0], ids[1]


def truncate_cot(
    spans: CotSpans,
    mode: str,
    keep_min: float = 0.1,
    keep_max: float = 0.9,
    generator: torch.Generator | None = None,
) -> tuple[CotSpans, torch.Tensor]:
    """Keep a prefix of each CoT; returns the kept spans and a ``skip`` [B] bool flag.

    * ``vanilla``: keep = 1, nothing is skipped.
    * ``random_truncate``: keep ~ U(keep_min, keep_max), one draw per row from ``generator`` (required, owned by
      the caller so runs are reproducible); the kept CoT is ``[start, start + floor(keep * length))``.
    * ``remove_wo_cot``: keep = 1; rows whose CoT is empty get ``skip`` = True (no classmate call).

    Empty CoTs in ``vanilla`` / ``random_truncate`` (including a CoT that truncation shortens to 0 tokens, since
    the floor is taken literally) are *not* skipped: the classmate receives an empty CoT between the think tags.
    ``has_answer`` is unchanged: it describes the main response, not the classmate input.
    """
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"unknown truncation mode {mode!r}; expected one of {TRUNCATION_MODES}")
    length = spans.length
    skip = torch.zeros_like(spans.has_answer, dtype=torch.bool)
    if mode == "random_truncate":
        if generator is None:
            raise ValueError("truncate_cot(mode='random_truncate') needs a torch.Generator (generator=None given)")
        if not 0.0 <= keep_min <= keep_max <= 1.0:
            raise ValueError(f"need 0 <= keep_min <= keep_max <= 1, got keep_min={keep_min}, keep_max={keep_max}")
        u = torch.rand(length.shape[0], generator=generator, dtype=torch.float64, device=generator.device)
        keep = (keep_min + (keep_max - keep_min) * u).to(length.device)
        kept = torch.floor(keep * length.double()).long()
    else:
        kept = length
        if mode == "remove_wo_cot":
            skip = length == 0
    end = spans.start + kept
    positions = torch.arange(spans.mask.shape[1], device=spans.mask.device).unsqueeze(0)
    mask = (positions >= spans.start.unsqueeze(1)) & (positions < end.unsqueeze(1))
    return CotSpans(mask=mask, start=spans.start.clone(), end=end, has_answer=spans.has_answer.clone()), skip

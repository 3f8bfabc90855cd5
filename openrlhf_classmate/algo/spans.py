"""CoT spans of main-model responses, computed on token ids, never on decoded text.

:func:`split_response_ids` is *the* split of one response into (CoT span, answer span, status). The classmate stage
(through :func:`cot_mask`), the main reward (``integration/rollout/policy_executor.py``) and evaluation
(``cli/evaluate.py``) all call it, so the three cannot disagree. Rules, on the response's token ids:

* ``think_close_id=None``: no think block at all (``--classmate.final_answer whole_response``, ``evaluate
  --no-think``): the CoT is empty and the whole response, stop id excluded, is the answer (status ``no_think``).
* ``think_open_id`` given: the first ``<think>`` opens the CoT (``start`` = its position + 1) and the first
  ``</think>`` *after it* closes it (``end`` = that position, exclusive). The CoT lies strictly between the tags and
  the answer is everything after the close tag, the final stop id excluded (status ``answer``).
* ``think_open_id`` given but no ``<think>`` in the row: the whole response is the CoT and ``</think>`` is not
  searched for: no answer (status ``unopened``).
* ``think_open_id=None``, or ``starts_in_think`` True for the row: the chat template already opened the thinking
  block in the prompt (R1-distill / ``*-Thinking-2507`` generation prompts end in ``<think>\\n``; see
  :func:`prompt_opens_think`), so the row starts inside the CoT (``start`` = 0) and the first ``</think>`` closes it.
* No closing ``</think>``: the CoT runs to the end, **stop id excluded** (the reference implementation
  included the EOS in the CoT it gave the classmate), and there is no answer (status ``unclosed``).
* A stop id is excluded only as the *last* token (where generation stopped); ``stop_ids`` should hold every EOS id of
  the model's generation config (Qwen3 stops on ``<|im_end|>`` and ``<|endoftext|>``). A response that does not end
  on one was cut at the length limit (``stopped`` False).

Tags are token ids: a ``</think>`` written as ordinary BPE pieces is text inside the CoT, not a close tag.

Conventions for a batch of responses ``response_ids`` [B, T] (right-padded) with ``response_mask`` [B, T]
(1 on valid response tokens, EOS included, 0 on padding): :func:`cot_mask` applies the split to every row.

Truncation (``truncate_cot``, through :func:`keep_prefix`) keeps a prefix ``[start, start + floor(keep * length))``
of each CoT.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import KW_ONLY, dataclass

import torch

TRUNCATION_MODES = ("vanilla", "random_truncate", "remove_wo_cot")
SPLIT_STATUSES = ("answer", "unclosed", "unopened", "no_think")


@dataclass(frozen=True)
class ResponseSplit:
    """One response split into CoT ``[cot_start, cot_end)`` and answer ``[answer_start, answer_end)`` (indices into
    its token ids; an empty answer range when there is no answer), the ``status`` (:data:`SPLIT_STATUSES`) and
    whether generation ``stopped`` on a stop id (False: cut at the length limit)."""

    cot_start: int
    cot_end: int
    answer_start: int
    answer_end: int
    _: KW_ONLY
    status: str
    stopped: bool

    @property
    def has_answer(self) -> bool:
        return self.status in ("answer", "no_think")


def _as_ids(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(t) for t in ids]


def stop_id_set(stop_ids: int | Collection[int] | None) -> frozenset[int]:
    if stop_ids is None:
        return frozenset()
    if isinstance(stop_ids, int):
        return frozenset((stop_ids,))
    return frozenset(int(t) for t in stop_ids)


def split_response_ids(
    response_ids: Sequence[int] | torch.Tensor,
    *,
    think_open_id: int | None,
    think_close_id: int | None,
    stop_ids: int | Collection[int] | None = None,
    starts_in_think: bool = False,
) -> ResponseSplit:
    """Split one response (its valid token ids, no padding) into CoT, answer and status (rules in the module
    docstring). The one definition shared by the classmate stage, the main reward and evaluation."""
    ids = _as_ids(response_ids)
    stopped = bool(ids) and ids[-1] in stop_id_set(stop_ids)
    body = len(ids) - int(stopped)
    if think_close_id is None:
        return ResponseSplit(0, 0, 0, body, status="no_think", stopped=stopped)
    if think_open_id is None or starts_in_think:
        start = 0
    else:
        try:
            start = ids.index(think_open_id, 0, body) + 1
        except ValueError:
            return ResponseSplit(0, body, body, body, status="unopened", stopped=stopped)
    try:
        close = ids.index(think_close_id, start, body)
    except ValueError:
        return ResponseSplit(start, body, body, body, status="unclosed", stopped=stopped)
    return ResponseSplit(start, close, close + 1, body, status="answer", stopped=stopped)


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


def prompt_opens_think(prompt_ids, *, think_open_id: int, think_close_id: int) -> bool:
    """True when a prompt ends inside a think block: its last ``think_open_id`` comes after its last
    ``think_close_id`` (the template opened the CoT, so the response starts inside it). Token ids, not text, so a
    closed think block of an earlier turn or a tag-like string in the user's message does not count."""
    ids = prompt_ids.tolist() if isinstance(prompt_ids, torch.Tensor) else list(prompt_ids)
    last_open = max((i for i, t in enumerate(ids) if t == think_open_id), default=-1)
    last_close = max((i for i, t in enumerate(ids) if t == think_close_id), default=-1)
    return last_open > last_close


def cot_mask(
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    think_open_id: int | None,
    think_close_id: int,
    stop_ids: int | Collection[int] | None = None,
    starts_in_think: torch.Tensor | None = None,
) -> CotSpans:
    """CoT spans of a right-padded response batch: :func:`split_response_ids` on every row's valid tokens.

    ``stop_ids``: the EOS id(s) generation stops on. ``starts_in_think`` [B] bool marks rows whose prompt opened the
    think block (:func:`prompt_opens_think`)."""
    valid = _check_response_mask(response_ids, response_mask)
    batch, width = response_ids.shape
    if starts_in_think is not None and starts_in_think.shape != (batch,):
        raise ValueError(f"starts_in_think must have shape ({batch},), got {tuple(starts_in_think.shape)}")
    lengths = valid.sum(dim=1).tolist()
    inside = [False] * batch if starts_in_think is None else starts_in_think.bool().tolist()
    stops = stop_id_set(stop_ids)
    splits = [split_response_ids(row[:n], think_open_id=think_open_id, think_close_id=think_close_id, stop_ids=stops,
                                 starts_in_think=opened)
              for row, n, opened in zip(response_ids.tolist(), lengths, inside, strict=True)]
    device = response_ids.device
    start = torch.tensor([sp.cot_start for sp in splits], dtype=torch.long, device=device)
    end = torch.tensor([sp.cot_end for sp in splits], dtype=torch.long, device=device)
    has_answer = torch.tensor([sp.status == "answer" for sp in splits], dtype=torch.bool, device=device)
    positions = torch.arange(width, device=device).unsqueeze(0)
    mask = (positions >= start.unsqueeze(1)) & (positions < end.unsqueeze(1))
    return CotSpans(mask=mask, start=start, end=end, has_answer=has_answer)


def think_tags_problem(think_open: str, think_close: str) -> str | None:
    """Why a pair of think tags cannot delimit a CoT (the same tag twice, or a closing tag as the opening one), or
    None. Said in terms of the tags; the caller names the flags."""
    if think_open == think_close:
        return f"the open and close tags are the same tag {think_open!r}: the CoT would end where it starts"
    if think_open.startswith("</") and not think_close.startswith("</"):
        return (f"open {think_open!r} and close {think_close!r} look swapped (the open tag is a closing tag): the "
                "CoT would be read from the answer")
    return None


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
    *,
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
        return keep_prefix(spans, (keep_min + (keep_max - keep_min) * u).to(length.device)), skip
    if mode == "remove_wo_cot":
        skip = length == 0
    return keep_prefix(spans, 1.0), skip


def keep_prefix(spans: CotSpans, keep: float | torch.Tensor) -> CotSpans:
    """Keep the prefix ``[start, start + floor(keep * length))`` of each CoT: the cut of ``random_truncate`` for its
    drawn ``keep`` ([B] float64), or for one fixed fraction (``evaluate --truncate-cot``)."""
    length = spans.length
    keep = torch.as_tensor(keep, dtype=torch.float64, device=length.device)  # in [0, 1]: the callers check
    # 1e-9: 0.7 x 90 is 62.99999999999999 in binary floating point; the floor of the product meant is 63
    end = spans.start + torch.floor(keep * length.double() + 1e-9).long()
    positions = torch.arange(spans.mask.shape[1], device=spans.mask.device).unsqueeze(0)
    mask = (positions >= spans.start.unsqueeze(1)) & (positions < end.unsqueeze(1))
    return CotSpans(mask=mask, start=spans.start.clone(), end=end, has_answer=spans.has_answer.clone())

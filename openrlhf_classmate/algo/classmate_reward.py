"""Classmate reward per response from the classmates' scores.

For response b, classmate k, sample s with score x_bks and validity flag ok_bks:

    mean_bk   = Σ_s ok·x / Σ_s ok                           (classmate k counts only if Σ_s ok ≥ 1)
    raw_b     = Σ_k w_k·mean_bk / Σ_k w_k    over the classmates k that count (weights renormalised)
    x_b       = λ · raw_b
    R^c_b     = condition(x_b, R^m_b)

with the main-condition (``use_classmate_main_cond`` in the reference; "incorrect" means R^m ≤ 0):

    always                              x
    no_classmate_when_main_incorrect    x if R^m > 0 else 0
    neg_classmate_when_main_incorrect   x if R^m > 0 else -x
    no_classmate                        0

A response with no valid classmate sample at all gets ``valid = False`` (and reward 0 as a placeholder): it must be
masked out downstream, not treated as a real score of 0 (the reference implementation scored a failed judge call,
a missing ``</think>``, an empty CoT and an over-long classmate input 0, the lowest rating: a systematic penalty).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CONDITIONS = (
    "always",
    "no_classmate_when_main_incorrect",
    "neg_classmate_when_main_incorrect",
    "no_classmate",
)


def combine_classmate_scores(
    scores: torch.Tensor,
    valid: torch.Tensor,
    main_rewards: torch.Tensor,
    *,
    weights: Sequence[float] | None = None,
    lam: float = 1.0,
    condition: str = "always",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(reward [B], valid [B] bool, raw_mean [B])``; ``raw_mean`` is before λ and the condition.

    ``scores`` [B, K, S] may hold anything (NaN included) where ``valid`` [B, K, S] is False.
    ``weights`` (length K, non-negative, default uniform) are renormalised per response over the classmates
    that have at least one valid sample, so a failed classmate does not drag the mean towards 0.
    """
    if condition not in CONDITIONS:
        raise ValueError(f"unknown classmate condition {condition!r}; expected one of {CONDITIONS}")
    if scores.dim() != 3:
        raise ValueError(f"scores must be [B, K, S], got shape {tuple(scores.shape)}")
    if valid.shape != scores.shape:
        raise ValueError(f"valid shape {tuple(valid.shape)} does not match scores shape {tuple(scores.shape)}")
    batch, num_classmates, _ = scores.shape
    if main_rewards.shape != (batch,):
        raise ValueError(f"main_rewards must have shape ({batch},), got {tuple(main_rewards.shape)}")
    if weights is None:
        classmate_weights = torch.ones(num_classmates, dtype=torch.float64, device=scores.device)
    else:
        classmate_weights = torch.as_tensor(list(weights), dtype=torch.float64, device=scores.device)
        if classmate_weights.shape != (num_classmates,):
            raise ValueError(f"weights has {classmate_weights.numel()} entries but scores has K={num_classmates} "
                             "classmates")
        if (not torch.isfinite(classmate_weights).all() or (classmate_weights < 0).any()
                or classmate_weights.sum() <= 0):
            raise ValueError(f"weights must be finite, non-negative and not all 0, got {list(weights)}")

    ok = valid.bool()
    out_dtype = scores.dtype if scores.is_floating_point() else torch.float32
    valid_scores = torch.where(ok, scores.double(), 0.0)  # where, not multiply: NaN at invalid entries must not leak
    valid_count = ok.sum(dim=2)  # [B, K]
    mean_per_classmate = valid_scores.sum(dim=2) / valid_count.clamp(min=1)  # mean_bk
    row_weights = classmate_weights.unsqueeze(0) * (valid_count > 0)  # [B, K]: w_k where classmate k counts, else 0
    row_weight_sum = row_weights.sum(dim=1)
    row_valid = row_weight_sum > 0
    raw = (row_weights * mean_per_classmate).sum(dim=1) / torch.where(row_valid, row_weight_sum, 1.0)

    scaled = lam * raw
    correct = main_rewards > 0
    if condition == "always":
        reward = scaled
    elif condition == "no_classmate_when_main_incorrect":
        reward = torch.where(correct, scaled, 0.0)
    elif condition == "neg_classmate_when_main_incorrect":
        reward = torch.where(correct, scaled, -scaled)
    else:  # no_classmate
        reward = torch.zeros_like(scaled)
    reward = torch.where(row_valid, reward, 0.0)
    return reward.to(out_dtype), row_valid, raw.to(out_dtype)

"""VR-CLI's completion-likelihood reward as pure functions (Gurung & Lapata 2025, arXiv 2503.22828).

The policy writes reasoning that ends in a plan for the next chapter. A frozen generator (the RL reference model) is
scored on the gold next chapter twice: with the plan in its prompt and without it (the baseline). With ``PPL`` the
exponentiated mean token NLL of the gold chapter (plus its end-of-turn tokens),

    I = 100 · (PPL_base − PPL_plan) / PPL_base        (percent; > 0 when the plan makes the gold chapter likelier)

and the reward is a mapping of I:

    ladder   (released)   t = (0.05, 1, 2), v = (0, 0.5, 0.9, 1.0):  R = v_k  for  t_k ≤ I < t_{k+1}  (t_0 = −∞)
    clipped               R = max(I, 0)
    binary                R = 0 if I < 0 else 1

The released ladder also adds ε = 1e-10 to every reward; a constant shift changes no group-normalised advantage, so
it is left out. The plan is the text after the last ``In summary:`` (then after the last ``In summary,``, then after
the last ``Detailed Plan:``, each step a split on the last occurrence, as released), stripped. A response containing
none of these markers, or nothing after them, has no plan (:func:`extract_plan` gives None); the released code uses
the whole response as the plan then (an absent marker leaves the text unchanged; :func:`released_plan`). The hook's
``--vrcli.missing_plan`` chooses: invalid (default), zero, or whole (the released behaviour).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

PLAN_MARKERS = ("In summary:", "In summary,", "Detailed Plan:")
MAPPINGS = ("ladder", "clipped", "binary")
LADDER_THRESHOLDS = (0.05, 1.0, 2.0)  # percent
LADDER_REWARDS = (0.0, 0.5, 0.9, 1.0)
IMPROVEMENT_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def released_plan(response: str) -> str:
    """The plan as the released code takes it: the successive splits, stripped. Without any marker that is the whole
    response; with nothing after the last marker it is empty."""
    plan = response
    for marker in PLAN_MARKERS:
        plan = plan.rsplit(marker, 1)[-1]  # an absent marker leaves the text unchanged
    return plan.strip()


def extract_plan(response: str) -> str | None:
    """The plan at the end of ``response``, or None when no marker is present or nothing follows the last one."""
    if not any(marker in response for marker in PLAN_MARKERS):
        return None
    return released_plan(response) or None


def mean_nll(action_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] mean negative log-likelihood of the masked tokens of each row ([B, T] log-probs and mask)."""
    mask = mask.to(action_log_probs.dtype)
    count = mask.sum(-1)
    if bool((count == 0).any()):
        raise ValueError("a row has no scored token")
    return -(action_log_probs.double() * mask.double()).sum(-1) / count.double()


def perplexity(nll: float) -> float:
    """``exp(nll)``; ``inf`` past float range (a garbage NLL must not raise) and ``nan`` for a NaN NLL."""
    try:
        return math.exp(nll)
    except OverflowError:
        return math.inf


def improvement(ppl_base: float, ppl_plan: float) -> float:
    """``100 · (PPL_base − PPL_plan) / PPL_base``: the percentage by which the plan lowers the gold perplexity."""
    if not ppl_base > 0:
        raise ValueError(f"baseline perplexity must be positive, got {ppl_base}")
    return 100.0 * (ppl_base - ppl_plan) / ppl_base


def check_ladder(thresholds: Sequence[float], rewards: Sequence[float]) -> None:
    """Raise ValueError unless ``thresholds`` increase strictly and ``rewards`` has one more entry."""
    if len(rewards) != len(thresholds) + 1:
        raise ValueError(f"a ladder with {len(thresholds)} thresholds needs {len(thresholds) + 1} rewards, "
                         f"got {len(rewards)}")
    if any(b <= a for a, b in zip(thresholds, thresholds[1:])):
        raise ValueError(f"ladder thresholds must increase strictly, got {list(thresholds)}")


def ladder_bucket(value: float, *, thresholds: Sequence[float] = LADDER_THRESHOLDS) -> int:
    """Index k of the rung with ``thresholds[k-1] <= value < thresholds[k]`` (0 below the first threshold)."""
    return sum(value >= t for t in thresholds)


def map_improvement(value: float, *, mapping: str = "ladder", thresholds: Sequence[float] = LADDER_THRESHOLDS,
                    rewards: Sequence[float] = LADDER_REWARDS) -> float:
    """The reward of an improvement ``value`` (percent) under ``mapping`` (see the module docstring)."""
    if mapping == "ladder":
        return float(rewards[ladder_bucket(value, thresholds=thresholds)])
    if mapping == "clipped":
        return max(value, 0.0)
    if mapping == "binary":
        return 0.0 if value < 0 else 1.0
    raise ValueError(f"unknown VR-CLI mapping {mapping!r}; expected one of {MAPPINGS}")


def ladder_bucket_names(thresholds: Sequence[float] = LADDER_THRESHOLDS) -> list[str]:
    """Readable rung names for logging: ``lt_0.05``, ``0.05_to_1``, ``1_to_2``, ``ge_2``."""
    t = [f"{x:g}" for x in thresholds]
    if not t:
        return ["all"]
    return [f"lt_{t[0]}"] + [f"{a}_to_{b}" for a, b in zip(t, t[1:])] + [f"ge_{t[-1]}"]


def improvement_stats(
    values: Sequence[float], *, quantiles: Sequence[float] = IMPROVEMENT_QUANTILES
) -> dict[str, float]:
    """Mean, min, max and quantiles (linear interpolation) of the improvements of the valid samples; {} if none."""
    if not values:
        return {}
    x = torch.tensor(list(values), dtype=torch.float64)
    stats = {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}
    for q in quantiles:
        stats[f"p{round(100 * q)}"] = float(torch.quantile(x, q))
    return stats

"""Group-normalised advantages for the classmate estimators.

The estimators are the reference implementation's (commit 030d0d13) and those of its later HEAD
(``grpo_w_classmate`` and ``gdpo``); a worked example with numbers is in ``tests/test_advantages.py``. Every formula
the code implements is written out below.

Notation (per response i of a prompt group g): R^m = main reward, R^c = classmate reward, v = response mask,
m = CoT mask (only its valid tokens are used: m := m ∧ v), ok^m / ok^c = validity of the main / classmate score
(a failed score is *invalid*, never 0). Padding always gets 0.

Per-stream baseline ``b(R)``, per group over the group's *valid* entries (n_g of them), named after the OpenRLHF
``--algo.advantage.estimator`` whose baseline it is, with the same formula:

    group_norm           (R_i - μ_g) / (σ_g + ε)        μ_g mean, σ_g unbiased std (n_g - 1)
    dr_grpo              R_i - μ_g
    rloo                 R_i - mean_{j ≠ i} R_j  =  n_g / (n_g - 1) · (R_i - μ_g)
    reinforce_baseline   R_i - μ_g, then the token advantages are whitened (below)

An entry that is invalid, or whose group has fewer than 2 valid entries, gets b = 0 (it "has no advantage" for that
stream) and never enters the statistics. A group whose valid rewards are all equal gets exactly 0.

With A^m = clip(b(R^m over ok^m)) (``main_clip``: upstream's ``--reward.clip_range``, applied to the post-baseline
scalar as upstream does) and A^c = b(R^c over ok^c):

    grpo              A^comb · v,   A^comb = clip(b(R^m + R^c))      (reward-sum baseline; R^c = 0 → plain GRPO)
    grpo_w_classmate  A^comb on m, A^m on v - m   (classmate_partial);   A^comb · v   (all)
    gdpo              S = w_m A^m + w_c A^c, batch-normalised S_bn = (S - mean S) / (std S + ε) over the responses
                      with an advantage in at least one stream (unbiased std; the others get S_bn = 0);
                      S_bn on m, A^m on v - m (classmate_partial) or S_bn · v (all)
    gdpo_wo_bn        the same with S instead of S_bn
    separated         main_advantages = A^m · v;  classmate_advantages = A^c · m (classmate_partial) or A^c · v
                      (all); advantages = their sum
    separated_non_neg the same with A^c := max(A^c, 0)

A^comb is defined where both scores are valid (and 2+ such entries in the group); elsewhere the response uses A^m
(trained as plain GRPO: it has no classmate signal).

Then, in upstream's order:

* ``kl_return`` [B, T] (KL in the reward: upstream's per-token return of -β·KL, Σ_{s ≥ t} -β KL_s) is added to the
  main-stream tokens: to ``advantages`` for the single-advantage estimators, to ``main_advantages`` (and the sum)
  for the separated ones. It does not depend on any score, so it also applies to responses with an invalid score.
* ``whiten`` (``reinforce_baseline``: "mean_std", or "mean" with ``--algo.advantage.no_std_norm``): upstream's batch
  whitening x → (x - μ) / sqrt(max(σ², 1e-8)) (biased σ, over tokens), per advantage tensor, with μ and σ over the
  tokens that carry a score, and every other token exactly 0 afterwards (its KL return included: whitening is a
  statistic of scored tokens, and the shift -μ has no meaning for a token without a score). A token carries a score
  when its row's score for that stream is valid:

      separated*        main_advantages: v ∧ ok^m;   classmate_advantages: (m or v, by token mode) ∧ ok^c
      grpo, grpo_w_classmate   v ∧ ok^m  (A^comb and its fallback A^m both need a valid main score)
      gdpo, gdpo_wo_bn  all: v ∧ (ok^m ∨ ok^c);   classmate_partial: (m ∧ (ok^m ∨ ok^c)) ∨ (v - m) ∧ ok^m

  ``separated_non_neg`` refuses whitening: centring its classmate stream over the batch makes it negative, against
  its definition A^c ≥ 0.

Everything is vectorised with segment sums (``index_add``, ``scatter_reduce``) over ``torch.unique`` group ids; statistics are
computed in float64 and the outputs are cast to the dtype of ``main_rewards`` (float32 for integer input).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ESTIMATORS = ("grpo", "grpo_w_classmate", "gdpo", "gdpo_wo_bn", "separated", "separated_non_neg")
TOKEN_MODES = ("classmate_partial", "all")
BASELINES = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline")
WHITENING = ("mean", "mean_std")
SEPARATED = ("separated", "separated_non_neg")


def _group_ids(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    # Arbitrary ids (uids hashed to ints, prompt indices, ...) -> 0..G-1.
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniq.numel())


def _check_group_sizes(inverse: torch.Tensor, num_groups: int, baseline: str) -> None:
    if baseline not in ("group_norm", "rloo"):
        return
    sizes = torch.bincount(inverse, minlength=num_groups)
    if (sizes < 2).any():
        raise ValueError(
            f"group_index has {int((sizes < 2).sum())} group(s) of size 1; a group needs at least 2 responses "
            f"for the {baseline} baseline"
        )


def _segment_stats(
    values: torch.Tensor, inverse: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group over valid entries: (count [G], values - group mean [B] (0 where invalid), unbiased var [G])."""
    values = torch.where(valid, values, 0.0)
    zeros = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    n = zeros.index_add(0, inverse, valid.to(values.dtype))
    mean = zeros.index_add(0, inverse, values) / n.clamp(min=1)
    centred = torch.where(valid, values - mean.index_select(0, inverse), 0.0)
    var = zeros.index_add(0, inverse, centred * centred) / (n - 1).clamp(min=1)
    return n, centred, var


def group_std(values: torch.Tensor, group_index: torch.Tensor, *, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased std of ``values`` per group over valid entries, per sample [B] (0 for groups with < 2 valid)."""
    inverse, num_groups = _group_ids(group_index)
    ok = torch.ones_like(inverse, dtype=torch.bool) if valid is None else valid.bool()
    n, _, var = _segment_stats(values.double(), inverse, num_groups, ok)
    return torch.where(n >= 2, var.sqrt(), 0.0).index_select(0, inverse).to(_out_dtype(values))


def _baseline(
    values: torch.Tensor,
    inverse: torch.Tensor,
    num_groups: int,
    valid: torch.Tensor,
    baseline: str,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(b [B] float64, defined [B] bool): the per-group baseline of the module docstring over valid entries."""
    values = torch.where(valid, values, 0.0)

    def per_sample(per_group: torch.Tensor) -> torch.Tensor:
        return per_group.index_select(0, inverse)  # much cheaper than advanced indexing per_group[inverse]

    n, centred, var = _segment_stats(values, inverse, num_groups, valid)
    # Exact zeros for constant groups (the floating-point mean may differ from the common value by an ulp).
    big = torch.finfo(values.dtype).max
    group_zeros = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    group_max = torch.full_like(group_zeros, -big).scatter_reduce(0, inverse, torch.where(valid, values, -big), "amax")
    group_min = torch.full_like(group_zeros, big).scatter_reduce(0, inverse, torch.where(valid, values, big), "amin")
    defined = valid & (per_sample(n) >= 2)
    centred = torch.where(per_sample(group_max == group_min), 0.0, centred)
    if baseline == "group_norm":
        advantage = centred / (per_sample(var.sqrt()) + eps)
    elif baseline == "rloo":
        n_i = per_sample(n)
        advantage = centred * n_i / (n_i - 1).clamp(min=1)
    else:  # dr_grpo, reinforce_baseline
        advantage = centred
    return torch.where(defined, advantage, 0.0), defined


def _as_1d(name: str, x: torch.Tensor, batch: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != (batch,):
        raise ValueError(f"{name} must have shape ({batch},) like main_rewards, got {tuple(x.shape)}")
    return x


def _check_finite(name: str, x: torch.Tensor, where: torch.Tensor | None = None) -> None:
    bad = ~torch.isfinite(x)
    if where is not None:
        bad = bad & where
    if bad.any():
        raise ValueError(f"{name} has {int(bad.sum())} non-finite (NaN/inf) value(s)")


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float32


def _check_baseline(baseline: str) -> None:
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; expected one of {BASELINES}")


def group_normalize(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    valid: torch.Tensor | None = None,
    baseline: str = "group_norm",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-group baseline ``b(R)`` [B] of the module docstring; invalid entries get 0.

    Raises ValueError for group sizes of 1 with ``group_norm`` / ``rloo`` (counting all entries, valid or not) and
    for non-finite rewards at valid entries.
    """
    _check_baseline(baseline)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    batch = rewards.shape[0]
    _as_1d("group_index", group_index, batch)
    ok = torch.ones(batch, dtype=torch.bool, device=rewards.device) if valid is None else _as_1d("valid", valid, batch)
    ok = ok.bool()
    _check_finite("rewards", rewards, ok)
    inverse, num_groups = _group_ids(group_index)
    _check_group_sizes(inverse, num_groups, baseline)
    adv, _ = _baseline(rewards.double(), inverse, num_groups, ok, baseline, eps)
    return adv.to(_out_dtype(rewards))


def _place(on_cot: torch.Tensor, off_cot: torch.Tensor, cot: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
    """[B, T]: ``on_cot`` on CoT tokens, ``off_cot`` on the other valid tokens, 0 on padding."""
    out = torch.where(cot, on_cot.unsqueeze(1), off_cot.unsqueeze(1))
    # In place: one [B, T] allocation in all (the token placement is memory-bound, see bench/advantages.py).
    return torch.where(resp, out, out.new_zeros(()), out=out)


def _broadcast(scalar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: ``scalar`` where ``mask``, 0 elsewhere."""
    return torch.where(mask, scalar.unsqueeze(1), scalar.new_zeros(()))


def whiten_tokens(advantages: torch.Tensor, mask: torch.Tensor, *, mode: str) -> torch.Tensor:
    """Upstream's batch whitening over the tokens in ``mask`` (biased variance, clamped at 1e-8); 0 outside it."""
    if mode not in WHITENING:
        raise ValueError(f"unknown whitening {mode!r}; expected one of {WHITENING}")
    count = mask.sum()
    if count == 0:
        return torch.zeros_like(advantages)  # no scored token: nothing to centre, every token 0 as below
    x = advantages.double()
    mean = (x * mask).sum() / count
    rstd = ((x - mean).square() * mask).sum().div(count).clamp(min=1e-8).rsqrt() if mode == "mean_std" else 1.0
    return torch.where(mask, (x - mean) * rstd, 0.0).to(advantages.dtype)


def compute_advantages(
    estimator: str,
    main_rewards: torch.Tensor,
    classmate_rewards: torch.Tensor | None,
    group_index: torch.Tensor,
    *,
    response_mask: torch.Tensor,
    cot_mask: torch.Tensor,
    token_mode: str = "classmate_partial",
    baseline: str = "group_norm",
    main_valid: torch.Tensor | None = None,
    classmate_valid: torch.Tensor | None = None,
    weights: Sequence[float] = (1.0, 1.0),
    main_clip: Sequence[float] | None = None,
    kl_return: torch.Tensor | None = None,
    whiten: str | None = None,
    eps: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """Token-level advantages for ``estimator`` (formulas and order of the steps in the module docstring).

    Returns ``"advantages"`` [B, T]; for ``separated`` / ``separated_non_neg`` also ``"main_advantages"`` and
    ``"classmate_advantages"`` [B, T]. For logging: ``"main_scalar"`` (A^m) and ``"classmate_scalar"`` (A^c as
    used, i.e. clamped for separated_non_neg) [B], plus ``"combined_scalar"`` [B] (A^comb, S or S_bn) for the
    single-advantage estimators. ``weights = (w_m, w_c)`` is used by gdpo / gdpo_wo_bn only.
    ``classmate_rewards=None`` means no classmate (all zeros, all valid); ``main_valid`` / ``classmate_valid``
    ``None`` mean every score is valid.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    if token_mode not in TOKEN_MODES:
        raise ValueError(f"unknown token_mode {token_mode!r}; expected one of {TOKEN_MODES}")
    _check_baseline(baseline)
    if whiten is not None and whiten not in WHITENING:
        raise ValueError(f"unknown whiten {whiten!r}; expected None or one of {WHITENING}")
    if whiten is not None and estimator == "separated_non_neg":
        raise ValueError(f"separated_non_neg keeps A^c >= 0, which whiten={whiten!r} (centring over the batch) "
                         "breaks: use another baseline or estimator")
    if not isinstance(main_rewards, torch.Tensor) or main_rewards.dim() != 1:
        shape = tuple(main_rewards.shape) if isinstance(main_rewards, torch.Tensor) else type(main_rewards).__name__
        raise ValueError(f"main_rewards must be a 1-D tensor [B], got {shape}")
    batch = main_rewards.shape[0]
    device = main_rewards.device
    if classmate_rewards is None:
        classmate_rewards = torch.zeros(batch, dtype=main_rewards.dtype, device=device)
    _as_1d("classmate_rewards", classmate_rewards, batch)
    _as_1d("group_index", group_index, batch)
    if response_mask.dim() != 2 or response_mask.shape[0] != batch:
        raise ValueError(f"response_mask must have shape ({batch}, T), got {tuple(response_mask.shape)}")
    if cot_mask.shape != response_mask.shape:
        raise ValueError(
            f"cot_mask shape {tuple(cot_mask.shape)} does not match response_mask shape {tuple(response_mask.shape)}"
        )
    if kl_return is not None and kl_return.shape != response_mask.shape:
        raise ValueError(
            f"kl_return shape {tuple(kl_return.shape)} does not match response_mask shape "
            f"{tuple(response_mask.shape)}"
        )
    everyone = torch.ones(batch, dtype=torch.bool, device=device)
    main_ok = everyone if main_valid is None else _as_1d("main_valid", main_valid, batch).bool()
    classmate_ok = everyone if classmate_valid is None else _as_1d("classmate_valid", classmate_valid, batch).bool()
    if len(weights) != 2:
        raise ValueError(f"weights must be (w_main, w_classmate), got {weights}")
    if main_clip is not None and (len(main_clip) != 2 or main_clip[0] > main_clip[1]):
        raise ValueError(f"main_clip must be (low, high) with low <= high, got {main_clip}")
    response_tokens = response_mask.bool()
    cot_tokens = cot_mask.bool()  # only read on valid tokens: CoT marks on padding are ignored (no O(B·T) check)
    _check_finite("main_rewards", main_rewards, main_ok)
    _check_finite("classmate_rewards", classmate_rewards, classmate_ok)

    inverse, num_groups = _group_ids(group_index)
    _check_group_sizes(inverse, num_groups, baseline)
    out_dtype = _out_dtype(main_rewards)
    # R^m and R^c in float64, 0 where the score is invalid (those entries never enter the statistics).
    valid_main_rewards = torch.where(main_ok, main_rewards.double(), 0.0)
    valid_classmate_rewards = torch.where(classmate_ok, classmate_rewards.double(), 0.0)

    def clip(x: torch.Tensor) -> torch.Tensor:
        return x if main_clip is None else x.clamp(min=float(main_clip[0]), max=float(main_clip[1]))

    # A^m and A^c per response, in float64 for the arithmetic below ...
    main_scalar_f64, main_defined = _baseline(valid_main_rewards, inverse, num_groups, main_ok, baseline, eps)
    # clipped only where the baseline is defined: a range without 0 ((0.2, 2.0)) would give the rows without an
    # advantage (an invalid score, a group of fewer than 2 valid ones) a clip bound instead of their exact 0
    main_scalar_f64 = torch.where(main_defined, clip(main_scalar_f64), 0.0)
    classmate_scalar_f64, classmate_defined = _baseline(valid_classmate_rewards, inverse, num_groups, classmate_ok,
                                                        baseline, eps)
    if estimator == "separated_non_neg":
        # A^c := max(A^c, 0): a classmate that fails does not penalise the main model (the formula the
        # reference left commented out for ``grpo_main_classmate_separated_non_neg_cl``)
        classmate_scalar_f64 = classmate_scalar_f64.clamp(min=0.0)
    # ... and in the output dtype, as placed on the tokens and returned for logging.
    main_scalar = main_scalar_f64.to(out_dtype)
    classmate_scalar = classmate_scalar_f64.to(out_dtype)
    result = {"main_scalar": main_scalar, "classmate_scalar": classmate_scalar}

    if estimator in ("grpo", "grpo_w_classmate"):
        # A^comb = clip(b(R^m + R^c)) where both scores are valid; A^m elsewhere.
        combined_scalar, defined = _baseline(
            valid_main_rewards + valid_classmate_rewards, inverse, num_groups, main_ok & classmate_ok, baseline, eps
        )
        combined_scalar = torch.where(defined, clip(combined_scalar), main_scalar_f64).to(out_dtype)
        result["combined_scalar"] = combined_scalar
        if estimator == "grpo" or token_mode == "all":
            advantages = _broadcast(combined_scalar, response_tokens)
        else:
            advantages = _place(combined_scalar, main_scalar, cot_tokens, response_tokens)
    elif estimator in ("gdpo", "gdpo_wo_bn"):
        # S = w_m·A^m + w_c·A^c
        weighted_sum = float(weights[0]) * main_scalar_f64 + float(weights[1]) * classmate_scalar_f64
        if estimator == "gdpo":  # S_bn = (S - mean_batch S) / (std_batch S + eps): the reference HEAD's batch norm
            # a response with no advantage in either stream (no valid score, or none that its group could compare)
            # carries no signal: it stays 0 and leaves S_bn's mean and std
            active = main_defined | classmate_defined
            count = int(active.sum())
            centred = torch.where(active, weighted_sum - weighted_sum[active].mean() if count else weighted_sum, 0.0)
            std = centred.square().sum().div(max(count - 1, 1)).sqrt()
            weighted_sum = centred / (std + eps)
        weighted_sum = weighted_sum.to(out_dtype)
        result["combined_scalar"] = weighted_sum
        if token_mode == "all":
            advantages = _broadcast(weighted_sum, response_tokens)
        else:
            advantages = _place(weighted_sum, main_scalar, cot_tokens, response_tokens)
    else:  # separated, separated_non_neg
        main_advantages = _broadcast(main_scalar, response_tokens)
        classmate_tokens = cot_tokens & response_tokens if token_mode == "classmate_partial" else response_tokens
        classmate_advantages = _broadcast(classmate_scalar, classmate_tokens)
        if kl_return is not None:
            main_advantages = main_advantages + torch.where(response_tokens, kl_return.to(out_dtype), 0.0)
        if whiten is not None:
            main_advantages = whiten_tokens(main_advantages, response_tokens & main_ok.unsqueeze(1), mode=whiten)
            classmate_advantages = whiten_tokens(
                classmate_advantages, classmate_tokens & classmate_ok.unsqueeze(1), mode=whiten
            )
        result["main_advantages"] = main_advantages
        result["classmate_advantages"] = classmate_advantages
        result["advantages"] = main_advantages + classmate_advantages
        _check_scalars_finite(result)
        return result

    if kl_return is not None:
        advantages = advantages + torch.where(response_tokens, kl_return.to(out_dtype), 0.0)
    if whiten is not None:
        scored = response_tokens & main_ok.unsqueeze(1)  # grpo, grpo_w_classmate: every token needs ok^m
        if estimator in ("gdpo", "gdpo_wo_bn"):
            either = response_tokens & (main_ok | classmate_ok).unsqueeze(1)  # S: either score
            scored = either if token_mode == "all" else torch.where(cot_tokens, either, scored)
        advantages = whiten_tokens(advantages, scored, mode=whiten)
    result["advantages"] = advantages
    _check_scalars_finite(result)
    return result


def _check_scalars_finite(result: dict[str, torch.Tensor]) -> None:
    """Finite rewards whose statistics overflow (|R| near the float64 or output dtype's limit; rloo's n/(n-1), the
    gdpo weights) give non-finite advantages: an error here, where they appear, not a skipped update later."""
    for name in ("main_scalar", "classmate_scalar", "combined_scalar"):
        x = result.get(name)
        if x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} overflowed to a non-finite value although every reward is finite: the rewards "
                             f"are too large for the advantage statistics in {x.dtype}; rescale the reward")


# upstream's --algo.advantage.estimator values that train over valid main scores only (plain runs: the main reward)
VALID_ONLY_ESTIMATORS = ("group_norm", "dr_grpo", "rloo", "reinforce_baseline", "reinforce", "flash_reinforce")


class GaeWithInvalidScoreError(ValueError):
    """A failed (invalid) main score reached ``gae``, which cannot leave it out."""


def main_advantages_over_valid(
    estimator: str,
    main_rewards: torch.Tensor | None,
    group_index: torch.Tensor | None,
    *,
    main_valid: torch.Tensor,
    response_mask: torch.Tensor | None = None,
    returns: torch.Tensor | None = None,
    returns_mask: torch.Tensor | None = None,
    no_std_norm: bool = False,
    **upstream,
) -> dict[str, torch.Tensor | None]:
    """Upstream's main-reward estimator ``estimator`` (``--algo.advantage.estimator``, a plain run) with the invalid
    main scores (``main_valid`` False) left out of every statistic: the group baselines, ``flash_reinforce``'s batch
    mean, the whitening of ``reinforce`` / ``reinforce_baseline``. An invalid score gets exactly zero advantage
    (upstream had entered a placeholder 0 into those statistics).

    * ``reinforce`` (no baseline): ``returns`` (upstream's discounted per-token returns, any shape) whitened over
      ``returns_mask`` (the action tokens of the valid rows), ``mean`` with ``no_std_norm``; returns
      ``{"advantages": <returns' shape>, "main_scalar": None}``.
    * the others: :func:`compute_advantages` ``grpo`` of the main reward alone, ``main_rewards`` [B] and
      ``group_index`` [B] in rollout order, ``response_mask`` [B, T], ``upstream`` the rest of what upstream's
      estimator reads (``baseline``, ``kl_return``, ``main_clip``, ``whiten``, ``eps``); ``flash_reinforce``: one
      batch-wide group with the mean baseline (``dr_grpo``), no whitening. Returns :func:`compute_advantages`'s dict.

    ``gae`` raises :class:`GaeWithInvalidScoreError`: its critic would learn the placeholder (the experience maker
    stops the run with it)."""
    if estimator == "gae":  # refused at launch with the scorer-registry reward; another reward marked one invalid
        raise GaeWithInvalidScoreError(
            "error: a main score marked invalid (extra_logs main_valid = 0) reached --algo.advantage.estimator gae, "
            "whose critic would learn its placeholder as a real reward: use "
            + ", ".join(VALID_ONLY_ESTIMATORS[:-1]) + " or " + VALID_ONLY_ESTIMATORS[-1])
    if estimator == "reinforce":
        return {"advantages": whiten_tokens(returns, returns_mask, mode="mean" if no_std_norm else "mean_std"),
                "main_scalar": None}
    if estimator == "flash_reinforce":
        group_index, upstream["baseline"] = torch.zeros_like(group_index), "dr_grpo"
    return compute_advantages("grpo", main_rewards, None, group_index, response_mask=response_mask,
                              cot_mask=torch.zeros_like(response_mask), main_valid=main_valid, **upstream)

"""Policy losses for the classmate objectives, drop-in for openrlhf 0.11.2's ``PolicyLoss``.

Both modules take the call that ``ActorPPOTrainer.training_step`` makes,

    fn(action_log_probs, old_action_log_probs, advantages, action_mask=..., rollout_log_probs=..., **loss_batch_info)

(``loss_batch_info`` = ``dp_size``, ``batch_num_tokens``, ``global_batch_size``), plus keyword-only classmate
tensors, and return the same 5-tuple ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)``.
Per-call statistics are kept in ``self.last_stats`` (detached 0-d tensors) for the trainer to log.

Upstream's ratio and rollout-correction options apply to both terms of both losses exactly as ``PolicyLoss`` applies
them to its one term (``tests/test_losses.py`` checks the equality for every combination):

* ``policy_loss_type="gspo"``: the ratio is sequence-level, r_i = exp(mean_t (ℓθ - ℓref)) on every token of row i
  (ℓref = ℓold, or the rollout log-probs when IS correction is on), and the aggregation is the per-sequence mean
  (``seq-mean-token-mean``), as GSPO prescribes.
* ``is_correction_level`` token / seq (``ppo`` only, as upstream): the per-token loss is multiplied by the truncated
  importance weight w = π_train/π_rollout (``mode=clip``: clamped to the threshold band; ``mask``: units whose gate
  statistic leaves the band get 0, the others w). ``vllm_kl`` and ``is_filter_ratio`` are returned as upstream does.

The single-advantage estimators (grpo, grpo_w_classmate, gdpo, gdpo_wo_bn) use openrlhf's ``PolicyLoss`` unchanged.

openrlhf is imported lazily (on the first token-mean / seq-mean-token-mean aggregation) so that
``openrlhf_classmate.algo`` stays cheap to import (openrlhf.models pulls in deepspeed, peft and transformers).
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

_LOG_RATIO_CLAMP = 20.0  # as openrlhf's PolicyLoss and the reference: ratio = exp(clamp(Δ, ±20))


def _openrlhf_aggregate_loss():
    # Our parent package ``openrlhf_classmate`` is already imported (it is this module's parent), so its CPU shims
    # are installed before openrlhf is.
    from openrlhf.models.loss import aggregate_loss

    return aggregate_loss


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    mode: str,
    dp_size: int = 1,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: float | torch.Tensor | None = None,
    max_response_len: int | None = None,
    ref_micro_batch_size: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to the scalar that is backpropagated for one micro-batch.

    With v the mask, the three modes are, over the sequences i and tokens t of the whole optimizer step:

        token-mean                Σ_{i,t} L·v / Σ_{i,t} v
        seq-mean-token-mean       mean_i ( Σ_t L·v / Σ_t v )
        seq-mean-token-sum-norm   Σ_i Σ_t L·v / T                (a sum over sequences, not a mean)

    ``token-mean`` and ``seq-mean-token-mean`` are openrlhf's ``aggregate_loss`` (token_level_loss True / False),
    which turn ``loss_batch_info`` into one global mean per optimizer step.

    ``seq-mean-token-sum-norm`` is the reference's aggregation (a sum over sequences, not a mean), for reproducing the
    reference runs. With T =
    ``max_response_len`` if given, else ``mask.shape[1]`` (the reference pads every rollout to
    ``max_response_length``, so pass it to reproduce the reference scale):

    * without ``global_batch_size``: ``Σ_i Σ_t L·v / T`` (a sum over the micro-batch's sequences, as in the
      reference; 0.611281 on the two-sequence worked example in ``tests/test_losses.py``).
    * with ``loss_batch_info``: ``Σ_i Σ_t L·v / T · dp_size · C / global_batch_size``, C = ``ref_micro_batch_size``
      (default ``global_batch_size / dp_size``).

    Why: the reference backpropagates ``Σ_{i∈micro} Σ_t L·v / T`` per micro-batch scaled by 1/GA and averages
    gradients over W ranks, so its per-optimizer-step objective is ``Σ_{i∈step} Σ_t L·v · C / (T · N)`` with N the
    sequences in the step and C = N / (GA · W) its micro-batch size (the reference's FSDP scaling). In openrlhf,
    DeepSpeed also divides
    every micro-batch loss by gas (``engine.backward``, ``scale_wrt_gas=True``) and DDP/ZeRO averages over the
    ``dp_size`` ranks, while ``iter_grad_accum_global_norm`` passes ``global_batch_size = N / gas`` (N = non-empty
    sequences of the whole window, all ranks); the dynamic-batch path passes N with gas = 1. Backpropagating
    ``x_k = Σ_{i∈k} Σ_t L·v · dp_size · C / (T · global_batch_size)`` therefore yields
    ``Σ_k x_k / (gas · dp_size) = Σ_{i∈step} Σ_t L·v · C / (T · N)``, the reference objective, with every sequence
    weighted equally even when micro-batches have unequal sizes (ragged last window, empty-mask rows). With a
    fixed C the value no longer depends on how the step is cut into micro-batches. With the default C =
    ``global_batch_size / dp_size`` (the mean micro-batch size of the window; equal to openrlhf's
    ``train.micro_batch_size`` on the non-dynamic path, where micro-batches are uniform) the formula reduces to
    ``Σ_i Σ_t L·v / T``, i.e. literally the reference's per-micro-batch loss. Pass the reference's
    ``ppo_micro_batch_size_per_gpu`` (16 in its scripts) as ``ref_micro_batch_size`` to fix the scale
    independently of the openrlhf batch layout (always do so with dynamic batching).
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {LOSS_AGG_MODES}")
    if mask is None:
        mask = torch.ones_like(loss, dtype=torch.bool)
    if mode != "seq-mean-token-sum-norm":
        return _openrlhf_aggregate_loss()(
            loss,
            mask,
            token_level_loss=mode == "token-mean",
            dp_size=dp_size,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )
    width = max_response_len if max_response_len is not None else mask.shape[-1]
    total = (loss * mask).sum() / width
    if global_batch_size is None:
        return total
    scale = ref_micro_batch_size if ref_micro_batch_size is not None else global_batch_size / dp_size
    return total * dp_size * scale / global_batch_size


def _masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim: int | None = None) -> torch.Tensor:
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


POLICY_LOSS_TYPES = ("ppo", "gspo")
IS_LEVELS = ("off", "token", "seq")
IS_MODES = ("mask", "clip")
IS_GATINGS = ("ratio", "binary_kl", "tv")


def policy_ratio(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    action_mask: torch.Tensor | None,
    rollout_log_probs: torch.Tensor | None = None,
    *,
    policy_loss_type: str = "ppo",
    is_correction: bool = False,
) -> torch.Tensor:
    """The PPO ratio [B, T] as upstream's ``PolicyLoss`` computes it (module docstring)."""
    if policy_loss_type == "ppo":
        return (log_probs - old_log_probs).clamp(min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP).exp()
    if policy_loss_type != "gspo":
        raise ValueError(f"unknown policy_loss_type {policy_loss_type!r}; expected one of {POLICY_LOSS_TYPES}")
    if action_mask is None:
        action_mask = torch.ones_like(log_probs, dtype=torch.bool)
    log_ratio = log_probs - (rollout_log_probs if is_correction else old_log_probs)
    seq = (log_ratio * action_mask).sum(dim=-1) / action_mask.sum(dim=-1).clamp(min=1)
    return seq.exp().unsqueeze(-1) * action_mask


def is_correction_weight(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    action_mask: torch.Tensor | None,
    *,
    level: str,
    mode: str = "mask",
    gating: str = "ratio",
    threshold: tuple[float, float] = (0.5, 5.0),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w, is_filter_ratio, vllm_kl): upstream's rollout importance-sampling correction (``PolicyLoss``, ppo).

    ``w`` [B, T] multiplies the per-token loss. The gate reads π_train/π_rollout per token (``level="token"``) or its
    geometric mean per sequence (``"seq"``), or the sampled-token binary KL / total variation between the two
    policies (``gating``); units outside ``threshold = (low, high)`` are dropped (``mask``) or, for the token ratio,
    clamped (``clip``). ``is_filter_ratio`` is the dropped/clamped fraction at the unit's granularity.
    """
    low, high = threshold
    seq_level = level == "seq"
    log_w = (old_log_probs - rollout_log_probs).detach()
    token_w = log_w.exp()
    if gating == "ratio":
        stat = (_masked_mean(log_w, action_mask, dim=-1).unsqueeze(-1) if seq_level else log_w).exp()
    else:
        p = rollout_log_probs.exp().clamp(1e-6, 1 - 1e-6)  # the clamp keeps the binary-KL logs finite
        q = old_log_probs.exp().clamp(1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
        else:  # tv
            stat = (p - q).abs()
        if seq_level:
            stat = _masked_mean(stat, action_mask, dim=-1).unsqueeze(-1)
    if mode == "clip":
        weight = stat.clamp(min=low, max=high)
        filtered = (stat < low) | (stat > high)
    else:
        keep = (stat >= low) & (stat <= high)
        weight = torch.where(keep, token_w, 0.0)
        filtered = ~keep
    filter_ratio = filtered.float().mean() if seq_level else _masked_mean(filtered.float(), action_mask)
    vllm_kl = _masked_mean(rollout_log_probs - old_log_probs, action_mask)
    return weight, filter_ratio, vllm_kl


def _check_is_options(policy_loss_type: str, level: str, mode: str, gating: str, threshold) -> None:
    """Upstream's constructor checks of ``PolicyLoss``, with the flag names in the messages."""
    if policy_loss_type not in POLICY_LOSS_TYPES:
        raise ValueError(f"policy_loss_type must be one of {POLICY_LOSS_TYPES}, got {policy_loss_type!r}")
    if level not in IS_LEVELS:
        raise ValueError(f"is_correction_level must be one of {IS_LEVELS}, got {level!r}")
    if mode not in IS_MODES:
        raise ValueError(f"is_correction_mode must be one of {IS_MODES}, got {mode!r}")
    if gating not in IS_GATINGS:
        raise ValueError(f"is_correction_gating must be one of {IS_GATINGS}, got {gating!r}")
    if mode == "clip" and (level == "seq" or gating != "ratio"):
        raise ValueError("is_correction_mode=clip requires is_correction_level=token and is_correction_gating=ratio")
    if gating != "ratio" and level != "off" and threshold[0] > 0:
        raise ValueError(f"is_correction_gating={gating} takes an upper bound only (a single threshold value)")


def _ppo_token_loss(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped PPO loss, op for op as openrlhf's ``PolicyLoss``; returns (loss, clipped flag)."""
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    if dual_clip is None:
        loss = -torch.min(surr1, surr2)
    else:
        clip1 = torch.min(surr1, surr2)
        clip2 = torch.max(clip1, dual_clip * adv)  # dual clip: lower bound for negative advantages
        loss = -torch.where(adv < 0, clip2, clip1)
    return loss, torch.lt(surr2, surr1)


def _check_dual_clip(name: str, value: float | None) -> None:
    if value is not None and value <= 1.0:
        raise ValueError(f"{name} must be > 1.0 (or None), got {value}")


def _check_same_shape(name: str, x: torch.Tensor, ref: torch.Tensor) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"{name} shape {tuple(x.shape)} does not match log_probs shape {tuple(ref.shape)}")


class _ClassmateLoss(torch.nn.Module):
    """What both classmate losses share: clip ranges of both terms, aggregation, ratio type and IS correction.

    The constructor is the one of both losses. ``clip_eps_low`` / ``clip_eps_high`` (ε_lo, ε_hi) and ``dual_clip``
    clip the main term as in upstream's ``PolicyLoss`` (and take its defaults); ``classmate_*`` clip the classmate
    term; ``loss_agg_mode`` is one of :data:`LOSS_AGG_MODES` (``max_response_len`` and ``ref_micro_batch_size`` are
    read by ``seq-mean-token-sum-norm`` only, see :func:`aggregate`); ``policy_loss_type`` and ``is_correction_*``
    are upstream's ratio and rollout-correction options (module docstring).
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        *,
        dual_clip: float | None = None,
        classmate_clip_eps_low: float = 0.4,
        classmate_clip_eps_high: float = 0.4,
        classmate_dual_clip: float | None = None,
        loss_agg_mode: str = "token-mean",
        max_response_len: int | None = None,
        ref_micro_batch_size: float | None = None,
        policy_loss_type: str = "ppo",
        is_correction_level: str = "off",
        is_correction_mode: str = "mask",
        is_correction_gating: str = "ratio",
        is_correction_threshold: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        super().__init__()
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
        _check_dual_clip("dual_clip", dual_clip)
        _check_dual_clip("classmate_dual_clip", classmate_dual_clip)
        threshold = tuple(float(x) for x in is_correction_threshold)
        _check_is_options(policy_loss_type, is_correction_level, is_correction_mode, is_correction_gating, threshold)
        if policy_loss_type == "gspo":
            if loss_agg_mode == "seq-mean-token-sum-norm":
                raise ValueError("policy_loss_type gspo aggregates per sequence; seq-mean-token-sum-norm is not "
                                 "defined for it")
            loss_agg_mode = "seq-mean-token-mean"  # as upstream: GSPO is a sequence-level objective
        self.clip_eps_low, self.clip_eps_high, self.dual_clip = clip_eps_low, clip_eps_high, dual_clip
        self.classmate_clip_eps_low = classmate_clip_eps_low
        self.classmate_clip_eps_high = classmate_clip_eps_high
        self.classmate_dual_clip = classmate_dual_clip
        self.loss_agg_mode = loss_agg_mode
        self.max_response_len = max_response_len
        self.ref_micro_batch_size = ref_micro_batch_size
        self.policy_loss_type = policy_loss_type
        self.is_correction_level = is_correction_level
        self.is_correction_mode = is_correction_mode
        self.is_correction_gating = is_correction_gating
        self.is_correction_threshold = threshold
        self.last_stats: dict[str, torch.Tensor] = {}

    def _ratio(self, log_probs, old_log_probs, action_mask, rollout_log_probs) -> torch.Tensor:
        correcting = self.is_correction_level != "off"
        if correcting and rollout_log_probs is None:
            raise ValueError(f"is_correction_level={self.is_correction_level} needs rollout_log_probs")
        return policy_ratio(log_probs, old_log_probs, action_mask, rollout_log_probs,
                            policy_loss_type=self.policy_loss_type, is_correction=correcting)

    def _is_weight(self, old_log_probs, rollout_log_probs, action_mask):
        """(w, is_filter_ratio, vllm_kl), or (None, None, None) where upstream applies no weight (off, or gspo)."""
        if self.is_correction_level == "off" or self.policy_loss_type != "ppo":
            return None, None, None
        return is_correction_weight(old_log_probs, rollout_log_probs, action_mask, level=self.is_correction_level,
                                    mode=self.is_correction_mode, gating=self.is_correction_gating,
                                    threshold=self.is_correction_threshold)

    def _aggregate(self, loss: torch.Tensor, action_mask, dp_size, batch_num_tokens, global_batch_size):
        return aggregate(loss, action_mask, mode=self.loss_agg_mode, dp_size=dp_size, batch_num_tokens=batch_num_tokens,
                         global_batch_size=global_batch_size, max_response_len=self.max_response_len,
                         ref_micro_batch_size=self.ref_micro_batch_size)


class SeparatedPolicyLoss(_ClassmateLoss):
    """Two clipped PPO terms with the same ratio, mask, IS weight and aggregation (the "separated" objective:
    ``A^m`` on every valid token and ``A^c`` on the CoT tokens, or on every valid token, each in its own clipped term):

        L = w · PPO(r, A^m; ε_lo, ε_hi, dual_clip) + w · PPO(r, A^c; ε^c_lo, ε^c_hi, classmate_dual_clip)

    with upstream's per-token clipped PPO term, r̄ = clamp(r, 1-ε_lo, 1+ε_hi):

        PPO(r, A; ε_lo, ε_hi, C) = max(-r·A, -r̄·A)                  where A ≥ 0, or C is None
                                 = min(-C·A, max(-r·A, -r̄·A))       where A < 0 (dual clip)

    ``advantages`` are the main advantages A^m·v; ``classmate_advantages`` are A^c·m (or A^c·v); r and w as in the
    module docstring. Each term gets the gradient of its own advantage, so the classmate stream really trains the
    CoT tokens (unlike ``VanillaClassmatePolicyLoss``). With ``classmate_advantages == 0`` this equals openrlhf's
    ``PolicyLoss`` exactly, and in general it equals the sum of two ``PolicyLoss`` calls with the two clip ranges.
    The returned ``clip_ratio`` is the main term's (openrlhf's definition: surr2 < surr1).
    """

    def _token_terms(self, ratio, advantages, classmate_advantages):
        main_token_loss, main_clipped = _ppo_token_loss(
            ratio, advantages, self.clip_eps_low, self.clip_eps_high, self.dual_clip
        )
        classmate_token_loss, classmate_clipped = _ppo_token_loss(
            ratio,
            classmate_advantages,
            self.classmate_clip_eps_low,
            self.classmate_clip_eps_high,
            self.classmate_dual_clip,
        )
        return main_token_loss, classmate_token_loss, main_clipped, classmate_clipped

    def token_loss(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        *,
        classmate_advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token loss [B, T] before aggregation (main term + classmate term, IS weight applied)."""
        ratio = self._ratio(log_probs, old_log_probs, action_mask, rollout_log_probs)
        main_token_loss, classmate_token_loss, _, _ = self._token_terms(ratio, advantages, classmate_advantages)
        weight, _, _ = self._is_weight(old_log_probs, rollout_log_probs, action_mask)
        total = main_token_loss + classmate_token_loss
        return total if weight is None else weight * total

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | torch.Tensor | None = None,
        global_batch_size: float | torch.Tensor | None = None,
        *,
        classmate_advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        _check_same_shape("advantages", advantages, log_probs)
        _check_same_shape("classmate_advantages", classmate_advantages, log_probs)
        ratio = self._ratio(log_probs, old_log_probs, action_mask, rollout_log_probs)
        main_token_loss, classmate_token_loss, main_clipped, classmate_clipped = self._token_terms(
            ratio, advantages, classmate_advantages
        )
        weight, filter_ratio, vllm_kl = self._is_weight(old_log_probs, rollout_log_probs, action_mask)
        if weight is not None:
            main_token_loss, classmate_token_loss = weight * main_token_loss, weight * classmate_token_loss
        batch_info = (dp_size, batch_num_tokens, global_batch_size)
        # aggregate() is linear, so this equals aggregating the summed per-token loss.
        main_loss = self._aggregate(main_token_loss, action_mask, *batch_info)
        classmate_loss = self._aggregate(classmate_token_loss, action_mask, *batch_info)
        loss = main_loss + classmate_loss
        clip_ratio = _masked_mean(main_clipped.float(), action_mask)
        ppo_kl = _masked_mean(-(log_probs - old_log_probs).detach(), action_mask)
        self.last_stats = {
            "main_loss": main_loss.detach(),
            "classmate_loss": classmate_loss.detach(),
            "main_clip_ratio": clip_ratio.detach(),
            "classmate_clip_ratio": _masked_mean(classmate_clipped.float(), action_mask).detach(),
            "ppo_kl": ppo_kl,
        }
        return loss, clip_ratio, ppo_kl, vllm_kl, filter_ratio


class VanillaClassmatePolicyLoss(_ClassmateLoss):
    """The reference two-ratio loss ``compute_policy_loss_vanilla_classmate`` (the reference implementation at
    commit 030d0d13), exactly.

    Per token, with ``r = exp(clamp(ℓθ - ℓold, ±20))``, ``c = exp(clamp(ℓcl - ℓold, ±20))`` (ℓcl = the classmate's
    log-prob of the main model's CoT token), ``r̄ = clamp(r, 1-ε_lo, 1+ε_hi)``, ``c̄ = clamp(c, 1-ε^c_lo, 1+ε^c_hi)``
    and m = CoT mask:

        v1 = r·A^m + m·c·A^c      v2 = r̄·A^m + m·c̄·A^c      v3 = C·A^m + m·C_c·A^c
        L1 = max(-v1, -v2)
        L  = min(-v3, L1) where v2 < 0, else L1          (dual clip on the sign of v2; skipped if dual_clip is None)

    multiplied by upstream's rollout IS weight w when ``is_correction_level`` is on (module docstring), and
    aggregated with ``loss_agg_mode`` (default ``seq-mean-token-sum-norm``, see :func:`aggregate`) over the response mask. The ratio
    is token-level: ``policy_loss_type="gspo"`` has no meaning for the two-ratio form and is refused.

    **The classmate advantage never contributes a gradient of its own.** c, c̄, A^c and v3 do not depend on θ
    (ℓcl comes from the classmate engine and ℓold is stored), so ∂L/∂ℓθ is -A^m·r on the v1 branch and on the v2
    branch with r inside the clip range, and 0 otherwise. A^c only changes which branch is active per CoT token and
    adds constants to the reported loss (in the two-sequence worked example checked in
    ``tests/test_losses.py``, plain PPO clips a token that this loss does not); ``token_mode`` has no effect on the
    update. Use it to reproduce the reference runs; ``SeparatedPolicyLoss`` gives the classmate stream a gradient.

    ``classmate_log_probs`` may be -inf (or anything) outside the CoT: it is replaced by ℓold there before the
    subtraction, so no inf - inf or inf·0 can produce NaN. ℓold and ℓcl are treated as constants (detached).

    ``last_stats``: ``loss``, ``main_clip_ratio`` = mean over v of [r ≠ r̄] (the reference's ``pg_clipfrac``, also
    the returned ``clip_ratio``), ``classmate_clip_ratio`` = mean over m of [c ≠ c̄] (the reference's repurposed
    ``pg_clipfrac_lower``), ``ppo_kl`` = mean over v of (ℓold - ℓθ) after the clamp.
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        *,
        dual_clip: float | None = 3.0,
        classmate_dual_clip: float | None = 3.0,
        loss_agg_mode: str = "seq-mean-token-sum-norm",
        policy_loss_type: str = "ppo",
        **options,
    ) -> None:
        """The reference's defaults (C = C_c = 3, ``seq-mean-token-sum-norm``); ``options`` as for
        :class:`SeparatedPolicyLoss` (the shared constructor)."""
        if policy_loss_type != "ppo":
            raise ValueError("the vanilla_classmate loss is token-level (two per-token ratios); policy_loss_type "
                             f"{policy_loss_type!r} is not defined for it")
        if dual_clip is not None and classmate_dual_clip is None:
            raise ValueError("classmate_dual_clip must be set when dual_clip is set (v3 needs both constants)")
        super().__init__(clip_eps_low, clip_eps_high, dual_clip=dual_clip, classmate_dual_clip=classmate_dual_clip,
                         loss_agg_mode=loss_agg_mode, policy_loss_type=policy_loss_type, **options)

    def _token_terms(self, log_probs, old_log_probs, advantages, classmate_advantages, classmate_log_probs, cot_mask):
        cot = cot_mask.bool()
        old = old_log_probs.detach()
        delta = (log_probs - old_log_probs).clamp(min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
        r = delta.exp()
        r_clip = r.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high)
        classmate_lp = torch.where(cot, classmate_log_probs.detach().to(old.dtype), old)
        c = (classmate_lp - old).clamp(min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP).exp()
        c_clip = c.clamp(1 - self.classmate_clip_eps_low, 1 + self.classmate_clip_eps_high)
        a_m = advantages
        a_c = torch.where(cot, classmate_advantages, classmate_advantages.new_zeros(()))

        v1 = r * a_m + c * a_c
        v2 = r_clip * a_m + c_clip * a_c
        per_token = torch.max(-v1, -v2)
        if self.dual_clip is not None:
            v3 = self.dual_clip * a_m + self.classmate_dual_clip * a_c
            per_token = torch.where(v2 < 0, torch.min(-v3, per_token), per_token)

        return per_token, (r, r_clip, c, c_clip, delta, cot)

    def token_loss(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        *,
        classmate_advantages: torch.Tensor,
        classmate_log_probs: torch.Tensor,
        cot_mask: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token loss L [B, T] of the class docstring before aggregation (times the IS weight when correction
        is on)."""
        per_token, _ = self._token_terms(
            log_probs, old_log_probs, advantages, classmate_advantages, classmate_log_probs, cot_mask
        )
        weight, _, _ = self._is_weight(old_log_probs, rollout_log_probs, action_mask)
        return per_token if weight is None else weight * per_token

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | torch.Tensor | None = None,
        global_batch_size: float | torch.Tensor | None = None,
        *,
        classmate_advantages: torch.Tensor,
        classmate_log_probs: torch.Tensor,
        cot_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        for name, x in (
            ("advantages", advantages),
            ("classmate_advantages", classmate_advantages),
            ("classmate_log_probs", classmate_log_probs),
            ("cot_mask", cot_mask),
        ):
            _check_same_shape(name, x, log_probs)
        if self.is_correction_level != "off" and rollout_log_probs is None:
            raise ValueError(f"is_correction_level={self.is_correction_level} needs rollout_log_probs")
        per_token, terms = self._token_terms(
            log_probs, old_log_probs, advantages, classmate_advantages, classmate_log_probs, cot_mask
        )
        weight, filter_ratio, vllm_kl = self._is_weight(old_log_probs, rollout_log_probs, action_mask)
        if weight is not None:
            per_token = weight * per_token
        r, r_clip, c, c_clip, delta, cot = terms
        loss = self._aggregate(per_token, action_mask, dp_size, batch_num_tokens, global_batch_size)
        clip_ratio = _masked_mean((r != r_clip).float(), action_mask).detach()
        ppo_kl = _masked_mean(-delta.detach(), action_mask)
        self.last_stats = {
            "loss": loss.detach(),
            "main_clip_ratio": clip_ratio,
            "classmate_clip_ratio": _masked_mean((c != c_clip).float(), cot).detach(),
            "ppo_kl": ppo_kl,
        }
        return loss, clip_ratio, ppo_kl, vllm_kl, filter_ratio

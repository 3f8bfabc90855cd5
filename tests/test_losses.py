"""Policy losses and aggregation (the formulas of ``openrlhf_classmate/algo/losses.py``), with
a two-sequence worked example."""

import importlib.util
import inspect
import os
import re

import pytest
import torch
from openrlhf.models.loss import PolicyLoss, aggregate_loss
from openrlhf.utils.loss_utils import iter_grad_accum_global_norm

from openrlhf_classmate.algo.losses import (
    LOSS_AGG_MODES,
    SeparatedPolicyLoss,
    VanillaClassmatePolicyLoss,
    aggregate,
)

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-6)
NEG_INF = float("-inf")

# The two-sequence worked example: rows i0 and i2 of tests/test_advantages.py's example, un-normalised advantages.
DELTA = torch.tensor(
    [[0, 0.1, 0.3, -0.3, 0, 0.262364, -0.05, 0], [0, -0.5, 0.1, 0.25, 0, 0, -0.3, 0]],
    dtype=F64,
)
DELTA_C = torch.tensor(
    [
        [NEG_INF, -1.0, 0.5, 0.2, NEG_INF, NEG_INF, NEG_INF, NEG_INF],
        [NEG_INF, 2.0, 0.0, -0.1, 0.3, -2.0, 0.4, 0.0],
    ],
    dtype=F64,
)
COT = torch.tensor([[0, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
ACTION_MASK = torch.ones(2, 8, dtype=torch.bool)
A_MAIN = torch.tensor([[4.0] * 8, [-4.0] * 8], dtype=F64)
A_CM = torch.tensor([[1.25], [-0.75]], dtype=F64) * COT
OLD = -1.0 - 0.1 * torch.arange(16, dtype=F64).view(2, 8)  # any stored log-probs; only differences matter

EXPECTED_L = [
    [-4, -4.880533, -6.55, -4.490026, -4, -4.8, -3.804918, -4],
    [4, 7.967915, 5.170684, 5.81473, 5.012394, 4.45, 4.25, 4.75],
]
EXPECTED_G = [
    [-4, -4.420684, 0, -2.963273, -4, 0, -3.804918, -4],
    [4, 2.426123, 4.420684, 5.136102, 4, 4, 0, 4],
]
EXPECTED_PPO_L = [
    [-4, -4.420684, -4.8, -2.963273, -4, -4.8, -3.804918, -4],
    [4, 3.2, 4.420684, 5.136102, 4, 4, 3.2, 4],
]


def _log_probs() -> torch.Tensor:
    return (OLD + DELTA).detach().requires_grad_(True)


def _vanilla_call(loss_fn, log_probs, **batch_info):
    return loss_fn(
        log_probs,
        OLD,
        A_MAIN,
        action_mask=ACTION_MASK,
        rollout_log_probs=None,
        **batch_info,
        classmate_advantages=A_CM,
        classmate_log_probs=OLD + DELTA_C,
        cot_mask=COT,
    )


def test_section_12_3_per_token_loss_and_gradient():
    loss_fn = VanillaClassmatePolicyLoss()
    lp = _log_probs()
    tok = loss_fn.token_loss(lp, OLD, A_MAIN, classmate_advantages=A_CM, classmate_log_probs=OLD + DELTA_C, cot_mask=COT)
    torch.testing.assert_close(tok.detach(), torch.tensor(EXPECTED_L, dtype=F64), **TOL)
    (grad,) = torch.autograd.grad(tok.sum(), lp)
    torch.testing.assert_close(grad, torch.tensor(EXPECTED_G, dtype=F64), **TOL)
    # (a) every non-zero g is -A^m·r: the classmate advantage never enters the gradient
    r = DELTA.exp()
    nonzero = grad != 0
    torch.testing.assert_close(grad[nonzero], (-A_MAIN * r)[nonzero], rtol=0, atol=1e-12)
    # (b) token (2,1) is clipped under standard PPO but not under the classmate loss; (c) (0,2) clipped in both
    assert grad[1, 1].item() == pytest.approx(2.426123, abs=1e-6)
    assert grad[0, 2].item() == 0.0


def test_section_12_3_standard_ppo_column():
    ppo = SeparatedPolicyLoss(dual_clip=3.0, loss_agg_mode="seq-mean-token-sum-norm")
    lp = _log_probs()
    tok = ppo.token_loss(lp, OLD, A_MAIN, classmate_advantages=torch.zeros_like(A_MAIN))
    torch.testing.assert_close(tok.detach(), torch.tensor(EXPECTED_PPO_L, dtype=F64), **TOL)
    (grad,) = torch.autograd.grad(tok.sum(), lp)
    assert grad[1, 1].item() == 0.0 and grad[0, 2].item() == 0.0
    loss, *_ = ppo(lp, OLD, A_MAIN, action_mask=ACTION_MASK, classmate_advantages=torch.zeros_like(A_MAIN))
    assert loss.item() == pytest.approx(-0.104011, abs=1e-6)


def test_section_12_3_aggregate_and_statistics():
    loss_fn = VanillaClassmatePolicyLoss()
    lp = _log_probs()
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter = _vanilla_call(loss_fn, lp)
    tok_sums = torch.tensor(EXPECTED_L, dtype=F64).sum(1)
    torch.testing.assert_close(tok_sums, torch.tensor([-36.525477, 41.415722], dtype=F64), **TOL)
    assert loss.item() == pytest.approx(0.611281, abs=1e-6)
    assert clip_ratio.item() == pytest.approx(0.375, abs=1e-12)
    assert ppo_kl.item() == pytest.approx(0.008602, abs=1e-6)
    assert vllm_kl is None and is_filter is None
    stats = loss_fn.last_stats
    assert stats["classmate_clip_ratio"].item() == pytest.approx(0.5, abs=1e-12)
    assert stats["main_clip_ratio"].item() == pytest.approx(0.375, abs=1e-12)
    assert stats["loss"].item() == pytest.approx(0.611281, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(grad * 8, torch.tensor(EXPECTED_G, dtype=F64), **TOL)
    assert not torch.isnan(grad).any()


def test_vanilla_handles_inf_and_nan_classmate_logprobs_outside_cot():
    cl = (OLD + DELTA_C).clone()
    cl[~COT] = float("nan")  # anything outside the CoT is ignored
    loss_fn = VanillaClassmatePolicyLoss()
    lp = _log_probs()
    loss, *_ = loss_fn(lp, OLD, A_MAIN, ACTION_MASK, classmate_advantages=A_CM, classmate_log_probs=cl, cot_mask=COT)
    assert loss.item() == pytest.approx(0.611281, abs=1e-6)
    loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_vanilla_token_mode_all_does_not_change_the_loss():
    a_cm_all = torch.tensor([[1.25], [-0.75]], dtype=F64).expand(2, 8)
    loss_fn = VanillaClassmatePolicyLoss()
    a, *_ = _vanilla_call(loss_fn, _log_probs())
    extras = dict(classmate_advantages=a_cm_all, classmate_log_probs=OLD + DELTA_C, cot_mask=COT)
    b, *_ = loss_fn(_log_probs(), OLD, A_MAIN, ACTION_MASK, **extras)
    assert a.item() == b.item()


# ---------------------------------------------------------------------------------------------------------------
# SeparatedPolicyLoss
# ---------------------------------------------------------------------------------------------------------------


def _random_inputs(seed: int, batch: int = 5, width: int = 7):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen) * 3
    lp = (old + torch.randn(batch, width, generator=gen) * 0.3).requires_grad_(True)
    adv = torch.randn(batch, 1, generator=gen).expand(batch, width).clone()
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    return lp, old, adv * mask, mask


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("with_info", [False, True])
def test_separated_with_zero_classmate_advantages_equals_openrlhf_policy_loss(mode, dual_clip, with_info):
    lp, old, adv, mask = _random_inputs(0)
    info = {}
    if with_info:
        info = dict(dp_size=2, batch_num_tokens=torch.tensor(40.0), global_batch_size=torch.tensor(9.0))
    reference = PolicyLoss(0.2, 0.28, dual_clip=dual_clip, token_level_loss=mode == "token-mean")
    ours = SeparatedPolicyLoss(0.2, 0.28, dual_clip=dual_clip, classmate_dual_clip=dual_clip, loss_agg_mode=mode)
    ref_out = reference(lp, old, adv, action_mask=mask, rollout_log_probs=None, **info)
    (ref_grad,) = torch.autograd.grad(ref_out[0], lp)
    out = ours(
        lp, old, adv, action_mask=mask, rollout_log_probs=None, **info, classmate_advantages=torch.zeros_like(adv)
    )
    (grad,) = torch.autograd.grad(out[0], lp)
    assert torch.equal(out[0], ref_out[0])
    assert torch.equal(grad, ref_grad)
    assert torch.equal(out[1], ref_out[1]) and torch.equal(out[2], ref_out[2])
    assert out[3] is None and out[4] is None


def test_separated_is_the_sum_of_two_clipped_terms():
    lp, old, adv, mask = _random_inputs(1)
    cm_adv = torch.randn(adv.shape, generator=torch.Generator().manual_seed(9), dtype=adv.dtype) * mask
    ours = SeparatedPolicyLoss(0.2, 0.2, classmate_clip_eps_low=0.4, classmate_clip_eps_high=0.4)
    loss, clip_ratio, *_ = ours(lp, old, adv, action_mask=mask, classmate_advantages=cm_adv)
    main_term = PolicyLoss(0.2, 0.2)(lp, old, adv, action_mask=mask)
    cm_term = PolicyLoss(0.4, 0.4)(lp, old, cm_adv, action_mask=mask)
    torch.testing.assert_close(loss, main_term[0] + cm_term[0], rtol=0, atol=1e-6)
    (g,) = torch.autograd.grad(loss, lp)
    (g_ref,) = torch.autograd.grad(main_term[0] + cm_term[0], lp)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-6)
    assert (g[cm_adv != 0] != 0).any()  # the classmate advantage has a gradient of its own here
    stats = ours.last_stats
    assert set(stats) == {"main_loss", "classmate_loss", "main_clip_ratio", "classmate_clip_ratio", "ppo_kl"}
    torch.testing.assert_close(stats["main_loss"], main_term[0].detach())
    torch.testing.assert_close(stats["classmate_loss"], cm_term[0].detach())
    torch.testing.assert_close(stats["main_clip_ratio"], main_term[1])
    torch.testing.assert_close(stats["classmate_clip_ratio"], cm_term[1])
    assert stats["main_clip_ratio"].item() == clip_ratio.item()


# Every ratio / rollout-correction option of upstream's PolicyLoss, in both terms.
IS_OPTIONS = [
    dict(policy_loss_type=t, is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating,
         is_correction_threshold=threshold)
    for t in ("ppo", "gspo")
    for level in ("off", "token", "seq")
    for mode, gating, threshold in (("mask", "ratio", (0.8, 1.25)), ("clip", "ratio", (0.8, 1.25)),
                                    ("mask", "binary_kl", (0.0, 0.02)), ("mask", "tv", (0.0, 0.1)))
    if not (mode == "clip" and level == "seq")
    if level != "off" or (mode, gating) == ("mask", "ratio")
]


def _rollout_inputs(seed: int):
    lp, old, adv, mask = _random_inputs(seed, batch=6, width=9)
    gen = torch.Generator().manual_seed(seed + 100)
    rollout = old + torch.randn(old.shape, generator=gen) * 0.25  # vLLM's log-probs differ from the trainer's
    cm_adv = torch.randn(adv.shape, generator=gen) * mask
    return lp, old, adv, mask, rollout, cm_adv


def _option_id(o):
    return f"{o['policy_loss_type']}-{o['is_correction_level']}-{o['is_correction_mode']}-{o['is_correction_gating']}"


@pytest.mark.parametrize("options", IS_OPTIONS, ids=_option_id)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_separated_honours_gspo_and_is_correction_exactly_as_upstream_in_both_terms(options, dual_clip):
    lp, old, adv, mask, rollout, cm_adv = _rollout_inputs(3)
    info = dict(dp_size=2, batch_num_tokens=torch.tensor(40.0), global_batch_size=torch.tensor(9.0))
    main_ref = PolicyLoss(0.2, 0.28, dual_clip=dual_clip, **options)
    cm_ref = PolicyLoss(0.4, 0.4, dual_clip=dual_clip, **options)
    ours = SeparatedPolicyLoss(0.2, 0.28, dual_clip=dual_clip, classmate_clip_eps_low=0.4, classmate_clip_eps_high=0.4,
                               classmate_dual_clip=dual_clip, **options)
    call = dict(action_mask=mask, rollout_log_probs=rollout, **info)
    main_out = main_ref(lp, old, adv, **call)
    cm_out = cm_ref(lp, old, cm_adv, **call)
    out = ours(lp, old, adv, **call, classmate_advantages=cm_adv)
    torch.testing.assert_close(out[0], main_out[0] + cm_out[0], rtol=0, atol=1e-6)
    (grad,) = torch.autograd.grad(out[0], lp)
    (ref_grad,) = torch.autograd.grad(main_out[0] + cm_out[0], lp)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-6)
    assert torch.equal(out[1], main_out[1]) and torch.equal(out[2], main_out[2])
    for ours_stat, ref_stat in zip(out[3:], main_out[3:]):
        assert (ours_stat is None) == (ref_stat is None)
        if ref_stat is not None:
            torch.testing.assert_close(ours_stat, ref_stat, rtol=0, atol=1e-7)
    # the option is live: the same call with it turned off gives another loss
    plain = SeparatedPolicyLoss(0.2, 0.28, dual_clip=dual_clip, classmate_clip_eps_low=0.4,
                                classmate_clip_eps_high=0.4, classmate_dual_clip=dual_clip)
    if options["policy_loss_type"] != "ppo" or options["is_correction_level"] != "off":
        assert not torch.allclose(plain(lp, old, adv, **call, classmate_advantages=cm_adv)[0], out[0])


def test_separated_is_weight_scales_both_terms_by_upstreams_truncated_weight():
    lp, old, adv, mask, rollout, cm_adv = _rollout_inputs(4)
    options = dict(is_correction_level="token", is_correction_mode="clip", is_correction_threshold=(0.8, 1.25))
    ours = SeparatedPolicyLoss(**options)
    plain = SeparatedPolicyLoss()
    weight = (old - rollout).exp().clamp(0.8, 1.25)
    assert ((weight == 0.8) | (weight == 1.25)).any() and ((weight > 0.8) & (weight < 1.25)).any()
    torch.testing.assert_close(
        ours.token_loss(lp, old, adv, classmate_advantages=cm_adv, action_mask=mask, rollout_log_probs=rollout),
        weight * plain.token_loss(lp, old, adv, classmate_advantages=cm_adv),
        rtol=0, atol=1e-7,
    )


def test_vanilla_applies_the_is_weight_to_the_whole_two_ratio_token_loss():
    rollout = OLD + torch.tensor([[0.3] * 8, [-0.05] * 8], dtype=F64)  # row 0 outside the band, row 1 inside
    options = dict(is_correction_level="seq", is_correction_mode="mask", is_correction_threshold=(0.8, 1.25))
    corrected = VanillaClassmatePolicyLoss(**options)
    lp = _log_probs()
    tok = corrected.token_loss(lp, OLD, A_MAIN, classmate_advantages=A_CM, classmate_log_probs=OLD + DELTA_C,
                               cot_mask=COT, action_mask=ACTION_MASK, rollout_log_probs=rollout)
    expected = torch.tensor(EXPECTED_L, dtype=F64) * torch.tensor([[0.0], [0.05]], dtype=F64).exp() * torch.tensor(
        [[0.0], [1.0]], dtype=F64)
    torch.testing.assert_close(tok.detach(), expected, **TOL)
    loss, _, _, vllm_kl, filter_ratio = _vanilla_call_with(corrected, lp, rollout)
    assert filter_ratio.item() == 0.5  # one of the two sequences dropped
    assert vllm_kl.item() == pytest.approx((0.3 * 8 - 0.05 * 8) / 16, abs=1e-12)
    assert loss.item() == pytest.approx(float(expected.sum()) / 8, abs=1e-6)
    with pytest.raises(ValueError, match="gspo"):
        VanillaClassmatePolicyLoss(policy_loss_type="gspo")
    with pytest.raises(ValueError, match="needs rollout_log_probs"):
        _vanilla_call_with(corrected, lp, None)


def _vanilla_call_with(loss_fn, log_probs, rollout):
    return loss_fn(log_probs, OLD, A_MAIN, action_mask=ACTION_MASK, rollout_log_probs=rollout,
                   classmate_advantages=A_CM, classmate_log_probs=OLD + DELTA_C, cot_mask=COT)


def test_gspo_forces_the_sequence_mean_and_refuses_the_reference_aggregation():
    assert SeparatedPolicyLoss(policy_loss_type="gspo").loss_agg_mode == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="gspo"):
        SeparatedPolicyLoss(policy_loss_type="gspo", loss_agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="is_correction_mode=clip requires"):
        SeparatedPolicyLoss(is_correction_level="seq", is_correction_mode="clip")


def test_separated_classmate_dual_clip():
    lp = torch.tensor([[2.0]], dtype=F64, requires_grad=True)  # r = e^2, far above the clip range
    old = torch.zeros(1, 1, dtype=F64)
    zero = torch.zeros(1, 1, dtype=F64)
    neg = torch.full((1, 1), -1.0, dtype=F64)
    with_dual = SeparatedPolicyLoss(classmate_dual_clip=3.0)
    without = SeparatedPolicyLoss()
    assert with_dual(lp, old, zero, classmate_advantages=neg)[0].item() == pytest.approx(3.0)
    assert without(lp, old, zero, classmate_advantages=neg)[0].item() == pytest.approx(torch.e**2)


# ---------------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------------


def test_aggregate_delegates_to_openrlhf():
    loss = torch.randn(3, 5, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    for mode, token_level in (("token-mean", True), ("seq-mean-token-mean", False)):
        for info in ({}, dict(dp_size=4, batch_num_tokens=20.0, global_batch_size=6.0)):
            ours = aggregate(loss, mask, mode=mode, **info)
            assert torch.equal(ours, aggregate_loss(loss, mask, token_level_loss=token_level, **info))
    assert LOSS_AGG_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'seq-sum'"):
        aggregate(loss, mask, mode="seq-sum")


def test_seq_mean_token_sum_norm_without_batch_info():
    loss = torch.randn(3, 5, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    total = (loss * mask).sum()
    torch.testing.assert_close(aggregate(loss, mask, mode="seq-mean-token-sum-norm"), total / 5)
    padded = aggregate(loss, mask, mode="seq-mean-token-sum-norm", max_response_len=3072)
    torch.testing.assert_close(padded, total / 3072)


def _per_micro_batch_losses(loss, mask, micro, gas, width, ref_mbs=None):
    """Objective DeepSpeed optimises for one step: Σ_k x_k / gas, with openrlhf's loss_batch_info."""
    batches = [(loss[i : i + micro], mask[i : i + micro]) for i in range(0, loss.shape[0], micro)]
    total = torch.zeros((), dtype=loss.dtype)
    for (lb, mb), info in iter_grad_accum_global_norm(iter(batches), None, gas, lambda b: b[1]):
        x = aggregate(lb, mb, mode="seq-mean-token-sum-norm", **info, max_response_len=width,
                      ref_micro_batch_size=ref_mbs)
        total = total + x / gas  # DeepSpeed's engine.backward scales every micro-batch loss by 1/gas
    return total


def test_seq_mean_token_sum_norm_with_batch_info_matches_reference_objective():
    gen = torch.Generator().manual_seed(3)
    loss = torch.randn(8, 6, generator=gen, dtype=F64)
    lengths = torch.randint(1, 7, (8,), generator=gen)
    mask = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    width = 10
    seq_sums = (loss * mask).sum(1) / width

    # The reference's aggregation: per micro-batch Σ/T, scaled by 1/GA -> mean over micro-batches.
    reference = torch.stack([seq_sums[i : i + 2].sum() for i in range(0, 8, 2)]).mean()
    # Default C = global_batch_size / dp_size reproduces it literally (uniform micro-batches of 2, gas = 4).
    torch.testing.assert_close(_per_micro_batch_losses(loss, mask, 2, 4, width), reference)
    # With the reference micro-batch size fixed, the objective no longer depends on how the step is cut:
    one_big = _per_micro_batch_losses(loss, mask, 8, 1, width, ref_mbs=2)
    two_micro = _per_micro_batch_losses(loss, mask, 4, 2, width, ref_mbs=2)
    four_micro = _per_micro_batch_losses(loss, mask, 2, 4, width, ref_mbs=2)
    torch.testing.assert_close(one_big, reference)
    torch.testing.assert_close(two_micro, reference)
    torch.testing.assert_close(four_micro, reference)
    # Explicitly: Σ_i Σ_t L·v · C / (T · N)
    torch.testing.assert_close(one_big, seq_sums.sum() * 2 / 8)


def test_seq_mean_token_sum_norm_data_parallel():
    """2 DP ranks x gas 2, micro-batch 2: the DP-averaged objective equals the reference's."""
    gen = torch.Generator().manual_seed(4)
    loss = torch.randn(8, 5, generator=gen, dtype=F64)
    mask = torch.rand(8, 5, generator=gen) > 0.3
    mask[:, 0] = True
    width = 5
    n_global = 8
    gas, dp = 2, 2
    info = dict(dp_size=dp, batch_num_tokens=mask.sum() / gas, global_batch_size=torch.tensor(n_global / gas))
    objective = torch.zeros((), dtype=F64)
    for rank in range(dp):
        rows = slice(rank * 4, rank * 4 + 4)
        rank_total = sum(
            aggregate(loss[rows][k : k + 2], mask[rows][k : k + 2], mode="seq-mean-token-sum-norm", **info) / gas
            for k in (0, 2)
        )
        objective = objective + rank_total / dp  # gradient all-reduce = mean over ranks
    reference = (loss * mask).sum() / width * 2 / n_global  # Σ L·v · micro / (T · N)
    torch.testing.assert_close(objective, reference)


# ---------------------------------------------------------------------------------------------------------------
# openrlhf 0.11.2 call contract
# ---------------------------------------------------------------------------------------------------------------

OPENRLHF_LOSS_PARAMS = [
    "self", "log_probs", "old_log_probs", "advantages", "action_mask", "rollout_log_probs", "dp_size",
    "batch_num_tokens", "global_batch_size",
]  # fmt: skip


def test_openrlhf_policy_loss_signature_is_unchanged():
    assert list(inspect.signature(PolicyLoss.forward).parameters) == OPENRLHF_LOSS_PARAMS
    lp, old, adv, mask = _random_inputs(2)
    out = PolicyLoss()(lp, old, adv, action_mask=mask, rollout_log_probs=None, dp_size=1)
    assert isinstance(out, tuple) and len(out) == 5
    for cls in (SeparatedPolicyLoss, VanillaClassmatePolicyLoss):
        params = list(inspect.signature(cls.forward).parameters.values())
        assert [p.name for p in params[: len(OPENRLHF_LOSS_PARAMS)]] == OPENRLHF_LOSS_PARAMS
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[len(OPENRLHF_LOSS_PARAMS) :])


def test_training_step_call_pattern_is_the_one_we_accept():
    # Read the installed source instead of importing ppo_actor (slow to import).
    spec = importlib.util.find_spec("openrlhf")
    path = os.path.join(os.path.dirname(spec.origin), "trainer", "ray", "ppo_actor.py")
    with open(path) as f:
        source = f.read()
    call = re.search(r"=\s*self\.actor_loss_fn\((.*?)\n\s*\)", source, re.S)
    assert call is not None
    args = [a.strip() for a in call.group(1).split(",") if a.strip()]
    assert args == [
        "action_log_probs",
        "old_action_log_probs",
        "advantages",
        "action_mask=experience.action_mask",
        "rollout_log_probs=experience.rollout_log_probs",
        "**loss_batch_info",
    ]
    assert "actor_loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = self.actor_loss_fn(" in source

    # ...and both losses accept exactly that call plus their keyword-only extras.
    lp, old, adv, mask = _random_inputs(3)
    loss_batch_info = {"dp_size": 1, "batch_num_tokens": mask.sum().float(), "global_batch_size": torch.tensor(5.0)}
    rollout = old.clone()
    extras = dict(classmate_advantages=adv * 0.5)
    out = SeparatedPolicyLoss()(lp, old, adv, action_mask=mask, rollout_log_probs=rollout, **loss_batch_info, **extras)
    assert len(out) == 5
    extras.update(classmate_log_probs=old + 0.1, cot_mask=mask)
    out = VanillaClassmatePolicyLoss()(
        lp, old, adv, action_mask=mask, rollout_log_probs=rollout, **loss_batch_info, **extras
    )
    assert len(out) == 5
    with pytest.raises(TypeError):
        SeparatedPolicyLoss()(lp, old, adv, mask, None, 1, None, None, adv)  # the extras are keyword-only


def test_constructor_validation():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        SeparatedPolicyLoss(loss_agg_mode="sum")
    with pytest.raises(ValueError, match="classmate_dual_clip"):
        SeparatedPolicyLoss(classmate_dual_clip=1.0)
    with pytest.raises(ValueError, match="classmate_dual_clip must be set"):
        VanillaClassmatePolicyLoss(classmate_dual_clip=None)
    lp, old, adv, mask = _random_inputs(0)
    with pytest.raises(ValueError, match="classmate_advantages shape"):
        SeparatedPolicyLoss()(lp, old, adv, mask, classmate_advantages=adv[:, :3])

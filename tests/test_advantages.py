"""Advantages of the classmate estimators (the formulas of ``openrlhf_classmate/algo/advantages.py``), with a worked
example in numbers."""

import math
import statistics

import pytest
import torch

from openrlhf_classmate.algo.advantages import (
    ESTIMATORS,
    TOKEN_MODES,
    compute_advantages,
    group_normalize,
    main_advantages_over_valid,
    whiten_tokens,
)
from openrlhf_classmate.algo.classmate_reward import combine_classmate_scores
from openrlhf_classmate.algo.spans import cot_mask

F64 = torch.float64
TOL = dict(rtol=0, atol=1e-6)

# The worked example: one prompt, 4 responses (rows i0-i3), width 8.
V = torch.tensor(
    [[1] * 8, [1] * 6 + [0] * 2, [1] * 8, [1] * 7 + [0]],
    dtype=torch.bool,
)
M = torch.tensor(
    [
        [0, 1, 1, 1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0, 0, 0, 0],
        [0, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 0, 0, 0, 0, 0, 0],
    ],
    dtype=torch.bool,
)
R_MAIN = torch.tensor([8.0, 3.0, 0.0, 5.0], dtype=F64)
R_CM = torch.tensor([6.0, 2.0, 4.0, 7.0], dtype=F64)
GROUP = torch.zeros(4, dtype=torch.long)


def _base(std_norm: bool) -> str:
    return "group_norm" if std_norm else "dr_grpo"


def _run(estimator, token_mode="classmate_partial", std_norm=False, r_cm=R_CM, **kw):
    return compute_advantages(estimator, R_MAIN, r_cm, GROUP, response_mask=V, cot_mask=M, token_mode=token_mode,
                              baseline=_base(std_norm), **kw)


def _rows(per_row: list[float], mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor(per_row, dtype=F64).unsqueeze(1) * mask


def _close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **TOL)


# ---------------------------------------------------------------------------------------------------------------
# The worked example
# ---------------------------------------------------------------------------------------------------------------


def test_section_12_masks_rewards_chain():
    """Token ids -> CoT masks -> classmate reward -> advantages, end to end on the worked example."""
    o, c, a, e, p = 100, 5, 6, 2, 0
    ids = torch.tensor(
        [[o, c, c, c, 101, a, a, e], [o, c, c, 101, a, e, p, p], [o, c, c, c, c, c, c, c], [o, c, 101, a, a, a, e, p]]
    )
    spans = cot_mask(ids, V.long(), think_open_id=o, think_close_id=101, stop_ids=e)
    assert torch.equal(spans.mask, M)
    reward, ok, _ = combine_classmate_scores(R_CM.view(4, 1, 1), torch.ones(4, 1, 1, dtype=torch.bool), R_MAIN)
    out = compute_advantages("separated", R_MAIN, reward, GROUP, response_mask=V, cot_mask=spans.mask,
                             baseline="dr_grpo", classmate_valid=ok)
    _close(out["main_advantages"], _rows([4, -1, -4, 1], V))


def test_section_12_2_scalars():
    un = _run("separated")
    _close(un["main_scalar"], [4, -1, -4, 1])
    _close(un["classmate_scalar"], [1.25, -2.75, -0.75, 2.25])
    norm = _run("separated", std_norm=True)
    _close(norm["main_scalar"], [1.188177, -0.297044, -1.188177, 0.297044])
    _close(norm["classmate_scalar"], [0.563734, -1.240215, -0.338241, 1.014722])
    # σ = centred / normalised - ε
    assert 4 / norm["main_scalar"][0].item() - 1e-6 == pytest.approx(3.366502, abs=1e-6)
    assert 1.25 / norm["classmate_scalar"][0].item() - 1e-6 == pytest.approx(2.217356, abs=1e-6)
    assert statistics.stdev(R_MAIN.tolist()) == pytest.approx(3.366502, abs=1e-6)


@pytest.mark.parametrize(
    ("condition", "a_c", "sigma"),
    [
        ("no_classmate_when_main_incorrect", [2.25, -1.75, -3.75, 3.25], 3.304038),
        ("neg_classmate_when_main_incorrect", [3.25, -0.75, -6.75, 4.25], None),
        ("no_classmate", [0, 0, 0, 0], None),
    ],
)
def test_section_12_2_conditions(condition, a_c, sigma):
    reward, ok, _ = combine_classmate_scores(
        R_CM.view(4, 1, 1), torch.ones(4, 1, 1, dtype=torch.bool), R_MAIN, condition=condition
    )
    out = _run("separated", r_cm=reward, classmate_valid=ok)
    _close(out["classmate_scalar"], a_c)
    if sigma is not None:
        normed = _run("separated", std_norm=True, r_cm=reward, classmate_valid=ok)["classmate_scalar"]
        assert a_c[0] / normed[0].item() - 1e-6 == pytest.approx(sigma, abs=1e-6)


def test_section_12_2_gdpo_separated_token_tensors():
    out = _run("separated")
    main = torch.tensor(
        [[4] * 8, [-1] * 6 + [0, 0], [-4] * 8, [1] * 7 + [0]],
        dtype=F64,
    )
    cm_partial = torch.tensor(
        [
            [0, 1.25, 1.25, 1.25, 0, 0, 0, 0],
            [0, -2.75, -2.75, 0, 0, 0, 0, 0],
            [0] + [-0.75] * 7,
            [0, 2.25, 0, 0, 0, 0, 0, 0],
        ],
        dtype=F64,
    )
    _close(out["main_advantages"], main)
    _close(out["classmate_advantages"], cm_partial)
    _close(
        out["advantages"],
        [
            [4, 5.25, 5.25, 5.25, 4, 4, 4, 4],
            [-1, -3.75, -3.75, -1, -1, -1, 0, 0],
            [-4] + [-4.75] * 7,
            [1, 3.25, 1, 1, 1, 1, 1, 0],
        ],
    )
    all_mode = _run("separated", token_mode="all")
    _close(all_mode["main_advantages"], main)
    _close(all_mode["classmate_advantages"], _rows([1.25, -2.75, -0.75, 2.25], V))
    _close(all_mode["advantages"], _rows([5.25, -3.75, -4.75, 3.25], V))


def test_section_12_2_separated_non_neg():
    out = _run("separated_non_neg")
    _close(out["classmate_scalar"], [1.25, 0, 0, 2.25])
    _close(
        out["advantages"],
        [
            [4, 5.25, 5.25, 5.25, 4, 4, 4, 4],
            [-1] * 6 + [0, 0],
            [-4] * 8,
            [1, 3.25, 1, 1, 1, 1, 1, 0],
        ],
    )


def _cot_else_main(on_cot: list[float], a_m: list[float]) -> torch.Tensor:
    return torch.where(M, _rows(on_cot, V), _rows(a_m, V))


def test_section_12_2_gdpo_batch_normalised():
    s_bn = [1.051754, -0.751253, -0.951587, 0.651086]
    out = _run("gdpo")
    _close(out["combined_scalar"], s_bn)
    _close(out["advantages"], _cot_else_main(s_bn, [4, -1, -4, 1]))
    _close(_run("gdpo", token_mode="all")["advantages"], _rows(s_bn, V))
    assert statistics.stdev([5.25, -3.75, -4.75, 3.25]) == pytest.approx(4.991660, abs=1e-6)


def test_section_12_2_gdpo_wo_bn_and_weights():
    s = [5.25, -3.75, -4.75, 3.25]
    out = _run("gdpo_wo_bn")
    _close(out["combined_scalar"], s)
    _close(out["advantages"], _cot_else_main(s, [4, -1, -4, 1]))
    weighted = _run("gdpo_wo_bn", weights=(0.5, 2.0))["combined_scalar"]
    _close(weighted, [0.5 * 4 + 2 * 1.25, 0.5 * -1 + 2 * -2.75, 0.5 * -4 + 2 * -0.75, 0.5 * 1 + 2 * 2.25])


def test_section_12_2_grpo_w_classmate():
    out = _run("grpo_w_classmate")
    _close(out["combined_scalar"], [5.25, -3.75, -4.75, 3.25])
    _close(out["advantages"], _cot_else_main([5.25, -3.75, -4.75, 3.25], [4, -1, -4, 1]))
    normed = _run("grpo_w_classmate", std_norm=True)
    s_bn = [1.051754, -0.751253, -0.951587, 0.651086]
    _close(normed["advantages"], _cot_else_main(s_bn, [1.188177, -0.297044, -1.188177, 0.297044]))
    _close(_run("grpo_w_classmate", token_mode="all")["advantages"], _rows([5.25, -3.75, -4.75, 3.25], V))


def test_section_12_grpo_reward_sum_and_plain():
    _close(_run("grpo")["advantages"], _rows([5.25, -3.75, -4.75, 3.25], V))
    plain = compute_advantages("grpo", R_MAIN, None, GROUP, response_mask=V, cot_mask=M, token_mode="all",
                               baseline="dr_grpo")
    _close(plain["advantages"], _rows([4, -1, -4, 1], V))


# ---------------------------------------------------------------------------------------------------------------
# A per-sample loop reference of the module docstring's formulas, for random batches.
# ---------------------------------------------------------------------------------------------------------------


def _loop_groupnorm(values, groups, valid, std_norm, eps):
    out, defined = [], []
    for i in range(len(values)):
        members = [values[j] for j in range(len(values)) if groups[j] == groups[i] and valid[j]]
        if not valid[i] or len(members) < 2:
            out.append(0.0)
            defined.append(False)
            continue
        mu = sum(members) / len(members)
        sd = statistics.stdev(members)
        centred = 0.0 if max(members) == min(members) else values[i] - mu
        out.append(centred / (sd + eps) if std_norm else centred)
        defined.append(True)
    return out, defined


def _loop_advantages(estimator, main, cm, groups, resp, cot, token_mode, std_norm, ok, weights, eps=1e-6):
    main, cm, groups, ok = main.tolist(), cm.tolist(), groups.tolist(), ok.tolist()
    cm = [c if k else 0.0 for c, k in zip(cm, ok, strict=True)]
    a_m, _ = _loop_groupnorm(main, groups, [True] * len(main), std_norm, eps)
    a_c, _ = _loop_groupnorm(cm, groups, ok, std_norm, eps)
    if estimator == "separated_non_neg":
        a_c = [max(x, 0.0) for x in a_c]
    on_cot = None
    if estimator in ("grpo", "grpo_w_classmate"):
        comb, defined = _loop_groupnorm([x + y for x, y in zip(main, cm, strict=True)], groups, ok, std_norm, eps)
        on_cot = [c if d else m for c, d, m in zip(comb, defined, a_m, strict=True)]
        if estimator == "grpo":
            token_mode = "all"
    elif estimator in ("gdpo", "gdpo_wo_bn"):
        on_cot = [weights[0] * x + weights[1] * y for x, y in zip(a_m, a_c, strict=True)]
        if estimator == "gdpo":
            mu, sd = statistics.mean(on_cot), statistics.stdev(on_cot)
            on_cot = [(s - mu) / (sd + eps) for s in on_cot]
    adv = torch.zeros(resp.shape, dtype=F64)
    for i in range(resp.shape[0]):
        for t in range(resp.shape[1]):
            if not resp[i, t]:
                continue
            if on_cot is None:  # separated
                cm_mask = cot[i, t] if token_mode == "classmate_partial" else True
                adv[i, t] = a_m[i] + (a_c[i] if cm_mask else 0.0)
            elif token_mode == "all" or cot[i, t]:
                adv[i, t] = on_cot[i]
            else:
                adv[i, t] = a_m[i]
    return adv


def _random_batch(seed: int, groups: int = 6, width: int = 10):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 6, (groups,), generator=gen)
    ids = torch.randperm(1000, generator=gen)[:groups] * 7 - 300  # arbitrary, non-contiguous group ids
    group_index = torch.repeat_interleave(ids, sizes)
    group_index = group_index[torch.randperm(len(group_index), generator=gen)]  # groups interleaved
    batch = len(group_index)
    main = torch.randint(0, 11, (batch,), generator=gen).to(F64)  # rating-like ties included
    cm = torch.randn(batch, generator=gen, dtype=F64) * 3
    ok = torch.rand(batch, generator=gen) > 0.25
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    pos = torch.arange(width).unsqueeze(0)
    resp = pos < lengths.unsqueeze(1)
    start = (torch.rand(batch, generator=gen) * (lengths + 1)).long()
    end = start + (torch.rand(batch, generator=gen) * (lengths - start + 1)).long()
    cot = (pos >= start.unsqueeze(1)) & (pos < end.unsqueeze(1))
    return main, cm, group_index, resp, cot, ok


CASES = [(e, t, s) for e in ESTIMATORS for t in TOKEN_MODES for s in (False, True)]


@pytest.mark.parametrize(("estimator", "token_mode", "std_norm"), CASES)
def test_random_batches_match_loop_reference(estimator, token_mode, std_norm):
    for seed in range(3):
        main, cm, groups, resp, cot, ok = _random_batch(seed)
        out = compute_advantages(estimator, main, cm, groups, response_mask=resp, cot_mask=cot, token_mode=token_mode,
                                 baseline=_base(std_norm), classmate_valid=ok, weights=(0.7, 1.3))
        ref = _loop_advantages(estimator, main, cm, groups, resp, cot, token_mode, std_norm, ok, (0.7, 1.3))
        torch.testing.assert_close(out["advantages"], ref, rtol=0, atol=1e-9)


@pytest.mark.parametrize(("estimator", "token_mode", "std_norm"), CASES)
def test_properties_on_random_batches(estimator, token_mode, std_norm):
    main, cm, groups, resp, cot, ok = _random_batch(11)
    kw = dict(response_mask=resp, cot_mask=cot, token_mode=token_mode, baseline=_base(std_norm), classmate_valid=ok)
    out = compute_advantages(estimator, main, cm, groups, **kw)
    tensors = {k: v for k, v in out.items() if v.dim() == 2}

    # 0 on padding
    for name, x in tensors.items():
        assert (x[~resp] == 0).all(), name

    # classmate_partial: non-CoT valid tokens carry A^m
    if token_mode == "classmate_partial" and estimator != "grpo":
        a_m = out["main_scalar"].unsqueeze(1).expand_as(resp)
        off = resp & ~cot
        assert torch.equal(out["advantages"][off], a_m[off])

    # shifting all rewards of a group by a constant changes nothing
    shift = torch.zeros_like(main)
    for g, c in zip(groups.unique().tolist(), [3.0, -7.5, 100.0, 0.25, -1.0, 12.0], strict=False):
        shift[groups == g] = c
    shifted = compute_advantages(estimator, main + shift, cm + 2 * shift, groups, **kw)
    for key, x in out.items():
        torch.testing.assert_close(shifted[key], x, rtol=0, atol=1e-9, msg=key)

    # invalid classmate samples do not change anything else: their rewards are never read...
    garbage = torch.where(ok, cm, torch.full_like(cm, float("nan")))
    for key, x in compute_advantages(estimator, main, garbage, groups, **kw).items():
        assert torch.equal(x, out[key]), key
    # ...and the valid ones' A^c equals that of a batch without the invalid samples
    if estimator != "separated_non_neg":
        sub = compute_advantages(estimator, main[ok], cm[ok], groups[ok], response_mask=resp[ok], cot_mask=cot[ok],
                                 token_mode=token_mode, baseline="dr_grpo")
        full = compute_advantages(estimator, main, cm, groups, response_mask=resp, cot_mask=cot, token_mode=token_mode,
                                  baseline="dr_grpo", classmate_valid=ok)
        torch.testing.assert_close(full["classmate_scalar"][ok], sub["classmate_scalar"], rtol=0, atol=1e-12)
        assert (full["classmate_scalar"][~ok] == 0).all()


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e != "gdpo"])  # gdpo re-centres over the batch
@pytest.mark.parametrize("std_norm", [False, True])
def test_group_with_equal_rewards_gets_zero(estimator, std_norm):
    main, cm, groups, resp, cot, ok = _random_batch(5)
    g0 = groups == groups[0]
    main[g0] = 0.1
    cm[g0] = 0.3
    out = compute_advantages(estimator, main, cm, groups, response_mask=resp, cot_mask=cot, token_mode="all",
                             baseline=_base(std_norm), classmate_valid=ok)
    assert (out["advantages"][g0] == 0).all()
    assert (out["main_scalar"][g0] == 0).all() and (out["classmate_scalar"][g0] == 0).all()


def test_group_normalize_direct():
    r = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 5.0])
    g = torch.tensor([7, 7, 7, 3, 3, 9])
    out = group_normalize(r, g, baseline="dr_grpo")
    _close(out, [-1, 0, 1, 0, 0, 0])  # the size-1 group 9 gets 0
    assert out.dtype == torch.float32
    normed = group_normalize(r[:5], g[:5], valid=torch.tensor([True, True, False, True, True]))
    _close(normed, [-0.5 / (math.sqrt(0.5) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6), 0, 0, 0])
    with pytest.raises(ValueError, match="group_index"):
        group_normalize(r, g, baseline="group_norm")


def test_integer_rewards_and_float32_output():
    out = compute_advantages("gdpo", R_MAIN.long(), R_CM.long(), GROUP, response_mask=V, cot_mask=M, baseline="dr_grpo")
    assert out["advantages"].dtype == torch.float32
    torch.testing.assert_close(out["advantages"].double(), _run("gdpo")["advantages"], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def test_bad_input_raises_naming_the_argument():
    base = dict(
        estimator="gdpo",
        main_rewards=R_MAIN,
        classmate_rewards=R_CM,
        group_index=GROUP,
        response_mask=V,
        cot_mask=M,
        token_mode="classmate_partial",
        baseline="group_norm",
    )

    def call(**over):
        return compute_advantages(**{**base, **over})

    with pytest.raises(ValueError, match=r"classmate_rewards must have shape \(4,\).*\(3,\)"):
        call(classmate_rewards=R_CM[:3])
    with pytest.raises(ValueError, match="group_index must have shape"):
        call(group_index=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"response_mask must have shape \(4, T\), got \(3, 8\)"):
        call(response_mask=V[:3])
    with pytest.raises(ValueError, match=r"cot_mask shape \(4, 7\) does not match response_mask shape \(4, 8\)"):
        call(cot_mask=M[:, :7])
    with pytest.raises(ValueError, match="classmate_valid must have shape"):
        call(classmate_valid=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="main_rewards must be a 1-D"):
        call(main_rewards=R_MAIN.view(2, 2))
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        call(estimator="ppo")
    with pytest.raises(ValueError, match="unknown token_mode 'cot'"):
        call(token_mode="cot")
    with pytest.raises(ValueError, match="group_index has 1 group"):
        call(group_index=torch.tensor([0, 0, 0, 1]))
    with pytest.raises(ValueError, match="main_rewards has 1 non-finite"):
        call(main_rewards=torch.tensor([1.0, float("nan"), 2.0, 3.0], dtype=F64))
    with pytest.raises(ValueError, match="classmate_rewards has 1 non-finite"):
        call(classmate_rewards=torch.tensor([1.0, float("nan"), 2.0, 3.0], dtype=F64))
    with pytest.raises(ValueError, match="weights"):
        call(weights=(1.0,))
    # Not errors: CoT marks on padding (ignored), NaN at an invalid classmate entry, size-1 groups without std_norm.
    for estimator in ESTIMATORS:
        for key, x in call(estimator=estimator, cot_mask=torch.ones_like(M)).items():
            if x.dim() == 2:
                assert (x[~V] == 0).all(), (estimator, key)
    nan_invalid = torch.tensor([1.0, float("nan"), 2.0, 3.0], dtype=F64)
    call(classmate_rewards=nan_invalid, classmate_valid=torch.tensor([True, False, True, True]))
    out = call(group_index=torch.tensor([0, 0, 0, 1]), baseline="dr_grpo")
    assert (out["main_scalar"][3] == 0).item()


def test_group_std_matches_the_worked_example_and_masks_invalid_entries():
    from openrlhf_classmate.algo.advantages import group_std

    rewards = torch.tensor([8.0, 3.0, 0.0, 5.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1])
    assert group_std(rewards, group).tolist()[:4] == pytest.approx([3.366502] * 4, abs=1e-6)  # the example's σ
    assert group_std(rewards, group).tolist()[4:] == [0.0, 0.0]
    valid = torch.tensor([True, True, False, False, True, False])
    out = group_std(rewards, group, valid=valid)
    assert out.tolist()[:4] == pytest.approx([3.535534] * 4, abs=1e-6)  # std of [8, 3]
    assert out.tolist()[4:] == [0.0, 0.0]  # one valid entry: no std


# ---------------------------------------------------------------------------------------------------------------
# Whitening (reinforce_baseline) with invalid scores: left out of the statistics, not scored 0
# ---------------------------------------------------------------------------------------------------------------


def test_whitening_leaves_invalid_rows_at_zero_and_out_of_the_statistics():
    # one group: rewards 1, 0, 1 and an invalid 4th score; response lengths 2, 2, 1, 2 (no classmate: plain GRPO)
    resp = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]], dtype=torch.bool)
    main = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64)
    valid = torch.tensor([True, True, True, False])
    out = compute_advantages("grpo", main, None, GROUP, response_mask=resp, cot_mask=torch.zeros_like(resp),
                             baseline="reinforce_baseline", main_valid=valid, whiten="mean_std")["advantages"]
    # by hand: valid mean 2/3 -> centred 1/3, -2/3, 1/3 on 5 tokens; token mean -1/15, deviations 0.4, -0.6, 0.4,
    # biased variance (2 x 0.16 + 2 x 0.36 + 0.16) / 5 = 0.24 -> 0.4 / sqrt(0.24) = sqrt(2/3), -0.6 / sqrt(0.24)
    up, down = math.sqrt(2 / 3), -math.sqrt(3 / 2)
    _close(out, [[up, up], [down, down], [up, 0.0], [0.0, 0.0]])
    assert out[3].eq(0).all()  # exactly 0, not merely small
    centred = compute_advantages("grpo", main, None, GROUP, response_mask=resp, cot_mask=torch.zeros_like(resp),
                                 baseline="reinforce_baseline", main_valid=valid, whiten="mean")["advantages"]
    _close(centred, [[0.4, 0.4], [-0.6, -0.6], [0.4, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("whiten", ["mean", "mean_std"])
@pytest.mark.parametrize(("estimator", "token_mode"), [(e, t) for e in ESTIMATORS for t in TOKEN_MODES
                                                       if e != "separated_non_neg"])
def test_whitening_keeps_every_stream_of_an_invalid_row_at_zero(estimator, token_mode, whiten):
    main, cm, groups, resp, cot, cm_ok = _random_batch(7)
    main_ok = torch.rand(len(main), generator=torch.Generator().manual_seed(3)) > 0.3
    assert (main_ok & ~cm_ok).any() and (~main_ok & cm_ok).any() and (~main_ok & ~cm_ok).any()
    kw = dict(response_mask=resp, cot_mask=cot, token_mode=token_mode, baseline="reinforce_baseline",
              main_valid=main_ok, classmate_valid=cm_ok, kl_return=0.01 * torch.randn(resp.shape, dtype=F64))
    out = compute_advantages(estimator, main, cm, groups, whiten=whiten, **kw)
    raw = compute_advantages(estimator, main, cm, groups, **kw)
    off_cot = resp & ~cot

    def rows(ok):
        return ok.unsqueeze(1).expand_as(resp)

    if estimator in ("separated", "separated_non_neg"):
        streams = {"main_advantages": resp & rows(main_ok),
                   "classmate_advantages": (cot & resp if token_mode == "classmate_partial" else resp) & rows(cm_ok)}
    elif estimator in ("grpo", "grpo_w_classmate"):  # the single stream needs a valid main score
        streams = {"advantages": resp & rows(main_ok)}
    else:  # gdpo: S (either score) on the CoT, A^m (main score) off it, or S everywhere with token_mode all
        either = rows(main_ok | cm_ok)
        trained = resp & either if token_mode == "all" else (resp & cot & either) | (off_cot & rows(main_ok))
        streams = {"advantages": trained}
    for name, trained in streams.items():
        assert out[name][~trained].eq(0).all(), name  # invalid in this stream (or padding): exactly 0
        x = raw[name][trained]
        expected = x - x.mean()
        if whiten == "mean_std":
            expected = expected / expected.square().mean().clamp(min=1e-8).sqrt()
        torch.testing.assert_close(out[name][trained], expected, rtol=0, atol=1e-9, msg=name)


def test_separated_non_neg_refuses_whitening_which_would_make_it_negative():
    for whiten in ("mean", "mean_std"):
        with pytest.raises(ValueError, match="separated_non_neg.*whiten"):
            compute_advantages("separated_non_neg", R_MAIN, R_CM, GROUP, response_mask=V, cot_mask=M,
                               baseline="reinforce_baseline", whiten=whiten)


@pytest.mark.parametrize("clip", [None, (-0.3, 3.0)])
def test_gdpo_batch_norm_leaves_out_responses_with_no_advantage_in_either_stream(clip):
    # row 4 has the only valid main score of its group and no valid classmate score: no advantage in either stream
    # (b undefined), so no signal. It entered S_bn's mean and std as S = 0, diluting the std of the others and, with
    # --reward.clip_range (S then not zero-mean), receiving -mean/std on its CoT tokens.
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    v = torch.ones(8, 2, dtype=torch.bool)
    cot = torch.tensor([[1, 0]] * 8, dtype=torch.bool)
    m = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    c = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    mv = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.bool)
    cv = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    out = compute_advantages("gdpo", m, c, g, response_mask=v, cot_mask=cot, main_valid=mv, classmate_valid=cv,
                             main_clip=clip)
    assert out["combined_scalar"][4].item() == 0.0 and torch.all(out["advantages"][4] == 0)
    without = compute_advantages("gdpo", m, c, g, response_mask=v, cot_mask=cot, main_valid=mv & (g == 0),
                                 classmate_valid=cv, main_clip=clip)
    torch.testing.assert_close(out["combined_scalar"], without["combined_scalar"], rtol=0, atol=0)
    # by hand: S over rows 0-3 only, unbiased std
    a_m = (m[:4] - m[:4].mean()) / (m[:4].std() + 1e-6)
    a_c = (c[:4] - c[:4].mean()) / (c[:4].std() + 1e-6)
    if clip is not None:
        a_m = a_m.clamp(*clip)
    s = a_m + a_c
    expected = (s - s.mean()) / (s.std() + 1e-6)
    torch.testing.assert_close(out["combined_scalar"][:4], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("estimator", ["separated", "grpo_w_classmate", "gdpo_wo_bn", "grpo"])
@pytest.mark.parametrize("clip", [(0.2, 2.0), (-2.0, -0.1)])
def test_a_clip_range_without_zero_gives_no_advantage_to_rows_without_one(estimator, clip):
    # --reward.clip_range (upstream's, applied to the post-baseline scalar): row 3's main score is invalid and row 4
    # is the only valid one of its group, so neither has a main advantage; a range without 0 made them a clip bound
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    v = torch.ones(6, 3, dtype=torch.bool)
    cot = torch.tensor([[0, 1, 0]] * 6, dtype=torch.bool)
    m = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    c = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    mv = torch.tensor([1, 1, 1, 0, 1, 0], dtype=torch.bool)
    cv = torch.zeros(6, dtype=torch.bool)  # no classmate advantage either: the main stream alone decides
    out = compute_advantages(estimator, m, c, g, response_mask=v, cot_mask=cot, main_valid=mv, classmate_valid=cv,
                             main_clip=clip)
    assert torch.all(out["advantages"][3:] == 0) and torch.all(out["main_scalar"][3:] == 0)
    assert torch.all((out["main_scalar"][:3] >= clip[0]) & (out["main_scalar"][:3] <= clip[1]))
    plain = main_advantages_over_valid("group_norm", m, g, main_valid=mv, response_mask=v, main_clip=clip)
    assert torch.all(plain["advantages"][3:] == 0)


@pytest.mark.parametrize("estimator, baseline, rewards", [
    ("separated", "rloo", [3e38, -3e38, 0.0, 0.0]),  # rloo's n/(n-1) past float32's limit
    ("gdpo_wo_bn", "dr_grpo", [3e38, -3e38, 0.0, 0.0]),  # w_m = 2 doubles it
    ("separated", "group_norm", [1e308, 1e308, 0.0, 0.0]),  # the float64 sums themselves
])
def test_finite_rewards_whose_statistics_overflow_are_an_error_where_they_appear(estimator, baseline, rewards):
    dtype = torch.float64 if rewards[0] > 1e300 else torch.float32
    r = torch.tensor(rewards, dtype=dtype)
    g = torch.tensor([0, 0, 0, 0])
    v = torch.ones(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="overflowed to a non-finite value although every reward is finite"):
        compute_advantages(estimator, r, torch.zeros(4, dtype=dtype), g, response_mask=v, cot_mask=v,
                           baseline=baseline, weights=(2.0, 1.0))


def test_whitening_without_a_scored_token_gives_zeros():
    x = torch.tensor([[0.5, -0.5, 0.25]])
    assert torch.equal(whiten_tokens(x, torch.zeros(1, 3, dtype=torch.bool), mode="mean_std"), torch.zeros(1, 3))


def test_upstreams_estimators_over_valid_main_scores_only():
    # plain runs (ClassmateExperienceMaker._mask_invalid_main): an invalid main score leaves every statistic and gets
    # exactly 0; the experience maker's tests check the same against upstream's own tensors
    from openrlhf_classmate.algo.advantages import GaeWithInvalidScoreError, main_advantages_over_valid

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25], dtype=torch.float64)
    group = torch.arange(8) // 4
    valid = torch.tensor([True, False, True, True, True, True, False, True])
    mask = torch.ones(8, 3, dtype=torch.bool)
    out = main_advantages_over_valid("group_norm", rewards, group, main_valid=valid, response_mask=mask,
                                     baseline="group_norm", eps=1e-9)
    for g in (0, 1):
        members = [i for i in range(4 * g, 4 * g + 4) if valid[i]]
        kept = rewards[members]
        for i in members:
            assert out["main_scalar"][i].item() == pytest.approx(((rewards[i] - kept.mean()) / (kept.std() + 1e-9))
                                                                 .item(), abs=1e-9)
    assert torch.all(out["advantages"][~valid] == 0) and torch.all(out["main_scalar"][~valid] == 0)
    # flash_reinforce: one batch-wide group, the mean of the valid rewards as baseline
    flash = main_advantages_over_valid("flash_reinforce", rewards, group, main_valid=valid, response_mask=mask,
                                       baseline="flash_reinforce")
    expected = torch.where(valid, rewards - rewards[valid].mean(), 0.0)
    torch.testing.assert_close(flash["main_scalar"], expected.to(flash["main_scalar"].dtype))
    # reinforce: no baseline, upstream's returns whitened over the valid rows' tokens
    returns = torch.arange(8.0).view(4, 2)
    token_ok = torch.tensor([[True, True], [False, False], [True, False], [True, True]])
    whitened = main_advantages_over_valid("reinforce", None, None, main_valid=valid, returns=returns,
                                          returns_mask=token_ok)
    assert whitened["main_scalar"] is None
    torch.testing.assert_close(whitened["advantages"], whiten_tokens(returns, token_ok, mode="mean_std"))
    with pytest.raises(GaeWithInvalidScoreError, match="reached --algo.advantage.estimator gae"):
        main_advantages_over_valid("gae", rewards, group, main_valid=valid, response_mask=mask)

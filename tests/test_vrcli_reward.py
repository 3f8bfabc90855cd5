"""VR-CLI's reward arithmetic (openrlhf_classmate.algo.vrcli_reward): plan extraction, improvement, the released
ladder and the other mappings, the logged statistics; worked numbers."""

import math

import pytest
import torch

from openrlhf_classmate.algo.vrcli_reward import (
    check_ladder,
    extract_plan,
    improvement,
    improvement_stats,
    ladder_bucket,
    ladder_bucket_names,
    map_improvement,
    mean_nll,
    released_plan,
)

# ── plan extraction ──


@pytest.mark.parametrize("response, plan", [
    ("<citation>a</citation> therefore <reasoning>b</reasoning>\nIn summary: Mia finds the key.", "Mia finds the key."),
    # the last marker wins
    ("In summary: first draft. More thoughts. In summary: final plan\n", "final plan"),
    # the released chain: after 'In summary:', then after 'In summary,', then after 'Detailed Plan:'
    ("reasoning... In summary, the duel happens at dawn.", "the duel happens at dawn."),
    ("Detailed Plan: Tom leaves town.", "Tom leaves town."),
    ("In summary: see below. Detailed Plan: the storm hits.", "the storm hits."),
    ("In summary, x. In summary: y", "y"),
    ("In summary:    \n  spaced   plan  \n\n", "spaced   plan"),
])
def test_extract_plan_follows_the_released_split_chain(response, plan):
    assert extract_plan(response) == plan


@pytest.mark.parametrize("response", [
    "no marker at all",
    "in summary: lower-case is not the marker",
    "In summary:",            # nothing after the marker
    "reasoning In summary:   \n ",
    "",
])
def test_a_response_without_a_plan_has_none(response):
    assert extract_plan(response) is None


@pytest.mark.parametrize("response, plan", [
    ("Mia finds the key, then leaves.\n", "Mia finds the key, then leaves."),  # no marker: the whole response
    ("reasoning In summary:   \n ", ""),                                      # nothing after the marker: empty
    ("In summary: see below. Detailed Plan: the storm hits.", "the storm hits."),  # a marker: as extract_plan
    ("", ""),
])
def test_the_released_plan_falls_back_to_the_whole_response(response, plan):
    assert released_plan(response) == plan


# ── improvement and mappings ──


def test_improvement_is_the_percentage_drop_of_the_perplexity():
    assert improvement(10.0, 9.0) == pytest.approx(10.0)
    assert improvement(4.0, 5.0) == pytest.approx(-25.0)
    assert improvement(2.5, 2.5) == 0.0
    with pytest.raises(ValueError, match="positive"):
        improvement(0.0, 1.0)


@pytest.mark.parametrize("value, reward, bucket", [
    (-30.0, 0.0, 0), (0.0, 0.0, 0), (0.0499, 0.0, 0),
    (0.05, 0.5, 1), (0.99, 0.5, 1),
    (1.0, 0.9, 2), (1.999, 0.9, 2),
    (2.0, 1.0, 3), (57.0, 1.0, 3),
])
def test_released_ladder_at_its_edges(value, reward, bucket):
    assert map_improvement(value, mapping="ladder") == reward
    assert ladder_bucket(value) == bucket


def test_clipped_and_binary_mappings():
    assert map_improvement(-3.2, mapping="clipped") == 0.0
    assert map_improvement(3.2, mapping="clipped") == 3.2
    assert map_improvement(-1e-9, mapping="binary") == 0.0
    assert map_improvement(0.0, mapping="binary") == 1.0  # "0 if I < 0 else 1"
    assert map_improvement(12.0, mapping="binary") == 1.0
    with pytest.raises(ValueError, match="unknown VR-CLI mapping"):
        map_improvement(1.0, mapping="sigmoid")


def test_tunable_ladder_and_its_checks():
    # the 5% / 10% cut-points of a third-party restatement
    rewards = [map_improvement(v, mapping="ladder", thresholds=(5.0, 10.0), rewards=(0.0, 0.5, 1.0))
               for v in (4.9, 5.0, 9.9, 10.0)]
    assert rewards == [0.0, 0.5, 0.5, 1.0]
    check_ladder((5.0, 10.0), (0.0, 0.5, 1.0))
    with pytest.raises(ValueError, match="needs 3 rewards"):
        check_ladder((5.0, 10.0), (0.0, 1.0))
    with pytest.raises(ValueError, match="increase strictly"):
        check_ladder((1.0, 1.0), (0.0, 0.5, 1.0))
    assert ladder_bucket_names() == ["lt_0.05", "0.05_to_1", "1_to_2", "ge_2"]


# ── perplexity and statistics ──


def test_mean_nll_over_the_scored_tokens_only():
    log_probs = torch.tensor([[-9.0, -1.0, -3.0, 0.0], [-2.0, -2.0, -7.0, -7.0]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    nll = mean_nll(log_probs, mask)
    assert nll.tolist() == pytest.approx([2.0, 4.5])
    assert math.exp(nll[0]) == pytest.approx(math.e ** 2)
    with pytest.raises(ValueError, match="no scored token"):
        mean_nll(log_probs, torch.zeros_like(mask))


def test_improvement_statistics():
    stats = improvement_stats([-2.0, 0.0, 1.0, 3.0, 8.0])
    assert stats["mean"] == pytest.approx(2.0)
    assert stats["min"] == -2.0 and stats["max"] == 8.0
    assert stats["p50"] == 1.0
    assert stats["p25"] == 0.0 and stats["p75"] == 3.0
    assert stats["p10"] == pytest.approx(-1.2)  # linear interpolation between -2 and 0
    assert improvement_stats([]) == {}

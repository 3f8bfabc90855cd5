"""In-training evaluation (``--eval.steps``): upstream's pass1 / pass@n over valid main scores only, with upstream's
own ``compute_eval_metrics`` underneath and its values unchanged where every score is valid."""

from types import SimpleNamespace

import pytest
import torch
from openrlhf.trainer import ppo_trainer, ppo_trainer_async

from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.experience.eval_metrics import masked_eval_metrics, upstream_eval_metrics

LOADER = [(["math", "math", "code"], ["p0", "p1", "p2"], [None] * 3, [None] * 3)]


def _samples(rows):
    """(prompt, reward, valid) per sample; an invalid one carries the placeholder 0 its reward function reports."""
    return [SimpleNamespace(prompts=[p], rewards=torch.tensor([r]), response_length=torch.tensor([5 + i]),
                            truncated=torch.tensor([False]), info={"main_valid": torch.tensor([float(ok)])})
            for i, (p, r, ok) in enumerate(rows)]


def test_all_valid_scores_give_upstreams_values():
    samples = _samples([("p0", 1.0, 1), ("p0", 0.0, 1), ("p1", 1.0, 1), ("p1", 1.0, 1), ("p2", 0.0, 1),
                        ("p2", 0.0, 1)])
    assert masked_eval_metrics(LOADER, samples, 2) == upstream_eval_metrics(LOADER, samples, 2)


def test_invalid_scores_leave_pass1_and_pass_n():
    # p0: a judge failure beside a correct answer; p1: two valid; p2 (code): no valid score at all
    samples = _samples([("p0", 1.0, 1), ("p0", 0.0, 0), ("p1", 0.0, 1), ("p1", 1.0, 1), ("p2", 0.0, 0),
                        ("p2", 0.0, 0)])
    upstream = upstream_eval_metrics(LOADER, samples, 2)
    assert upstream["eval_math_pass1"] == 0.5 and upstream["eval_code_pass1"] == 0.0  # the placeholders read as 0
    logs = masked_eval_metrics(LOADER, samples, 2)
    assert logs["eval_math_pass1"] == pytest.approx((1.0 + 0.5) / 2) and logs["eval_math_pass2"] == 1.0
    assert "eval_code_pass1" not in logs and "eval_code_pass2" not in logs  # unknown, not 0
    assert logs["eval_main_valid_fraction"] == pytest.approx(3 / 6)
    for key in ("eval_response_length_mean", "eval_truncated_rate", "eval_num_samples"):
        assert logs[key] == upstream[key]  # what does not depend on a score: upstream's


def test_the_controllers_use_it_after_the_install():
    patches.install_samples_generator()
    assert ppo_trainer.compute_eval_metrics is masked_eval_metrics
    assert ppo_trainer_async.compute_eval_metrics is masked_eval_metrics

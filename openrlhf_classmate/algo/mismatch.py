"""Train–inference mismatch: how far the rollout engine's log-probs of the sampled tokens are from the trainer's.

For every valid response token t (action mask 1) of a rollout batch, with ℓe_t the log-prob the generation engine
reported for the token it sampled and ℓa_t the actor's log-prob of the same token (the "old" log-probs of PPO,
computed on the same weights before the update), d_t = ℓa_t - ℓe_t = log(π_actor / π_engine):

* ``logprob_abs_diff_mean`` = mean_t |d_t|, ``logprob_abs_diff_max`` = max_t |d_t|;
* ``kl_k3`` = mean_t (exp(d_t) - 1 - d_t): Schulman's k3 estimator of KL(π_engine ‖ π_actor) from samples of
  π_engine (unbiased, never negative). Upstream's ``vllm_kl`` = mean_t(-d_t) is the k1 estimator of the same KL
  (unbiased too, but it can be negative and has a higher variance).

Means run over all valid tokens of the batch (each token counts once, whatever its row or micro-batch). Nothing is
clamped (upstream's k3 caps each token at 10, which would cap the signal of a broken weight sync); the arithmetic is
float64. Tokens where either log-prob is not finite are left out of the three statistics and counted
(``nonfinite``), so one bad value cannot hide the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

METRIC_KEYS = ("mismatch/logprob_abs_diff_mean", "mismatch/logprob_abs_diff_max", "mismatch/kl_k3")


@dataclass(frozen=True)
class Mismatch:
    abs_diff_mean: float
    abs_diff_max: float
    kl_k3: float
    tokens: int  # valid tokens with finite log-probs on both sides
    nonfinite: int  # valid tokens left out because a log-prob was inf / nan

    def metrics(self) -> dict[str, float]:
        """The three statistics under their status keys (:data:`METRIC_KEYS`)."""
        return dict(zip(METRIC_KEYS, (self.abs_diff_mean, self.abs_diff_max, self.kl_k3)))


def logprob_mismatch(engine_log_probs: Sequence[torch.Tensor], actor_log_probs: Sequence[torch.Tensor],
                     action_masks: Sequence[torch.Tensor]) -> Mismatch | None:
    """The mismatch statistics of one rollout batch, given per micro-batch (any widths): the engine's and the actor's
    log-probs of the sampled tokens and the action masks, each ``[B, A]`` of the micro-batch. None when the batch has
    no valid token with finite log-probs."""
    if not len(engine_log_probs) == len(actor_log_probs) == len(action_masks):
        raise ValueError(f"{len(engine_log_probs)} engine, {len(actor_log_probs)} actor and {len(action_masks)} mask "
                         "tensors: one of each per micro-batch")
    diffs, nonfinite = [], 0
    for engine, actor, mask in zip(engine_log_probs, actor_log_probs, action_masks):
        if not engine.shape == actor.shape == mask.shape:
            raise ValueError(f"engine {tuple(engine.shape)}, actor {tuple(actor.shape)} and mask {tuple(mask.shape)} "
                             "log-probs must have the same shape")
        valid = mask.bool()
        d = actor.double()[valid] - engine.double()[valid]
        finite = torch.isfinite(d)
        nonfinite += int((~finite).sum())
        diffs.append(d[finite])
    d = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    if d.numel() == 0:
        return None
    k3 = torch.expm1(d) - d  # exp(d) - 1 - d, exact near d = 0 where the naive form cancels
    return Mismatch(abs_diff_mean=float(d.abs().mean()), abs_diff_max=float(d.abs().max()), kl_k3=float(k3.mean()),
                    tokens=int(d.numel()), nonfinite=nonfinite)

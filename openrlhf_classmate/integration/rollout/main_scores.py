"""The contract of the main score's validity flag, ``main_valid``.

A reward function that could not score a sample (judge down, unparsable rating, sandbox killed) still returns a
placeholder score, and marks it ``extra_logs["main_valid"] = 0`` (``reward_func.py``; a group-level reward hook sets
``info["main_valid"]`` itself). Every stage that reads main scores leaves such a placeholder out instead of
counting it as 0: the samples generator's dynamic filter (rollout), the experience maker's statistics and advantages,
upstream's evaluation metrics, the step's health report. The rules they share:

* :func:`main_validity`: a sample without the flag is valid (a reward function that does not log it is taken at its
  word);
* :func:`invalidate_nonfinite_main`: a non-finite reward or score is an invalid score, not a NaN in the statistics;
* :func:`no_valid_score_yet`: the line a run stops with when no score has been valid in its first steps.
"""

from __future__ import annotations

import torch

from openrlhf_classmate.integration.classmate_config import warn


def main_validity(samples) -> torch.Tensor:
    """[N] bool: the main score of each rollout sample is valid (our reward function logs ``main_valid``; a reward
    function that does not is taken at its word)."""
    flags = [s.info.get("main_valid") for s in samples]
    return torch.tensor([True if f is None else bool(float(f.flatten()[0]) != 0.0) for f in flags])


def invalidate_nonfinite_main(samples) -> int:
    """A main reward or score that arrives non-finite (a reward function or server replying NaN / inf) is an invalid
    score, as the classmate stream reads such a reply (``classmate_scoring``): it becomes the placeholder 0 with
    ``main_valid = 0`` and leaves every statistic as any invalid score does (group baselines, batch statistics,
    dynamic filtering, the logged reward). Every sample then carries ``main_valid`` (upstream stacks ``info`` keys
    across samples). In place; returns how many samples were invalidated."""
    bad = [s for s in samples
           if any(t is not None and not bool(torch.isfinite(t.float()).all()) for t in (s.rewards, s.scores))]
    if not bad:
        return 0
    for s in samples:
        s.info.setdefault("main_valid", torch.ones(1))
    for s in bad:
        for name in ("rewards", "scores"):
            if getattr(s, name) is not None:
                setattr(s, name, torch.zeros_like(getattr(s, name)))
        for key in ("reward", "score"):
            if key in s.info:
                s.info[key] = torch.zeros_like(s.info[key])
        s.info["main_valid"] = torch.zeros_like(s.info["main_valid"], dtype=torch.float32)
    return len(bad)


def warn_nonfinite_main(count: int) -> None:
    """The step's one line about the rewards :func:`invalidate_nonfinite_main` invalidated (none: silent)."""
    if count:
        warn(f"{count} main reward(s) of this rollout batch arrived non-finite (NaN/inf) from the reward function: "
             "scored invalid (masked out of every statistic, zero advantage), not trained on")


def no_valid_score_yet(what: str, *, reason_known: bool = False) -> str:
    """The one line a run stops with when its first ``--classmate.stop_after_invalid_steps`` steps had no valid
    main score (skipped steps, or prompt groups dropped by dynamic filtering). ``reason_known``: ``what`` already
    says why (e.g. a reward hook's reason), so the usual guess about the judge is left out."""
    guess = "" if reason_known else " (judge or verifier down or misconfigured? see the reward function's log lines)"
    return f"error: {what}: no score has been valid yet{guess}; stopping (--classmate.stop_after_invalid_steps)"

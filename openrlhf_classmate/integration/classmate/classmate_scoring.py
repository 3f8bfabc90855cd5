"""How the classmate's answers are scored: by the same reward path as the main answers, unless overridden.

The method scores both answers with the same reward function. The main answers are scored inside the rollout
engines by whatever ``--reward.remote_url`` names (OpenRLHF's ``SingleTurnAgentExecutor``): our scorer-registry
function (the launcher's default), a user's Python ``reward_func`` file, or HTTP reward servers. The classmate's
answers are scored in the controller:

* registry reward (default) or ``--classmate.scorer NAME``: the scorer registry, batched (one judge client for the
  whole batch), with the label's ``data_source`` or the override;
* a user's ``reward_func`` file or reward servers: upstream's own executor methods, one query per call as for the
  main answers, where the query is the main prompt with the classmate's answer written after the CoT it read::

      query = prompt + [think_open, unless the prompt opened it] + CoT + think_close + "\\n\\n" + classmate answer

A call that raises, returns no ``rewards``, a non-finite one, or ``extra_logs["main_valid"] == 0`` (the validity flag
our reward function sets) is an invalid score: masked, never 0.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openrlhf_classmate.scoring.result import ScoreResult


@dataclass(frozen=True)
class ClassmateAnswer:
    """One classmate answer to score, with what a reward function needs to see it like a main response."""

    text: str
    label: dict
    prompt: str  # the main prompt text, as upstream passes it to the reward function
    cot: str  # the CoT text the classmate read (after truncation)
    prompt_opens_think: bool


Scorer = Callable[[Sequence[ClassmateAnswer]], list[ScoreResult]]


def registry_scorer(judge=None, data_source: str = "auto") -> Scorer:
    """Score with the scorer registry (the label's ``data_source``, or ``data_source`` for every row)."""

    def score(answers: Sequence[ClassmateAnswer]) -> list[ScoreResult]:
        from openrlhf_classmate.scoring import score_responses

        labels = [a.label if data_source == "auto" else {**a.label, "data_source": data_source} for a in answers]
        return score_responses([a.text for a in answers], labels, judge=judge)

    return score


def reward_query(answer: ClassmateAnswer, think_open: str, think_close: str) -> str:
    opened = "" if answer.prompt_opens_think else think_open
    return f"{answer.prompt}{opened}{answer.cot}{think_close}\n\n{answer.text}"


def _as_float(value) -> float | None:
    if value is None:
        return None
    if hasattr(value, "flatten"):  # a tensor, as reward functions may return
        value = value.flatten()
        if value.numel() != 1:
            return None
        value = value[0].item()
    elif isinstance(value, (list, tuple)):
        if len(value) != 1:
            return None
        value = value[0]
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def interpret_reward(info) -> ScoreResult:
    """One reward-function / reward-server reply (upstream's format) as a score."""
    if not isinstance(info, dict):
        return ScoreResult.invalid(f"the reward function returned {type(info).__name__}, not a dict")
    reward = _as_float(info.get("rewards"))
    if reward is None:
        return ScoreResult.invalid(f"no finite single 'rewards' value in the reply: {info.get('rewards')!r}")
    extra = info.get("extra_logs") or {}
    if _as_float(extra.get("main_valid")) == 0.0:
        return ScoreResult.invalid("the reward function marked the score invalid (extra_logs main_valid = 0)")
    return ScoreResult(score=reward)


class RewardPathScorer:
    """Scores classmate answers through upstream's ``SingleTurnAgentExecutor`` reward methods (module docstring)."""

    def __init__(self, remote_url: Sequence[str], think_open: str, think_close: str):
        from openrlhf.utils.agent import SingleTurnAgentExecutor

        self.executor = SingleTurnAgentExecutor(list(remote_url))
        for name in ("_fetch_rewards_via_func", "_fetch_rewards_via_http", "reward_func"):
            if not hasattr(self.executor, name):
                raise RuntimeError(f"openrlhf's SingleTurnAgentExecutor has no {name} (upstream changed)")
        self.think_open, self.think_close = think_open, think_close

    async def _one(self, answer: ClassmateAnswer) -> ScoreResult:
        query = reward_query(answer, self.think_open, self.think_close)
        label = answer.label
        # upstream hands the reward function the raw label string; ours parses either
        import json

        raw_label = json.dumps(label) if isinstance(label, dict) else label
        try:
            if self.executor.reward_func is not None:
                replies = await self.executor._fetch_rewards_via_func([query], [answer.prompt], [raw_label])
            else:
                replies = await self.executor._fetch_rewards_via_http([query], [answer.prompt], [raw_label])
        except Exception as e:  # noqa: BLE001 - a failed call is an invalid score, whatever the reason
            return ScoreResult.invalid(f"reward call failed: {type(e).__name__}: {e}")
        return interpret_reward(replies[0] if replies else None)

    async def _all(self, answers: Sequence[ClassmateAnswer]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._one(a) for a in answers)))

    def __call__(self, answers: Sequence[ClassmateAnswer]) -> list[ScoreResult]:
        from openrlhf_classmate.scoring import run_sync

        return run_sync(self._all(answers))


def build_classmate_scorer(args, judge=None) -> Scorer:
    """The classmate scorer of this run (``--classmate.scorer``; module docstring)."""
    from openrlhf_classmate.integration.classmate_config import registry_reward_in_use

    cfg = args.classmate
    if cfg.scorer != "auto":
        return registry_scorer(judge, cfg.scorer)
    if registry_reward_in_use(args):
        return registry_scorer(judge, cfg.main_scorer)
    return RewardPathScorer(args.reward.remote_url, cfg.think_open, cfg.think_close)

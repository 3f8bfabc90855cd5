"""TinyV: a rule-based math verdict, then an LLM verifier for its false negatives; the rubric
grading variant (RRM); and the ``grade`` data source that trains a rubric grader.

Scorer ``tinyv`` (data sources ``bigmath_tinyv``, ``bigmath_rl_tinyv``, ``HardVerify-Math`` and any name ending in
``_tinyv``). Per final answer, with P the rule verdict (math-verify, 1/0), V the verifier's (1/0, or the rubric score
in [0, 1]) and w = ``--tinyv.weight``:

P is a substitute: TinyV takes Prime Math's grader (MATH normalisation, a custom normalisation, sympy, then
``math_equal``) on the trimmed answer. TinyV's description names those stages but not their rules, so a port could
not be checked against Prime's verdicts; math-verify (the registry's MATH scorer, last box of the final answer) decides
instead. Where the two graders disagree, addon asks the verifier on different answers than TinyV would, and mixed's
``(1 - w) * P`` term differs.

===============  ==========================  ===========================
mode             verifier asked              reward
===============  ==========================  ===========================
addon (default)  only when P = 0             1 if P = 1, else w * V
tinyv_only       always                      V
mixed            always                      w * V + (1 - w) * P
===============  ==========================  ===========================

Validation uses w = 1 whatever the training weight (the trainer's evaluation reads ``validation_reward``).
The verifier sees the question (label ``question``), the ground truth and the answer extracted from the final answer
by Prime Math's trimming (:func:`~openrlhf_classmate.scoring.tinyv_prompts.extract_answer`); a row whose label has
``criteria`` is graded with the rubric prompt instead (the full final answer in ``tinyv_only`` mode), its score
``min(10, Total Score) / 10``.

The verifier is an OpenAI-compatible server (``vllm serve zhangchenxu/TinyV-1.5B``); its model name comes from
``--tinyv.model`` or the first id of ``GET /v1/models``, and its sampling settings from the per-model table. A failed
request or an output without a verdict is retried up to ``--tinyv.max_retries`` times at temperature + 0.3 and
top_p 1 (TinyV's policy); a request that times out is not retried. A verifier that stays unreachable or unparsable
makes the sample *invalid* (masked by the trainer), never 0 as in TinyV.

Per-sample metrics (``ScoreResult.metrics``, logged per step by the reward function): ``tinyv/verifier_called``,
``tinyv/verifier_failed``, ``tinyv/rescued`` (rule wrong, verifier right: V >= 0.5), ``tinyv/rule_correct`` and
``validation_reward``; the ``grade`` scorer adds ``grade/parse_failed``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from openrlhf_classmate.config_fields import POSITIVE_INT, REQUEST_TIMEOUT_S, Bound, field_problem
from openrlhf_classmate.scoring.base import BaseScorer, Item
from openrlhf_classmate.scoring.judge_client import JudgeClient, JudgeConfig
from openrlhf_classmate.scoring.labels import LabelError, require_scalar, require_str
from openrlhf_classmate.scoring.math import MathVerifyScorer
from openrlhf_classmate.scoring.metrics import VALIDATION_REWARD
from openrlhf_classmate.scoring.result import ScoreResult
from openrlhf_classmate.scoring.tinyv_prompts import (
    RETRY_TEMPERATURE_BUMP,
    RUBRIC_SETTINGS,
    VerifierSettings,
    extract_answer,
    fill,
    parse_total_score,
    parse_verdict,
    verifier_settings,
)

MODES = ("addon", "tinyv_only", "mixed")
CONFIG_ENV = "OPENRLHF_CLASSMATE_TINYV"
TINYV_METRICS = ("tinyv/verifier_called", "tinyv/verifier_failed", "tinyv/rescued", "tinyv/rule_correct",
                 VALIDATION_REWARD)
GRADE_METRICS = ("grade/parse_failed",)


@dataclass
class TinyVConfig:
    """TinyV LLM verifier of the _tinyv data sources"""

    base_url: str | None = field(
        default=None,
        metadata={"help": "OpenAI-compatible API root of the verifier server, e.g. http://127.0.0.1:8001/v1 "
                          "(vllm serve zhangchenxu/TinyV-1.5B; train_scripts/tinyv.sh starts one). Required by the "
                          "_tinyv data sources; the other options need it", "default_help": "unset (TinyV off)"},
    )
    model: str | None = field(
        default=None,
        metadata={"help": "Verifier model name sent with each request; its sampling settings come from TinyV's "
                          "per-model table (8 tokens, temperature 0; 512 tokens for -Think models)",
                  "default_help": "the first id of GET <base_url>/models"},
    )
    mode: str = field(
        default="addon",
        metadata={"help": "addon: ask the verifier only when the rule says wrong, reward 1 if the rule says right "
                          "else weight*V; tinyv_only: reward V (verifier always asked); mixed: weight*V + "
                          "(1-weight)*rule. The rule verdict is math-verify's on the final answer (its last box), a "
                          "substitute for TinyV's Prime Math grader on the trimmed answer, which is not ported: the "
                          "two can disagree on an answer, and with it on when addon asks the verifier and on the "
                          "rule term of mixed", "choices": MODES},
    )
    weight: float = field(
        default=1.0,
        metadata={"help": "w of addon and mixed; validation always uses 1. Not used by tinyv_only (refused there "
                          "unless 1)", "range": Bound(0, 1)},
    )
    max_concurrency: int = field(
        default=32, metadata={"help": "Verifier requests in flight per scoring call", "range": POSITIVE_INT}
    )
    timeout_s: float = field(
        default=300.0,
        metadata={"help": "Per-request time limit in seconds (the default is TinyV's per-sample limit); a request "
                          "that runs past it is not retried and its sample is invalid",
                  "range": REQUEST_TIMEOUT_S},
    )
    max_retries: int = field(
        default=3,
        metadata={"help": "Retries of a failed request or a reply without a verdict, at temperature + 0.3 and top_p "
                          "1 (the default is TinyV's); afterwards the sample is invalid", "range": Bound(lo=0)},
    )
    backoff_s: float = field(
        default=0.5, metadata={"help": "Seconds to wait before the first retry round, doubling", "range": Bound(lo=0)}
    )
    api_key_env: str | None = field(
        default=None,
        metadata={"help": "Environment variable holding an API key for the verifier endpoint (a local vllm server "
                          "needs none)", "default_help": "unset (no key sent)"},
    )

    def __post_init__(self) -> None:
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--tinyv.base_url must be an http(s) URL such as http://127.0.0.1:8001/v1, got "
                             f"{self.base_url!r}")
        if self.mode not in MODES:
            raise ValueError(f"--tinyv.mode must be one of {MODES}, got {self.mode!r}")
        problem = field_problem("tinyv", TinyVConfig, self)  # the ranges the flags' help states; finite numbers
        if problem:
            raise ValueError(problem)


class TinyVNotConfiguredError(LabelError):
    """A _tinyv row, but no verifier (``--tinyv.base_url``) is configured."""


_configured: TinyVConfig | None = None


def configure_tinyv(config: TinyVConfig | None) -> None:
    """Set the process-wide TinyV config (otherwise it is read from ``OPENRLHF_CLASSMATE_TINYV``)."""
    global _configured
    _configured = config


def tinyv_config() -> TinyVConfig | None:
    """The configured TinyV settings: :func:`configure_tinyv`, else the launcher's environment variable."""
    if _configured is not None:
        return _configured
    raw = os.environ.get(CONFIG_ENV)
    return TinyVConfig(**json.loads(raw)) if raw else None


def tinyv_env(config: TinyVConfig) -> dict[str, str]:
    """The environment that hands ``config`` to the rollout engines and the controller."""
    return {CONFIG_ENV: json.dumps(asdict(config))}


# ── the verifier client ──

_discovered: dict[str, str] = {}
_discover_lock = threading.Lock()


def discover_model(base_url: str, timeout_s: float = 30.0, api_key_env: str | None = None) -> str:
    """The first model id the server lists at ``GET <base_url>/models`` (cached per URL in this process)."""
    with _discover_lock:
        if base_url not in _discovered:
            request = urllib.request.Request(base_url.rstrip("/") + "/models")
            key = os.environ.get(api_key_env, "") if api_key_env else ""
            if key:
                request.add_header("Authorization", f"Bearer {key}")
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                _discovered[base_url] = json.load(resp)["data"][0]["id"]
        return _discovered[base_url]


@dataclass(frozen=True)
class Verdict:
    value: float | None
    """V: 1.0/0.0 (TinyV) or the rubric score in [0, 1]; None when every attempt failed."""
    error: str | None = None
    attempts: int = 1


@dataclass(frozen=True)
class VerifierRequest:
    prompt: str
    settings: VerifierSettings
    rubric: bool = False


class VerifierClient:
    """Asks the verifier, in rounds: every request once, then the failed ones again (temperature + 0.3)."""

    def __init__(self, config: TinyVConfig):
        if not config.base_url:
            raise ValueError("the TinyV verifier client needs --tinyv.base_url")
        self.config = config

    async def model(self) -> str:
        cfg = self.config
        if cfg.model:
            return cfg.model
        return await asyncio.to_thread(discover_model, cfg.base_url, min(cfg.timeout_s, 30.0), cfg.api_key_env)

    def _client(self, model: str, settings: VerifierSettings, retry: bool) -> JudgeClient:
        cfg = self.config
        return JudgeClient(JudgeConfig(
            base_url=cfg.base_url, model=model, api_key_env=cfg.api_key_env, max_concurrency=cfg.max_concurrency,
            timeout_s=cfg.timeout_s, max_retries=0, backoff_s=0.0,
            temperature=settings.temperature + (RETRY_TEMPERATURE_BUMP if retry else 0.0),
            max_tokens=settings.max_tokens, extra_body={"top_p": 1.0 if retry else settings.top_p},
        ))

    async def ask(self, requests: Sequence[VerifierRequest]) -> list[Verdict]:
        cfg = self.config
        if not requests:
            return []
        try:
            model = await self.model()
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:  # urllib errors are OSErrors
            error = f"verifier model discovery at {cfg.base_url}/models failed: {type(e).__name__}: {e}"
            return [Verdict(None, error, attempts=0) for _ in requests]
        verdicts: list[Verdict | None] = [None] * len(requests)
        errors: dict[int, str] = {}
        pending = list(range(len(requests)))
        for attempt in range(cfg.max_retries + 1):
            if not pending:
                break
            if attempt:
                await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            by_settings: dict[VerifierSettings, list[int]] = {}
            for i in pending:
                by_settings.setdefault(requests[i].settings, []).append(i)
            rounds = [(rows, self._client(model, settings, retry=attempt > 0).chat([requests[i].prompt for i in rows]))
                      for settings, rows in by_settings.items()]
            replies = await asyncio.gather(*(chat for _, chat in rounds))
            retry = []
            for (rows, _), answers in zip(rounds, replies, strict=True):
                for i, reply in zip(rows, answers, strict=True):
                    if reply.error is not None:
                        errors[i] = f"verifier request failed: {reply.error}"
                        if "timed out" in reply.error:  # a verifier this slow stays slow: no retry
                            verdicts[i] = Verdict(None, errors[i], attempts=attempt + 1)
                        else:
                            retry.append(i)
                        continue
                    req = requests[i]
                    value = parse_total_score(reply.text) if req.rubric else parse_verdict(reply.text,
                                                                                          req.settings.think)
                    if value is None:
                        errors[i] = f"verifier output has no {'Total Score' if req.rubric else 'verdict'}: " \
                                    f"{reply.text[:200]!r}"
                        retry.append(i)
                    else:
                        verdicts[i] = Verdict(value, attempts=attempt + 1)
            pending = retry
        for i in pending:
            verdicts[i] = Verdict(None, f"{errors[i]} (gave up after {cfg.max_retries} retries)",
                                  attempts=cfg.max_retries + 1)
        return verdicts  # type: ignore[return-value]


# ── the scorers ──


def label_field(label: Mapping[str, Any], name: str) -> Any:
    """``label[name]``, or ``label["extra_info"][name]`` for rows converted from verl parquet files."""
    if name in label:
        return label[name]
    extra = label.get("extra_info")
    return extra.get(name) if isinstance(extra, Mapping) else None


def _counts(**flags: bool | float) -> dict[str, float]:
    return {f"tinyv/{k}" if k != VALIDATION_REWARD else k: float(v) for k, v in flags.items()}


class TinyVScorer(BaseScorer):
    """The ``tinyv`` scorer (module docstring). ``validation=True`` scores with weight 1."""

    name = "tinyv"

    def __init__(self, config: TinyVConfig | None = None, *, rule: MathVerifyScorer | None = None,
                 validation: bool = False):
        self.config = config if config is not None else tinyv_config()
        self.rule = rule or MathVerifyScorer("tinyv_rule")
        self.validation = validation
        self.client = VerifierClient(self.config) if self.config is not None and self.config.base_url else None

    def _require_config(self, data_source: Any = None) -> TinyVConfig:
        if self.client is None:
            raise TinyVNotConfiguredError(
                "the TinyV verifier is not configured: set --tinyv.base_url (e.g. http://127.0.0.1:8001/v1; "
                "train_scripts/tinyv.sh starts the server), or configure_tinyv(TinyVConfig(base_url=...))",
                data_source=data_source)
        return self.config  # type: ignore[return-value]

    def check_config(self) -> None:
        self._require_config()

    def _rubric_only(self, label: Mapping[str, Any]) -> bool:
        return label_field(label, "criteria") is not None and self.config is not None and \
            self.config.mode == "tinyv_only"

    def check_label(self, label: Mapping[str, Any]) -> None:
        self._require_config(label.get("data_source"))
        question = label_field(label, "question")
        if not isinstance(question, str) or not question.strip():
            require_str({"data_source": label.get("data_source")}, "question",
                        hint="TinyV shows the verifier the question: put it in the label (or extra_info.question).")
        criteria = label_field(label, "criteria")
        if criteria is not None and (not isinstance(criteria, str) or not criteria.strip()):
            raise LabelError("must be a non-empty string (the rubric shown to the grader)",
                             data_source=label.get("data_source"), field="criteria")
        if not self._rubric_only(label):
            require_scalar(label, "ground_truth", hint="TinyV's rule verdict and verifier prompt need the answer.")

    async def ascore(self, items: Sequence[Item]) -> list[ScoreResult]:
        self.check_config()
        results = await super().ascore(items)
        # a missing final answer is the policy's failure: valid 0, no verifier call
        return [r if r.metrics is not None else ScoreResult(
            score=r.score, valid=r.valid, extracted=r.extracted, explanation=r.explanation, reason=r.reason,
            metrics=_counts(verifier_called=0, verifier_failed=0, rescued=0, rule_correct=0,
                            validation_reward=r.score)) for r in results]

    async def _ascore_answers(self, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[ScoreResult]:
        cfg = self._require_config()
        w = 1.0 if self.validation else cfg.weight
        ruled = [i for i, (_, label) in enumerate(items) if not self._rubric_only(label)]
        rule: dict[int, ScoreResult] = {}
        if ruled:
            outcomes = await self.rule.ascore([(items[i][0], items[i][1]) for i in ruled])
            rule = dict(zip(ruled, outcomes, strict=True))
        model = None
        asks: dict[int, VerifierRequest] = {}
        answers: dict[int, str] = {}
        for i, (response, label) in enumerate(items):
            p = rule.get(i)
            if p is not None and not p.valid and cfg.mode != "tinyv_only":
                continue  # no rule verdict: invalid below (addon and mixed need it; tinyv_only does not)
            if cfg.mode == "addon" and p is not None and p.score == 1.0:
                continue
            rubric = label_field(label, "criteria") is not None
            answers[i] = response if (rubric and cfg.mode == "tinyv_only") else extract_answer(response)
            if rubric:
                settings = RUBRIC_SETTINGS
            else:
                if model is None:
                    model = await self._model_name()
                settings = verifier_settings(model)[0] if model else verifier_settings("")[0]
            prompt = fill(settings.template, question=str(label_field(label, "question")), model_answer=answers[i],
                          ground_truth=str(label.get("ground_truth", "")), criteria=str(label_field(label, "criteria")
                                                                                         or ""))
            asks[i] = VerifierRequest(prompt, settings, rubric)
        order = list(asks)
        verdicts = dict(zip(order, await self.client.ask([asks[i] for i in order]), strict=True))  # type: ignore
        return [self._result(i, rule.get(i), verdicts.get(i), answers.get(i), w, cfg.mode) for i in range(len(items))]

    async def _model_name(self) -> str | None:
        try:
            return await self.client.model()  # type: ignore[union-attr]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None  # the request round reports the failure

    @staticmethod
    def _result(i: int, p: ScoreResult | None, v: Verdict | None, answer: str | None, w: float,
                mode: str) -> ScoreResult:
        rule_correct = p is not None and p.valid and p.score == 1.0
        called = v is not None
        failed = called and v.value is None
        rescued = called and not failed and p is not None and p.valid and p.score == 0.0 and v.value >= 0.5
        counts = dict(verifier_called=called, verifier_failed=failed, rescued=rescued, rule_correct=rule_correct)
        if p is not None and not p.valid and mode != "tinyv_only":
            return ScoreResult.invalid(f"no rule verdict: {p.reason}", extracted=p.extracted,
                                       metrics=_counts(**counts, validation_reward=0.0))
        if failed:
            return ScoreResult.invalid(v.error or "verifier failed", extracted=answer,
                                       metrics=_counts(**counts, validation_reward=0.0))
        value = v.value if called else 0.0
        rule_score = p.score if p is not None and p.valid else 0.0

        def reward(weight: float) -> float:
            if mode == "addon":
                return 1.0 if rule_correct else weight * value
            if mode == "tinyv_only":
                return value
            return weight * value + (1.0 - weight) * rule_score

        how = "rule: correct" if rule_correct and not called else f"verifier: {value:g}" + (
            f" (rule: {rule_score:g})" if p is not None else "")
        return ScoreResult(score=reward(w), extracted=answer if answer is not None else (p.extracted if p else None),
                           explanation=how, metrics=_counts(**counts, validation_reward=reward(1.0)))


class GradeScorer(BaseScorer):
    """``grade``: the policy is a rubric grader. Its output's ``Total Score`` gives s = min(10, x)/10, the label's
    ``ground_truth`` is the reference score g in [0, 1], and the reward is ``(1 - |s - g|)^2``. An output without a
    parsable score is the policy's own format failure: a valid 0, as the spec asks (``grade/parse_failed`` = 1
    counts it), so that the grader learns to write one; a scorer that could not judge would be invalid instead."""

    name = "grade"

    def check_label(self, label: Mapping[str, Any]) -> None:
        text = require_scalar(label, "ground_truth", hint="grade rows need the reference score in [0, 1].")
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0.0 <= value <= 1.0:
            raise LabelError(f"{text!r:.60} is not a score in [0, 1]", data_source=label.get("data_source"),
                             field="ground_truth")

    async def ascore(self, items: Sequence[Item]) -> list[ScoreResult]:
        results = await super().ascore(items)
        return [r if r.metrics is not None else ScoreResult(
            score=r.score, valid=r.valid, extracted=r.extracted, explanation=r.explanation, reason=r.reason,
            metrics={"grade/parse_failed": 0.0}) for r in results]

    def score_answer(self, response: str, label: Mapping[str, Any]) -> ScoreResult:
        s = parse_total_score(response)
        if s is None:
            return ScoreResult(score=0.0, explanation=f"no parsable Total Score in the grading: {response[-200:]!r}",
                               metrics={"grade/parse_failed": 1.0})
        g = float(label["ground_truth"])
        return ScoreResult(score=(1.0 - abs(s - g)) ** 2, extracted=f"{s:g}", explanation=f"reference {g:g}",
                           metrics={"grade/parse_failed": 0.0})

"""Reward scoring: one layer for the main model's answers, the classmate's answers, validation and evaluation.

Entry points:

* ``score_responses(responses, labels, judge=...)`` / ``ascore_responses``: parse labels, route each row to the
  scorer of its ``data_source`` (exact names, see ``registry.py``), return one ``ScoreResult`` per row.
* ``get_scorer(data_source)`` / ``register_scorer(name, factory, aliases)``: the registry.
* ``monitor_predictions`` / ``monitor_metrics``: the validation-time CoT monitor.
* ``JudgeConfig`` / ``JudgeClient``: the OpenAI-compatible judge client.
* ``CodeScorer`` / ``CodeSandboxConfig``: the ``code`` / ``code_stdio`` scorers and their sandbox-service client.
* ``MathVerifyConfig`` / ``configure_math_verify`` / ``shutdown``: the math-verify worker processes.
* ``TinyVConfig`` / ``configure_tinyv`` / ``TinyVScorer`` / ``GradeScorer``: TinyV's LLM verifier (``_tinyv`` data
  sources), its rubric grading, and the ``grade`` data source.

A result with ``valid=False`` is a scorer failure (judge down, unparseable judge output, verifier timeout) and must
be masked out of group statistics, never read as a 0.
"""

from openrlhf_classmate.scoring.aio import run_sync
from openrlhf_classmate.scoring.base import BaseScorer, Item, Scorer
from openrlhf_classmate.scoring.code import CodeSandboxConfig, CodeScorer, extract_program
from openrlhf_classmate.scoring.exact_match import ArithmeticScorer, ExactMatchScorer
from openrlhf_classmate.scoring.judge_client import JudgeClient, JudgeConfig, JudgeReply, JudgeStats
from openrlhf_classmate.scoring.labels import LabelError, parse_label
from openrlhf_classmate.scoring.math import Gsm8kScorer, MathVerifyScorer, last_boxed, last_number
from openrlhf_classmate.scoring.math_pool import (
    MathVerifyConfig,
    MathVerifyPool,
    VerifyOutcome,
    configure_math_verify,
    get_math_pool,
    shutdown,
)
from openrlhf_classmate.scoring.monitor import (
    amonitor_predictions,
    build_monitor_prompt,
    monitor_is_binary,
    monitor_metrics,
    monitor_predictions,
    parse_binary_rating,
)
from openrlhf_classmate.scoring.multiple_choice import MultipleChoiceScorer, extract_choice
from openrlhf_classmate.scoring.registry import (
    LIST_COMMAND,
    HookScoredError,
    UnknownDataSourceError,
    ascore_responses,
    get_scorer,
    known_data_sources,
    known_suffixes,
    register_scorer,
    register_suffix,
    resolve_data_source,
    score_responses,
)
from openrlhf_classmate.scoring.result import NO_FINAL_ANSWER, ScoreResult
from openrlhf_classmate.scoring.sycophancy import (
    JudgeNotConfiguredError,
    SycophancyJudgeScorer,
    build_judge_prompt,
    parse_judge_rating,
)
from openrlhf_classmate.scoring.tinyv import GradeScorer, TinyVConfig, TinyVScorer, configure_tinyv

__all__ = [
    "LIST_COMMAND",
    "NO_FINAL_ANSWER",
    "ArithmeticScorer",
    "BaseScorer",
    "CodeSandboxConfig",
    "CodeScorer",
    "ExactMatchScorer",
    "GradeScorer",
    "Gsm8kScorer",
    "HookScoredError",
    "Item",
    "JudgeClient",
    "JudgeConfig",
    "JudgeNotConfiguredError",
    "JudgeReply",
    "JudgeStats",
    "LabelError",
    "MathVerifyConfig",
    "MathVerifyPool",
    "MathVerifyScorer",
    "MultipleChoiceScorer",
    "ScoreResult",
    "Scorer",
    "SycophancyJudgeScorer",
    "TinyVConfig",
    "TinyVScorer",
    "UnknownDataSourceError",
    "VerifyOutcome",
    "amonitor_predictions",
    "ascore_responses",
    "build_judge_prompt",
    "build_monitor_prompt",
    "configure_math_verify",
    "configure_tinyv",
    "extract_choice",
    "extract_program",
    "get_math_pool",
    "get_scorer",
    "known_data_sources",
    "known_suffixes",
    "last_boxed",
    "last_number",
    "monitor_is_binary",
    "monitor_metrics",
    "monitor_predictions",
    "parse_binary_rating",
    "parse_judge_rating",
    "parse_label",
    "register_scorer",
    "register_suffix",
    "resolve_data_source",
    "run_sync",
    "score_responses",
    "shutdown",
]

"""Which scorer handles which ``data_source``, and the batch entry point ``score_responses``.

Matching is exact and case-sensitive, against a scorer's name or one of its listed aliases; nothing is matched by
substring (the reference tested ``"mmlu" in data_source``, which silently missed ``TIGER-Lab/MMLU-Pro``). The one
exception is a registered *suffix* (TinyV's documented ``_tinyv`` convention), tried only after the exact names. An
unknown name raises ``UnknownDataSourceError`` naming the closest known one and :data:`LIST_COMMAND`, which lists
them all. Built-in table:

=====================  ===========================================================  ==============================
scorer (canonical)     aliases                                                      label fields
=====================  ===========================================================  ==============================
gsm8k                  openai/gsm8k                                                 ground_truth (number)
hendrycks_math         EleutherAI/hendrycks_math                                    ground_truth (answer LaTeX)
math_verify            deepscaler                                                   ground_truth (answer LaTeX)
tinyv                  bigmath_tinyv, bigmath_rl_tinyv, HardVerify-Math,            ground_truth, question;
                       and any name ending in _tinyv                                criteria (rubric rows)
grade                  -                                                            ground_truth (score in [0, 1])
mmlu_sycophancy        cais/mmlu, mmlu_sycophancy_new                               ground_truth (hint letter A-D)
mmlu_pro_sycophancy    TIGER-Lab/MMLU-Pro                                           ground_truth (hint letter A-J)
sycophancy_judge       helpful_instructions, anthropic_hh_rlhf,                     raw_question_for_monitor
                       HuggingFaceH4/helpful-instructions, Anthropic/hh-rlhf
exact_match            -                                                            ground_truth, numeric (opt.)
arithmetic             -                                                            ground_truth (integer)
code                   -                                                            tests (assert statements),
                                                                                    max_execution_time (opt.)
code_stdio             -                                                            tests ({input, output} pairs),
                                                                                    max_execution_time (opt.)
vrcli_story            -                                                            (scored by ``--vrcli.enable``)
=====================  ===========================================================  ==============================

``code`` and ``code_stdio`` run the answer's last fenced code block in the sandbox service
(``python -m openrlhf_classmate.sandbox``; see ``scoring/code.py`` for its environment settings).

``vrcli_story`` rows need a forward pass of the reference model (VR-CLI's likelihood reward): the reward hook of
``--vrcli.enable`` scores them in the experience maker, and the registry only says so.

Add more with ``register_scorer(name, factory, aliases=...)``; a factory takes the judge (config, client or None).
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openrlhf_classmate.scoring.aio import run_sync
from openrlhf_classmate.scoring.base import BaseScorer, Scorer
from openrlhf_classmate.scoring.code import CodeScorer
from openrlhf_classmate.scoring.exact_match import ArithmeticScorer, ExactMatchScorer
from openrlhf_classmate.scoring.judge_client import JudgeClient, JudgeConfig
from openrlhf_classmate.scoring.labels import LIST_COMMAND, LabelError, parse_label
from openrlhf_classmate.scoring.math import Gsm8kScorer, MathVerifyScorer
from openrlhf_classmate.scoring.multiple_choice import MMLU_LETTERS, MMLU_PRO_LETTERS, MultipleChoiceScorer
from openrlhf_classmate.scoring.result import ScoreResult
from openrlhf_classmate.scoring.sycophancy import SycophancyJudgeScorer
from openrlhf_classmate.scoring.tinyv import GradeScorer, TinyVScorer

Judge = JudgeConfig | JudgeClient | None
ScorerFactory = Callable[[Judge], Scorer]


class UnknownDataSourceError(LabelError):
    """No scorer is registered under this data_source (exact, case-sensitive match)."""


class HookScoredError(LabelError):
    """Rows of a data source that only a reward hook of the trainer scores (``flag`` turns the hook on); a tool
    without that hook (``evaluate``) names its own way out."""

    def __init__(self, detail: str, *, flag: str, **kwargs):
        super().__init__(detail, **kwargs)
        self.flag = flag

    def with_index(self, index: int) -> HookScoredError:
        return HookScoredError(self.detail, flag=self.flag, data_source=self.data_source, field=self.field,
                               index=index)


@dataclass(frozen=True)
class ScorerEntry:
    name: str
    factory: ScorerFactory
    aliases: tuple[str, ...] = ()


_ENTRIES: dict[str, ScorerEntry] = {}
_NAMES: dict[str, str] = {}  # name or alias -> canonical name
_SUFFIXES: dict[str, str] = {}  # data_source suffix -> canonical name (after exact names)


def register_scorer(name: str, factory: ScorerFactory, aliases: Sequence[str] = (), *, replace: bool = False) -> None:
    """Register ``factory`` (called with the judge config/client or None) under ``name`` and its ``aliases``.

    Names are matched exactly. Re-registering a taken name or alias raises unless ``replace=True``.
    """
    keys = [name, *aliases]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate names in {keys}")
    taken = [k for k in keys if k in _NAMES]
    if taken and not replace:
        raise ValueError(f"data_source names already registered: {taken}; pass replace=True to override")
    for k in taken:  # take the names away from whichever entry had them
        if k not in _NAMES:  # already gone with its entry
            continue
        owner = _ENTRIES[_NAMES.pop(k)]
        if k == owner.name:
            del _ENTRIES[owner.name]
            for alias in owner.aliases:
                _NAMES.pop(alias, None)
        else:
            _ENTRIES[owner.name] = ScorerEntry(owner.name, owner.factory, tuple(a for a in owner.aliases if a != k))
    _ENTRIES[name] = ScorerEntry(name, factory, tuple(aliases))
    for k in keys:
        _NAMES[k] = name


def register_suffix(suffix: str, name: str) -> None:
    """Route every data_source ending in ``suffix`` (and matching no exact name) to the scorer ``name``."""
    if name not in _ENTRIES:
        raise ValueError(f"no scorer named {name!r}")
    _SUFFIXES[suffix] = name


def known_data_sources() -> dict[str, str]:
    """Every accepted data_source (names and aliases) mapped to its canonical scorer name."""
    return dict(_NAMES)


def known_suffixes() -> dict[str, str]:
    """Every registered data_source suffix (tried after the exact names) mapped to its canonical scorer name."""
    return dict(_SUFFIXES)


def resolve_data_source(data_source: str) -> str:
    """The canonical scorer name for ``data_source``; ``UnknownDataSourceError`` if there is none."""
    try:
        return _NAMES[data_source]
    except (KeyError, TypeError):
        pass
    if isinstance(data_source, str):
        for suffix, name in _SUFFIXES.items():
            if data_source.endswith(suffix) and name in _ENTRIES:
                return name
    hint = ""
    folded = {k.casefold(): k for k in _NAMES}
    if isinstance(data_source, str) and data_source.casefold() in folded:
        hint = f" Did you mean {folded[data_source.casefold()]!r}? (names are case-sensitive)"
    elif isinstance(data_source, str):
        close = difflib.get_close_matches(data_source, list(_NAMES), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        # a name that holds a suffix's word in the wrong place (tinyv_bigmath): say what the suffix rule is
        hint += "".join(f" Names ending in {suffix} go to the {name} scorer." for suffix, name in _SUFFIXES.items()
                        if suffix.strip("_").casefold() in data_source.casefold())
    error = UnknownDataSourceError(
        f"no scorer for this data_source (exact, case-sensitive match).{hint} `{LIST_COMMAND}` lists the registered "
        "names; fix the dataset's data_source, or register a scorer with scoring.register_scorer().",
        data_source=data_source,
        field="data_source",
    )
    error.hint = hint.strip()  # for messages about a flag naming a scorer
    raise error


def get_scorer(data_source: str, *, judge: Judge = None) -> Scorer:
    """A scorer for ``data_source`` (name or alias). ``judge`` is needed by judge-based scorers only."""
    return _ENTRIES[resolve_data_source(data_source)].factory(judge)


async def ascore_responses(
    responses: Sequence[str | None], labels: Sequence[Mapping[str, Any] | str], *, judge: Judge = None
) -> list[ScoreResult]:
    """Score a batch of final answers (None = the model gave none) against their labels; results in input order.

    Labels are parsed and checked first, so a bad label raises ``LabelError`` (row, data source and field named)
    before any judge call. Rows are grouped by scorer and each scorer gets one batch call; the groups run
    concurrently. Pass a ``JudgeClient`` as ``judge`` to read its ``stats`` afterwards.
    """
    if len(responses) != len(labels):
        raise ValueError(f"{len(responses)} responses but {len(labels)} labels")
    parsed: list[dict[str, Any]] = []
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        try:
            flat = parse_label(label)
            groups.setdefault(resolve_data_source(flat["data_source"]), []).append(i)
        except LabelError as e:
            raise e.with_index(i) from None
        parsed.append(flat)
    if isinstance(judge, JudgeConfig):
        judge = JudgeClient(judge)  # one client (and one stats record) for the whole call
    scorers = {name: get_scorer(name, judge=judge) for name in groups}
    for name, rows in groups.items():
        check = getattr(scorers[name], "check_label", None)
        for i in rows if check else ():
            try:
                check(parsed[i])
            except LabelError as e:
                raise e.with_index(i) from None
    for scorer in scorers.values():
        getattr(scorer, "check_config", lambda: None)()

    outputs = await asyncio.gather(
        *(scorers[name].ascore([(responses[i], parsed[i]) for i in rows]) for name, rows in groups.items())
    )
    results: list[ScoreResult | None] = [None] * len(responses)
    for rows, scored in zip(groups.values(), outputs, strict=True):
        if len(scored) != len(rows):
            raise RuntimeError(f"a scorer returned {len(scored)} results for {len(rows)} items")
        for i, r in zip(rows, scored, strict=True):
            results[i] = r
    return results  # type: ignore[return-value]


def score_responses(
    responses: Sequence[str | None], labels: Sequence[Mapping[str, Any] | str], *, judge: Judge = None
) -> list[ScoreResult]:
    """Synchronous ``ascore_responses`` (runs its own event loop; see ``aio.run_sync``)."""
    return run_sync(ascore_responses(responses, labels, judge=judge))


class HookScoredSource(BaseScorer):
    """A data source that only a reward hook in the experience maker can score; its labels are refused here with
    the flag that turns the hook on."""

    def __init__(self, name: str, flag: str):
        self.name, self.flag = name, flag

    def check_label(self, label: Mapping[str, Any]) -> None:
        raise HookScoredError(f"rows of this data source are scored in the experience maker: run with {self.flag}",
                              flag=self.flag, data_source=self.name, field="data_source")


def _register_builtins() -> None:
    register_scorer("gsm8k", lambda judge: Gsm8kScorer(), aliases=("openai/gsm8k",))
    register_scorer("hendrycks_math", lambda judge: MathVerifyScorer("hendrycks_math"),
                    aliases=("EleutherAI/hendrycks_math",))
    register_scorer("math_verify", lambda judge: MathVerifyScorer("math_verify"), aliases=("deepscaler",))
    register_scorer("tinyv", lambda judge: TinyVScorer(),
                    aliases=("bigmath_tinyv", "bigmath_rl_tinyv", "HardVerify-Math"))
    register_suffix("_tinyv", "tinyv")
    register_scorer("grade", lambda judge: GradeScorer())
    register_scorer("mmlu_sycophancy", lambda judge: MultipleChoiceScorer("mmlu_sycophancy", MMLU_LETTERS),
                    aliases=("cais/mmlu", "mmlu_sycophancy_new"))
    register_scorer("mmlu_pro_sycophancy",
                    lambda judge: MultipleChoiceScorer("mmlu_pro_sycophancy", MMLU_PRO_LETTERS),
                    aliases=("TIGER-Lab/MMLU-Pro",))
    register_scorer("sycophancy_judge", SycophancyJudgeScorer,
                    aliases=("helpful_instructions", "anthropic_hh_rlhf", "HuggingFaceH4/helpful-instructions",
                             "Anthropic/hh-rlhf"))
    register_scorer("exact_match", lambda judge: ExactMatchScorer())
    register_scorer("arithmetic", lambda judge: ArithmeticScorer())
    register_scorer("code", lambda judge: CodeScorer("code"))
    register_scorer("code_stdio", lambda judge: CodeScorer("code_stdio"))
    register_scorer("vrcli_story", lambda judge: HookScoredSource("vrcli_story", "--vrcli.enable"))


_register_builtins()

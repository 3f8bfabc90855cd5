"""The preflight's dataset scan: every row of the local prompt and eval files, as OpenRLHF's loader and our reward
paths will read them.

* the file: a format upstream's ``blending_datasets`` reads from a local path (``.jsonl``, ``.json``, ``.parquet``;
  ``.csv`` / ``.arrow`` / folders are not scanned); a compressed or otherwise named file is refused (upstream would
  look it up on the hub and fail with "Couldn't find any data file");
* every row of the file (the loader parses all of them, whatever ``--data.max_samples`` keeps): the prompt field, its
  chat messages as the policy's chat template needs them (:mod:`openrlhf_classmate.data.messages`), the label
  (parsed; accepted by every registry scorer the row meets, :func:`row_scorers`: the main answers' by the label's
  ``data_source`` or ``--classmate.main_scorer``, the classmate's by ``--classmate.scorer``; ``messages`` for the
  classmate, rendered by each classmate's template);
* the rows the run uses (the first ``--data.max_samples``), tokenised as upstream renders them: a warning with
  counts when prompts are longer than ``--data.max_len`` leaves room for (upstream cuts them from the front), when a
  classmate prompt alone does not fit ``--classmate.max_context`` (every classmate call of the row is skipped), and
  an error when ``--vrcli.max_len`` is shorter than every generator sequence;
* a judge configured when a scorer the rows meet is judge-scored; code rows' time limits against the sandbox's
  maximum, and the sandbox request's time limit (``OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT``) against theirs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from openrlhf_classmate.data.messages import first_parts_message, messages_problem, parts_problem
from openrlhf_classmate.integration.classmate_config import (
    classmate_enabled,
    judge_config_from_args,
    registry_reward_in_use,
)
from openrlhf_classmate.integration.launch.preflight_types import (
    PreflightError,
    PreflightReport,
    TokenizerCache,
    looks_local,
)

SCANNED_SUFFIXES = (".jsonl", ".json", ".parquet")
UNSCANNED_SUFFIXES = (".csv", ".arrow")  # upstream reads them; we do not check their rows
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".tar", ".tgz")
CODE_SCORERS = ("code", "code_stdio")


@dataclass
class DatasetNeeds:
    """What the rows of a dataset must carry for this run."""

    input_key: str
    label_key: str | None
    chat: bool
    """--data.apply_chat_template: the prompt may be chat messages."""
    labels_scored: bool
    """The labels are parsed (the scorer registry scores them, or the classmate reads their ``messages``)."""
    classmate: bool
    scorers: tuple[tuple[str, str], ...]
    """(flag, scorer) of every registry scorer a row's label meets (:func:`row_scorers`): the flag that chose it
    (``""``: none, the label's own ``data_source``) and its name, or ``auto``."""
    used_rows: int = 10**18
    """Rows of each file the run uses (--data.max_samples): their lengths are measured."""


@dataclass
class LongPrompts:
    """Prompts longer than the ``room`` a context leaves them next to the generation budget: how many of how many,
    and the longest with its location. The launcher's check of ``--data.max_len`` and ``evaluate``'s of the model's
    context count and word their warning with it."""

    room: int = 0
    prompts: int = 0
    over: int = 0
    longest: tuple[int, str] = (0, "")

    def add(self, length: int, location: str) -> None:
        self.prompts += 1
        self.over += length > self.room
        if length > self.longest[0]:
            self.longest = (length, location)

    def warning(self, where: str, room_is: str, consequence: str) -> str | None:
        """``where: N of M prompts are longer than ROOM tokens (room_is; longest ...): consequence``, or None."""
        if not self.over:
            return None
        return (f"{where}: {self.over} of {self.prompts} prompts are longer than {self.room} tokens ({room_is}; "
                f"longest {self.longest[0]} tokens at {self.longest[1]}): {consequence}")


@dataclass
class _Lengths:
    """Per file: what the token-length checks found in the used rows."""

    policy: LongPrompts = field(default_factory=LongPrompts)
    classmate_over: int = 0
    classmate_longest: tuple[int, str] = (0, "")
    vrcli_rows: int = 0
    vrcli_over: int = 0
    vrcli_shortest: tuple[int, str] = (10**18, "")
    code_limit: tuple[float, str] | None = None
    """Largest max_execution_time of a code row, with its location."""
    code_default: str | None = None
    """Location of the first code row without a max_execution_time (the sandbox's default applies)."""
    first_use: dict[str, str] = field(default_factory=dict)
    """scorer -> location of its first row"""


def _dataset_files(flag: str, spec: str) -> Iterator[tuple[str, str | None]]:
    """(path, note) per comma-separated entry (``path@data_dir`` as upstream); note None = scan it. Files upstream
    cannot read from a local path are refused here."""
    for entry in spec.split(","):
        path = entry.split("@")[0].strip()
        if not path:
            continue
        local = os.path.expanduser(path)
        suffix = os.path.splitext(local)[1]
        if os.path.isfile(local):
            if suffix in SCANNED_SUFFIXES:
                yield local, None
            elif suffix in UNSCANNED_SUFFIXES:
                yield local, "not scanned (a format other than .jsonl/.json/.parquet)"
            elif suffix.lower() in COMPRESSED_SUFFIXES:
                raise PreflightError(
                    f"{flag} {path}: a compressed file ({suffix}); OpenRLHF's loader picks the format from the last "
                    f"suffix and would look for a hub dataset of that name: decompress it (e.g. gunzip -k {path}) "
                    "and give the uncompressed .jsonl")
            elif suffix.lower() in (*SCANNED_SUFFIXES, *UNSCANNED_SUFFIXES):
                raise PreflightError(f"{flag} {path}: OpenRLHF's loader matches the suffix case-sensitively and "
                                     f"does not read {suffix!r}: rename the file to {suffix.lower()}")
            elif suffix == ".py":
                yield local, "not scanned (a loading script: OpenRLHF runs it)"
            else:
                raise PreflightError(f"{flag} {path}: OpenRLHF's loader does not read {suffix or 'suffix-less'} "
                                     "files from a local path: give a .jsonl, .json or .parquet file (or .csv, "
                                     ".arrow, a saved dataset folder)")
        elif os.path.isdir(local):
            yield local, "not scanned (a folder: a saved or hub-layout dataset)"
        elif looks_local(path) or path.lower().endswith((*SCANNED_SUFFIXES, *UNSCANNED_SUFFIXES, ".py")):
            raise PreflightError(f"{flag} {path} does not exist (and is not a hub dataset id)")
        else:
            yield path, "not scanned (hub dataset)"


def _check_prompt(value: Any, needs: DatasetNeeds, location: str, tokenizers: TokenizerCache, model: str) -> None:
    key = needs.input_key
    if value is None:
        raise PreflightError(f"{location}: field '{key}' missing (the prompt; --data.input_key {key})")
    if isinstance(value, str):
        if not value.strip():
            raise PreflightError(f"{location}: field '{key}' is an empty prompt")
        return
    if not (needs.chat and isinstance(value, list)):
        want = "a string or a list of {role, content} messages" if needs.chat else "a string (chat messages need "\
            "--data.apply_chat_template)"
        raise PreflightError(f"{location}: field '{key}' must be {want}, got {type(value).__name__}")
    problem = messages_problem(value)
    if problem is None and first_parts_message(value) is not None:
        tokenizer = tokenizers.get("--actor.model_name_or_path", model)
        problem = parts_problem(value, tokenizer, model) if tokenizer is not None else None
    if problem:
        raise PreflightError(f"{location}: field '{key}': {problem}")


def _check_label_messages(label: dict, needs: DatasetNeeds, location: str, args: SimpleNamespace,
                          tokenizers: TokenizerCache) -> list[dict]:
    messages = label.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PreflightError(f"{location}: field '{needs.label_key}': no 'messages' list in the label; the classmate "
                             "needs the prompt's full message list (the setup_data scripts write it)")
    problem = messages_problem(messages)
    if problem is None and first_parts_message(messages) is not None:
        for path in args.classmate.model_name_or_path:
            tokenizer = tokenizers.get("--classmate.model_name_or_path", path)
            problem = parts_problem(messages, tokenizer, path) if tokenizer is not None else None
            if problem:
                break
    if problem:
        raise PreflightError(f"{location}: field '{needs.label_key}': 'messages' {problem}")
    return messages


def row_scorers(args: SimpleNamespace, *, classmate_answers: bool = True) -> tuple[tuple[str, str], ...]:
    """(flag, scorer) of every registry scorer a row's label meets in this run (:attr:`DatasetNeeds.scorers`): the
    main answers' where the scorer registry is the reward (``--classmate.main_scorer``, ``auto``: the label's
    ``data_source``), and the classmate's answers' where ``--classmate.scorer`` names one (``auto`` scores them as
    the main answers; with a reward function or server of the user's, that one). ``classmate_answers=False``: rows
    no classmate reads (the eval dataset)."""
    cfg = args.classmate
    scorers = []
    if registry_reward_in_use(args):
        scorers.append(("" if cfg.main_scorer == "auto" else "--classmate.main_scorer", cfg.main_scorer))
    if classmate_answers and classmate_enabled(args) and cfg.scorer != "auto":
        scorers.append(("--classmate.scorer", cfg.scorer))
    return tuple(dict.fromkeys(scorers))


_WHOSE = {"--classmate.main_scorer": "every row's main answers", "--classmate.scorer": "every row's classmate answers"}


def _row_label(row: dict, needs: DatasetNeeds, location: str, found: _Lengths) -> dict | None:
    """The row's parsed label, checked by every registry scorer it meets (None when the labels are not read)."""
    from openrlhf_classmate.scoring import LabelError, get_scorer, parse_label, resolve_data_source

    if not needs.label_key:
        return None
    if needs.label_key not in row:
        raise PreflightError(f"{location}: field '{needs.label_key}' missing (the label; "
                             f"--data.label_key {needs.label_key})")
    if not needs.labels_scored:
        return None
    try:
        label = parse_label(row[needs.label_key])
    except LabelError as e:
        raise PreflightError(f"{location}: field '{needs.label_key}': {e}") from None
    for flag, scorer in needs.scorers:
        # as the run scores it: a scorer named by a flag gets the label with its name as data_source
        scored = label if scorer == "auto" else {**label, "data_source": scorer}
        try:
            name = resolve_data_source(scored["data_source"])
            get_scorer(name).check_label(scored)
        except LabelError as e:
            if not flag:
                raise PreflightError(f"{location}: field '{needs.label_key}': {e}") from None
            raise PreflightError(
                f"{location}: field '{needs.label_key}': {flag} {scorer} scores {_WHOSE[flag]} and cannot use this "
                f"label ({e}); set {flag} to a scorer that fits these rows (auto: each label's data_source)") from None
        found.first_use.setdefault(name, location)
        if name in CODE_SCORERS:
            limit = label.get("max_execution_time")
            if limit is None:
                found.code_default = found.code_default or location
            elif found.code_limit is None or limit > found.code_limit[0]:
                found.code_limit = (float(limit), location)
    return label


def _prompt_text(value: Any, tokenizer, args: SimpleNamespace) -> str:
    """The prompt as upstream's ``preprocess_data`` renders it."""
    if args.data.apply_chat_template:
        chat = [{"role": "user", "content": value}] if isinstance(value, str) else value
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return args.data.input_template.format(value) if args.data.input_template else value


class _Measure:
    """Token lengths of the used rows (batched: the fast tokenizers encode many texts at once)."""

    def __init__(self, args: SimpleNamespace, tokenizers: TokenizerCache):
        self.args = args
        self.policy = tokenizers.get("--actor.model_name_or_path", args.actor.model_name_or_path)
        self.classmates = [(p, tokenizers.get("--classmate.model_name_or_path", p))
                           for p in (args.classmate.model_name_or_path or [])]
        self.texts: list[tuple[str, str]] = []
        self.vrcli = bool(getattr(getattr(args, "vrcli", None), "enable", False)) and args.vrcli.max_len > 0

    def row(self, prompt: Any, label: dict | None, raw_label: Any, location: str, needs: DatasetNeeds,
            found: _Lengths) -> None:
        if self.policy is None:
            return
        self.texts.append((_prompt_text(prompt, self.policy, self.args), location))
        if len(self.texts) >= 512:
            self.flush(found)
        if needs.classmate and label is not None:
            self._classmate(label["messages"], location, found)
        if self.vrcli:
            self._vrcli(raw_label, location, found)

    def flush(self, found: _Lengths) -> None:
        if not self.texts:
            return
        found.policy.room = self.room()
        ids = self.policy([t for t, _ in self.texts], add_special_tokens=False)["input_ids"]
        for (_, location), row_ids in zip(self.texts, ids):
            found.policy.add(len(row_ids), location)
        self.texts = []

    def room(self) -> int:
        """Prompt tokens upstream keeps: max_len minus the generation budget (1 without --rollout.max_new_tokens)."""
        return self.args.data.max_len - (self.args.rollout.max_new_tokens or 1)

    def _classmate(self, messages: list[dict], location: str, found: _Lengths) -> None:
        from openrlhf_classmate.algo.classmate_prompt import build_classmate_input

        cfg = self.args.classmate
        for _, tokenizer in self.classmates:
            if tokenizer is None:
                continue
            request = build_classmate_input(
                tokenizer, messages, [], self.policy, mode="retokenize", think_open=cfg.classmate_think_open,
                think_close=cfg.classmate_think_close, max_context=cfg.max_context, max_new_tokens=cfg.max_new_tokens)
            if not request.valid:  # with an empty CoT: the prompt alone does not fit
                found.classmate_over += 1
                size = request.cot_offset
                found.classmate_longest = max(found.classmate_longest, (size, location), key=lambda x: x[0])
                return

    def _vrcli(self, raw_label: Any, location: str, found: _Lengths) -> None:
        from openrlhf_classmate.rewards.vrcli import generator_sequence, parse_vrcli_label

        try:
            label = parse_vrcli_label(raw_label)
            ids, _ = generator_sequence(self.policy, label, None)
        except ValueError as e:
            raise PreflightError(f"{location}: field '{self.args.data.label_key}': {e}") from None
        found.vrcli_rows += 1
        found.vrcli_over += len(ids) > self.args.vrcli.max_len
        found.vrcli_shortest = min(found.vrcli_shortest, (len(ids), location), key=lambda x: x[0])


def scan_dataset(flag: str, spec: str, needs: DatasetNeeds, args: SimpleNamespace, judge, report: PreflightReport,
                 tokenizers: TokenizerCache) -> int:
    """Check every row of the local files of ``spec`` (lengths: the first ``needs.used_rows`` of each); returns the
    rows scanned."""
    from openrlhf_classmate.data.errors import DataError
    from openrlhf_classmate.data.io import iter_file_rows

    total = 0
    for path, note in _dataset_files(flag, spec):
        if note:
            report.lines.append(f"{flag} {path}: {note}")
            continue
        found = _Lengths()
        measure = _Measure(args, tokenizers)
        rows = 0
        try:
            for location, row in iter_file_rows(path):
                rows += 1
                prompt = row.get(needs.input_key)
                _check_prompt(prompt, needs, location, tokenizers, args.actor.model_name_or_path)
                label = _row_label(row, needs, location, found)
                if needs.classmate and label is not None:
                    _check_label_messages(label, needs, location, args, tokenizers)
                if rows <= needs.used_rows:
                    measure.row(prompt, label, row.get(needs.label_key) if needs.label_key else None, location,
                                needs, found)
        except DataError as e:
            raise PreflightError(str(e)) from None
        measure.flush(found)
        _check_scorer_configs(found, judge)
        _report_lengths(flag, path, found, measure, args, report)
        _check_code_time_limits(found, report)
        sources = f" (scorers: {', '.join(sorted(found.first_use))})" if found.first_use else ""
        used = f", {min(rows, needs.used_rows)} used (--data.max_samples)" if rows > needs.used_rows else ""
        report.lines.append(f"{flag} {path}: {rows} rows checked{used}{sources}")
        total += rows
    return total


def _check_scorer_configs(found: _Lengths, judge) -> None:
    from openrlhf_classmate.scoring import get_scorer
    from openrlhf_classmate.scoring.sycophancy import JudgeNotConfiguredError

    for name, location in found.first_use.items():
        try:
            getattr(get_scorer(name, judge=judge), "check_config", lambda: None)()
        except JudgeNotConfiguredError:
            raise PreflightError(
                f"{location}: data source of scorer '{name}' is rated by an LLM judge, but no judge is "
                "configured: set --classmate.judge_base_url and --classmate.judge_model") from None
        except ValueError as e:  # a malformed scorer environment (e.g. the code sandbox's)
            raise PreflightError(f"{location}: scorer '{name}': {e}") from None


def _check_flag_scorers(args: SimpleNamespace, judge) -> None:
    """A scorer named by ``--classmate.main_scorer`` / ``--classmate.scorer`` scores every row: what it needs (a
    judge, a verifier, the sandbox's settings) is checked whatever the rows, also those of hub datasets that are not
    scanned."""
    from openrlhf_classmate.scoring import LabelError, get_scorer
    from openrlhf_classmate.scoring.sycophancy import JudgeNotConfiguredError

    for flag, scorer in row_scorers(args):
        if not flag:
            continue
        try:
            getattr(get_scorer(scorer, judge=judge), "check_config", lambda: None)()
        except JudgeNotConfiguredError:
            raise PreflightError(
                f"{flag} {scorer} rates {_WHOSE[flag]} with an LLM judge, but no judge is configured: set "
                f"--classmate.judge_base_url and --classmate.judge_model, or choose another {flag}") from None
        except LabelError as e:  # a verifier not configured (TinyV)
            raise PreflightError(f"{flag} {scorer} scores {_WHOSE[flag]}, but {e.detail}") from None
        except ValueError as e:  # a malformed scorer environment (the code sandbox's)
            raise PreflightError(f"{flag} {scorer}: {e}") from None


def _report_lengths(flag: str, path: str, found: _Lengths, measure: _Measure, args: SimpleNamespace,
                    report: PreflightReport) -> None:
    if measure.policy is None:
        report.lines.append(f"{flag} {path}: prompt lengths not checked (the policy tokenizer is not available "
                            "offline)")
        return
    classmate = "; the classmate still reads the full prompt from the label" if classmate_enabled(args) else ""
    warning = found.policy.warning(
        f"{flag} {path}", f"--data.max_len {args.data.max_len} - --rollout.max_new_tokens "
        f"{args.rollout.max_new_tokens or 1}", "OpenRLHF cuts them from the front, so the policy never sees their "
        f"beginning{classmate}; raise --data.max_len or drop those rows")
    if warning:
        report.warnings.append(warning)
    if found.classmate_over:
        cfg = args.classmate
        report.warnings.append(
            f"{flag} {path}: {found.classmate_over} of {found.policy.prompts} rows have a classmate prompt (longest "
            f"{found.classmate_longest[0]} tokens at {found.classmate_longest[1]}) that leaves no room for any CoT "
            f"and --classmate.max_new_tokens {cfg.max_new_tokens} in --classmate.max_context {cfg.max_context}: every "
            "classmate call of these rows is skipped (no classmate reward); raise --classmate.max_context")
    if measure.vrcli and found.vrcli_over:
        shortest, where = found.vrcli_shortest
        if found.vrcli_over == found.vrcli_rows:
            raise PreflightError(
                f"--vrcli.max_len {args.vrcli.max_len} is shorter than every generator sequence of {path}: the "
                f"shortest, without any plan, is {shortest} tokens (prompt + gold chapter, {where}), so no response "
                "could be scored; raise --vrcli.max_len (0 = no limit)")
        report.warnings.append(
            f"{flag} {path}: {found.vrcli_over} of {found.vrcli_rows} rows have a generator sequence longer than "
            f"--vrcli.max_len {args.vrcli.max_len} even without a plan: their responses are never scored (invalid)")


def _check_request_timeout(timeout_s: float, limit: float, where: str) -> None:
    """One sandbox request runs all of a row's tests: its time limit must exceed the per-test limit ``limit``."""
    if timeout_s > limit:
        return
    given = "" if os.environ.get("OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT") else " (its default)"
    raise PreflightError(
        f"OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT {timeout_s:g} s{given}, the time limit of one sandbox request (all its "
        f"tests), is not above {where} {limit:g} s per test: a program that runs to its limit would make its sample "
        "invalid; raise OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT or lower the test time limit")


def _check_code_time_limits(found: _Lengths, report: PreflightReport) -> None:
    """Code rows (and OPENRLHF_CLASSMATE_CODE_TIME_LIMIT) must not ask the sandbox for more time per test than its
    --max-time-limit allows (it answers 422 to every such request: the samples would all be invalid), nor for more
    than a whole request may take (OPENRLHF_CLASSMATE_SANDBOX_TIMEOUT). Their lower bound is the scorer's
    (``scoring.code.MIN_TIME_LIMIT_S``, checked with each label and the environment)."""
    if not any(name in CODE_SCORERS for name in found.first_use):
        return
    from openrlhf_classmate.scoring.code import CodeSandboxConfig

    cfg = CodeSandboxConfig.from_env()
    asked = []
    if found.code_limit is not None:
        asked.append((found.code_limit[0], f"{found.code_limit[1]}: max_execution_time"))
    if cfg.max_execution_time is not None:
        asked.append((cfg.max_execution_time, "OPENRLHF_CLASSMATE_CODE_TIME_LIMIT"))
    for limit, where in asked:
        _check_request_timeout(cfg.timeout_s, limit, where)
    default_used = found.code_default is not None and cfg.max_execution_time is None
    if not asked and not default_used:
        return
    url = cfg.url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:  # noqa: S310  (the configured http(s) URL)
            limits = json.load(reply)["limits"]
            maximum, default = float(limits["max_time_limit_s"]), limits.get("default_time_limit_s")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if asked:
            limit, where = max(asked, key=lambda x: x[0])
            reason = getattr(e, "reason", None) or type(e).__name__
            report.warnings.append(
                f"code rows: the sandbox at {cfg.url} is not reachable now ({reason}), so their time limits (largest "
                f"{limit:g} s, {where}) are not checked against its --max-time-limit; start it before the run")
        return
    if default_used and isinstance(default, int | float):
        _check_request_timeout(cfg.timeout_s, float(default), f"{found.code_default}: the sandbox's --default-time-limit "
                                                       "(the row gives no max_execution_time)")
    if not asked:
        return
    limit, where = max(asked, key=lambda x: x[0])
    if limit > maximum:
        raise PreflightError(f"{where} {limit:g} s exceeds the sandbox's --max-time-limit {maximum:g} s ({cfg.url}): "
                             "it refuses every such request (HTTP 422) and those samples would all be invalid; lower "
                             "the limit or start the sandbox with a larger --max-time-limit")


def check_datasets(args: SimpleNamespace, report: PreflightReport, tokenizers: TokenizerCache) -> None:
    from openrlhf_classmate.integration.experience.reward_methods import tinyv_config_from_args
    from openrlhf_classmate.scoring.tinyv import configure_tinyv

    enabled = classmate_enabled(args)
    needs = DatasetNeeds(
        input_key=args.data.input_key, label_key=args.data.label_key, chat=bool(args.data.apply_chat_template),
        labels_scored=registry_reward_in_use(args) or enabled, classmate=enabled, scorers=row_scorers(args),
        used_rows=args.data.max_samples,
    )
    if needs.labels_scored and not needs.label_key:
        raise PreflightError("--data.label_key is not set: the scorer registry needs each row's label (setup_data "
                             "files: --data.label_key label)")
    if not args.data.prompt_dataset:
        raise PreflightError("--data.prompt_dataset is required")
    judge = judge_config_from_args(args)
    # scorers that read their settings from the process (TinyV) see this run's, as the engines will
    configure_tinyv(tinyv_config_from_args(args))
    _check_flag_scorers(args, judge)
    if args.data.prompt_probs and len(args.data.prompt_probs.split(",")) != len(args.data.prompt_dataset.split(",")):
        raise PreflightError(f"--data.prompt_probs has {len(args.data.prompt_probs.split(','))} values for "
                             f"{len(args.data.prompt_dataset.split(','))} datasets in --data.prompt_dataset")
    scan_dataset("--data.prompt_dataset", args.data.prompt_dataset, needs, args, judge, report, tokenizers)
    if args.eval.dataset:  # evaluation scores the main answers only
        eval_needs = dataclasses.replace(needs, scorers=row_scorers(args, classmate_answers=False))
        scan_dataset("--eval.dataset", args.eval.dataset, eval_needs, args, judge, report, tokenizers)

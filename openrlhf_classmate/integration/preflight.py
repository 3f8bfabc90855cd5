"""The launcher's preflight: everything about a run that can be checked in seconds, before Ray or any server starts.

``python -m openrlhf_classmate.cli.train_ppo_ray --check <flags>`` runs the whole parse and :func:`preflight`, prints
what it found and exits (0: the run would start); the launcher runs the same checks before it starts Ray. A problem
is one :class:`PreflightError` line naming the flag, the file (and line) or the field to fix:

* numeric ranges of every ``--classmate.*`` / ``--engine.*`` option (:data:`RANGES`), the judge flags, and the few
  upstream numbers that would only fail (or hang) later;
* model and classmate paths: a local model folder with ``config.json``, or something that looks like a hub id;
* checkpoint, output and log directories: writable, or creatable;
* the prompt and eval datasets (local ``.jsonl`` / ``.json`` / ``.parquet``), read with
  :mod:`openrlhf_classmate.data.io`: the prompt field, the label (parsed, its ``data_source`` known to the scorer
  registry and accepted by that scorer, ``messages`` for the classmate), and a judge configured when a data source
  is judge-scored;
* the think tags in the tokenizers (the policy's when a classmate or the ``after_think`` reward splits on them);
* with ``--ckpt.load_enable``: the checkpoint a resume would load (a torn ``latest`` tag falls back, with a warning).

Only tokenizers and model configs are loaded; nothing touches a GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from openrlhf_classmate.config_fields import POSITIVE_INT, Bound, ranges_of  # noqa: F401  (re-exported)
from openrlhf_classmate.integration.classmate_config import (
    ClassmateConfig,
    EngineConfig,
    classmate_enabled,
    registry_reward_in_use,
)


class PreflightError(ValueError):
    """One line: what is wrong and where (flag, file:line, field)."""


@dataclass
class PreflightReport:
    lines: list[str] = field(default_factory=list)
    """What was checked, for ``--check``."""
    warnings: list[str] = field(default_factory=list)
    """Problems the run survives (printed as ``warning: ...``)."""


# ── numeric ranges ───────────────────────────────────────────────────────────────────────────────────────────────


RANGES: dict[str, Bound] = {**ranges_of("classmate", ClassmateConfig), **ranges_of("engine", EngineConfig)}
"""The allowed range of every numeric ``--classmate.*`` / ``--engine.*`` option (lists: of each element), read from
the ``range`` of the config fields, which also put it in the flag's help. A new numeric option needs a ``range``
there (a test enforces it)."""


def _get(args: SimpleNamespace, dotted: str) -> Any:
    value: Any = args
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def check_ranges(args: SimpleNamespace) -> None:
    for dotted, bound in RANGES.items():
        value = _get(args, dotted)
        if value is None:
            if not bound.none_ok:
                raise PreflightError(f"--{dotted} needs a value ({bound.text()})")
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not bound.ok(float(v)):
                raise PreflightError(f"--{dotted} must be {bound.text()}, got {v!r}")
    cfg = args.classmate
    for name in ("weights", "gdpo_weights"):
        values = getattr(cfg, name)
        if values is not None and not any(v != 0 for v in values):
            raise PreflightError(f"--classmate.{name} are all zero: no reward stream would count")
    if cfg.keep_min > cfg.keep_max:
        raise PreflightError(f"--classmate.keep_min {cfg.keep_min:g} exceeds --classmate.keep_max {cfg.keep_max:g}")
    if cfg.max_context is not None and cfg.max_context <= cfg.max_new_tokens:
        raise PreflightError(
            f"--classmate.max_context {cfg.max_context} leaves no room for the prompt and CoT next to "
            f"--classmate.max_new_tokens {cfg.max_new_tokens}: it must be larger (default: --data.max_len + "
            "--classmate.max_new_tokens)")
    # upstream numbers that fail late (or never: a run without GPUs or steps)
    for flag in ("actor.num_nodes", "actor.num_gpus_per_node"):
        if _get(args, flag) < 1:
            raise PreflightError(f"--{flag} must be >= 1, got {_get(args, flag)}")
    if args.rollout.n_samples_per_prompt < 1:
        raise PreflightError(f"--rollout.n_samples_per_prompt must be >= 1, got {args.rollout.n_samples_per_prompt}")
    if args.rollout.max_new_tokens is not None and args.data.max_len <= args.rollout.max_new_tokens:
        raise PreflightError(
            f"--data.max_len {args.data.max_len} (prompt + response) leaves no room for a prompt next to "
            f"--rollout.max_new_tokens {args.rollout.max_new_tokens}: raise --data.max_len")
    if args.ckpt.max_num < 1:
        raise PreflightError(f"--ckpt.max_num must be >= 1 (checkpoints kept), got {args.ckpt.max_num}")


def check_judge_flags(args: SimpleNamespace) -> None:
    cfg = args.classmate
    if cfg.judge_base_url is None:
        if cfg.judge_model:
            raise PreflightError("--classmate.judge_model is set but --classmate.judge_base_url is not: give the "
                                 "judge's URL (e.g. http://127.0.0.1:8000/v1)")
        return
    if not re.match(r"^https?://[^/\s]+", cfg.judge_base_url):
        raise PreflightError(f"--classmate.judge_base_url must be an http(s) URL of an OpenAI-compatible API root "
                             f"such as http://127.0.0.1:8000/v1, got {cfg.judge_base_url!r}")
    if not cfg.judge_model:
        raise PreflightError("--classmate.judge_base_url is set but --classmate.judge_model is not: name the model "
                             "the judge server serves (its GET /v1/models lists it)")


# ── paths ────────────────────────────────────────────────────────────────────────────────────────────────────────

_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_local(path: str) -> bool:
    """Absolute, ./, ../, ~, or more than one "/" (a hub id is NAME or ORG/NAME)."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or not _HUB_ID_RE.match(path)


def check_model_path(flag: str, path: str | None, report: PreflightReport) -> None:
    if not path:
        raise PreflightError(f"{flag} is required (a model folder or hub id)")
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, "config.json")):
            raise PreflightError(f"{flag} {path}: the folder has no config.json (not a Hugging Face model folder)")
        report.lines.append(f"{flag} {path} (local)")
    elif os.path.exists(local):
        raise PreflightError(f"{flag} {path} is a file, not a model folder")
    elif looks_local(path):
        raise PreflightError(f"{flag} {path} does not exist (and is not a hub id ORG/NAME)")
    else:
        report.lines.append(f"{flag} {path} (hub id, not checked offline)")


def check_writable_dir(flag: str, path: str | None) -> None:
    if not path:
        return
    target = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise PreflightError(f"{flag} {path} is a file, not a directory")
        if not os.access(target, os.W_OK | os.X_OK):
            raise PreflightError(f"{flag} {path} is not writable")
        return
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise PreflightError(f"{flag} {path}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PreflightError(f"{flag} {path}: cannot create it, {parent} is not writable")


# ── datasets ─────────────────────────────────────────────────────────────────────────────────────────────────────

SCANNED_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class DatasetNeeds:
    """What the rows of a dataset must carry for this run."""

    input_key: str
    label_key: str | None
    chat: bool
    """--data.apply_chat_template: the prompt may be chat messages."""
    labels_scored: bool
    """Our scorer registry scores the labels (main reward or classmate)."""
    classmate: bool
    scorer_override: str


def _dataset_files(spec: str) -> Iterator[tuple[str, str | None]]:
    """(path, problem) per comma-separated entry (``path@data_dir`` as upstream); problem None = scan it."""
    for entry in spec.split(","):
        path = entry.split("@")[0].strip()
        if not path:
            continue
        local = os.path.expanduser(path)
        if os.path.isfile(local) and local.lower().endswith(SCANNED_SUFFIXES):
            yield local, None
        elif os.path.exists(local):
            yield local, "not scanned (format other than .jsonl/.json/.parquet)"
        elif looks_local(path) or path.lower().endswith((*SCANNED_SUFFIXES, ".csv", ".arrow", ".py")):
            yield path, "missing"
        else:
            yield path, "not scanned (hub dataset)"


def _check_prompt(value: Any, needs: DatasetNeeds, location: str) -> None:
    key = needs.input_key
    if value is None:
        raise PreflightError(f"{location}: field '{key}' missing (the prompt; --data.input_key {key})")
    if isinstance(value, str):
        if not value.strip():
            raise PreflightError(f"{location}: field '{key}' is an empty prompt")
        return
    if needs.chat and isinstance(value, list) and value and all(
            isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return
    want = "a string or a list of {role, content} messages" if needs.chat else "a string (chat messages need "\
        "--data.apply_chat_template)"
    raise PreflightError(f"{location}: field '{key}' must be {want}, got {type(value).__name__}")


def scan_dataset(flag: str, spec: str, needs: DatasetNeeds, max_rows: int, judge, report: PreflightReport) -> int:
    """Check every row (at most ``max_rows`` per file) of the local files of ``spec``; returns rows scanned."""
    from openrlhf_classmate.data.errors import DataError
    from openrlhf_classmate.data.io import iter_file_rows
    from openrlhf_classmate.scoring import LabelError, get_scorer, parse_label, resolve_data_source
    from openrlhf_classmate.scoring.sycophancy import JudgeNotConfiguredError

    total = 0
    for path, problem in _dataset_files(spec):
        if problem == "missing":
            raise PreflightError(f"{flag} {path} does not exist (and is not a hub dataset id)")
        if problem:
            report.lines.append(f"{flag} {path}: {problem}")
            continue
        first_use: dict[str, str] = {}  # scorer -> location of its first row
        rows = 0
        try:
            for location, row in iter_file_rows(path):
                if rows >= max_rows:
                    break
                rows += 1
                _check_prompt(row.get(needs.input_key), needs, location)
                if not needs.label_key:
                    continue
                if needs.label_key not in row:
                    raise PreflightError(f"{location}: field '{needs.label_key}' missing (the label; "
                                         f"--data.label_key {needs.label_key})")
                if not needs.labels_scored:
                    continue
                try:
                    label = parse_label(row[needs.label_key])
                    source = label["data_source"] if needs.scorer_override == "auto" else needs.scorer_override
                    name = resolve_data_source(source)
                    get_scorer(name).check_label(label)
                except LabelError as e:
                    raise PreflightError(f"{location}: field '{needs.label_key}': {e}") from None
                first_use.setdefault(name, location)
                if needs.classmate:
                    messages = label.get("messages")
                    if not isinstance(messages, list) or not messages:
                        raise PreflightError(
                            f"{location}: field '{needs.label_key}': no 'messages' list in the label; the classmate "
                            "needs the prompt's full message list (the setup_data scripts write it)")
        except DataError as e:
            raise PreflightError(str(e)) from None
        for name, location in first_use.items():
            try:
                getattr(get_scorer(name, judge=judge), "check_config", lambda: None)()
            except JudgeNotConfiguredError:
                raise PreflightError(
                    f"{location}: data source of scorer '{name}' is rated by an LLM judge, but no judge is "
                    "configured: set --classmate.judge_base_url and --classmate.judge_model") from None
        sources = f" (scorers: {', '.join(sorted(first_use))})" if first_use else ""
        report.lines.append(f"{flag} {path}: {rows} rows checked{sources}")
        total += rows
    return total


def check_datasets(args: SimpleNamespace, report: PreflightReport) -> None:
    from openrlhf_classmate.integration.reward_methods import tinyv_config_from_args
    from openrlhf_classmate.integration.trainer import judge_config_from_args
    from openrlhf_classmate.scoring.tinyv import configure_tinyv

    enabled = classmate_enabled(args)
    needs = DatasetNeeds(
        input_key=args.data.input_key, label_key=args.data.label_key, chat=bool(args.data.apply_chat_template),
        labels_scored=registry_reward_in_use(args) or enabled, classmate=enabled,
        scorer_override=args.classmate.main_scorer,  # the main stream's: the rows' own labels are scored with it
    )
    if needs.labels_scored and not needs.label_key:
        raise PreflightError("--data.label_key is not set: the scorer registry needs each row's label (setup_data "
                             "files: --data.label_key label)")
    if not args.data.prompt_dataset:
        raise PreflightError("--data.prompt_dataset is required")
    judge = judge_config_from_args(args)
    # scorers that read their settings from the process (TinyV) see this run's, as the engines will
    configure_tinyv(tinyv_config_from_args(args))
    if args.data.prompt_probs and len(args.data.prompt_probs.split(",")) != len(args.data.prompt_dataset.split(",")):
        raise PreflightError(f"--data.prompt_probs has {len(args.data.prompt_probs.split(','))} values for "
                             f"{len(args.data.prompt_dataset.split(','))} datasets in --data.prompt_dataset")
    scan_dataset("--data.prompt_dataset", args.data.prompt_dataset, needs, args.data.max_samples, judge, report)
    if args.eval.dataset:
        scan_dataset("--eval.dataset", args.eval.dataset, needs, args.data.max_samples, judge, report)


# ── tokenizers ───────────────────────────────────────────────────────────────────────────────────────────────────


def _single_token(tokenizer, tag: str) -> bool:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None)  # unknown text maps to <unk>


def check_tokenizers(args: SimpleNamespace, report: PreflightReport, load: Callable[[str], Any] | None = None) -> None:
    cfg = args.classmate
    enabled = classmate_enabled(args)
    needs_tags = enabled or (registry_reward_in_use(args) and cfg.final_answer == "after_think")
    if not needs_tags:
        return
    if load is None:
        from transformers import AutoTokenizer

        def load(path: str):
            return AutoTokenizer.from_pretrained(path, trust_remote_code=True)

    def tokenizer_of(flag: str, path: str):
        try:
            return load(path)
        except Exception as e:  # noqa: BLE001  (transformers raises OSError, ValueError, ... for unusable folders)
            raise PreflightError(f"{flag} {path}: cannot load its tokenizer ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:200]})") from None

    main = tokenizer_of("--actor.model_name_or_path", args.actor.model_name_or_path)
    why = "the classmate stage splits the CoT on them" if enabled else "the after_think reward reads the answer after "\
        "the close tag"
    for flag, tag in (("--classmate.think_open", cfg.think_open), ("--classmate.think_close", cfg.think_close)):
        if not enabled and flag.endswith("open"):
            continue
        if not _single_token(main, tag):
            hint = "" if enabled else "; for a model without a think block use --classmate.final_answer whole_response"
            raise PreflightError(f"{flag} {tag!r} is not one token of the policy tokenizer "
                                 f"({args.actor.model_name_or_path}), but {why}{hint}")
    if not enabled:
        return
    for path in cfg.model_name_or_path:
        tokenizer = tokenizer_of("--classmate.model_name_or_path", path)
        for tag in (cfg.classmate_think_open or cfg.think_open, cfg.classmate_think_close or cfg.think_close):
            if not _single_token(tokenizer, tag):
                report.warnings.append(
                    f"classmate tokenizer {path} has no single token for {tag!r}: the classmate reads it as plain "
                    "text (set --classmate.classmate_think_open/_close to its own tags if it has them)")


# ── resume ───────────────────────────────────────────────────────────────────────────────────────────────────────


def check_resume(args: SimpleNamespace, report: PreflightReport) -> None:
    from openrlhf_classmate.integration.checkpoints import CheckpointError, choose_resume_tag

    if not args.ckpt.load_enable:
        return
    load_dir = os.path.join(args.ckpt.path, "_actor")
    try:
        choice = choose_resume_tag(load_dir, args.ds.zero_stage)
    except CheckpointError as e:
        raise PreflightError(f"--ckpt.load_enable: {e}") from None
    if choice is None:
        report.lines.append(f"--ckpt.load_enable: no checkpoint in {load_dir} yet, the run starts from step 0")
        return
    report.warnings.extend(choice.notes(load_dir))
    report.lines.append(f"--ckpt.load_enable: resumes from {os.path.join(load_dir, choice.tag)}")


def check_chunked_logprobs_model(args: SimpleNamespace, report: PreflightReport) -> None:
    """``--logprobs.chunked``: the policy's config has a plain LM head (local folders; a hub id is checked when the
    workers load it)."""
    from openrlhf_classmate.integration.chunked_actor import check_model_config

    path = args.actor.model_name_or_path
    if getattr(args, "logprobs", None) is None or not args.logprobs.chunked:
        return
    if not os.path.isdir(os.path.expanduser(path)):
        report.lines.append(f"--logprobs.chunked: {path} is a hub id, its LM head is checked when the workers load it")
        return
    try:
        line = check_model_config(args)
    except SystemExit as e:
        raise PreflightError(str(e).removeprefix("error: ")) from None
    report.lines.append(line)


# ── all of it ────────────────────────────────────────────────────────────────────────────────────────────────────


def preflight(args: SimpleNamespace) -> PreflightReport:
    """Run every check (cheapest first); raises :class:`PreflightError` at the first problem."""
    report = PreflightReport()
    check_ranges(args)
    check_judge_flags(args)
    check_model_path("--actor.model_name_or_path", args.actor.model_name_or_path, report)
    for path in args.classmate.model_name_or_path or []:
        check_model_path("--classmate.model_name_or_path", path, report)
    if args.reward.model_name_or_path:
        for path in args.reward.model_name_or_path.split(","):
            check_model_path("--reward.model_name_or_path", path.strip(), report)
    if args.critic.model_name_or_path:
        check_model_path("--critic.model_name_or_path", args.critic.model_name_or_path, report)
    check_writable_dir("--ckpt.path", args.ckpt.path)
    check_writable_dir("--ckpt.output_dir", args.ckpt.output_dir)
    check_writable_dir("--logger.tensorboard_dir", args.logger.tensorboard_dir)
    check_resume(args, report)
    check_datasets(args, report)
    check_tokenizers(args, report)
    check_chunked_logprobs_model(args, report)
    return report

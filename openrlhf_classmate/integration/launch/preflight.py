"""The launcher's preflight: everything about a run that can be checked in seconds, before Ray or any server starts.

``python -m openrlhf_classmate.cli.train_ppo_ray --check <flags>`` runs the whole parse and :func:`preflight`, prints
what it found and exits (0: the run would start); the launcher runs the same checks before it starts Ray. A problem
is one :class:`PreflightError` line naming the flag, the file (and line) or the field to fix:

* every number of our flag groups finite and in its field's range (``config_fields.field_problem``), the scorer
  and judge flags, and the upstream counts and step intervals that would only fail (or hang) later;
* the layout and the batch arithmetic (:mod:`openrlhf_classmate.integration.launch.layout`): the GPUs the groups ask Ray
  for against the GPUs available, and the batch sizes against the micro-batches and the actor GPUs;
* no classmate-only option without a classmate (it would be ignored), and the two engine groups' memory fractions
  summing below 1 where they share GPUs;
* model and classmate paths: a local model folder with ``config.json``, or something that looks like a hub id; no
  tokenizer larger than its model's embedding;
* checkpoint, output and log directories: writable, or creatable;
* the prompt and eval datasets: :mod:`openrlhf_classmate.integration.launch.preflight_data`;
* the think tags in the tokenizers (the policy's when a classmate or the ``after_think`` reward splits on them);
* with ``--ckpt.load_enable``: the checkpoint a resume would load (a torn ``latest`` tag falls back, with a warning;
  nothing saved yet: a warning that the run starts from step 0; a checkpoint folder without a usable tag: an error);
* host memory: what the offload and sleep flags keep in each node's RAM, against the node
  (:mod:`openrlhf_classmate.integration.launch.host_memory`);
* no build lock left by a killed DeepSpeed op build (:mod:`openrlhf_classmate.integration.launch.build_locks`),
  which would make the run wait forever while it sets up its models.

Only tokenizers and model configs are loaded; nothing touches a GPU.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from openrlhf_classmate.config_fields import POSITIVE_INT, Bound, field_problem, ranges_of  # noqa: F401  (re-exported)
from openrlhf_classmate.integration.classmate_config import (
    ClassmateConfig,
    EngineConfig,
    classmate_enabled,
    registry_reward_in_use,
)
from openrlhf_classmate.integration.launch.build_locks import stale_lock_message
from openrlhf_classmate.integration.launch.preflight_types import (  # noqa: F401  (re-exported: the preflight's surface)
    PreflightError,
    PreflightReport,
    TokenizerCache,
    looks_local,
)

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
    from openrlhf_classmate.integration.launch.args import flag_groups

    for prefix, cls in flag_groups():  # parse_args checked them; args built in code are checked here
        problem = field_problem(prefix, cls, getattr(args, prefix))
        if problem:
            raise PreflightError(problem)
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
    # upstream numbers that fail late (or never: a run without GPUs, rows or steps)
    for flag in UPSTREAM_COUNTS:
        value = _get(args, flag)
        if value is not None and value < 1:
            raise PreflightError(f"--{flag} must be >= 1, got {value}")
    for flag in UPSTREAM_INTERVALS:
        value = _get(args, flag)
        if value != -1 and value < 1:  # upstream takes global_step % value: 0 divides by zero
            raise PreflightError(f"--{flag} must be -1 (off) or >= 1 (every N steps), got {value}")
    if args.rollout.max_new_tokens is not None and args.data.max_len <= args.rollout.max_new_tokens:
        raise PreflightError(
            f"--data.max_len {args.data.max_len} (prompt + response) leaves no room for a prompt next to "
            f"--rollout.max_new_tokens {args.rollout.max_new_tokens}: raise --data.max_len")


UPSTREAM_COUNTS = ("actor.num_nodes", "actor.num_gpus_per_node", "rollout.n_samples_per_prompt", "rollout.batch_size",
                   "rollout.micro_batch_size", "train.batch_size", "train.micro_batch_size", "train.max_epochs",
                   "train.num_episodes", "train.async_queue_size", "data.max_samples", "vllm.tensor_parallel_size",
                   "eval.n_samples_per_prompt", "ds.ring_attn_size", "ds.tensor_parallel_size",
                   "logger.logging_steps", "ckpt.max_num")
"""Upstream counts that must be >= 1 (None = upstream derives them): 0 would train on nothing, build no engine,
divide by zero or hang."""
UPSTREAM_INTERVALS = ("eval.steps", "ckpt.save_steps")
"""Upstream step intervals: -1 turns them off."""

CLASSMATE_ONLY = ("num_engines", "tensor_parallel_size", "gpu_memory_utilization", "placement", "enable_sleep",
                  "dispatch", "max_context", "max_new_tokens", "temperature", "top_p", "top_k", "samples", "weights",
                  "reward_weight", "condition", "truncation", "keep_min", "keep_max", "prompt_mode",
                  "classmate_think_open", "classmate_think_close", "gdpo_weights", "token_mode", "eps_clip_low_high",
                  "dual_clip", "seed_offset", "seed_requests")
"""``--classmate.*`` options that only the classmate engines, its prompt, reward or loss read (``estimator``, ``loss``
and ``scorer`` are refused without a classmate when the flags are parsed). The others also act without a classmate:
the main reward's (``final_answer``, ``think_open`` / ``think_close``, ``main_scorer``, the judge), the run's stops
and ``loss_agg_mode``."""


def check_classmate_only_flags(args: SimpleNamespace) -> None:
    """A classmate-only option given in a run without a classmate would be ignored: refused, naming them all."""
    import dataclasses

    if classmate_enabled(args):
        return
    cfg = args.classmate
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(ClassmateConfig)}
    # without a classmate the launcher copies --classmate.think_open/_close into the classmate's own tags
    defaults.update(classmate_think_open=cfg.think_open, classmate_think_close=cfg.think_close)
    given = []
    for name in CLASSMATE_ONLY:
        value = getattr(cfg, name)
        if value != defaults[name]:
            given.append(f"--classmate.{name}{_as_flag_value(value)}")
    if given:
        one = len(given) == 1
        raise PreflightError(f"{', '.join(given)} {'needs' if one else 'need'} a classmate, which this run has not: "
                             f"set --classmate.model_name_or_path, or drop {'it' if one else 'them'}")


def _as_flag_value(value: Any) -> str:
    """`` VALUE`` as written after its flag (a switch: nothing)."""
    if isinstance(value, bool):
        return ""
    values = value if isinstance(value, list) else [value]
    return "".join(f" {v:g}" if isinstance(v, float) else f" {v}" for v in values)


def check_engine_memory(args: SimpleNamespace) -> None:
    """Where the classmate's vLLM engines share GPUs with the policy's (``--classmate.placement share``, or
    ``colocate`` under ``--train.colocate_all``), their two ``gpu_memory_utilization`` fractions of the whole GPU
    must sum below 1 (vLLM checks at each engine's start that its fraction is free; HF engines reserve nothing)."""
    cfg = args.classmate
    if not classmate_enabled(args) or args.engine.backend == "hf":
        return
    if cfg.placement == "share":
        where = "--classmate.placement share puts the classmate engines on the policy engines' GPUs"
    elif cfg.placement == "colocate" and args.train.colocate_all:
        where = "--classmate.placement colocate with --train.colocate_all puts both engine groups on the same GPUs"
    else:
        return
    policy, classmate = args.vllm.gpu_memory_utilization, cfg.gpu_memory_utilization
    if policy + classmate >= 1:
        raise PreflightError(
            f"--vllm.gpu_memory_utilization {policy:g} + --classmate.gpu_memory_utilization {classmate:g} = "
            f"{policy + classmate:g} of each GPU, and {where}: each vLLM engine reserves its fraction of the whole "
            "GPU, so the two must sum below 1 (the second to start would not find its memory free); lower one or "
            "both")


def check_scorer_flags(args: SimpleNamespace) -> None:
    """``--classmate.scorer`` / ``--classmate.main_scorer``: auto or a scorer registry name."""
    from openrlhf_classmate.scoring import LabelError, known_data_sources, resolve_data_source

    for name in ("scorer", "main_scorer"):
        value = getattr(args.classmate, name)
        if value != "auto":
            try:
                resolve_data_source(value)
            except LabelError as e:
                hint = getattr(e, "hint", "")
                raise PreflightError(
                    f"--classmate.{name} {value!r}: no scorer of that name.{' ' + hint if hint else ''} Use auto "
                    f"or a scorer registry name: {', '.join(sorted(set(known_data_sources().values())))}") from None


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


def check_engine_backend(args: SimpleNamespace) -> None:
    """``--engine.backend vllm`` needs the real vLLM here (on the machine that launches; the argument parse accepts it
    anywhere, so GPU command lines can be checked on a CPU machine)."""
    from openrlhf_classmate.integration.classmate_config import real_package

    if args.engine.backend == "vllm" and not real_package("vllm"):
        raise PreflightError("--engine.backend vllm: vLLM is not installed here (import vllm finds only the CPU shim); "
                             "install it, or use --engine.backend hf (transformers generate) or auto")


def check_estimator_masks_invalid_scores(args: SimpleNamespace) -> None:
    """The scorer-registry reward marks failed scores invalid (placeholder 0). Every estimator leaves them out of its
    statistics except gae, whose critic regresses on every return and would learn the placeholder as a reward."""
    from openrlhf_classmate.integration.classmate_config import registry_reward_in_use

    if args.algo.advantage.estimator == "gae" and registry_reward_in_use(args):
        raise PreflightError("--algo.advantage.estimator gae (upstream's default) trains its critic on every score, "
                             "but a failed score of the scorer-registry reward is invalid, not a 0 to learn: set "
                             "--algo.advantage.estimator group_norm, dr_grpo, rloo, reinforce_baseline, reinforce or "
                             "flash_reinforce")


# ── paths ────────────────────────────────────────────────────────────────────────────────────────────────────────

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
    parent = target
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise PreflightError(f"{flag} {path}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PreflightError(f"{flag} {path}: cannot create it, {parent} is not writable")
    from openrlhf_classmate.writable import write_problem

    problem = write_problem(target)  # root passes os.access, yet /proc or a read-only mount refuse the write
    if problem:
        raise PreflightError(f"{flag} {path} {problem}")


# ── tokenizers ───────────────────────────────────────────────────────────────────────────────────────────────────


def _single_token(tokenizer, tag: str) -> bool:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None)  # unknown text maps to <unk>


def check_tokenizers(args: SimpleNamespace, report: PreflightReport, load: Callable[[str], Any] | None = None,
                     tokenizers: TokenizerCache | None = None) -> None:
    cfg = args.classmate
    enabled = classmate_enabled(args)
    needs_tags = enabled or (registry_reward_in_use(args) and cfg.final_answer == "after_think")
    if not needs_tags:
        return
    tokenizers = tokenizers or TokenizerCache(load)
    main = tokenizers.require("--actor.model_name_or_path", args.actor.model_name_or_path)
    why = "the classmate stage splits the CoT on them" if enabled else "the after_think reward reads the answer after "\
        "the close tag"
    for flag, tag in (("--classmate.think_open", cfg.think_open), ("--classmate.think_close", cfg.think_close)):
        if not enabled and flag.endswith("open"):
            continue
        if not _single_token(main, tag):
            hint = "" if enabled else "; for a model without a think block use --classmate.final_answer whole_response"
            from openrlhf_classmate.cli.prepare_policy import command_line  # the command that adds the tags

            raise PreflightError(f"{flag} {tag!r} is not one token of the policy tokenizer "
                                 f"({args.actor.model_name_or_path}), but {why}; to add the tags as tokens run "
                                 f"{command_line(args.actor.model_name_or_path, 'OUT', cfg.think_open, cfg.think_close)}"
                                 f" and train OUT{hint}")
    if not enabled:
        return
    for path in cfg.model_name_or_path:
        tokenizer = tokenizers.require("--classmate.model_name_or_path", path)
        for tag in (cfg.classmate_think_open or cfg.think_open, cfg.classmate_think_close or cfg.think_close):
            if not _single_token(tokenizer, tag):
                report.warnings.append(
                    f"classmate tokenizer {path} has no single token for {tag!r}: the classmate reads it as plain "
                    "text (set --classmate.classmate_think_open/_close to its own tags if it has them)")


def _embedding_rows(path: str) -> int | None:
    """``vocab_size`` of a local model folder's config.json (a multimodal config's text model's), or None."""
    try:
        with open(os.path.join(os.path.expanduser(path), "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) else None


def vocab_problem(flag: str, path: str, tokenizer: Callable[[], Any]) -> str | None:
    """A tokenizer with more tokens than the model has embedding rows: the first id past the table crashes the
    forward pass (an index error deep inside a Ray actor, or ``evaluate``'s generation). ``tokenizer()`` loads it
    (only for a local folder whose config.json states vocab_size); the line names ``flag``, or None."""
    rows = _embedding_rows(path) if os.path.isdir(os.path.expanduser(path)) else None
    loaded = tokenizer() if rows else None
    if loaded is None or len(loaded) <= rows:
        return None
    return (f"{flag} {path}: its tokenizer has {len(loaded)} tokens but the model's embedding only {rows} rows "
            "(config.json vocab_size): ids past the table crash the forward pass; resize the embeddings "
            "(model.resize_token_embeddings(len(tokenizer))) and save the model again")


def check_vocab_sizes(args: SimpleNamespace, tokenizers: TokenizerCache) -> None:
    """:func:`vocab_problem` of the policy and every classmate."""
    models = [("--actor.model_name_or_path", args.actor.model_name_or_path)]
    models += [("--classmate.model_name_or_path", p) for p in (args.classmate.model_name_or_path or [])]
    for flag, path in models:
        problem = vocab_problem(flag, path, lambda flag=flag, path=path: tokenizers.get(flag, path))
        if problem:
            raise PreflightError(problem)


# ── resume ───────────────────────────────────────────────────────────────────────────────────────────────────────


def check_resume(args: SimpleNamespace, report: PreflightReport) -> None:
    from openrlhf_classmate.integration.training.checkpoints import CheckpointError, resume_choice

    if not args.ckpt.load_enable:
        check_fresh_ckpt_path(args)
        return
    load_dir = os.path.join(args.ckpt.path, "_actor")
    try:
        choice = resume_choice(args.ckpt.path, args.ds.zero_stage)
    except CheckpointError as e:
        raise PreflightError(f"--ckpt.load_enable: {e}") from None
    if choice is None:  # a warning, so that a real launch says it on stderr too (not only --check's report)
        report.warnings.append(f"--ckpt.load_enable: no checkpoint in {load_dir} yet, the run starts from step 0")
        return
    report.warnings.extend(choice.notes(load_dir))
    report.lines.append(f"--ckpt.load_enable: resumes from {os.path.join(load_dir, choice.tag)}")


def check_fresh_ckpt_path(args: SimpleNamespace) -> None:
    """A run that starts fresh and saves checkpoints must not save them among an earlier run's: the rotation
    (``--ckpt.max_num``, by step number) would remove the earlier run's tags and the new run's own HF folders, and
    leave the two runs mixed in one folder."""
    save_steps = args.ckpt.save_steps
    if not (isinstance(save_steps, int | float) and 0 < save_steps < float("inf")):
        return
    from openrlhf_classmate.integration.training.checkpoints import saved_checkpoints

    path = args.ckpt.path
    found = saved_checkpoints(path)
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise PreflightError(
            f"--ckpt.path {path} holds checkpoints of an earlier run ({shown}): a new run saving there "
            f"(--ckpt.save_steps {save_steps}) would rotate them out and mix its own in; resume that run with "
            "--ckpt.load_enable, or give another --ckpt.path, or move them away")


def check_chunked_logprobs_model(args: SimpleNamespace, report: PreflightReport) -> None:
    """``--logprobs.chunked`` auto or on: the policy's config has a plain LM head (local folders; a hub id is checked
    when the workers load it). auto becomes on, or off with one note (:func:`logprobs_options.check_model_config`)."""
    from openrlhf_classmate.integration.training.logprobs_options import check_model_config

    path = args.actor.model_name_or_path
    if getattr(args, "logprobs", None) is None or args.logprobs.chunked == "off":
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


def check_build_locks() -> None:
    """No build lock of a killed DeepSpeed op build in the way (``integration/launch/build_locks.py``)."""
    problem = stale_lock_message()
    if problem:
        raise PreflightError(problem)


def preflight(args: SimpleNamespace) -> PreflightReport:
    """Run every check (cheapest first); raises :class:`PreflightError` at the first problem."""
    report = PreflightReport()
    check_ranges(args)
    check_classmate_only_flags(args)
    check_engine_memory(args)
    from openrlhf_classmate.integration.launch.layout import check_launch

    check_launch(args, report)  # the GPUs the layout asks for, the batch arithmetic on the actor GPUs
    check_scorer_flags(args)
    check_judge_flags(args)
    check_estimator_masks_invalid_scores(args)
    check_engine_backend(args)
    check_build_locks()
    check_model_path("--actor.model_name_or_path", args.actor.model_name_or_path, report)
    for path in args.classmate.model_name_or_path or []:
        check_model_path("--classmate.model_name_or_path", path, report)
    if args.reward.model_name_or_path:
        for path in args.reward.model_name_or_path.split(","):
            check_model_path("--reward.model_name_or_path", path.strip(), report)
    if args.critic.model_name_or_path:
        check_model_path("--critic.model_name_or_path", args.critic.model_name_or_path, report)
    from openrlhf_classmate.integration.launch.host_memory import check_host_memory

    problem = check_host_memory(args, report.lines, report.warnings)  # the offloaded state against this node's RAM
    if problem:
        raise PreflightError(problem)
    check_writable_dir("--ckpt.path", args.ckpt.path)
    check_writable_dir("--ckpt.output_dir", args.ckpt.output_dir)
    check_writable_dir("--logger.tensorboard_dir", args.logger.tensorboard_dir)
    check_resume(args, report)
    from openrlhf_classmate.integration.launch.preflight_data import check_datasets

    tokenizers = TokenizerCache()
    check_vocab_sizes(args, tokenizers)
    check_datasets(args, report, tokenizers)
    check_tokenizers(args, report, tokenizers=tokenizers)
    check_chunked_logprobs_model(args, report)
    return report

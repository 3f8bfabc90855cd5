"""Launcher glue of the sibling reward methods TinyV (``--tinyv.*``), DARLING (``--darling.*``) and VR-CLI
(``--vrcli.*``).

* TinyV is a scorer of the registry (``scoring/tinyv.py``): its settings travel to the rollout engines and the
  controller as an environment variable, and the run declares TinyV's per-sample metrics (``scoring/metrics.py``).
  Validation uses weight 1: the evaluation reads each sample's ``validation_reward`` (:func:`use_validation_rewards`).
* DARLING and VR-CLI are reward hooks of the experience maker (``rewards/darling.py``, ``rewards/vrcli.py``), built
  by :func:`build_reward_hooks`.

The groups are checked up front (:func:`validate_reward_method_args`, :func:`validate_vrcli_args`), with one
``error:`` line per problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from types import SimpleNamespace

from openrlhf_classmate.algo.vrcli_reward import check_ladder
from openrlhf_classmate.config_fields import add_dataclass_group
from openrlhf_classmate.integration.classmate_config import (
    REWARD_FUNC_PATH,
    classmate_enabled,
    log_resolved,
    registry_reward_in_use,
)
from openrlhf_classmate.rewards.darling import PARTITION_KINDS, DarlingConfig, DarlingRewardHook, classifier_urls
from openrlhf_classmate.rewards.likelihood import model_checksum
from openrlhf_classmate.rewards.vrcli import PENDING_REWARD_FUNC_PATH, VrcliConfig, check_dataset_baselines
from openrlhf_classmate.scoring.metrics import METRICS_ENV, VALIDATION_REWARD
from openrlhf_classmate.scoring.tinyv import GRADE_METRICS, TINYV_METRICS, TinyVConfig, tinyv_env

# DARLING options that only the pair classifier (the partition variants) reads.
CLASSIFIER_OPTIONS = ("classifier_urls", "classifier_model", "threshold", "cls_token", "sep_token", "max_len",
                      "short_answer_words", "pairs_per_request", "max_concurrency", "timeout_s", "max_retries",
                      "backoff_s", "diversity_floor")


def add_reward_method_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_group(parser, "tinyv", TinyVConfig)
    add_dataclass_group(parser, "darling", DarlingConfig)


def _fail(message: str) -> None:
    raise SystemExit(f"error: {message}")


def _defaults(cls) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)}


def _changed(ns: SimpleNamespace, cls, names=None) -> list[str]:
    defaults = _defaults(cls)
    return [name for name in (names or defaults) if getattr(ns, name) != defaults[name]]


def tinyv_config_from_args(args: SimpleNamespace) -> TinyVConfig | None:
    ns = getattr(args, "tinyv", None)
    if ns is None or not ns.base_url:
        return None
    return TinyVConfig(**{name: getattr(ns, name) for name in _defaults(TinyVConfig)})


def darling_config_from_args(args: SimpleNamespace) -> DarlingConfig | None:
    ns = getattr(args, "darling", None)
    if ns is None or ns.diversity == "none":
        return None
    return DarlingConfig(**{name: getattr(ns, name) for name in _defaults(DarlingConfig)})


def validate_reward_method_args(args: SimpleNamespace) -> None:
    _validate_tinyv(args)
    _validate_darling(args)


def _validate_tinyv(args: SimpleNamespace) -> None:
    ns = args.tinyv
    if not ns.base_url:
        changed = _changed(ns, TinyVConfig)
        if changed:
            _fail(f"--tinyv.{changed[0]} configures the TinyV verifier, which needs --tinyv.base_url "
                  "(e.g. http://127.0.0.1:8001/v1)")
        return
    try:
        cfg = tinyv_config_from_args(args)
    except ValueError as e:
        _fail(str(e))
    if cfg.mode == "tinyv_only" and cfg.weight != 1.0:
        _fail(f"--tinyv.weight {cfg.weight} has no effect with --tinyv.mode tinyv_only (reward = the verifier's "
              "verdict): use --tinyv.mode mixed for weight*V + (1-weight)*rule, or drop --tinyv.weight")
    if not registry_reward_in_use(args) and args.classmate.scorer == "auto":
        _fail("--tinyv.base_url configures the scorer registry's TinyV scorer, but --reward.remote_url replaces the "
              "registry as the reward: drop --reward.remote_url (or score classmate answers with --classmate.scorer "
              "tinyv)")


def _validate_darling(args: SimpleNamespace) -> None:
    ns = args.darling
    if ns.diversity == "none":
        changed = _changed(ns, DarlingConfig)
        if changed:
            _fail(f"--darling.{changed[0]} needs DARLING on: set --darling.diversity (partition, "
                  "partition_correct or ngram)")
        return
    if args.algo.advantage.estimator != "dr_grpo":
        _fail(f"DARLING's advantage is the group mean baseline without std division: set "
              f"--algo.advantage.estimator dr_grpo (got {args.algo.advantage.estimator})")
    if args.rollout.n_samples_per_prompt < 2:
        _fail("DARLING compares the responses of a prompt group: set --rollout.n_samples_per_prompt >= 2")
    if args.reward.model_name_or_path:
        _fail("DARLING combines the quality reward given at rollout time (--reward.remote_url or the scorer "
              "registry) with the diversity; --reward.model_name_or_path is scored later and is not supported")
    if args.train.async_enable:
        _fail("DARLING's reward hook runs in the synchronous trainer only: drop --train.async_enable")
    if ns.combine == "multiplicative":
        changed = _changed(ns, DarlingConfig, ("lambda_quality", "lambda_diversity"))
        if changed:
            _fail(f"--darling.{changed[0]} weighs the terms of --darling.combine additive or normalize_then_sum; "
                  "multiplicative (quality x diversity) has no weights")
    if ns.lambda_diversity == 0.0:
        _fail("--darling.lambda_diversity 0 leaves the quality alone: drop --darling.diversity for a quality-only run")
    if ns.diversity in PARTITION_KINDS:
        if ns.ngram_n != 4:
            _fail(f"--darling.ngram_n is read by --darling.diversity ngram only (got {ns.diversity})")
        urls = classifier_urls(ns)
        if not urls:
            _fail(f"--darling.diversity {ns.diversity} needs the pair classifier: --darling.classifier_urls URL "
                  "[URL ...] (or DARLING_CLASSIFIER_URLS; train_scripts/darling.sh starts the servers)")
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            _fail(f"--darling.classifier_urls must be http(s) URLs such as http://127.0.0.1:8010/v1, got {bad[0]!r}")
        checks = (
            (0.0 < ns.threshold < 1.0, f"--darling.threshold must be in (0, 1), got {ns.threshold}"),
            (0.0 <= ns.diversity_floor <= 1.0, f"--darling.diversity_floor must be in [0, 1], got {ns.diversity_floor}"),
            (ns.max_len >= 5, f"--darling.max_len must be >= 5, got {ns.max_len}"),
            (ns.short_answer_words >= 0, "--darling.short_answer_words must be >= 0"),
            (ns.pairs_per_request >= 1 and ns.max_concurrency >= 1, "--darling.pairs_per_request and "
                                                                    "--darling.max_concurrency must be >= 1"),
            (ns.timeout_s > 0 and ns.max_retries >= 0 and ns.backoff_s >= 0, "--darling.timeout_s must be > 0, "
             "--darling.max_retries and --darling.backoff_s >= 0"),
        )
        for ok, message in checks:
            if not ok:
                _fail(message)
    else:
        changed = _changed(ns, DarlingConfig, CLASSIFIER_OPTIONS)
        if changed:
            _fail(f"--darling.{changed[0]} is read by the partition variants (pair classifier) only; "
                  "--darling.diversity ngram does not use it")
        if ns.ngram_n < 1:
            _fail(f"--darling.ngram_n must be >= 1, got {ns.ngram_n}")


def validate_vrcli_args(args: SimpleNamespace) -> None:
    """Refuse what cannot work with the VR-CLI reward, before Ray starts; with ``--vrcli.baseline dataset`` also
    check the baselines of local jsonl datasets against the reference model."""
    v = args.vrcli
    if not v.enable:
        changed = _changed(v, VrcliConfig)
        if changed:
            _fail(f"--vrcli.{changed[0]} has no effect without --vrcli.enable")
        return
    if not args.algo.kl.init_coef > 0:
        _fail("--vrcli.enable scores plans with the reference model, which upstream creates only when "
              "--algo.kl.init_coef > 0: set it (the released runs used --algo.kl.init_coef 1e-6 with "
              "--algo.kl.use_loss --algo.kl.estimator k3)")
    if args.rollout.temperature != 1.0:
        _fail(f"--vrcli.enable with --rollout.temperature {args.rollout.temperature}: upstream's reference actor "
              "divides its logits by the rollout temperature, so the perplexities would be those of a tempered "
              "model; use --rollout.temperature 1.0 (the released runs did)")
    if args.train.agent_func_path or args.reward.model_name_or_path or (args.reward.remote_url or []) != [
            REWARD_FUNC_PATH]:
        _fail("--vrcli.enable computes the main reward itself: drop --reward.remote_url / "
              "--reward.model_name_or_path / --train.agent_func_path")
    if not args.data.label_key:
        _fail("--vrcli.enable reads the gold chapter and the datapoint from each row's label: set "
              "--data.label_key (label, for rows written by setup_data/vrcli_story.py)")
    if classmate_enabled(args):
        _fail("--vrcli.enable with a classmate is not supported: drop --classmate.model_name_or_path")
    if args.train.async_enable:
        _fail("--vrcli.enable needs the synchronous trainer (its experience maker runs the reward): drop "
              "--train.async_enable")
    if args.algo.dynamic_filtering_enable:
        _fail("--algo.dynamic_filtering_enable filters prompt groups on the rollout-time scores, before the VR-CLI "
              "reward exists: drop it")
    try:
        check_ladder(v.thresholds, v.ladder_rewards)
    except ValueError as e:
        _fail(f"--vrcli.thresholds / --vrcli.ladder_rewards: {e}")
    if v.micro_batch_size < 1:
        _fail("--vrcli.micro_batch_size must be >= 1")
    if v.max_tokens_per_forward < 0 or v.max_len < 0:
        _fail("--vrcli.max_tokens_per_forward and --vrcli.max_len must be >= 0 (0 = no limit)")
    args.reward.remote_url = [PENDING_REWARD_FUNC_PATH]
    log_resolved(f"--reward.remote_url {PENDING_REWARD_FUNC_PATH} (--vrcli.enable: the experience maker computes "
                 "the reward; the engines only mark it pending)")
    v.reference_checksum = None
    if v.baseline == "dataset":
        print(f"vrcli: checksum of the reference model {args.actor.model_name_or_path} (to check the datasets' "
              "precomputed baselines)", flush=True)
        try:
            v.reference_checksum = model_checksum(args.actor.model_name_or_path)
        except (OSError, ValueError) as e:
            _fail(f"--vrcli.baseline dataset: cannot checksum the reference model {args.actor.model_name_or_path} "
                  f"({e}); use --vrcli.baseline online")
        for flag, value in (("--data.prompt_dataset", args.data.prompt_dataset),
                            ("--eval.dataset", getattr(args.eval, "dataset", None))):
            for path in (value or "").split(","):
                if os.path.isfile(path) and path.endswith((".jsonl", ".json")):
                    problem = check_dataset_baselines(path, args.data.label_key, args.actor.model_name_or_path,
                                                      v.reference_checksum, args.ds.param_dtype)
                    if problem:
                        _fail(f"{flag} {problem}")


def reward_method_env(args: SimpleNamespace) -> dict[str, str]:
    """Environment for the engine-side reward function and the controller: the TinyV settings and the declared
    per-sample scorer metrics."""
    env: dict[str, str] = {}
    keys: list[str] = []
    cfg = tinyv_config_from_args(args)
    if cfg is not None:
        env.update(tinyv_env(cfg))
        keys += TINYV_METRICS
    if cfg is not None or getattr(args.classmate, "main_scorer", "auto") == "grade":
        keys += GRADE_METRICS
    if keys:
        env[METRICS_ENV] = json.dumps(keys)
    return env


def build_reward_hooks(args: SimpleNamespace, tokenizer=None) -> list:
    """The experience maker's group-level reward hooks of this run: DARLING (``--darling.diversity``) and VR-CLI
    (``--vrcli.enable``)."""
    hooks = []
    cfg = darling_config_from_args(args)
    if cfg is not None:
        hooks.append(DarlingRewardHook(cfg, args.rollout.n_samples_per_prompt))
    if getattr(getattr(args, "vrcli", None), "enable", False):
        from openrlhf_classmate.rewards.vrcli import build_vrcli_hook

        hooks.append(build_vrcli_hook(args, tokenizer))
    return hooks


def evaluate_with_validation_rewards(samples_generator) -> None:
    """Make this trainer's evaluation (upstream's ``generate_eval_samples`` of its own samples generator) score with
    :func:`use_validation_rewards`."""
    generate_eval_samples = samples_generator.generate_eval_samples

    def eval_samples(**kwargs):
        samples = generate_eval_samples(**kwargs)
        use_validation_rewards(samples)
        return samples

    samples_generator.generate_eval_samples = eval_samples


def use_validation_rewards(samples: list) -> None:
    """Evaluation scores each sample with its ``validation_reward`` where the reward function logged one (TinyV at
    weight 1), instead of its training reward."""
    for sample in samples:
        value = sample.info.get(VALIDATION_REWARD)
        if value is not None:
            sample.rewards = value.detach().clone().float().reshape(sample.rewards.shape)

"""The launcher's half of the ``--classmate.*`` and ``--engine.*`` flag groups (declared in
:mod:`~openrlhf_classmate.integration.classmate_config`): after parsing, :func:`resolve_classmate_args` fills in the
derived values (logging each one the user did not give), then :func:`validate_classmate_args` only checks."""

from __future__ import annotations

from types import SimpleNamespace

from openrlhf_classmate.algo.advantages import BASELINES
from openrlhf_classmate.integration.classmate_config import (
    SEPARATED_ESTIMATORS,
    EngineConfig,
    _fail,
    _group_dispatch_obstacle,
    classmate_enabled,
    classmate_engines_sleep,
    log_resolved,
    real_package,
    registry_reward_in_use,
)
from openrlhf_classmate.integration.launch.layout import resolve_placement


def resolve_classmate_args(args: SimpleNamespace) -> None:
    """Fill in the derived values of the ``--classmate.*`` / ``--engine.*`` groups (and the upstream flags they
    decide), logging each value set that the user did not give. Runs after upstream's post-processing, before
    :func:`validate_classmate_args`; checks nothing."""
    cfg = args.classmate
    enabled = classmate_enabled(args)
    for name in ("think_open", "think_close"):
        if not getattr(cfg, f"classmate_{name}"):
            setattr(cfg, f"classmate_{name}", getattr(cfg, name))
            if enabled:  # unused without a classmate: not worth a line
                log_resolved(f"--classmate.classmate_{name} {getattr(cfg, name)} (from --classmate.{name})")
    if args.engine.backend == "auto":
        args.engine.backend = "vllm" if real_package("vllm") else "hf"
        log_resolved(f"--engine.backend {args.engine.backend} (auto: vLLM is "
                     f"{'installed' if args.engine.backend == 'vllm' else 'not installed'})")
    if args.ds.packing_samples and args.ds.attn_implementation.startswith("flash_attention") and not real_package("flash_attn"):
        # no flash-attn (CPU, or a GPU image without it): transformers' sdpa attends within each packed sequence,
        # like flash-attn's varlen kernel, when the model gets restarting position_ids (checked in tests/test_packing)
        log_resolved(f"--ds.packing_samples without flash-attn installed: --ds.attn_implementation "
                     f"{args.ds.attn_implementation} -> sdpa (packed sequences stay separated by their position ids)")
        args.ds.attn_implementation = "sdpa"
    if cfg.loss_agg_mode in ("token-mean", "seq-mean-token-mean") and args.actor.loss_agg_mode != cfg.loss_agg_mode:
        args.actor.loss_agg_mode = cfg.loss_agg_mode  # upstream's PolicyLoss aggregates these itself
        log_resolved(f"--actor.loss_agg_mode {cfg.loss_agg_mode} (from --classmate.loss_agg_mode)")
    if not enabled:
        return
    if cfg.estimator is None:
        cfg.estimator = "gdpo"
        log_resolved("--classmate.estimator gdpo (the default with a classmate)")
    if cfg.max_context is None:
        cfg.max_context = args.data.max_len + cfg.max_new_tokens
        log_resolved(f"--classmate.max_context {cfg.max_context} (--data.max_len {args.data.max_len} + "
                     f"--classmate.max_new_tokens {cfg.max_new_tokens})")
    resolve_placement(args)  # auto: after the backend (HF engines take no GPU), before the checks of the placement


def validate_classmate_args(args: SimpleNamespace) -> None:
    """Check flag combinations up front (after :func:`resolve_classmate_args`); exits with one clear message naming
    the flags to change. Changes nothing."""
    cfg = args.classmate
    if args.actor.policy_loss_type == "gspo" and cfg.loss_agg_mode == "seq-mean-token-sum-norm":
        _fail("--actor.policy_loss_type gspo is a sequence-level objective (upstream aggregates it per sequence): "
              "drop --classmate.loss_agg_mode seq-mean-token-sum-norm")
    if cfg.loss_agg_mode == "seq-mean-token-sum-norm" and args.rollout.max_new_tokens is None:
        # T must be one constant: the padded width of a micro-batch would score the same response by prompt length
        _fail("--classmate.loss_agg_mode seq-mean-token-sum-norm divides each sequence's token sum by a fixed T = "
              "--rollout.max_new_tokens: set --rollout.max_new_tokens")
    _check_think_tags(args)
    engine = args.engine
    if engine.kv_cache_gib is not None and engine.backend == "hf":
        _fail("--engine.kv_cache_gib sizes vLLM's KV cache; the HF engines (--engine.backend hf) have none: drop it")
    if engine.backend == "hf":
        for name, what in (("profile_kv_cache", "vLLM's KV-cache profiling"),
                           ("cudagraph_max_size", "vLLM's CUDA-graph capture")):
            if getattr(engine, name) != getattr(EngineConfig, name):
                _fail(f"--engine.{name} sets {what}; the HF engines (--engine.backend hf) have none: drop it")
    if engine.kv_cache_gib is not None and engine.profile_kv_cache:
        _fail("--engine.kv_cache_gib fixes every engine's KV cache and --engine.profile_kv_cache lets vLLM size it by "
              "profiling: drop one of the two")
    if engine.no_mismatch_metrics:
        for name in ("mismatch_warn_threshold", "mismatch_interval"):
            if getattr(engine, name) != getattr(EngineConfig, name):
                _fail(f"--engine.{name} sets the mismatch metrics, which --engine.no_mismatch_metrics turns off: drop "
                      "one of the two")
    if not classmate_enabled(args):
        for name, default in (("estimator", None), ("loss", "auto"), ("scorer", "auto")):
            if getattr(cfg, name) != default:
                _fail(f"--classmate.{name} {getattr(cfg, name)} needs a classmate: set --classmate.model_name_or_path"
                      + (" (--classmate.main_scorer chooses the main answers' scorer)" if name == "scorer" else ""))
        return

    if cfg.final_answer == "whole_response":
        # the reward would score the whole response while the classmate reads the CoT: two different splits
        _fail("--classmate.final_answer whole_response is for policies without a think block, which give a "
              "classmate no CoT to read: drop it (the main answer is then the text after the think-close tag)")
    n_models = len(cfg.model_name_or_path)
    if cfg.weights is not None and len(cfg.weights) != n_models:
        _fail(f"--classmate.weights has {len(cfg.weights)} values for {n_models} classmate model(s)")
    if cfg.weights is not None and (min(cfg.weights) < 0 or sum(cfg.weights) <= 0):
        _fail("--classmate.weights must be non-negative with a positive sum")
    if not 0 < cfg.keep_min <= cfg.keep_max <= 1:
        _fail(f"need 0 < --classmate.keep_min <= --classmate.keep_max <= 1, got {cfg.keep_min}, {cfg.keep_max}")
    if cfg.samples < 1 or cfg.num_engines < 1 or cfg.max_new_tokens < 1:
        _fail("--classmate.samples, --classmate.num_engines and --classmate.max_new_tokens must be >= 1")
    if cfg.placement == "colocate" and not (args.train.colocate_actor_ref or args.train.colocate_all):
        _fail("--classmate.placement colocate needs --train.colocate_actor_ref or --train.colocate_all "
              "(there is no actor/ref placement group to join otherwise)")
    if cfg.placement == "share" and not (args.vllm.num_engines and args.vllm.num_engines > 0):
        _fail("--classmate.placement share needs policy engines (--vllm.num_engines > 0)")
    _check_placement_fits(args)
    if args.vllm.num_engines is None or args.vllm.num_engines < 1:
        _fail("classmate training needs policy rollout engines: set --vllm.num_engines >= 1")
    if args.rollout.n_samples_per_prompt < 2:
        _fail("classmate estimators normalise per prompt group: set --rollout.n_samples_per_prompt >= 2")
    if args.train.async_enable and classmate_engines_sleep(args):
        _fail("--train.async_enable overlaps rollouts with training, which vLLM sleep mode cannot (upstream refuses "
              "--vllm.enable_sleep with async too): use --classmate.placement separate or share without "
              "--classmate.enable_sleep")
    if cfg.dispatch == "group" and (obstacle := _group_dispatch_obstacle(args)):
        _fail(f"--classmate.dispatch group: {obstacle}; use --classmate.dispatch batch (or "
              "auto), or --classmate.placement separate / share without --classmate.enable_sleep")
    agg = cfg.loss_agg_mode or args.actor.loss_agg_mode
    if args.train.dynamic_batch_enable and agg == "seq-mean-token-sum-norm":
        _fail("--classmate.loss_agg_mode seq-mean-token-sum-norm scales the loss by the micro-batch size, which "
              "--train.dynamic_batch_enable varies per micro-batch: use token-mean / seq-mean-token-mean, or fixed "
              "micro-batches")
    if args.reward.model_name_or_path:
        _fail("classmate training needs the main rewards at rollout time, from a reward function or server "
              "(--reward.remote_url, or none for the scorer registry); --reward.model_name_or_path is not supported")
    _check_upstream_advantage_options(args)
    if args.train.agent_func_path and cfg.scorer == "auto":
        _fail("with --train.agent_func_path the main reward comes from the agent, which cannot score the classmate's "
              "answers: set --classmate.scorer to a scorer registry name (e.g. math_verify)")
    if cfg.loss == "vanilla_classmate":
        if cfg.estimator not in SEPARATED_ESTIMATORS:
            _fail("--classmate.loss vanilla_classmate needs separate main/classmate advantages: "
                  "--classmate.estimator separated (or separated_non_neg)")
        if cfg.prompt_mode != "splice":
            _fail("--classmate.loss vanilla_classmate needs the classmate's log-probs of the main CoT tokens, which "
                  "exist only with --classmate.prompt_mode splice")
        if n_models != 1 or cfg.samples != 1:
            _fail("--classmate.loss vanilla_classmate supports exactly one classmate model and --classmate.samples 1")
        if args.actor.policy_loss_type != "ppo":
            _fail("--classmate.loss vanilla_classmate is the reference's token-level two-ratio loss; "
                  "--actor.policy_loss_type gspo has no meaning there: use --classmate.loss separated with gspo")
    if cfg.prompt_mode == "splice":
        _check_splice_vocab(args)


def _check_think_tags(args: SimpleNamespace) -> None:
    """The tag pairs that split responses (classmate stage, after_think reward) and frame the classmate's prompt."""
    from openrlhf_classmate.algo.spans import think_tags_problem

    cfg = args.classmate
    pairs = []
    if classmate_enabled(args) or (registry_reward_in_use(args) and cfg.final_answer == "after_think"):
        pairs.append(("think", cfg.think_open, cfg.think_close))
    if classmate_enabled(args):
        pairs.append(("classmate_think", cfg.classmate_think_open, cfg.classmate_think_close))
    for name, open_tag, close_tag in pairs:
        problem = think_tags_problem(open_tag, close_tag)
        if problem:
            _fail(f"--classmate.{name}_open / --classmate.{name}_close: {problem}")


def _check_placement_fits(args: SimpleNamespace) -> None:
    """A classmate group joining another placement group needs one bundle (GPU) per engine rank there."""
    cfg = args.classmate
    if cfg.tensor_parallel_size < 1:
        _fail("--classmate.tensor_parallel_size must be >= 1")
    need = cfg.num_engines * cfg.tensor_parallel_size
    if cfg.placement == "share":
        have = args.vllm.num_engines * args.vllm.tensor_parallel_size
        where = (f"the policy engines' placement group ({have} GPUs = --vllm.num_engines {args.vllm.num_engines} x "
                 f"--vllm.tensor_parallel_size {args.vllm.tensor_parallel_size})")
    elif cfg.placement == "colocate":
        have = args.actor.num_nodes * args.actor.num_gpus_per_node
        where = (f"the actor/ref placement group ({have} GPUs = --actor.num_nodes {args.actor.num_nodes} x "
                 f"--actor.num_gpus_per_node {args.actor.num_gpus_per_node})")
    else:
        return
    if need > have:
        _fail(f"--classmate.placement {cfg.placement}: --classmate.num_engines {cfg.num_engines} x "
              f"--classmate.tensor_parallel_size {cfg.tensor_parallel_size} = {need} GPUs do not fit {where}; "
              "lower the classmate engines or use --classmate.placement separate")


# The per-stream baselines a classmate run can use: upstream's --algo.advantage.estimator names, same formulas
# (openrlhf_classmate.algo.advantages.BASELINES). The others have no per-prompt-group baseline.
CLASSMATE_UPSTREAM_ESTIMATORS = BASELINES
_REFUSED_UPSTREAM_ESTIMATORS = {
    "gae": "needs a critic; the classmate estimators are critic-free",
    "reinforce": "has no baseline (only batch whitening); use reinforce_baseline for a group baseline + whitening",
    "flash_reinforce": "uses one batch-wide baseline for single samples per prompt; use group_norm, dr_grpo or rloo",
}


def _check_upstream_advantage_options(args: SimpleNamespace) -> None:
    """Upstream advantage options in a classmate run: honoured as upstream defines them, or refused here."""
    advantage = args.algo.advantage
    estimator = advantage.estimator
    if estimator in _REFUSED_UPSTREAM_ESTIMATORS:
        _fail(f"--algo.advantage.estimator {estimator} {_REFUSED_UPSTREAM_ESTIMATORS[estimator]} "
              f"(with a classmate use one of {', '.join(CLASSMATE_UPSTREAM_ESTIMATORS)})")
    if estimator == "reinforce_baseline" and args.classmate.estimator == "separated_non_neg":
        _fail("--classmate.estimator separated_non_neg keeps the classmate advantage >= 0, which the batch whitening "
              "of --algo.advantage.estimator reinforce_baseline (centring over the batch) breaks: use group_norm, "
              "dr_grpo or rloo")
    if advantage.no_std_norm and estimator != "reinforce_baseline":
        _fail(f"--algo.advantage.no_std_norm has no effect with --algo.advantage.estimator {estimator} (upstream "
              "applies it to the batch whitening of reinforce_baseline only): use --algo.advantage.estimator "
              "dr_grpo for group-mean-only advantages")
    if advantage.gamma != 1.0:
        _fail(f"--algo.advantage.gamma {advantage.gamma}: the classmate estimators are outcome-level and upstream "
              f"resets gamma to 1 for {estimator}; drop --algo.advantage.gamma")
    if advantage.lambd != 1.0:
        _fail(f"--algo.advantage.lambd {advantage.lambd} is GAE's and has no effect without a critic; drop it")
    if args.reward.normalize_enable:
        _fail("--reward.normalize_enable normalises a reward model's output; a classmate run scores with a reward "
              "function or server (--reward.remote_url), so drop --reward.normalize_enable")


def _check_splice_vocab(args: SimpleNamespace) -> None:
    from transformers import AutoTokenizer

    from openrlhf_classmate.algo.classmate_prompt import check_splice_compatible

    main = AutoTokenizer.from_pretrained(args.actor.model_name_or_path, trust_remote_code=True)
    for path in args.classmate.model_name_or_path:
        classmate = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        try:
            check_splice_compatible(main, classmate)
        except ValueError as e:
            _fail(f"--classmate.prompt_mode splice with classmate {path}: {e}")

"""The ``--classmate.*`` and ``--engine.*`` flag groups: their dataclasses, resolution of derived values and up-front
validation.

Each field below becomes ``--classmate.<name>`` (``--engine.<name>`` for :class:`EngineConfig`) through
:func:`openrlhf_classmate.config_fields.add_dataclass_group`, which builds the flag's help from the
field's ``help``, ``range`` and default; the preflight enforces the same ``range`` (``preflight.RANGES``). After
upstream's ``hierarchize`` the values reach every Ray actor as ``strategy.args.classmate.<name>``.

After parsing, :func:`resolve_classmate_args` fills in the derived values (logging each one the user did not give),
then :func:`validate_classmate_args` only checks.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

from openrlhf_classmate.algo.advantages import BASELINES, ESTIMATORS, TOKEN_MODES
from openrlhf_classmate.algo.classmate_prompt import PROMPT_MODES
from openrlhf_classmate.algo.classmate_reward import CONDITIONS
from openrlhf_classmate.algo.losses import LOSS_AGG_MODES
from openrlhf_classmate.algo.spans import TRUNCATION_MODES
from openrlhf_classmate.config_fields import POSITIVE_INT, REQUEST_TIMEOUT_S, Bound, add_dataclass_group
from openrlhf_classmate.integration.layout import AUTO_RULE, resolve_placement

SEPARATED_ESTIMATORS = ("separated", "separated_non_neg")
LOSSES = ("auto", "separated", "vanilla_classmate")
PLACEMENTS = ("auto", "separate", "colocate", "share")
DISPATCH_MODES = ("auto", "group", "batch")
REWARD_FUNC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reward_func.py")


@dataclass
class ClassmateConfig:
    """Classmate chain-of-thought training. Without ``model_name_or_path`` the launcher trains exactly like upstream."""

    model_name_or_path: list[str] | None = field(
        default=None,
        metadata={"help": "Frozen classmate model(s), HF ids or local paths: each reads the policy's CoT and answers; "
                          "its score becomes the classmate reward. Setting it turns classmate training on (and makes "
                          "gdpo the default --classmate.estimator, group_norm the default "
                          "--algo.advantage.estimator); unset, the run is upstream's",
                  "default_help": "unset (no classmate)", "nargs": "+"},
    )
    num_engines: int = field(
        default=1, metadata={"help": "vLLM engines per classmate model (throughput of the classmate stage)",
                             "range": POSITIVE_INT}
    )
    tensor_parallel_size: int = field(
        default=1, metadata={"help": "Tensor-parallel size (GPUs) of each classmate engine; num_engines x this GPUs "
                                     "per classmate model must fit the placement (--classmate.placement)",
                             "range": POSITIVE_INT}
    )
    gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "Fraction of GPU memory a classmate vLLM engine reserves; where it shares GPUs with the "
                          "policy engines (placement share, or colocate with --train.colocate_all) its sum with "
                          "--vllm.gpu_memory_utilization must stay below 1 (checked at launch)",
                  "range": Bound(0, 1, lo_open=True)},
    )
    placement: str = field(
        default="auto",
        metadata={
            "help": "Where the classmate engines run. separate: GPUs of their own; colocate: the actor/ref placement "
            "group (needs --train.colocate_actor_ref or --train.colocate_all; forces --classmate.enable_sleep); "
            "share: the policy engines' GPUs (needs --vllm.num_engines > 0; awake through the step at "
            "--classmate.gpu_memory_utilization, so its generation runs during the rollout; what each costs: "
            "README); auto: "
            + AUTO_RULE + " (the choice is logged at launch; README 'Where the classmate runs')",
            "choices": PLACEMENTS,
        },
    )
    enable_sleep: bool = field(
        default=False,
        metadata={"help": "Put the classmate engines to sleep (vLLM sleep mode) between classmate stages, freeing "
                          "their memory for training; forced on for placement colocate; not with --train.async_enable"},
    )
    dispatch: str = field(
        default="auto",
        metadata={"help": "When the classmate requests are sent: group (each prompt group's as soon as its rollouts "
                          "are generated, so the classmate generates while the policy engines are still busy with "
                          "the other groups), batch (all at once after the whole rollout batch), auto (group where "
                          "the classmate engines are awake during the rollout: placement separate, or share "
                          "without --classmate.enable_sleep, and no --rollout.vllm_generate_batch_size above "
                          "--rollout.batch_size; batch otherwise)",
                  "choices": DISPATCH_MODES},
    )
    max_context: int | None = field(
        default=None,
        metadata={"help": "max_model_len of the classmate engines (prompt + CoT + answer); must exceed "
                          "--classmate.max_new_tokens",
                  "default_help": "--data.max_len + --classmate.max_new_tokens",
                  "range": Bound(lo=2, none_ok=True)},
    )
    max_new_tokens: int = field(
        default=512, metadata={"help": "Most tokens of one classmate answer; a longer answer is cut and scored as is",
                               "range": POSITIVE_INT}
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature of the classmate answers; 0 = greedy", "range": Bound(0, 2)}
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "Nucleus sampling of the classmate answers: sample from the smallest set of tokens whose "
                          "probability reaches top_p; 1 = the full distribution. Combines with --classmate.top_k "
                          "(both filters apply) and --classmate.temperature (applied first)",
                  "range": Bound(0, 1, lo_open=True)},
    )
    top_k: int = field(
        default=-1,
        metadata={"help": "Sample the classmate answers from the k most likely tokens only; -1 = off",
                  "range": Bound(lo=-1)},
    )
    samples: int = field(
        default=1, metadata={"help": "Answers S sampled per classmate model and CoT; a response's classmate score is "
                                     "the mean over its valid samples", "range": POSITIVE_INT}
    )
    weights: list[float] | None = field(
        default=None,
        metadata={"help": "Weight of each classmate model in the classmate reward, one per --classmate."
                          "model_name_or_path, non-negative with a positive sum (renormalised over the models that "
                          "scored)", "default_help": "uniform", "nargs": "+", "range": Bound(lo=0, none_ok=True)},
    )
    reward_weight: float = field(
        default=1.0, metadata={"help": "lambda: multiplies the weighted classmate score to give the classmate reward "
                                       "(before --classmate.condition)", "range": Bound()}
    )
    condition: str = field(
        default="always",
        metadata={"help": "Classmate reward given the main reward R^m (incorrect: R^m <= 0): always; "
                          "no_classmate_when_main_incorrect (0 then); neg_classmate_when_main_incorrect (negated "
                          "then); no_classmate (always 0: the main reward alone, for ablations)",
                  "choices": CONDITIONS},
    )
    truncation: str = field(
        default="vanilla",
        metadata={"help": "How much of the CoT the classmate sees: vanilla (all of it); random_truncate (a prefix, a "
                          "fraction in [--classmate.keep_min, --classmate.keep_max] drawn per response); "
                          "remove_wo_cot (all of it; responses with an empty CoT get no classmate call)",
                  "choices": TRUNCATION_MODES},
    )
    keep_min: float = field(
        default=0.1, metadata={"help": "random_truncate: lower bound of the kept CoT fraction (<= --classmate."
                                       "keep_max)", "range": Bound(0, 1, lo_open=True)}
    )
    keep_max: float = field(
        default=0.9, metadata={"help": "random_truncate: upper bound of the kept CoT fraction (>= --classmate."
                                       "keep_min)", "range": Bound(0, 1, lo_open=True)}
    )
    prompt_mode: str = field(
        default="retokenize",
        metadata={
            "help": "retokenize: decode the CoT and encode it with the classmate tokenizer; splice: reuse the main "
            "token ids (identical vocabularies only, checked at launch; needed by --classmate.loss "
            "vanilla_classmate)",
            "choices": PROMPT_MODES,
        },
    )
    final_answer: str = field(
        default="after_think",
        metadata={"help": "What the main reward scores: what follows the think-close tag's token id (a response "
                          "without one has no answer and scores 0), or the whole response (non-thinking policies; "
                          "not with a classmate)",
                  "choices": ("after_think", "whole_response")},
    )
    think_open: str = field(default="<think>", metadata={"help": "Tag opening the main model's CoT (one token of "
                                                                  "the policy tokenizer, checked at launch)"})
    think_close: str = field(default="</think>", metadata={"help": "Tag closing the main model's CoT (one token of "
                                                                    "the policy tokenizer, checked at launch)"})
    classmate_think_open: str | None = field(
        default=None, metadata={"help": "Think-open tag written around the CoT in the classmate prompt",
                                "default_help": "--classmate.think_open"}
    )
    classmate_think_close: str | None = field(
        default=None, metadata={"help": "Think-close tag written around the CoT in the classmate prompt",
                                "default_help": "--classmate.think_close"}
    )
    estimator: str | None = field(
        default=None,
        metadata={"help": "How the main and classmate rewards become advantages. grpo: one baseline of their sum; "
                          "grpo_w_classmate: that advantage on the tokens of --classmate.token_mode, the main advantage "
                          "elsewhere; gdpo: per-stream "
                          "baselines, weighted (--classmate.gdpo_weights) and batch-normalised; gdpo_wo_bn: without "
                          "the batch normalisation; separated / separated_non_neg: two advantage streams (the "
                          "classmate's clipped at 0 in the latter) trained by the two-term loss. The per-stream "
                          "baseline is --algo.advantage.estimator's",
                  "default_help": "gdpo with a classmate", "choices": ESTIMATORS},
    )
    gdpo_weights: list[float] = field(
        default_factory=lambda: [1.0, 1.0],
        metadata={"help": "gdpo / gdpo_wo_bn: weights (w_main, w_classmate) of the two advantage streams; not all "
                          "zero", "nargs": 2, "range": Bound()},
    )
    token_mode: str = field(
        default="classmate_partial",
        metadata={"help": "Tokens the classmate advantage applies to: classmate_partial (the CoT only; the answer "
                          "gets the main advantage) or all (the whole response)", "choices": TOKEN_MODES},
    )
    loss: str = field(
        default="auto",
        metadata={
            "help": "auto: two-term separated loss for separated estimators, upstream PolicyLoss otherwise; "
            "separated: the two-term loss always; vanilla_classmate: the reference two-ratio loss (reproduction "
            "only: needs --classmate.estimator separated*, --classmate.prompt_mode splice, one classmate, "
            "--classmate.samples 1)",
            "choices": LOSSES,
        },
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={"help": "Overrides --actor.loss_agg_mode, adding the reference's seq-mean-token-sum-norm (also "
                          "without a classmate; its T is --rollout.max_new_tokens, which it needs; not with "
                          "--train.dynamic_batch_enable or policy_loss_type gspo)",
                  "default_help": "--actor.loss_agg_mode", "choices": LOSS_AGG_MODES},
    )
    eps_clip_low_high: list[float] = field(
        default_factory=lambda: [0.4, 0.4],
        metadata={"help": "Clip range (low, high) of the classmate PPO term's ratio: [1 - low, 1 + high]",
                  "nargs": 2, "range": Bound(lo=0, lo_open=True)},
    )
    dual_clip: float | None = field(
        default=None, metadata={"help": "Dual-clip constant c of the classmate PPO term (bounds the loss of "
                                        "negative advantages by c x the advantage)",
                                "default_help": "unset (off)", "range": Bound(lo=1, lo_open=True, none_ok=True)}
    )
    scorer: str = field(
        default="auto",
        metadata={"help": "How classmate answers are scored. auto: by the same reward path as the main answers "
                          "(--reward.remote_url function or server, else the scorer registry); a registry name "
                          "(e.g. math_verify): that registry scorer, whatever scores the main answers (required "
                          "with --train.agent_func_path)"},
    )
    main_scorer: str = field(
        default="auto",
        metadata={"help": "Registry scorer for the main answers when the scorer registry is the reward (no "
                          "--reward.remote_url): auto = the label's data_source, or a registry name that "
                          "overrides it for every row (with or without a classmate)"},
    )
    stop_after_invalid_steps: int = field(
        default=3,
        metadata={"help": "A step whose main scores are all invalid (judge down, unparsable outputs) is skipped "
                          "with a warning; if the first N steps of a run are all skipped, the run stops with an "
                          "error (0 = never stop). With --algo.dynamic_filtering_enable, every --rollout.batch_size "
                          "prompt groups dropped for having no valid score count as one such step. Applies with or "
                          "without a classmate. The classmate stream likewise: a run whose first N steps with "
                          "classmate answers scored every one of them invalid stops (steps whose classmate requests "
                          "were all skipped do not count)", "range": Bound(lo=0)},
    )
    stop_after_nonfinite_skips: int = field(
        default=5,
        metadata={"help": "A policy update whose rewards, advantages, loss or gradient norm hold a non-finite value "
                          "is skipped (weights, optimizer state and learning-rate schedule unchanged; one warning "
                          "line; counted in train/nonfinite_skipped); after N consecutive skipped updates the run "
                          "stops with an error (0 = never stop). Applies with or without a classmate",
                  "range": Bound(lo=0)},
    )
    seed_offset: int = field(
        default=10_000, metadata={"help": "Classmate engine seeds start at --train.seed + this (keeps them apart "
                                          "from the policy engines' seeds)", "range": Bound(lo=0)}
    )
    seed_requests: bool = field(
        default=False,
        metadata={"help": "Give every classmate request a seed of its own (drawn from --train.seed), so that an answer "
                          "depends on its input and seed only, never on what it was batched with. Off (as upstream's "
                          "policy rollouts): the classmate engines sample from their engine seed. Cost when on: vLLM "
                          "draws the sampling noise of each seeded request in a separate kernel launch on a "
                          "vocabulary-wide row, at every decode step (its sampler's per-request loop), where "
                          "unseeded requests share one launch"},
    )
    judge_base_url: str | None = field(
        default=None, metadata={"help": "OpenAI-compatible judge endpoint (e.g. http://host:8000/v1) for the judge "
                                        "scorers (data sources scored by an LLM judge, main or classmate answers)"}
    )
    judge_model: str | None = field(
        default=None, metadata={"help": "Model name sent to the judge endpoint (needs --classmate.judge_base_url)"}
    )
    judge_api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "Environment variable holding the judge API key (unset or empty: "
                                                    "no key is sent)"}
    )
    judge_timeout_s: float = field(
        default=60.0, metadata={"help": "Seconds one judge request may take (connect + answer); a timed-out request "
                                        "is not retried and its score is invalid (masked)",
                                "range": REQUEST_TIMEOUT_S})
    judge_max_retries: int = field(
        default=3, metadata={"help": "Retries of a judge request after a connection error, HTTP 5xx or 429 "
                                     "(exponential backoff from 0.5 s); then its score is invalid",
                             "range": Bound(lo=0)})
    judge_max_concurrency: int = field(
        default=32, metadata={"help": "Judge requests in flight at once, per process (each rollout engine scoring "
                                      "main answers, and the controller scoring classmate answers)",
                              "range": POSITIVE_INT})


@dataclass
class EngineConfig:
    """Generation engines of both groups (policy and classmate)."""

    backend: str = field(
        default="auto",
        metadata={"help": "vllm, hf (transformers generate; CPU, tests, debugging) or auto (vllm if importable)",
                  "choices": ("auto", "vllm", "hf")},
    )
    hf_max_batch: int = field(
        default=64, metadata={"help": "hf backend: most requests batched in one generate call (memory vs speed)",
                              "range": POSITIVE_INT}
    )
    kv_cache_gib: float | None = field(
        default=None,
        metadata={"help": "vllm backend: a fixed KV-cache size in GiB for every engine, policy and classmate (vLLM's "
                          "kv_cache_memory_bytes). vLLM then skips its start-up profiling of the GPU's free memory, "
                          "which another process allocating on the same GPU corrupts; so engine groups sharing a GPU "
                          "start together instead of one after the other, and two runs may share one GPU. "
                          "--vllm.gpu_memory_utilization / --classmate.gpu_memory_utilization must still be free "
                          "when each engine starts",
                  "default_help": "unset (vLLM sizes the cache by profiling)",
                  "range": Bound(lo=0, lo_open=True, none_ok=True)},
    )
    no_mismatch_metrics: bool = field(
        default=False,
        metadata={"help": "turn off the train-inference mismatch metrics (mismatch/logprob_abs_diff_mean, "
                          "_max, mismatch/kl_k3: the policy engines' log-probs of the sampled tokens against the "
                          "actor's). On, each rollout request asks the engine for the sampled token's log-prob only, "
                          "with one final output per request and (without --train.agent_func_path) no detokenised "
                          "text; off, upstream's request is sent unchanged. Its cost is vLLM's per-token log-prob "
                          "path in Python, measured in README, 'Train-inference mismatch'"},
    )
    mismatch_interval: int = field(
        default=5,
        metadata={"help": "the policy engines return the sampled tokens' log-probs for the mismatch metrics on steps "
                          "1 and 2 (the first load of the weights and the first sync), then on every N-th step (1: "
                          "every step). A measured step asks for every request's log-probs, so each reading covers "
                          "a whole rollout batch (the same population every time, and vLLM's log-softmax over its "
                          "running batch is paid only then); the steps in between ask for none, as upstream's "
                          "request does, and log no mismatch/* values. With --algo.advantage.is_correction_level "
                          "upstream asks for them on every step, and every step is measured",
                  "range": POSITIVE_INT},
    )
    weight_sync_bucket_mb: int = field(
        default=512,
        metadata={"help": "vllm backend with --train.colocate_all (CUDA IPC): the actor sends its weights to the "
                          "policy engines in buckets of at most this many MiB, one IPC handle and one engine call per "
                          "bucket, instead of upstream's one per parameter (integration/weight_sync.py). Each bucket "
                          "is one extra buffer on each actor GPU while it is sent. 0: upstream's per-parameter sync",
                  "range": Bound(lo=0)},
    )
    mismatch_warn_threshold: float = field(
        default=0.1,
        metadata={"help": "one warning line naming the step when mismatch/logprob_abs_diff_mean (nats per response "
                          "token) exceeds this. Engines in bf16 on the trained weights stay well below it (README: the "
                          "levels measured); engines that missed weight syncs drift above it as the policy moves, and "
                          "weights that never arrived, or arrived corrupted or in part, give values near 1",
                  "range": Bound(lo=0, lo_open=True)},
    )


def add_classmate_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_group(parser, "classmate", ClassmateConfig)
    add_dataclass_group(parser, "engine", EngineConfig)


@functools.lru_cache(maxsize=64)
def is_registry_reward_func(url: str) -> bool:
    """Whether ``url`` names our scorer-registry reward function: ``REWARD_FUNC_PATH`` by any path (relative, through a
    symlink), or a byte-identical copy of it (a second checkout, whose path a Ray worker importing the first one's
    package would not recognise)."""
    if not os.path.isfile(url):
        return False
    if os.path.realpath(url) == os.path.realpath(REWARD_FUNC_PATH):
        return True
    with open(url, "rb") as mine, open(REWARD_FUNC_PATH, "rb") as ours:
        return mine.read() == ours.read()


def registry_reward_in_use(args: SimpleNamespace) -> bool:
    """True when the main reward is our scorer-registry reward function (the launcher's default)."""
    urls = getattr(args.reward, "remote_url", None) or []
    return any(is_registry_reward_func(url) for url in ([urls] if isinstance(urls, str) else urls))


def classmate_enabled(args: SimpleNamespace) -> bool:
    return bool(getattr(getattr(args, "classmate", None), "model_name_or_path", None))


def uses_separated_loss(args: SimpleNamespace) -> bool:
    cfg = args.classmate
    return classmate_enabled(args) and (cfg.loss == "vanilla_classmate" or cfg.estimator in SEPARATED_ESTIMATORS)


def _group_dispatch_obstacle(args: SimpleNamespace) -> str | None:
    """Why the classmate requests cannot be sent per prompt group in this run (None: they can)."""
    cfg = args.classmate
    if cfg.placement == "colocate" or cfg.enable_sleep:
        return ("the classmate engines sleep during the rollout (--classmate.placement colocate or "
                "--classmate.enable_sleep)")
    generate = getattr(args.rollout, "vllm_generate_batch_size", None)
    if generate and generate > args.rollout.batch_size:
        return (f"--rollout.vllm_generate_batch_size {generate} > --rollout.batch_size {args.rollout.batch_size} "
                "generates groups for later steps")
    return None


def dispatch_per_group(args: SimpleNamespace) -> bool:
    """``--classmate.dispatch`` resolved: send each prompt group's classmate requests as soon as it is generated."""
    mode = getattr(args.classmate, "dispatch", "auto")
    return classmate_enabled(args) and mode != "batch" and _group_dispatch_obstacle(args) is None


def real_package(package: str) -> bool:
    """True when ``package`` is really installed (not our CPU import shim)."""
    import importlib.util

    from openrlhf_classmate import shims

    spec = importlib.util.find_spec(package)
    return spec is not None and not (spec.origin or "").startswith(shims.SHIM_DIRS[package])


def _fail(message: str) -> None:
    raise SystemExit(f"error: {message}")


def log_resolved(message: str) -> None:
    """One stderr line for a value the launcher set that the user did not give."""
    print(f"[openrlhf_classmate] {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """One stderr line for a problem the run survives (Ray forwards an actor's stderr to the driver's)."""
    print(f"[openrlhf_classmate] warning: {message}", file=sys.stderr, flush=True)


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
    if args.train.async_enable and (cfg.placement == "colocate" or cfg.enable_sleep):
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

"""The ``--classmate.*`` and ``--engine.*`` flag groups: one dataclass, its docstrings, and up-front validation.

Each field below becomes ``--classmate.<name>`` (``--engine.<name>`` for :class:`EngineConfig`); after upstream's
``hierarchize`` the values reach every Ray actor as ``strategy.args.classmate.<name>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from openrlhf_classmate.algo.advantages import BASELINES, ESTIMATORS, TOKEN_MODES
from openrlhf_classmate.algo.classmate_prompt import PROMPT_MODES
from openrlhf_classmate.algo.classmate_reward import CONDITIONS
from openrlhf_classmate.algo.spans import TRUNCATION_MODES

SEPARATED_ESTIMATORS = ("separated", "separated_non_neg")
LOSSES = ("auto", "separated", "vanilla_classmate")
PLACEMENTS = ("separate", "colocate", "share")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
REWARD_FUNC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reward_func.py")


@dataclass
class ClassmateConfig:
    """Classmate chain-of-thought training. Without ``model_name_or_path`` the launcher trains exactly like upstream."""

    model_name_or_path: list[str] | None = field(
        default=None, metadata={"help": "Frozen classmate model(s): HF ids or local paths (one or more)", "nargs": "+"}
    )
    num_engines: int = field(default=1, metadata={"help": "Classmate engines (per classmate model)"})
    tensor_parallel_size: int = field(default=1, metadata={"help": "Tensor-parallel size of each classmate engine"})
    gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "vLLM memory fraction of a classmate engine (sum with the policy's below 1 when GPUs are shared)"}
    )
    placement: str = field(
        default="separate",
        metadata={
            "help": "separate: own GPUs; colocate: the actor/ref placement group (needs --train.colocate_actor_ref "
            "or --train.colocate_all); share: the policy engines' GPUs",
            "choices": PLACEMENTS,
        },
    )
    enable_sleep: bool = field(
        default=False, metadata={"help": "Sleep the classmate engines between steps (vLLM sleep mode; forced on for colocate)"}
    )
    max_context: int | None = field(
        default=None, metadata={"help": "Classmate max_model_len; default --data.max_len + --classmate.max_new_tokens"}
    )
    max_new_tokens: int = field(default=512, metadata={"help": "Max tokens of a classmate answer"})
    temperature: float = field(default=1.0, metadata={"help": "Classmate sampling temperature (0 = greedy)"})
    top_p: float = field(default=1.0, metadata={"help": "Classmate nucleus sampling"})
    top_k: int = field(default=-1, metadata={"help": "Classmate top-k (-1 = off)"})
    samples: int = field(default=1, metadata={"help": "Answers sampled per classmate model and CoT (S)"})
    weights: list[float] | None = field(
        default=None, metadata={"help": "Weight of each classmate model in the classmate reward (default uniform)", "nargs": "+"}
    )
    reward_weight: float = field(default=1.0, metadata={"help": "lambda: multiplies the averaged classmate score"})
    condition: str = field(
        default="always", metadata={"help": "Classmate reward given the main reward", "choices": CONDITIONS}
    )
    truncation: str = field(
        default="vanilla", metadata={"help": "How much of the CoT the classmate sees", "choices": TRUNCATION_MODES}
    )
    keep_min: float = field(default=0.1, metadata={"help": "random_truncate: lower bound of the kept CoT fraction"})
    keep_max: float = field(default=0.9, metadata={"help": "random_truncate: upper bound of the kept CoT fraction"})
    prompt_mode: str = field(
        default="retokenize",
        metadata={
            "help": "retokenize: decode the CoT and encode it with the classmate tokenizer; splice: reuse the main "
            "token ids (identical vocabularies only)",
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
    think_open: str = field(default="<think>", metadata={"help": "Tag opening the main model's CoT"})
    think_close: str = field(default="</think>", metadata={"help": "Tag closing the main model's CoT"})
    classmate_think_open: str | None = field(
        default=None, metadata={"help": "Think-open tag in the classmate prompt (default: --classmate.think_open)"}
    )
    classmate_think_close: str | None = field(
        default=None, metadata={"help": "Think-close tag in the classmate prompt (default: --classmate.think_close)"}
    )
    estimator: str | None = field(
        default=None,
        metadata={"help": "Advantage estimator (default gdpo when a classmate model is set)", "choices": ESTIMATORS},
    )
    gdpo_weights: list[float] = field(
        default_factory=lambda: [1.0, 1.0], metadata={"help": "gdpo: weights (w_main, w_classmate)", "nargs": 2}
    )
    token_mode: str = field(
        default="classmate_partial",
        metadata={"help": "Where the classmate advantage applies: CoT tokens only, or all", "choices": TOKEN_MODES},
    )
    loss: str = field(
        default="auto",
        metadata={
            "help": "auto: two-term separated loss for separated estimators, upstream PolicyLoss otherwise; "
            "vanilla_classmate: the reference two-ratio loss (reproduction only)",
            "choices": LOSSES,
        },
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={"help": "Overrides --actor.loss_agg_mode, adding the reference's seq-mean-token-sum-norm (also "
                          "without a classmate)", "choices": LOSS_AGG_MODES},
    )
    eps_clip_low_high: list[float] = field(
        default_factory=lambda: [0.4, 0.4], metadata={"help": "Clip range of the classmate PPO term", "nargs": 2}
    )
    dual_clip: float | None = field(default=None, metadata={"help": "Dual-clip constant of the classmate PPO term"})
    scorer: str = field(
        default="auto",
        metadata={"help": "How classmate answers are scored. auto (default): by the same reward path as the main "
                          "answers (--reward.remote_url function or server, else the scorer registry); a registry "
                          "name (e.g. math_verify): that registry scorer, whatever scores the main answers"},
    )
    main_scorer: str = field(
        default="auto",
        metadata={"help": "Registry scorer for the main answers when the scorer registry is the reward (no "
                          "--reward.remote_url): auto (default) = the label's data_source, or a registry name that "
                          "overrides it for every row (with or without a classmate)"},
    )
    stop_after_invalid_steps: int = field(
        default=3,
        metadata={"help": "A step whose main scores are all invalid (judge down, unparsable outputs) is skipped "
                          "with a warning; if the first N steps of a run are all skipped, the run stops with an "
                          "error (0 = never stop). Applies with or without a classmate. Default 3"},
    )
    seed_offset: int = field(default=10_000, metadata={"help": "Classmate engine seeds start at --train.seed + this"})
    judge_base_url: str | None = field(
        default=None, metadata={"help": "OpenAI-compatible judge endpoint (e.g. http://host:8000/v1) for judge scorers"}
    )
    judge_model: str | None = field(default=None, metadata={"help": "Judge model name"})
    judge_api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "Env var holding the judge API key"})
    judge_timeout_s: float = field(
        default=60.0, metadata={"help": "Seconds one judge request may take (connect + answer); a timed-out request "
                                        "is not retried and its score is invalid (masked). > 0; default 60"})
    judge_max_retries: int = field(
        default=3, metadata={"help": "Retries of a judge request after a connection error, HTTP 5xx or 429 "
                                     "(exponential backoff from 0.5 s); then its score is invalid. >= 0; default 3"})
    judge_max_concurrency: int = field(
        default=32, metadata={"help": "Judge requests in flight at once, per process (each rollout engine scoring "
                                      "main answers, and the controller scoring classmate answers). >= 1; default 32"})


@dataclass
class EngineConfig:
    """Generation engines of both groups (policy and classmate)."""

    backend: str = field(
        default="auto",
        metadata={"help": "vllm, hf (transformers generate; CPU, tests, debugging) or auto (vllm if importable)",
                  "choices": ("auto", "vllm", "hf")},
    )
    hf_max_batch: int = field(default=64, metadata={"help": "hf backend: max requests batched in one generate call"})


def _add_group(parser: argparse.ArgumentParser, prefix: str, cls: type) -> None:
    group = parser.add_argument_group(f"{prefix} ({cls.__doc__.splitlines()[0]})")
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"default": default, "help": meta.pop("help")}
        if f.type == "bool":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = {"int": int, "float": float}.get(f.type.split(" ")[0], None) or _element_type(f.type)
            kwargs.update(meta)
        group.add_argument(f"--{prefix}.{f.name}", **kwargs)


def _element_type(type_name: str):
    if "float" in type_name:
        return float
    if type_name.startswith("int"):
        return int
    return str


def add_classmate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_group(parser, "classmate", ClassmateConfig)
    _add_group(parser, "engine", EngineConfig)


def registry_reward_in_use(args: SimpleNamespace) -> bool:
    """True when the main reward is our scorer-registry reward function (the launcher's default)."""
    urls = getattr(args.reward, "remote_url", None) or []
    return REWARD_FUNC_PATH in urls


def classmate_enabled(args: SimpleNamespace) -> bool:
    return bool(getattr(getattr(args, "classmate", None), "model_name_or_path", None))


def uses_separated_loss(args: SimpleNamespace) -> bool:
    c = args.classmate
    return classmate_enabled(args) and (c.loss == "vanilla_classmate" or c.estimator in SEPARATED_ESTIMATORS)


def _real(package: str) -> bool:
    """True when ``package`` is really installed (not our CPU import shim)."""
    import importlib.util

    from openrlhf_classmate import shims

    spec = importlib.util.find_spec(package)
    return spec is not None and not (spec.origin or "").startswith(shims.SHIM_DIRS[package])


def _fail(message: str) -> None:
    raise SystemExit(f"error: {message}")


def validate_classmate_args(args: SimpleNamespace) -> None:
    """Check flag combinations up front; exits with one clear message naming the flags to change."""
    c = args.classmate
    enabled = classmate_enabled(args)
    c.classmate_think_open = c.classmate_think_open or c.think_open
    c.classmate_think_close = c.classmate_think_close or c.think_close
    if args.engine.backend == "auto":
        args.engine.backend = "vllm" if _real("vllm") else "hf"

    if args.ds.packing_samples and args.ds.attn_implementation.startswith("flash_attention") and not _real("flash_attn"):
        # no flash-attn (CPU, or a GPU image without it): transformers' sdpa attends within each packed sequence,
        # like flash-attn's varlen kernel, when the model gets restarting position_ids (checked in tests/test_packing)
        print(f"[openrlhf_classmate] --ds.packing_samples without flash-attn installed: --ds.attn_implementation "
              f"{args.ds.attn_implementation} -> sdpa (packed sequences stay separated by their position ids)")
        args.ds.attn_implementation = "sdpa"
    if c.loss_agg_mode in ("token-mean", "seq-mean-token-mean"):
        args.actor.loss_agg_mode = c.loss_agg_mode  # upstream's PolicyLoss aggregates these itself
    if args.actor.policy_loss_type == "gspo" and c.loss_agg_mode == "seq-mean-token-sum-norm":
        _fail("--actor.policy_loss_type gspo is a sequence-level objective (upstream aggregates it per sequence): "
              "drop --classmate.loss_agg_mode seq-mean-token-sum-norm")
    if not enabled:
        for name, default in (("estimator", None), ("loss", "auto"), ("scorer", "auto")):
            if getattr(c, name) != default:
                _fail(f"--classmate.{name} {getattr(c, name)} needs a classmate: set --classmate.model_name_or_path"
                      + (" (--classmate.main_scorer chooses the main answers' scorer)" if name == "scorer" else ""))
        return

    c.estimator = c.estimator or "gdpo"
    if c.final_answer == "whole_response":
        # the reward would score the whole response while the classmate reads the CoT: two different splits
        _fail("--classmate.final_answer whole_response is for policies without a think block, which give a "
              "classmate no CoT to read: drop it (the main answer is then the text after the think-close tag)")
    n_models = len(c.model_name_or_path)
    if c.weights is not None and len(c.weights) != n_models:
        _fail(f"--classmate.weights has {len(c.weights)} values for {n_models} classmate model(s)")
    if c.weights is not None and (min(c.weights) < 0 or sum(c.weights) <= 0):
        _fail("--classmate.weights must be non-negative with a positive sum")
    if not 0 < c.keep_min <= c.keep_max <= 1:
        _fail(f"need 0 < --classmate.keep_min <= --classmate.keep_max <= 1, got {c.keep_min}, {c.keep_max}")
    if c.samples < 1 or c.num_engines < 1 or c.max_new_tokens < 1:
        _fail("--classmate.samples, --classmate.num_engines and --classmate.max_new_tokens must be >= 1")
    if c.placement == "colocate" and not (args.train.colocate_actor_ref or args.train.colocate_all):
        _fail("--classmate.placement colocate needs --train.colocate_actor_ref or --train.colocate_all "
              "(there is no actor/ref placement group to join otherwise)")
    if c.placement == "share" and not (args.vllm.num_engines and args.vllm.num_engines > 0):
        _fail("--classmate.placement share needs policy engines (--vllm.num_engines > 0)")
    _check_placement_fits(args)
    if c.max_context is None:
        c.max_context = args.data.max_len + c.max_new_tokens
    if args.vllm.num_engines is None or args.vllm.num_engines < 1:
        _fail("classmate training needs policy rollout engines: set --vllm.num_engines >= 1")
    if args.rollout.n_samples_per_prompt < 2:
        _fail("classmate estimators normalise per prompt group: set --rollout.n_samples_per_prompt >= 2")
    if args.train.async_enable and (c.placement == "colocate" or c.enable_sleep):
        _fail("--train.async_enable overlaps rollouts with training, which vLLM sleep mode cannot (upstream refuses "
              "--vllm.enable_sleep with async too): use --classmate.placement separate or share without "
              "--classmate.enable_sleep")
    agg = c.loss_agg_mode or args.actor.loss_agg_mode
    if args.train.dynamic_batch_enable and agg == "seq-mean-token-sum-norm":
        _fail("--classmate.loss_agg_mode seq-mean-token-sum-norm scales the loss by the micro-batch size, which "
              "--train.dynamic_batch_enable varies per micro-batch: use token-mean / seq-mean-token-mean, or fixed "
              "micro-batches")
    if args.reward.model_name_or_path:
        _fail("classmate training needs the main rewards at rollout time, from a reward function or server "
              "(--reward.remote_url, or none for the scorer registry); --reward.model_name_or_path is not supported")
    _check_upstream_advantage_options(args)
    if args.train.agent_func_path and c.scorer == "auto":
        _fail("with --train.agent_func_path the main reward comes from the agent, which cannot score the classmate's "
              "answers: set --classmate.scorer to a scorer registry name (e.g. math_verify)")
    if c.loss == "vanilla_classmate":
        if c.estimator not in SEPARATED_ESTIMATORS:
            _fail("--classmate.loss vanilla_classmate needs separate main/classmate advantages: "
                  "--classmate.estimator separated (or separated_non_neg)")
        if c.prompt_mode != "splice":
            _fail("--classmate.loss vanilla_classmate needs the classmate's log-probs of the main CoT tokens, which "
                  "exist only with --classmate.prompt_mode splice")
        if n_models != 1 or c.samples != 1:
            _fail("--classmate.loss vanilla_classmate supports exactly one classmate model and --classmate.samples 1")
        if args.actor.policy_loss_type != "ppo":
            _fail("--classmate.loss vanilla_classmate is the reference's token-level two-ratio loss; "
                  "--actor.policy_loss_type gspo has no meaning there: use --classmate.loss separated with gspo")
    if c.prompt_mode == "splice":
        _check_splice_vocab(args)


def _check_placement_fits(args: SimpleNamespace) -> None:
    """A classmate group joining another placement group needs one bundle (GPU) per engine rank there."""
    c = args.classmate
    if c.tensor_parallel_size < 1:
        _fail("--classmate.tensor_parallel_size must be >= 1")
    need = c.num_engines * c.tensor_parallel_size
    if c.placement == "share":
        have = args.vllm.num_engines * args.vllm.tensor_parallel_size
        where = (f"the policy engines' placement group ({have} GPUs = --vllm.num_engines {args.vllm.num_engines} x "
                 f"--vllm.tensor_parallel_size {args.vllm.tensor_parallel_size})")
    elif c.placement == "colocate":
        have = args.actor.num_nodes * args.actor.num_gpus_per_node
        where = (f"the actor/ref placement group ({have} GPUs = --actor.num_nodes {args.actor.num_nodes} x "
                 f"--actor.num_gpus_per_node {args.actor.num_gpus_per_node})")
    else:
        return
    if need > have:
        _fail(f"--classmate.placement {c.placement}: --classmate.num_engines {c.num_engines} x "
              f"--classmate.tensor_parallel_size {c.tensor_parallel_size} = {need} GPUs do not fit {where}; "
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

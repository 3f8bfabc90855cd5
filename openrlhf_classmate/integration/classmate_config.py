"""The ``--classmate.*`` and ``--engine.*`` flag groups: their dataclasses, and what every stage reads from them
(``classmate_enabled``, ``registry_reward_in_use``, ``dispatch_per_group``, ``judge_config_from_args``) and writes
with (``warn``, ``log_resolved``).

Each field below becomes ``--classmate.<name>`` (``--engine.<name>`` for :class:`EngineConfig`) through
:func:`openrlhf_classmate.config_fields.add_dataclass_group`, which builds the flag's help from the
field's ``help``, ``range`` and default; the preflight enforces the same ``range`` (``preflight.RANGES``). After
upstream's ``hierarchize`` the values reach every Ray actor as ``strategy.args.classmate.<name>``.

After parsing, :mod:`~openrlhf_classmate.integration.launch.classmate_args` fills in the derived values and checks the
combinations.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

from openrlhf_classmate.algo.advantages import ESTIMATORS, TOKEN_MODES
from openrlhf_classmate.algo.classmate_prompt import PROMPT_MODES
from openrlhf_classmate.algo.classmate_reward import CONDITIONS
from openrlhf_classmate.algo.losses import LOSS_AGG_MODES
from openrlhf_classmate.algo.spans import TRUNCATION_MODES
from openrlhf_classmate.config_fields import POSITIVE_INT, REQUEST_TIMEOUT_S, Bound, add_dataclass_group

SEPARATED_ESTIMATORS = ("separated", "separated_non_neg")
LOSSES = ("auto", "separated", "vanilla_classmate")
PLACEMENTS = ("auto", "separate", "colocate", "share")
DISPATCH_MODES = ("auto", "group", "batch")
AUTO_RULE = ("separate when the GPUs left by the actor, reference and policy engines give every classmate engine a "
             "whole GPU, otherwise share when the two engine groups' memory fractions sum below 1, otherwise "
             "colocate")
"""What ``--classmate.placement auto`` picks: one sentence, the same in the flag's help and the README (a test reads
both)."""
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
    profile_kv_cache: bool = field(
        default=False,
        metadata={"help": "vllm backend: let vLLM size each engine's KV cache by profiling the GPU's free memory at "
                          "start-up, engine groups sharing a GPU one after the other. Off (the default), the launcher "
                          "works each group's size out from its --vllm.gpu_memory_utilization / "
                          "--classmate.gpu_memory_utilization, the GPU's memory and the checkpoint's size "
                          "(integration/rollout/engine_memory.py), so the groups start side by side; where it cannot "
                          "(no GPU visible to the launcher, a hub id) the engines profile, with one line saying why"},
    )
    cudagraph_max_size: int | None = field(
        default=None,
        metadata={"help": "vllm backend: the largest batch (in sequences) each engine captures a CUDA graph for "
                          "(vLLM's max_cudagraph_capture_size). Unset: the most requests one engine holds in a "
                          "rollout step (--rollout.vllm_generate_batch_size x --rollout.n_samples_per_prompt over "
                          "--vllm.num_engines; the classmate's over --classmate.num_engines, times "
                          "--classmate.samples), rounded up to vLLM's next capture size and at most 512, so that start-up "
                          "captures no graph a step never uses. Batches above it (a larger evaluation) run compiled "
                          "without a graph. 0: vLLM's own choice (up to 512 whatever the batch)",
                  "default_help": "unset (the rollout's largest per-engine batch)",
                  "range": Bound(lo=0, none_ok=True)},
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
        default=10,
        metadata={"help": "the policy engines return the sampled tokens' log-probs for the mismatch metrics on steps "
                          "1 and 2 (the first load of the weights and the first sync), then on every N-th step (1: "
                          "every step). A measured step asks for every request's log-probs, so each reading covers "
                          "a whole rollout batch (the same population every time, and vLLM's log-softmax over its "
                          "running batch is paid only then); the steps in between ask for none, as upstream's "
                          "request does, and log no mismatch/* values. A measured step's rollout took ~1.1 s more "
                          "for 128 x 512 tokens of a 0.5B policy on one H200, so 10 keeps the cost near 4% of the "
                          "generation phase (README, 'Train-inference mismatch'). With "
                          "--algo.advantage.is_correction_level upstream asks for them on every step, and every step "
                          "is measured",
                  "range": POSITIVE_INT},
    )
    weight_sync_bucket_mb: int = field(
        default=512,
        metadata={"help": "vllm backend with --train.colocate_all (CUDA IPC): the actor sends its weights to the "
                          "policy engines in buckets of at most this many MiB, one IPC handle and one engine call per "
                          "bucket, instead of upstream's one per parameter (integration/training/weight_sync.py). Each bucket "
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


def classmate_engines_sleep(args: SimpleNamespace) -> bool:
    """Whether the classmate engines sleep while the policy generates and trains (``--classmate.placement colocate``
    or ``--classmate.enable_sleep``), their weights then in host memory."""
    return args.classmate.placement == "colocate" or bool(args.classmate.enable_sleep)


def _group_dispatch_obstacle(args: SimpleNamespace) -> str | None:
    """Why the classmate requests cannot be sent per prompt group in this run (None: they can)."""
    if classmate_engines_sleep(args):
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


def judge_config_from_args(args):
    """The judge of both reward streams (``--classmate.judge_*``), or None without ``--classmate.judge_base_url``."""
    cfg = args.classmate
    if not cfg.judge_base_url:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    return JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model or "", api_key_env=cfg.judge_api_key_env,
                       timeout_s=cfg.judge_timeout_s, max_retries=cfg.judge_max_retries,
                       max_concurrency=cfg.judge_max_concurrency)


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

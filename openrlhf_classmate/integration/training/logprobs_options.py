"""``--logprobs.*``: the options of the chunked log-probs and their launch checks (``chunked_actor.py`` holds the
actor). Kept apart from the actor, which imports ``openrlhf.models`` (PEFT, DeepSpeed: ~5 s of imports), so that
parsing the launcher's flags does not (``--check`` still imports upstream's launcher, and with it the models)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from openrlhf_classmate.algo.chunked_logprobs import DEFAULT_CHUNK_SIZE
from openrlhf_classmate.config_fields import POSITIVE_INT, add_dataclass_group
from openrlhf_classmate.integration.classmate_config import log_resolved

CHUNKED_STATES = ("auto", "on", "off")


@dataclass
class LogprobsConfig:
    """Token log-probs of the actor and reference forwards."""

    chunked: str = field(
        default="auto",
        metadata={"help": "Compute the actor's and the reference model's token log-probs (and the entropy when "
                          "--actor.entropy_coef is set) from the last hidden states through the LM head, "
                          "--logprobs.chunk_size tokens at a time and only at the response tokens, with a backward "
                          "that recomputes each chunk's logits, instead of upstream's float32 [tokens, vocabulary] "
                          "logits: the same values (fp32 logsumexp) in far less memory (H100, Qwen2.5-0.5B shapes: "
                          "1.12-1.40x the actor update's tokens/s, 0.387x its peak memory); VR-CLI's reference NLLs "
                          "too. Not with --ds.ring_attn_size > 1, --ds.tensor_parallel_size > 1, LoRA on lm_head, "
                          "vision-language models or models that rescale their logits: auto uses it where supported "
                          "and otherwise upstream's path with one note saying why; on refuses those at launch "
                          "(given bare, --logprobs.chunked means on); off is upstream's path",
                  "choices": CHUNKED_STATES, "nargs": "?", "const": "on"},
    )
    chunk_size: int = field(
        default=DEFAULT_CHUNK_SIZE,
        metadata={"help": "Tokens per LM-head chunk of --logprobs.chunked (auto or on): the largest temporary is "
                          "chunk_size x vocabulary (the chunk's logits and their gradient in the model dtype); 1k-4k "
                          "keeps the GEMMs efficient", "range": POSITIVE_INT},
    )


def add_logprobs_arguments(parser) -> None:
    add_dataclass_group(parser, "logprobs", LogprobsConfig)


def _fail(message: str) -> None:
    raise SystemExit(f"error: {message}")


def _fall_back(cfg, reason: str) -> str:
    """auto meets a run the chunked head does not serve: upstream's path, with one note line (returned too)."""
    cfg.chunked = "off"
    note = f"--logprobs.chunked auto: upstream's full-logits path, as {reason} (--logprobs.chunked on would refuse it)"
    log_resolved(note)
    return note


def chunk_size_from_args(args: SimpleNamespace) -> int | None:
    """``--logprobs.chunk_size`` unless ``--logprobs.chunked`` is off (then None: upstream's forward). auto counts as
    on here: the launch resolves it (:func:`validate_logprobs_args`, :func:`check_model_config`)."""
    cfg = getattr(args, "logprobs", None)
    return cfg.chunk_size if cfg is not None and cfg.chunked != "off" else None


def _flag_conflict(args: SimpleNamespace) -> tuple[str, str] | None:
    """(the refusal of ``on``, the reason of auto's fallback) for flags the chunked head does not support."""
    if args.ds.ring_attn_size > 1:
        return (f"--logprobs.chunked with --ds.ring_attn_size {args.ds.ring_attn_size}: the chunked LM head is not "
                "verified with ring attention; drop one of them",
                f"--ds.ring_attn_size {args.ds.ring_attn_size} (ring attention) is not verified with the chunked head")
    if args.ds.tensor_parallel_size > 1:
        return (f"--logprobs.chunked with --ds.tensor_parallel_size {args.ds.tensor_parallel_size}: a tensor-parallel "
                "LM head holds part of the vocabulary, the log-softmax needs all of it; drop one of them",
                f"--ds.tensor_parallel_size {args.ds.tensor_parallel_size} splits the LM head's vocabulary")
    targets = args.ds.lora.target_modules or []
    if args.ds.lora.rank > 0 and "lm_head" in ([targets] if isinstance(targets, str) else targets):
        return ("--logprobs.chunked needs a plain linear LM head: drop lm_head from --ds.lora.target_modules or drop "
                "--logprobs.chunked", "lm_head in --ds.lora.target_modules makes the LM head a LoRA layer")
    return None


def validate_logprobs_args(args: SimpleNamespace) -> None:
    """Launch checks of ``--logprobs.*`` that need only the flags (the model's config: :func:`check_model_config`).
    ``on`` with an unsupported combination is refused; ``auto`` with one becomes ``off`` (one note line); a supported
    ``auto`` stays ``auto`` until the model's config is checked."""
    cfg = args.logprobs  # its chunk_size range is checked with every group's numbers (args.check_flag_groups)
    if cfg.chunked == "off":
        if cfg.chunk_size != DEFAULT_CHUNK_SIZE:
            _fail("--logprobs.chunk_size sets the chunk of --logprobs.chunked: drop --logprobs.chunked off or drop "
                  "--logprobs.chunk_size")
        return
    conflict = _flag_conflict(args)
    if conflict is not None:
        if cfg.chunked == "on":
            _fail(conflict[0])
        _fall_back(cfg, conflict[1])


# config attributes by which a causal LM changes its logits after the head, with their neutral value
_LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


def _config_problem(config, path: str) -> str | None:
    if hasattr(config, "vision_config"):
        return (f"{path} is a vision-language model (upstream builds it as ImageTextToText); the chunked LM head "
                "supports causal LMs only")
    for name, neutral in _LOGIT_TRANSFORMS.items():
        value = getattr(config, name, neutral)
        if value != neutral:
            return (f"{path} sets {name}={value}, a change of the logits after the LM head that the chunked head "
                    "does not apply")
    return None


def check_model_config(args: SimpleNamespace, load_config=None) -> str | None:
    """Launch check of the policy model for ``--logprobs.chunked``; returns what was checked (None: off). A model
    the chunked head cannot serve: ``on`` raises SystemExit with one line, ``auto`` becomes ``off`` (one note line,
    also returned); a plain head turns ``auto`` into ``on``. ``load_config(path)`` defaults to
    ``AutoConfig.from_pretrained``."""
    if chunk_size_from_args(args) is None:
        return None
    path = args.actor.model_name_or_path
    if load_config is None:
        from transformers import AutoConfig

        def load_config(p):
            return AutoConfig.from_pretrained(p, trust_remote_code=True)

    problem = _config_problem(load_config(path), path)
    if problem is not None:
        if args.logprobs.chunked == "on":
            _fail(f"--logprobs.chunked: {problem}: drop --logprobs.chunked")
        return _fall_back(args.logprobs, problem)
    args.logprobs.chunked = "on"
    return f"--logprobs.chunked: {path} has a plain LM head (chunks of {args.logprobs.chunk_size} tokens)"

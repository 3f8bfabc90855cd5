"""Up-front check of the launcher's sampling flags against vLLM's own ``SamplingParams`` validation.

Upstream builds its rollout ``SamplingParams`` only at the first step, after every engine and model has started; the
classmate stage builds its own per request. Building the same parameters at parse time (the CPU stand-in validates
as vLLM 0.29 does) turns a bad value into one ``error:`` line naming the flags, on CPU and GPU alike.
"""

from __future__ import annotations

from types import SimpleNamespace

from openrlhf_classmate.integration.classmate_config import classmate_enabled


def sampling_flag_sets(args: SimpleNamespace) -> list[tuple[str, dict]]:
    """(flags, ``SamplingParams`` keyword arguments) exactly as upstream and the classmate stage will build them."""
    r = args.rollout
    sets = [(f"--rollout.temperature {r.temperature} / --rollout.top_p {r.top_p} / --rollout.max_new_tokens "
             f"{r.max_new_tokens}",
             # OpenRLHF 0.11.2 samples_generator._dispatch_prompts_to_vllm (one request per sample: n = 1)
             dict(temperature=r.temperature, top_p=r.top_p, top_k=-1, max_tokens=r.max_new_tokens, min_tokens=1))]
    if getattr(args.eval, "dataset", None):
        sets.append((f"--eval.temperature {args.eval.temperature} / --rollout.top_p {r.top_p}",
                     dict(temperature=args.eval.temperature, top_p=r.top_p, top_k=-1, max_tokens=r.max_new_tokens,
                          min_tokens=1)))
    if classmate_enabled(args):
        cfg = args.classmate
        sets.append((f"--classmate.temperature {cfg.temperature} / --classmate.top_p {cfg.top_p} / --classmate.top_k "
                     f"{cfg.top_k} / --classmate.max_new_tokens {cfg.max_new_tokens}",
                     dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_new_tokens)))
    return sets


def check_sampling_args(args: SimpleNamespace) -> None:
    """Exit with ``error: ...`` when vLLM would reject a sampling setting of the run."""
    from vllm import SamplingParams

    for flags, kwargs in sampling_flag_sets(args):
        try:
            SamplingParams(**kwargs)
        except Exception as e:  # noqa: BLE001  (vLLM 0.26: ValueError/TypeError; 0.29: VLLMValidationError)
            raise SystemExit(f"error: {flags}: vLLM rejects these sampling settings: {e}") from None

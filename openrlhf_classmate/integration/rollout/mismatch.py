"""Train–inference mismatch of the policy engines, on the measured steps (on unless ``--engine.no_mismatch_metrics``).

What runs where:

* rollout request (the process that generates: the sync controller, or the async rollout actor):
  ``trainer.install_rollout_request`` makes upstream's ``samples_generator`` build every policy request with
  ``logprobs=0`` on measured steps (the sampled token's log-prob only: no top-k entries; steps 1 and 2, then every
  ``--engine.mismatch_interval``-th: :func:`measured_step`, set per rollout batch by the samples generator through
  :func:`set_measuring`; a step measures all of its requests or none, so every reading covers a whole rollout
  batch), ``output_kind=FINAL_ONLY`` (one output per
  request instead of one per generated token), on vLLM ``flat_logprobs=True`` and, when the policy executor never
  reads the decoded text (no ``--train.agent_func_path``), ``detokenize=False`` (vLLM then decodes neither the text
  nor a string per log-prob entry). Upstream's executor turns the engine's log-probs into ``rollout_log_probs`` (``utils/agent.py``) as it
  does for ``--algo.advantage.is_correction_level``. Why these three settings: README, "Train–inference mismatch".
* engines (``cli.train_ppo_ray.EngineFactory.policy``): vLLM policy engines start with
  ``logprobs_mode="processed_logprobs"`` (log-probs after temperature, as the actor computes them; upstream passes
  the same mode with IS correction); the HF engine reports those already.
* experience maker (:meth:`ClassmateExperienceMaker.make_experience`): :func:`measure` compares them with the actor's
  old log-probs that upstream computes anyway, per rollout batch.
* controller (``ClassmateControllerMixin.train_step``): :func:`step_report` adds ``mismatch/*`` to the step's status
  (tensorboard / wandb: ``train/mismatch/...``) and one warning line naming the step when the mean crosses
  ``--engine.mismatch_warn_threshold``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from openrlhf_classmate.algo.mismatch import Mismatch, logprob_mismatch

ENGINE_LOGPROBS_MODE = "processed_logprobs"


def enabled(args: SimpleNamespace) -> bool:
    return not getattr(args.engine, "no_mismatch_metrics", False)


# whether this process's next rollout requests ask for the sampled tokens' log-probs (the samples generator sets it
# per rollout batch: measured_step)
_measuring = True


def measured_step(step: int, interval: int) -> bool:
    """Whether rollout batch ``step`` (1-based) measures the mismatch: steps 1 and 2 (the weights as loaded, then the
    first sync), then every ``interval``-th (``--engine.mismatch_interval``)."""
    return step <= 2 or step % interval == 0


def set_measuring(on: bool) -> None:
    """Whether the rollout requests this process builds from now on ask for the sampled tokens' log-probs."""
    global _measuring
    _measuring = on


def rollout_sampling_params(args: SimpleNamespace) -> Callable:
    """Stands in for ``vllm.SamplingParams`` inside upstream's ``samples_generator``: the same call, plus the cheap
    sampled-token log-prob request on measured steps (module docstring; :func:`set_measuring`)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    # a user's agent (--train.agent_func_path) may read request_output.outputs[0].text; upstream's single-turn
    # executor and ours read token ids only
    detokenize = bool(getattr(args.train, "agent_func_path", None))
    # vLLM: log-probs in a few flat lists per request instead of a dict and a Logprob per token (less for Python's
    # garbage collector to walk in the engine actor; upstream's executor iterates both alike). The HF engine has
    # no such container and refuses the option.
    flat = args.engine.backend == "vllm"

    def build(**kwargs) -> SamplingParams:
        if _measuring or kwargs.get("logprobs") is not None:
            kwargs["logprobs"] = 0  # also where upstream asks for 1 (IS correction): it reads the sampled token only
            if flat:
                kwargs["flat_logprobs"] = True
        kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY
        if not detokenize:
            kwargs["detokenize"] = False
        return SamplingParams(**kwargs)

    return build


def measure(experiences) -> Mismatch | None:
    """The mismatch of one rollout batch (upstream's micro-batch experiences after ``make_experience``); None when
    the engines returned no log-probs (a custom agent that leaves ``rollout_log_probs`` out)."""
    if not experiences or any(e.rollout_log_probs is None for e in experiences):
        return None
    return logprob_mismatch([e.rollout_log_probs for e in experiences], [e.action_log_probs for e in experiences],
                            [e.action_mask for e in experiences])


def step_report(mismatch: Mismatch | None, step: int, threshold: float) -> tuple[dict[str, float], str | None]:
    """The step's ``mismatch/*`` metrics and, when the mean crosses ``threshold`` or a log-prob was not finite, one
    warning line naming the step."""
    if mismatch is None:
        return {}, None
    problems = []
    if mismatch.abs_diff_mean > threshold:
        problems.append(f"mean |actor - engine log-prob| {mismatch.abs_diff_mean:.3g} > --engine.mismatch_warn_threshold "
                        f"{threshold:g} (max {mismatch.abs_diff_max:.3g}, k3 KL {mismatch.kl_k3:.3g}, "
                        f"{mismatch.tokens} tokens): the engines do not sample from the weights being trained "
                        "(weight sync broken?)")
    if mismatch.nonfinite:
        problems.append(f"{mismatch.nonfinite} response tokens had a non-finite engine or actor log-prob (left out "
                        "of mismatch/*)")
    warning = f"step {step}: train-inference mismatch: " + "; ".join(problems) if problems else None
    return mismatch.metrics(), warning

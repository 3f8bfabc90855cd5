"""Policy actor side: ``ClassmatePolicyModelActor`` and its trainer ``ClassmateActorPPOTrainer``; the reference
worker ``ClassmateReferenceModelActor``. Both workers build an ``Actor`` that compares its loaded weights with the
checkpoint (``integration/training/weight_check.py``), chunked-log-prob with ``--logprobs.chunked``
(``integration/training/chunked_actor.py``).

Upstream's ``training_step`` calls ``self.actor_loss_fn(log_probs, old_log_probs, advantages, action_mask=...,
rollout_log_probs=..., **loss_batch_info)`` and never passes the rest of the micro-batch. ``ClassmateActorPPOTrainer``
keeps the current micro-batch on ``self`` for the duration of ``training_step`` and installs a loss adapter that
hands the classmate tensors (``classmate_advantages``, ``cot_mask``, ``classmate_log_probs``) to our losses as
keyword arguments, so ``training_step`` itself is not copied. Anything the loss reports goes into
``experience.info``, which upstream logs. Its :class:`~openrlhf_classmate.integration.training.nonfinite.NonfiniteGuard` keeps
non-finite rewards, advantages, losses and gradients away from the optimizer.

Upstream's ``ppo_train`` reads each tensor metric of a micro-batch back with ``value.float().mean().item()``, one
host sync per metric (~60 for GDPO). ``training_step`` hands it those means as python floats read in one transfer
(:func:`metrics_to_host`), so upstream takes its ``value * scale`` branch with the same numbers; our strategy then
reduces the dict in one collective (``integration/training/strategy.py``). Upstream's collate also leaves each per-sample
``info`` metric as a list of 0-dim tensors, which ``to_device`` copies to the device one sample at a time and
``training_step`` reads back one element at a time; ours stacks each into one tensor first (:func:`stack_info`).
Upstream's per-metric path against this one is the before/after pair ``syncs`` of ``bench/GPU_RESULTS.md``.
"""

from __future__ import annotations

import time

import torch
from openrlhf.models import Actor
from openrlhf.trainer.ray.launcher import ReferenceModelActor
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor

from openrlhf_classmate import ports
from openrlhf_classmate.algo.losses import SeparatedPolicyLoss, VanillaClassmatePolicyLoss
from openrlhf_classmate.integration.classmate_config import classmate_enabled, uses_separated_loss
from openrlhf_classmate.integration.patches import install_actor_model, install_actor_trainer
from openrlhf_classmate.integration.training import weight_sync
from openrlhf_classmate.integration.training.chunked_actor import ChunkedLogprobActor, chunked_actor_class
from openrlhf_classmate.integration.training.logprobs_options import check_model_config, chunk_size_from_args
from openrlhf_classmate.integration.training.nonfinite import NonfiniteGuard
from openrlhf_classmate.integration.training.weight_check import LoadCheckedActor, load_checked_class


class ClassmateLossAdapter(torch.nn.Module):
    """Upstream's loss signature in; our loss, with the micro-batch's classmate tensors as keyword arguments, out.

    ``extra_fields`` name the ``ClassmateExperience`` fields the loss needs; ``zero_classmate`` passes a zero
    classmate advantage instead (a single-advantage estimator with the reference's aggregation).
    """

    def __init__(self, loss: torch.nn.Module, extra_fields: tuple[str, ...], trainer: ClassmateActorPPOTrainer,
                 zero_classmate: bool = False):
        super().__init__()
        self.loss = loss
        self.extra_fields = extra_fields
        self.zero_classmate = zero_classmate
        self._trainer = [trainer]  # a list: not registered as a submodule

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None,
                **loss_batch_info):
        experience = self._trainer[0].current_experience
        extras = {"classmate_advantages": torch.zeros_like(advantages)} if self.zero_classmate else {}
        for name in self.extra_fields:
            value = getattr(experience, name, None)
            if value is None:
                raise RuntimeError(f"the classmate loss needs experience.{name}, which this micro-batch lacks "
                                   "(is Experience rebound to ClassmateExperience in this process?)")
            extras[name] = value
        out = self.loss(log_probs, old_log_probs, advantages, action_mask=action_mask,
                        rollout_log_probs=rollout_log_probs, **loss_batch_info, **extras)
        for key, value in getattr(self.loss, "last_stats", {}).items():
            experience.info[f"classmate/{key}"] = value.detach().float()
        return out


def build_classmate_loss(args) -> tuple[torch.nn.Module, tuple[str, ...], bool] | None:
    """(loss, experience fields it needs, zero classmate advantage) for this run; None = upstream's PolicyLoss.

    Every ratio / correction option of upstream's ``PolicyLoss`` (``--actor.policy_loss_type``,
    ``--algo.advantage.is_correction_*``) is passed on, so our losses apply them exactly as upstream does.
    """
    cfg = args.classmate
    agg = cfg.loss_agg_mode or args.actor.loss_agg_mode
    advantage = args.algo.advantage
    common = dict(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        classmate_clip_eps_low=cfg.eps_clip_low_high[0],
        classmate_clip_eps_high=cfg.eps_clip_low_high[1],
        loss_agg_mode=agg,
        max_response_len=args.rollout.max_new_tokens,
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=advantage.is_correction_level,
        is_correction_mode=advantage.is_correction_mode,
        is_correction_gating=advantage.is_correction_gating,
        is_correction_threshold=tuple(advantage.is_correction_threshold),
    )
    if not uses_separated_loss(args):
        if agg == "seq-mean-token-sum-norm":
            # a single-advantage estimator with the reference aggregation: the separated loss, zero second term
            return SeparatedPolicyLoss(dual_clip=args.actor.dual_clip, **common), (), True
        return None  # upstream's PolicyLoss, built from args.actor.loss_agg_mode (set from --classmate.loss_agg_mode)
    if cfg.loss == "vanilla_classmate":
        loss = VanillaClassmatePolicyLoss(
            dual_clip=args.actor.dual_clip or 3.0, classmate_dual_clip=cfg.dual_clip or 3.0, **common
        )
        return loss, ("classmate_advantages", "classmate_log_probs", "cot_mask"), False
    loss = SeparatedPolicyLoss(dual_clip=args.actor.dual_clip, classmate_dual_clip=cfg.dual_clip, **common)
    return loss, ("classmate_advantages",), False


def metrics_to_host(metrics: dict, weights: dict) -> None:
    """Replace, in place, each tensor metric that ``ppo_train`` reduces (its weight is not None) by
    ``value.float().mean().item()``, read back in one transfer per device (float32 means stacked, ``tolist``: the
    same floats). Other values, and the metrics upstream keeps as they are (weight None), are untouched."""
    by_device: dict[torch.device, list[str]] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and weights.get(key) is not None:
            by_device.setdefault(value.device, []).append(key)
    with torch.no_grad():
        for keys in by_device.values():
            metrics.update(zip(keys, torch.stack([metrics[k].float().mean() for k in keys]).tolist()))


# The actor update's split, logged per step: ``fit`` (the worker's whole ``fit``: the micro-batches, their collation,
# the metric reduction, the replay buffer's clearing and upstream's cache emptying) and ``micro_steps`` (the sum of
# the micro-batches' training steps: forward, loss, backward, optimizer step, metric read-back); rank 0's. Not under
# ``timing/``: upstream's controller sums every ``timing/*`` key into ``timing/step_total``.
ACTOR_TIMING = "actor_timing"


def stack_info(info: dict) -> dict:
    """``info`` with each list of 0-dim tensors (what upstream's collate makes of a per-sample metric) stacked into
    one tensor: ``to_device`` then copies it to the device once, not once per sample, and ``training_step`` takes it
    as a per-sample metric (weight ``sample``, as the list) without reading each element back to the host. Values
    equal: the mean of the same float32 numbers."""
    out = dict(info)
    for key, value in info.items():
        if (isinstance(value, list) and value and all(isinstance(t, torch.Tensor) and t.dim() == 0 for t in value)
                and len({t.dtype for t in value}) == 1 and len({t.device for t in value}) == 1):
            out[key] = torch.stack(value)
    return out


def stacked_info_collate(collate):
    """Upstream's replay-buffer collate, then :func:`stack_info`."""
    def collate_fn(batch):
        experience = collate(batch)
        experience.info = stack_info(experience.info)
        return experience

    return collate_fn


class ClassmateActorPPOTrainer(ActorPPOTrainer):
    current_experience = None
    micro_step_s = 0.0  # this step's training_step seconds so far

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.upstream_loss_fn = self.actor_loss_fn
        cfg = self.args.classmate
        built = build_classmate_loss(self.args) if classmate_enabled(self.args) or cfg.loss_agg_mode else None
        if built is not None:
            loss, fields, zero_classmate = built
            self.actor_loss_fn = ClassmateLossAdapter(loss, fields, self, zero_classmate)
        # non-finite rewards, advantages, loss or gradient norm never reach the optimizer (our strategy's
        # backward / optimizer_step consult the guard of the model they are given)
        self.nonfinite = NonfiniteGuard(self.actor.model, cfg.stop_after_nonfinite_skips)
        self.actor.nonfinite_guard = self.nonfinite
        # this buffer only: upstream's ppo_train hands the DataLoader replay_buffer.collate_fn
        self.replay_buffer.collate_fn = stacked_info_collate(self.replay_buffer.collate_fn)

    def ppo_train(self, kl_ctl: float):
        self.micro_step_s = 0.0
        status = super().ppo_train(kl_ctl)
        status[f"{ACTOR_TIMING}/micro_steps"] = self.micro_step_s
        status.update(self.nonfinite.status())  # the controller logs the total and stops on the consecutive count
        return status

    def broadcast_to_vllm(self):
        """The CUDA-IPC sync in buckets (``integration/training/weight_sync.py``) where upstream would send one parameter at a
        time over CUDA IPC; upstream's own sync otherwise (NCCL / gloo broadcast, DeepSpeed tensor parallelism, VLM
        models, ``--engine.weight_sync_bucket_mb 0``)."""
        args = self.strategy.args
        bucket_mb = args.engine.weight_sync_bucket_mb
        if (not self.use_cuda_ipc or not bucket_mb or args.ds.tensor_parallel_size > 1
                or getattr(self.actor, "is_vlm", False)):
            return super().broadcast_to_vllm()
        return weight_sync.sync_buckets(self, bucket_mb << 20)

    def training_step(self, experience, kl_ctl, step, loss_batch_info=None):
        start = time.perf_counter()
        self.current_experience = experience
        self.nonfinite.check_experience(experience)
        try:
            status = super().training_step(experience, kl_ctl, step, loss_batch_info)
        finally:
            self.current_experience = None
        metrics_to_host(status["metrics"], status["weights"])
        # wall time up to the metrics' read-back, which waits for the micro-batch's GPU work
        self.micro_step_s += time.perf_counter() - start
        return status


def _master_port() -> int:
    """Rank 0's master port for its group (upstream's ``__init__`` asks ``self._get_free_port()``): one below the
    kernel's ephemeral range, which no outgoing connection can take before the TCPStore binds it (``ports``)."""
    return ports.free_port()


class ClassmatePolicyModelActor(PolicyModelActor.__ray_actor_class__):
    _get_free_port = staticmethod(_master_port)

    def init_model_from_pretrained(self, strategy, pretrain, max_steps=None, vllm_engines=None):
        install_actor_trainer(ClassmateActorPPOTrainer)
        chunked = install_worker_actor(strategy.args)
        if strategy.args.engine.backend == "hf":
            vllm_engines = None  # HF engines get weights from the controller through the object store
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        if not isinstance(self.trainer, ClassmateActorPPOTrainer):
            raise RuntimeError("upstream no longer builds ActorPPOTrainer through the module global we rebind")
        _check_built(self.actor, chunked, "policy")

    def fit(self, kl_ctl: float = 0):
        start = time.perf_counter()
        status = super().fit(kl_ctl)  # ends with a device synchronize
        status[f"{ACTOR_TIMING}/fit"] = time.perf_counter() - start
        return status

    def hf_engine_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full policy weights on rank 0 (gathered under ZeRO-3; every rank must call this), None elsewhere; with
        ``--ds.lora.rank`` the merged weights (:func:`engine_state_dict`)."""
        import deepspeed

        model = self.actor.model.module
        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.strategy.args.ds.zero_stage == 3):
            if torch.distributed.get_rank() != 0:
                return None
            return engine_state_dict(model)


def engine_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an engine loads, on the CPU: the model's state dict, or for a peft LoRA model (upstream's
    ``--ds.lora.rank``) each adapted weight merged, ``W + B A · scaling`` in W's dtype as peft's own merge computes
    it, under the base model's parameter names. Computed aside: the training weights stay base + adapter."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if adapter not in module.lora_A or adapter in module.merged_adapters:
                continue  # not a linear adapter of this layer, or already inside the base weight
            if module.lora_variant.get(adapter) is not None or module.lora_bias.get(adapter):
                raise NotImplementedError(f"{name}: only plain LoRA adapters (no DoRA, no LoRA bias) are merged")
            key = f"{name}.base_layer.weight"
            delta = module.get_delta_weight(adapter)
            deltas[key] = delta if key not in deltas else deltas[key] + delta
    merged = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        if "modules_to_save" in key or "original_module" in key:
            raise NotImplementedError(f"{key}: peft modules_to_save are not merged for the engines")
        value = tensor.detach()
        if key in deltas:
            value = value + deltas[key].to(value.dtype)
        merged[key.replace(".base_layer.", ".")] = value.to("cpu", copy=True)
    return merged


class ClassmateReferenceModelActor(ReferenceModelActor.__ray_actor_class__):
    """Upstream's reference worker; its ``Actor`` checks the loaded weights against the checkpoint, and with
    ``--logprobs.chunked`` (auto: by default) computes log-probs (the reference forward and VR-CLI's NLLs) through the
    chunked LM head."""

    _get_free_port = staticmethod(_master_port)

    def init_model_from_pretrained(self, strategy, pretrain):
        chunked = install_worker_actor(strategy.args)
        super().init_model_from_pretrained(strategy, pretrain)
        _check_built(self.model, chunked, "reference")


def install_worker_actor(args) -> bool:
    """In a policy or reference worker, before upstream's ``init_model_from_pretrained``: make it build our ``Actor``:
    upstream's, or the chunked one unless ``--logprobs.chunked`` is off (returns whether), whose weights are compared
    with the checkpoint as soon as they are loaded (``integration/training/weight_check.py``; the policy's EMA copy too). An
    ``auto`` the launch left open (a hub id: the preflight reads local folders only) is decided here from the
    model's config (:func:`check_model_config`)."""
    if getattr(args, "logprobs", None) is not None and args.logprobs.chunked == "auto":
        check_model_config(args)
    chunk_size = chunk_size_from_args(args)
    base = chunked_actor_class(chunk_size) if chunk_size is not None else Actor
    install_actor_model(load_checked_class(base))
    return chunk_size is not None


def _check_built(actor, chunked: bool, which: str) -> None:
    if not isinstance(actor, LoadCheckedActor) or (chunked and not isinstance(actor, ChunkedLogprobActor)):
        raise RuntimeError(f"upstream no longer builds the {which}'s Actor through the module global we rebind")

"""``ResilientDeepspeedStrategy``: upstream's ``DeepspeedStrategy`` with safer checkpoint handling.

* ``load_ckpt`` without an explicit tag resumes from :func:`checkpoints.choose_resume_tag`'s choice: ``latest`` when
  it is complete, else the newest complete older tag, with one line naming the broken file (a torn checkpoint used
  to end in a ``torch.load`` traceback). Every rank makes the same choice from the same files.
* ``save_ckpt`` rotates the DeepSpeed tags (``--ckpt.max_num`` / ``--ckpt.max_mem``, upstream's policy) only once the
  new tag is complete: every rank's files written and ``latest`` naming it. Upstream deletes the old tags *before*
  writing the new one, so a crash during a save at ``--ckpt.max_num 1`` left no checkpoint to resume from. During a
  save N+1 tags may exist for a moment; a torn tag is the first to go.
* ``save_ckpt`` ends, after the barrier that follows every rank's files, with rank 0 writing the tag's completeness
  marker (``checkpoint_complete.json``: the data-parallel world size and every file's size), having recorded before
  the save that tags from this step on carry one (``<save_dir>/checkpoint_markers.json``). Without it a tag missing
  its highest rank's files looked complete (no gap below the highest rank seen): the resume took it and that rank
  died in ``torch.load``, and the rotation kept it. The details: :mod:`openrlhf_classmate.integration.training.checkpoints`.
  A decoupled (asynchronous) DeepSpeed checkpoint engine is still writing when the save returns, so its tags get no
  marker: they are checked by their files and, as before, count as not complete yet at the save (older checkpoints
  are kept).
* ``save_model`` into ``<ckpt.path>/<tag>_hf`` (``--ckpt.save_hf``) rotates those folders with ``--ckpt.max_num``,
  as upstream rotates the DeepSpeed tags (the ``_hf`` folders used to pile up forever).
* ``backward`` / ``optimizer_step`` of a model carrying a ``nonfinite_guard`` (the policy:
  :class:`~openrlhf_classmate.integration.training.nonfinite.NonfiniteGuard`) check the loss, and skip an update whose
  inputs, loss or gradient norm are not finite.
* ``all_reduce`` of a flat dict of numbers (``ppo_train`` reduces one per micro-batch: about 60 keys for GDPO) or of
  one-element float32 tensors packs it into one float32 tensor and makes one collective, where upstream makes one per
  key with a host-to-device and a device-to-host copy each (:func:`packable`). The values are upstream's bit for bit
  on one or two ranks (and for ``max`` on any number); on three or more, a sum's terms may be added in another order
  by the collective (gloo: 10 of 60 values differed in the last bit on 3 ranks), as for any change of tensor size.
  Upstream's per-key path against this one is the before/after pair ``syncs`` of ``bench/GPU_RESULTS.md``;
* its DeepSpeed configs turn on ``stage3_allgather_sequential`` on the CPU accelerator (ZeRO-3), the workaround of a
  DeepSpeed defect that loaded uninitialised memory into parameters (:func:`safe_gathers`).

Upstream's ``train()`` builds its strategy with ``get_strategy(args)``; :func:`patches.install_launcher` rebinds
that name to :func:`get_strategy` below. The strategy object travels to the Ray actors by pickle, so the subclass
is what every actor uses.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
from openrlhf.utils.deepspeed import DeepspeedStrategy

from openrlhf_classmate.integration.training.checkpoints import (
    begin_marked_save,
    choose_resume_tag,
    inspect_tag,
    mark_complete,
    read_latest,
    rotate_hf_folders,
    rotate_tags,
)


def packable(data) -> str | None:
    """``"numbers"`` / ``"tensors"`` when :meth:`ResilientDeepspeedStrategy.all_reduce` reduces ``data`` in one
    collective, else None (upstream's path).

    Packed: a non-empty dict whose values are all python numbers (upstream reduces each as ``torch.Tensor([x])``,
    float32, so one float32 tensor of them holds the same values), or all distinct one-element float32 tensors on one
    device without grad (upstream divides those in place: another dtype would be divided in that dtype, a leaf that
    requires grad would raise). Nested dicts, multi-element tensors and mixtures are not. Every rank decides from its
    own dict; the ranks agree because upstream's callers build the same keys and types on each rank (which upstream's
    per-key collectives need as well)."""
    if not isinstance(data, dict) or not data:
        return None
    values = list(data.values())
    if all(isinstance(v, (int, float)) for v in values):
        return "numbers"
    if (all(isinstance(v, torch.Tensor) and v.numel() == 1 and v.dtype == torch.float32 and not v.requires_grad
            for v in values)
            and len({v.device for v in values}) == 1 and len({id(v) for v in values}) == len(values)):
        return "tensors"
    return None


def safe_gathers(ds_config: dict) -> dict:
    """Turn on ZeRO-3's ``stage3_allgather_sequential`` where DeepSpeed's blocking multi-parameter gather is unsafe.

    The cause (DeepSpeed's, not ours): DeepSpeed 0.19.6 ``Init._allgather_params_coalesced`` (the gather of a
    ``GatheredParameters`` context over two or more parameters, and of a module's parameters in the forward) starts
    one asynchronous all-gather per parameter, waits on the *last* handle only ("ensures the operation is enqueued")
    and calls ``accelerator.synchronize()`` only where ``resolves_data_dependency()`` is False. On CUDA that
    synchronise orders everything (NCCL runs the gathers in order on one stream); DeepSpeed's CPU accelerator says
    True and ``synchronize`` is a no-op there, while gloo runs asynchronous collectives on a pool of worker threads
    that finish out of order (two plain ``torch.distributed`` gloo ranks: waiting on the second of two async
    all-gathers left the first unfinished in 10 of 20 rounds). The context's body then runs while an earlier
    parameter's all-gather is still writing into it. transformers' ZeRO-3 loader (``_load_state_dict_into_zero3_model``)
    gathers each module's parameters together (weight + bias: Qwen2's q/k/v projections), rank 0 copies the
    checkpoint in, the late all-gather overwrites it with the partitions as they were (uninitialised memory:
    transformers skips the random init of weights it will load), and the broadcast that ends the context sends that
    to every rank. With the flag every gather goes through ``_allgather_params_sequential`` / the sequential fetch,
    one synchronous all-gather per parameter. Where the accelerator synchronises (GPUs) the config is unchanged.
    ``tests/test_weight_check.py`` reproduces the race and checks the fix.
    """
    from deepspeed.accelerator import get_accelerator

    zero = ds_config.get("zero_optimization", {})
    if zero.get("stage") == 3 and get_accelerator().resolves_data_dependency():
        zero["stage3_allgather_sequential"] = True
    return ds_config


class ResilientDeepspeedStrategy(DeepspeedStrategy):
    def all_reduce(self, data, op="mean"):
        """Upstream's ``all_reduce``, with a :func:`packable` dict reduced in one collective (module docstring)."""
        kind = packable(data)
        if kind is None:
            return super().all_reduce(data, op)
        assert op in ("mean", "max", "sum")
        keys, values = list(data), list(data.values())
        # upstream, per value: a CPU tensor (every number) goes to the accelerator device and back; a tensor already
        # on that device is reduced in place and returned
        on_cpu = kind == "numbers" or values[0].device.type == "cpu"
        packed = torch.Tensor(values) if kind == "numbers" else torch.stack([v.reshape(()) for v in values])
        if on_cpu:
            packed = packed.to(torch.cuda.current_device())
        if op == "mean":
            packed /= self.world_size
        dist.all_reduce(packed, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if on_cpu:
            packed = packed.cpu()
        if kind == "numbers":
            return dict(zip(keys, packed.tolist()))
        in_place = not on_cpu or torch.device(torch.cuda.current_device()).type == "cpu"
        out = {}
        for key, value, reduced in zip(keys, values, packed.unbind()):
            out[key] = value.copy_(reduced.view_as(value)) if in_place else reduced.reshape(value.shape).clone()
        return out

    def backward(self, loss, model, optimizer, **kwargs) -> None:
        guard = getattr(model, "nonfinite_guard", None)
        if guard is not None:
            guard.check_loss(loss)
        super().backward(loss, model, optimizer, **kwargs)

    def optimizer_step(self, optimizer, model, scheduler, name="model", **kwargs) -> None:
        guard = getattr(model, "nonfinite_guard", None)
        boundary = guard is not None and guard.before_step()
        super().optimizer_step(optimizer, model, scheduler, name=name, **kwargs)
        if boundary:
            guard.after_step()

    def get_ds_train_config(self, *args, **kwargs):
        return safe_gathers(super().get_ds_train_config(*args, **kwargs))

    def get_ds_eval_config(self, *args, **kwargs):
        return safe_gathers(super().get_ds_eval_config(*args, **kwargs))

    def load_ckpt(self, model, load_dir, tag=None, *args, **kwargs):
        if tag is None:
            choice = choose_resume_tag(load_dir, self.stage)  # CheckpointError when no tag is complete
            if choice is not None:
                for note in choice.notes(load_dir):
                    self.print(f"[openrlhf_classmate] warning: {note}")
                tag = choice.tag
        return super().load_ckpt(model, load_dir, tag, *args, **kwargs)

    def save_ckpt(self, model, save_dir, tag=None, max_num=3, max_mem=1000, client_state=None, save_latest=True,
                  metric_value=None, metric_key=None):
        """Upstream's ``save_ckpt`` (same signature and steps: save, then the metric file) with its rotation moved
        after the save (see the module docstring). The signature is pinned by ``tests/test_checkpoints.py``."""
        import deepspeed
        from openrlhf.utils.distributed_util import torch_dist_barrier_and_cuda_sync

        assert isinstance(model, deepspeed.DeepSpeedEngine)
        name = tag or f"global_step{model.global_steps}"  # DeepSpeed's name for tag=None
        # a decoupled engine is still writing when save_checkpoint returns: no marker can vouch for its files
        marked = not model.checkpoint_engine.is_decoupled()
        if self.is_rank_0():
            os.makedirs(save_dir, exist_ok=True)
            if marked:
                begin_marked_save(save_dir, name)
        torch_dist_barrier_and_cuda_sync()  # the record (and no stale marker) is on disk before any rank's file
        model.save_checkpoint(save_dir, tag=tag, client_state=client_state or {}, save_latest=save_latest)
        if self.is_rank_0() and tag is not None:  # after the save, as upstream: no metric file without a checkpoint
            self._write_ckpt_metric(os.path.join(save_dir, tag), metric_value, metric_key=metric_key)
        torch_dist_barrier_and_cuda_sync()  # every rank's files are on disk before rank 0 marks or removes anything
        if self.is_rank_0():
            if marked:
                mark_complete(os.path.join(save_dir, name), model.dp_world_size, self.stage)
            self._rotate_complete(save_dir, name, max_num, max_mem, save_latest)
        gc.collect()

    def _rotate_complete(self, save_dir: str, tag: str, max_num: int, max_mem: float, save_latest: bool) -> None:
        problem = inspect_tag(os.path.join(save_dir, tag), self.stage)
        if problem is None and save_latest and read_latest(save_dir) != tag:
            problem = f"{os.path.join(save_dir, 'latest')} does not name {tag}"
        if problem:  # e.g. a decoupled checkpoint engine still writing: keep every older tag until the next save
            self.print(f"[openrlhf_classmate] warning: checkpoint {tag} is not complete yet ({problem}); older "
                       "checkpoints are kept")
            return
        for path, why in rotate_tags(save_dir, tag, max_num, max_mem, self._read_ckpt_metric, self.stage):
            self.print(f"Deleted checkpoint {path} ({why})")

    def save_model(self, model, tokenizer, output_dir, **kwargs) -> None:
        super().save_model(model, tokenizer, output_dir, **kwargs)
        ckpt = self.args.ckpt
        folder = os.path.abspath(output_dir)
        if self.is_rank_0() and folder.endswith("_hf") and os.path.dirname(folder) == os.path.abspath(ckpt.path):
            for name in rotate_hf_folders(ckpt.path, ckpt.max_num):
                self.print(f"Deleted HF checkpoint {os.path.join(ckpt.path, name)} (--ckpt.max_num {ckpt.max_num})")


def get_strategy(args) -> ResilientDeepspeedStrategy:
    """Upstream ``openrlhf.utils.get_strategy(args)``, turned into the subclass (which adds no state)."""
    from openrlhf.utils import get_strategy as upstream_get_strategy

    strategy = upstream_get_strategy(args)
    if type(strategy) is not DeepspeedStrategy:
        raise TypeError(f"openrlhf.utils.get_strategy returned {type(strategy).__name__}, not DeepspeedStrategy")
    strategy.__class__ = ResilientDeepspeedStrategy
    return strategy

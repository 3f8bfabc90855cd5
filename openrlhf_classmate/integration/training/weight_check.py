"""Check, once per model load, that the weights in memory are the checkpoint's.

A ZeRO-3 load on DeepSpeed's CPU accelerator left uninitialised memory in parameters (a DeepSpeed gather defect:
:func:`openrlhf_classmate.integration.training.strategy.safe_gathers` has the cause and the workaround): nothing failed, the reference model simply computed NaN or silently wrong log-probs. Since a loader defect of
this kind can only be seen by comparing, every policy and reference model is compared with its safetensors files
right after ``from_pretrained``, before DeepSpeed wraps it:

* each parameter is gathered alone (``GatheredParameters([p])`` under ZeRO-3: one parameter's memory at a time) and
  compared byte for byte with the checkpoint tensor cast to the parameter's dtype (the cast the loader does);
* every rank compares (each has the gathered tensor), so every rank stops with the same one-line error, naming the
  parameter and the model path;
* cost: one read of the checkpoint (memory-mapped), a byte compare, and under ZeRO-3 one all-gather of each
  parameter (the volume of one ZeRO-3 forward): for Qwen2.5-0.5B's shape (290 tensors, 942 MiB bf16) 0.5-0.7 s
  measured in one process on this project's 2-core CPU machine, plus the gathers under ZeRO-3.

:class:`LoadCheckedActor` is upstream's ``Actor`` plus this check; ``integration.training.actor.install_worker_actor`` makes
the policy and reference workers build it (combined with the chunked-log-prob ``Actor`` of ``--logprobs.chunked``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import torch
from openrlhf.models import Actor

from openrlhf_classmate.errors import TrainingStopped

PEFT_PREFIX = "base_model.model."


@dataclass
class WeightCheck:
    """What :func:`verify_loaded_weights` compared: parameters and bytes checked, names it could not find."""

    checked: int = 0
    bytes: int = 0
    seconds: float = 0.0
    not_in_checkpoint: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing was compared (no safetensors files)

    def line(self, path: str) -> str:
        if self.skipped:
            return f"weight check of {path} skipped: {self.skipped}"
        text = (f"weights of {path} match the checkpoint: {self.checked} parameters ({self.bytes / 2**20:.1f} MiB) "
                f"compared in {self.seconds:.2f} s")
        if self.not_in_checkpoint:
            text += (f"; {len(self.not_in_checkpoint)} not in the checkpoint (not compared, e.g. "
                     f"{self.not_in_checkpoint[0]})")
        return text


def safetensors_files(path: str) -> list[str]:
    """The safetensors files of a model folder (or a hub id already in the local cache); [] if there are none."""
    if not os.path.isdir(path):
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(path, local_files_only=True, allow_patterns=["*.safetensors", "*.json"])
        except Exception:  # noqa: BLE001 - not a local model: nothing to compare with
            return []
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, n) for n in names]
    single = os.path.join(path, "model.safetensors")
    return [single] if os.path.isfile(single) else []


def checkpoint_key(name: str, keys: set[str], prefix: str) -> str | None:
    """The checkpoint key of model parameter ``name`` (PEFT wrapping and the base-model prefix undone)."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):].replace(".base_layer.", ".")
    candidates = [name]
    if prefix:
        candidates += [name[len(prefix) + 1:]] if name.startswith(prefix + ".") else [f"{prefix}.{name}"]
    return next((c for c in candidates if c in keys), None)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` as the widest integers that tile them (a byte-exact compare, 8 bytes per element)."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if flat.numel() % size == 0 and (flat.storage_offset() % size == 0):
            return flat.view(dtype)
    return flat


def describe_mismatch(loaded: torch.Tensor, expected: torch.Tensor) -> str:
    """``k/n values differ (m non-finite; max |difference| d)`` for two same-shape tensors."""
    a, b = loaded.detach().double().reshape(-1).cpu(), expected.detach().double().reshape(-1).cpu()
    differ = ~((a == b) | (a.isnan() & b.isnan()))
    nonfinite = int((~torch.isfinite(a)).sum())
    both = differ & torch.isfinite(a) & torch.isfinite(b)
    text = f"{int(differ.sum())}/{a.numel()} values differ ({nonfinite} non-finite in memory"
    if bool(both.any()):
        text += f"; max |difference| of the finite ones {float((a[both] - b[both]).abs().max()):.3g}"
    return text + ")"


def verify_loaded_weights(model: torch.nn.Module, path: str, *, zero3: bool) -> WeightCheck:
    """Compare every parameter of ``model`` (just loaded from ``path``) with the checkpoint, one at a time.

    Under ZeRO-3 every rank must call this (each parameter is gathered). Raises ``TrainingStopped`` with one line
    at the first parameter that differs; the result lists what was compared."""
    from safetensors import safe_open

    files = safetensors_files(path)
    if not files:
        return WeightCheck(skipped="no safetensors files to compare with")
    start = time.perf_counter()
    handles = [safe_open(f, framework="pt", device="cpu") for f in files]
    where = {key: h for h in handles for key in h.keys()}
    prefix = getattr(model, "base_model_prefix", "") or getattr(getattr(model, "base_model", None),
                                                                  "base_model_prefix", "")
    keys = set(where)
    report = WeightCheck()
    for name, param in model.named_parameters():
        key = checkpoint_key(name, keys, prefix)
        if key is None:
            report.not_in_checkpoint.append(name)
            continue
        expected = where[key].get_tensor(key)
        with _gathered(param, zero3):
            loaded = param.data
            if tuple(loaded.shape) != tuple(expected.shape):
                problem = f"shape {tuple(loaded.shape)} in memory, {tuple(expected.shape)} in the checkpoint"
            else:
                expected = expected.to(device=loaded.device, dtype=loaded.dtype)
                problem = None if torch.equal(_bytes(loaded), _bytes(expected)) else describe_mismatch(loaded,
                                                                                                       expected)
            report.checked += 1
            report.bytes += loaded.numel() * loaded.element_size()
        if problem:
            named = name if key == name else f"{name} (checkpoint key {key})"
            raise _stop(f"the weights loaded from {path} are not the checkpoint's: parameter {named}: {problem}; "
                        "refusing to train on a wrongly loaded model")
    report.seconds = time.perf_counter() - start
    return report


def _gathered(param: torch.nn.Parameter, zero3: bool):
    import contextlib

    if not (zero3 and hasattr(param, "ds_id")):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param])  # one parameter: DeepSpeed's synchronous gather


def _stop(message: str) -> TrainingStopped:
    return TrainingStopped(f"error: {message}")


class LoadCheckedActor(Actor):
    """Upstream's ``Actor``; a model loaded from a path is compared with its checkpoint before anything uses it
    (before DeepSpeed wraps it, and before a resumed run loads its DeepSpeed checkpoint over it)."""

    def __init__(self, pretrain_or_model, *args, **kwargs):
        super().__init__(pretrain_or_model, *args, **kwargs)
        if not isinstance(pretrain_or_model, str):
            return
        if kwargs.get("load_in_4bit"):
            report = WeightCheck(skipped="4-bit quantised weights are not the checkpoint's bytes")
        else:
            ds_config = kwargs.get("ds_config") or {}
            zero3 = ds_config.get("zero_optimization", {}).get("stage") == 3
            report = verify_loaded_weights(self.model, pretrain_or_model, zero3=zero3)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"[openrlhf_classmate] {report.line(pretrain_or_model)}", flush=True)


def load_checked_class(base: type[Actor]) -> type[LoadCheckedActor]:
    """``base`` (upstream's ``Actor`` or a subclass, e.g. the chunked one) with the load check, for upstream to
    construct as its ``Actor``."""
    if issubclass(base, LoadCheckedActor):
        return base
    if base is Actor:
        return LoadCheckedActor
    return type(base.__name__, (LoadCheckedActor, base), {})

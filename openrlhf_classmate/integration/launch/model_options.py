"""Upstream's model and parallelism options in our runs: ``--ds.lora.*``, ``--ds.ring_attn_size``,
``--ds.tensor_parallel_size`` and ``--ds.use_liger_kernel``. Each works as upstream defines it, or is refused before
Ray starts with one ``error:`` line (:func:`validate_model_options`, after the classmate checks):

* ``--ds.lora.rank`` > 0: upstream's ``Actor`` wraps the policy in a peft LoRA model; the reference (and a classmate,
  even one that is the initial policy) is built from the checkpoint on disk, so it stays the base model. The HF
  engines get the merged weights (``integration.training.actor.engine_state_dict``; ``tests/test_lora.py``). With vLLM
  engines upstream 0.11.2's ``broadcast_to_vllm`` sends the adapter's own parameter names (``base_model.model.*``,
  ``lora_A`` / ``lora_B``), which vLLM's ``load_weights`` cannot place (OpenRLHF issues #991, #1081, #1349): refused.
* ``--ds.ring_attn_size`` > 1 splits each packed sequence across ranks; it needs flash-attn's varlen kernels and the
  ``ring_flash_attn`` package (GPU only, not in requirements.txt) and has never run with the classmate's per-token
  tensors (classmate advantages, CoT mask, classmate log-probs): refused with a classmate, and in any run where
  those packages are missing.
* ``--ds.tensor_parallel_size`` > 1 (DeepSpeed AutoTP, bf16 only): every rank of a TP group gets the same
  micro-batch, and the classmate tensors would travel through upstream's de-duplication of those copies, which no
  classmate run has exercised: refused with a classmate. AutoTP itself trains on CPU (gloo), but the HF engines'
  weight sync gathers ZeRO-3 partitions only, not AutoTP shards (upstream's vLLM sync gathers them): refused with HF
  engines in any run.
* ``--ds.use_liger_kernel`` swaps the model class for liger's (Triton kernels for norms, RoPE and MLP; the fused
  linear cross-entropy only when labels are passed, which upstream's actor forward never does), so the log-probs that
  both loss terms read would be the usual ones; but it needs Triton on a GPU and no classmate run has used it, so it
  is refused with a classmate (one line) until a GPU run verifies it. The package is not in requirements.txt: refused
  in any run where it is not installed.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from openrlhf_classmate.integration.classmate_config import _fail, classmate_enabled, real_package


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def validate_model_options(args: SimpleNamespace) -> None:
    """Refuse the upstream model options that cannot work in this run (module docstring); changes nothing."""
    ds = args.ds
    if classmate_enabled(args):
        if ds.ring_attn_size > 1:
            _fail(f"--ds.ring_attn_size {ds.ring_attn_size} with a classmate: ring attention splits each sequence "
                  "across ranks and has never run with the classmate's per-token tensors (it needs flash-attn and "
                  "GPUs): drop it (--ds.packing_samples / --train.dynamic_batch_enable keep long batches dense)")
        if ds.tensor_parallel_size > 1:
            _fail(f"--ds.tensor_parallel_size {ds.tensor_parallel_size} with a classmate: DeepSpeed AutoTP duplicates "
                  "each micro-batch across the TP ranks, a path the classmate tensors have never run through: drop "
                  "it (ZeRO-3 with --ds.adam_offload shards a model that does not fit one GPU)")
        if ds.use_liger_kernel:
            _fail("--ds.use_liger_kernel with a classmate: liger's kernels need Triton on a GPU and have never run in "
                  "a classmate run (nothing here verifies the log-probs both loss terms read): drop it")
    if ds.tensor_parallel_size > 1 and args.engine.backend == "hf":
        _fail(f"--ds.tensor_parallel_size {ds.tensor_parallel_size} with HF engines: their weight sync gathers ZeRO-3 "
              "partitions, not AutoTP shards, so the engines would get one shard per weight: use vLLM engines "
              "(upstream's sync gathers the shards) or drop --ds.tensor_parallel_size")
    if ds.use_liger_kernel and not _installed("liger_kernel"):
        _fail("--ds.use_liger_kernel loads the policy and reference through the liger-kernel package, which is not "
              "installed (it is not in requirements.txt and needs a GPU with Triton): pip install liger-kernel, or "
              "drop --ds.use_liger_kernel")
    if ds.ring_attn_size > 1 and not (real_package("flash_attn") and _installed("ring_flash_attn")):
        _fail(f"--ds.ring_attn_size {ds.ring_attn_size} needs flash-attn and the ring_flash_attn package (GPU only), "
              "which are not installed: drop --ds.ring_attn_size")
    if ds.lora.rank > 0 and args.engine.backend == "vllm" and (args.vllm.num_engines or 0) > 0:
        _fail(f"--ds.lora.rank {ds.lora.rank} with vLLM engines: upstream's weight sync sends the LoRA adapter's "
              "parameter names, which vLLM cannot load (OpenRLHF issues #991, #1081, #1349): train without LoRA, "
              "or use --engine.backend hf")

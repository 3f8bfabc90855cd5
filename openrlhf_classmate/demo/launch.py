"""RL stage of the demo: the real launcher (``python -m openrlhf_classmate.cli.train_ppo_ray``) as a subprocess.

Ray starts locally with logical GPUs, DeepSpeed runs on its CPU accelerator and both engine groups (policy and
classmate) are HF-transformers engines, exactly as ``tests/test_e2e_cpu.py`` runs it. The full log goes to
``<run_dir>/launcher.log``; each ``Global step`` line of the controller is turned into one progress line.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

STEP_LINE = re.compile(r"Global step (\d+): (\{.*\})")
NON_FINITE = re.compile(r"(?<![\w'\"])-?(?:nan|inf)(?![\w'\"])")


@dataclass(frozen=True)
class RLConfig:
    steps: int
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    lr: float = 1e-3
    save_every: int = 5  # HF checkpoints for the held-out curves
    max_new_tokens: int = 24
    classmate_max_new_tokens: int = 4


def parse_step_line(line: str) -> tuple[int, dict] | None:
    """``(step, status)`` of the controller's ``Global step N: {...}`` line, or None for any other line. Non-finite
    values (printed ``nan`` / ``inf``) become None; a status that does not parse becomes ``{}``."""
    match = STEP_LINE.search(line)
    if not match:
        return None
    try:
        status = ast.literal_eval(NON_FINITE.sub("None", match.group(2)))
    except (ValueError, SyntaxError):
        status = {}
    return int(match.group(1)), status if isinstance(status, dict) else {}


def _run_argv(run_dir: str, policy: str, prompts: str, cfg: RLConfig, seed: int, classmate: str | None,
              max_len: int) -> list[str]:
    """The flags both demos share. ``classmate=None`` is plain GRPO (upstream ``group_norm``), otherwise classmate
    GDPO."""
    batch = cfg.prompts_per_step * cfg.samples_per_prompt
    micro = str(min(128, batch))
    argv = [
        "--actor.model_name_or_path", policy, "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
        "--data.prompt_dataset", prompts, "--data.input_key", "prompt", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", str(max_len),
        "--data.max_samples", str(cfg.steps * cfg.prompts_per_step),  # one pass, one prompt batch per step
        "--rollout.max_new_tokens", str(cfg.max_new_tokens), "--rollout.temperature", "1.0",
        "--rollout.batch_size", str(cfg.prompts_per_step), "--rollout.n_samples_per_prompt",
        str(cfg.samples_per_prompt), "--rollout.micro_batch_size", micro,
        "--train.batch_size", str(batch), "--train.micro_batch_size", micro,  # one optimizer step per rollout
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", str(seed),
        "--algo.kl.init_coef", "0",  # no reference model (as configs/classmate_gdpo.yaml)
        "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.adam.lr", str(cfg.lr), "--actor.lr_warmup_ratio", "0",
        "--ckpt.path", os.path.join(run_dir, "ckpt"), "--ckpt.output_dir", os.path.join(run_dir, "final"),
        "--ckpt.save_steps", str(cfg.save_every),
        "--logger.tensorboard_dir", os.path.join(run_dir, "tensorboard"),
    ]
    if classmate:
        argv += [
            "--classmate.model_name_or_path", classmate, "--classmate.estimator", "gdpo",
            "--classmate.max_new_tokens", str(cfg.classmate_max_new_tokens),
            "--classmate.temperature", "0",  # the classmate reads the CoT greedily (as in evaluation)
        ]
    else:
        argv += ["--algo.advantage.estimator", "group_norm"]
    return argv


def launcher_argv(run_dir: str, policy: str, prompts: str, cfg: RLConfig, seed: int,
                  classmate: str | None) -> list[str]:
    """Flags of one CPU demo run: HF engines, actor and reference colocated, HF checkpoints for the held-out
    curves."""
    return _run_argv(run_dir, policy, prompts, cfg, seed, classmate, max_len=64) + [
        "--train.colocate_actor_ref", "--vllm.sync_backend", "gloo",
        "--engine.backend", "hf", "--engine.hf_max_batch", str(cfg.prompts_per_step * cfg.samples_per_prompt),
        "--ckpt.save_hf", "--ckpt.disable_ds",
        "--ckpt.max_num", str(cfg.steps // cfg.save_every + 1),  # keep every HF checkpoint (they rotate with it)
    ]


ENGINE_MEMORY = {"policy": 0.2, "classmate": 0.15}  # fractions of the GPU (those of the vllm1 validation runs)
# KV cache per engine, fixed (--engine.kv_cache_gib): a step's 512 sequences of <= 176 tokens need ~1.4 GiB in the
# policy's cache (8 layers x K and V x 512 x bf16 = 16 KiB a token). Fixed, vLLM does not profile the GPU's memory,
# so the engines start together and two runs can share the GPU (the demo's parallel mode)
KV_CACHE_GIB = 2.0


def gpu_launcher_argv(run_dir: str, policy: str, prompts: str, cfg: RLConfig, seed: int, classmate: str | None, *,
                      engine: str, max_len: int, enforce_eager: bool = False) -> list[str]:
    """Flags of one GPU demo run: the production single-GPU layout (``configs/classmate_gdpo.yaml``): actor and
    engines colocated (``--train.colocate_all``), vLLM sleep mode between rollouts, the classmate engine in the
    actor's placement group (``colocate``, sleeping too), CUDA graphs (no ``--vllm.enforce_eager``), and the weight
    sync upstream picks there (CUDA IPC under ``colocate_all`` with ``--vllm.sync_backend nccl``). DeepSpeed
    checkpoints every ``cfg.save_every`` steps and ``--ckpt.load_enable``, so a stopped run resumes where it
    stopped. ``engine="hf"``: the same flags with HF-transformers engines and gloo (the CPU check).
    ``enforce_eager``: no CUDA graphs (a fallback for a machine where their capture fails)."""
    argv = _run_argv(run_dir, policy, prompts, cfg, seed, classmate, max_len) + [
        "--train.colocate_all", "--vllm.enable_sleep", "--engine.backend", engine,
        "--ckpt.max_num", "2", "--ckpt.load_enable",
        # the demo's report follows the mismatch over every step (its policy is small enough for the cost)
        "--engine.mismatch_interval", "1",
    ]
    if engine == "vllm":
        argv += ["--vllm.sync_backend", "nccl", "--vllm.gpu_memory_utilization", str(ENGINE_MEMORY["policy"]),
                 "--engine.kv_cache_gib", str(KV_CACHE_GIB)]
        argv += ["--vllm.enforce_eager"] if enforce_eager else []
    else:
        argv += ["--vllm.sync_backend", "gloo",
                 "--engine.hf_max_batch", str(cfg.prompts_per_step * cfg.samples_per_prompt)]
    if classmate:
        argv += ["--classmate.placement", "colocate"]
        if engine == "vllm":
            argv += ["--classmate.gpu_memory_utilization", str(ENGINE_MEMORY["classmate"])]
    return argv


def run_launcher(run_dir: str, argv: list[str], on_step: Callable[[int, dict, float], None],
                 env_overrides: dict[str, str] | None = None, timeout: float = 3600) -> float:
    """Run the launcher, calling ``on_step(step, metrics, elapsed)`` per training step; returns the wall time.

    Raises ``RuntimeError`` with the log's tail when the launcher fails."""
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", RAY_DEDUP_LOGS="0", **(env_overrides or {}))
    log_path = os.path.join(run_dir, "launcher.log")
    command = [sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv]
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(command) + "\n")
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        try:
            for line in proc.stdout:
                log.write(line)
                parsed = parse_step_line(line)
                if parsed:
                    on_step(*parsed, time.time() - start)
                if time.time() - start > timeout:
                    proc.kill()
                    raise RuntimeError(f"the launcher ran past {timeout:.0f}s; log: {log_path}")
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        raise RuntimeError(f"the launcher exited with {proc.returncode} (log: {log_path}); tail:\n{tail}")
    return time.time() - start


def checkpoints(run_dir: str) -> dict[int, str]:
    """``{step: hf_dir}`` of the periodic HF checkpoints (``ckpt/global_step{N}_hf``) plus the final model."""
    out = {}
    ckpt = os.path.join(run_dir, "ckpt")
    for name in os.listdir(ckpt) if os.path.isdir(ckpt) else []:
        match = re.fullmatch(r"global_step(\d+)_hf", name)
        if match:
            out[int(match.group(1))] = os.path.join(ckpt, name)
    return out

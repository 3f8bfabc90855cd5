"""A tiny end-to-end world for the CPU (and GPU validation) runs of the launcher: two random tiny models sharing a
five-digit vocabulary, and a jsonl of one-digit additions scored by the ``arithmetic`` scorer. The vocabulary is
small on purpose: random models then emit ``</think>`` and correct digits often enough that rewards vary, so the
policy loss and its gradient are not zero and a two-step run really changes the weights."""

from __future__ import annotations

import json
import os
import random

from openrlhf_classmate.testing.tiny_models import save_tiny_model

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


def build_world(root: str, num_prompts: int = 16, seed: int = 0, judged: bool = False) -> dict[str, str]:
    """``judged``: the rows are rated by the LLM judge (data source ``helpful_instructions``) instead of the
    ``arithmetic`` scorer; each row's question carries ``[[fake:key=rowN]]`` for the fake judge server (see
    :mod:`openrlhf_classmate.scoring.testing_server`), so a test can tell which rows a step scored."""
    os.makedirs(root, exist_ok=True)
    policy = save_tiny_model(os.path.join(root, "policy"), WORDS, hidden_size=32, seed=seed)
    classmate = save_tiny_model(os.path.join(root, "classmate"), WORDS, hidden_size=16, seed=seed + 1)
    rng = random.Random(seed)
    data = os.path.join(root, "train.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(num_prompts):
            a = rng.randint(0, 4)
            b = rng.randint(0, 4 - a)
            messages = [{"role": "user", "content": f"{a} + {b} = ?"}]
            if judged:
                label = {"data_source": "helpful_instructions", "ground_truth": None,
                         "raw_question_for_monitor": f"{a} + {b} = ? [[fake:key=row{i}]]", "messages": messages}
            else:
                label = {"data_source": "arithmetic", "ground_truth": str(a + b), "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    return {"root": root, "policy": policy, "classmate": classmate, "data": data}


def launcher_argv(world: dict[str, str], classmate: bool = True, zero_stage: int = 2, max_samples: int = 8,
                  num_episodes: int = 1, estimator: str = "separated", extra: list[str] | None = None) -> list[str]:
    """Flags of a 2-step run (8 prompts x 4 samples, rollout batch 4) with checkpoints every step."""
    root = world["root"]
    argv = [
        "--actor.model_name_or_path", world["policy"], "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1", "--train.colocate_actor_ref",
        "--vllm.num_engines", "1", "--vllm.sync_backend", "gloo",
        "--data.prompt_dataset", world["data"], "--data.input_key", "prompt", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "64", "--data.max_samples", str(max_samples),
        "--rollout.max_new_tokens", "16", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
        "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--train.micro_batch_size", "4",
        "--train.max_epochs", "1", "--train.num_episodes", str(num_episodes),
        "--algo.kl.init_coef", "0.01", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--ds.zero_stage", str(zero_stage), "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.adam.lr", "1e-3", "--actor.lr_warmup_ratio", "0",  # no warm-up: a 2-step run must move weights
        "--ckpt.path", os.path.join(root, "ckpt"), "--ckpt.output_dir", os.path.join(root, "hf_final"),
        "--ckpt.save_steps", "1", "--ckpt.save_hf", "--logger.tensorboard_dir", os.path.join(root, "tb"),
    ]
    if classmate:
        argv += ["--classmate.model_name_or_path", world["classmate"], "--classmate.max_new_tokens", "8",
                 "--classmate.estimator", estimator]
    else:
        argv += ["--algo.advantage.estimator", "group_norm"]
    return argv + list(extra or [])


def run_launcher(argv: list[str], log_path: str, cwd: str | None = None, timeout: int = 900,
                 env: dict[str, str] | None = None) -> int:
    """Run the launcher as a subprocess (as a user would), output to ``log_path``; returns the exit code."""
    import subprocess
    import sys

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
           **(env or {})}
    with open(log_path, "w") as log:
        return subprocess.run([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], cwd=cwd,
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode


def tensorboard_scalars(tb_dir: str) -> dict[str, dict[int, float]]:
    """All scalars under ``tb_dir``: {tag: {step: value}}."""
    import glob

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for path in glob.glob(os.path.join(tb_dir, "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def model_weights(path: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_weight_change(before: dict, after: dict) -> float:
    if before.keys() != after.keys():
        raise ValueError(f"different parameter names: {sorted(before.keys() ^ after.keys())[:5]}")
    return max(float((before[k] - after[k]).abs().max()) for k in before)

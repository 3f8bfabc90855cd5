"""A tiny end-to-end world for the CPU (and GPU validation) runs of the launcher: two random tiny models sharing a
five-digit vocabulary, and a jsonl of one-digit additions scored by the ``arithmetic`` scorer. The vocabulary is
small on purpose: random models then emit ``</think>`` and correct digits often enough that rewards vary, so the
policy loss and its gradient are not zero and a two-step run really changes the weights.

``build_bpe_world`` is the same world over realistic tokenizers (:mod:`openrlhf_classmate.testing.bpe_world`): a
Qwen3-like policy and a SentencePiece-style classmate."""

from __future__ import annotations

import json
import os
import random

from openrlhf_classmate.testing.tiny_models import save_tiny_model
from openrlhf_classmate.testing.watchdog import (  # noqa: F401  (kill_session, release_build_locks, stop_session: re-exported)
    HARD_TIMEOUT,
    QUIET,
    TIMEOUT_EXIT,
    kill_session,
    release_build_locks,
    run_watched,
    stop_session,
)

WORDS = ["0", "1", "2", "3", "4", "+", "=", "?"]


def build_world(root: str, num_prompts: int = 16, seed: int = 0, policy_hidden: int = 32, classmate_hidden: int = 16,
                num_heads: int = 4, judged: bool = False, judge_directives: dict[int, str] | None = None
                ) -> dict[str, str]:
    """The world under ``root``. Real vLLM needs a head dimension its kernels accept (``hidden / num_heads`` a
    multiple of 8, 32 or more): the GPU runs use ``policy_hidden=classmate_hidden=256`` with 4 heads.

    ``judged``: the rows are rated by the LLM judge (data source ``helpful_instructions``) instead of the
    ``arithmetic`` scorer; each row's question carries ``[[fake:key=rowN]]`` for the fake judge server (see
    :mod:`openrlhf_classmate.testing.judge_server`), so a test can tell which rows a step scored;
    ``judge_directives`` adds more to the questions of some rows (row index -> e.g. ``"[[fake:malformed]]"``)."""
    os.makedirs(root, exist_ok=True)
    policy = save_tiny_model(os.path.join(root, "policy"), WORDS, hidden_size=policy_hidden, num_heads=num_heads,
                             seed=seed)
    classmate = save_tiny_model(os.path.join(root, "classmate"), WORDS, hidden_size=classmate_hidden,
                                num_heads=num_heads, seed=seed + 1)
    rng = random.Random(seed)
    data = os.path.join(root, "train.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for i in range(num_prompts):
            a = rng.randint(0, 4)
            b = rng.randint(0, 4 - a)
            messages = [{"role": "user", "content": f"{a} + {b} = ?"}]
            if judged:
                label = {"data_source": "helpful_instructions", "ground_truth": None,
                         "raw_question_for_monitor": f"{a} + {b} = ? [[fake:key=row{i}]]"
                                                     + (f" {judge_directives[i]}" if i in (judge_directives or {}) else ""),
                         "messages": messages}
            else:
                label = {"data_source": "arithmetic", "ground_truth": str(a + b), "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    return {"root": root, "policy": policy, "classmate": classmate, "data": data}


def one_row_world(root: str) -> tuple[str, str]:
    """The smallest world a launcher takes: a one-layer policy (hidden 8) over five words and a one-row arithmetic
    data file under ``root``; returns (policy folder, data file)."""
    os.makedirs(root, exist_ok=True)
    policy = save_tiny_model(os.path.join(root, "policy"), ["1", "2", "+", "=", "?"], hidden_size=8, num_layers=1,
                             num_heads=2)
    data = os.path.join(root, "train.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.write(json.dumps({"prompt": "1 + 1 = ?", "label": json.dumps(
            {"data_source": "arithmetic", "ground_truth": "2"})}) + "\n")
    return policy, data


def one_step_argv(policy: str, data: str, ckpt: str, output_dir: str) -> list[str]:
    """Flags of a one-step plain-GRPO run of :func:`one_row_world` (2 samples of the one prompt, twice), checkpoints
    in ``ckpt``, the final model in ``output_dir``."""
    return ["--actor.model_name_or_path", policy, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
            "--vllm.num_engines", "1", "--data.prompt_dataset", data, "--data.input_key", "prompt",
            "--data.label_key", "label", "--data.max_len", "64", "--rollout.max_new_tokens", "16",
            "--rollout.batch_size", "2", "--rollout.micro_batch_size", "2", "--rollout.n_samples_per_prompt", "2",
            "--train.batch_size", "4", "--train.micro_batch_size", "2", "--algo.advantage.estimator", "group_norm",
            "--classmate.final_answer", "whole_response", "--ckpt.path", ckpt, "--ckpt.output_dir", output_dir]


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


def run_launcher(argv: list[str], log_path: str, cwd: str | None = None, timeout: float | None = HARD_TIMEOUT,
                 env: dict[str, str] | None = None, quiet: float = QUIET) -> int:
    """Run the launcher as a subprocess (as a user would), output to ``log_path``; returns the exit code.

    It runs under :func:`~openrlhf_classmate.testing.watchdog.run_watched`: the whole session (the launcher, its local
    Ray cluster, engine processes) is killed when the log has not grown for ``quiet`` seconds or after ``timeout``
    seconds in all, and the result is then :data:`TIMEOUT_EXIT` (124, as ``timeout(1)``), so a caller can go on with a
    clean machine. No limit depends on how fast the machine is: a loaded machine slows a run, it does not silence it."""
    import sys

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
           **(env or {})}
    return run_watched([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], log_path, cwd=cwd,
                       env=env, quiet=quiet, timeout=timeout)


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


def build_bpe_world(root: str, num_prompts: int = 16, seed: int = 0, warm_steps: int = 120) -> dict[str, str]:
    """The end-to-end world over real-style tokenizers: a Qwen3-like policy (byte-level BPE, ChatML,
    stops on ``<|im_end|>`` and ``<|endoftext|>``) and a SentencePiece-style classmate (another vocabulary: the CoT
    is re-tokenised), both tiny. The policy is warm-started for a few seconds on responses
    ``<think>a + b = c</think>\\n\\nc<|im_end|>`` of which a quarter write ``</think>`` as ordinary pieces and a
    quarter stop on ``<|endoftext|>``, so its rollouts hold genuine close tags, typed ones and both stop ids."""
    from openrlhf_classmate.testing.bpe_world import save_world_model

    os.makedirs(root, exist_ok=True)
    policy = save_world_model("qwen3", os.path.join(root, "policy"), hidden_size=32, seed=seed)
    classmate = save_world_model("sentencepiece", os.path.join(root, "classmate"), hidden_size=16, seed=seed + 1)
    rng = random.Random(seed)
    data = os.path.join(root, "train.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(num_prompts):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            messages = [{"role": "user", "content": f"{a} + {b} = ?"}]
            label = {"data_source": "arithmetic", "ground_truth": str(a + b), "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    _warm_start_mixed_close_tags(policy, warm_steps, seed)
    return {"root": root, "policy": policy, "classmate": classmate, "data": data}


def _warm_start_mixed_close_tags(path: str, steps: int, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openrlhf_classmate.algo.classmate_prompt import encode_text

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    open_id, close_id = tok.convert_tokens_to_ids(["<think>", "</think>"])
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    rng = random.Random(seed)
    examples = []
    for i in range(64):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = tok.apply_chat_template([{"role": "user", "content": f"{a} + {b} = ?"}], add_generation_prompt=True,
                                         tokenize=False)
        close = encode_text(tok, "</think>") if i % 4 == 1 else [close_id]
        stop = endoftext if i % 4 == 2 else im_end
        response = [open_id] + encode_text(tok, f"{a} + {b} = {a + b}") + close + encode_text(tok, f"\n\n{a + b}")
        examples.append((tok(prompt, add_special_tokens=False)["input_ids"], response + [stop]))
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        batch = [examples[(step * 16 + j) % len(examples)] for j in range(16)]
        width = max(len(p) + len(r) for p, r in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for j, (p, r) in enumerate(batch):
            ids[j, : len(p) + len(r)] = torch.tensor(p + r)
            labels[j, len(p): len(p) + len(r)] = torch.tensor(r)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(path)

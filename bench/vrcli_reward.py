"""VR-CLI reward forwards per second: batched (our hook's path) vs one blocking call per sample (the release's path).

A ``RayActorGroup`` of our reference actors (upstream's real ``ReferenceModelActor`` with the launcher's strategy
and load check; DeepSpeed, ZeRO-``--zero-stage``, bf16) holds a randomly initialised model of a real shape;
``--samples`` generator sequences of ``--seq-len`` tokens (lengths drawn from [3/4, 1] x seq-len, a fixed seed)
each score their last ``--gold-len`` tokens. Two ways to get their mean NLLs:

* ``batched``: ``openrlhf_classmate.rewards.likelihood.gold_mean_nll`` through ``group_forward``, exactly what
  ``VrcliRewardHook`` runs: one ``async_run_method_batch`` call, micro-batches of at most ``--micro-batch-size`` rows
  and ``--max-tokens-per-forward`` padded tokens, dealt to the ranks in lock-step;
* ``per_sample``: the released ``get_r_refs`` pattern, one blocking call per sequence (micro-batch of 1; with several
  ranks the other ranks run a one-row dummy, as ZeRO-3 needs every rank in every forward).

Modes alternate for ``--repeats`` rounds after a warm-up; reported: median seconds per batch of samples, sequences
and scored tokens per second, the speed-up of batched over per-sample (median of per-round ratios), and the largest
difference between the two modes' NLLs (they must agree: same model, same tokens).

    python bench/vrcli_reward.py --out bench/gpu_results          # 3B shape, 64 x 2k tokens, 1 GPU (the target)
    python bench/vrcli_reward.py --ranks 4 --out DIR             # 4 reference ranks (nvidia-h200-x4)
    python bench/vrcli_reward.py --preset tiny --samples 5 --seq-len 48 --gold-len 16 --micro-batch-size 2 \\
        --ranks 2 --zero-stage 3 --repeats 1 --out /tmp/vrcli_bench   # CPU smoke run (its test)

Writes ``<out>/vrcli_reward.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401  (CPU shims before openrlhf)

PRESETS = {
    # Qwen2.5-3B-Instruct's shape (the released 3B VR-CLI run's generator)
    "3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, vocab_size=151936),
    # Qwen2.5-0.5B's shape
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}


def make_model(path: str, preset: str, max_len: int) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    config = Qwen2Config(**PRESETS[preset], max_position_embeddings=max(4096, max_len), tie_word_embeddings=True,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # a 3B random init is minutes on a CPU
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    build_word_tokenizer([str(i) for i in range(10)]).save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the reference actor needs the memory
    return n_params


def default_attention() -> str:
    import importlib.util

    import torch

    from openrlhf_classmate import shims

    spec = importlib.util.find_spec("flash_attn")
    real = spec is not None and not (spec.origin or "").startswith(shims.SHIM_DIRS["flash_attn"])
    return "flash_attention_2" if torch.cuda.is_available() and real else "sdpa"


def build_args(model_dir: str, a):
    from openrlhf_classmate.integration.launch.args import parse_args

    argv = [
        "--actor.model_name_or_path", model_dir, "--actor.num_gpus_per_node", str(a.ranks),
        "--ref.num_gpus_per_node", str(a.ranks), "--data.prompt_dataset", "unused.jsonl", "--vllm.num_engines", "0",
        "--rollout.batch_size", str(a.samples), "--rollout.n_samples_per_prompt", "1",
        "--train.batch_size", str(a.ranks), "--train.micro_batch_size", "1", "--ds.zero_stage", str(a.zero_stage),
        "--ds.param_dtype", "bf16", "--ds.attn_implementation", a.attn, "--algo.kl.init_coef", "0.001",
        "--algo.advantage.estimator", "reinforce", "--data.max_len", str(a.seq_len), "--engine.backend", "hf",
    ]
    if a.ref_offload:
        argv.append("--ref.offload")
    return parse_args(argv)


def make_items(a, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(1)
    items = []
    for _ in range(a.samples):
        n = rng.randint(a.seq_len - a.seq_len // 4, a.seq_len)
        items.append(([rng.randrange(10, vocab) for _ in range(n)], n - a.gold_len))
    return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="3b")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=2048, help="longest generator sequence (prompt + plan + gold)")
    p.add_argument("--gold-len", type=int, default=512, help="scored tokens at the end of each sequence")
    p.add_argument("--micro-batch-size", type=int, default=8, help="--vrcli.micro_batch_size")
    p.add_argument("--max-tokens-per-forward", type=int, default=16384, help="--vrcli.max_tokens_per_forward")
    p.add_argument("--ranks", type=int, default=1, help="reference actors (one GPU each)")
    p.add_argument("--zero-stage", type=int, default=3)
    p.add_argument("--ref-offload", action="store_true", help="--ref.offload (ZeRO-3 parameter offload)")
    p.add_argument("--attn", default=None, help="attention implementation (default: flash_attention_2 with a GPU)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True, help="output directory (vrcli_reward.json is written there)")
    a = p.parse_args()
    if a.gold_len >= a.seq_len - a.seq_len // 4:
        p.error("--gold-len must be shorter than the shortest sequence (3/4 of --seq-len)")
    a.attn = a.attn or default_attention()

    import ray
    import torch
    from openrlhf.trainer.ray.launcher import RayActorGroup

    from openrlhf_classmate.cli.train_ppo_ray import init_ray
    from openrlhf_classmate.integration.training.actor import ClassmateReferenceModelActor
    from openrlhf_classmate.integration.training.strategy import get_strategy
    from openrlhf_classmate.rewards.likelihood import gold_mean_nll, group_forward

    model_dir = tempfile.mkdtemp(prefix="vrcli_bench_")
    n_params = make_model(model_dir, a.preset, a.seq_len)
    args = build_args(model_dir, a)
    init_ray(args, {})
    strategy = get_strategy(args)
    # the launcher's strategy and reference actor: on CPU, ZeRO-3 loading needs the strategy's safe gathers (upstream's
    # strategy loaded garbage into a weight in about 1 of 4 starts: the NaN this bench's test used to see)
    group = RayActorGroup(1, a.ranks, ray.remote(num_gpus=1)(ClassmateReferenceModelActor), pg=None,
                          num_gpus_per_actor=1)
    ray.get(group.async_init_model_from_pretrained(strategy, model_dir))
    items = make_items(a, PRESETS[a.preset]["vocab_size"])
    forward = group_forward(group)

    def batched():
        return gold_mean_nll(forward, items, pad_id=0, micro_batch_size=a.micro_batch_size,
                             max_tokens=a.max_tokens_per_forward or None, ranks=a.ranks)

    def per_sample():
        return [gold_mean_nll(forward, [item], pad_id=0, micro_batch_size=1, ranks=a.ranks)[0] for item in items]

    modes = {"batched": batched, "per_sample": per_sample}
    times: dict[str, list[float]] = {m: [] for m in modes}
    nll: dict[str, list[float]] = {}
    for r in range(a.warmup + a.repeats):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            nll[name] = fn()
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
        if r >= a.warmup:
            print(f"round {r + 1 - a.warmup}/{a.repeats}: " + ", ".join(f"{m} {times[m][-1]:.3f}s" for m in modes),
                  flush=True)
    tokens = sum(a.gold_len for _ in items)
    results = {}
    for name in modes:
        t = statistics.median(times[name])
        results[name] = {"seconds": t, "times": times[name], "sequences_per_s": len(items) / t,
                         "scored_tokens_per_s": tokens / t,
                         "tokens_per_s": sum(len(ids) for ids, _ in items) / t}
    speedup = statistics.median(s / b for s, b in zip(times["per_sample"], times["batched"]))
    diff = max(abs(x - y) for x, y in zip(nll["batched"], nll["per_sample"]))
    report = {
        "config": vars(a), "params": n_params, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available()
        else "cpu", "results": results, "speedup_batched_over_per_sample": speedup,
        "max_abs_nll_difference": diff, "mean_nll": statistics.fmean(nll["batched"]),
    }
    print(f"\nmodel {a.preset} ({n_params / 1e6:.1f}M params), ZeRO-{a.zero_stage}, bf16, {a.attn}, {a.ranks} rank(s); "
          f"{a.samples} sequences of <= {a.seq_len} tokens ({a.gold_len} scored), micro-batch {a.micro_batch_size}")
    for name, res in results.items():
        print(f"{name:<12}{res['seconds']:>9.3f} s{res['sequences_per_s']:>10.1f} seq/s"
              f"{res['tokens_per_s']:>12,.0f} tok/s")
    print(f"speed-up batched / per-sample: {speedup:.2f}x; max |NLL difference| {diff:.2e}")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "vrcli_reward.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)
    ray.shutdown()


if __name__ == "__main__":
    main()

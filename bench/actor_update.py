"""Actor-update throughput: upstream's PolicyLoss vs the classmate losses, on OpenRLHF's real PolicyModelActor.

One ``PolicyModelActor`` (our subclass, which builds the real ``ActorPPOTrainer``) with a randomly initialised
Qwen2-like model in bf16 under DeepSpeed ZeRO-2 with gradient checkpointing, a fixed synthetic batch of experiences,
and ``fit`` (forward, backward, optimizer step over the whole batch) timed after warm-up with device synchronisation,
for each loss:

* ``stock``: upstream ``PolicyLoss`` on the plain advantage;
* ``separated``: our two-term loss (main + classmate clipped PPO terms);
* ``vanilla_classmate``: the reference two-ratio loss (needs the classmate log-probs of the CoT).

Reported: tokens/s (prompt + response tokens of the batch per second of ``fit``), the ratio of each classmate loss to
stock, peak device memory, and model FLOP utilisation

    MFU = (6·N·T + 12·L·d·S·T) / t / peak,   N = parameters (tied embedding counted once), T = tokens per fit,
                                             L = layers, d = hidden size, S = sequence length, t = seconds per fit

i.e. the usual 6N per token for forward + backward plus the attention score/value matmuls counted without the causal
half (PaLM, appendix B); recomputation by gradient checkpointing is not counted (model FLOPs, not hardware FLOPs).
``peak`` defaults to 790 TFLOP/s, the bf16 matmul ceiling measured on the lent H100/H200 machines.

    python bench/actor_update.py                      # 0.5B, 64 x (1024 + 1024) tokens (GPU)
    python bench/actor_update.py --preset tiny        # a CPU smoke run of the same code path
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401  (CPU shims before openrlhf)

PRESETS = {
    # Qwen2-0.5B's shape
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(path: str, preset: str, max_len: int) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    config = Qwen2Config(**PRESETS[preset], max_position_embeddings=max(4096, max_len), tie_word_embeddings=True,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    build_word_tokenizer([str(i) for i in range(10)]).save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def build_args(model_dir: str, a) -> object:
    from openrlhf_classmate.integration.args import parse_args

    n = a.num_seqs
    return parse_args([
        "--actor.model_name_or_path", model_dir, "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--data.prompt_dataset", "unused.jsonl", "--vllm.num_engines", "0", "--vllm.sync_backend", "gloo",
        "--rollout.batch_size", str(n), "--rollout.micro_batch_size", str(a.micro_batch),
        "--rollout.n_samples_per_prompt", "1", "--train.batch_size", str(n),
        "--train.micro_batch_size", str(a.micro_batch), "--ds.zero_stage", str(a.zero_stage),
        "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa", "--actor.gradient_checkpointing_enable",
        "--actor.lr_warmup_ratio", "0", "--actor.adam.lr", "1e-6", "--algo.advantage.estimator", "reinforce",
        "--rollout.max_new_tokens", str(a.response_len), "--data.max_len", str(a.prompt_len + a.response_len),
        "--engine.backend", "hf",
        *(["--ds.packing_samples", "--vllm.num_engines", "1"] if a.packing else []),
    ])


def make_experience(actor, a, device):
    import torch

    from openrlhf_classmate.integration.experience import ClassmateExperience

    g = torch.Generator().manual_seed(1)
    n, total = a.num_seqs, a.prompt_len + a.response_len
    vocab = actor.actor.model.module.config.vocab_size
    sequences = torch.randint(10, vocab, (n, total), generator=g)
    # --ragged: response lengths uniform in [response_len / 2, response_len] (right padding), so packing matters
    lengths = (torch.randint(a.response_len // 2, a.response_len + 1, (n,), generator=g) if a.ragged
               else torch.full((n,), a.response_len))
    attention = (torch.arange(total).unsqueeze(0) < (a.prompt_len + lengths).unsqueeze(1)).long()
    sequences = sequences * attention  # pad id 0
    action_mask = torch.zeros(n, total - 1, dtype=torch.bool)
    action_mask[:, a.prompt_len - 1 :] = attention[:, a.prompt_len :].bool()
    cot = torch.zeros_like(action_mask)
    cot[:, a.prompt_len : a.prompt_len + a.response_len // 2] = True  # the first half of the response is the CoT
    old = torch.cat([
        actor.forward(sequences[i : i + a.micro_batch], action_mask[i : i + a.micro_batch],
                      attention[i : i + a.micro_batch]).float()
        for i in range(0, n, a.micro_batch)
    ])
    adv = torch.randn(n, 1, generator=g) * action_mask
    classmate_adv = torch.randn(n, 1, generator=g) * cot
    classmate_lp = torch.where(cot, old + 0.3 * torch.randn(old.shape, generator=g), torch.tensor(float("-inf")))
    return ClassmateExperience(
        sequences=sequences, attention_mask=attention, action_mask=action_mask, action_log_probs=old,
        advantages=adv, classmate_advantages=classmate_adv, cot_mask=cot, classmate_log_probs=classmate_lp,
        response_length=lengths.float(), total_length=attention.sum(-1).float(),
        prompts=[""] * n, labels=[""] * n, index=list(range(n)), info={},
    )


def loss_fn(name: str, trainer):
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_classmate.algo.losses import SeparatedPolicyLoss, VanillaClassmatePolicyLoss
    from openrlhf_classmate.integration.actor import ClassmateLossAdapter

    if name == "stock":
        return PolicyLoss(0.2, 0.2, token_level_loss=True)
    if name == "separated":
        return ClassmateLossAdapter(SeparatedPolicyLoss(loss_agg_mode="token-mean"), ("classmate_advantages",),
                                    trainer)
    return ClassmateLossAdapter(
        VanillaClassmatePolicyLoss(loss_agg_mode="token-mean"),
        ("classmate_advantages", "classmate_log_probs", "cot_mask"), trainer,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--losses", nargs="+", default=["stock", "separated", "vanilla_classmate"])
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--packing", action="store_true", help="--ds.packing_samples (sdpa without flash-attn)")
    p.add_argument("--ragged", action="store_true", help="response lengths vary per sequence (see make_experience)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()

    import torch
    from openrlhf.utils import get_strategy

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.actor import ClassmatePolicyModelActor

    patches.install_experience()
    cuda = torch.cuda.is_available()
    if not cuda:
        patches.install_cpu_runtime()
    os.environ.setdefault("LOCAL_RANK", "0")
    model_dir = tempfile.mkdtemp(prefix="actor_bench_")
    n_params = make_model(model_dir, a.preset, a.prompt_len + a.response_len)
    args = build_args(model_dir, a)
    strategy = get_strategy(args)
    actor = ClassmatePolicyModelActor.__new__(ClassmatePolicyModelActor)
    ClassmatePolicyModelActor.__init__(actor, 1, 0, "127.0.0.1", _free_port())
    actor.init_model_from_pretrained(strategy, model_dir, max_steps=1000)
    device = torch.device("cuda" if cuda else "cpu")
    experience = make_experience(actor, a, device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    tokens = int(experience.attention_mask.sum())  # real (unpadded) tokens
    cfg = PRESETS[a.preset]
    flops = 6 * n_params * tokens + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * (
        a.prompt_len + a.response_len) * tokens
    # Round-robin over the losses (one fit each per round) so that drift of the device affects them alike.
    losses = {name: loss_fn(name, actor.trainer) for name in a.losses}
    times: dict[str, list[float]] = {name: [] for name in a.losses}
    peak: dict[str, float] = {}
    last_status: dict[str, dict] = {}
    for r in range(a.warmup + a.repeats):
        for name, fn in losses.items():
            actor.trainer.actor_loss_fn = fn
            actor.append(experience)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            last_status[name] = actor.fit(kl_ctl=0.0)
            sync()
            if r >= a.warmup:
                times[name].append(time.perf_counter() - t0)
            peak[name] = max(peak.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0)
        print(f"round {r + 1}/{a.warmup + a.repeats}: " + ", ".join(
            f"{name} {times[name][-1]:.3f}s" for name in losses if r >= a.warmup), flush=True)
    results = {}
    for name in a.losses:
        t = statistics.median(times[name])
        results[name] = {
            "seconds_per_fit": t,
            "times": times[name],
            "tokens_per_s": tokens / t,
            "peak_memory_gib": peak[name] if cuda else None,
            "mfu": flops / t / (a.peak_tflops * 1e12),
            "policy_loss": float(last_status[name].get("policy_loss", float("nan"))),
        }

    stock = results.get("stock", {}).get("tokens_per_s")
    print(f"\nmodel {a.preset}: {n_params / 1e6:.1f}M params, ZeRO-{a.zero_stage}, bf16, grad ckpt; "
          f"batch {a.num_seqs} x ({a.prompt_len}+{a.response_len}) tokens{' (ragged)' if a.ragged else ''}, "
          f"packing {'on' if a.packing else 'off'}, micro-batch {a.micro_batch}; "
          f"median of {a.repeats} timed fits per loss, round-robin, after {a.warmup} warm-up round(s)")
    # "paired": the median over rounds of stock time / this loss's time in the same round (robust to drift)
    print(f"{'loss':<20}{'s/fit':>8}{'tokens/s':>12}{'vs stock':>10}{'paired':>8}{'peak GiB':>10}{'MFU':>8}")
    for name, r in results.items():
        ratio = r["tokens_per_s"] / stock if stock else float("nan")
        paired = (statistics.median(ts / t for ts, t in zip(times["stock"], times[name]))
                  if "stock" in times else float("nan"))
        r["ratio_to_stock"], r["paired_ratio_to_stock"] = ratio, paired
        mem = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:<20}{r['seconds_per_fit']:>8.3f}{r['tokens_per_s']:>12,.0f}{ratio:>10.3f}{paired:>8.3f}"
              f"{mem:>10}{r['mfu']:>8.1%}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": vars(a), "params": n_params, "flops_per_fit": flops, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

"""Loss overhead per micro-batch: forward + backward of the policy loss alone, stock vs the classmate losses.

The full-fit benchmark (``bench/actor_update.py``) moves by ±10% between rounds, which hides a few percent. This one
isolates what the classmate losses add: on one realistic micro-batch (default 4 x 2048 response tokens, bf16
log-probs with ``requires_grad``, ragged lengths), it times ``loss(...)`` + ``loss.backward()`` of

* ``stock``: upstream ``PolicyLoss`` (token-mean),
* ``separated``: our two-term loss through the actor's ``ClassmateLossAdapter`` (what training runs),
* ``vanilla_classmate``: the reference two-ratio loss through the adapter,

with CUDA events around blocks of calls (many repetitions, round-robin over the losses so drift hits them alike),
and the forward + backward of the model itself on the same micro-batch (a Qwen2-0.5B-shaped model, bf16, the
``fit`` work the loss is a part of). Reported per loss: median µs per call, overhead over stock in µs, and that
overhead as a fraction of the measured model forward + backward time.

    python bench/loss_overhead.py --out results.json          # GPU
    python bench/loss_overhead.py --preset tiny --seqs 2 --len 64 --blocks 3 --calls 5   # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401  (CPU shims before openrlhf)

PRESETS = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}


class Timer:
    """Median seconds of ``fn`` over blocks of ``calls`` calls: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.torch = torch

    def block(self, fn, calls: int) -> float:
        torch = self.torch
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls


def make_batch(seqs: int, length: int, device, seed: int = 0):
    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (seqs,), generator=g)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    cot = mask & (torch.arange(length).unsqueeze(0) < (lengths // 2).unsqueeze(1))
    old = (-torch.rand(seqs, length, generator=g) * 3 * mask).to(torch.bfloat16)
    experience = ClassmateExperience(
        action_mask=mask, action_log_probs=old, advantages=(torch.randn(seqs, 1, generator=g) * mask),
        classmate_advantages=(torch.randn(seqs, 1, generator=g) * cot), cot_mask=cot,
        classmate_log_probs=torch.where(cot, old.float() - 0.3, float("-inf")), info={},
    )
    experience.to_device(device)
    log_probs = old.float().to(device) + 0.05 * torch.randn(seqs, length, generator=g).to(device) * mask.to(device)
    return experience, log_probs.to(torch.bfloat16)


def losses(experience):
    from openrlhf.models.loss import PolicyLoss

    from openrlhf_classmate.algo.losses import SeparatedPolicyLoss, VanillaClassmatePolicyLoss
    from openrlhf_classmate.integration.training.actor import ClassmateLossAdapter

    class Trainer:
        current_experience = experience

    trainer = Trainer()
    return {
        "stock": PolicyLoss(0.2, 0.2, token_level_loss=True),
        "separated": ClassmateLossAdapter(SeparatedPolicyLoss(loss_agg_mode="token-mean"),
                                          ("classmate_advantages",), trainer),
        "vanilla_classmate": ClassmateLossAdapter(VanillaClassmatePolicyLoss(loss_agg_mode="token-mean"),
                                                  ("classmate_advantages", "classmate_log_probs", "cot_mask"),
                                                  trainer),
    }


def model_step_seconds(preset: str, seqs: int, length: int, device, timer: Timer, blocks: int) -> float:
    """Median forward + backward time of the model on a (seqs, 2·length) micro-batch (prompt + response)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**PRESETS[preset], max_position_embeddings=max(4096, 2 * length), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    ids = torch.randint(10, config.vocab_size, (seqs, 2 * length), device=device)

    def step():
        logits = model(ids).logits
        logits.float().log_softmax(-1)[..., :1].sum().backward()

    step()
    return statistics.median(timer.block(step, 1) for _ in range(blocks))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="0.5b")
    p.add_argument("--seqs", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--len", type=int, default=2048, help="response tokens per sequence (the loss's width)")
    p.add_argument("--blocks", type=int, default=30, help="timed blocks per loss (round-robin)")
    p.add_argument("--calls", type=int, default=200, help="loss forward + backward calls per block")
    p.add_argument("--model-blocks", type=int, default=10)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = Timer(device)
    experience, base = make_batch(a.seqs, a.len, device)
    fns = losses(experience)
    info = {"dp_size": 1, "batch_num_tokens": experience.action_mask.sum().float(),
            "global_batch_size": torch.tensor(float(a.seqs), device=device)}

    def call(fn):
        lp = base.detach().requires_grad_(True)

        def run():
            loss = fn(lp, experience.action_log_probs, experience.advantages, action_mask=experience.action_mask,
                      rollout_log_probs=None, **info)[0]
            loss.backward()

        return run

    runs = {name: call(fn) for name, fn in fns.items()}
    for run in runs.values():  # warm-up (allocator, kernels)
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(a.blocks):
        for name, run in runs.items():
            times[name].append(timer.block(run, a.calls))
    model_s = model_step_seconds(a.preset, a.seqs, a.len, device, timer, a.model_blocks)
    stock = statistics.median(times["stock"])
    results = {"model_forward_backward_s": model_s, "losses": {}}
    print(f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; micro-batch {a.seqs} x "
          f"{a.len} response tokens (ragged), bf16 log-probs; {a.blocks} blocks x {a.calls} calls per loss")
    print(f"model ({a.preset}, bf16, grad ckpt) forward + backward on {a.seqs} x {2 * a.len} tokens: "
          f"{model_s * 1e3:.2f} ms")
    print(f"{'loss':<20}{'µs/call':>10}{'overhead µs':>13}{'of fit':>10}")
    for name, ts in times.items():
        t = statistics.median(ts)
        overhead = t - stock
        results["losses"][name] = {"us_per_call": t * 1e6, "overhead_us": overhead * 1e6,
                                   "overhead_fraction_of_model_step": overhead / model_s,
                                   "block_us": [x * 1e6 for x in ts]}
        print(f"{name:<20}{t * 1e6:>10.1f}{overhead * 1e6:>13.1f}{overhead / model_s:>10.3%}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": vars(a), "device": str(device), **results}, f, indent=1)


if __name__ == "__main__":
    main()

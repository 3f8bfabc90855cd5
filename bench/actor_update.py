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

``--chunked-logprobs`` runs every loss twice per round, interleaved: ``stock/<loss>`` through upstream's
``Actor.forward`` (full float32 logits) and ``chunked/<loss>`` through ``--logprobs.chunked`` (the same worker, whose
``ChunkedLogprobActor`` runs upstream's forward when its ``chunk_size`` is None), and adds, stock vs chunked:

* ``reference_forward``: the no-grad log-prob forward of the whole batch (the reference model's and the old
  log-probs' forward), micro-batches of ``--ref-micro-batch``: tokens/s and peak memory;
* ``vrcli_nll``: VR-CLI's batched gold-chapter NLLs (``rewards/likelihood.gold_mean_nll``, the response as the
  chapter) through the same forward: tokens/s, peak memory and the largest NLL difference;
* ``lm_head``: the LM head alone (forward + backward of one micro-batch's log-probs), upstream's path over all its
  tokens vs the chunked head over its response tokens at several chunk sizes: ms and extra peak memory;
* ``equality``: the largest differences between the two paths' log-probs of the batch.

``--long-context`` (with ``--chunked-logprobs``): Qwen2.5-1.5B shapes, 2 sequences of 1024 + 15360 tokens,
micro-batch 1, the stock loss; chunked first, then stock, whose out-of-memory error is recorded, not fatal.
``--tiny``: the same code at a CPU size (its test: ``tests/test_bench_chunked.py``).

    python bench/actor_update.py --chunked-logprobs --out chunked.json                  # GPU, the issue's targets
    python bench/actor_update.py --chunked-logprobs --long-context --out long.json      # GPU, 16k tokens
    python bench/actor_update.py --chunked-logprobs --tiny --out /tmp/chunked.json      # CPU smoke run
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
    # Qwen2.5-1.5B's shape
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
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
    from openrlhf_classmate.integration.launch.args import parse_args

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
        *(["--logprobs.chunked", "--logprobs.chunk_size", str(a.chunk_size)] if a.chunked_logprobs
          else ["--logprobs.chunked", "off"]),  # stock: upstream's forward (auto would chunk)
        *(["--actor.entropy_coef", str(a.entropy_coef)] if a.entropy_coef is not None else []),
    ])


def make_experience(actor, a, device):
    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

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
    from openrlhf_classmate.integration.training.actor import ClassmateLossAdapter

    if name == "stock":
        return PolicyLoss(0.2, 0.2, token_level_loss=True)
    if name == "separated":
        return ClassmateLossAdapter(SeparatedPolicyLoss(loss_agg_mode="token-mean"), ("classmate_advantages",),
                                    trainer)
    return ClassmateLossAdapter(
        VanillaClassmatePolicyLoss(loss_agg_mode="token-mean"),
        ("classmate_advantages", "classmate_log_probs", "cot_mask"), trainer,
    )


def set_path(worker, a, path: str) -> None:
    """Route the worker's Actor through upstream's forward ("stock") or the chunked LM head ("chunked")."""
    if a.chunked_logprobs:
        worker.actor.chunk_size = a.chunk_size if path == "chunked" else None


def _micro_batches(experience, size: int):
    n = experience.sequences.shape[0]
    return [(experience.sequences[i : i + size], experience.action_mask[i : i + size],
             experience.attention_mask[i : i + size]) for i in range(0, n, size)]


def measure(fn, cuda: bool, repeats: int) -> dict:
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call, and the peak device memory (with
    ``error`` instead when the device runs out of memory)."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    except torch.cuda.OutOfMemoryError as e:
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
        return {"error": "out of memory: " + str(e).splitlines()[0], "peak_memory_gib": peak}
    return {"seconds": statistics.median(times), "times": times,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, "last": out}


def reference_forwards(worker, experience, a, cuda: bool) -> dict:
    """The no-grad log-prob forward (reference / old log-probs) and VR-CLI's batched NLLs, stock vs chunked."""
    import torch

    from openrlhf_classmate.rewards.likelihood import gold_mean_nll, local_forward

    batches = _micro_batches(experience, a.ref_micro_batch)
    tokens = int(experience.attention_mask.sum())
    # VR-CLI: each sequence's response is the "gold chapter" scored after its prompt
    items = [(seq[mask.bool()].tolist(), a.prompt_len) for seq, mask in
             zip(experience.sequences, experience.attention_mask)]
    device = torch.device("cuda" if cuda else "cpu")
    out: dict = {"reference_forward": {}, "vrcli_nll": {}}
    values = {}
    for path in ("stock", "chunked"):
        set_path(worker, a, path)
        ref = measure(lambda: torch.cat([worker.forward(*mb).float() for mb in batches]), cuda, a.ref_repeats)
        nll = measure(lambda: gold_mean_nll(local_forward(worker.actor, device), items, pad_id=0,
                                            micro_batch_size=a.ref_micro_batch), cuda, a.ref_repeats)
        for key, m in (("reference_forward", ref), ("vrcli_nll", nll)):
            out[key][path] = ({"error": m["error"], "peak_memory_gib": m["peak_memory_gib"]} if "error" in m else
                              {"seconds": m["seconds"], "tokens_per_s": tokens / m["seconds"],
                               "peak_memory_gib": m["peak_memory_gib"]})
        if "error" not in ref and "error" not in nll:
            values[path] = (ref["last"], torch.tensor(nll["last"]))
    mask = experience.action_mask
    if len(values) < 2:
        out["equality"] = {}
        return out
    (lp_s, nll_s), (lp_c, nll_c) = values["stock"], values["chunked"]
    out["equality"] = {
        "max_abs_logprob_diff": float((lp_c - lp_s)[mask].abs().max()),
        "mean_abs_logprob_diff": float((lp_c - lp_s)[mask].abs().mean()),
        "max_abs_nll_diff": float((nll_c - nll_s).abs().max()),
        "mean_logprob": float(lp_s[mask].mean()),
    }
    return out


def lm_head_sweep(worker, a, cuda: bool) -> dict:
    """The LM head alone for one training micro-batch: upstream's path (float32 logits of all its tokens,
    ``log_probs_from_logits``) vs the chunked head over the response tokens, forward + backward."""
    import deepspeed
    import torch
    from openrlhf.models.utils import log_probs_from_logits

    from openrlhf_classmate.algo.chunked_logprobs import chunked_lm_head_stats

    head = worker.actor.model.module.get_output_embeddings()
    with deepspeed.zero.GatheredParameters([head.weight], enabled=hasattr(head.weight, "ds_numel")):
        weight = head.weight.detach().clone().requires_grad_()
    device, dtype = weight.device, weight.dtype
    vocab, hidden_size = weight.shape
    g = torch.Generator(device=device).manual_seed(0)
    n_all = a.micro_batch * (a.prompt_len + a.response_len)
    n_act = a.micro_batch * a.response_len
    hidden = torch.randn(n_all, hidden_size, generator=g, device=device, dtype=dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n_all,), generator=g, device=device)

    def stock():
        hidden.grad = weight.grad = None
        logits = torch.nn.functional.linear(hidden, weight).float()
        log_probs_from_logits(logits.unsqueeze(0), targets.unsqueeze(0)).sum().backward()

    def chunked(size):
        def run():
            hidden.grad = weight.grad = None
            stats = chunked_lm_head_stats(hidden[-n_act:], weight, targets[-n_act:], chunk_size=size)
            stats.sum().backward()
        return run

    out = {"tokens_stock": n_all, "tokens_chunked": n_act, "vocab": vocab, "hidden": hidden_size}
    sizes = [s for s in a.sweep_chunks if s <= n_act] or [n_act]
    for name, fn in [("stock", stock)] + [(f"chunk_{s}", chunked(s)) for s in sizes]:
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
        m = measure(fn, cuda, a.ref_repeats)
        hidden.grad = weight.grad = None
        if "error" in m:
            out[name] = {"error": m["error"]}
            continue
        out[name] = {"ms": 1e3 * m["seconds"],
                     "extra_peak_gib": (m["peak_memory_gib"] - base / 2**30) if cuda else None}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model shape (default 0.5b)")
    p.add_argument("--num-seqs", type=int, default=None, help="default 64")
    p.add_argument("--prompt-len", type=int, default=None, help="default 1024")
    p.add_argument("--response-len", type=int, default=None, help="default 1024")
    p.add_argument("--micro-batch", type=int, default=None, help="default 4")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 8; 4 with --chunked-logprobs)")
    p.add_argument("--losses", nargs="+", default=None,
                   help="default: stock separated vanilla_classmate (stock only with --long-context)")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--packing", action="store_true", help="--ds.packing_samples (sdpa without flash-attn)")
    p.add_argument("--ragged", action="store_true", help="response lengths vary per sequence (see make_experience)")
    p.add_argument("--chunked-logprobs", action="store_true", help="stock vs --logprobs.chunked, interleaved")
    p.add_argument("--chunk-size", type=int, default=None, help="--logprobs.chunk_size (default 2048; tiny: 8)")
    p.add_argument("--entropy-coef", type=float, default=None, help="--actor.entropy_coef (entropy in the loss or, "
                   "with 0, logged)")
    p.add_argument("--long-context", action="store_true", help="1.5B shapes, 2 x (1024 + 15360) tokens, "
                   "micro-batch 1, stock loss; chunked first, stock's out-of-memory recorded")
    p.add_argument("--ref-micro-batch", type=int, default=None, help="rows per reference / VR-CLI forward "
                   "(default 2 x --micro-batch)")
    p.add_argument("--ref-repeats", type=int, default=3, help="timed calls of each reference-side measurement")
    p.add_argument("--sweep-chunks", type=int, nargs="+", default=[1024, 2048, 4096],
                   help="chunk sizes of the lm_head measurement")
    p.add_argument("--tiny", action="store_true", help="a CPU-sized run of the same code (tests)")
    p.add_argument("--budget-s", type=float, default=None, help="start no round that would end after this many "
                   "seconds of the run (the JSON is written with the rounds done)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args()
    resolve_defaults(a)
    run(a)


def resolve_defaults(a) -> None:
    if a.long_context and not a.chunked_logprobs:
        raise SystemExit("error: --long-context compares the stock and chunked paths: add --chunked-logprobs")
    if a.tiny:
        base = dict(preset="tiny", num_seqs=4, prompt_len=16, response_len=16, micro_batch=2, chunk_size=8,
                    repeats=1)
        if a.long_context:
            base.update(num_seqs=2, prompt_len=8, response_len=56, micro_batch=1)
        a.sweep_chunks = [8, 16]
    elif a.long_context:
        base = dict(preset="1.5b", num_seqs=2, prompt_len=1024, response_len=15360, micro_batch=1, repeats=2)
    else:
        base = dict(preset="0.5b", num_seqs=64, prompt_len=1024, response_len=1024, micro_batch=4,
                    repeats=4 if a.chunked_logprobs else 8)
    base.setdefault("chunk_size", 2048)
    for key, value in base.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.losses is None:
        a.losses = ["stock"] if a.long_context else ["stock", "separated", "vanilla_classmate"]
    if a.ref_micro_batch is None:
        a.ref_micro_batch = a.micro_batch if a.long_context else 2 * a.micro_batch


def run(a) -> None:
    t_start = time.perf_counter()
    import torch
    from openrlhf.utils import get_strategy

    from openrlhf_classmate.integration import patches
    from openrlhf_classmate.integration.training.actor import ClassmatePolicyModelActor

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
    paths = ["stock", "chunked"] if a.chunked_logprobs else ["stock"]
    set_path(actor, a, paths[-1])  # the chunked path builds the experience (the stock one may not fit, long context)
    experience = make_experience(actor, a, device)
    report: dict = {"config": vars(a), "params": n_params, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    if a.chunked_logprobs:
        report.update(compare_paths(actor, experience, a, cuda))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    tokens = int(experience.attention_mask.sum())  # real (unpadded) tokens
    cfg = PRESETS[a.preset]
    flops = 6 * n_params * tokens + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * (
        a.prompt_len + a.response_len) * tokens
    losses = {name: loss_fn(name, actor.trainer) for name in a.losses}
    variants = [(path, name) for path in paths for name in losses]  # stock first in each round
    if a.long_context:
        variants.reverse()  # chunked first: an out-of-memory stock fit must not disturb the chunked ones
    label = {v: f"{v[0]}/{v[1]}" if a.chunked_logprobs else v[1] for v in variants}
    times: dict[str, list[float]] = {label[v]: [] for v in variants}
    peak: dict[str, float] = {}
    last_status: dict[str, dict] = {}
    failed: dict[str, str] = {}

    def fit(variant) -> float | None:
        name = label[variant]
        set_path(actor, a, variant[0])
        actor.trainer.actor_loss_fn = losses[variant[1]]
        actor.append(experience)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        try:
            last_status[name] = actor.fit(kl_ctl=0.0)
        except torch.cuda.OutOfMemoryError as e:
            failed[name] = "out of memory: " + str(e).splitlines()[0]
            peak[name] = torch.cuda.max_memory_allocated() / 2**30
            actor.trainer.replay_buffer.clear()
            torch.cuda.empty_cache()
            return None
        sync()
        peak[name] = max(peak.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0)
        return time.perf_counter() - t0

    rounds = a.warmup + a.repeats
    # round-robin over the variants, so that drift of the device affects them alike; long context: each variant's
    # fits back to back, chunked first
    schedule = [[v] for v in variants for _ in range(rounds)] if a.long_context else [variants] * rounds
    fits_done = {label[v]: 0 for v in variants}
    last_group = 0.0
    for group in schedule:
        if a.budget_s is not None and time.perf_counter() - t_start + last_group > a.budget_s:
            print(f"stopping: the next fits would pass --budget-s {a.budget_s:g}", flush=True)
            break
        t_group = time.perf_counter()
        for variant in group:
            name = label[variant]
            if name in failed:
                continue
            seconds = fit(variant)
            fits_done[name] += 1
            if seconds is not None and fits_done[name] > a.warmup:
                times[name].append(seconds)
        last_group = time.perf_counter() - t_group
        print(", ".join(f"{label[v]} {times[label[v]][-1]:.3f}s" for v in group if times[label[v]]) or "warm-up",
              flush=True)

    results = {}
    for variant in variants:
        name = label[variant]
        if name in failed or not times[name]:
            results[name] = {"error": failed.get(name, "no timed fit (budget)"), "peak_memory_gib": peak.get(name)}
            continue
        t = statistics.median(times[name])
        results[name] = {
            "seconds_per_fit": t,
            "times": times[name],
            "tokens_per_s": tokens / t,
            "peak_memory_gib": peak[name] if cuda else None,
            "mfu": flops / t / (a.peak_tflops * 1e12),
            "policy_loss": float(last_status[name].get("policy_loss", float("nan"))),
        }
    report.update(flops_per_fit=flops, tokens_per_fit=tokens, results=results)
    print_fits(a, n_params, results, times, label, variants)
    if a.chunked_logprobs:
        from openrlhf_classmate.algo import chunked_logprobs

        report["chunked_vs_stock"] = ratios(results, times, a.losses)
        # None: the per-chunk kernels ran compiled (CUDA) or eagerly by design (CPU); else why compiling failed
        report["compile_errors"] = {"chunk_stats": chunked_logprobs.chunk_stats.error,
                                    "chunk_grad": chunked_logprobs.chunk_grad.error}
        print_chunked(report)
    report["seconds"] = time.perf_counter() - t_start
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=float)


def compare_paths(worker, experience, a, cuda: bool) -> dict:
    """The reference-side measurements and the equality of the two paths' log-probs (module docstring)."""

    out = reference_forwards(worker, experience, a, cuda)
    out["lm_head"] = lm_head_sweep(worker, a, cuda)
    return out


def ratios(results: dict, times: dict, losses: list[str]) -> dict:
    """Per loss: chunked / stock tokens/s (ratio of medians, and paired per round) and peak memory."""
    out = {}
    for loss in losses:
        s, c = results.get(f"stock/{loss}", {}), results.get(f"chunked/{loss}", {})
        entry = {"stock_error": s.get("error"), "chunked_error": c.get("error")}
        if "tokens_per_s" in s and "tokens_per_s" in c:
            entry["tokens_per_s_ratio"] = c["tokens_per_s"] / s["tokens_per_s"]
            pairs = list(zip(times[f"stock/{loss}"], times[f"chunked/{loss}"]))
            entry["paired_ratio"] = statistics.median(ts / tc for ts, tc in pairs) if pairs else None
        if s.get("peak_memory_gib") and c.get("peak_memory_gib"):
            entry["peak_memory_ratio"] = c["peak_memory_gib"] / s["peak_memory_gib"]
        out[loss] = entry
    return out


def print_fits(a, n_params, results, times, label, variants) -> None:
    stock_key = "stock/stock" if a.chunked_logprobs else "stock"
    stock = results.get(stock_key, {}).get("tokens_per_s")
    print(f"\nmodel {a.preset}: {n_params / 1e6:.1f}M params, ZeRO-{a.zero_stage}, bf16, grad ckpt; "
          f"batch {a.num_seqs} x ({a.prompt_len}+{a.response_len}) tokens{' (ragged)' if a.ragged else ''}, "
          f"packing {'on' if a.packing else 'off'}, micro-batch {a.micro_batch}; "
          f"median of {a.repeats} timed fits per variant after {a.warmup} warm-up round(s)")
    # "paired": the median over rounds of stock time / this variant's time in the same round (robust to drift)
    print(f"{'variant':<28}{'s/fit':>8}{'tokens/s':>12}{'vs stock':>10}{'paired':>8}{'peak GiB':>10}{'MFU':>8}")
    for variant in variants:
        name = label[variant]
        r = results[name]
        if "error" in r:
            print(f"{name:<28} {r['error']}")
            continue
        ratio = r["tokens_per_s"] / stock if stock else float("nan")
        pairs = list(zip(times.get(stock_key, []), times[name]))
        paired = statistics.median(ts / t for ts, t in pairs) if pairs else float("nan")
        r["ratio_to_stock"], r["paired_ratio_to_stock"] = ratio, paired
        mem = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "-"
        print(f"{name:<28}{r['seconds_per_fit']:>8.3f}{r['tokens_per_s']:>12,.0f}{ratio:>10.3f}{paired:>8.3f}"
              f"{mem:>10}{r['mfu']:>8.1%}")


def print_chunked(report: dict) -> None:
    print("\nchunked / stock per loss (tokens/s: ratio of medians, paired; peak memory):")
    for loss, r in report["chunked_vs_stock"].items():
        parts = [f"{k} {r[k]:.3f}" for k in ("tokens_per_s_ratio", "paired_ratio", "peak_memory_ratio")
                 if r.get(k) is not None]
        errors = [f"{k} {r[k]}" for k in ("stock_error", "chunked_error") if r.get(k)]
        print(f"  {loss:<20}" + ", ".join(parts + errors))
    for key in ("reference_forward", "vrcli_nll"):
        row = report[key]
        print(f"{key}: " + ", ".join(
            f"{path} " + (m["error"] if "error" in m else f"{m['tokens_per_s']:,.0f} tokens/s")
            + (f" peak {m['peak_memory_gib']:.1f} GiB" if m["peak_memory_gib"] is not None else "")
            for path, m in row.items()))
    errors = {k: v for k, v in report["compile_errors"].items() if v}
    print(f"torch.compile of the chunk kernels: {errors or 'ok (or CPU: eager by design)'}")
    print("equality (stock vs chunked, no-grad forward of the batch): "
          + (", ".join(f"{k} {v:.3g}" for k, v in report["equality"].items()) or "-"))
    lm = report["lm_head"]
    print(f"lm_head ({lm['tokens_stock']} stock tokens, {lm['tokens_chunked']} chunked): " + ", ".join(
        f"{k} {v['ms']:.1f} ms" + (f" +{v['extra_peak_gib']:.2f} GiB" if v.get("extra_peak_gib") is not None else "")
        if "ms" in v else f"{k} {v['error']}" for k, v in lm.items() if isinstance(v, dict)))


if __name__ == "__main__":
    main()

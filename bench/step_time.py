"""Step-time breakdown: a plain GRPO step vs a classmate GDPO step on the same hardware and batch.

Models: a policy and a classmate with Qwen2.5-0.5B's shapes (24 layers, hidden 896, 14 query / 2 key-value heads,
MLP 4864, RoPE theta 1e6, tied embeddings, 494M parameters) and random weights, as Llama-architecture checkpoints
(Qwen2.5 adds biases on q/k/v: 0.1% of the parameters), bf16. Vocabulary: a synthetic word-level tokenizer of exactly
151,936 entries (Qwen2.5's embedding size: the 8 arithmetic words, 9 special / think tokens and filler words
``w0 ... w151918``), so the embedding, the LM head and the 151,936-way log-softmax cost what they cost in Qwen2.5-0.5B.
Nothing is downloaded; the models are built once into ``--models`` and reused.

Batch: ``--prompts`` (32) one-digit-addition prompts x ``--samples`` (8) per step, ``--new-tokens`` (512) new
tokens per response; the random policy practically never emits EOS or ``</think>``, so every response is 512 tokens,
its CoT is the whole response and every sample goes to the classmate (the most classmate work a step can have), which
writes ``--classmate-new-tokens`` (256) tokens. ZeRO-2, bf16, gradient checkpointing, KL to a reference model
(actor and ref forwards), one optimizer step per rollout batch, ``--steps`` (4) steps; step 1 (warm-up: CUDA
graphs, allocator, JIT) is left out of the means.

Layouts (``--gpus``, ``--layout``): ``colocate_all`` (the default, the production config
``configs/classmate_gdpo.yaml``): every model on every GPU, data parallel (an actor and a reference rank, a policy
engine and a classmate engine per GPU; ``--train.colocate_all``, vLLM sleep, CUDA-IPC weight sync), the classmate
placement the launcher's default (``auto``: ``share`` here, the classmate engine awake beside the policy engine, its
generation overlapping the rollout and the actor/ref forwards) unless ``--placement`` says otherwise; ``--prompts``
counts all GPUs' prompts, so a 2-GPU call with twice the 1-GPU call's prompts has the same per-GPU batch
(``--scaling ONE TWO`` then gives tokens/s per GPU, 2 GPUs over 1, against 0.85x). ``split`` (2 GPUs): actor/ref on
one GPU, the policy and classmate engines on the other, NCCL weight sync across GPUs. GRPO runs the same layout
without the classmate.

Timings come from the launcher's own per-step scalars (tensorboard; the interleaved run reads its step lines): upstream's ``timing/*`` (generation, make_experience,
ppo_train, broadcast, step_total) and the classmate stage's ``classmate/*`` (stage_time, dispatch_time,
generation_time, score_time, stage_overlap_time, actor_ref_forward_time) and the actor update's split
(``actor_timing/fit``: the worker's own fit, ``actor_timing/micro_steps``: its micro-batches' training steps). Writes ``step_time_<N>gpu.json`` to
``--out`` and prints the table with the GDPO / GRPO ratio against the 1.25x target.

Train-inference mismatch: ``--mismatch on`` (the launcher's default) asks the policy engines for the
sampled tokens' log-probs and logs ``mismatch/*``; ``--mismatch off`` sends upstream's request unchanged
(``--engine.no_mismatch_metrics``); ``--is-correction token`` adds upstream's ``--algo.advantage.is_correction_level
token`` (upstream's own log-prob request, with ``--mismatch off``). The three variants keep separate work folders and
JSON files (``step_time_<N>gpu[_mismatch-off][_is-token].json``), so the generation row can be compared across them;
the per-step ``mismatch/*`` values are in each run's ``per_step``.

Before/after pairs: ``--interleave --before CHANGE[,CHANGE...]`` has the launcher's steps take the path
from before a change (``OPENRLHF_CLASSMATE_BENCH_BEFORE``, ``integration/bench_switches.py``), so that one run
measures each change as a before/after pair under the same engines, weights and machine drift. The steps cycle
through the launcher's own path and each change's before path in blocks (one step with ``--runs gdpo``, a GDPO and
a GRPO step under the alternation): with ``--runs gdpo`` and three changes, step 1 after, 2-4 the changes' before
paths, 5 after, ... The launcher logs each step's path (``bench/before``); the first step of each path is warm-up;
each change gets its before minus after rows (:data:`PAIR_ROWS`) of the medians and of each before step against the
after step that opened its cycle, and counts with at least ``MIN_STEADY`` steady steps on both sides. Files carry
``_before-<changes>`` (and ``_gdpo-only``). The recorded pairs (``dispatch``, ``seeds``, ``syncs``) are recorded in
``bench/GPU_RESULTS.md`` (``bench/gpu_results/wave9``) and their before paths removed: no change has one today, and
``bench_switches.BEFORE_CHANGES`` says how a new pair plugs in.

``--tiny --engine hf`` runs the same script path on CPU with tiny models (the check of this script, no timing value).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401
from openrlhf_classmate.demo.launch import parse_step_line  # noqa: E402
from openrlhf_classmate.integration.bench_switches import ALTERNATE_ENV, parse_changes  # noqa: E402
from openrlhf_classmate.integration.bench_switches import BEFORE_ENV as BENCH_BEFORE_ENV  # noqa: E402
from openrlhf_classmate.testing.e2e import WORDS, kill_session, run_launcher, tensorboard_scalars  # noqa: E402
from openrlhf_classmate.testing.watchdog import HARD_TIMEOUT  # noqa: E402

# GDPO / GRPO step-time targets: one GPU runs the classmate stage between sleeping engines, two GPUs overlap it with
# the actor/ref forwards
TARGETS = {1: 1.25, 2: 1.10}
# a call's ratio counts with at least this many steady steps of each kind, and two calls agree when their ratios are
# at most AGREE apart
MIN_STEADY = 8
AGREE = 0.05
# tokens/s per GPU on 2 GPUs against 1 GPU at the same per-GPU batch
SCALING_TARGET = 0.85
QWEN25_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  max_position_embeddings=32_768)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=10_000.0, rms_norm_eps=1e-6, max_position_embeddings=2048)

# (row label, tensorboard tag under train/); GRPO has no classmate/* rows
ROWS = [
    ("generation (rollout + main reward)", "timing/generation"),
    ("  engines: generation + main reward", "rollout/engines_s"),
    ("  responses to experiences", "rollout/process_s"),
    ("  engines' wake-up + sleep", "rollout/wake_sleep_s"),
    ("  first prompt group back", "rollout/first_group_s"),
    ("make experience", "timing/make_experience"),
    ("  classmate stage", "classmate/stage_time"),
    ("    inputs + dispatch", "classmate/dispatch_time"),
    ("    classmate generation", "classmate/generation_time"),
    ("    classmate scoring", "classmate/score_time"),
    ("    overlapped with actor/ref fwd", "classmate/stage_overlap_time"),
    ("    on the critical path", "classmate/wait_time"),
    ("  actor/ref forwards", "classmate/actor_ref_forward_time"),
    ("actor update", "timing/ppo_train"),
    ("  the worker's fit", "actor_timing/fit"),
    ("    micro-batch training steps", "actor_timing/micro_steps"),
    ("weight sync", "timing/broadcast"),
    ("step total", "timing/step_total"),
]
# per-step values recorded next to the timings (not seconds)
LEVELS = ["mismatch/logprob_abs_diff_mean", "mismatch/logprob_abs_diff_max", "mismatch/kl_k3", "vllm_kl"]


def variant(a) -> str:
    """The suffix of this variant's work folders and JSON file (empty for the launcher's defaults)."""
    return (("" if a.mismatch == "on" else "_mismatch-off") + ("" if a.is_correction == "off" else "_is-token")
            + ("" if getattr(a, "dispatch", "auto") == "auto" else f"_dispatch-{a.dispatch}")
            + ("_seeded" if getattr(a, "seed_requests", False) else "")
            + ("_gdpo-only" if gdpo_only(a) else "")
            + (f"_before-{a.before.replace(',', '-')}" if getattr(a, "before", None) else "")
            + ("_split" if layout(a) == "split" else "")
            + (f"_cudagraph-{a.cudagraph_max}" if getattr(a, "cudagraph_max", None) is not None else ""))


def layout(a) -> str:
    """``colocate_all`` (every model on every GPU, data parallel: the production layout) or ``split`` (2 GPUs:
    actor/ref on one, the engines on the other)."""
    return "split" if a.gpus > 1 and getattr(a, "layout", "colocate_all") == "split" else "colocate_all"


def gdpo_only(a) -> bool:
    """An interleaved run of classmate GDPO steps only (``--interleave --runs gdpo``): its paths interleave, not its
    kinds."""
    return bool(getattr(a, "interleave", False)) and getattr(a, "runs", "grpo,gdpo") == "gdpo"


def before_list(a) -> tuple[str, ...]:
    """The changes of ``--before``, in order (empty without it; checked by :func:`parse_cli`)."""
    return parse_changes(getattr(a, "before", None) or "")


def launcher_env(a, interleave: bool) -> dict[str, str]:
    """The benchmark switches the launcher's processes read from the environment (never set in a training run)."""
    env = {ALTERNATE_ENV: "1"} if interleave and not gdpo_only(a) else {}
    if getattr(a, "before", None):
        env[BENCH_BEFORE_ENV] = a.before
    return env


def build_model(path: str, shape: dict, seed: int) -> str:
    """A random Llama checkpoint of ``shape`` with a word-level tokenizer of exactly ``vocab_size`` entries."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    if os.path.isfile(os.path.join(path, "done")):
        return path
    overhead = len(build_word_tokenizer(WORDS)) - len(WORDS)
    fillers = [f"w{i}" for i in range(shape["vocab_size"] - overhead - len(WORDS))]
    tokenizer = build_word_tokenizer(WORDS + fillers)
    if len(tokenizer) != shape["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} entries, expected {shape['vocab_size']}")
    config = LlamaConfig(**{"tie_word_embeddings": True, **shape}, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    open(os.path.join(path, "done"), "w").close()
    return path


def build_data(path: str, n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            a = rng.randint(0, 4)
            b = rng.randint(0, 4 - a)
            messages = [{"role": "user", "content": f"{a} + {b} = ?"}]
            label = {"data_source": "arithmetic", "ground_truth": str(a + b), "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    return path


def launcher_argv(a, policy: str, classmate: str | None, data: str, root: str) -> list[str]:
    batch = a.prompts * a.samples
    # data parallel over every GPU (layout colocate_all): an actor and a reference rank, a policy engine (and in
    # share / colocate a classmate engine) on each GPU; split: actor/ref on one GPU, the engines on the other
    ranks = str(a.gpus if layout(a) == "colocate_all" else 1)
    argv = [
        "--actor.model_name_or_path", policy, "--actor.num_nodes", "1", "--actor.num_gpus_per_node", ranks,
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", ranks,
        "--vllm.num_engines", ranks, "--vllm.sync_backend", "nccl" if a.engine == "vllm" else "gloo",
        "--data.prompt_dataset", data, "--data.input_key", "prompt", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", str(a.new_tokens + 64),
        "--data.max_samples", str(a.prompts * a.steps),
        "--rollout.max_new_tokens", str(a.new_tokens), "--rollout.batch_size", str(a.prompts),
        "--rollout.n_samples_per_prompt", str(a.samples), "--rollout.micro_batch_size", str(a.micro_batch),
        "--rollout.temperature", "1.0",
        "--train.batch_size", str(batch), "--train.micro_batch_size", str(a.train_micro_batch),
        "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "42",
        "--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--ds.zero_stage", "2", "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.gradient_checkpointing_enable", "--actor.adam.lr", "1e-6", "--actor.lr_warmup_ratio", "0",
        "--ckpt.path", os.path.join(root, "ckpt"), "--ckpt.output_dir", os.path.join(root, "hf_final"),
        "--logger.tensorboard_dir", os.path.join(root, "tb"),
        "--engine.backend", a.engine,
    ]
    if a.mismatch == "off":
        argv.append("--engine.no_mismatch_metrics")
    if a.is_correction != "off":
        argv += ["--algo.advantage.is_correction_level", a.is_correction]
    if a.engine == "vllm" and a.enforce_eager:
        argv.append("--vllm.enforce_eager")
    if getattr(a, "cudagraph_max", None) is not None:
        argv += ["--engine.cudagraph_max_size", str(a.cudagraph_max)]
    if layout(a) == "colocate_all":
        argv += ["--train.colocate_all", "--vllm.enable_sleep", "--vllm.gpu_memory_utilization", "0.3"]
    else:
        argv += ["--train.colocate_actor_ref", "--vllm.gpu_memory_utilization", "0.45"]
    if classmate is None:
        argv += ["--algo.advantage.estimator", "group_norm"]
    else:
        memory = getattr(a, "classmate_memory", None) or ("0.2" if layout(a) == "colocate_all" else "0.35")
        argv += ["--classmate.model_name_or_path", classmate, "--classmate.estimator", "gdpo",
                 "--classmate.max_new_tokens", str(a.classmate_new_tokens), "--classmate.temperature", "1.0",
                 "--classmate.gpu_memory_utilization", str(memory), "--classmate.num_engines", ranks,
                 "--classmate.dispatch", getattr(a, "dispatch", "auto")]
        # no --placement: the launcher's default (auto: share wherever the engines' memory fits beside each other)
        if getattr(a, "placement", None):
            argv += ["--classmate.placement", a.placement]
        if getattr(a, "seed_requests", False):
            argv.append("--classmate.seed_requests")
    return argv


def _mean(values: list[float], digits: int | None = 3) -> float | None:
    """Mean rounded to ``digits`` decimals (seconds), or to 4 significant digits (``None``: small levels)."""
    if not values:
        return None
    mean = statistics.fmean(values)
    return round(mean, digits) if digits is not None else float(f"{mean:.4g}")


def spread(values: list[float], digits: int | None = 3) -> dict | None:
    """Median with min / max and the count: how a noisy phase is reported (``digits=None``: 4 significant digits,
    for small levels such as the mismatch metrics)."""
    if not values:
        return None

    def r(x: float) -> float:
        return round(x, digits) if digits is not None else float(f"{x:.4g}")

    return {"median": r(statistics.median(values)), "min": r(min(values)), "max": r(max(values)), "n": len(values)}


def launcher_step_scalars(log: str) -> dict[str, dict[int, float]]:
    """``{"train/<tag>": {step: value}}`` from the controller's ``Global step N: {...}`` lines of a launcher log, the
    shape ``tensorboard_scalars`` returns. Each line is printed as its step ends, so a run stopped by its time limit
    keeps every step it finished (tensorboard's writer flushes every 120 s and loses the rest); non-finite values are
    left out."""
    out: dict[str, dict[int, float]] = {}
    with open(log, errors="replace") as f:
        for line in f:
            parsed = parse_step_line(line)
            if parsed is None:
                continue
            step, status = parsed
            for tag, value in status.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.setdefault(f"train/{tag}", {})[step] = float(value)
    return out


# the rows of each change's before minus after difference: a change shows in the rollout, the experience making
# (the classmate stage's generation and critical path), the actor update or the weight sync, and in the step total
PAIR_ROWS = ["timing/generation", "timing/make_experience", "classmate/generation_time", "classmate/wait_time",
             "timing/ppo_train", "timing/broadcast", "timing/step_total"]


def split_interleaved(tb: dict[str, dict[int, float]], skip_first: int = 1, changes: tuple[str, ...] = (),
                      block: int = 2) -> dict:
    """Per-step timings of an interleaved run, split by step kind (``bench/classmate_step``: 1 = GDPO, 0 = GRPO).

    The first ``skip_first`` steps of each kind are warm-up (CUDA graphs, allocator, JIT, the classmate engine's
    first wake-up) and left out. Returns ``{kind: {"steps": [...], "per_step": {tag: {step: s}}, "stats": {tag:
    spread}}}`` plus ``paired``: the ratio of each steady GDPO step to the GRPO step right after it (same weights
    and machine state give or take one step), as a spread, and ``ratio``, that of the medians.

    A run under ``--before`` (``changes``) splits by ``bench/before``, the path index: see :func:`split_paths`.
    ``block``: steps per path block (2 under the GDPO / GRPO alternation, 1 without)."""
    if changes:
        return split_paths(tb, changes, block, skip_first)
    return _split_kinds(tb, None, skip_first)


def split_paths(tb: dict[str, dict[int, float]], changes: tuple[str, ...], block: int, skip_first: int = 1) -> dict:
    """A run cycling through the launcher's own path and the before path of each of ``changes``
    (``bench/before``: 0 = own path, i = the i-th change; ``bench_switches.before_path``).

    The keys of :func:`_split_kinds` are those of the own path's steps (the "after" of every change); ``changes``
    lists the changes, ``paths`` holds the same split for each change's before steps (each path's first step of each
    kind is warm-up), ``before_after`` per change, kind and :data:`PAIR_ROWS` tag the before minus after seconds,
    each before step paired with the after step that opened its cycle (``index * block`` steps earlier), and
    ``counts`` per change whether both sides have at least :data:`MIN_STEADY` steady steps of each kind that ran."""
    index = tb.get("train/bench/before", {})
    out = _split_kinds(tb, {s for s, v in index.items() if round(v) == 0}, skip_first)
    out["changes"] = list(changes)
    out["paths"], out["before_after"], out["counts"] = {}, {}, {}
    kinds = [kind for kind in ("gdpo", "grpo") if out[kind]["steps"]]
    for i, change in enumerate(changes, start=1):
        path = out["paths"][change] = _split_kinds(tb, {s for s, v in index.items() if round(v) == i}, skip_first)
        out["before_after"][change] = {
            kind: {tag: before_after(out[kind]["per_step"].get(tag, {}), path[kind]["per_step"].get(tag, {}),
                                     gap=i * block)
                   for tag in PAIR_ROWS}
            for kind in kinds}
        out["counts"][change] = bool(kinds) and all(
            min(len(out[kind]["steps"]), len(path[kind]["steps"])) >= MIN_STEADY for kind in kinds)
    return out


def before_after(after: dict[int, float], before: dict[int, float], gap: int = 2) -> dict:
    """Before minus after seconds of one kind and tag: ``median_diff`` (of the medians) and ``pairs``, each steady
    before step ``s`` against the after step of its kind ``gap`` steps earlier (2 under the GDPO / GRPO alternation:
    step 7 vs 5, 8 vs 6; a pair with a warm-up step is left out), with their ``paired`` spread."""
    def median(values: dict[int, float]) -> float | None:
        finite = [v for v in values.values() if v == v]
        return round(statistics.median(finite), 3) if finite else None

    a, b = median(after), median(before)
    pairs = {s: round(v - after[s - gap], 3) for s, v in sorted(before.items())
             if s - gap in after and v == v and after[s - gap] == after[s - gap]}
    return {"after": a, "before": b, "median_diff": round(b - a, 3) if a is not None and b is not None else None,
            "pairs": pairs, "paired": spread(list(pairs.values()))}


def _split_kinds(tb: dict[str, dict[int, float]], only: set[int] | None, skip_first: int) -> dict:
    """:func:`split_interleaved` over the steps in ``only`` (None: every step)."""
    kinds = tb.get("train/bench/classmate_step", {})
    out: dict = {}
    for kind, flag in (("gdpo", 1.0), ("grpo", 0.0)):
        steps = sorted(s for s, v in kinds.items() if round(v) == flag and (only is None or s in only))[skip_first:]
        per_step = {tag: {s: round(tb.get(f"train/{tag}", {}).get(s, float("nan")), 3) for s in steps}
                    for _, tag in ROWS if f"train/{tag}" in tb}
        per_step.update({tag: {s: float(f"{tb[f'train/{tag}'].get(s, float('nan')):.4g}") for s in steps}
                         for tag in LEVELS if f"train/{tag}" in tb})
        stats = {tag: spread([v for v in values.values() if v == v], digits=None if tag in LEVELS else 3)
                 for tag, values in per_step.items()}
        out[kind] = {"steps": steps, "per_step": per_step, "stats": stats}
    total = "timing/step_total"
    gdpo_steps = out["gdpo"]["per_step"].get(total, {})
    grpo_steps = out["grpo"]["per_step"].get(total, {})
    pairs = [gdpo_steps[s] / grpo_steps[s + 1] for s in gdpo_steps if s + 1 in grpo_steps and grpo_steps[s + 1] > 0]
    out["paired"] = spread(pairs)
    g = (out["grpo"]["stats"].get(total) or {}).get("median")
    c = (out["gdpo"]["stats"].get(total) or {}).get("median")
    out["ratio"] = round(c / g, 3) if g and c else None
    return out


# vLLM's own start-up lines (each engine's load, torch.compile with or without its cache, CUDA-graph capture, KV
# cache, the whole init): the engines' share of startup_s, phase by phase
VLLM_STARTUP = re.compile(r"(Loading weights took|Model loading took|torch\.compile takes|Directly load the compiled|"
                          r"Compiling a graph for|Graph capturing finished|init engine .* took|"
                          r"Available KV cache memory|GPU KV cache size)")


def vllm_startup_lines(log: str) -> list[str]:
    """The launcher log's vLLM start-up lines (:data:`VLLM_STARTUP`), without their Ray prefixes' timestamps."""
    try:
        with open(log, errors="replace") as f:
            return [line.strip()[-240:] for line in f if VLLM_STARTUP.search(line)][:60]
    except OSError:
        return []


def run_one(name: str, a, policy: str, classmate: str | None, data: str, timeout: int,
            interleave: bool = False) -> dict:
    root = os.path.join(a.work, f"{name}_{a.gpus}gpu{variant(a)}")
    shutil.rmtree(root, ignore_errors=True)  # no stale tensorboard events of an earlier attempt
    os.makedirs(root, exist_ok=True)
    log = os.path.join(root, "launcher.log")
    t0 = time.time()
    code = run_launcher(launcher_argv(a, policy, classmate, data, root), log, timeout=timeout,
                        env=launcher_env(a, interleave))
    row: dict = {"run": name, "exit": code, "wall_s": round(time.time() - t0, 1), "log": log}
    tb = launcher_step_scalars(log) if interleave else None
    if code != 0:
        row["log_tail"] = _tail(log, 60)
        if not (tb and tb.get("train/timing/step_total")):
            return row
        # an interleaved run stopped by its time limit: the steps it logged are complete measurements
        row["partial"] = True
    if tb is None:
        tb = tensorboard_scalars(os.path.join(root, "tb"))
    row["response_length"] = _mean(list(tb.get("train/response_length", {}).values()))
    # the launcher's start-up breakdown, logged at step 1 (integration/startup.py): launch to the end of step 1 and
    # each phase before it
    row["first_step_s"] = tb.get("train/startup/first_step_s", {}).get(1)
    row["startup_s"] = {tag.removeprefix("train/startup/"): values[1] for tag, values in tb.items()
                        if tag.startswith("train/startup/") and 1 in values}
    row["vllm_startup_lines"] = vllm_startup_lines(log)
    row["classmate_output_length"] = _mean(list(tb.get("train/classmate/output_length", {}).values()))
    if interleave:
        row.update(split_interleaved(tb, changes=before_list(a), block=1 if gdpo_only(a) else 2))
        row["outside_steps_s"] = time_outside_steps(row["wall_s"], tb)
        row.update(throughput(row, a.prompts * a.samples, a.gpus))
        return row
    per_step = {tag: {int(s): round(v, 3) for s, v in sorted(tb.get(f"train/{tag}", {}).items())} for _, tag in ROWS}
    per_step.update({tag: {int(s): float(f"{v:.4g}") for s, v in sorted(tb.get(f"train/{tag}", {}).items())}
                     for tag in LEVELS if f"train/{tag}" in tb})
    steps = sorted(per_step["timing/step_total"])
    steady = [s for s in steps if s > 1] or steps
    row.update(steps=steps, steady_steps=steady, per_step=per_step,
               mean={tag: _mean([v for s, v in values.items() if s in steady], digits=None if tag in LEVELS else 3)
                     for tag, values in per_step.items()})
    if classmate is None:  # no classmate stage: make_experience is the actor/ref forwards (+ upstream advantages)
        row["mean"]["classmate/actor_ref_forward_time"] = row["mean"]["timing/make_experience"]
    return row


def throughput(row: dict, samples_per_step: int, gpus: int) -> dict:
    """Per kind, the generated tokens per second per GPU of the median step (``samples_per_step`` responses of the
    run's mean response length, over the median ``timing/step_total``), and the median weight sync of the steady
    steps of both kinds (``weight_sync_median_s``)."""
    length = row.get("response_length")
    tokens = {}
    for kind in ("grpo", "gdpo"):
        median = ((row.get(kind) or {}).get("stats", {}).get("timing/step_total") or {}).get("median")
        if median and length:
            tokens[kind] = round(samples_per_step * length / median / gpus, 1)
    syncs = [v for kind in ("grpo", "gdpo") for v in ((row.get(kind) or {}).get("per_step", {})
                                                      .get("timing/broadcast", {}).values()) if v == v]
    return {"tokens_per_s_per_gpu": tokens,
            "weight_sync_median_s": round(statistics.median(syncs), 3) if syncs else None}


def run_group(cmd: list[str], timeout: float) -> None:
    """Run ``cmd`` in its own process group and kill the whole group when it is over ``timeout`` or done: vLLM's
    EngineCore child outlives a killed parent, and one kept a device call's console open past the call's limit
    (bench/GPU_RESULTS.md section 9). Raises CalledProcessError / TimeoutExpired as ``subprocess.run`` does."""
    import subprocess

    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        if proc.wait(timeout=timeout) != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd[:2])
    finally:
        kill_session(proc)  # what is left of the group (the parent may be gone already)


# the standalone engine's start (~40 s with a warm compile cache, ~75 s on a fresh machine) and its warm-up and three
# rounds at 0.5B
STANDALONE_ESTIMATE_S = 120


def standalone(a, row: dict, left_s: float) -> dict:
    """The policy engine alone (``bench/vllm_generation_logprobs.py``: one ``AsyncLLMEngine``, the same model, each
    engine's share of the batch at once, upstream's request without log-probs, 3 rounds after a warm-up) against
    the run's rollout phase: ``rollout_vs_standalone`` per kind, the trainer's generated tokens/s per engine over the
    median ``timing/generation`` divided by the standalone engine's. Run after the launcher, on the GPU it left."""
    import subprocess

    out = os.path.join(a.work, "standalone.json")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_generation_logprobs.py"),
           "--requests", str(a.prompts * a.samples // a.gpus), "--tokens", str(a.new_tokens), "--prompt-len", "32",
           "--rounds", "3", "--variants", "upstream,mismatch", "--gpu-memory-utilization", "0.3",
           "--models", a.models, "--out", out]
    if left_s < STANDALONE_ESTIMATE_S:
        return {"standalone": {"skipped": f"{left_s:.0f} s left, ~{STANDALONE_ESTIMATE_S} s needed"}}
    if os.path.exists(out):
        os.remove(out)  # a previous call's figures must not stand in for this one's
    try:
        run_group(cmd, timeout=left_s)
    except subprocess.TimeoutExpired as e:
        if not os.path.exists(out):  # the script writes its JSON after the rounds, before vLLM's shutdown
            return {"standalone": {"error": repr(e)[-500:]}}
    except (subprocess.SubprocessError, OSError) as e:
        return {"standalone": {"error": repr(e)[-500:]}}
    try:
        engine = json.load(open(out))
    except (OSError, ValueError) as e:
        return {"standalone": {"error": repr(e)[-500:]}}
    alone = engine["variants"]["upstream"]["tokens_per_s"]
    length = row.get("response_length") or a.new_tokens
    ratios = {}
    for kind in ("grpo", "gdpo"):
        median = ((row.get(kind) or {}).get("stats", {}).get("timing/generation") or {}).get("median")
        if median:
            ratios[kind] = round(a.prompts * a.samples / a.gpus * length / median / alone, 3)
    return {"standalone": engine, "rollout_vs_standalone": ratios}


def scaling(one: dict, two: dict) -> dict:
    """Tokens/s per GPU of a multi-GPU interleaved call over a one-GPU call's, per kind (target
    :data:`SCALING_TARGET`): the last call of each JSON. Refused (``ValueError``) unless both ran the same per-GPU
    batch, models and request path: another per-GPU batch is another figure."""
    if one.get("gpus") != 1 or (two.get("gpus") or 1) < 2:
        raise ValueError(f"needs a 1-GPU and a multi-GPU step-time JSON (got {one.get('gpus')} and {two.get('gpus')})")
    for key in ("models", "engine", "mismatch", "is_correction", "dispatch", "placement", "layout"):
        if one.get(key) != two.get(key):
            raise ValueError(f"{key} differs: {one.get(key)!r} on 1 GPU, {two.get(key)!r} on {two['gpus']}")
    per_gpu = [c.get("samples_per_gpu") for c in (one, two)]
    if None in per_gpu or per_gpu[0] != per_gpu[1]:
        raise ValueError(f"the per-GPU batch differs: {per_gpu[0]} samples per GPU on 1 GPU, {per_gpu[1]} on "
                         f"{two['gpus']} (run the multi-GPU call with --prompts {two['gpus']} x the one-GPU call's)")
    a, b = one["calls"][-1].get("tokens_per_s_per_gpu", {}), two["calls"][-1].get("tokens_per_s_per_gpu", {})
    ratios = {kind: round(b[kind] / a[kind], 3) for kind in ("grpo", "gdpo") if a.get(kind) and b.get(kind)}
    return {"one_gpu": a, "multi_gpu": b, "gpus": two["gpus"], "ratios": ratios, "target": SCALING_TARGET,
            "meets": bool(ratios) and all(r >= SCALING_TARGET for r in ratios.values())}


def time_outside_steps(wall_s: float, tb: dict[str, dict[int, float]]) -> float:
    """Seconds of a run spent outside its logged steps: start-up (Ray, the engines one after the other, CUDA graphs,
    the models) plus shutdown or the unfinished step a time limit cut; what a device call must leave for them."""
    return round(wall_s - sum(tb.get("train/timing/step_total", {}).values()), 1)


def _guarded_run(name: str, a, policy: str, classmate: str | None, data: str, timeout: int,
                 interleave: bool = False) -> dict:
    try:
        return run_one(name, a, policy, classmate, data, timeout, interleave)
    except Exception as e:  # noqa: BLE001  (keep the other run's numbers and the JSON)
        return {"run": name, "exit": "error", "error": repr(e)[-2000:],
                "log": os.path.join(a.work, f"{name}_{a.gpus}gpu{variant(a)}", "launcher.log")}


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def print_table(result: dict) -> None:
    grpo, gdpo = result["runs"].get("grpo", {}), result["runs"].get("gdpo", {})
    print(f"\nstep-time breakdown, {result['gpus']} GPU(s), {result['device']}: {result['batch']}; seconds, mean of "
          f"steps {gdpo.get('steady_steps') or grpo.get('steady_steps')}")
    print(f"{'':<36}{'GRPO':>9}{'GDPO':>9}{'GDPO-GRPO':>11}")
    for label, tag in ROWS:
        g, c = (grpo.get("mean") or {}).get(tag), (gdpo.get("mean") or {}).get(tag)
        delta = f"{c - g:>11.2f}" if g is not None and c is not None else f"{'':>11}"
        print(f"{label:<36}{'' if g is None else f'{g:.2f}':>9}{'' if c is None else f'{c:.2f}':>9}{delta}")
    for name, run in result["runs"].items():
        if run.get("exit") != 0:
            print(f"{name}: exit {run.get('exit')} (see {run.get('log')}) {run.get('skipped', '')}")
    for name, run in result["runs"].items():
        means = {tag.split("/")[-1]: (run.get("mean") or {}).get(tag) for tag in LEVELS}
        if any(v is not None for v in means.values()):
            print(f"{name} per-step means: " + ", ".join(f"{k} {v:.3g}" for k, v in means.items() if v is not None))
    if result.get("ratio") is not None:
        print(f"GDPO / GRPO step time = {result['ratio']:.3f} ({verdict(result['ratio'], result['gpus'])})")


def verdict(ratio: float | None, gpus: int) -> str:
    """Whether a GDPO / GRPO step-time ratio meets the target of its GPU count."""
    target = TARGETS[gpus]
    return f"{'meets' if ratio is not None and ratio <= target else 'misses'} the {target}x target"


def interleaved_timeout(left: float) -> int:
    """Seconds the interleaved run may take: no 600 s cap (a run started in its own session, setsid, may outlive one
    device call); --budget-s bounds it (the steps it finished before its limit count: launcher_step_scalars), and
    without one (the CPU check) the watchdog's hard limit does."""
    return int(min(left - 10, HARD_TIMEOUT))


def interleaved_call(a, result: dict, policy: str, classmate: str, data: str, start: float) -> None:
    """One interleaved run per call; the calls of one (warm) machine with the same settings are kept in ``$WORK`` so
    that the ratio's spread between calls is reported next to each call's figure."""
    name = f"step_time_{a.gpus}gpu_interleaved_{result['placement']}{variant(a)}"
    state_path, out_path = os.path.join(a.work, name + ".json"), os.path.join(a.out, name + ".json")
    state = json.load(open(state_path)) if os.path.isfile(state_path) and not a.fresh else None
    previous = None
    if a.previous:
        try:
            previous = json.load(open(a.previous))
        except (OSError, ValueError) as e:
            sys.exit(f"error: --previous {a.previous}: not a step-time JSON ({e})")
        result["previous"] = a.previous
    calls = earlier_calls(result, state, previous, a.previous or "")
    left = a.budget_s - (time.time() - start)
    if left < a.run_estimate_s:
        row = {"run": "interleaved", "exit": None,
               "skipped": f"{left:.0f} s left of --budget-s, ~{a.run_estimate_s:.0f} s needed"}
    else:
        row = _guarded_run("interleaved", a, policy, classmate, data, timeout=interleaved_timeout(left),
                           interleave=True)
    if a.standalone and row.get("exit") == 0:
        row.update(standalone(a, row, a.budget_s - (time.time() - start) - 10))
    row["call"] = len(calls) + 1
    calls.append(row)
    result.update(calls=calls, **combine_calls(calls))
    # this call's start-up, weight sync and throughput at the top, readable without the table
    result.update({k: row.get(k) for k in ("first_step_s", "weight_sync_median_s", "tokens_per_s_per_gpu",
                                            "rollout_vs_standalone")})
    for path in (state_path, out_path):
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".tmp", path)
    print_interleaved(result)
    sys.exit(0 if row.get("exit") == 0 else 1)


# the settings two interleaved calls must share to be counted together (a ratio of another card, batch, layout or
# request path is another figure)
CALL_SETTINGS = ("device", "batch", "models", "gpus", "engine", "placement", "mismatch", "is_correction",
                 "before", "gdpo_only", "dispatch", "seed_requests", "layout", "cudagraph_max")
# the value of a setting a JSON written before the setting existed holds (every interleaved call before the layout
# setting ran on one GPU, colocate_all)
SETTING_DEFAULTS = {"gdpo_only": False, "layout": "colocate_all", "cudagraph_max": None}


def earlier_calls(result: dict, state: dict | None, previous: dict | None, previous_name: str = "") -> list[dict]:
    """The calls this one is counted with: those kept on this (warm) machine with the same settings (``state``), and
    those of an earlier machine's JSON (``--previous``, e.g. a committed ``bench/gpu_results`` file), so that the two
    calls the agreement rule needs may come from two device sessions. A ``previous`` of other settings is refused
    before any run; the machine's own calls already holding ``previous``'s are not counted twice."""
    def setting(saved: dict, k: str):
        return saved.get(k, SETTING_DEFAULTS.get(k))

    calls = state.get("calls", []) if state and all(setting(state, k) == result[k] for k in CALL_SETTINGS) else []
    if previous is None:
        return calls
    differ = [k for k in CALL_SETTINGS if setting(previous, k) != result[k]]
    if differ:
        detail = ", ".join(f"{k} {setting(previous, k)!r} there, {result[k]!r} here" for k in differ)
        sys.exit(f"error: --previous {previous_name}: other settings ({detail}); its calls are another figure "
                 "(same card kind, batch, placement and request path, or leave --previous out)")
    before = previous.get("calls", [])
    return calls if calls[:len(before)] == before else before + calls


def steady_steps(row: dict) -> int:
    """The steady steps of the kind with fewer of them in one call (the launcher's own path under an alternation)."""
    return min(len((row.get(kind) or {}).get("steps") or []) for kind in ("gdpo", "grpo"))


def combine_calls(calls: list[dict]) -> dict:
    """The ratio of each call, and the calls that count: those with at least :data:`MIN_STEADY` steady steps of each
    kind (a call stopped by its limit with fewer is kept in ``all_ratios`` only). Two or more counted calls get
    their ``call_spread`` (largest minus smallest ratio of medians) and ``calls_agree`` (spread <= :data:`AGREE`)."""
    counted = [c for c in calls if c.get("ratio") and steady_steps(c) >= MIN_STEADY]
    out = {"steady_steps": [steady_steps(c) for c in calls], "all_ratios": [c.get("ratio") for c in calls],
           "ratios": [c["ratio"] for c in counted],
           "paired_ratios": [(c.get("paired") or {}).get("median") for c in counted]}
    if len(counted) >= 2:
        out["call_spread"] = round(max(out["ratios"]) - min(out["ratios"]), 3)
        out["calls_agree"] = out["call_spread"] <= AGREE
    return out


def print_interleaved(result: dict) -> None:
    row = result["calls"][-1]
    if "changes" in row:
        return print_paths(result, row)
    columns = [("GRPO", row.get("grpo")), ("GDPO", row.get("gdpo"))]
    _table_head("interleaved step time", result, row, columns)
    if "gdpo" not in row:
        return
    _table_rows(columns)

    def ratio_line(title: str, part: dict) -> None:
        paired = part.get("paired") or {}
        least = steady_steps(part)
        judged = (verdict(part["ratio"], result["gpus"]) if least >= MIN_STEADY else
                  f"- {least} steady steps of each kind (GDPO {len(part['gdpo']['steps'])}, GRPO "
                  f"{len(part['grpo']['steps'])}): too few to count (at least {MIN_STEADY})")
        print(f"{title} = {part['ratio']} (ratio of medians; paired GDPO step / next GRPO step: median "
              f"{paired.get('median')} [{paired.get('min')}, {paired.get('max')}]) {judged}")

    ratio_line("GDPO / GRPO", row)
    if len(result.get("calls", [])) >= 2:
        print(f"ratios of the calls so far: {result['all_ratios']} (steady steps of each kind: "
              f"{result['steady_steps']}); of the calls with at least {MIN_STEADY}: {result['ratios']}"
              + (f" (spread {result['call_spread']}; {'agree' if result['calls_agree'] else 'DO NOT agree'} "
                 f"within {AGREE})" if "call_spread" in result else ""))


def _table_head(what: str, result: dict, row: dict, columns: list[tuple[str, dict | None]]) -> None:
    """The title line of an interleaved call's table (the steps of each column), and its exit if it failed."""
    steps = " / ".join(f"{title.lower()} {(group or {}).get('steps')}" for title, group in columns)
    print(f"\n{what}, {result['gpus']} GPU(s), {result['device']}, classmate {result['placement']}: "
          f"{result['batch']}; call {row['call']}; seconds, median [min, max] over steps {steps}")
    if row.get("exit") != 0:
        print(f"run: exit {row.get('exit')} (see {row.get('log')}) {row.get('skipped', '')}"
              + (" - the steps it logged before stopping:" if row.get("partial") else ""))


def _table_rows(columns: list[tuple[str, dict]]) -> None:
    """The column titles, then a line per :data:`ROWS` entry: each column's median [min, max]."""
    print(f"{'':<36}" + "".join(f"{title:>22}" for title, _ in columns))
    for label, tag in ROWS:
        print(f"{label:<36}" + "".join(f"{_cell(group, tag):>22}" for _, group in columns))


def _cell(group: dict, tag: str) -> str:
    st = group["stats"].get(tag)
    return f"{st['median']:.2f} [{st['min']:.2f}, {st['max']:.2f}]" if st else ""


def _diff(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def print_paths(result: dict, row: dict) -> None:
    """The table of a multi-change run (:func:`split_paths`): a column per kind that ran and path, then each
    change's before minus after rows."""
    kinds = [kind for kind in ("grpo", "gdpo") if (row.get(kind) or {}).get("steps")]
    columns = [(f"{kind.upper()} after", row[kind]) for kind in kinds]
    columns += [(f"{kind.upper()} {change}", row["paths"][change][kind]) for kind in kinds for change in row["changes"]]
    _table_head("before/after pairs", result, row, columns)
    if not kinds:
        return
    _table_rows(columns)
    labels = {tag: label.strip() for label, tag in ROWS}
    for change in row["changes"]:
        least = min(min(len(row[kind]["steps"]), len(row["paths"][change][kind]["steps"])) for kind in kinds)
        print(f"{change}: before - after ({least} steady steps on the smaller side; "
              + ("counts)" if row["counts"][change] else f"too few to count, at least {MIN_STEADY})"))
        for tag in PAIR_ROWS:
            parts = []
            for kind in kinds:
                ba = row["before_after"][change][kind][tag]
                if ba["after"] is None:
                    continue
                pairs = ba["paired"] or {}
                parts.append(f"{kind.upper()} {_diff(ba['median_diff'])} (pairs {_diff(pairs.get('median'))} "
                             f"[{_diff(pairs.get('min'))}, {_diff(pairs.get('max'))}])")
            if parts:
                print(f"  {labels[tag]}: " + ", ".join(parts))
    if "grpo" not in kinds:
        print("GDPO steps only: no GDPO / GRPO ratio in this run (its figures are the pairs above)")
    elif "gdpo" in kinds:
        print(f"GDPO / GRPO, after steps = {row['ratio']} (ratio of medians)")


def parse_cli(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, choices=(1, 2), default=1)
    p.add_argument("--runs", default="grpo,gdpo", help="grpo, gdpo or both (comma-separated)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--classmate-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=16, help="--rollout.micro_batch_size (forward passes)")
    p.add_argument("--train-micro-batch", type=int, default=8, help="--train.micro_batch_size")
    p.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (faster engine start)")
    p.add_argument("--no-eager-fallback", action="store_true",
                   help="do not retry in eager mode when the first run fails with CUDA graphs / compilation")
    p.add_argument("--mismatch", choices=("on", "off"), default="on",
                   help="on: the launcher's default mismatch/* metrics (sampled-token log-probs from the engines); "
                        "off: --engine.no_mismatch_metrics (upstream's request)")
    p.add_argument("--is-correction", choices=("off", "token"), default="off",
                   help="token: upstream's --algo.advantage.is_correction_level token (its own log-prob request)")
    p.add_argument("--tiny", action="store_true", help="tiny models (CPU check of the script path)")
    p.add_argument("--models", default=os.path.join(os.environ.get("WORK", "/tmp"), "step_time_models"))
    p.add_argument("--work", default=os.path.join(os.environ.get("WORK", "/tmp"), "step_time"))
    p.add_argument("--out", default=os.environ.get("OUT", "step_time_out"))
    p.add_argument("--budget-s", type=float, default=float("inf"), help="skip a run that would not end in time")
    p.add_argument("--run-estimate-s", type=float, default=270, help="expected wall time of one run (budget)")
    p.add_argument("--prepare-only", action="store_true", help="build the models and data, run nothing")
    p.add_argument("--fresh", action="store_true", help="measure again runs an earlier call already measured")
    p.add_argument("--previous", default=None, metavar="JSON",
                   help="with --interleave: an earlier machine's step-time JSON (e.g. a committed bench/gpu_results "
                        "file) whose calls count with this one: the spread between calls across device sessions; "
                        "refused before the run when its settings differ")
    p.add_argument("--interleave", action="store_true",
                   help="one launcher run whose steps alternate GDPO (odd) and plain GRPO (even): both kinds timed in "
                        "one process, same engines and drift (--steps counts both kinds; the first of each is warm-up)")
    p.add_argument("--dispatch", choices=("auto", "group", "batch"), default="auto",
                   help="--classmate.dispatch (auto: per prompt group where the classmate engines stay awake, i.e. "
                        "--placement share)")
    p.add_argument("--before", default=None, metavar="CHANGE[,CHANGE...]",
                   help=f"with --interleave: steps take the path from before a change ({BENCH_BEFORE_ENV}; the changes "
                        "whose before path the code holds: bench_switches.BEFORE_CHANGES). The steps cycle through "
                        "after and each change's before path (--runs gdpo: one step per block)")
    p.add_argument("--seed-requests", action="store_true",
                   help="--classmate.seed_requests: a seed per classmate request (vLLM's per-request sampling loop; "
                        "the launcher's default is off)")
    p.add_argument("--placement", choices=("auto", "colocate", "share"), default=None,
                   help="--classmate.placement (default: the launcher's, auto)")
    p.add_argument("--layout", choices=("colocate_all", "split"), default="colocate_all",
                   help="with --gpus 2: colocate_all = every model on both GPUs, data parallel (--prompts counts both "
                        "GPUs' prompts: twice the one-GPU call's for the same per-GPU batch); split = actor/ref on one "
                        "GPU, the policy and classmate engines on the other")
    p.add_argument("--classmate-memory", type=float, default=None,
                   help="--classmate.gpu_memory_utilization (default 0.2 colocate_all, 0.35 split)")
    p.add_argument("--cudagraph-max", type=int, default=None, metavar="N",
                   help="--engine.cudagraph_max_size N (0: vLLM's own capture sizes, up to 512; default: the "
                        "launcher's, the rollout's per-engine batch)")
    p.add_argument("--standalone", action="store_true",
                   help="with --interleave: after the run, the policy engine alone on the same batch "
                        "(bench/vllm_generation_logprobs.py), and the rollout phase's tokens/s against it "
                        "(rollout_vs_standalone per kind)")
    p.add_argument("--scaling", nargs=2, default=None, metavar=("ONE_GPU_JSON", "TWO_GPU_JSON"),
                   help="run nothing: tokens/s per GPU of two interleaved JSONs' last calls, multi over one GPU, per "
                        f"kind (target {SCALING_TARGET}), printed and written to --out as scaling.json")
    a = p.parse_args(argv)
    try:
        before_list(a)
    except ValueError as e:
        p.error(f"--before {a.before}: {e}")
    if a.before and not a.interleave:
        p.error("--before needs --interleave: it compares the steps of one run")
    if a.interleave and set(a.runs.split(",")) not in ({"grpo", "gdpo"}, {"gdpo"}):
        p.error(f"--runs {a.runs} with --interleave: grpo,gdpo (steps alternate the kinds) or gdpo (GDPO steps only, "
                "with --before)")
    if gdpo_only(a) and not a.before:
        p.error("--interleave --runs gdpo needs --before: a run of GDPO steps only compares the paths of its changes")
    if a.previous and not a.interleave:
        p.error("--previous needs --interleave: it counts earlier interleaved calls with this one")
    if a.standalone and (not a.interleave or a.engine != "vllm" or a.tiny):
        p.error("--standalone compares an interleaved run's rollout with a real vLLM engine: --interleave, "
                "--engine vllm, no --tiny")
    if a.previous and not os.path.isfile(a.previous):
        p.error(f"--previous {a.previous}: no such file")
    return a


def scaling_call(a) -> None:
    """``--scaling ONE TWO``: the scaling figure of two committed or fresh interleaved JSONs."""
    try:
        one, two = (json.load(open(path)) for path in a.scaling)
        result = {"one_gpu_json": a.scaling[0], "multi_gpu_json": a.scaling[1], **scaling(one, two)}
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"error: --scaling {' '.join(a.scaling)}: {e}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "scaling.json"), "w") as f:
        json.dump(result, f, indent=1)
    for kind, ratio in result["ratios"].items():
        print(f"{kind.upper()}: {result['multi_gpu'][kind]:,.0f} tokens/s per GPU on {result['gpus']} GPUs, "
              f"{result['one_gpu'][kind]:,.0f} on 1: {ratio:.3f}x ({'meets' if ratio >= SCALING_TARGET else 'misses'}"
              f" the {SCALING_TARGET}x target)")


def main() -> None:
    a = parse_cli()
    if a.scaling:
        return scaling_call(a)
    start = time.time()
    shape = TINY if a.tiny else QWEN25_05B
    kind = "tiny" if a.tiny else "qwen2.5-0.5b-shape"
    policy = build_model(os.path.join(a.models, f"{kind}_policy"), shape, seed=0)
    classmate = build_model(os.path.join(a.models, f"{kind}_classmate"), shape, seed=1)
    os.makedirs(a.work, exist_ok=True)
    data = build_data(os.path.join(a.work, "prompts.jsonl"), a.prompts * a.steps)
    print(f"models ready in {time.time() - start:.0f} s: {policy}, {classmate}", flush=True)
    if a.prepare_only:
        return
    import torch

    device = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
              else "cpu")
    result = {
        "device": device, "gpus": a.gpus, "engine": a.engine, "enforce_eager": a.enforce_eager, "models": kind,
        "shape": shape, "vocab_size": shape["vocab_size"],
        "batch": f"{a.prompts} prompts x {a.samples} samples, {a.new_tokens} new tokens, classmate "
                 f"{a.classmate_new_tokens} new tokens",
        "target": TARGETS[a.gpus], "mismatch": a.mismatch, "is_correction": a.is_correction,
        "before": a.before, "gdpo_only": gdpo_only(a), "dispatch": a.dispatch,
        "seed_requests": a.seed_requests, "layout": layout(a), "cudagraph_max": a.cudagraph_max,
        "samples_per_gpu": a.prompts * a.samples // a.gpus,
        "runs": {},
    }
    os.makedirs(a.out, exist_ok=True)
    if a.interleave:
        result["placement"] = a.placement or "auto"
        return interleaved_call(a, result, policy, classmate, data, start)
    out_path = os.path.join(a.out, f"step_time_{a.gpus}gpu{variant(a)}.json")
    # runs of earlier calls on the same (warm) machine with the same settings count too: GRPO and GDPO can be
    # measured in two device calls and still be compared in one table
    state_path = os.path.join(a.work, f"step_time_{a.gpus}gpu{variant(a)}.json")
    if os.path.isfile(state_path) and not a.fresh:
        previous = json.load(open(state_path))
        same = all(previous.get(k) == result[k]
                   for k in ("device", "batch", "models", "gpus", "engine", "mismatch", "is_correction"))
        if same and (previous.get("enforce_eager") or not a.enforce_eager):
            result["runs"].update({k: v for k, v in previous["runs"].items() if v.get("exit") == 0})
            result["enforce_eager"] = previous.get("enforce_eager", result["enforce_eager"])
            a.enforce_eager = result["enforce_eager"]
    for name in a.runs.split(","):
        if name not in ("grpo", "gdpo"):
            raise SystemExit(f"error: --runs: unknown run {name!r} (grpo, gdpo)")
        if result["runs"].get(name, {}).get("exit") == 0 and not a.fresh:
            print(f"{name}: measured in an earlier call on this machine (--fresh to measure again)", flush=True)
            continue
        left = a.budget_s - (time.time() - start)
        if left < a.run_estimate_s:
            result["runs"][name] = {"run": name, "exit": None,
                                    "skipped": f"{left:.0f} s left of --budget-s, ~{a.run_estimate_s:.0f} s needed"}
        else:
            row = _guarded_run(name, a, policy, classmate if name == "gdpo" else None, data,
                               timeout=int(min(600, left - 10)))
            left = a.budget_s - (time.time() - start)
            if (row["exit"] != 0 and a.engine == "vllm" and not a.enforce_eager and not a.no_eager_fallback
                    and not any(r.get("exit") == 0 for r in result["runs"].values())
                    and left >= a.run_estimate_s):
                # the first run failed with vLLM's default CUDA graphs / torch.compile: measure both runs eagerly
                result["eager_fallback"] = {"first_attempt": {k: row[k] for k in ("exit", "wall_s", "log")},
                                            "log_tail": _tail(row["log"], 40)}
                a.enforce_eager = result["enforce_eager"] = True
                row = _guarded_run(name, a, policy, classmate if name == "gdpo" else None, data,
                                   timeout=int(min(600, left - 10)))
            result["runs"][name] = row
        grpo, gdpo = result["runs"].get("grpo", {}), result["runs"].get("gdpo", {})
        g = (grpo.get("mean") or {}).get("timing/step_total")
        c = (gdpo.get("mean") or {}).get("timing/step_total")
        result["ratio"] = round(c / g, 3) if g and c else None
        for path in (out_path, state_path):
            with open(path + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(path + ".tmp", path)
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(out_path + ".tmp", out_path)
    print_table(result)
    sys.exit(0 if all(r.get("exit") == 0 for r in result["runs"].values()) else 1)


if __name__ == "__main__":
    main()

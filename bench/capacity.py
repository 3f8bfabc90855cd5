"""What fits where: a few steps of classmate GDPO for each cell of a grid of model shapes, response lengths and GPU
counts, with the outcome (runs / refused at launch / host OOM / OOM with the stage that ran out / timeout / error),
the peak memory per GPU, the step seconds, the generated tokens/s per GPU and the flags that made the cell fit.

    python bench/capacity.py --cells 7b+1.5b/2k/2gpu,1.5b+0.5b/8k/1gpu --out DIR --budget-s 1500
    python bench/capacity.py --list                       # the grid, in the order the cells run
    python bench/capacity.py --tiny --engine hf --cells 1.5b+0.5b/2k/1gpu   # the script path on CPU, tiny models

Models: random weights in Qwen2.5's shapes (:data:`SHAPES`: 0.5B, 1.5B, 3B and 7B; Llama architecture, which leaves
out Qwen2.5's q/k/v biases, 0.1% of the parameters), bf16, with a word-level tokenizer of exactly Qwen2.5's embedding
size (``step_time.build_model``). A random policy practically never writes EOS or ``</think>``: every response is
``--response`` tokens long and all of it goes to the classmate as CoT, the most memory a step of that length can take.
The models are built once into ``--models`` (7B: 15 GB of disk).

Batch: 4 prompts x 4 samples per GPU (16 responses of the cell's length per GPU: 1 GPU 4 x 4, 2 GPUs 8 x 4), one
optimizer step per rollout batch, KL to a reference model, the classmate writing ``--classmate-tokens`` (256) tokens
after the CoT. ``--steps`` (2) steps: step 1 carries the warm-up (CUDA graphs, allocator, JIT), the last step is the
one timed. The launcher is stopped once the last step is logged (the final HF save of a 7B model would add minutes
and measure the disk).

Layout, as a user would run it: every model colocated on every GPU (``--train.colocate_all``, the policy engines
sleeping during training), one policy engine per GPU, the classmate ``share`` (one classmate engine per GPU, awake
beside the sleeping policy engine so that its generation overlaps the actor/ref forwards), ZeRO-2 on one GPU and
ZeRO-3 over two, gradient checkpointing, the chunked LM-head log-probs (the launcher's default).

Flags that make a cell fit (:func:`plan`): a memory estimate per GPU (DeepSpeed's training state, the reference model,
each engine's weights and KV cache, activations) sets each engine's ``gpu_memory_utilization`` from what it holds,
adds ``--ds.enable_sleep`` (the actor/ref states leave the GPU while the engines generate) when the engines and the
training state do not fit together, and ``--ds.adam_offload`` (Adam's fp32 states on the CPU) when the training
state alone does not fit; micro-batches keep about 8k tokens per forward. The plan is an estimate: the table records
what happened.

Peak memory per GPU is what ``nvidia-smi`` reports as used, sampled every 0.5 s over the whole run (the engines'
reserved KV caches included: what another process could not have). Outputs: ``capacity.json`` in ``--out`` after
every cell (a ``cells`` list) and the table printed last; finished cells are kept in ``--work`` and reused by a later
call on the same machine (``--fresh`` measures them again), so a grid larger than one device call is sent again until
it is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # step_time's model and prompt builders

from step_time import build_data, build_model  # noqa: E402  (the step-time benchmark's random models and prompts)

import openrlhf_classmate  # noqa: E402,F401
from openrlhf_classmate.demo.launch import parse_step_line  # noqa: E402
from openrlhf_classmate.testing.watchdog import run_watched  # noqa: E402

GIB = 1024**3
_QWEN = dict(vocab_size=151_936, rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32_768)
# Qwen2.5's configurations (hidden, MLP, layers, query heads, key-value heads; 7B unties its LM head)
SHAPES = {
    "0.5b": dict(_QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(_QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
    "3b": dict(_QWEN, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2),
    "7b": dict(_QWEN, vocab_size=152_064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=10_000.0, rms_norm_eps=1e-6, max_position_embeddings=20_000)
LENGTHS = {"2k": 2048, "8k": 8192}
PROMPTS_PER_GPU, SAMPLES = 4, 4
PROMPT_TOKENS = 64  # the arithmetic prompts with the chat template, rounded up (--data.max_len = response + this)
# the grid (3 policies x 2 classmates x 2 response lengths x 1-2 GPUs) in the order a device call runs it: the
# question users ask first ("7B with a 1.5B classmate on two GPUs?"), then one GPU, then the rest
ORDER = [
    "7b+1.5b/2k/2gpu", "1.5b+0.5b/8k/1gpu", "7b+1.5b/8k/2gpu", "3b+0.5b/8k/1gpu", "7b+1.5b/2k/1gpu",
    "1.5b+0.5b/2k/1gpu", "3b+1.5b/2k/1gpu", "7b+0.5b/2k/2gpu", "1.5b+1.5b/8k/1gpu", "3b+0.5b/8k/2gpu",
    "1.5b+0.5b/8k/2gpu", "7b+0.5b/8k/2gpu",
]
GRID = ORDER + [f"{p}+{c}/{r}/{g}gpu" for p in ("1.5b", "3b", "7b") for c in ("0.5b", "1.5b") for r in LENGTHS
                for g in (1, 2) if f"{p}+{c}/{r}/{g}gpu" not in ORDER]


@dataclass(frozen=True)
class Cell:
    policy: str
    classmate: str
    response: int
    gpus: int

    @property
    def name(self) -> str:
        length = next(k for k, v in LENGTHS.items() if v == self.response)
        return f"{self.policy}+{self.classmate}/{length}/{self.gpus}gpu"

    @property
    def prompts(self) -> int:
        return PROMPTS_PER_GPU * self.gpus


def parse_cell(name: str) -> Cell:
    m = re.fullmatch(r"([0-9.]+b)\+([0-9.]+b)/(\d+k)/([12])gpu", name)
    if not m or m.group(1) not in SHAPES or m.group(2) not in SHAPES or m.group(3) not in LENGTHS:
        raise ValueError(f"{name!r} is not a cell: POLICY+CLASSMATE/LENGTH/NGPU with shapes {sorted(SHAPES)}, "
                         f"lengths {sorted(LENGTHS)}, 1 or 2 GPUs (e.g. 7b+1.5b/2k/2gpu)")
    return Cell(m.group(1), m.group(2), LENGTHS[m.group(3)], int(m.group(4)))


def params(shape: dict) -> int:
    """Parameters of a Llama-architecture model of ``shape`` (embeddings, attention, MLP, norms, LM head)."""
    h, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    head = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head
    attention = h * h * 2 + h * kv * 2
    per_layer = attention + 3 * h * inter + 2 * h
    embed = shape["vocab_size"] * h
    return embed * (1 if shape.get("tie_word_embeddings", True) else 2) + layers * per_layer + h


def kv_bytes_per_token(shape: dict) -> int:
    """bf16 key and value of every layer for one token."""
    head = shape["hidden_size"] // shape["num_attention_heads"]
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head * 2


@dataclass
class Plan:
    zero: int
    policy_util: float
    classmate_util: float
    ds_sleep: bool
    adam_offload: bool
    train_micro: int
    rollout_micro: int
    estimate_gib: dict[str, float]

    def flags(self) -> list[str]:
        out = ["--ds.zero_stage", str(self.zero), "--vllm.gpu_memory_utilization", f"{self.policy_util:.2f}",
               "--classmate.gpu_memory_utilization", f"{self.classmate_util:.2f}",
               "--train.micro_batch_size", str(self.train_micro), "--rollout.micro_batch_size", str(self.rollout_micro)]
        return out + (["--ds.enable_sleep"] if self.ds_sleep else []) + (["--ds.adam_offload"] if self.adam_offload
                                                                          else [])

    def summary(self) -> str:
        """The flags that made the cell fit, as the table shows them."""
        parts = [f"ZeRO-{self.zero}", f"micro {self.train_micro}/{self.rollout_micro}",
                 f"engines {self.policy_util:.2f}+{self.classmate_util:.2f}"]
        parts += ["ds sleep"] if self.ds_sleep else []
        parts += ["Adam offload"] if self.adam_offload else []
        return ", ".join(parts + ["grad ckpt", "chunked log-probs"])


def _pow2_at_most(x: float) -> int:
    n = 1
    while n * 2 <= x:
        n *= 2
    return n


def plan(cell: Cell, gpu_gib: float, shapes: dict[str, dict] | None = None) -> Plan:
    """The flags of ``cell`` on GPUs of ``gpu_gib`` GiB, from an estimate of what each GPU holds (module docstring).

    Per GPU: the training state (bf16 weights and gradients, fp32 master weights and Adam moments: 16 bytes a
    parameter, ZeRO-2 splitting all but the bf16 weights over the GPUs, ZeRO-3 all of it), the bf16 reference model
    (split under ZeRO-3), activations of one micro-batch with gradient checkpointing, and each engine's bf16 weights
    plus the KV cache of its share of the batch (with 50% headroom) and ~3 GiB of CUDA graphs and workspace."""
    shapes = shapes or SHAPES
    pol, cm = shapes[cell.policy], shapes[cell.classmate]
    p, c, g = params(pol), params(cm), cell.gpus
    zero = 3 if g > 1 else 2
    seq = PROMPT_TOKENS + cell.response
    per_gpu_seqs = cell.prompts * SAMPLES // g
    train_micro = min(per_gpu_seqs, _pow2_at_most(max(1, 8192 // seq)))
    rollout_micro = min(per_gpu_seqs, 2 * train_micro)
    state = 16 * p / g if zero == 3 else 2 * p + 14 * p / g
    ref = 2 * p / g if zero == 3 else 2 * p
    h, layers = pol["hidden_size"], pol["num_hidden_layers"]
    activations = train_micro * seq * h * 2 * layers + train_micro * seq * h * 2 * 24 + 2 * GIB
    engine_p = 2 * p + 1.5 * kv_bytes_per_token(pol) * per_gpu_seqs * seq + 3 * GIB
    engine_c = 2 * c + 1.5 * kv_bytes_per_token(cm) * per_gpu_seqs * (seq + 256) + 3 * GIB
    total = gpu_gib * GIB
    policy_util = min(0.6, max(0.1, round(engine_p / total + 0.005, 2)))
    classmate_util = min(0.35, max(0.05, round(engine_c / total + 0.005, 2)))
    sleeping_engines = 2 * GIB  # CUDA contexts and what a sleeping engine keeps
    adam_offload = state + ref + activations + sleeping_engines > 0.9 * total
    if adam_offload:  # fp32 master weights and Adam moments on the CPU: bf16 weights and gradients stay
        state = 4 * p / g if zero == 3 else 2 * p + 2 * p / g
    rollout = state + ref + (policy_util + classmate_util) * total
    ds_sleep = rollout > 0.95 * total
    return Plan(zero, policy_util, classmate_util, ds_sleep, adam_offload, train_micro, rollout_micro,
                {k: round(v / GIB, 1) for k, v in (("training_state", state), ("reference", ref),
                                                    ("activations", activations), ("policy_engine", engine_p),
                                                    ("classmate_engine", engine_c))})


def launcher_argv(cell: Cell, p: Plan, policy: str, classmate: str, data: str, root: str, engine: str,
                  steps: int, classmate_tokens: int, eager: bool) -> list[str]:
    batch = cell.prompts * SAMPLES
    g = str(cell.gpus)
    argv = [
        "--actor.model_name_or_path", policy, "--actor.num_nodes", "1", "--actor.num_gpus_per_node", g,
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", g, "--vllm.num_engines", g,
        "--vllm.sync_backend", "nccl" if engine == "vllm" else "gloo",
        "--data.prompt_dataset", data, "--data.input_key", "prompt", "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", str(cell.response + PROMPT_TOKENS),
        "--data.max_samples", str(cell.prompts * steps),
        "--rollout.max_new_tokens", str(cell.response), "--rollout.batch_size", str(cell.prompts),
        "--rollout.n_samples_per_prompt", str(SAMPLES), "--rollout.temperature", "1.0",
        "--train.batch_size", str(batch), "--train.max_epochs", "1", "--train.num_episodes", "1", "--train.seed", "42",
        "--train.colocate_all", "--vllm.enable_sleep",
        "--algo.kl.init_coef", "0.001", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
        "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa",
        "--actor.gradient_checkpointing_enable", "--actor.adam.lr", "1e-6", "--actor.lr_warmup_ratio", "0",
        "--ckpt.path", os.path.join(root, "ckpt"), "--ckpt.output_dir", os.path.join(root, "hf_final"),
        "--logger.tensorboard_dir", os.path.join(root, "tb"),
        "--engine.backend", engine,
        "--classmate.model_name_or_path", classmate, "--classmate.estimator", "gdpo",
        "--classmate.max_new_tokens", str(classmate_tokens), "--classmate.temperature", "1.0",
        "--classmate.placement", "share", "--classmate.num_engines", g,
    ]
    if engine == "vllm" and eager:
        argv.append("--vllm.enforce_eager")
    return argv + p.flags()


# what running out of memory looks like in a launcher log (torch, cuBLAS, vLLM's start-up checks, Ray's OOM killer)
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED|No available memory for the cache "
                 r"blocks|Free memory on device .{0,80}is less than desired|out of memory|OOM killer|"
                 r"Insufficient memory")
# the stage a failure happened in, from the frames and messages before it (first match wins: most specific first)
STAGES = [
    ("engine start", re.compile(r"cache blocks|determine_available_memory|initialize_kv_cache|EngineCore failed|"
                                r"gpu_memory_utilization|Free memory on device|init_engine|LLMRayActor.__init__")),
    ("model load", re.compile(r"from_pretrained|init_model_from_pretrained|deepspeed\.initialize|_configure_optimizer|"
                              r"load_state_dict|\bprepare\(|ModelActor\.__init__")),
    ("actor update", re.compile(r"ppo_train|training_step|backward|optimizer_step|\bfit\b|\.step\(")),
    ("actor/ref forwards", re.compile(r"make_experience|forward|compute_ref|log_probs|logprobs")),
    ("rollout", re.compile(r"generate|wake_up|sampling")),
    ("weight sync", re.compile(r"broadcast_to_vllm|update_weight|_broadcast")),
]


# Ray's memory monitor killing a worker for the node's host memory, as Ray words it and as the launcher's one line
# does (integration/launch/actor_died.py); the killed task names the stage
HOST_KILL = re.compile(r"killed due to the node running low on memory.*?task name=([\w.]+)|"
                       r"^error: Ray's memory monitor killed ([\w.]+)", re.MULTILINE)
RAY_STARTED = re.compile(r"Started a local Ray instance|Connected to Ray cluster")


def failure(log_text: str) -> tuple[str, str | None]:
    """``(outcome, stage)`` of a failed run from its log: ``host OOM`` (Ray's memory monitor killed a worker: the
    stage is the killed task's), ``refused`` (the launcher's one ``error:`` line before Ray started: its preflight),
    ``OOM`` with the stage that ran out of GPU memory, ``timeout`` (the watchdog's line) or ``error`` (the stage where
    known)."""
    lines = log_text.splitlines()
    killed = HOST_KILL.search(log_text)
    if killed:
        task = killed.group(1) or killed.group(2)
        return "host OOM", next((stage for stage, pattern in STAGES if pattern.search(task)), None)
    refusal = next((i for i, line in enumerate(lines) if line.startswith("error: ")), None)
    if refusal is not None and not RAY_STARTED.search("\n".join(lines[:refusal])) and "Traceback" not in log_text:
        return "refused", None
    hit = next((i for i, line in enumerate(lines) if OOM.search(line)), None)
    if hit is None:
        if "[watchdog] killed" in log_text:
            return "timeout", None
        hit = next((i for i, line in enumerate(lines) if "Traceback" in line or "Error" in line), None)
        if hit is None:
            return "error", None
        window = lines[hit:hit + 80]
        outcome = "error"
    else:
        window = lines[max(0, hit - 80):hit + 1]
        outcome = "OOM"
    text = "\n".join(window)
    return outcome, next((stage for stage, pattern in STAGES if pattern.search(text)), None)


def visible_gpus() -> set[int] | None:
    """The GPUs of this run (``CUDA_VISIBLE_DEVICES`` as indices, which ``nvidia-smi`` also numbers by), or None for
    all: runs started side by side on one host, each on its own GPUs, read only their own memory."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or not value.strip():
        return None
    try:
        return {int(x) for x in value.split(",") if x.strip()}
    except ValueError:  # GPU UUIDs: nvidia-smi's index cannot be matched; read every GPU
        return None


class MemorySampler(threading.Thread):
    """The peak of ``nvidia-smi``'s memory.used per GPU (GiB) while it runs; empty without nvidia-smi."""

    def __init__(self, period: float = 0.5):
        super().__init__(daemon=True)
        self.period, self.peak, self._halt = period, {}, threading.Event()

    @staticmethod
    def used() -> dict[int, float]:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        used = {}
        mine = visible_gpus()
        for line in out.strip().splitlines():
            index, mib = (x.strip() for x in line.split(","))
            if mine is None or int(index) in mine:
                used[int(index)] = int(mib) / 1024
        return used

    def run(self) -> None:
        while not self._halt.is_set():
            for index, gib in self.used().items():
                self.peak[index] = max(self.peak.get(index, 0.0), gib)
            self._halt.wait(self.period)

    def stop(self) -> dict[int, float]:
        self._halt.set()
        self.join(timeout=15)
        return {i: round(v, 1) for i, v in sorted(self.peak.items())}


def total_gpu_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return int(out[0]) / 1024 if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


class StepLines:
    """The launcher's step lines as its log grows (read from where the last call stopped): when each step was logged
    (seconds after the start); called by the watchdog, it asks for the stop once ``steps`` steps are logged."""

    def __init__(self, log_path: str, steps: int):
        self.log_path, self.steps, self.started = log_path, steps, time.time()
        self.at: dict[int, float] = {}
        self._offset, self._rest = 0, b""

    def __call__(self) -> str | None:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return None
        self._offset += len(chunk)
        *complete, self._rest = (self._rest + chunk).split(b"\n")
        for line in complete:
            parsed = parse_step_line(line.decode(errors="replace"))
            if parsed:
                self.at.setdefault(parsed[0], round(time.time() - self.started, 1))
        return f"step {self.steps} was logged" if len(self.at) >= self.steps else None


def run_until_steps(argv: list[str], log_path: str, steps: int, timeout: float, quiet: float = 600.0) -> dict:
    """The launcher under the watchdog until it has logged ``steps`` steps (then its session is stopped: the final
    save is not what is measured), it exits, it prints nothing for ``quiet`` s or ``timeout`` s pass. Returns the
    exit (0 when the steps were all logged), the watchdog's line and when each step was logged."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    lines = StepLines(log_path, steps)
    code = run_watched([sys.executable, "-m", "openrlhf_classmate.cli.train_ppo_ray", *argv], log_path, env=env,
                       quiet=quiet, timeout=timeout, until=lines)
    with open(log_path, errors="replace") as f:
        stopped = next((line[len("[watchdog] "):].strip() for line in reversed(f.readlines())
                        if line.startswith("[watchdog] ")), None)
    return {"exit": code, "stopped": stopped, "wall_s": round(time.time() - lines.started, 1),
            "step_logged_at_s": lines.at}


def wait_for_free_gpus(limit_s: float = 90.0, below_gib: float = 2.0) -> dict[int, float]:
    """Wait until every GPU of this run is back below ``below_gib`` of memory (the stopped run's processes gone); after
    half the time, ``ray stop --force`` for whatever Ray left behind (not when ``CUDA_VISIBLE_DEVICES`` names this
    run's GPUs: runs side by side on one host). Returns the memory used at the end."""
    t0 = time.time()
    stopped = False
    while True:
        used = MemorySampler.used()
        if all(v < below_gib for v in used.values()) or time.time() - t0 > limit_s:
            return {i: round(v, 1) for i, v in used.items()}
        # with CUDA_VISIBLE_DEVICES other runs may share the host: `ray stop` would stop their clusters too
        if not stopped and time.time() - t0 > limit_s / 2 and visible_gpus() is None:
            # Ray's own module, not the `ray` command: pip --target installs (the GPU machine's) have no scripts
            subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True,
                           timeout=60)
            stopped = True
        time.sleep(2)


def estimate_s(cell: Cell, steps: int, shapes: dict[str, dict]) -> float:
    """Wall time of a cell for the budget (start-up, model loads, decoding every response to its end, training)."""
    billions = params(shapes[cell.policy]) / 1e9
    start = 150 + 25 * billions
    decode = cell.response * (0.006 + 0.002 * billions)
    train = 6 * params(shapes[cell.policy]) * cell.prompts * SAMPLES * (cell.response + PROMPT_TOKENS) * 1.3 / (
        250e12 * cell.gpus)
    return start + steps * (decode + train + 20)


def cell_row(cell: Cell, p: Plan) -> dict:
    return {"cell": cell.name, "policy": cell.policy, "classmate": cell.classmate, "response": cell.response,
            "gpus": cell.gpus, "prompts": cell.prompts, "samples": SAMPLES, "flags": p.summary(),
            "plan": p.estimate_gib}


# vLLM's line as an engine goes to sleep: what the rest of the GPU holds then (the actor/ref states, the other engine)
IN_USE = re.compile(r"Sleep mode freed [\d.]+ GiB memory, ([\d.]+) GiB memory is still in use")


def read_log(cell: Cell, text: str, steps: int) -> dict:
    """What a launcher log says of a cell: ``runs`` with the last step's seconds, tokens/s per GPU and parts when it
    logged ``steps`` steps, else the failure (:func:`failure`), and the most memory vLLM saw in use on a GPU as an
    engine went to sleep (``vllm_in_use_gib``: a lower bound of the peak, from the log alone)."""
    logged = dict(parsed for parsed in map(parse_step_line, text.splitlines()) if parsed)
    in_use = [float(v) for v in IN_USE.findall(text)]
    row: dict = {"vllm_in_use_gib": max(in_use) if in_use else None}
    if len(logged) < steps:
        outcome, stage = failure(text)
        if outcome == "refused":  # the launcher's own line says why (host memory, the layout, ...)
            row["reason"] = next(line for line in text.splitlines() if line.startswith("error: "))
        return {**row, "outcome": outcome, "stage": stage, "steps_logged": sorted(logged),
                "log_tail": "\n".join(text.splitlines()[-60:])}
    last = logged[max(logged)]
    step_s = last.get("timing/step_total")
    tokens = (last.get("response_length") or cell.response) * cell.prompts * SAMPLES
    return {**row, "outcome": "runs", "stage": None, "step_s": step_s,
            "step_s_all": [s.get("timing/step_total") for _, s in sorted(logged.items())],
            "tokens_per_s_per_gpu": round(tokens / step_s / cell.gpus) if step_s else None,
            "response_length": last.get("response_length"),
            # the launcher's start-up breakdown at step 1 (integration/startup.py)
            "first_step_s": logged[min(logged)].get("startup/first_step_s"),
            "startup_s": {k.removeprefix("startup/"): v for k, v in logged[min(logged)].items()
                          if k.startswith("startup/")},
            "parts": {k: last.get(k) for k in ("timing/generation", "timing/make_experience", "timing/ppo_train",
                                               "timing/broadcast", "classmate/stage_time",
                                               "classmate/stage_overlap_time")}}


def measure(cell: Cell, a, models: dict[str, str], data: str, gpu_gib: float, timeout: float) -> dict:
    shapes = {k: TINY for k in SHAPES} if a.tiny else SHAPES
    p = plan(cell, gpu_gib, shapes)
    root = os.path.join(a.work, cell.name.replace("/", "_"))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    argv = launcher_argv(cell, p, models[cell.policy], models[cell.classmate], data, root, a.engine, a.steps,
                         a.classmate_tokens, a.enforce_eager)
    row = {**cell_row(cell, p), "argv": argv}
    sampler = MemorySampler()
    sampler.start()
    log = os.path.join(root, "launcher.log")
    try:
        result = run_until_steps(argv, log, a.steps, timeout)
    finally:
        row["peak_gib"] = sampler.stop()
    row.update(exit=result["exit"], wall_s=result["wall_s"], stopped=result["stopped"],
               step_logged_at_s=result["step_logged_at_s"])
    with open(log, errors="replace") as f:
        row.update(read_log(cell, f.read(), a.steps))
    if row["outcome"] == "runs" and row.get("first_step_s") is None:  # a launcher without the start-up metrics
        row["first_step_s"] = result["step_logged_at_s"].get(min(result["step_logged_at_s"]))
    return row


def clean_up() -> dict:
    """Wait for the GPUs before the next cell; called after the cell's row is on disk. A cleanup that fails must not
    cost the row (it did once: the `ray` command is not on PATH where Ray is installed with pip --target), nor may
    its wait (a device call that copied the results while a cell waited here found no row)."""
    try:
        return {"after_gib": wait_for_free_gpus() if shutil.which("nvidia-smi") else {}}
    except Exception as e:  # noqa: BLE001
        return {"cleanup_error": repr(e)[-500:]}


def save(result: dict, out: str) -> None:
    """``capacity.json`` in ``out``, replaced whole (a reader never sees half a file)."""
    with open(os.path.join(out, "capacity.json.tmp"), "w") as f:
        json.dump(result, f, indent=1)
    os.replace(os.path.join(out, "capacity.json.tmp"), os.path.join(out, "capacity.json"))


def rows_from_logs(pairs: list[str], steps: int, gpu_gib: float) -> list[dict]:
    """Rows rebuilt from kept launcher logs (``CELL=PATH``, plain or gzipped) for cells whose row was lost: the
    same reading as :func:`measure`, without the peak memory (only the sampler saw it) or the first-step time."""
    import gzip

    rows = []
    for pair in pairs:
        name, _, path = pair.partition("=")
        cell = parse_cell(name)
        with (gzip.open(path, "rt", errors="replace") if path.endswith(".gz") else open(path, errors="replace")) as f:
            text = f.read()
        rows.append({**cell_row(cell, plan(cell, gpu_gib)), **read_log(cell, text, steps), "from_log": path,
                     "peak_gib": {}})
    return rows


def print_table(result: dict) -> None:
    print(f"\nwhat fits where, {result['device']}; {PROMPTS_PER_GPU} prompts x {SAMPLES} samples per GPU, "
          f"classmate {result['classmate_tokens']} tokens, {result['steps']} steps (the last timed)")
    print("| policy | classmate | response | GPUs | outcome | peak GiB per GPU | vLLM saw in use, GiB | step s | "
          "tokens/s per GPU | first step s | flags |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["cells"]:
        if "skipped" in r:
            print(f"| {r['cell']} | | | | not run: {r['skipped']} | | | | | | |")
            continue
        outcome = r["outcome"] + (f" ({r['stage']})" if r.get("stage") else "")
        # the cell's own GPUs: the most used ones (a 1-GPU cell on a 2-GPU machine leaves the other idle)
        peak = " / ".join(f"{v:.0f}" for v in sorted(r.get("peak_gib", {}).values(), reverse=True)[:r["gpus"]]) or "-"
        step = f"{r['step_s']:.1f}" if r.get("step_s") else "-"
        tps = f"{r['tokens_per_s_per_gpu']:,}" if r.get("tokens_per_s_per_gpu") else "-"
        first = f"{r['first_step_s']:.0f}" if r.get("first_step_s") else "-"
        seen = f"{r['vllm_in_use_gib']:.0f}" if r.get("vllm_in_use_gib") else "-"
        print(f"| {r['policy']} | {r['classmate']} | {r['response'] // 1024}k | {r['gpus']} | {outcome} | {peak} | "
              f"{seen} | {step} | {tps} | {first} | {r['flags']} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default=",".join(ORDER),
                   help="comma-separated cells POLICY+CLASSMATE/LENGTH/NGPU (default: the grid's first cells, in "
                        "order; --list shows all)")
    p.add_argument("--list", action="store_true", help="print the grid and each cell's planned flags, run nothing")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--classmate-tokens", type=int, default=256)
    p.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (faster start, slower "
                   "decoding)")
    p.add_argument("--gpu-gib", type=float, default=None, help="memory per GPU for the plan (default: nvidia-smi's, "
                   "else 140)")
    p.add_argument("--tiny", action="store_true", help="tiny models of every shape (CPU check of the script path)")
    p.add_argument("--models", default=os.path.join(os.environ.get("WORK", "/tmp"), "capacity_models"))
    p.add_argument("--work", default=os.path.join(os.environ.get("WORK", "/tmp"), "capacity"))
    p.add_argument("--out", default=os.environ.get("OUT", "capacity_out"))
    p.add_argument("--budget-s", type=float, default=float("inf"), help="skip cells that would not end in time")
    p.add_argument("--fresh", action="store_true", help="measure again cells an earlier call measured")
    p.add_argument("--from-log", default=None, metavar="CELL=LOG[,CELL=LOG]",
                   help="rebuild the rows of these cells from kept launcher logs (.gz too) and print the table; "
                        "nothing runs (no peak memory: only a live run samples it)")
    p.add_argument("--device", default=None, help="the device named in --from-log's JSON")
    a = p.parse_args(argv)
    try:
        cells = [parse_cell(name.strip()) for name in a.cells.split(",") if name.strip()]
    except ValueError as e:
        p.error(str(e))
    if a.steps < 1:
        p.error("--steps must be at least 1")
    gpu_gib = a.gpu_gib or total_gpu_gib() or 140.0
    shapes = {k: TINY for k in SHAPES} if a.tiny else SHAPES
    if a.list:
        for name in GRID:
            cell = parse_cell(name)
            pl = plan(cell, gpu_gib, shapes)
            print(f"{name:<20} {params(shapes[cell.policy]) / 1e9:5.2f}B + {params(shapes[cell.classmate]) / 1e9:4.2f}B"
                  f"  ~{estimate_s(cell, a.steps, shapes):4.0f} s  {pl.summary()}  (estimate GiB {pl.estimate_gib})")
        return
    if a.from_log:
        try:
            rows = rows_from_logs(a.from_log.split(","), a.steps, gpu_gib)
        except (ValueError, OSError) as e:
            p.error(f"--from-log: {e}")
        result = {"device": a.device or "unknown", "gpu_gib": round(gpu_gib, 1), "engine": a.engine,
                  "steps": a.steps, "classmate_tokens": a.classmate_tokens, "eager": a.enforce_eager, "cells": rows}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "capacity.json"), "w") as f:
            json.dump(result, f, indent=1)
        print_table(result)
        return
    start = time.time()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    import torch

    device = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
              else "cpu")
    result = {"device": device, "gpu_gib": round(gpu_gib, 1), "engine": a.engine, "tiny": a.tiny, "steps": a.steps,
              "classmate_tokens": a.classmate_tokens, "eager": a.enforce_eager, "cells": []}
    data = build_data(os.path.join(a.work, "prompts.jsonl"), 64)
    models: dict[str, str] = {}
    gpus_here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for cell in cells:
        kept = os.path.join(a.work, cell.name.replace("/", "_") + ".result.json")
        left = a.budget_s - (time.time() - start)
        need = estimate_s(cell, a.steps, shapes)
        ran = False
        if os.path.isfile(kept) and not a.fresh:
            row = {**json.load(open(kept)), "from_earlier_call": True}
            print(f"{cell.name}: measured in an earlier call on this machine (--fresh to measure again)", flush=True)
        elif a.engine == "vllm" and 0 < gpus_here < cell.gpus:
            row = {"cell": cell.name, "skipped": f"needs {cell.gpus} GPUs, the device has {gpus_here}"}
        elif left < need:
            row = {"cell": cell.name, "skipped": f"{left:.0f} s left of --budget-s, about {need:.0f} s needed"}
        else:
            for name in (cell.policy, cell.classmate):
                if name not in models:
                    t0 = time.time()
                    models[name] = build_model(os.path.join(a.models, ("tiny_" if a.tiny else "") + name),
                                               shapes[name], seed=len(models))
                    print(f"model {name}: {models[name]} ({time.time() - t0:.0f} s)", flush=True)
            left = a.budget_s - (time.time() - start)
            print(f"===== {cell.name} (~{need:.0f} s; {left:.0f} s left)", flush=True)
            ran = True
            try:
                row = measure(cell, a, models, data, gpu_gib, timeout=min(left - 20, 3 * need + 300))
            except Exception as e:  # noqa: BLE001  (one broken cell must not cost the others' results)
                row = {"cell": cell.name, "outcome": "error", "error": repr(e)[-2000:], "flags": "", "gpus": cell.gpus,
                       "policy": cell.policy, "classmate": cell.classmate, "response": cell.response}
            if row.get("outcome") in ("runs", "OOM", "host OOM", "refused"):  # outcomes of the cell, not the call
                with open(kept, "w") as f:
                    json.dump(row, f, indent=1)
            print(f"{cell.name}: {row.get('outcome')} {row.get('stage') or ''} peak {row.get('peak_gib')} "
                  f"step {row.get('step_s')} s", flush=True)
        result["cells"].append(row)
        save(result, a.out)  # the row first, then the wait for the GPUs
        if ran:
            row.update(clean_up())
            save(result, a.out)
    print_table(result)


if __name__ == "__main__":
    main()

"""Host memory: what a run keeps in each node's RAM by its flags, checked against the node before Ray starts.

A 7.6B policy with ``--ds.adam_offload`` on one H200 node of 125.9 GiB got two minutes into its start-up, then Ray's
memory monitor killed the actor while DeepSpeed built its CPU optimizer (``bench/GPU_RESULTS.md`` section 12): 84-89
GiB in the actor, 26-28 GiB in the sleeping policy engine. The launcher can see that coming from the parameter
counts (the safetensors headers):

* ``--ds.adam_offload``: DeepSpeed's CPU optimizer holds fp32 master weights, both Adam moments and fp32 gradients,
  :data:`ADAM_OFFLOAD_BYTES` (16) bytes a parameter, split over the actor's ranks (and the critic's, where a run has
  one: upstream gives it the same DeepSpeed options);
* ``--ds.enable_sleep`` (without Adam offload): upstream's ``offload_deepspeed_states`` moves the Adam moments, the
  fp32 master weights and the bf16 gradients to the CPU while the engines generate, :data:`DS_SLEEP_BYTES` (14);
* ``--ref.offload`` under ZeRO-3 (with ``--algo.kl.init_coef`` > 0: upstream's only reference): its bf16 weights, 2
  bytes a parameter;
* ``--vllm.enable_sleep``: each sleeping policy engine keeps its weights in host memory (vLLM's sleep level 1, which
  upstream uses); so does each classmate engine that sleeps (``--classmate.placement colocate`` or
  ``--classmate.enable_sleep``).

Each part is spread evenly over the nodes of its group. The sum is a floor: the processes' own memory (CUDA
contexts, libraries, pinned buffers: ~12 GiB more in a 7B engine) comes on top. A floor above what the node allows
(Ray kills a worker once the node uses ``RAY_memory_usage_threshold``, 0.95, of its memory; without Ray's monitor,
all of it) is refused with one line. Where the run joins a Ray cluster (``RAY_ADDRESS``) the launcher's node may not
be a training node, so the line is a warning there.
"""

from __future__ import annotations

import json
import math
import os
import struct
from types import SimpleNamespace

from openrlhf_classmate.integration.classmate_config import classmate_engines_sleep
from openrlhf_classmate.integration.rollout.engine_memory import safetensors_files

GIB = 2**30  # what Ray's memory monitor prints as "GB", and free -g
ADAM_OFFLOAD_BYTES = 16  # fp32 master weights 4 + Adam moments 4 + 4 + fp32 gradients 4 (DeepSpeed's CPU optimizer)
DS_SLEEP_BYTES = 14  # offload_deepspeed_states: Adam moments 8, fp32 master weights 4, bf16 gradients 2
BF16_BYTES = 2
RAY_THRESHOLD = 0.95  # Ray's default RAY_memory_usage_threshold
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header is JSON of names and shapes: kilobytes, never this


def _tensor_elements(name: str) -> int | None:
    """Elements of every tensor of one safetensors file, from its header (8 bytes of length, then JSON); None for a
    file that is not one (a Git LFS pointer, a truncated download)."""
    try:
        with open(name, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > min(MAX_HEADER_BYTES, os.path.getsize(name) - 8):
                return None
            header = json.loads(f.read(size))
        return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")
    except Exception:  # noqa: BLE001  (anything unreadable: no figure, the check is skipped for this model)
        return None


def parameter_count(path: str) -> int | None:
    """Parameters of a local model folder, from its safetensors headers (no tensor is read); None for a hub id, a
    folder without safetensors files or one whose files cannot be read as safetensors."""
    folder = os.path.expanduser(path)
    if not os.path.isdir(folder):
        return None
    files = safetensors_files(folder)
    counts = [_tensor_elements(name) for name in files]
    if not counts or any(c is None for c in counts):
        return None
    return sum(counts)


def node_memory_bytes() -> int | None:
    """This node's memory as a process here can use it: MemTotal, or a smaller cgroup limit (a container)."""
    try:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


def allowed_bytes(total: int, env: dict[str, str] | None = None) -> tuple[int, str]:
    """What a run may use of ``total`` before something kills it, and by whose rule."""
    env = os.environ if env is None else env
    if env.get("RAY_memory_monitor_refresh_ms", "").strip() == "0":
        return total, "Ray's memory monitor is off (RAY_memory_monitor_refresh_ms=0)"
    try:
        threshold = float(env.get("RAY_memory_usage_threshold", RAY_THRESHOLD))
    except ValueError:
        threshold = RAY_THRESHOLD
    return int(threshold * total), f"Ray kills a worker above {threshold:g} of it (RAY_memory_usage_threshold)"


def host_parts(args: SimpleNamespace, params: dict[str, int]) -> list[tuple[str, float]]:
    """(what, bytes on one node) of every part of :mod:`host_memory`'s list that the flags turn on; ``params`` maps
    each model path to its parameter count (a path missing from it counts nothing)."""
    parts = []
    policy = params.get(args.actor.model_name_or_path, 0)
    actor_nodes = max(1, args.actor.num_nodes)
    if args.ds.adam_offload:
        parts.append(("--ds.adam_offload: Adam's fp32 master weights, moments and gradients",
                      ADAM_OFFLOAD_BYTES * policy / actor_nodes))
    elif getattr(args.ds, "enable_sleep", False):
        parts.append(("--ds.enable_sleep: the actor's optimizer state while the engines generate",
                      DS_SLEEP_BYTES * policy / actor_nodes))
    critic = params.get(args.critic.model_name_or_path, 0) if args.critic.model_name_or_path else 0
    critic_nodes = max(1, args.critic.num_nodes)
    if critic and args.ds.adam_offload:  # upstream gives the critic the actor's DeepSpeed options
        parts.append(("--ds.adam_offload: the critic's Adam state", ADAM_OFFLOAD_BYTES * critic / critic_nodes))
    elif critic and getattr(args.ds, "enable_sleep", False):
        parts.append(("--ds.enable_sleep: the critic's optimizer state", DS_SLEEP_BYTES * critic / critic_nodes))
    # upstream builds the reference only for a KL term, and offloads its parameters only under ZeRO-3 (its eval
    # config is stage 0 otherwise, where DeepSpeed ignores the parameter offload)
    if args.ref.offload and args.algo.kl.init_coef > 0 and args.ds.zero_stage == 3:
        parts.append(("--ref.offload: the reference's weights", BF16_BYTES * policy / max(1, args.ref.num_nodes)))
    if args.vllm.enable_sleep and args.vllm.num_engines:
        parts.append((f"--vllm.enable_sleep: {args.vllm.num_engines} sleeping policy engine(s)' weights",
                      BF16_BYTES * policy * args.vllm.num_engines / actor_nodes))
    cfg = args.classmate
    if cfg.model_name_or_path and classmate_engines_sleep(args) and cfg.num_engines:
        weights = sum(params.get(p, 0) for p in cfg.model_name_or_path)
        parts.append((f"sleeping classmate engines' weights ({cfg.num_engines} per classmate)",
                      BF16_BYTES * weights * cfg.num_engines / actor_nodes))
    return [(what, b) for what, b in parts if b > 0]


def host_memory_problem(args: SimpleNamespace, params: dict[str, int], total: int | None,
                        env: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(refusal, note): the refusal where the floor of :func:`host_parts` exceeds what the node allows; the note says
    the figures either way (None without parts or without a readable node size)."""
    parts = host_parts(args, params)
    if not parts or total is None:
        return None, None
    need = sum(b for _, b in parts)
    allowed, rule = allowed_bytes(total, env)
    listed = " + ".join(f"{what} {b / GIB:.1f} GiB" for what, b in parts)
    if need <= allowed:
        return None, f"host memory: {listed} = {need / GIB:.1f} GiB of this node's {total / GIB:.1f} GiB ({rule})"
    return (f"host memory: {listed} = {need / GIB:.1f} GiB on each node, above the {allowed / GIB:.1f} GiB this node "
            f"allows of its {total / GIB:.1f} GiB ({rule}): the run would be killed while it loads its models; spread "
            "the actor over more GPUs with --ds.zero_stage 3 (its optimizer state on the GPUs, without "
            "--ds.adam_offload), or use nodes with more memory"), None


def check_host_memory(args: SimpleNamespace, lines: list[str], warnings: list[str],
                      total: int | None = None) -> str | None:
    """The preflight's check: the refusal line (None: the run may start); the note goes to ``lines`` (``--check``'s
    report), and to ``warnings`` instead of a refusal where the run joins a Ray cluster (``RAY_ADDRESS``)."""
    paths = [args.actor.model_name_or_path, *(args.classmate.model_name_or_path or [])]
    paths += [args.critic.model_name_or_path] if args.critic.model_name_or_path else []
    params = {p: n for p in paths if (n := parameter_count(p)) is not None}
    problem, note = host_memory_problem(args, params, node_memory_bytes() if total is None else total)
    if note:
        lines.append(note)
    if problem and os.environ.get("RAY_ADDRESS"):
        warnings.append(f"{problem} (RAY_ADDRESS is set: the launcher's node may not be a training node)")
        return None
    return problem

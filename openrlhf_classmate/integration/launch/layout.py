"""Launch-time layout checks: the batch arithmetic and the GPUs a layout asks Ray for, before Ray starts.

Two kinds of run used to start, hold Ray and the engines for minutes and then fail or hang:

* **batch arithmetic** that DeepSpeed asserts on (``--train.batch_size`` not a multiple of the micro-batch times the
  data-parallel ranks: 0 gradient-accumulation steps on 16 GPUs with the shipped configs) or that upstream silently
  changes (a rollout that is not a whole number of optimizer steps: the partial step's gradient is carried into the
  next rollout, scaled as a whole step; rollout micro-batches that cannot be shared evenly by the actor ranks, which
  then train on different numbers of samples and wait for each other). :func:`batch_problem` states every rule,
  :func:`check_batches` refuses in one line naming values that work (each one checked by the same rules);
* **layouts Ray cannot place**: more whole GPUs than the cluster has (Ray waits for the placement group forever), or
  groups that upstream asserts on after Ray has started (``--train.colocate_all`` with another number of policy
  engine GPUs than actor GPUs). :func:`layout_of` counts the GPUs each group asks for as upstream's ``train()`` and
  the launcher's ``EngineFactory`` create them; :func:`check_layout` compares the total with
  :func:`available_gpus` (the Ray cluster when ``RAY_ADDRESS`` names one, ``OPENRLHF_CLASSMATE_GPUS`` that
  ``train_scripts`` export, else this node's CUDA devices x ``--actor.num_nodes``; unknown on a CPU machine, where
  the launcher runs on Ray's logical GPUs and nothing is counted).

``--classmate.placement auto`` (the default) is resolved here too (:func:`resolve_placement`, from
``resolve_classmate_args``): see ``classmate_config.AUTO_RULE`` and :func:`choose_placement`.

Importing this module imports only the standard library (``train_scripts`` run :func:`fit_micro_batches` through
``script_helpers`` before any training stack); torch and Ray are imported where the GPUs are counted.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

GPUS_ENV = "OPENRLHF_CLASSMATE_GPUS"
"""GPUs the run may use, all nodes together; ``train_scripts/lib.sh`` exports NNODES x GPUS_PER_NODE."""

SERVER_MEMORY_ENV = "OPENRLHF_CLASSMATE_SERVER_GPU_MEMORY"
"""The fraction of each training GPU held by model servers started on those GPUs (``train_scripts`` export the sum
of their ``--gpu-memory-utilization``: a judge, a verifier); ``auto`` counts it beside the two engine groups."""

FLAGS = {"rollout_batch": "--rollout.batch_size", "samples": "--rollout.n_samples_per_prompt",
         "rollout_micro": "--rollout.micro_batch_size", "train_batch": "--train.batch_size",
         "train_micro": "--train.micro_batch_size", "ring": "--ds.ring_attn_size",
         "tp": "--ds.tensor_parallel_size", "dynamic": "--train.dynamic_batch_enable"}
"""Each :class:`Batches` field's launcher flag (``actor_gpus`` is ``--actor.num_nodes x --actor.num_gpus_per_node``)."""

UPSTREAM_DEFAULTS = {"rollout_batch": 1024, "samples": 1, "rollout_micro": 1, "train_batch": 128, "train_micro": 1,
                     "ring": 1, "tp": 1, "dynamic": False}
"""OpenRLHF 0.11.2's defaults of those flags (tests compare them with its parser), for configs that leave one out."""


def _fail(message: str) -> None:
    from openrlhf_classmate.integration.launch.preflight_types import PreflightError

    raise PreflightError(message)


# ── batch arithmetic ─────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Batches:
    """The numbers upstream's batch arithmetic reads."""

    rollout_batch: int  # prompts per rollout
    samples: int  # responses per prompt
    rollout_micro: int  # samples per experience (forward passes of the old log-probs / reference)
    train_batch: int  # samples per optimizer step, all ranks together
    train_micro: int  # samples per forward/backward on one GPU
    actor_gpus: int
    ring: int = 1
    tp: int = 1
    dynamic: bool = False

    @property
    def per_rollout(self) -> int:
        return self.rollout_batch * self.samples

    @property
    def dp(self) -> int:
        return self.actor_gpus // (self.ring * self.tp)


def batches_of(args: SimpleNamespace) -> Batches:
    return Batches(rollout_batch=args.rollout.batch_size, samples=args.rollout.n_samples_per_prompt,
                   rollout_micro=args.rollout.micro_batch_size, train_batch=args.train.batch_size,
                   train_micro=args.train.micro_batch_size,
                   actor_gpus=args.actor.num_nodes * args.actor.num_gpus_per_node, ring=args.ds.ring_attn_size,
                   tp=args.ds.tensor_parallel_size, dynamic=bool(args.train.dynamic_batch_enable))


def batch_problem(b: Batches) -> str | None:
    """What upstream (OpenRLHF 0.11.2) or DeepSpeed would reject or silently change in ``b``, or None.

    Per rollout, upstream cuts the ``per_rollout`` samples into experiences of ``rollout_micro`` samples and hands
    each data-parallel rank ``ceil(experiences / dp)`` of them (``RayActorGroup.async_run_method_batch``); each rank
    trains on its samples in micro-batches of ``train_micro`` (the rest dropped, ``drop_last``) and DeepSpeed steps
    the optimizer every ``train_batch / (train_micro x dp)`` micro-batches (its config asserts that this is a whole
    number >= 1); the loss of each optimizer step is normalised over that step's micro-batches
    (``iter_grad_accum_global_norm``). With ``dynamic`` batching the ranks take ``train_batch // dp`` samples per
    optimizer step and ``per_rollout // train_batch`` steps, dropping the rest."""
    per = b.ring * b.tp
    if b.actor_gpus % per:
        return (f"the {b.actor_gpus} actor GPUs (--actor.num_nodes x --actor.num_gpus_per_node) are not a multiple of "
                f"--ds.ring_attn_size {b.ring} x --ds.tensor_parallel_size {b.tp} = {per}: DeepSpeed's device mesh "
                "needs whole groups of them")
    dp = b.dp
    ranks = f"{dp} actor GPU{'s' if dp != 1 else ''}" + (" (data-parallel ranks)" if per > 1 else "")
    total = b.per_rollout
    if b.dynamic:
        if b.train_batch % dp:
            return (f"--train.batch_size {b.train_batch} is not a multiple of the {ranks}: with "
                    f"--train.dynamic_batch_enable each rank takes {b.train_batch} // {dp} = {b.train_batch // dp} "
                    "samples per optimizer step and the rest are dropped")
    else:
        step = b.train_micro * dp
        if b.train_batch % step:
            return (f"--train.batch_size {b.train_batch} is not a multiple of --train.micro_batch_size "
                    f"{b.train_micro} x {ranks} = {step}: DeepSpeed would take {b.train_batch} // {step} = "
                    f"{b.train_batch // step} gradient-accumulation step(s) and assert (after Ray and the engines have "
                    "started)")
    if total % b.train_batch:
        what = (f"fewer than --train.batch_size {b.train_batch}" if total < b.train_batch else
                f"not a multiple of --train.batch_size {b.train_batch}")
        rest = ("dropped" if b.dynamic else "a partial optimizer step whose gradient DeepSpeed carries into the next "
                "rollout, scaled as a whole step")
        return (f"--rollout.batch_size {b.rollout_batch} x --rollout.n_samples_per_prompt {b.samples} = {total} "
                f"samples per rollout is {what}: upstream trains a rollout in whole optimizer steps, and the "
                f"{total % b.train_batch} samples left over would be {rest}")
    if not b.dynamic:
        shares = rank_samples(total, b.rollout_micro, dp)
        if min(shares) != max(shares) or not shares[0]:
            return (f"the {total} samples of a rollout (--rollout.batch_size {b.rollout_batch} x "
                    f"--rollout.n_samples_per_prompt {b.samples}) in experiences of --rollout.micro_batch_size "
                    f"{b.rollout_micro} cannot be shared evenly by the {ranks}: upstream's split gives them "
                    f"{min(shares)} to {max(shares)} samples each, so they would train on different numbers of "
                    "micro-batches and wait for each other forever")
    return None


def rank_samples(total: int, micro: int, ranks: int) -> list[int]:
    """The samples each data-parallel rank trains on, as upstream splits a rollout: experiences of ``micro`` samples
    (the last one shorter), ``ceil(experiences / ranks)`` consecutive experiences per rank (the last ranks fewer, or
    none)."""
    sizes = [min(micro, total - start) for start in range(0, total, micro)]
    chunk = -(-len(sizes) // ranks)
    return [sum(sizes[i * chunk:(i + 1) * chunk]) for i in range(ranks)]


def _nearest(values: Iterable[int], target: int) -> list[int]:
    """``values`` by distance to ``target`` (the larger first on a tie)."""
    return sorted(values, key=lambda v: (abs(v - target), -v))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def working_values(b: Batches, limit: int = 3) -> list[dict[str, int]]:
    """Up to ``limit`` changes to ``b`` that make :func:`batch_problem` None, those that leave the algorithm alone
    first: the micro-batch sizes (per-GPU memory knobs: upstream normalises the loss per optimizer step), then the
    optimizer-step size, then the prompts per rollout, then both of the last two; the number of actor GPUs where
    no flag alone helps."""
    found: list[dict[str, int]] = []

    def first(candidates: Iterable[dict[str, int]]) -> None:
        for change in candidates:
            if batch_problem(dataclasses.replace(b, **change)) is None:
                found.append(change)
                return

    if not b.dynamic:
        first({"train_micro": m} for m in range(b.train_micro - 1, 0, -1))
        first({"rollout_micro": r} for r in range(b.rollout_micro - 1, 0, -1))
        if not found:
            first({"train_micro": m, "rollout_micro": r} for m in range(b.train_micro, 0, -1)
                  for r in range(b.rollout_micro, 0, -1))
    first({"train_batch": t} for t in _nearest(_divisors(b.per_rollout), b.train_batch) if t != b.train_batch)
    first({"rollout_batch": r} for r in _nearest(range(1, 4 * b.rollout_batch + 1), b.rollout_batch)
          if r != b.rollout_batch)
    if not found:
        first({"rollout_batch": r, "train_batch": t}
              for r in _nearest(range(1, 4 * b.rollout_batch + 1), b.rollout_batch)
              for t in _nearest(_divisors(r * b.samples), b.train_batch))
    if not found:
        first({"actor_gpus": g} for g in range(b.actor_gpus - 1, 0, -1))
    return found[:limit]


def render_change(change: dict[str, int]) -> str:
    return " ".join(f"{change[k]} actor GPUs" if k == "actor_gpus" else f"{FLAGS[k]} {change[k]}" for k in change)


def batch_message(b: Batches) -> str | None:
    """:func:`batch_problem` with the values that work on these GPUs, as one line; None when nothing is wrong."""
    problem = batch_problem(b)
    if problem is None:
        return None
    changes = working_values(b)
    if not changes:
        return f"{problem}; no single change of these flags makes it work on {b.actor_gpus} actor GPU(s)"
    return f"{problem}. Values that work on {b.actor_gpus} actor GPU(s): {'; or '.join(map(render_change, changes))}"


def check_batches(args: SimpleNamespace, report: Any) -> None:
    """The batch arithmetic of ``args`` on its actor GPUs (:func:`batch_problem`), one line naming values that work;
    and a warning when fewer prompts than policy engines leave engines idle (upstream sends all the samples of a
    prompt to one engine)."""
    b = batches_of(args)
    message = batch_message(b)
    if message:
        _fail(message)
    steps = b.per_rollout // b.train_batch
    if b.dynamic:
        report.lines.append(f"batches: {b.per_rollout} samples per rollout = {steps} optimizer step(s) of "
                            f"{b.train_batch} samples (dynamic micro-batches) on {b.dp} actor rank(s)")
    else:
        report.lines.append(f"batches: {b.per_rollout} samples per rollout = {steps} optimizer step(s) of "
                            f"{b.train_batch} = {b.train_batch // (b.train_micro * b.dp)} micro-batch(es) of "
                            f"{b.train_micro} on each of {b.dp} actor rank(s)")
    engines = args.vllm.num_engines or 0
    if 0 < b.rollout_batch < engines:
        report.warnings.append(f"--rollout.batch_size {b.rollout_batch} prompts for --vllm.num_engines {engines}: "
                               f"{engines - b.rollout_batch} policy engine(s) idle every rollout (upstream sends each "
                               "prompt's samples to one engine)")


def fit_micro_batches(b: Batches, keep: Iterable[str] = ()) -> Batches | None:
    """``b`` with the largest micro-batch sizes, at most its own, that pass :func:`batch_problem` on its GPUs (the
    fields named in ``keep`` unchanged); None where no micro-batch size helps. ``train_scripts`` fit the configs'
    per-GPU micro-batches to the run's GPUs with it; the global sizes (the algorithm's) are never changed."""
    if batch_problem(b) is None:
        return b
    if b.dynamic:
        return None
    keep = set(keep)
    trains = [b.train_micro] if "train_micro" in keep else range(b.train_micro, 0, -1)
    rollouts = [b.rollout_micro] if "rollout_micro" in keep else range(b.rollout_micro, 0, -1)
    for m in trains:
        for r in rollouts:
            fitted = dataclasses.replace(b, train_micro=m, rollout_micro=r)
            if batch_problem(fitted) is None:
                return fitted
    return None


# ── GPUs available ───────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class GpuCount:
    count: int | None
    """GPUs the run may use, all nodes together; None where unknown (no CUDA device, no cluster, no setting)."""
    source: str
    """Where the number came from, for messages."""


def available_gpus(args: SimpleNamespace) -> GpuCount:
    """The GPUs this run may use: the smallest of ``OPENRLHF_CLASSMATE_GPUS`` (what ``train_scripts`` were told:
    NNODES x GPUS_PER_NODE, without the GPUs kept for servers, which Ray would count as free) and the Ray cluster's
    GPUs when ``RAY_ADDRESS`` names a cluster (asked of its dashboard or GCS, which starts nothing); with neither,
    this node's CUDA devices x ``--actor.num_nodes``. Unknown on a machine without CUDA devices (the launcher then
    runs on Ray's logical GPUs)."""
    return _available(os.environ.get(GPUS_ENV), os.environ.get("RAY_ADDRESS"), args.actor.num_nodes)


@functools.lru_cache(maxsize=8)
def _available(env: str | None, ray_address: str | None, num_nodes: int) -> GpuCount:
    counts: list[tuple[int, str]] = []
    if env is not None and env.strip():
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            _fail(f"{GPUS_ENV}={env!r}: must be a whole number >= 1 (the GPUs the run may use, all nodes together)")
        counts.append((n, f"{GPUS_ENV}={n}"))
    if ray_address:
        n = _ray_cluster_gpus(ray_address)
        if n is not None:
            counts.append((n, f"the Ray cluster at {ray_address}"))
    if counts:
        return GpuCount(*min(counts))
    import torch

    local = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local:
        return GpuCount(local * num_nodes, f"{local} CUDA device(s) here x --actor.num_nodes {num_nodes}")
    return GpuCount(None, f"no CUDA device here, no {GPUS_ENV}, no RAY_ADDRESS")


def _ray_cluster_gpus(address: str, timeout_s: float = 15.0) -> int | None:
    """The GPUs of the alive nodes of the cluster at ``address`` (GCS, ``auto`` or dashboard address), or None when it
    cannot be asked within ``timeout_s``. The state API asks the dashboard over HTTP: no driver connects, nothing
    starts (``ray.init`` here would leave this process connected without the launcher's runtime env). An unreachable
    GCS address keeps Ray's client waiting ~40 s: the question runs in a daemon thread, given up after the timeout."""
    import threading

    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            import ray

            if ray.is_initialized():
                answer["gpus"] = int(ray.cluster_resources().get("GPU", 0))
                return
            from ray.util.state import list_nodes

            nodes = list_nodes(address=address, timeout=10, raise_on_missing_output=False)
            answer["gpus"] = int(sum((n.resources_total or {}).get("GPU", 0) for n in nodes if n.state == "ALIVE"))
        except Exception as e:  # noqa: BLE001 - an unreachable cluster: count another way, and say so
            answer["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"

    thread = threading.Thread(target=ask, name="count-ray-gpus", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "gpus" in answer:
        return answer["gpus"]
    from openrlhf_classmate.integration.classmate_config import warn

    why = answer.get("error", f"no answer within {timeout_s:g} s")
    warn(f"could not count the GPUs of the Ray cluster at {address} ({why}); the layout is counted without it")
    return None


# ── layout ───────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Layout:
    """The whole GPUs each group asks Ray for (a group inside another's placement group asks for none), and how many
    groups hold a share of each GPU of a placement group (Ray gives each 0.2 of a GPU there)."""

    groups: list[tuple[str, int]]
    sharing: dict[str, int]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.groups)

    def describe(self) -> str:
        return " + ".join(f"{n} for the {name}" for name, n in self.groups if n)


def classmate_gpus(args: SimpleNamespace) -> int:
    """GPUs the classmate engines of every classmate model take as engines of their own (``separate``); vLLM engines
    only: HF engines ask Ray for no GPU."""
    cfg = args.classmate
    if not cfg.model_name_or_path or args.engine.backend != "vllm":
        return 0
    return len(cfg.model_name_or_path) * cfg.num_engines * cfg.tensor_parallel_size


def layout_of(args: SimpleNamespace, placement: str | None = None) -> Layout:
    """The groups upstream's ``train()`` and the launcher's ``EngineFactory`` create for ``args`` (with the classmate
    at ``placement``, default its flag), and the GPUs each asks Ray for."""
    from openrlhf_classmate.integration.classmate_config import classmate_enabled

    cfg = args.classmate
    placement = placement or cfg.placement
    vllm = args.engine.backend == "vllm"
    train = args.train
    colocated = train.colocate_actor_ref or train.colocate_all
    kl = args.algo.kl.init_coef > 0
    has_engines = bool(args.vllm.num_engines and args.vllm.num_engines > 0)
    engines_in_actor_pg = has_engines and train.colocate_all and not train.async_enable
    classmate = classmate_enabled(args)
    models = len(cfg.model_name_or_path or [])
    critic = bool(args.critic.model_name_or_path)
    reward_model = not args.reward.remote_url

    actor_pg = ["actor"]  # the groups holding a share of each GPU of the actor's placement group (or its GPUs)
    if kl and colocated:
        actor_pg.append("reference")
    if train.colocate_all:
        actor_pg += ["critic"] * critic + ["reward model"] * reward_model
    if engines_in_actor_pg and vllm:
        actor_pg.append("policy engines")
    classmate_in = {"colocate": "actor", "share": "actor" if engines_in_actor_pg else "policy"}.get(placement)
    if classmate and vllm and classmate_in == "actor":
        actor_pg += ["classmate engines"] * models
    groups = [(", ".join(dict.fromkeys(actor_pg)), args.actor.num_nodes * args.actor.num_gpus_per_node)]
    if kl and not colocated:
        groups.append(("reference", args.ref.num_nodes * args.ref.num_gpus_per_node))
    if critic and not train.colocate_all:
        both = train.colocate_critic_reward and reward_model
        groups.append(("critic and reward model" if both else "critic",
                       args.critic.num_nodes * args.critic.num_gpus_per_node))
    if reward_model and not train.colocate_all and not (critic and train.colocate_critic_reward):
        groups.append(("reward model", args.reward.num_nodes * args.reward.num_gpus_per_node))
    policy_pg = 0
    if has_engines and vllm and not engines_in_actor_pg:
        policy_pg = 1 + (models if classmate and classmate_in == "policy" else 0)
        name = "policy engines" + (" and the classmate engines beside them" if policy_pg > 1 else "")
        groups.append((name, args.vllm.num_engines * args.vllm.tensor_parallel_size))
    if classmate and placement == "separate":
        groups.append(("classmate engines (separate: a whole GPU for each)", classmate_gpus(args)))
    sharing = {"the actor's": len(actor_pg) if colocated else 1}
    if policy_pg:
        sharing["the policy engines'"] = policy_pg
    return Layout(groups, sharing)


def check_layout(args: SimpleNamespace, report: Any) -> None:
    """Refuse, in one line before Ray starts, a layout upstream asserts on after Ray has started, one that puts more
    groups on a GPU than Ray's 0.2-GPU shares allow, and one asking for more GPUs than :func:`available_gpus`."""
    from openrlhf_classmate.integration.classmate_config import classmate_enabled

    a, train = args.actor, args.train
    actor = a.num_nodes * a.num_gpus_per_node
    engines = args.vllm.num_engines or 0
    if engines > 0 and train.colocate_all and not train.async_enable:
        tp = args.vllm.tensor_parallel_size
        if engines * tp != actor:
            hint = f": set --vllm.num_engines {actor // tp}" if actor % tp == 0 else ""
            _fail(f"--train.colocate_all puts a policy engine GPU on each actor GPU: --vllm.num_engines {engines} x "
                  f"--vllm.tensor_parallel_size {tp} = {engines * tp} must equal --actor.num_nodes {a.num_nodes} x "
                  f"--actor.num_gpus_per_node {a.num_gpus_per_node} = {actor} (OpenRLHF asserts it after Ray has "
                  f"started){hint}")
    colocated = "--train.colocate_all" if train.colocate_all else "--train.colocate_actor_ref"
    if ((train.colocate_actor_ref or train.colocate_all) and args.algo.kl.init_coef > 0
            and (args.ref.num_nodes, args.ref.num_gpus_per_node) != (a.num_nodes, a.num_gpus_per_node)):
        _fail(f"{colocated} puts the reference model on the actor's GPUs: --ref.num_nodes {args.ref.num_nodes} / "
              f"--ref.num_gpus_per_node {args.ref.num_gpus_per_node} must equal --actor.num_nodes {a.num_nodes} / "
              f"--actor.num_gpus_per_node {a.num_gpus_per_node} (OpenRLHF asserts it after Ray has started)")
    if (args.critic.model_name_or_path and train.colocate_critic_reward and not args.reward.remote_url
            and (args.critic.num_nodes, args.critic.num_gpus_per_node)
            != (args.reward.num_nodes, args.reward.num_gpus_per_node)):
        _fail("--train.colocate_critic_reward: --critic.num_nodes / --critic.num_gpus_per_node must equal "
              "--reward.num_nodes / --reward.num_gpus_per_node (OpenRLHF asserts it after Ray has started)")
    layout = layout_of(args)
    for where, n in layout.sharing.items():
        if n > 5:
            _fail(f"{n} groups share each GPU of {where} placement group ({layout.groups[0][0]}), and Ray gives each "
                  "0.2 of a GPU there, so at most 5 fit: Ray would wait for the rest forever; use fewer classmate "
                  "models there, or --classmate.placement separate")
    gpus = available_gpus(args)
    where = f"{layout.total} GPU(s) ({layout.describe()})"
    if gpus.count is None:
        report.lines.append(f"layout: {where} asked of Ray; not counted ({gpus.source}: Ray's logical GPUs)")
        return
    if layout.total > gpus.count:
        missing = layout.total - gpus.count
        hint = ("lower --actor.num_gpus_per_node / --vllm.num_engines, or colocate the groups (--train.colocate_all "
                "puts the reference and the policy engines on the actor's GPUs)")
        if classmate_enabled(args) and args.classmate.placement == "separate" and classmate_gpus(args):
            per = args.classmate.tensor_parallel_size * len(args.classmate.model_name_or_path)
            fit = max(0, (gpus.count - layout.total + classmate_gpus(args)) // per)
            hint = ("use --classmate.placement share (the classmate engines beside the policy engines, no GPU of "
                    "their own; the two engine groups' memory fractions summing below 1)"
                    + (f", or at most --classmate.num_engines {fit}" if fit else "")
                    + "; train_scripts: CLASSMATE_GPUS=N keeps N GPUs of each node for them")
        _fail(f"the layout asks Ray for {where}, but {gpus.count} are available ({gpus.source}): Ray would wait for "
              f"the missing {missing} forever; {hint}")
    report.lines.append(f"layout: {where} asked of Ray, of {gpus.count} available ({gpus.source})")


def check_launch(args: SimpleNamespace, report: Any) -> None:
    """The preflight's layout checks: the GPUs the layout asks for, then the batch arithmetic on the actor GPUs."""
    check_layout(args, report)
    check_batches(args, report)


# ── --classmate.placement auto ───────────────────────────────────────────────────────────────────────────────────


def choose_placement(args: SimpleNamespace) -> tuple[str, str]:
    """``--classmate.placement auto`` for ``args``: (placement, why), by ``classmate_config.AUTO_RULE``.

    Why this order. ``separate`` costs the other groups nothing: the classmate engines get GPUs that the rest of the
    layout would leave idle, stay awake through the step (their generation overlaps the rollout and the actor/ref
    forwards) and take no memory from the policy engines or the actor. Without such GPUs, ``share`` keeps the
    classmate engines awake beside the policy engines at ``--classmate.gpu_memory_utilization`` of each GPU: on one
    H100 a classmate GDPO step took 1.05-1.07x a GRPO step with it, 1.31-1.32x with ``colocate`` (README, "one GPU"),
    whose engines sleep through the rollout and generate only after it; so ``colocate`` is the fallback where the
    two engine groups' memory fractions do not fit one GPU (the check the preflight makes under ``share``). HF
    engines hold no GPU in Ray's bookkeeping, so for them ``separate`` takes nothing from anyone."""
    cfg = args.classmate
    if args.engine.backend != "vllm":
        return "separate", "HF engines take no GPU of their own in Ray's bookkeeping"
    need = classmate_gpus(args)
    rest = layout_of(args, "share").total
    gpus = available_gpus(args)
    if gpus.count is not None and gpus.count - rest >= need:
        return "separate", (f"{gpus.count} GPUs ({gpus.source}), the rest of the layout takes {rest}: a whole GPU "
                            f"for each of the {need} classmate engine GPU(s)")
    left = (f"{gpus.count} GPUs ({gpus.source}) leave {max(0, gpus.count - rest)} beyond the {rest} the rest of the "
            f"layout takes, {need} needed for separate" if gpus.count is not None else f"GPUs unknown ({gpus.source})")
    policy = (args.vllm.num_engines or 0) * args.vllm.tensor_parallel_size
    per_model = cfg.num_engines * cfg.tensor_parallel_size
    servers = server_memory()
    memory = args.vllm.gpu_memory_utilization + cfg.gpu_memory_utilization + servers
    if per_model > policy:
        no_share = (f"--classmate.num_engines {cfg.num_engines} x --classmate.tensor_parallel_size "
                    f"{cfg.tensor_parallel_size} exceed the policy engines' {policy} GPUs")
    elif memory >= 1:
        held = f" + {servers:g} held by servers on the training GPUs ({SERVER_MEMORY_ENV})" if servers else ""
        no_share = (f"--vllm.gpu_memory_utilization {args.vllm.gpu_memory_utilization:g} + "
                    f"--classmate.gpu_memory_utilization {cfg.gpu_memory_utilization:g}{held} = {memory:g} of a GPU "
                    "do not fit one GPU")
    else:
        return "share", f"{left}; the classmate engines beside the policy engines, awake through the step"
    actor = args.actor.num_nodes * args.actor.num_gpus_per_node
    if (args.train.colocate_actor_ref or args.train.colocate_all) and per_model <= actor:
        return "colocate", (f"{left}; not share: {no_share}; the classmate engines join the actor/ref GPUs and "
                            "sleep between stages")
    return "separate", f"{left}; not share: {no_share}; not colocate: no actor/ref placement group to join"


def server_memory() -> float:
    """:data:`SERVER_MEMORY_ENV` (0 when unset)."""
    text = os.environ.get(SERVER_MEMORY_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:  # NaN fails too
        _fail(f"{SERVER_MEMORY_ENV}={text!r}: must be a fraction of a GPU in [0, 1) (the memory servers hold on each "
              "training GPU)")
    return value


def resolve_placement(args: SimpleNamespace) -> None:
    """Replace ``--classmate.placement auto`` by :func:`choose_placement`'s choice, logged in one line. Without a
    classmate it stays ``auto`` (nothing is placed)."""
    from openrlhf_classmate.integration.classmate_config import classmate_enabled, log_resolved

    if args.classmate.placement != "auto" or not classmate_enabled(args):
        return
    from openrlhf_classmate.integration.launch.preflight_types import PreflightError

    try:
        placement, why = choose_placement(args)
    except PreflightError as e:  # a bad OPENRLHF_CLASSMATE_GPUS, met while the flags are parsed
        raise SystemExit(f"error: {e}") from None
    args.classmate.placement = placement
    log_resolved(f"--classmate.placement {placement} (auto: {why})")

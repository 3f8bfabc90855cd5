"""``python -m openrlhf_classmate.cli.train_ppo_ray``: OpenRLHF's ``train_ppo_ray`` plus classmate training.

Accepts every flag of ``openrlhf.cli.train_ppo_ray`` 0.11.2 unchanged, plus ``--classmate.*``, ``--engine.*``,
``--config FILE.yaml`` and ``--check`` (parse and preflight only: :mod:`openrlhf_classmate.integration.launch.preflight`,
which also runs before every launch). It rebinds the few upstream names listed in :mod:`openrlhf_classmate.integration.patches`
and then calls upstream's own ``train(args)``: without ``--classmate.model_name_or_path`` the run is upstream's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import threading
import time

import openrlhf_classmate  # noqa: F401  (CPU shims first)
from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.classmate_config import (
    classmate_enabled,
    is_registry_reward_func,
    judge_config_from_args,
    registry_reward_in_use,
)
from openrlhf_classmate.integration.launch.args import ConfigError, parse_args
from openrlhf_classmate.integration.launch.startup import StartupClock, mark_launch
from openrlhf_classmate.integration.rollout import mismatch

INTEGRATION_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration")
CLASSMATE_EXECUTOR_PATH = os.path.join(INTEGRATION_DIR, "classmate", "classmate_executor.py")
POLICY_EXECUTOR_PATH = os.path.join(INTEGRATION_DIR, "rollout", "policy_executor.py")


def reward_env(args) -> dict[str, str]:
    """Settings the engine-side reward (``integration/rollout/policy_executor.py`` + ``reward_func.py``) reads: it receives
    no ``args``. Checks, before Ray starts, that the registry reward can split the policy's responses on token ids."""
    from transformers import AutoTokenizer

    from openrlhf_classmate.algo.response_split import load_stop_token_ids
    from openrlhf_classmate.algo.spans import think_token_ids

    cfg = args.classmate
    tokenizer = AutoTokenizer.from_pretrained(args.actor.model_name_or_path, trust_remote_code=True)
    if registry_reward_in_use(args) and cfg.final_answer == "after_think":
        try:
            think_token_ids(tokenizer, cfg.think_open, cfg.think_close)
        except ValueError as e:
            raise SystemExit(f"error: {e}: the main reward splits responses on the think tags' token ids; set "
                             "--classmate.think_open / --classmate.think_close to the model's tags, or "
                             "--classmate.final_answer whole_response for a model without a think block") from None
    env = {
        "OPENRLHF_CLASSMATE_THINK_OPEN": cfg.think_open,
        "OPENRLHF_CLASSMATE_THINK_CLOSE": cfg.think_close,
        "OPENRLHF_CLASSMATE_FINAL_ANSWER": cfg.final_answer,
        "OPENRLHF_CLASSMATE_STOP_IDS": json.dumps(list(load_stop_token_ids(args.actor.model_name_or_path, tokenizer))),
        "OPENRLHF_CLASSMATE_SCORER": cfg.main_scorer,
    }
    judge = judge_config_from_args(args)
    if judge is not None:
        env["OPENRLHF_CLASSMATE_JUDGE"] = json.dumps(dataclasses.asdict(judge))
    from openrlhf_classmate.integration.experience.reward_methods import reward_method_env

    env.update(reward_method_env(args))  # TinyV's verifier and the declared per-sample scorer metrics
    return env


def ray_init_address(address: str) -> str:
    """``RAY_ADDRESS`` for joining a running cluster from this process. The dashboard's http address, which ``ray job
    submit`` takes (and the train scripts pass there), is refused here in one line: ``ray.init`` fails on it with a
    traceback about a missing client module."""
    if address.startswith(("http://", "https://")):
        raise SystemExit(f"error: RAY_ADDRESS={address} is a dashboard (job submission) address; a launcher started "
                         "directly (RAY_SUBMIT=0 in train_scripts) joins the cluster by its GCS address: set "
                         "RAY_ADDRESS=auto on a cluster node, or HEAD_IP:6379, or submit the launcher with ray job "
                         "submit")
    return address


def init_ray(args, extra_env: dict[str, str]) -> None:
    import ray
    import torch

    if ray.is_initialized():
        return
    env = {
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "false"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        **extra_env,
    }
    for passthrough in ("TORCH_CUDA_ARCH_LIST", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "WANDB_MODE", "WANDB_DIR", "OMP_NUM_THREADS",
                        "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                        "HF_HUB_OFFLINE", "PYTHONPATH"):
        if passthrough in os.environ:
            env[passthrough] = os.environ[passthrough]
    for name, value in os.environ.items():  # settings of reward hooks and servers (e.g. DARLING_CLASSIFIER_URLS)
        if name.startswith(("OPENRLHF_CLASSMATE_", "DARLING_", "TINYV_", "VRCLI_")):
            env.setdefault(name, value)
    os.environ.update(extra_env)
    runtime_env = {"env_vars": env, "worker_process_setup_hook": "openrlhf_classmate.integration.patches.worker_setup"}
    if os.environ.get("RAY_ADDRESS"):
        # As a Ray job's driver (`ray job submit`, the train scripts' cluster path), ray.init merges this runtime env
        # into the job's and refuses any environment variable both set, even to the same value (the scripts forward
        # HF_HUB_OFFLINE, WANDB_MODE, ..., which are passed through here as well): this process's values win
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        ray.init(address=ray_init_address(os.environ["RAY_ADDRESS"]), runtime_env=runtime_env)
    elif torch.cuda.is_available():
        ray.init(runtime_env=runtime_env)
    else:
        # No GPU: logical GPUs let upstream's placement groups schedule; DeepSpeed runs on its CPU accelerator.
        env["DS_ACCELERATOR"] = "cpu"
        ray.init(num_cpus=16, num_gpus=8, runtime_env=runtime_env, include_dashboard=False)
    from openrlhf_classmate.integration.launch.terminated import install_sigterm_handler

    if args is not None:
        install_sigterm_handler(args.ckpt.path)  # after ray.init, which sets its own


def wait_until_ready(engines: list) -> None:
    """Block until every engine actor has finished ``__init__`` (an actor runs method calls only after it).

    vLLM sizes its KV cache by profiling the GPU's free memory during start-up; an engine (or DeepSpeed model) that
    starts on the same GPU meanwhile corrupts that measurement, so engines sharing a GPU start one group at a time."""
    import ray

    if engines:
        ray.get([engine.get_num_unfinished_requests.remote() for engine in engines])


class _Background:
    """A call run in a thread, its result (or exception) collected later. A daemon thread, not a ThreadPoolExecutor,
    whose worker Python joins at exit: a launcher that fails meanwhile must not wait on engines that never start."""

    def __init__(self, fn):
        import threading

        self._out: tuple = (None, None)
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="classmate-engines")
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._out = (fn(), None)
        except BaseException as e:  # noqa: BLE001  (re-raised in the launcher's thread by result())
            self._out = (None, e)

    def result(self):
        self._thread.join()
        value, error = self._out
        if error is not None:
            raise error
        return value


class EngineFactory:
    """Stands in for upstream ``create_vllm_engines``: HF engines for ``--engine.backend hf``; with classmate
    placement ``share`` the policy engines get an explicit placement group the classmate engines join.

    Upstream's ``train()`` (``openrlhf/cli/train_ppo_ray.py``) creates the policy engines with a module-global call
    ``create_vllm_engines(...)``; :func:`openrlhf_classmate.integration.patches.install_launcher` rebinds that global to
    :meth:`policy` (row ``cli.train_ppo_ray.create_vllm_engines`` of the table in ``integration/patches.py``). The
    factory object exists so that the classmate engines, created later by :class:`TrainerFactory`, can find the
    policy engines and their placement group (``share``) here."""

    def __init__(self, args, clock: StartupClock | None = None, fixed_kv: bool = False, defer_sleep: bool = False):
        self.args = args
        self.policy_pg = None
        self.policy_engines: list = []
        self.clock = clock or StartupClock()  # the engine groups' start-up seconds (integration/launch/startup.py)
        # no engine profiles GPU memory (fixed_kv_caches), so no group waits for another
        self.fixed_kv = fixed_kv or fixed_kv_caches(args, {})
        self._early = None  # the classmate groups' start beside the policy engines' (a thread), see policy()
        # the actor/ref models load while the vLLM engines start (models_while_engines_start): upstream's
        # create_vllm_engines then returns without waiting for its engines' first sleep, whose refs gather here for
        # the controller to wait on before the first step
        self.defer_sleep = defer_sleep
        self.sleeping: list = []

    def create(self, *args, **kwargs):
        """Engines of either group on the chosen backend; the arguments are ``create_vllm_engines``'s."""
        if self.args.engine.backend == "hf":
            from openrlhf_classmate.integration.rollout.hf_engine import create_hf_engines

            return create_hf_engines(*args, max_batch=self.args.engine.hf_max_batch, **kwargs)
        from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

        with patches.engine_sleep_deferred(self.sleeping) if self.defer_sleep else contextlib.nullcontext():
            return create_vllm_engines(*args, **kwargs)

    def policy(self, *args, **kwargs):
        """Called by upstream ``train()`` in place of ``create_vllm_engines``, with its arguments (partly
        positional)."""
        import inspect

        from openrlhf_classmate.integration.rollout.hf_engine import create_hf_engines

        # upstream passes some arguments by position: binding them to create_hf_engines' signature, which mirrors
        # create_vllm_engines' parameters (tested in test_upstream_pins), names them all, so the reward path and
        # the placement group below can be read and replaced by name
        bound = inspect.signature(create_hf_engines).bind(*args, **kwargs).arguments
        urls = bound.get("remote_rm_url") or []
        if (any(is_registry_reward_func(u) for u in ([urls] if isinstance(urls, str) else urls))
                and not bound.get("agent_func_path")):
            # the registry reward scores the answer split on token ids, not upstream's decoded query text
            # (a user's --train.agent_func_path is never replaced: upstream then ignores the reward url)
            bound["agent_func_path"] = POLICY_EXECUTOR_PATH
        if mismatch.enabled(self.args) and not bound.get("logprobs_mode"):
            # the sampled tokens' log-probs after temperature, as the actor computes them (upstream asks for the same
            # mode, and only that, with --algo.advantage.is_correction_level)
            bound["logprobs_mode"] = mismatch.ENGINE_LOGPROBS_MODE
        if (classmate_enabled(self.args) and self.args.classmate.placement == "share"
                and bound.get("shared_pg") is None and self.args.engine.backend != "hf"):
            import ray
            from ray.util.placement_group import placement_group

            gpus = bound["num_engines"] * bound["tensor_parallel_size"]
            bound["shared_pg"] = placement_group([{"GPU": 1, "CPU": 1}] * gpus, strategy="PACK")
            ray.get(bound["shared_pg"].ready())
        self.policy_pg = bound.get("shared_pg")
        if self.fixed_kv and classmate_enabled(self.args):
            # upstream's create_vllm_engines returns once the engines are up (asleep, with --vllm.enable_sleep): the
            # classmate groups start now, beside them, instead of after them
            self._early = _Background(self._classmate)
        with self.clock.phase("policy_engines"):
            self.policy_engines = self.create(**bound)
        return self.policy_engines

    def classmate(self) -> tuple[list[list], bool]:
        """One engine group per classmate model; returns (groups, colocated with actor/ref). Started beside the
        policy engines where none profiles memory: then ``classmate_engines`` is the time the launch waited for them
        after the policy engines were up."""
        with self.clock.phase("classmate_engines"):
            return self._early.result() if self._early is not None else self._classmate()

    def _classmate(self) -> tuple[list[list], bool]:
        args, cfg = self.args, self.args.classmate
        shared_pg, colocated = None, False
        if cfg.placement == "colocate":
            shared_pg, colocated = patches.recorded_placement_groups()[0], True
        elif cfg.placement == "share":
            shared_pg = self.policy_pg
        shares_a_gpu = cfg.placement != "separate"
        # vLLM sizes its KV cache by profiling the GPU's free memory (unless its size is fixed)
        profiles = shares_a_gpu and not self.fixed_kv
        if profiles:
            wait_until_ready(self.policy_engines)  # the policy engines may still be profiling GPU memory
        groups = []
        for k, path in enumerate(cfg.model_name_or_path):
            groups.append(self.create(
                num_engines=cfg.num_engines,
                tensor_parallel_size=cfg.tensor_parallel_size,
                pretrain=path,
                seed=args.train.seed + cfg.seed_offset + 1000 * k,  # never the policy engines' seeds
                full_determinism=args.train.full_determinism_enable,
                enable_prefix_caching=False,
                enforce_eager=args.vllm.enforce_eager,
                max_model_len=cfg.max_context,
                shared_pg=shared_pg,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                vllm_enable_sleep=colocated or cfg.enable_sleep,
                logprobs_mode=None,
                agent_func_path=CLASSMATE_EXECUTOR_PATH,
                remote_rm_url=None,
            ))
            if profiles:
                wait_until_ready(groups[-1])  # before the next group, and before upstream loads actor/ref models
        return groups, colocated


class TrainerFactory:
    """Stands in for upstream ``PPOTrainer`` (and ``PPOTrainerAsync``) inside ``train()``: ``.remote(...)`` creates
    the classmate engine group and our controller (``integration.trainer.controller_class``).

    Upstream's ``train()`` imports ``PPOTrainer`` (``PPOTrainerAsync`` with ``--train.async_enable``) at call time
    and calls ``PPOTrainer.remote(...)`` on the Ray actor class. ``install_launcher`` rebinds both names to this
    object (rows ``ppo_trainer.PPOTrainer`` / ``ppo_trainer_async.PPOTrainerAsync`` of the table in
    ``integration/patches.py``), so its :meth:`remote` looks like a Ray actor class to ``train()``: it creates the
    classmate engines only now, after upstream has placed the policy engines and the actor/ref models, and returns
    the handle of the real actor it starts."""

    def __init__(self, args, engines: EngineFactory):
        # imported here, before install_launcher rebinds upstream's trainer names to this factory
        from openrlhf_classmate.integration.trainer import controller_class

        self.trainer_cls = controller_class(args)
        self.args = args
        self.engines = engines
        self.handle = None

    def remote(self, *args, **kwargs):
        """``ray.remote(PPOTrainer).remote(...)`` as upstream calls it, plus the classmate engine groups."""
        import ray

        groups, colocated = self.engines.classmate() if classmate_enabled(self.args) else ([], False)
        startup = self.engines.clock.hand_over()
        startup["engines_starting"] = list(self.engines.sleeping)  # refs, passed as such (nested in the dict)
        self.handle = ray.remote(self.trainer_cls).remote(
            *args, classmate_engines=groups, classmate_colocated=colocated, startup=startup, **kwargs
        )
        return self.handle


# the launcher phase's parts main() measured before run() (startup.LAUNCHER_PARTS); empty where run() is called alone
launcher_parts: dict[str, float] = {}


def kv_cache_plan(args) -> dict[str, int]:
    """The launcher's KV-cache size for each vLLM engine group (``integration/rollout/engine_memory.py``), one line
    each; where it cannot size them, one line saying why the groups sharing a GPU start one after the other."""
    from openrlhf_classmate.integration.classmate_config import log_resolved
    from openrlhf_classmate.integration.rollout.engine_memory import GIB, plan

    sizes, why = plan(args)
    if sizes:
        each = ", ".join(f"{size / GIB:.2f} GiB for {key.rsplit('|', 1)[0]} at {key.rsplit('|', 1)[1]}"
                         for key, size in sorted(sizes.items()))
        log_resolved(f"KV caches {each} (each engine's fraction of the GPU minus its weights and vLLM's reserve: no "
                     "engine profiles the GPU, so the engine groups start side by side; --engine.profile_kv_cache "
                     "lets vLLM size them)")
    elif why is not None:
        log_resolved(f"the vLLM engines size their KV caches by profiling GPU memory, groups sharing a GPU one after "
                     f"the other: {why} (--engine.kv_cache_gib fixes a size)")
    return sizes


def fixed_kv_caches(args, kv_plan: dict[str, int]) -> bool:
    """Whether no engine profiles GPU memory at its start: every vLLM engine has a fixed KV-cache size (the launcher's,
    ``kv_plan`` from :func:`kv_cache_plan`, or ``--engine.kv_cache_gib``), or the engines are HF ones, which reserve
    nothing."""
    return bool(kv_plan) or args.engine.backend == "hf" or args.engine.kv_cache_gib is not None


def models_while_engines_start(args, kv_plan: dict[str, int]) -> bool:
    """Whether the actor/ref models load while the vLLM engines start, one line saying so or why not.

    Under ``--vllm.enable_sleep`` upstream's ``train()`` creates the engines and waits until they are up and asleep
    (their whole start: 70-125 s at 0.5B on one H200) before it loads the models (30-65 s) on the same GPUs. The two
    can overlap where no engine profiles GPU memory (fixed KV caches) and the models fit beside the awake engines
    (``engine_memory.models_beside_engines``)."""
    from openrlhf_classmate.integration.classmate_config import log_resolved
    from openrlhf_classmate.integration.rollout.engine_memory import models_beside_engines

    if args.engine.backend != "vllm" or not args.vllm.enable_sleep or not args.vllm.num_engines:
        return False  # nothing waits: the engines start in the background already (or there are none)
    if not fixed_kv_caches(args, kv_plan):
        log_resolved("the actor/ref models load after the vLLM engines are up: the engines profile GPU memory")
        return False
    fits, sizes = models_beside_engines(args)
    if fits:
        log_resolved(f"the actor/ref models load while the vLLM engines start ({sizes}); the first step waits for "
                     "the engines")
    else:
        log_resolved(f"the actor/ref models load after the vLLM engines are up and asleep, as upstream does: {sizes}")
    return fits


def inspect_models_ahead(args) -> threading.Thread | None:
    """vLLM's model-class inspection of the engines' models, started in the background before Ray starts, so that the
    engines find its cache warm (``integration/rollout/model_inspection.py``); one line saying so or why not."""
    from openrlhf_classmate.integration.classmate_config import log_resolved
    from openrlhf_classmate.integration.rollout.engine_memory import engine_groups
    from openrlhf_classmate.integration.rollout.model_inspection import start_inspection

    paths = [model for _, model, _, _ in engine_groups(args)]
    if args.engine.backend != "vllm" or not paths:
        return None
    thread, how = start_inspection(paths, log=log_resolved)
    log_resolved(f"vLLM's model inspection ahead of the engines: {how} (its cache: $VLLM_CACHE_ROOT/modelinfos, "
                 "default ~/.cache/vllm)")
    return thread


def run(args) -> TrainerFactory:
    """Train with parsed ``args``; returns the factory (its ``handle`` is the controller actor, for tests)."""
    t0 = time.time()
    import ray
    from openrlhf.cli import train_ppo_ray as upstream

    from openrlhf_classmate.integration.rollout.vllm_engine import engine_env
    from openrlhf_classmate.integration.training.actor import ClassmatePolicyModelActor, ClassmateReferenceModelActor

    launched = mark_launch()
    clock = StartupClock()
    t1 = time.time()
    kv_plan = kv_cache_plan(args)
    t2 = time.time()
    inspect_models_ahead(args)  # its thread runs on through Ray's start and the engines'
    now = time.time()
    clock.seconds["launcher"] = now - launched  # Python's imports, parsing, the preflight
    clock.seconds.update(launcher_parts)  # main()'s: its imports, the parsing and preflight
    clock.seconds.update(launcher_upstream_imports=t1 - t0, launcher_kv_plan=t2 - t1, launcher_inspection=now - t2)
    with clock.phase("ray"):
        init_ray(args, {**reward_env(args), **engine_env(args, kv_plan)})
    patches.install_experience()
    engines = EngineFactory(args, clock, fixed_kv=fixed_kv_caches(args, kv_plan),
                            defer_sleep=models_while_engines_start(args, kv_plan))
    trainer = TrainerFactory(args, engines)
    # from here upstream's train() finds our engine factory, actor class and trainer factory under its own names
    # (the table in integration/patches.py); it then runs unchanged
    patches.install_launcher(engines.policy, ray.remote(num_gpus=1)(ClassmatePolicyModelActor), trainer,
                             ray.remote(num_gpus=1)(ClassmateReferenceModelActor))
    upstream.train(args)
    if trainer.handle is not None:
        # every engine counts the complete weight syncs it received (HF: load_weights; vLLM: CountingRolloutActor):
        # record them next to the checkpoints, so runs can check policy = steps and classmate = 0
        updates = ray.get(trainer.handle.engine_weight_updates.remote())
        os.makedirs(args.ckpt.path, exist_ok=True)
        path = os.path.join(args.ckpt.path, "engine_weight_updates.json")
        with open(path + ".tmp", "w") as f:
            json.dump(updates, f)
        os.replace(path + ".tmp", path)
    return trainer


def check_scorer_environment() -> None:
    """Scorer settings read from the environment in the reward processes (the code sandbox's), checked here, before
    Ray starts, rather than failing every reward later."""
    from openrlhf_classmate.scoring.code import CodeSandboxConfig

    try:
        CodeSandboxConfig.from_env()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def main(argv: list[str] | None = None) -> None:
    """Parse, run the preflight (``--check`` stops there), then train. Bad input ends in one line ``error: ...``."""
    from openrlhf_classmate.integration.launch.preflight import PreflightError, preflight

    launched = mark_launch()  # the start-up breakdown counts from this process's start (integration/launch/startup.py)
    entered = time.time()

    try:
        args = parse_args(argv)
        check_scorer_environment()
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if os.environ.get("OPENRLHF_CLASSMATE_ALLOW_UPSTREAM_CHANGES") != "1":
        try:
            patches.check_upstream()
        except patches.UpstreamChangedError as e:
            raise SystemExit(f"error: {e} (set OPENRLHF_CLASSMATE_ALLOW_UPSTREAM_CHANGES=1 to run anyway)") from None
    try:
        report = preflight(args)
    except PreflightError as e:
        raise SystemExit(f"error: {e}") from None
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if args.check:
        for line in report.lines:
            print(f"  {line}")
        print("check passed: the run would start")
        return
    try:
        launcher_parts.update(launcher_imports=entered - launched, launcher_preflight=time.time() - entered)
        run(args)
    except Exception as e:  # noqa: BLE001 - our own stop, a full disk, a dead process become one line; else re-raises
        from openrlhf_classmate.errors import TrainingStopped
        from openrlhf_classmate.integration.training.disk_full import no_space_message

        cause = getattr(e, "cause", e)  # Ray wraps the controller's exception in a RayTaskError
        if isinstance(cause, TrainingStopped):
            raise SystemExit(str(cause)) from None
        full = no_space_message(e, [("--ckpt.path", args.ckpt.path), ("--ckpt.output_dir", args.ckpt.output_dir)],
                                args.ckpt.path)
        if full:
            raise SystemExit(full) from None
        from openrlhf_classmate.integration.launch.actor_died import actor_died_message

        died = actor_died_message(e, args.ckpt.path)
        if died:
            raise SystemExit(died) from None
        raise


if __name__ == "__main__":
    main(sys.argv[1:])

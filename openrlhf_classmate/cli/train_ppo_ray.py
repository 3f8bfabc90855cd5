"""``python -m openrlhf_classmate.cli.train_ppo_ray``: OpenRLHF's ``train_ppo_ray`` plus classmate training.

Accepts every flag of ``openrlhf.cli.train_ppo_ray`` 0.11.2 unchanged, plus ``--classmate.*``, ``--engine.*``,
``--config FILE.yaml`` and ``--check`` (parse and preflight only: :mod:`openrlhf_classmate.integration.preflight`,
which also runs before every launch). It rebinds the few upstream names listed in :mod:`openrlhf_classmate.integration.patches`
and then calls upstream's own ``train(args)``: without ``--classmate.model_name_or_path`` the run is upstream's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import openrlhf_classmate  # noqa: F401  (CPU shims first)
from openrlhf_classmate.integration import patches
from openrlhf_classmate.integration.args import ConfigError, parse_args
from openrlhf_classmate.integration.classmate_config import classmate_enabled

CLASSMATE_EXECUTOR_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration", "classmate_executor.py"
)


def reward_env(args) -> dict[str, str]:
    """Settings the engine-side reward function reads (it receives no ``args``)."""
    from transformers import AutoTokenizer

    from openrlhf_classmate.integration.trainer import judge_config_from_args

    cfg = args.classmate
    tokenizer = AutoTokenizer.from_pretrained(args.actor.model_name_or_path, trust_remote_code=True)
    strip = [t for t in tokenizer.all_special_tokens if t not in (cfg.think_open, cfg.think_close)]
    env = {
        "OPENRLHF_CLASSMATE_THINK_CLOSE": cfg.think_close,
        "OPENRLHF_CLASSMATE_FINAL_ANSWER": cfg.final_answer,
        "OPENRLHF_CLASSMATE_STRIP_TOKENS": json.dumps(strip),
        "OPENRLHF_CLASSMATE_SCORER": cfg.scorer,
    }
    judge = judge_config_from_args(args)
    if judge is not None:
        env["OPENRLHF_CLASSMATE_JUDGE"] = json.dumps(dataclasses.asdict(judge))
    return env


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
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=runtime_env)
    elif torch.cuda.is_available():
        ray.init(runtime_env=runtime_env)
    else:
        # No GPU: logical GPUs let upstream's placement groups schedule; DeepSpeed runs on its CPU accelerator.
        env["DS_ACCELERATOR"] = "cpu"
        ray.init(num_cpus=16, num_gpus=8, runtime_env=runtime_env, include_dashboard=False)


class EngineFactory:
    """Stands in for upstream ``create_vllm_engines``: HF engines for ``--engine.backend hf``; with classmate
    placement ``share`` the policy engines get an explicit placement group the classmate engines join."""

    def __init__(self, args):
        self.args = args
        self.policy_pg = None

    def create(self, *args, **kwargs):
        if self.args.engine.backend == "hf":
            from openrlhf_classmate.integration.hf_engine import create_hf_engines

            return create_hf_engines(*args, max_batch=self.args.engine.hf_max_batch, **kwargs)
        from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

        return create_vllm_engines(*args, **kwargs)

    def policy(self, *args, **kwargs):
        """Called by upstream ``train()`` with ``create_vllm_engines``'s arguments (partly positional)."""
        import inspect

        from openrlhf_classmate.integration.hf_engine import create_hf_engines

        # create_hf_engines mirrors create_vllm_engines' parameters (tested in test_upstream_pins)
        bound = inspect.signature(create_hf_engines).bind(*args, **kwargs).arguments
        if (classmate_enabled(self.args) and self.args.classmate.placement == "share"
                and bound.get("shared_pg") is None and self.args.engine.backend != "hf"):
            import ray
            from ray.util.placement_group import placement_group

            gpus = bound["num_engines"] * bound["tensor_parallel_size"]
            bound["shared_pg"] = placement_group([{"GPU": 1, "CPU": 1}] * gpus, strategy="PACK")
            ray.get(bound["shared_pg"].ready())
        self.policy_pg = bound.get("shared_pg")
        return self.create(**bound)

    def classmate(self) -> tuple[list[list], bool]:
        """One engine group per classmate model; returns (groups, colocated with actor/ref)."""
        args, cfg = self.args, self.args.classmate
        shared_pg, colocated = None, False
        if cfg.placement == "colocate":
            shared_pg, colocated = patches.recorded_placement_groups()[0], True
        elif cfg.placement == "share":
            shared_pg = self.policy_pg
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
        return groups, colocated


class TrainerFactory:
    """Stands in for upstream ``PPOTrainer`` inside ``train()``: ``.remote(...)`` creates the classmate engine group
    and the ``ClassmatePPOTrainer`` controller."""

    def __init__(self, args, engines: EngineFactory):
        # imported here, before install_launcher rebinds upstream's PPOTrainer to this factory
        from openrlhf_classmate.integration.trainer import ClassmatePPOTrainer

        self.trainer_cls = ClassmatePPOTrainer
        self.args = args
        self.engines = engines
        self.handle = None

    def remote(self, *args, **kwargs):
        import ray

        groups, colocated = self.engines.classmate() if classmate_enabled(self.args) else ([], False)
        self.handle = ray.remote(self.trainer_cls).remote(
            *args, classmate_engines=groups, classmate_colocated=colocated, **kwargs
        )
        return self.handle


def run(args) -> TrainerFactory:
    """Train with parsed ``args``; returns the factory (its ``handle`` is the controller actor, for tests)."""
    import ray
    from openrlhf.cli import train_ppo_ray as upstream

    from openrlhf_classmate.integration.actor import ClassmatePolicyModelActor

    init_ray(args, reward_env(args))
    patches.install_experience()
    engines = EngineFactory(args)
    trainer = TrainerFactory(args, engines)
    patches.install_launcher(engines.policy, ray.remote(num_gpus=1)(ClassmatePolicyModelActor), trainer)
    upstream.train(args)
    if args.engine.backend == "hf" and trainer.handle is not None:
        # HF engines count their weight updates: record them next to the checkpoints (classmate must stay at 0)
        updates = ray.get(trainer.handle.engine_weight_updates.remote())
        os.makedirs(args.ckpt.path, exist_ok=True)
        with open(os.path.join(args.ckpt.path, "engine_weight_updates.json"), "w") as f:
            json.dump(updates, f)
    return trainer


def main(argv: list[str] | None = None) -> None:
    """Parse, run the preflight (``--check`` stops there), then train. Bad input ends in one line ``error: ...``."""
    from openrlhf_classmate.integration.preflight import PreflightError, preflight

    try:
        args = parse_args(argv)
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
    run(args)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Every place where openrlhf_classmate rebinds a name inside OpenRLHF 0.11.2, in one module.

OpenRLHF is extended by subclassing; where upstream hard-codes a class or function through a module global, the
global is rebound here (and nowhere else):

===============================================  ==========================================================
upstream name                                    rebound to / why
===============================================  ==========================================================
``Experience`` in the five batching modules      :class:`ClassmateExperience` (else new fields are dropped)
``ppo_actor.ActorPPOTrainer`` (actor workers)    ``ClassmateActorPPOTrainer`` (classmate losses)
``ppo_actor.Actor``, ``launcher.Actor``          ``LoadCheckedActor`` (loaded weights compared with the checkpoint),
(actor and reference workers)                    unless ``--logprobs.chunked off``: ``ChunkedLogprobActor``
``cli.train_ppo_ray.create_vllm_engines``        dispatch to the HF engine when the backend is ``hf``
``cli.train_ppo_ray.PolicyModelActor``           ``ClassmatePolicyModelActor``
``cli.train_ppo_ray.ReferenceModelActor``        ``ClassmateReferenceModelActor`` (installs our ``Actor``)
``cli.train_ppo_ray.placement_group``            records the actor/ref group (classmate ``colocate`` placement)
``vllm_engine.RolloutRayActor``                  ``CountingRolloutActor`` (counts weight updates per engine)
``vllm_engine.batch_vllm_engine_call``, while    the engines' first ``sleep`` sent without waiting for it, so the
the launcher creates engines                     actor/ref models load while the engines start (``engine_sleep_
                                                 deferred``; the controller waits for it before the first step)
``ppo_trainer.PPOTrainer``                       factory creating the classmate engines + ``ClassmatePPOTrainer``
``ppo_trainer_async.PPOTrainerAsync``            the same factory (``--train.async_enable``): ``ClassmatePPOTrainerAsync``
``ppo_trainer_async.GenerateSamplesActor`` and   inside ``ClassmatePPOTrainerAsync``'s process only: our rollout actor
``ppo_trainer_async.TrainingActor``              (dispatches the classmate requests) and training actor (our maker)
``SamplesGenerator`` in ``ppo_trainer`` and      ``ClassmateSamplesGenerator`` (dynamic filtering leaves invalid
``ppo_trainer_async``                            scores out), in the controller / rollout actor's process
``compute_eval_metrics`` in the same two         ``masked_eval_metrics`` (eval pass1 / pass@n over valid scores)
``cli.train_ppo_ray.get_strategy``               ``ResilientDeepspeedStrategy`` (resume skips torn checkpoints,
                                                 ``*_hf`` folders rotate with ``--ckpt.max_num``)
``samples_generator.SamplingParams`` (the        rollout requests with the sampled token's log-prob (the
process that generates rollouts)                 ``mismatch/*`` metrics, ``integration/rollout/mismatch.py``)
CPU only: ``torch.cuda.*`` no-ops, ``init_device_mesh`` on cpu, ``ppo_actor.NaiveReplayBuffer`` on cpu
===============================================  ==========================================================

:func:`check_upstream` pins the exact upstream sources these rebindings were written against; a test calls it, so
an upgrade of OpenRLHF fails loudly instead of silently training something else.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.abc
import os
import sys
import threading
from collections.abc import Callable, Iterator

import openrlhf_classmate  # noqa: F401  (CPU shims before openrlhf imports)

UPSTREAM_VERSION = "0.11.2"
# sha256 of the upstream files whose names, signatures or control flow the rebindings rely on.
UPSTREAM_SHA256 = {
    "cli/train_ppo_ray.py": "a57da6a94a193645c653c39a19808d7a408ed3302b076c637778770d268096ab",
    "trainer/ppo_trainer.py": "c01b55d6c3c25f8c691c898b4f829d74d3c21f7d8ddae82f23966f65c254e03b",
    "trainer/ppo_trainer_async.py": "fc4c3b6022b6e18a4e6d5905d935a27481b62ab6e294c39e868d7caf414ffe5d",
    "trainer/ppo_utils/experience.py": "ee653245197294876b098ea5d451eb7bf7fa15a8257df7035201650a5623b312",
    "trainer/ppo_utils/experience_maker.py": "1defeef7fa22fc8ff6621d76f5a042a57ebfff4f83aa0338ef9a397de8f8563f",
    "trainer/ppo_utils/replay_buffer.py": "25e2826fc9541d7e94ea83283f1372b412a24f4053b122e8a2ef801f84c7d1c5",
    "trainer/ppo_utils/samples_generator.py": "3e55ca5c9d5b344f9657421f80f6bf28017dde998bc9031ce2606b14399db5aa",
    "trainer/ray/ppo_actor.py": "576ab84fa9a665dc229449e919351816fa339bba7b17810f03f165db02965579",
    "trainer/ray/vllm_engine.py": "8795d66373861f914a457e2b8e4f4739bd4c3e9c1a9aa34301440d495a5d9939",
    "trainer/ray/launcher.py": "67c202f4ed826332348392bdf96acb5dfccdfda857556e80ba7118078a7b5ec3",
    "models/loss.py": "a6dd82c27e8b1711c6a33b6acd0319be25df9f9d54e2326b950d8f2131060860",
    "models/actor.py": "4c9522114e57caf424a607235e17d8c7357e64e3fcb1cef5d083d3c880d8f975",
    "models/utils.py": "bb0c73194c8a14173ebe15dff103f5a9440eb766f373444101a03ee9fca4af87",
    "models/ring_attn_utils.py": "f0ec7490fd7b7ce5f07e34a8bf96d68630e9274498356da927c551a29d26d8cc",
    "utils/agent.py": "bfe2cfefc53c664c1e66e3a60ab7683be8c4fc87064b1169275c339bf9d47331",
    "utils/deepspeed/deepspeed.py": "d43196e47227157d584e34a84a0471f9620b418add0365e8efb2ef24a6467f53",
    "utils/utils.py": "5a5e651101f207b66f9e42a4982d1d492a555ec8aa49db98f6fe12d901a690d2",
}

EXPERIENCE_MODULES = (
    "openrlhf.trainer.ppo_utils.experience",
    "openrlhf.trainer.ppo_utils.samples_generator",
    "openrlhf.trainer.ppo_utils.experience_maker",
    "openrlhf.trainer.ppo_utils.replay_buffer",
    "openrlhf.trainer.ray.ppo_actor",
)


class UpstreamChangedError(RuntimeError):
    pass


def upstream_hashes() -> dict[str, str]:
    import openrlhf

    root = os.path.dirname(openrlhf.__file__)
    hashes = {}
    for rel in UPSTREAM_SHA256:
        with open(os.path.join(root, rel), "rb") as f:
            hashes[rel] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def check_upstream() -> None:
    """Raise if the installed OpenRLHF is not the exact release the rebindings were written against."""
    from importlib.metadata import version

    installed = version("openrlhf")
    if installed != UPSTREAM_VERSION:
        raise UpstreamChangedError(f"openrlhf_classmate targets openrlhf=={UPSTREAM_VERSION}, found {installed}")
    changed = [rel for rel, sha in upstream_hashes().items() if sha != UPSTREAM_SHA256[rel]]
    if changed:
        raise UpstreamChangedError(
            "openrlhf source differs from the pinned 0.11.2 files the rebindings were checked against: "
            + ", ".join(changed)
            + ". Re-check openrlhf_classmate/integration/patches.py against them, then update UPSTREAM_SHA256."
        )


def install_experience() -> None:
    """Rebind ``Experience`` to :class:`ClassmateExperience` in every module that builds or splits experiences."""
    for name in EXPERIENCE_MODULES:
        _rebind_experience(name)


def _rebind_experience(name: str) -> None:
    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    module = importlib.import_module(name)
    if not hasattr(module, "Experience"):
        raise UpstreamChangedError(f"{name} no longer has a module-global `Experience` to rebind")
    module.Experience = ClassmateExperience


def install_actor_trainer(trainer_cls: type) -> None:
    """Make ``PolicyModelActor.init_model_from_pretrained`` build ``trainer_cls`` (call in the actor worker)."""
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    if not hasattr(ppo_actor, "ActorPPOTrainer"):
        raise UpstreamChangedError("openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer is gone")
    ppo_actor.ActorPPOTrainer = trainer_cls


def install_actor_model(actor_cls: type) -> None:
    """Make ``PolicyModelActor`` / ``ReferenceModelActor.init_model_from_pretrained`` build ``actor_cls`` where
    they build upstream's ``Actor`` (call in the worker, before them)."""
    import openrlhf.trainer.ray.launcher as launcher
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    for module in (ppo_actor, launcher):
        if not hasattr(module, "Actor"):
            raise UpstreamChangedError(f"{module.__name__} no longer has a module-global `Actor` to rebind")
        module.Actor = actor_cls


# ── CPU runtime (no CUDA): upstream's CUDA-only calls (device, synchronize, device mesh, replay buffer device) ──


@contextlib.contextmanager
def _cuda_device_index(index: int):
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: index
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def install_cpu_runtime() -> bool:
    """Make upstream's CUDA calls harmless on a machine without CUDA. Returns False (and does nothing) with CUDA."""
    import torch

    if torch.cuda.is_available():
        return False
    for _, patch in CPU_RUNTIME_PATCHES:
        patch()
    return True


def _cpu_torch() -> None:
    import torch

    if torch.cuda.is_available():
        return
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None


def _cpu_device_mesh() -> None:
    import openrlhf.utils.deepspeed.deepspeed as ds_module
    import torch

    if torch.cuda.is_available() or getattr(ds_module.init_device_mesh, "_openrlhf_classmate_cpu", False):
        return
    real_mesh = ds_module.init_device_mesh

    def cpu_device_mesh(device_type, *args, **kwargs):
        return real_mesh("cpu", *args, **kwargs)

    cpu_device_mesh._openrlhf_classmate_cpu = True
    ds_module.init_device_mesh = cpu_device_mesh


def _cpu_replay_buffer() -> None:
    import openrlhf.trainer.ray.ppo_actor as ppo_actor
    import torch

    base = ppo_actor.NaiveReplayBuffer
    if torch.cuda.is_available() or getattr(base, "_openrlhf_classmate_cpu", False):
        return

    class CpuReplayBuffer(base):
        _openrlhf_classmate_cpu = True

        def __init__(self, *args, **kwargs):
            with _cuda_device_index(0):  # upstream builds torch.device(f"cuda:{index}") here
                super().__init__(*args, **kwargs)
            self.target_device = torch.device("cpu")

    ppo_actor.NaiveReplayBuffer = CpuReplayBuffer


# (module, patch): each CPU-runtime patch and the module it changes
CPU_RUNTIME_PATCHES: tuple[tuple[str, Callable[[], None]], ...] = (
    ("torch", _cpu_torch),
    ("openrlhf.utils.deepspeed.deepspeed", _cpu_device_mesh),
    ("openrlhf.trainer.ray.ppo_actor", _cpu_replay_buffer),
)


class _LoaderThenPatch(importlib.abc.Loader):
    """A module's own loader, then its pending patches (:func:`after_import`); everything else (``get_source`` for
    tracebacks and TorchScript, ``is_package``, resources) is the real loader's."""

    def __init__(self, loader, run_patches: Callable[[], None]) -> None:
        self._loader, self._run_patches = loader, run_patches

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        self._run_patches()

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with pending patches it takes the spec the other finders give and runs the
    patches right after the module's own code, on its first import in this process."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoaderThenPatch(spec.loader, lambda: self.run(fullname))
        return spec

    def run(self, fullname: str) -> None:
        for patch in self.pending.pop(fullname, []):
            patch()


_AFTER_IMPORT = _PatchAfterImport()


def after_import(name: str, patch: Callable[[], None]) -> None:
    """Run ``patch`` right after module ``name`` is first imported in this process, or now if it already is."""
    if name in sys.modules:
        patch()
        return
    if _AFTER_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER_IMPORT)
    _AFTER_IMPORT.pending.setdefault(name, []).append(patch)


def worker_setup() -> None:
    """Ray ``worker_process_setup_hook``: the same patches in every worker process, each applied where its module is
    first imported (at once where it already is). A process that never imports upstream's trainer modules (a vLLM or
    HF engine) is spared DeepSpeed and ``openrlhf.models`` (2-4 CPU-s per process on CPU: upstream keeps DeepSpeed
    out of its vLLM actors on purpose)."""
    # ClassmateExperience first (light: it imports upstream's ppo_utils package and transformers): a rebinding that
    # runs as an upstream module finishes importing must not meet it half-imported, as it would where unpickling an
    # experience is a worker's first import (it imports the ppo_utils package, whose modules are rebound)
    import openrlhf_classmate.integration.experience.experience  # noqa: F401

    for name in EXPERIENCE_MODULES:
        after_import(name, lambda name=name: _rebind_experience(name))
    for name, patch in CPU_RUNTIME_PATCHES:
        after_import(name, patch)


# ── Launcher rebindings (driver process) ──

_RECORDED_PLACEMENT_GROUPS: list = []


def recorded_placement_groups() -> list:
    """Placement groups created by upstream ``train()``, in order (the first is the actor/ref group)."""
    return _RECORDED_PLACEMENT_GROUPS


def install_vllm_engine_counter() -> None:
    """Make upstream ``create_vllm_engines`` build :class:`~openrlhf_classmate.integration.rollout.vllm_engine.
    CountingRolloutActor` (upstream's actor plus weight-update counts); call in the process that creates engines."""
    import openrlhf.trainer.ray.vllm_engine as vllm_engine
    import ray

    from openrlhf_classmate.integration.rollout.vllm_engine import CountingRolloutActor

    current = getattr(vllm_engine, "RolloutRayActor", None)
    if current is None:
        raise UpstreamChangedError("openrlhf.trainer.ray.vllm_engine.RolloutRayActor is gone")
    if getattr(current, "__ray_actor_class__", None) is not CountingRolloutActor:
        vllm_engine.RolloutRayActor = ray.remote(CountingRolloutActor)


_SLEEP_DEFERRED = threading.Lock()  # the engine groups are created from two threads (the classmate's beside)


@contextlib.contextmanager
def engine_sleep_deferred(pending: list) -> Iterator[None]:
    """Within it, upstream ``create_vllm_engines`` sends its engines' ``sleep`` (under ``--vllm.enable_sleep``) and
    returns at once, the sleeps' refs appended to ``pending``, instead of waiting for the engines to start and fall
    asleep. The block runs under a lock: creating engines takes milliseconds when nothing waits."""
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    original = getattr(vllm_engine, "batch_vllm_engine_call", None)
    if original is None:
        raise UpstreamChangedError("openrlhf.trainer.ray.vllm_engine.batch_vllm_engine_call is gone")

    def sleep_later(engines, method_name, *args, **kwargs):
        if method_name != "sleep" or args or kwargs:
            return original(engines, method_name, *args, **kwargs)
        pending.extend(engine.sleep.remote() for engine in engines)
        return None

    with _SLEEP_DEFERRED:
        vllm_engine.batch_vllm_engine_call = sleep_later
        try:
            yield
        finally:
            vllm_engine.batch_vllm_engine_call = original


def install_launcher(create_engines, policy_actor_cls, trainer_factory, reference_actor_cls=None) -> None:
    """Rebind the names upstream ``train()`` looks up at call time (see the table in the module docstring)."""
    import openrlhf.cli.train_ppo_ray as cli
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async

    from openrlhf_classmate.integration.training.strategy import get_strategy

    for name in ("create_vllm_engines", "PolicyModelActor", "ReferenceModelActor", "placement_group", "train",
                 "get_strategy"):
        if not hasattr(cli, name):
            raise UpstreamChangedError(f"openrlhf.cli.train_ppo_ray.{name} is gone")
    real_pg = cli.placement_group

    def recording_placement_group(*args, **kwargs):
        pg = real_pg(*args, **kwargs)
        _RECORDED_PLACEMENT_GROUPS.append(pg)
        return pg

    cli.placement_group = recording_placement_group
    install_vllm_engine_counter()
    cli.create_vllm_engines = create_engines
    cli.PolicyModelActor = policy_actor_cls
    if reference_actor_cls is not None:
        cli.ReferenceModelActor = reference_actor_cls
    if not hasattr(ppo_trainer_async, "PPOTrainerAsync"):
        raise UpstreamChangedError("openrlhf.trainer.ppo_trainer_async.PPOTrainerAsync is gone")
    cli.get_strategy = get_strategy
    ppo_trainer.PPOTrainer = trainer_factory
    ppo_trainer_async.PPOTrainerAsync = trainer_factory  # train() imports it at call time under async_enable


def install_samples_generator() -> None:
    """Make the controllers build :class:`~openrlhf_classmate.integration.rollout.samples_generator.ClassmateSamplesGenerator`
    (call in the controller's or the async rollout actor's process, before upstream's ``__init__``)."""
    import openrlhf.trainer.ppo_trainer as ppo_trainer
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async

    from openrlhf_classmate.integration.experience.eval_metrics import masked_eval_metrics
    from openrlhf_classmate.integration.rollout.samples_generator import ClassmateSamplesGenerator

    for module in (ppo_trainer, ppo_trainer_async):
        for name in ("SamplesGenerator", "compute_eval_metrics"):
            if not hasattr(module, name):
                raise UpstreamChangedError(f"{module.__name__}.{name} is gone")
        module.SamplesGenerator = ClassmateSamplesGenerator
        module.compute_eval_metrics = masked_eval_metrics


def install_rollout_sampling_params(factory) -> None:
    """Make upstream's ``SamplesGenerator._dispatch_prompts_to_vllm`` build its requests with ``factory`` (its
    keyword arguments are ``vllm.SamplingParams``'s); call in the process that generates rollouts."""
    import openrlhf.trainer.ppo_utils.samples_generator as samples_generator

    if not hasattr(samples_generator, "SamplingParams"):
        raise UpstreamChangedError("openrlhf.trainer.ppo_utils.samples_generator.SamplingParams is gone")
    samples_generator.SamplingParams = factory


def install_async_actors(generator, trainer) -> None:
    """Make ``PPOTrainerAsync.__init__`` create our rollout and training actors (call in that actor's process)."""
    import openrlhf.trainer.ppo_trainer_async as ppo_trainer_async

    for name in ("GenerateSamplesActor", "TrainingActor"):
        if not hasattr(ppo_trainer_async, name):
            raise UpstreamChangedError(f"openrlhf.trainer.ppo_trainer_async.{name} is gone")
    ppo_trainer_async.GenerateSamplesActor = generator
    ppo_trainer_async.TrainingActor = trainer

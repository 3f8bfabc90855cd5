"""ClassmatePPOTrainer with a fake Ray: HF-engine weight sync goes through the object store to the policy engines
only; the classmate engines are never in ``vllm_engines``."""

from types import SimpleNamespace

import ray

from openrlhf_classmate.cli.train_ppo_ray import EngineFactory
from openrlhf_classmate.integration.trainer import ClassmatePPOTrainer


class _Method:
    def __init__(self, fn):
        self.remote = fn


class FakeEngine:
    def __init__(self):
        self.loaded = []
        self.load_weights = _Method(lambda state: self.loaded.append(state) or len(self.loaded))
        self.get_num_weight_updates = _Method(lambda: len(self.loaded))


class FakeActorGroup:
    def __init__(self):
        self.calls = []

    def async_run_method(self, method_name, **kwargs):
        self.calls.append(method_name)
        return [{"w": 1.0}, None]  # rank 0 returns the weights, rank 1 None


def test_hf_weight_sync_reaches_policy_engines_only(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda x: x)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns: (refs, []))
    trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
    policy, classmate = [FakeEngine(), FakeEngine()], [[FakeEngine()]]
    trainer.args = SimpleNamespace(engine=SimpleNamespace(backend="hf"))
    trainer.vllm_engines, trainer.classmate_engines = policy, classmate
    trainer.actor_model_group = FakeActorGroup()
    trainer.broadcast_to_vllm()
    trainer.broadcast_to_vllm()
    assert trainer.actor_model_group.calls == ["hf_engine_state_dict"] * 2  # every rank joins (ZeRO-3 gather)
    assert all(engine.loaded == [{"w": 1.0}] * 2 for engine in policy)
    assert trainer.engine_weight_updates() == {"policy": [2, 2], "classmate": [0]}


def test_engine_factory_seeds_classmates_apart_and_uses_the_classmate_executor(monkeypatch):
    created = []
    args = SimpleNamespace(
        engine=SimpleNamespace(backend="hf", hf_max_batch=8),
        train=SimpleNamespace(seed=42, full_determinism_enable=False),
        vllm=SimpleNamespace(enforce_eager=False),
        classmate=SimpleNamespace(placement="separate", model_name_or_path=["a", "b"], num_engines=2,
                                  tensor_parallel_size=1, max_context=128, gpu_memory_utilization=0.3,
                                  enable_sleep=False, seed_offset=10_000),
    )
    factory = EngineFactory(args)
    monkeypatch.setattr(factory, "create", lambda **kw: created.append(kw) or [object()] * kw["num_engines"])
    groups, colocated = factory.classmate()
    assert len(groups) == 2 and all(len(g) == 2 for g in groups) and colocated is False
    assert [kw["seed"] for kw in created] == [10_042, 11_042]  # never the policy engines' seeds (42, 43, ...)
    assert all(kw["agent_func_path"].endswith("classmate_executor.py") and kw["remote_rm_url"] is None
               for kw in created)
    assert all(kw["max_model_len"] == 128 and kw["shared_pg"] is None for kw in created)


def test_engine_factory_forwards_upstreams_positional_call_unchanged(monkeypatch):
    # upstream train() passes the first twelve arguments of create_vllm_engines positionally
    args = SimpleNamespace(engine=SimpleNamespace(backend="vllm", hf_max_batch=8, kv_cache_gib=None),
                           classmate=SimpleNamespace(model_name_or_path=None, placement="separate"))
    factory = EngineFactory(args)
    seen = {}
    monkeypatch.setattr(factory, "create", lambda **kw: seen.update(kw) or ["engine"])
    pg = object()
    out = factory.policy(2, 1, "policy", 42, False, True, False, 4096, pg, 0.6, True, "processed_logprobs",
                         agent_func_path=None, remote_rm_url=["r.py"], max_images_per_prompt=0)
    assert out == ["engine"] and factory.policy_pg is pg
    assert seen == dict(num_engines=2, tensor_parallel_size=1, pretrain="policy", seed=42, full_determinism=False,
                        enable_prefix_caching=True, enforce_eager=False, max_model_len=4096, shared_pg=pg,
                        gpu_memory_utilization=0.6, vllm_enable_sleep=True, logprobs_mode="processed_logprobs",
                        agent_func_path=None, remote_rm_url=["r.py"], max_images_per_prompt=0)


class _ReadyEngine:
    """An engine whose readiness probe is logged (an actor answers only after its __init__ finished)."""

    def __init__(self, name, log):
        self.get_num_unfinished_requests = _Method(lambda: log.append(f"ready {name}") or 0)


def _placement_args(placement, kv_cache_gib=None):
    return SimpleNamespace(
        engine=SimpleNamespace(backend="vllm", hf_max_batch=8, kv_cache_gib=kv_cache_gib),
        train=SimpleNamespace(seed=1, full_determinism_enable=False),
        vllm=SimpleNamespace(enforce_eager=True),
        classmate=SimpleNamespace(placement=placement, model_name_or_path=["a", "b"], num_engines=1,
                                  tensor_parallel_size=1, max_context=64, gpu_memory_utilization=0.2,
                                  enable_sleep=False, seed_offset=10_000),
    )


def _factory_log(monkeypatch, placement, kv_cache_gib=None, fixed_kv=False, wait_s=0.0):
    """What the engine factory creates and waits for, in order. With ``wait_s``, the policy group's creation, like
    upstream's create_vllm_engines under --vllm.enable_sleep, returns only when its engines are up: here, once both
    classmate groups were created or after ``wait_s``. So the log shows whether the classmate groups started while
    the policy's were starting."""
    import threading
    import time

    from openrlhf_classmate.integration import patches

    log = []
    both = threading.Event()
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(patches, "recorded_placement_groups", lambda: ["actor-pg"])
    factory = EngineFactory(_placement_args(placement, kv_cache_gib), fixed_kv=fixed_kv)

    def create(**kw):
        log.append(f"create {kw['pretrain']} pg={kw['shared_pg']}")
        if kw["pretrain"] == "b":
            both.set()
        if kw["pretrain"] == "policy" and wait_s:
            t0 = time.time()
            both.wait(timeout=wait_s)
            log.append(f"policy up{' (waited for nothing)' if time.time() - t0 > 0.9 * wait_s else ''}")
        return [_ReadyEngine(kw["pretrain"], log)]

    monkeypatch.setattr(factory, "create", create)
    factory.policy(1, 1, "policy", 1, False, False, True, 64, "policy-pg", 0.2, False, None)
    factory.classmate()
    return log


def test_engines_sharing_a_gpu_start_one_group_at_a_time(monkeypatch):
    # vLLM profiles free GPU memory while it starts: the classmate groups on the policy engines' GPU must wait
    # for the policy engines, and for each other, and be up before upstream loads the actor/ref models
    assert _factory_log(monkeypatch, "share") == [
        "create policy pg=policy-pg", "ready policy", "create a pg=policy-pg", "ready a", "create b pg=policy-pg",
        "ready b"]
    assert _factory_log(monkeypatch, "colocate") == [
        "create policy pg=policy-pg", "ready policy", "create a pg=actor-pg", "ready a", "create b pg=actor-pg",
        "ready b"]


def test_engines_with_a_fixed_kv_cache_start_together_on_a_shared_gpu(monkeypatch):
    # a fixed KV cache (--engine.kv_cache_gib, or the launcher's own sizes: engine_memory.plan): vLLM does not
    # profile the GPU's memory, so the classmate groups start while the policy's are starting, no group waits
    for placement, pg in (("share", "policy-pg"), ("colocate", "actor-pg")):
        for fixed in ({"kv_cache_gib": 2.0}, {"fixed_kv": True}):
            log = _factory_log(monkeypatch, placement, wait_s=5.0, **fixed)
            assert sorted(log[:3]) == sorted(["create policy pg=policy-pg", f"create a pg={pg}",
                                              f"create b pg={pg}"]), log
            assert log[3:] == ["policy up"] and log.index("create a pg=" + pg) < log.index("create b pg=" + pg)
    # profiling: the classmate groups wait for the policy's (which here gives up waiting for them after 1 s)
    assert _factory_log(monkeypatch, "share", wait_s=1.0) == [
        "create policy pg=policy-pg", "policy up (waited for nothing)", "ready policy", "create a pg=policy-pg",
        "ready a", "create b pg=policy-pg", "ready b"]


def test_a_failed_classmate_start_beside_the_policy_is_raised_by_the_launcher(monkeypatch):
    import pytest

    from openrlhf_classmate.integration import patches

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(patches, "recorded_placement_groups", lambda: ["actor-pg"])
    factory = EngineFactory(_placement_args("share"), fixed_kv=True)

    def create(**kw):
        if kw["pretrain"] == "a":
            raise RuntimeError("classmate engine a failed to start")
        return [_ReadyEngine(kw["pretrain"], [])]

    monkeypatch.setattr(factory, "create", create)
    factory.policy(1, 1, "policy", 1, False, False, True, 64, "policy-pg", 0.2, False, None)
    with pytest.raises(RuntimeError, match="classmate engine a failed to start"):
        factory.classmate()


def test_engines_on_their_own_gpus_start_concurrently(monkeypatch):
    assert _factory_log(monkeypatch, "separate") == [
        "create policy pg=policy-pg", "create a pg=None", "create b pg=None"]


def test_steps_without_any_valid_main_score_are_skipped_then_the_run_stops(monkeypatch):
    import pytest
    import torch
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    from openrlhf_classmate.errors import TrainingStopped
    from openrlhf_classmate.integration.experience.experience_maker import AllScoresInvalidError
    from openrlhf_classmate.integration.launch.args import parse_args

    label = '{"data_source": "arithmetic", "ground_truth": "2"}'

    def batch(valid: float) -> list:
        return [SimpleNamespace(labels=[label], info={"main_valid": torch.tensor([valid])}) for _ in range(2)]

    bad, good = batch(0.0), batch(1.0)

    def fake_step(self, rollout_samples, global_step):
        if rollout_samples is bad:
            raise AllScoresInvalidError("all 8 main scores of this rollout batch are invalid")
        return {"reward": 1.0}, global_step + 1

    def trainer_with(limit: int):
        trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
        trainer.args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                                   "--classmate.stop_after_invalid_steps", str(limit)])
        trainer.classmate_stage, trainer.judge_client = None, None
        return trainer

    def counters(status: dict) -> dict:
        return {k: v for k, v in status.items() if not k.startswith(("judge/", "reward/"))}

    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", fake_step)
    trainer = trainer_with(3)
    status, step = trainer.train_step(bad, 0)
    assert (counters(status), step) == ({"skipped_invalid_step": 1.0}, 1)
    assert status["reward/main_valid_fraction"] == 0.0  # the skipped step still reports its judge health
    assert (counters(trainer.train_step(bad, 1)[0]), trainer.train_step(good, 1)[1]) == ({"skipped_invalid_step": 1.0}, 2)
    trainer = trainer_with(3)
    trainer.train_step(bad, 0)
    trainer.train_step(bad, 1)
    with pytest.raises(TrainingStopped, match="in each of the first 3 steps.*stop_after_invalid_steps"):
        trainer.train_step(bad, 2)
    # a reward hook that knows why every score is invalid: its reason, not a guess about the judge
    too_long = batch(0.0)

    def hook_step(self, rollout_samples, global_step):
        raise AllScoresInvalidError("all 2 main scores of this rollout batch are invalid",
                                    "VR-CLI: 2 generator sequences longer than --vrcli.max_len 8")

    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", hook_step)
    with pytest.raises(TrainingStopped) as stopped:
        trainer_with(1).train_step(too_long, 0)
    assert "longer than --vrcli.max_len 8) in each of the first 1 steps" in str(stopped.value)
    assert "judge" not in str(stopped.value)
    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", fake_step)
    # once a step had valid scores, later all-invalid steps are skipped, never fatal
    trainer = trainer_with(1)
    status, step = trainer.train_step(good, 0)
    assert (counters(status), step) == ({"reward": 1.0, "skipped_invalid_step": 0.0}, 1)
    for step in range(1, 5):
        assert counters(trainer.train_step(bad, step)[0]) == {"skipped_invalid_step": 1.0}


def test_each_step_reports_the_mismatch_and_warns_once_above_the_threshold(monkeypatch):
    """The controller adds ``mismatch/*`` to the step's status (logged as train/mismatch/...) and prints one warning
    line naming the step when the mean crosses --engine.mismatch_warn_threshold."""
    import logging

    from openrlhf.trainer.ppo_trainer import PPOTrainer

    from openrlhf_classmate.algo.mismatch import Mismatch
    from openrlhf_classmate.integration import trainer as trainer_module
    from openrlhf_classmate.integration.launch.args import parse_args

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    monkeypatch.setattr(trainer_module.logger, "handlers", [*trainer_module.logger.handlers, handler])

    measured = iter([Mismatch(0.012, 0.9, 1.5e-4, 100, 0), Mismatch(2.5, 9.0, 3.1, 100, 0), None])

    def fake_step(self, rollout_samples, global_step):
        self.experience_maker.last_mismatch = next(measured)  # what make_experience measured for this batch
        return {"reward": 1.0}, global_step + 1

    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", fake_step)
    trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
    trainer.args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                               "--engine.mismatch_warn_threshold", "0.05", "--engine.mismatch_interval", "1"])
    trainer.classmate_stage, trainer.judge_client = None, None
    trainer.experience_maker = SimpleNamespace(last_mismatch=None)
    status, step = trainer.train_step([], 0)
    assert step == 1 and status["mismatch/logprob_abs_diff_mean"] == 0.012
    assert (status["mismatch/logprob_abs_diff_max"], status["mismatch/kl_k3"]) == (0.9, 1.5e-4)
    assert not [line for line in lines if "mismatch" in line]
    status, step = trainer.train_step([], 1)
    assert status["mismatch/logprob_abs_diff_mean"] == 2.5 and trainer.experience_maker.last_mismatch is None
    warned = [line for line in lines if "train-inference mismatch" in line]
    assert len(warned) == 1 and warned[0].startswith("step 2: train-inference mismatch: mean |actor - engine "
                                                     "log-prob| 2.5 > --engine.mismatch_warn_threshold 0.05")
    status, step = trainer.train_step([], 2)  # rollouts without log-probs: no metric, said once
    assert not [k for k in status if k.startswith("mismatch/")]
    assert lines[-1].startswith("step 3: no mismatch/* metrics")
    # with the default --engine.mismatch_interval (10) step 3 is not measured: no metric, and nothing to say
    lines.clear()
    trainer.args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"])
    trainer._mismatch_steps, trainer._reported_no_mismatch = 2, False
    measured = iter([None, None, None])
    status, step = trainer.train_step([], 3)
    assert not [k for k in status if k.startswith("mismatch/")] and not lines
    trainer._mismatch_steps = 4
    trainer.train_step([], 4)  # nor is step 5 (it was under the old default of 5)
    assert not lines
    trainer._mismatch_steps = 9
    trainer.train_step([], 9)  # step 10 is measured: its missing log-probs are said
    assert len(lines) == 1 and lines[0].startswith("step 10: no mismatch/* metrics")


def test_a_run_whose_classmate_scores_are_all_invalid_stops_like_one_without_main_scores(monkeypatch):
    """A classmate run whose every classmate answer is scored invalid (judge down, a broken reward function) trains
    plain GRPO with the classmate stream masked out; it stops after --classmate.stop_after_invalid_steps such
    steps, as a run without valid main scores does, unless a classmate score was valid before. Steps whose classmate
    requests were all skipped (no CoT, over the context) score nothing and do not count. Seen in a CPU demo run:
    256/256 classmate scores invalid at each of its 40 steps, a warning per step, and a summary as if it trained."""
    import pytest
    import torch
    from openrlhf.trainer.ppo_trainer import PPOTrainer

    from openrlhf_classmate.errors import TrainingStopped
    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.scoring.result import ScoreResult

    label = '{"data_source": "arithmetic", "ground_truth": "2"}'
    samples = [SimpleNamespace(labels=[label], info={"main_valid": torch.tensor([1.0])}) for _ in range(2)]
    broken = ([ScoreResult.invalid("judge: HTTP 503")] * 2, [False, False])
    skipped = ([], [False, False])
    scored = ([ScoreResult(1.0), ScoreResult.invalid("judge: HTTP 503")], [True, False])
    plan = []

    def fake_step(self, rollout_samples, global_step):
        self.classmate_stage.last_scores = plan.pop(0)
        return {"reward": 1.0}, global_step + 1

    def trainer_with(limit: int):
        trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
        trainer.args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl",
                                   "--classmate.model_name_or_path", "c", "--rollout.n_samples_per_prompt", "2", "--vllm.num_engines", "1",
                                   "--classmate.stop_after_invalid_steps", str(limit)])
        trainer.classmate_stage, trainer.judge_client = SimpleNamespace(last_scores=([], [])), None
        return trainer

    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", fake_step)
    trainer = trainer_with(3)
    plan[:] = [broken, skipped, broken, skipped]
    for step in range(4):
        assert trainer.train_step(samples, step)[1] == step + 1  # trained: the main stream is fine
    plan[:] = [broken]
    with pytest.raises(TrainingStopped) as stopped:
        trainer.train_step(samples, 4)
    assert str(stopped.value) == (
        "error: the classmate scores of each of the first 3 steps with classmate answers were all invalid (2 in the "
        "last; first: judge: HTTP 503): no score has been valid yet; stopping (--classmate.stop_after_invalid_steps)")
    # a valid classmate score earlier: later all-invalid steps only warn; 0 never stops
    for limit, first in ((1, scored), (0, broken)):
        trainer = trainer_with(limit)
        plan[:] = [first] + [broken] * 4
        for step in range(5):
            trainer.train_step(samples, step)


def test_the_first_step_waits_for_engines_still_starting_and_the_breakdown_names_the_wait(monkeypatch):
    # models_while_engines_start: the launcher hands the controller the engines' first sleeps (refs); fit waits for
    # them before the first step, and the start-up breakdown reports that wait as engines_ready
    import time

    from openrlhf.trainer.ppo_trainer import PPOTrainer

    from openrlhf_classmate.integration.launch.args import parse_args
    from openrlhf_classmate.integration.launch.startup import LAUNCH_ENV

    waited = []
    monkeypatch.setattr(ray, "get", lambda refs: waited.append(list(refs)) or time.sleep(0.3))
    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "fit", lambda self: "fitted")
    monkeypatch.setattr(PPOTrainer.__ray_actor_class__, "train_step", lambda self, samples, step: ({}, step + 1))
    monkeypatch.setenv(LAUNCH_ENV, repr(time.time() - 10))
    trainer = ClassmatePPOTrainer.__new__(ClassmatePPOTrainer)
    trainer.args = parse_args(["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d.jsonl"])
    trainer.classmate_stage, trainer.judge_client = None, None
    trainer._startup = {"seconds": {"launcher": 1.0}, "handed_over": time.time() - 2,
                        "engines_starting": ["sleep-ref-1", "sleep-ref-2"]}
    assert trainer.fit() == "fitted" and waited == [["sleep-ref-1", "sleep-ref-2"]]
    status, _ = trainer.train_step([], 0)
    assert 1.9 < status["startup/models_s"] < 2.2 and 0.3 <= status["startup/engines_ready_s"] < 0.6
    assert status["startup/step_1_s"] < 0.2
    # nothing handed over (upstream's order): no wait, no such phase
    waited.clear()
    trainer._startup = {"seconds": {}, "handed_over": time.time()}
    trainer.fit()
    assert waited == [] and "startup/engines_ready_s" not in trainer.train_step([], 0)[0]


def test_the_launcher_phase_shows_its_parts_inside_it_without_counting_them_twice(monkeypatch):
    # the launcher's 26 s on a GPU machine (bench/GPU_RESULTS.md section 11) split into Python's imports, parsing and
    # preflight, upstream's launcher import and the KV-cache plan; driver_setup is what is left of the driver's time
    import time

    from openrlhf_classmate.integration.launch import startup

    monkeypatch.setenv(startup.LAUNCH_ENV, repr(time.time() - 30.0))
    clock = startup.StartupClock()
    clock.seconds.update(launcher=26.0, ray=3.0, launcher_imports=9.1, launcher_preflight=4.0,
                         launcher_upstream_imports=10.2, launcher_kv_plan=2.1)
    seconds = clock.hand_over()["seconds"]
    assert 0.9 < seconds["driver_setup"] < 1.2  # 30 s since launch - launcher 26 - ray 3, the parts not subtracted
    metrics = startup.breakdown(seconds, None)
    assert metrics["startup/launcher_upstream_imports_s"] == 10.2 and metrics["startup/launcher_kv_plan_s"] == 2.1
    assert startup.summary_line(metrics).startswith(
        "start-up: launcher 26.0 s (imports 9.1, preflight 4.0, upstream imports 10.2, kv plan 2.1), ray 3.0 s, "
        "driver setup ")

"""The GPU scripts' launcher command lines pass the launcher's own parsing and checks (upstream's included), so a
device call never fails on a flag that CPU parsing would already refuse. The runs themselves are checked on CPU by
``bench/gpu_validate.py --engine hf`` and ``bench/step_time.py --tiny --engine hf`` (see bench/GPU_RESULTS.md)."""

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from openrlhf_classmate.integration.launch.args import parse_args
from openrlhf_classmate.testing.e2e import build_world

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(REPO, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(str(tmp_path_factory.mktemp("gpu_scripts") / "world"), num_prompts=4)


@pytest.fixture(scope="module")
def gpu_validate():
    return _bench("gpu_validate")


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_every_validation_run_parses(world, gpu_validate, engine):
    plans = {name for names in gpu_validate.PLANS.values() for name in names}
    assert plans == set(gpu_validate.RUNS)  # every run belongs to a plan
    for name, run in gpu_validate.RUNS.items():
        args = parse_args(gpu_validate.run_argv(run, world, engine))
        assert args.engine.backend == engine, name
        assert args.vllm.num_engines == run.policy_engines and args.classmate.num_engines == run.classmate_engines
        assert args.actor.num_gpus_per_node == run.actor_gpus and args.ds.zero_stage == run.zero
        if engine == "vllm":
            assert args.vllm.sync_backend == "nccl" and args.vllm.enforce_eager
            # the GPUs the layout takes (one Ray bundle per actor/ref group, engine and classmate engine of its own)
            if run.engine == "vllm":  # (the HF engines of the "hf" plan take no GPU)
                assert gpu_validate.gpus_needed(args) == run.gpus, name


def test_the_plans_cover_issue_13s_list(gpu_validate):
    runs = {name: gpu_validate.RUNS[name] for name in gpu_validate.PLANS["vllm1"] + gpu_validate.PLANS["vllm2"]}
    flags = [" ".join(r.extra) for r in runs.values()]
    assert any(r.zero == 2 and r.estimator == "separated" for r in runs.values())
    assert any(r.zero == 3 and r.estimator == "gdpo" for r in runs.values())
    assert any("vanilla_classmate" in f for f in flags)
    assert any("placement colocate" in f and "enable_sleep" in f for f in flags)
    assert any("placement share" in f for f in flags)
    two = [r for r in runs.values() if r.gpus == 2]
    assert any(r.expect_overlap and "colocate_all" not in " ".join(r.extra) for r in two)  # engines on the 2nd GPU
    assert any(r.zero == 3 and r.actor_gpus == 2 and "colocate_all" in " ".join(r.extra) for r in two)


def test_the_plans_cover_issue_28s_deployment_shape(world, gpu_validate):
    # --classmate.placement separate: classmate engines on GPUs of their own, overlapping the actor/ref forwards
    separate = {name: run for name, run in gpu_validate.RUNS.items() if "placement separate" in " ".join(run.extra)}
    assert separate and all(run.expect_overlap and run.engine == "vllm" for run in separate.values())
    by_gpus = {run.gpus: parse_args(gpu_validate.run_argv(run, world, "vllm")) for run in separate.values()}
    # the deployment shape: actor + ref on GPU 0, the policy engine on GPU 1 (NCCL broadcast), the classmate on GPU 2
    shape = by_gpus[3]
    assert shape.train.colocate_actor_ref and not shape.train.colocate_all and shape.vllm.sync_backend == "nccl"
    assert "zero2_gdpo_separate_3gpu" in gpu_validate.PLANS["vllm3"]
    # the closest two-GPU layout: actor/ref + policy engine on GPU 0 (colocate_all), the classmate engine on GPU 1
    assert by_gpus[2].train.colocate_all and "zero2_gdpo_separate_2gpu" in gpu_validate.PLANS["vllm2"]
    # every plan is a step of gpu_validate.sh
    script = open(os.path.join(REPO, "bench", "gpu_validate.sh")).read()
    steps = {s.strip() for line in script.splitlines() if line.strip().startswith("vllm1|") for s in
             line.strip().rstrip(")").split("|")}
    assert set(gpu_validate.PLANS) <= steps


def test_a_run_needing_more_gpus_than_the_device_has_is_skipped(gpu_validate):
    # Ray would wait forever for the placement group of a third GPU on a two-GPU host
    run = gpu_validate.RUNS["zero2_gdpo_separate_3gpu"]
    assert "needs 3 GPUs, the device has 2" in gpu_validate.too_few_gpus(run, "vllm", device_gpus=2)
    assert gpu_validate.too_few_gpus(run, "vllm", device_gpus=4) is None
    assert gpu_validate.too_few_gpus(run, "hf", device_gpus=0) is None  # --engine hf: Ray's logical GPUs


@pytest.mark.parametrize("gpus, layout", [(1, "colocate_all"), (2, "colocate_all"), (2, "split")])
@pytest.mark.parametrize("classmate", [False, True])
def test_step_time_runs_parse(gpus, layout, classmate, gpu_validate):
    step_time = _bench("step_time")
    a = SimpleNamespace(prompts=32 * gpus, samples=8, new_tokens=512, classmate_new_tokens=256, steps=4,
                        micro_batch=16, train_micro_batch=8, engine="vllm", enforce_eager=False, gpus=gpus,
                        mismatch="on", is_correction="off", layout=layout, placement=None)
    args = parse_args(step_time.launcher_argv(a, "policy", "classmate" if classmate else None, "d.jsonl", "/tmp/x"))
    assert not args.engine.no_mismatch_metrics and args.algo.advantage.is_correction_level == "off"
    assert args.rollout.batch_size * args.rollout.n_samples_per_prompt == args.train.batch_size == 256 * gpus
    assert args.rollout.max_new_tokens == 512 and args.algo.kl.init_coef > 0  # a reference model: ref forwards
    assert bool(args.train.colocate_all) == (layout == "colocate_all")
    assert gpu_validate.gpus_needed(args) == gpus
    ranks = gpus if layout == "colocate_all" else 1  # data parallel: an actor rank and a policy engine per GPU
    assert args.actor.num_gpus_per_node == args.ref.num_gpus_per_node == args.vllm.num_engines == ranks
    assert step_time.variant(a) == ("_split" if layout == "split" else "")
    if classmate:
        assert args.classmate.estimator == "gdpo" and args.classmate.max_new_tokens == 256
        # no --classmate.placement: the launcher's auto, which picks share (each engine group at a fraction of a GPU)
        assert args.classmate.placement == "share" and args.classmate.num_engines == ranks
        pinned = parse_args(step_time.launcher_argv(SimpleNamespace(**{**vars(a), "placement": "colocate"}),
                                                    "policy", "classmate", "d.jsonl", "/tmp/x"))
        assert pinned.classmate.placement == "colocate"
    else:
        assert args.algo.advantage.estimator == "group_norm" and not args.classmate.model_name_or_path


def _interleaved_json(gpus: int, samples_per_gpu: int, grpo_s: float, gdpo_s: float, **settings) -> dict:
    """A step-time JSON of one interleaved call whose medians are ``grpo_s`` / ``gdpo_s`` (512-token responses)."""
    step_time = _bench("step_time")
    row = {"response_length": 512.0,
           "grpo": {"stats": {"timing/step_total": {"median": grpo_s}}, "per_step": {"timing/broadcast": {2: 1.0}}},
           "gdpo": {"stats": {"timing/step_total": {"median": gdpo_s}}, "per_step": {"timing/broadcast": {3: 1.4}}}}
    row.update(step_time.throughput(row, samples_per_gpu * gpus, gpus))
    return {"gpus": gpus, "samples_per_gpu": samples_per_gpu, "models": "qwen2.5-0.5b-shape", "engine": "vllm",
            "mismatch": "on", "is_correction": "off", "dispatch": "auto", "placement": "auto",
            "layout": "colocate_all", "calls": [row], **settings}


def test_throughput_and_scaling_follow_from_the_medians():
    step_time = _bench("step_time")
    one = _interleaved_json(1, 256, grpo_s=20.0, gdpo_s=21.0)
    # 256 responses x 512 tokens in a 20 s median step on one GPU
    assert one["calls"][0]["tokens_per_s_per_gpu"] == {"grpo": 6553.6, "gdpo": 6241.5}
    assert one["calls"][0]["weight_sync_median_s"] == 1.2
    two = _interleaved_json(2, 256, grpo_s=22.0, gdpo_s=25.0)
    out = step_time.scaling(one, two)
    assert out["ratios"] == {"grpo": round(20 / 22, 3), "gdpo": round(21 / 25, 3)}
    assert out["meets"] is False  # GDPO 0.84 < 0.85
    assert step_time.scaling(one, _interleaved_json(2, 256, 21.0, 22.0))["meets"] is True
    with pytest.raises(ValueError, match=r"the per-GPU batch differs: 256 samples per GPU on 1 GPU, 128 on 2 "
                                         r"\(run the multi-GPU call with --prompts 2 x the one-GPU call's\)"):
        step_time.scaling(one, _interleaved_json(2, 128, 22.0, 25.0))
    with pytest.raises(ValueError, match="layout differs: 'colocate_all' on 1 GPU, 'split' on 2"):
        step_time.scaling(one, _interleaved_json(2, 256, 22.0, 25.0, layout="split"))


def test_the_scaling_command_writes_its_json_and_refuses_in_one_line(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps(_interleaved_json(1, 256, 20.0, 21.0)))
    two.write_text(json.dumps(_interleaved_json(2, 256, 21.0, 23.0)))
    res = subprocess.run([sys.executable, "bench/step_time.py", "--scaling", str(one), str(two), "--out",
                          str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "GDPO: 5,699 tokens/s per GPU on 2 GPUs, 6,242 on 1: 0.913x (meets the 0.85x target)" in res.stdout
    assert json.load(open(tmp_path / "out" / "scaling.json"))["ratios"] == {"grpo": 0.952, "gdpo": 0.913}
    res = subprocess.run([sys.executable, "bench/step_time.py", "--scaling", str(two), str(one)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 1 and res.stderr.strip().endswith("needs a 1-GPU and a multi-GPU step-time JSON (got 2 "
                                                                "and 1)"), res.stderr


def test_step_time_mismatch_variants_parse_and_keep_apart():
    # the GPU before/after pairs of the mismatch metrics: on (default), off (upstream's request), upstream's IS request
    step_time = _bench("step_time")
    seen = {}
    for mismatch, is_correction in (("on", "off"), ("off", "off"), ("off", "token")):
        a = SimpleNamespace(prompts=32, samples=8, new_tokens=512, classmate_new_tokens=256, steps=4, micro_batch=16,
                            train_micro_batch=8, engine="vllm", enforce_eager=False, gpus=1, mismatch=mismatch,
                            is_correction=is_correction)
        args = parse_args(step_time.launcher_argv(a, "policy", None, "d.jsonl", "/tmp/x"))
        seen[step_time.variant(a)] = (args.engine.no_mismatch_metrics, args.algo.advantage.is_correction_level)
    assert seen == {"": (False, "off"), "_mismatch-off": (True, "off"), "_mismatch-off_is-token": (True, "token")}


@pytest.mark.parametrize("placement, dispatch, per_group", [
    ("colocate", "auto", False), ("share", "auto", True), ("share", "batch", False), ("share", "group", True)])
def test_step_time_dispatch_variants(placement, dispatch, per_group):
    # the classmate dispatch: the classmate awake on the one GPU (share) with its requests sent per prompt group
    # during the rollout, against the same layout sending them after the batch (one folder and JSON per variant)
    from openrlhf_classmate.integration.classmate_config import dispatch_per_group

    step_time = _bench("step_time")
    a = SimpleNamespace(prompts=32, samples=8, new_tokens=512, classmate_new_tokens=256, steps=4, micro_batch=16,
                        train_micro_batch=8, engine="vllm", enforce_eager=False, gpus=1, mismatch="on",
                        is_correction="off", placement=placement, dispatch=dispatch)
    args = parse_args(step_time.launcher_argv(a, "policy", "classmate", "d.jsonl", "/tmp/x"))
    assert args.classmate.placement == placement and args.classmate.dispatch == dispatch
    assert dispatch_per_group(args) is per_group
    assert step_time.variant(a) == ("" if dispatch == "auto" else f"_dispatch-{dispatch}")
    assert step_time.parse_cli(["--placement", "share", "--dispatch", "batch"]).dispatch == "batch"
    seeded = SimpleNamespace(**{**vars(a), "seed_requests": True})
    assert parse_args(step_time.launcher_argv(seeded, "policy", "classmate", "d.jsonl", "/tmp/x")).classmate.seed_requests
    assert not args.classmate.seed_requests and step_time.variant(seeded).endswith("_seeded")


def test_qwen_shaped_tokenizer_has_exactly_qwens_vocabulary(tmp_path):
    # the step-time models' vocabulary must match Qwen2.5-0.5B's embedding size (151,936); checked on the
    # tokenizer alone here (the 494M-parameter model itself is built on the GPU machine)
    from openrlhf_classmate.testing.e2e import WORDS
    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    step_time = _bench("step_time")
    size = step_time.QWEN25_05B["vocab_size"]
    overhead = len(build_word_tokenizer(WORDS)) - len(WORDS)
    tok = build_word_tokenizer(WORDS + [f"w{i}" for i in range(size - overhead - len(WORDS))])
    assert len(tok) == size == 151_936
    assert tok.encode("3 + 1 = ?", add_special_tokens=False) == tok.convert_tokens_to_ids(["3", "+", "1", "=", "?"])


def test_gpu_validate_sh_parses_and_refuses_unknown_steps(tmp_path):
    assert subprocess.run(["bash", "-n", os.path.join(REPO, "bench", "gpu_validate.sh")]).returncode == 0
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    res = subprocess.run(["bash", "bench/gpu_validate.sh", "nonsense"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "unknown step 'nonsense'" in res.stdout
    assert (tmp_path / "out" / "device.txt").read_text().startswith(("no GPU", "NVIDIA"))
    # a step that needs the carried vLLM refuses clearly on a machine without it
    for step in ("evaluate", "gpudemo", "capacity"):
        res = subprocess.run(["bash", "bench/gpu_validate.sh", step], cwd=REPO, capture_output=True, text=True,
                             env={**env, "VLLM_SITE": str(tmp_path / "none")}, timeout=120)
        assert res.returncode == 3 and "the machine is fresh" in res.stdout, (step, res.stdout)


def test_compile_sites_byte_compiles_the_installed_sites_and_device_txt_says_whether_imports_compile(tmp_path):
    # the bundle and the wheels install without .pyc; with PYTHONDONTWRITEBYTECODE set every process would compile
    # vLLM from source at each import (section 11's start-up)
    site = tmp_path / "site2" / "pkg"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("X = 1\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "VLLM_SITE": str(tmp_path / "none"), "WHEEL_SITE": str(tmp_path / "site2"), "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    res = subprocess.run(["bash", "bench/gpu_validate.sh", "compile-sites"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout
    assert f"{tmp_path / 'site2'}: 1 .pyc files" in res.stdout
    assert list((site / "__pycache__").glob("__init__.*.pyc"))
    device = (tmp_path / "out" / "device.txt").read_text()
    assert f"PYTHONDONTWRITEBYTECODE=1; .pyc files: {tmp_path / 'none'} 0, {tmp_path / 'site2'} 0" in device


def test_a_launcher_past_its_timeout_is_killed_with_its_whole_session(tmp_path, monkeypatch):
    import threading
    import time

    from openrlhf_classmate.testing.e2e import TIMEOUT_EXIT, kill_session, run_launcher

    # a JIT build lock left by a build the kill interrupts (made while the launcher runs), and an older one
    ext = tmp_path / "torch_extensions"
    old_lock, new_lock = ext / "py_cpu" / "cpu_adam" / "lock", ext / "py_cpu" / "fused_adam" / "lock"
    old_lock.parent.mkdir(parents=True)
    new_lock.parent.mkdir(parents=True)
    old_lock.touch()
    os.utime(old_lock, (time.time() - 3600, time.time() - 3600))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    threading.Timer(0.2, new_lock.touch).start()
    log = tmp_path / "launcher.log"
    t0 = time.time()
    assert run_launcher(["--help"], str(log), timeout=0.5) == TIMEOUT_EXIT  # still importing after 0.5 s
    assert time.time() - t0 < 40 and "killed after 0.5 s (timeout)" in log.read_text()
    # later builds of that op would wait on the killed build's lock forever: it is gone, the older one is not ours
    assert not new_lock.exists() and old_lock.exists() and f"removed the build lock {new_lock}" in log.read_text()
    # the session's other processes (Ray's, vLLM's) go too, not only its leader
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    time.sleep(0.3)
    kill_session(proc, grace=2)
    states = subprocess.run(["ps", "-o", "stat=", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert proc.poll() is not None and [s for s in states if not s.startswith("Z")] == []  # zombies: dead, unreaped


def test_interleaved_step_times_split_by_kind_with_medians_and_pairs():
    step_time = _bench("step_time")
    kinds = {s: float(s % 2) for s in range(1, 9)}  # odd steps GDPO, even GRPO
    totals = {1: 50.0, 2: 40.0, 3: 26.0, 4: 20.0, 5: 24.0, 6: 19.0, 7: 28.0, 8: 21.0}
    tb = {"train/bench/classmate_step": kinds, "train/timing/step_total": totals,
          "train/classmate/stage_time": {1: 9.0, 3: 4.5, 5: 4.4, 7: 4.7}}
    out = step_time.split_interleaved(tb)
    assert out["gdpo"]["steps"] == [3, 5, 7] and out["grpo"]["steps"] == [4, 6, 8]  # first of each kind: warm-up
    assert out["gdpo"]["stats"]["timing/step_total"] == {"median": 26.0, "min": 24.0, "max": 28.0, "n": 3}
    assert out["grpo"]["stats"]["timing/step_total"]["median"] == 20.0
    assert out["gdpo"]["stats"]["classmate/stage_time"]["median"] == 4.5
    assert "classmate/stage_time" not in out["grpo"]["stats"] or out["grpo"]["stats"]["classmate/stage_time"] is None
    assert out["ratio"] == 1.3
    # pairs: 26/20, 24/19, 28/21
    assert out["paired"] == {"median": 1.3, "min": round(24 / 19, 3), "max": round(28 / 21, 3), "n": 3}


def test_interleaved_step_times_come_from_the_launchers_step_lines(tmp_path):
    # a run stopped by its time limit keeps every step it printed (tensorboard only flushes every 120 s: the killed
    # run of the H100 call kept 3 of its 8 steps); the step lines are what upstream's controller prints per step
    step_time = _bench("step_time")
    log = tmp_path / "launcher.log"
    lines = ["(pid=1) starting", "\x1b[36m(ClassmatePPOTrainer pid=3768)\x1b[0m INFO ppo_trainer.py:551] Global step 1: "
             "{'bench/classmate_step': 1.0, 'timing/step_total': 50.0, 'classmate/stage_time': 9.0, 'kl': nan}"]
    lines += [f"(ClassmatePPOTrainer pid=3768) Global step {s}: {{'bench/classmate_step': {float(s % 2)}, "
              f"'timing/step_total': {20.0 + s}}}" for s in range(2, 9)]
    log.write_text("\n".join(lines + ["Global step 9: {'bench/classmate_step': 1.0, 'timing/step_to"]) + "\n")
    tb = step_time.launcher_step_scalars(str(log))
    assert tb["train/timing/step_total"] == {1: 50.0, **{s: 20.0 + s for s in range(2, 9)}}  # the cut line is left out
    assert tb["train/bench/classmate_step"][7] == 1.0 and tb["train/classmate/stage_time"] == {1: 9.0}
    assert "train/kl" not in tb  # a non-finite value is not a measurement
    out = step_time.split_interleaved(tb)
    assert out["gdpo"]["steps"] == [3, 5, 7] and out["grpo"]["steps"] == [4, 6, 8]
    assert out["paired"]["median"] == round(25.0 / 26.0, 3)


def test_the_step_time_target_is_tighter_on_two_gpus():
    # one GPU: the classmate stage runs between sleeping engines (1.25x); two: it overlaps the forwards
    step_time = _bench("step_time")
    assert step_time.verdict(1.15, gpus=1) == "meets the 1.25x target"
    assert step_time.verdict(1.15, gpus=2) == "misses the 1.1x target"
    assert step_time.verdict(1.08, gpus=2) == "meets the 1.1x target"


def test_an_interleaved_run_without_budget_gets_the_hard_limit():
    # the CPU check runs without --budget-s: an infinite budget once crashed the call (int(inf)) before the launcher
    from openrlhf_classmate.testing.watchdog import HARD_TIMEOUT

    step_time = _bench("step_time")
    assert step_time.interleaved_timeout(float("inf")) == int(HARD_TIMEOUT)
    assert step_time.interleaved_timeout(1200.0) == 1190  # no 600 s cap: a setsid run may outlive one device call


def test_vllm_logprobs_overhead_needs_a_real_vllm():
    # it times vLLM's own output path; under the CPU shim it says so in one line instead of failing half-way
    res = subprocess.run([sys.executable, "bench/vllm_logprobs_overhead.py", "--tokenizer", "none"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1].startswith("error: this benchmark runs vLLM")


@pytest.fixture
def changes(monkeypatch):
    """Three changes with a before path (none has one today: ``bench_switches.BEFORE_CHANGES``)."""
    from openrlhf_classmate.integration import bench_switches

    monkeypatch.setattr(bench_switches, "BEFORE_CHANGES", ("first", "second", "third"))
    return bench_switches.BEFORE_CHANGES


def _before_run() -> dict:
    """16 interleaved steps under ``--before first``: odd GDPO, even GRPO; steps 3-4, 7-8, ... on the path before
    the change (``bench/before``), GDPO steps slower there; GRPO steps take the same path twice (the control)."""
    total = {1: 40.0, 2: 30.0, 3: 41.0, 4: 31.0,
             5: 24.0, 9: 25.0, 13: 24.5, 7: 27.0, 11: 28.0, 15: 27.5,  # GDPO: after, before
             6: 20.0, 10: 20.2, 14: 20.1, 8: 20.1, 12: 20.0, 16: 20.3}  # GRPO: the same path twice
    return {"train/bench/classmate_step": {s: float(s % 2) for s in range(1, 17)},
            "train/bench/before": {s: float((s - 1) // 2 % 2) for s in range(1, 17)},
            "train/timing/step_total": total,
            "train/timing/make_experience": {s: v / 4 for s, v in total.items()},
            "train/timing/generation": {s: 10.0 for s in total}}


def test_one_change_under_the_alternation_splits_into_four_groups(capsys):
    step_time = _bench("step_time")
    out = step_time.split_interleaved(_before_run(), changes=("first",), block=2)
    before = out["paths"]["first"]
    assert out["gdpo"]["steps"] == [5, 9, 13] and before["gdpo"]["steps"] == [7, 11, 15]
    assert out["ratio"] == round(24.5 / 20.1, 3) and before["ratio"] == round(27.5 / 20.1, 3)
    ba = out["before_after"]["first"]
    assert set(ba["gdpo"]) == set(step_time.PAIR_ROWS)
    assert ba["gdpo"]["timing/step_total"]["median_diff"] == 3.0
    assert ba["gdpo"]["timing/step_total"]["pairs"] == {7: 3.0, 11: 3.0, 15: 3.0}  # 7-5, 11-9, 15-13 (3-1: warm-up)
    assert ba["grpo"]["timing/step_total"]["median_diff"] == 0.0  # the control: the same path
    assert ba["gdpo"]["timing/generation"]["median_diff"] == 0.0
    assert ba["gdpo"]["timing/ppo_train"]["after"] is None  # not logged in this run
    row = {"run": "interleaved", "exit": 0, "call": 1, **out}
    step_time.print_interleaved({"gpus": 1, "device": "cpu", "placement": "share", "batch": "b", "calls": [row]})
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "GRPO after" in line)
    assert header.split() == ["GRPO", "after", "GDPO", "after", "GRPO", "first", "GDPO", "first"]
    assert "  step total: GRPO +0.00 (pairs +0.10 [-0.20, +0.20]), GDPO +3.00 (pairs +3.00 [+3.00, +3.00])" in text
    assert "GDPO / GRPO, after steps = 1.219" in text


def _paths_run(cycles: int = 3) -> dict:
    """A GDPO-only run under ``--before first,second,third``: step 1 after, 2 first, 3 second, 4 third, 5 after, ...;
    the first change's steps 3 s slower in step total and generation, the second's 1 s slower in the classmate's own
    generation only, the third's 0.5 s slower in the actor update; the after steps drift by 0.1 s a cycle."""
    total, generation, classmate, update = {}, {}, {}, {}
    for s in range(1, 4 * cycles + 1):
        cycle, path = (s - 1) // 4, (s - 1) % 4
        drift = 0.1 * cycle + (10.0 if s <= 4 else 0.0)  # the first cycle: warm-up
        update[s] = 7.0 + (0.5 if path == 3 else 0.0)
        generation[s] = 12.0 + drift + (3.0 if path == 1 else 0.0)
        classmate[s] = 8.0 + (1.0 if path == 2 else 0.0) + (4.0 if path == 1 else 0.0)
        total[s] = generation[s] + update[s] + 2.0
    return {"train/bench/classmate_step": {s: 1.0 for s in total},
            "train/bench/before": {s: float((s - 1) % 4) for s in total},
            "train/timing/step_total": total, "train/timing/generation": generation,
            "train/timing/make_experience": {s: 2.0 for s in total}, "train/timing/ppo_train": update,
            "train/classmate/generation_time": classmate, "train/classmate/wait_time": {s: 0.2 for s in total}}


def test_several_changes_in_one_gdpo_only_run_give_a_pair_each(capsys):
    step_time = _bench("step_time")
    names = ("first", "second", "third")
    out = step_time.split_interleaved(_paths_run(), changes=names, block=1)
    assert out["changes"] == list(names) and out["grpo"]["steps"] == []
    assert out["gdpo"]["steps"] == [5, 9]  # step 1 is the after path's warm-up
    assert {c: out["paths"][c]["gdpo"]["steps"] for c in out["changes"]} == {
        "first": [6, 10], "second": [7, 11], "third": [8, 12]}
    ba = out["before_after"]
    assert all(set(ba[c]["gdpo"]) == set(step_time.PAIR_ROWS) for c in names)
    # each before step against the after step that opened its cycle: the change's own seconds, free of the drift
    assert ba["first"]["gdpo"]["timing/step_total"]["pairs"] == {6: 3.0, 10: 3.0}
    assert ba["second"]["gdpo"]["classmate/generation_time"]["pairs"] == {7: 1.0, 11: 1.0}
    assert ba["second"]["gdpo"]["timing/step_total"]["pairs"] == {7: 0.0, 11: 0.0}
    assert ba["third"]["gdpo"]["timing/ppo_train"] == {"after": 7.0, "before": 7.5, "median_diff": 0.5,
                                                      "pairs": {8: 0.5, 12: 0.5},
                                                      "paired": {"median": 0.5, "min": 0.5, "max": 0.5, "n": 2}}
    assert out["counts"] == {"first": False, "second": False, "third": False}  # 2 steady steps a path
    assert out["ratio"] is None  # no GRPO step
    counted = step_time.split_interleaved(_paths_run(cycles=9), changes=names, block=1)
    assert counted["counts"] == {"first": True, "second": True, "third": True}  # 8 steady steps a path

    row = {"run": "interleaved", "exit": 0, "call": 1, **out}
    step_time.print_interleaved({"gpus": 1, "device": "cpu", "placement": "share", "batch": "b", "calls": [row]})
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "GDPO after" in line)
    assert header.split() == ["GDPO", "after", "GDPO", "first", "GDPO", "second", "GDPO", "third"]
    assert "first: before - after (2 steady steps on the smaller side; too few to count, at least 8)" in text
    assert "  step total: GDPO +3.00 (pairs +3.00 [+3.00, +3.00])" in text
    assert "  classmate generation: GDPO +1.00 (pairs +1.00 [+1.00, +1.00])" in text
    assert "  actor update: GDPO +0.50 (pairs +0.50 [+0.50, +0.50])" in text
    assert "GDPO steps only: no GDPO / GRPO ratio in this run" in text


def test_one_change_in_a_gdpo_only_run_pairs_neighbouring_steps():
    # --runs gdpo --before first: every second step takes the before path, paired with the step before it
    step_time = _bench("step_time")
    tb = {"train/bench/classmate_step": {s: 1.0 for s in range(1, 9)},
          "train/bench/before": {s: float((s - 1) % 2) for s in range(1, 9)},
          "train/timing/step_total": {s: 20.0 + s + (1.0 if s % 2 == 0 else 0.0) for s in range(1, 9)}}
    out = step_time.split_interleaved(tb, changes=("first",), block=1)
    assert out["gdpo"]["steps"] == [3, 5, 7] and out["paths"]["first"]["gdpo"]["steps"] == [4, 6, 8]
    assert out["before_after"]["first"]["gdpo"]["timing/step_total"]["pairs"] == {4: 2.0, 6: 2.0, 8: 2.0}


def test_several_changes_reach_the_launcher_as_one_list_without_the_alternation(changes):
    step_time = _bench("step_time")
    a = step_time.parse_cli(["--interleave", "--runs", "gdpo", "--before", "first,second,third"])
    assert step_time.launcher_env(a, interleave=True) == {"OPENRLHF_CLASSMATE_BENCH_BEFORE": "first,second,third"}
    # the device tool returns only files named in letters, digits, '.', '_' and '-' (a '+' kept the first JSON back)
    assert step_time.variant(a) == "_gdpo-only_before-first-second-third"
    both = step_time.parse_cli(["--interleave", "--before", "second"])
    assert step_time.launcher_env(both, interleave=True) == {"OPENRLHF_CLASSMATE_BENCH_ALTERNATE": "1",
                                                             "OPENRLHF_CLASSMATE_BENCH_BEFORE": "second"}
    assert step_time.variant(both) == "_before-second"


@pytest.mark.parametrize("argv, message", [
    (["--before", "first"], "--before needs --interleave"),
    (["--interleave", "--before", "first,first"], "--before first,first: a comma-separated list of first, second, "
                                                  "third, each at most once"),
    (["--interleave", "--before", "prefix"], "--before prefix: a comma-separated list"),
    (["--interleave", "--runs", "gdpo"], "--interleave --runs gdpo needs --before"),
    (["--interleave", "--runs", "grpo", "--before", "first"], "--runs grpo with --interleave"),
])
def test_several_changes_misuse_is_refused(changes, capsys, argv, message):
    step_time = _bench("step_time")
    with pytest.raises(SystemExit):
        step_time.parse_cli(argv)
    assert message in capsys.readouterr().err


def test_the_recorded_pairs_are_refused(capsys):
    # the recorded pairs' before paths are gone (bench_switches): --before of any of them is refused before any run,
    # with a message that says no change has a before path today
    step_time = _bench("step_time")
    for change in ("dispatch", "weightsync", "mismatch", "tokenizer"):
        with pytest.raises(SystemExit):
            step_time.parse_cli(["--interleave", "--before", change])
        assert (f"--before {change}: a comma-separated list of no change (none has a before path today), each at most "
                "once") in capsys.readouterr().err


def _call(ratio: float, paired: float, steady: int) -> dict:
    """One interleaved call's row as ``interleaved_call`` keeps it: ``steady`` steady steps of each kind."""
    return {"run": "interleaved", "exit": 124, "partial": True, "ratio": ratio, "paired": {"median": paired},
            "gdpo": {"steps": list(range(3, 3 + 2 * steady, 2))}, "grpo": {"steps": list(range(4, 4 + 2 * steady, 2))}}


def test_calls_count_only_with_eight_steady_steps_and_agree_within_005():
    # 2026-11-28, one H100: two 10-minute calls logged 2-3 and 5 steady steps of each kind, ratios 0.993 and 1.063:
    # neither is a figure (a figure needs at least 8 steady steps each), and 0.07 apart they would not agree either
    step_time = _bench("step_time")
    short = step_time.combine_calls([_call(0.993, 1.037, 2), _call(1.063, 1.036, 5)])
    assert short["steady_steps"] == [2, 5] and short["ratios"] == [] and "calls_agree" not in short
    assert short["all_ratios"] == [0.993, 1.063]
    two = step_time.combine_calls([_call(1.10, 1.08, 8), _call(1.06, 1.07, 16), _call(1.30, 1.2, 3)])
    assert two["ratios"] == [1.10, 1.06] and two["paired_ratios"] == [1.08, 1.07]
    assert two["call_spread"] == 0.04 and two["calls_agree"] is True
    apart = step_time.combine_calls([_call(1.10, 1.08, 8), _call(1.04, 1.07, 9)])
    assert apart["call_spread"] == 0.06 and apart["calls_agree"] is False  # |1.10 - 1.04| > 0.05
    failed = step_time.combine_calls([{"run": "interleaved", "exit": 1, "log": "x"}, _call(1.1, 1.1, 8)])
    assert failed["steady_steps"] == [0, 8] and failed["ratios"] == [1.1] and "call_spread" not in failed


def test_a_call_with_too_few_steady_steps_is_not_given_a_verdict(capsys):
    step_time = _bench("step_time")
    out = step_time.split_interleaved({"train/bench/classmate_step": {s: float(s % 2) for s in range(1, 9)},
                                       "train/timing/step_total": {s: 20.0 + s % 2 for s in range(1, 9)}})
    row = {"run": "interleaved", "exit": 0, "call": 1, **out}
    result = {"gpus": 1, "device": "cpu", "placement": "share", "batch": "b", "calls": [row],
              **step_time.combine_calls([row])}
    step_time.print_interleaved(result)
    text = capsys.readouterr().out
    assert "3 steady steps of each kind (GDPO 3, GRPO 3): too few to count (at least 8)" in text
    assert "meets the" not in text and "misses the" not in text


def test_the_time_outside_the_steps_is_what_the_plan_must_leave():
    # call 2 of 2026-11-28: 528 s of wall time, 12 logged steps of ~24 s: ~212 s of start-up and the cut step
    step_time = _bench("step_time")
    tb = {"train/timing/step_total": {s: 24.0 for s in range(1, 13)}}
    assert step_time.time_outside_steps(528.2, tb) == 240.2
    assert step_time.time_outside_steps(90.0, {}) == 90.0  # no step logged: all of it


def test_the_log_prob_benchmarks_time_the_launchers_own_request(monkeypatch):
    # bench/vllm_logprobs_overhead.py and bench/vllm_generation_logprobs.py name the launcher's request by hand
    # (VARIANTS["mismatch"]); a change of the request in integration/rollout/mismatch.py must show here, not go unmeasured
    import vllm

    from openrlhf_classmate.integration.rollout import mismatch

    seen = {}

    class Capture:  # stands in for SamplingParams: the keywords the launcher's builder sends
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(vllm, "SamplingParams", Capture)
    args = SimpleNamespace(train=SimpleNamespace(agent_func_path=None), engine=SimpleNamespace(backend="vllm"))
    mismatch.rollout_sampling_params(args)(temperature=1.0, top_p=1.0, logprobs=1)  # upstream's, IS correction on
    sent = {k: v for k, v in seen.items() if k not in ("temperature", "top_p")}
    sent["output_kind"] = sent["output_kind"].name
    variants = _bench("vllm_logprobs_overhead").VARIANTS
    assert variants["mismatch"] == sent
    assert variants["mismatch_noflat"] == {k: v for k, v in sent.items() if k != "flat_logprobs"}


def test_calls_of_an_earlier_machine_count_with_this_one():
    # one device session holds one 28-step call (~17 min of a 30-minute budget), so the second call of the +-0.05
    # rule runs on the next session's fresh machine: --previous names the committed JSON of the first
    step_time = _bench("step_time")
    path = os.path.join(REPO, "bench", "gpu_results", "wave7", "step_time_1gpu_interleaved_share.json")
    first = json.load(open(path))
    assert first["ratios"] == [1.053] and first["steady_steps"] == [13]  # 2026-11-28, one H100, 28 steps
    # (a setting added since, gdpo_only, has its default: the JSON's calls alternated the kinds)
    here = {k: first.get(k, step_time.SETTING_DEFAULTS.get(k)) for k in step_time.CALL_SETTINGS}
    assert "gdpo_only" not in first and here["gdpo_only"] is False
    calls = step_time.earlier_calls(here, None, first, path)
    assert calls == first["calls"]
    second = _call(1.071, 1.05, 13)
    combined = step_time.combine_calls(calls + [second])
    assert combined["ratios"] == [1.053, 1.071] and combined["call_spread"] == 0.018 and combined["calls_agree"]
    # a second call on the same warm machine: its state already holds the first machine's call, counted once
    state = {**here, "calls": calls + [second]}
    assert step_time.earlier_calls(here, state, first, path) == calls + [second]
    # the machine's own calls without the earlier one (a state from before --previous): both, the earlier first
    assert step_time.earlier_calls(here, {**here, "calls": [second]}, first, path) == calls + [second]


def test_the_committed_two_call_step_time_follows_from_its_steps():
    # the step-time figure (GDPO / GRPO 1.053 and 1.072, two H100s, 2026-11-28): each call's ratio is the ratio
    # of the median step totals of its steady steps, recomputed here from the per-step seconds the JSON keeps
    step_time = _bench("step_time")
    path = os.path.join(REPO, "bench", "gpu_results", "wave8", "step_time_1gpu_interleaved_share.json")
    result = json.load(open(path))
    assert result["previous"].endswith("wave7/step_time_1gpu_interleaved_share.json")
    ratios = []
    for call in result["calls"]:
        totals = {kind: sorted(call[kind]["per_step"]["timing/step_total"].values()) for kind in ("gdpo", "grpo")}
        assert [len(v) for v in totals.values()] == [13, 13]
        ratios.append(round(totals["gdpo"][6] / totals["grpo"][6], 3))  # the median of 13
    assert ratios == [1.053, 1.072]
    combined = step_time.combine_calls(result["calls"])
    assert combined == {k: result[k] for k in combined}
    assert combined["ratios"] == ratios and combined["call_spread"] == 0.019 and combined["calls_agree"]


def test_the_committed_before_after_pairs_follow_from_their_steps():
    # the classmate stage's three before/after pairs (one H200, 2026-11-28, 36 GDPO steps cycling after, dispatch,
    # seeds, syncs): each
    # figure is recomputed here from the per-step seconds the JSON keeps, the medians and each before step against
    # the after step that opened its cycle (1, 2 or 3 steps earlier)
    path = os.path.join(REPO, "bench", "gpu_results", "wave9",
                        "step_time_1gpu_interleaved_share_gdpo-only_before-dispatch-seeds-syncs.json")
    call = json.load(open(path))["calls"][0]
    assert call["changes"] == ["dispatch", "seeds", "syncs"]
    after = {tag: {int(s): v for s, v in per.items()} for tag, per in call["gdpo"]["per_step"].items()}
    assert sorted(after["timing/step_total"]) == [5, 9, 13, 17, 21, 25, 29, 33]
    figures = {}
    for change, tag in [("dispatch", "timing/make_experience"), ("dispatch", "timing/step_total"),
                        ("dispatch", "classmate/wait_time"), ("seeds", "classmate/wait_time"),
                        ("seeds", "timing/step_total"), ("syncs", "timing/ppo_train")]:
        gap = call["changes"].index(change) + 1  # one step per block: no GRPO steps in this run
        before = {int(s): v for s, v in call["paths"][change]["gdpo"]["per_step"][tag].items()}
        assert len(before) == 8 and all((s - gap) in after[tag] for s in before)
        pairs = [before[s] - after[tag][s - gap] for s in sorted(before)]
        figures[change, tag] = (round(statistics.median(before.values()) - statistics.median(after[tag].values()), 2),
                                round(statistics.median(pairs), 2), round(min(pairs), 2), round(max(pairs), 2))
    assert figures == {
        ("dispatch", "timing/make_experience"): (1.99, 1.75, 0.93, 2.35),  # all 8 pairs slower before: it counts
        ("dispatch", "timing/step_total"): (2.03, 1.81, -1.97, 3.47),
        ("dispatch", "classmate/wait_time"): (0.92, 0.87, 0.18, 1.33),
        ("seeds", "classmate/wait_time"): (0.08, 0.05, -0.04, 0.16),
        ("seeds", "timing/step_total"): (0.48, 0.48, -3.87, 1.71),
        ("syncs", "timing/ppo_train"): (0.55, 0.76, -2.0, 2.21),
    }
    assert call["counts"] == {"dispatch": True, "seeds": True, "syncs": True}


def test_an_earlier_call_of_other_settings_is_refused_before_the_run():
    step_time = _bench("step_time")
    path = os.path.join(REPO, "bench", "gpu_results", "wave7", "step_time_1gpu_interleaved_share.json")
    first = json.load(open(path))
    here = {**{k: first.get(k, step_time.SETTING_DEFAULTS.get(k)) for k in step_time.CALL_SETTINGS},
            "device": "1 x NVIDIA H200", "placement": "colocate"}
    with pytest.raises(SystemExit, match=r"other settings \(device '1 x NVIDIA H100 80GB HBM3' there, "
                                         r"'1 x NVIDIA H200' here, placement 'share' there, 'colocate' here\)"):
        step_time.earlier_calls(here, None, first, path)
    # a machine's own state of other settings is simply not counted (as before)
    assert step_time.earlier_calls(here, {**first}, None) == []


@pytest.mark.parametrize("argv, message", [
    (["--previous", "bench/gpu_results/wave7/step_time_1gpu_interleaved_share.json"], "--previous needs --interleave"),
    (["--interleave", "--previous", "no/such.json"], "--previous no/such.json: no such file"),
])
def test_previous_misuse_is_refused(capsys, argv, message):
    step_time = _bench("step_time")
    with pytest.raises(SystemExit):
        step_time.parse_cli(argv)
    assert message in capsys.readouterr().err


def test_the_script_refuses_an_earlier_call_of_another_card_before_the_launcher(tmp_path):
    # the real script on CPU: tiny models are built (seconds), then the H100 JSON is refused in one line, no run
    res = subprocess.run([sys.executable, "bench/step_time.py", "--tiny", "--engine", "hf", "--interleave", "--previous",
                          "bench/gpu_results/wave7/step_time_1gpu_interleaved_share.json", "--placement", "share",
                          "--models", str(tmp_path / "models"), "--work", str(tmp_path / "work"), "--out",
                          str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 1, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --previous bench/gpu_results/wave7/step_time_1gpu_interleaved_share.json: other "
                           "settings (device '1 x NVIDIA H100 80GB HBM3' there, 'cpu' here, models"), last
    assert not (tmp_path / "work" / "interleaved_1gpu").exists()  # no launcher run was started


# ── bench/capacity.py: what fits where ──

@pytest.fixture(scope="module")
def capacity():
    return _bench("capacity")


def test_every_capacity_cell_parses_with_the_gpus_it_names(capacity, gpu_validate):
    # the whole grid (3 policies x 2 classmates x 2 lengths x 1-2 GPUs), each cell's launch passing the
    # launcher's own checks (upstream's batch arithmetic, the placement's bundles, the engines' memory sum)
    assert len(capacity.GRID) == len(set(capacity.GRID)) == 24 and set(capacity.ORDER) <= set(capacity.GRID)
    for name in capacity.GRID:
        cell = capacity.parse_cell(name)
        plan = capacity.plan(cell, 140.0)
        args = parse_args(capacity.launcher_argv(cell, plan, "policy", "classmate", "d.jsonl", "/tmp/x", "vllm",
                                                 2, 256, False))
        assert gpu_validate.gpus_needed(args) == cell.gpus, name  # every model colocated on the cell's GPUs
        assert args.train.colocate_all and args.classmate.placement == "share", name
        assert args.vllm.num_engines == args.classmate.num_engines == cell.gpus, name
        assert args.rollout.max_new_tokens == cell.response and args.data.max_len > cell.response
        assert args.ds.zero_stage == (3 if cell.gpus == 2 else 2), name
        assert args.vllm.gpu_memory_utilization + args.classmate.gpu_memory_utilization < 1
        # per GPU: 16 responses, a whole number of micro-batches per optimizer step
        assert args.train.batch_size // cell.gpus == 16
        assert args.train.batch_size % (args.train.micro_batch_size * cell.gpus) == 0
        assert args.ds.adam_offload == plan.adam_offload and args.ds.enable_sleep == plan.ds_sleep


def test_capacity_shapes_are_qwen25s_parameter_counts(capacity):
    # the parameter formula the memory plan uses, against the published sizes (Qwen2.5 adds q/k/v biases: +0.1%)
    counts = {name: capacity.params(shape) / 1e9 for name, shape in capacity.SHAPES.items()}
    assert counts == pytest.approx({"0.5b": 0.494, "1.5b": 1.543, "3b": 3.086, "7b": 7.615}, abs=0.002)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    for name in ("0.5b", "7b"):  # tied LM head (step_time.build_model's default) and untied (7B)
        small = dict(capacity.SHAPES[name], num_hidden_layers=2, vocab_size=1000)
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**{"tie_word_embeddings": True, **small}))
        assert capacity.params(small) == sum(p.numel() for p in model.parameters()), name


def test_capacity_plan_offloads_adam_only_where_the_training_state_cannot_fit(capacity):
    cell = capacity.parse_cell
    one_7b = capacity.plan(cell("7b+1.5b/2k/1gpu"), 140.0)
    assert one_7b.adam_offload and one_7b.zero == 2  # 16 B/param x 7.6B = 114 GiB + reference: no room on one GPU
    two_7b = capacity.plan(cell("7b+1.5b/2k/2gpu"), 140.0)
    assert not two_7b.adam_offload and two_7b.zero == 3  # ZeRO-3 halves it
    assert not capacity.plan(cell("1.5b+0.5b/8k/1gpu"), 140.0).adam_offload
    # an 80 GB card: the training state fits, not beside the engines (DeepSpeed's states leave the GPU while they
    # generate); a 64 GB one: Adam's states go to the CPU
    on_80 = capacity.plan(cell("7b+1.5b/2k/2gpu"), 80.0)
    assert on_80.ds_sleep and not on_80.adam_offload
    assert capacity.plan(cell("7b+1.5b/2k/2gpu"), 64.0).adam_offload
    # longer responses: smaller micro-batches, a larger KV cache for the engines
    short, long = capacity.plan(cell("3b+0.5b/2k/1gpu"), 140.0), capacity.plan(cell("3b+0.5b/8k/1gpu"), 140.0)
    assert (short.train_micro, long.train_micro) == (2, 1) and long.policy_util > short.policy_util
    assert "Adam offload" in one_7b.summary() and "ZeRO-3" in two_7b.summary()


def test_capacity_cell_names_are_checked_in_one_line(capacity, capsys):
    with pytest.raises(SystemExit):
        capacity.main(["--cells", "7b+1.5b/4k/2gpu", "--list"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'7b+1.5b/4k/2gpu' is not a cell" in err and "e.g. 7b+1.5b/2k/2gpu" in err


@pytest.mark.parametrize("log, outcome, stage", [
    ("Traceback (most recent call last):\n  File \"vllm/v1/worker/gpu_worker.py\", in determine_available_memory\n"
     "ValueError: Free memory on device (20.1/139.8 GiB) on startup is less than desired GPU memory utilization "
     "(0.3, 41.9 GiB)", "OOM", "engine start"),
    ("  File \"openrlhf/trainer/ray/ppo_actor.py\", line 120, in ppo_train\n  File \"deepspeed/runtime/engine.py\", "
     "in backward\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.23 GiB", "OOM", "actor update"),
    ("  File \"openrlhf_classmate/integration/experience/experience_maker.py\", in make_experience_batch\n  File \"x.py\", in "
     "forward\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB", "OOM", "actor/ref forwards"),
    ("  File \"transformers/modeling_utils.py\", in from_pretrained\ntorch.OutOfMemoryError: CUDA out of memory",
     "OOM", "model load"),
    ("Global step 1: {}\n[watchdog] killed after 600 s without output\n", "timeout", None),
    ("Traceback (most recent call last):\n  File \"a.py\", in generate\nRuntimeError: NCCL error", "error", "rollout"),
])
def test_capacity_names_what_ran_out_and_where(capacity, log, outcome, stage):
    assert capacity.failure(log) == (outcome, stage)


def test_capacity_tells_host_memory_from_gpu_memory_and_a_refusal_from_a_crash(capacity):
    # the 7B one-GPU cell of 2026-11-29: vLLM's engines had started (their lines come first), then Ray's memory
    # monitor killed the actor while DeepSpeed built its CPU optimizer; the stage is the killed task's, not the
    # engines' start-up lines before it
    import gzip

    with gzip.open(os.path.join(REPO, "bench/gpu_results/wave15/capacity/7b_p_1.5b_2k_1gpu.log.gz"), "rt") as f:
        log = f.read()
    assert "determine_available_memory" in log or "gpu_memory_utilization" in log  # the engines' lines are there
    assert capacity.failure(log) == ("host OOM", "model load")
    refused = "[openrlhf_classmate] --engine.backend vllm\nerror: host memory: --ds.adam_offload: ... 127.7 GiB\n"
    assert capacity.failure(refused) == ("refused", None)
    row = capacity.read_log(capacity.parse_cell("7b+1.5b/2k/1gpu"), refused, steps=2)
    assert row["outcome"] == "refused" and row["reason"] == "error: host memory: --ds.adam_offload: ... 127.7 GiB"
    # the launcher's own one line for the same kill (no traceback since): still a host OOM, not a refusal
    started = "2026-11-29 12:05:40,1\tINFO worker.py:2012 -- Started a local Ray instance.\n"
    one_line = (started + "error: Ray's memory monitor killed ClassmatePolicyModelActor.__init__ (process 2341, 89.22 "
                "GiB) with its node's memory at 123.66 / 125.87 GiB, above its threshold 0.95: ...\n")
    assert capacity.failure(one_line) == ("host OOM", "model load")
    # the watchdog's stop, which the launcher now ends in one SIGTERM line: a timeout, not a refusal
    stopped = (started + "[watchdog] killed after 900 s (timeout)\nerror: the run received SIGTERM (a scheduler's "
               "preemption, kill or timeout) and stopped.\n")
    assert capacity.failure(stopped) == ("timeout", None)


def test_the_launcher_refuses_exactly_the_7b_one_gpu_cells_on_the_h200_node(capacity):
    # the grid's plans against the lent machine's 125.87 GiB (Ray's 0.95 of it): the 7B policy on one GPU needs Adam
    # offload, whose 113.5 GiB of CPU state does not fit beside the sleeping engine's weights; every other cell does
    from openrlhf_classmate.integration.launch.host_memory import host_memory_problem

    refused = []
    for name in capacity.GRID:
        cell = capacity.parse_cell(name)
        args = parse_args(capacity.launcher_argv(cell, capacity.plan(cell, 140.0), "policy", "classmate", "d.jsonl",
                                                 "/tmp/x", "vllm", 2, 256, False))
        params = {"policy": capacity.params(capacity.SHAPES[cell.policy]),
                  "classmate": capacity.params(capacity.SHAPES[cell.classmate])}
        if host_memory_problem(args, params, int(125.87 * 2**30), env={})[0]:
            refused.append(name)
    assert sorted(refused) == ["7b+0.5b/2k/1gpu", "7b+0.5b/8k/1gpu", "7b+1.5b/2k/1gpu", "7b+1.5b/8k/1gpu"]


def test_capacity_rows_come_from_the_launcher_log(capacity):
    cell = capacity.parse_cell("1.5b+0.5b/2k/1gpu")
    lines = ["INFO ppo_trainer.py:551] ✨ Global step 1: {'timing/step_total': 60.5, 'response_length': 2048.0}",
             "(EngineCore) INFO gpu_worker.py:221] Sleep mode freed 14.23 GiB memory, 59.52 GiB memory is still in use.",
             "INFO ppo_trainer.py:551] ✨ Global step 2: {'timing/step_total': 64.0, 'response_length': 1024.0, "
             "'timing/generation': 50.4}",
             "(EngineCore) INFO gpu_worker.py:221] Sleep mode freed 14.21 GiB memory, 71.26 GiB memory is still in use."]
    row = capacity.read_log(cell, "\n".join(lines), steps=2)
    assert row["outcome"] == "runs" and row["step_s"] == 64.0 and row["step_s_all"] == [60.5, 64.0]
    assert row["tokens_per_s_per_gpu"] == round(1024 * 16 / 64.0) and row["vllm_in_use_gib"] == 71.26
    assert row["parts"]["timing/generation"] == 50.4
    short = capacity.read_log(cell, lines[0] + "\ntorch.OutOfMemoryError: CUDA out of memory (in backward)", steps=2)
    assert (short["outcome"], short["stage"], short["steps_logged"]) == ("OOM", "actor update", [1])


def test_a_failing_gpu_cleanup_does_not_raise(capacity, monkeypatch):
    # the first device call lost two measured cells: memory still held after the stop, then `ray stop` run as a
    # command that a pip --target install of Ray does not put on PATH (FileNotFoundError)
    monkeypatch.setattr(capacity.MemorySampler, "used", staticmethod(lambda: {0: 50.0}))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = []

    def run(cmd, **kwargs):
        # found as the real call would be, but not run: `ray stop --force` kills every Ray process of the machine,
        # the clusters of tests running next to this one included
        calls.append(cmd)
        if shutil.which(cmd[0]) is None:
            raise FileNotFoundError(cmd[0])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(capacity.subprocess, "run", run)
    assert capacity.wait_for_free_gpus(limit_s=3) == {0: 50.0}  # (ray stop is tried after half the time)
    assert calls == [[sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"]]


def test_a_run_on_its_own_gpus_reads_only_their_memory_and_never_stops_ray(capacity, monkeypatch):
    # runs side by side on one host (CUDA_VISIBLE_DEVICES each): a run reads its own GPUs' memory, and waiting for
    # them to empty never calls `ray stop`, which would stop the other runs' clusters
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        csv = "0, 81920\n1, 40960\n2, 1024\n3, 102400\n"  # nvidia-smi --query-gpu=index,memory.used (MiB)
        return subprocess.CompletedProcess(cmd, 0, stdout=csv if cmd[0] == "nvidia-smi" else "")

    monkeypatch.setattr(capacity.subprocess, "run", run)
    assert capacity.visible_gpus() == {2, 3}
    assert capacity.MemorySampler.used() == {2: 1.0, 3: 100.0}
    assert capacity.wait_for_free_gpus(limit_s=3) == {2: 1.0, 3: 100.0}
    assert all(cmd[0] == "nvidia-smi" for cmd in calls)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f")  # UUIDs: no index to match, every GPU is read
    assert capacity.visible_gpus() is None and len(capacity.MemorySampler.used()) == 4


def test_a_cell_row_is_on_disk_before_the_wait_for_the_gpus(capacity, monkeypatch, tmp_path):
    # a device call copied capacity.json while the cells were still waiting for their GPUs to empty (up to 90 s):
    # the three measured rows were not in it. Now each row is written, then the wait runs, then the row again.
    seen = []

    def measure(cell, a, models, data, gpu_gib, timeout):
        return {**capacity.cell_row(cell, capacity.plan(cell, gpu_gib)), "outcome": "runs", "step_s": 38.6}

    def clean_up():
        on_disk = json.load(open(tmp_path / "out" / "capacity.json"))
        seen.append([row["cell"] for row in on_disk["cells"]])
        return {"after_gib": {0: 0.5}}

    monkeypatch.setattr(capacity, "measure", measure)
    monkeypatch.setattr(capacity, "clean_up", clean_up)
    monkeypatch.setattr(capacity, "build_model", lambda path, shape, seed: path)
    monkeypatch.setattr(sys, "argv", ["capacity.py", "--tiny", "--engine", "hf", "--cells",
                                      "1.5b+0.5b/2k/1gpu,3b+0.5b/2k/1gpu", "--out", str(tmp_path / "out"),
                                      "--work", str(tmp_path / "work"), "--models", str(tmp_path / "models")])
    capacity.main()
    assert seen == [["1.5b+0.5b/2k/1gpu"], ["1.5b+0.5b/2k/1gpu", "3b+0.5b/2k/1gpu"]]
    final = json.load(open(tmp_path / "out" / "capacity.json"))["cells"]
    assert [row["after_gib"] for row in final] == [{"0": 0.5}, {"0": 0.5}]


@pytest.mark.parametrize("folder, logs", [
    ("wave10", {"7b+1.5b/2k/2gpu": "cap_7b-1.5b_2k_2gpu.log.gz", "1.5b+0.5b/2k/1gpu": "cap_1.5b-0.5b_2k_1gpu.log.gz"}),
    ("wave16/capacity", {c: c.replace("+", "_p_").replace("/", "_") + ".log.gz"  # CUDA graphs, 8k tokens
                         for c in ("1.5b+1.5b/8k/1gpu", "3b+0.5b/8k/1gpu", "3b+1.5b/8k/1gpu")}),
])
def test_the_committed_capacity_rows_are_what_their_logs_say(capacity, folder, logs):
    wave = os.path.join(REPO, "bench", "gpu_results", *folder.split("/"))
    committed = json.load(open(os.path.join(wave, "capacity.json")))
    rebuilt = capacity.rows_from_logs([f"{c}={os.path.join(wave, f)}" for c, f in logs.items()], 2,
                                      committed["gpu_gib"])
    for row, again in zip(committed["cells"], rebuilt, strict=True):
        assert row["outcome"] == again["outcome"] == "runs"
        # every figure the log holds (the peak memory came from the sampler, not the log)
        read = {k: v or None for k, v in again.items() if k not in ("from_log", "peak_gib", "log_tail")}
        assert {k: row.get(k) or None for k in read} == read  # None or {}: a figure the older rows did not have


def test_the_report_prints_the_committed_capacity_and_validation_tables(capsys):
    # bench/gpu_report.py over a committed results folder: the capacity cells through the capacity script's own table
    _bench("gpu_report").main(os.path.join(REPO, "bench", "gpu_results", "wave10"))
    out = capsys.readouterr().out
    assert "| 7b | 1.5b | 2k | 2 | runs | - | 114 | 63.3 | 518 |" in out
    assert "| zero3_gdpo_colocate_2gpu (ZeRO-3, gdpo, 2 GPU) |" in out and "not a known result file" not in out


def test_the_prepared_policy_check_runs_its_transformers_half_on_cpu(tmp_path):
    # bench/gpu_prepared_policy.py (the `prepared` GPU step): both cases prepared, each tag one id in the written
    # folder (the resized Llama table and the Qwen2 table's spare rows); the vLLM half needs a GPU
    res = subprocess.run([sys.executable, "bench/gpu_prepared_policy.py", "--hf-only", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.load(open(tmp_path / "prepared_policy_vllm.json"))
    rows = {r["case"]: r for r in result["cases"]}
    assert result["ok"] and result["hf_only"] and set(rows) == {"llama_untied_resized", "qwen2_tied_spare_rows"}
    resized, spare = rows["llama_untied_resized"], rows["qwen2_tied_spare_rows"]
    assert resized["vocab_rows"] == resized["tokenizer_len"]  # two rows added for the two tags
    assert spare["vocab_rows"] == spare["tokenizer_len"] + 22  # two of the 24 spare rows taken
    for r in rows.values():
        assert sorted(ids[0] for ids in r["hf_tags"].values()) == [r["tokenizer_len"] - 2, r["tokenizer_len"] - 1]


def test_the_rollout_against_the_engine_alone_is_tokens_per_engine_over_the_standalone_rate(tmp_path, monkeypatch,
                                                                                          capsys):
    # --standalone: after the run, bench/vllm_generation_logprobs.py times the policy engine alone on each engine's
    # share of the batch; the ratio is the rollout phase's tokens/s per engine over the engine's own
    step_time = _bench("step_time")
    a = step_time.parse_cli(["--gpus", "2", "--prompts", "64", "--interleave", "--standalone", "--work",
                             str(tmp_path), "--models", str(tmp_path / "models")])
    seen = {}

    def run(cmd, timeout):
        seen["cmd"] = cmd
        out = cmd[cmd.index("--out") + 1]
        json.dump({"variants": {"upstream": {"tokens_per_s": 26_000}, "mismatch": {"tokens_per_s": 17_000}}},
                  open(out, "w"))

    monkeypatch.setattr(step_time, "run_group", run)  # the real one: test_the_standalone_engine_is_killed_...
    row = {"response_length": 512.0, "grpo": {"stats": {"timing/generation": {"median": 10.24}}},
           "gdpo": {"stats": {"timing/generation": {"median": 12.8}}}}
    got = step_time.standalone(a, row, 300)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--requests") + 1] == "256" and cmd[cmd.index("--tokens") + 1] == "512"  # per engine
    # 256 x 512 tokens per engine in 10.24 s = 12,800 tokens/s, against 26,000 alone
    assert got["rollout_vs_standalone"] == {"grpo": round(12_800 / 26_000, 3), "gdpo": round(10_240 / 26_000, 3)}
    # the script wrote its JSON, then hung in vLLM's shutdown past the budget (a fresh H200, 2026-11-29): the
    # figures count; a run that timed out before writing leaves no ratio, not the previous call's file's
    def hung(cmd, timeout):
        run(cmd, timeout)
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(step_time, "run_group", hung)
    assert step_time.standalone(a, row, 300)["rollout_vs_standalone"] == got["rollout_vs_standalone"]

    def timed_out(cmd, timeout):
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(step_time, "run_group", timed_out)
    assert "rollout_vs_standalone" not in step_time.standalone(a, row, 300)
    assert "TimeoutExpired" in step_time.standalone(a, row, 300)["standalone"]["error"]
    for argv in (["--standalone"], ["--interleave", "--standalone", "--tiny"]):
        with pytest.raises(SystemExit):
            step_time.parse_cli(argv)
        assert "--standalone compares an interleaved run's rollout with a real vLLM engine" in capsys.readouterr().err


def test_the_fault_runs_refuse_an_unknown_scenario_before_any_run():
    res = subprocess.run([sys.executable, "bench/faults.py", "--scenarios", "rank-killed,disk-full"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 2 and "--scenarios: unknown ['disk-full']; known: rank-killed, sigterm-in-save" in res.stderr


def test_the_standalone_engine_is_killed_with_its_children(tmp_path):
    """``step_time.run_group``: a timed-out command's children die with it (vLLM's EngineCore outlived its killed
    parent on the GPU and held the device call open past its limit), and a short budget skips the run in one line."""
    step_time = _bench("step_time")
    pid_file = tmp_path / "child.pid"
    # the parent starts a child that would outlive it (as vLLM's EngineCore does), then hangs
    cmd = [sys.executable, "-c", "import subprocess, sys, time; "
           "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"]
    with pytest.raises(subprocess.TimeoutExpired):
        step_time.run_group(cmd, timeout=3)
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child {child} outlived the timed-out command")
    with pytest.raises(subprocess.CalledProcessError):
        step_time.run_group([sys.executable, "-c", "raise SystemExit(3)"], timeout=30)
    a = SimpleNamespace(work=str(tmp_path), prompts=16, samples=8, gpus=1, new_tokens=512, models=str(tmp_path))
    assert step_time.standalone(a, {}, left_s=41.9) == {
        "standalone": {"skipped": f"42 s left, ~{step_time.STANDALONE_ESTIMATE_S} s needed"}}


def test_launcher_profile_times_the_launchers_check_its_socket_lookups_and_imports(tmp_path):
    # bench/launcher_profile.py: where the launcher's ~20 s before Ray go on the GPU machine (GPU_RESULTS section 12);
    # --imports: the same in fresh processes, where cProfile's process had imported first (section 13)
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "launcher_profile.py"), "--out", str(tmp_path),
                          "--backend", "hf", "--imports", "--modules", "json,no_such_module_here"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.load(open(tmp_path / "launcher_profile.json"))
    assert result["error"] is None and result["main_s"] > 0 and result["lookups"] == []
    top = result["cumulative"][0]
    assert "openrlhf_classmate/cli/train_ppo_ray.py:" in top["function"] and top["function"].endswith(" main")
    assert top["cumulative_s"] == pytest.approx(result["main_s"], rel=0.2)
    assert "check passed: the run would start" in out.stdout
    imports = result["imports"]
    assert imports["bare_s"] > 0 and all(s > 0 for s in imports["modules"]["json"]["s"])
    assert imports["modules"]["json"]["error"] is None
    assert {r["package"]: r["s"] for r in imports["modules"]["json"]["packages"]}["json"] > 0
    assert "No module named 'no_such_module_here'" in imports["modules"]["no_such_module_here"]["error"]
    assert imports["cuda_start"]["devices"] >= 0 and imports["cuda_start"]["s"] >= 0
    check = imports["check"]
    assert check["error"] is None and 0 < check["import_s"] < check["process_s"]
    packages = {r["package"]: r for r in check["packages"]}
    assert packages["openrlhf_classmate"]["s"] > 0 and "torch" in packages  # torch's own time, imported from inside


IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:    100000 |     100000 | _frozen_importlib_external
import time:    174000 |     174000 |       _json
import time:    565000 |     739000 |     json.scanner
import time:    405000 |    1144000 |   json.decoder
import time:    240000 |    1384000 | json
import time:    300000 |     300000 |     json.tool
import time:   2000000 |    2000000 |   numpy.core
import time:   1000000 |    3300000 | torch
import time:      7000 |       7000 | json.tool
"""


def test_importtime_lines_are_summed_per_top_level_package():
    total, rows = _bench("launcher_profile").importtime_by_package(IMPORTTIME)
    # outermost imports: _frozen... 0.1 s, json 1.384 + 0.007 s, torch 3.3 s (numpy's and json.tool's time inside it);
    # own: each line's first column, wherever it sits
    assert total == 4.791
    assert rows == [{"package": "torch", "s": 3.3, "own_s": 1.0}, {"package": "numpy", "s": 0.0, "own_s": 2.0},
                    {"package": "json", "s": 1.391, "own_s": 1.517}, {"package": "_json", "s": 0.0, "own_s": 0.174},
                    {"package": "_frozen_importlib_external", "s": 0.1, "own_s": 0.1}]


def test_the_cuda_probe_reads_its_own_last_line():
    profile = _bench("launcher_profile")
    assert profile.cuda_start("a banner a library printed\n1 2.50049\n") == {"devices": 1, "s": 2.5}
    with pytest.raises(ValueError):
        profile.cuda_start("")


def test_a_timed_out_or_failing_process_is_an_error_not_a_crash():
    profile = _bench("launcher_profile")
    late = profile.timed_process(["-c", "import time; time.sleep(5)"], timeout_s=0.5)
    assert late["s"] is None and late["error"] == "over 0 s" and late["stdout"] == late["stderr"] == ""
    failed = profile.timed_process(["-X", "importtime", "-c", "import json; raise SystemExit('no GPU here')"])
    assert failed["error"] == "no GPU here" and failed["s"] > 0
    assert profile.importtime_by_package(late["stderr"]) == (0, [])


def test_launcher_profile_counts_a_connection_and_its_lookup_once():
    import socket

    profile = _bench("launcher_profile")
    saved = {name: getattr(socket, name) for name in profile.LOOKUPS}
    server = socket.create_server(("127.0.0.1", 0))
    record: list[dict] = []
    try:
        profile.watch_sockets(record)
        socket.create_connection(("localhost", server.getsockname()[1]), timeout=5).close()
        socket.getaddrinfo("127.0.0.1", 80)
    finally:
        for name, original in saved.items():
            setattr(socket, name, original)
        server.close()
    assert [r["call"] for r in record] == ["create_connection", "getaddrinfo"]  # the inner lookup is the outer's
    assert all(0 <= r["s"] < 5 for r in record)


def test_the_seeds_table_reads_each_summary_and_gives_the_mean_and_range(tmp_path, capsys, monkeypatch):
    # bench/gpu_demo_seeds.py: the committed seed 0 as it is, and two copies standing in for seeds 1 and 2
    # with other accuracies and a failed check, so the mean, the range and the failed check are known by hand
    seeds = _bench("gpu_demo_seeds")
    seed0 = os.path.join(REPO, "bench", "gpu_results", "gpu_demo")
    with open(os.path.join(seed0, "summary.json")) as f:
        summary = json.load(f)

    def write(name: str, changed: dict) -> str:
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "summary.json", "w") as f:
            json.dump(changed, f)
        return str(tmp_path / name)

    folders = [seed0]
    for seed, gdpo_classmate, grpo_classmate in ((1, 0.90, 0.50), (2, 0.80, 0.70)):
        other = json.loads(json.dumps(summary))
        other["seed"] = seed
        other["models"]["device"] = "NVIDIA H200"
        other["eval"]["classmate"]["classmate_accuracy"] = gdpo_classmate
        other["eval"]["grpo"]["classmate_accuracy"] = grpo_classmate
        other["checks"][1] = [other["checks"][1][0], "...", gdpo_classmate - grpo_classmate >= 0.2]
        folders.append(write(f"s{seed}", other))
    result = seeds.main(folders + ["--json", str(tmp_path / "seeds.json")])
    out = capsys.readouterr().out
    assert "| 0 | 37.7 | 98.8 | 15.6 | 98.8 | 98.8 | 3.3 | 95.5 | 16.6 | 250.3 | 5.6 | all pass |" in out
    assert "| 1 |" in out and "| 2 |" in out and out.count("all pass") == 2  # seed 1's gap is 40 points
    assert "failed: classmate accuracy GDPO - GRPO >= 20 points |" in out
    gap = result["spread"]["gap GDPO - GRPO"]  # 95.5, 40.0 and 10.0 points
    assert (round(gap["mean"], 1), round(gap["min"], 1), round(gap["max"], 1)) == (48.5, 10.0, 95.5)
    assert "| mean [min, max] | 37.7 [37.7, 37.7] |" in out
    assert "mix devices: NVIDIA H100 80GB HBM3, NVIDIA H200." in out
    with open(tmp_path / "seeds.json") as f:
        assert json.load(f)["spread"]["classmate after GDPO"]["min"] == pytest.approx(80.0)

    # a check the run could not judge is not a pass; the default folders not run yet are named
    unjudged = json.loads(json.dumps(summary))
    unjudged["checks"][3][2] = None
    seeds.main([write("unjudged", unjudged)])
    assert "| pass, not judged: the whole demo within 25 minutes" in capsys.readouterr().out
    monkeypatch.setattr(seeds, "DEFAULT", [seed0, str(tmp_path / "never_run")])
    seeds.main([])
    out = capsys.readouterr().out
    assert "not run yet: " in out and "never_run" in out and out.count("| 0 |") == 1

    # what cannot be read is one line naming the file
    no_grpo = json.loads(json.dumps(summary))
    del no_grpo["eval"]["grpo"]
    with pytest.raises(SystemExit, match=r"no_grpo/summary.json: no plain GRPO evaluation"):
        seeds.main([write("no_grpo", no_grpo)])
    unfinished = json.loads(json.dumps(summary))
    del unfinished["rl_measured"]
    with pytest.raises(SystemExit, match=r"the summary has no 'GDPO start-up s'"):
        seeds.main([write("unfinished", unfinished)])
    with pytest.raises(SystemExit, match=r"error: seed 1 twice: .*s1 and .*s1_again"):
        seeds.main([folders[1], write("s1_again", summary | {"seed": 1})])
    with pytest.raises(SystemExit, match=r"s9/summary.json: no demo summary"):
        seeds.main([str(tmp_path / "s9")])


def test_the_committed_seeds_give_the_tables_of_the_readme_and_the_demo_doc(capsys):
    # the three committed GPU demo runs read back to the table docs/demo.md and the README print, line for line;
    # every check holds at each seed (a seed that failed one would say so in its row, and the docs with it)
    seeds = _bench("gpu_demo_seeds")
    result = seeds.main([])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert [r["seed"] for r in result["seeds"]] == [0, 1, 2] and len(lines) == 6
    assert all(seeds.verdict(r["checks"]) == "all pass" for r in result["seeds"])
    for doc in ("README.md", os.path.join("docs", "demo.md")):
        with open(os.path.join(REPO, doc)) as f:
            text = f.read()
        assert all(line + "\n" in text for line in lines), doc
    gap = result["spread"]["gap GDPO - GRPO"]
    assert (round(gap["mean"], 1), round(gap["min"], 1), round(gap["max"], 1)) == (90.7, 87.8, 95.5)

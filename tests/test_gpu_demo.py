"""The GPU demo (``python -m openrlhf_classmate.demo --gpu``, docs/demo.md): its world, tokenizer and model shapes, the
launcher flags it sends (parsed by the launcher's own parser), the stage and budget machinery, the RL stage stopped
after a checkpoint and resumed (a stand-in launcher), the metrics it records (the train-inference mismatch included),
and, once end to end on CPU (``--gpu --tiny``, HF engines, the real launcher): a call stopped by its budget, the next
one doing the rest, a third that redoes nothing.
"""

import hashlib
import json
import os
import random
import sys
import threading
import time

import pytest

from openrlhf_classmate.demo import gpu_world as G
from openrlhf_classmate.demo import stages as ST
from openrlhf_classmate.demo import world as W

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ── world, tokenizer, models ──

@pytest.fixture(scope="module")
def tok():
    return G.build_tokenizer(0)


def test_the_cpu_world_is_unchanged_for_a_seed():
    # the Spec refactor must not move the embedded demo's problems or traces (its README numbers come from them)
    train, held = W.make_splits(0, 2500, 200)
    assert [p.text for p in held[:2]] == ["4 + 4 - 3 - 4 = ?", "4 + 3 + 5 + 3 = ?"]
    assert train[-1].text == "4 + 4 - 2 + 5 = ?"
    rng = random.Random(1)
    assert [W.sample_trace(held[0], rng, W.WorldConfig()) for _ in range(3)] == [
        ("4 + 4 = 8 - 3 = 5 - 4 = 1", "1"), ("4 + 4 = 8 - 3 = 5", "1"), ("4 + 4 = 10 - 3 = 7 - 4 = 3", "3")]
    # the fourth style (the GPU world's private chain) has weight 0 here and must not move a draw: the digest of
    # 600 traces (main and classmate mixtures) computed before it was added
    from openrlhf_classmate.demo.warmstart import CLASSMATE_READ_CONFIG

    rng = random.Random(7)
    problems = [W.random_problem(rng) for _ in range(300)]
    traces = [W.sample_trace(p, rng, W.WorldConfig()) for p in problems]
    traces += [W.sample_trace(p, rng, CLASSMATE_READ_CONFIG) for p in problems]
    assert hashlib.sha256(repr(traces).encode()).hexdigest()[:16] == "83847fe22d10a8ff"


def test_the_gpu_world_is_harder():
    train, held = W.make_splits(0, 2000, 200, G.SPEC)
    problems = train + held
    lengths = {len(p.steps) + 1 for p in problems}
    assert lengths == {6, 7, 8}
    assert max(p.answer for p in problems) > 50 and all(0 <= p.answer <= G.SPEC.max_result for p in problems)
    rng = random.Random(0)
    styles = [W.sample_trace(p, rng, G.TRACES, style="full", spec=G.SPEC) for p in problems[:500]]
    wrong = sum(cot.split()[4::4] != [str(v) for v in _running(p)] for p, (cot, _) in zip(problems, styles))
    assert 0.3 < wrong / 500 < 0.7  # 12% per written step over 5-7 steps: about half the full chains hold a slip


def test_the_gpu_world_has_a_private_notation_that_slips_less_and_that_the_classmate_cannot_read():
    from openrlhf_classmate.demo.evaluate import CPU_STYLE_NAMES, cot_style

    problem = W.Problem(49, (("+", 27), ("-", 17), ("-", 50)))  # 76, 59, 9
    rng = random.Random(0)
    cots = [W.sample_trace(problem, rng, W.WorldConfig(private_step_error=0.0), style="private", spec=G.SPEC)
            for _ in range(3)]
    assert cots[0] == ("50 + 72 = 23 - 82 = 40 - 49 = 0", "9")  # every digit d as 9 - d, the answer in plain digits
    assert W.private_number(40) == "59" and W.private_number(7) == "2" and W.private_number(93) == "06"
    assert cot_style(problem, cots[0][0]) == "private"
    assert cot_style(problem, W.chain_text(problem, [76, 59, 9])) == "full"
    assert cot_style(problem, "50 + 72 = 23 - 82 = 40") == "other"  # a private chain cut short
    assert "private" not in CPU_STYLE_NAMES and G.STYLE_NAMES[-1] == "other"

    # the mixture: no silent steps, as many private chains as legible ones (30% each), and a private step slips half as often as a legible one
    train, _ = W.make_splits(0, 3000, 10, G.SPEC)
    rng = random.Random(1)
    shapes = [cot_style(p, W.sample_trace(p, rng, G.TRACES, spec=G.SPEC)[0]) for p in train]
    assert shapes.count("skip") == 0 and 0.26 < shapes.count("private") / len(shapes) < 0.34
    assert 0.26 < shapes.count("full") / len(shapes) < 0.34
    slips = {}
    for style in ("full", "private"):
        rng = random.Random(2)
        number = W.private_number if style == "private" else str
        wrong = steps = 0
        for p in train:  # a step slips where its result is not the previous written one's op d
            written = W.sample_trace(p, rng, G.TRACES, style=style, spec=G.SPEC)[0].split()[4::4]
            previous = p.first
            for (op, d), w in zip(p.steps, written):
                wrong += w != number(min(max(W.apply(previous, op, d), 0), G.SPEC.max_word))
                steps += 1
                previous = int(w.translate(str.maketrans("0123456789", "9876543210")) if style == "private" else w)
        slips[style] = wrong / steps
    assert 0.10 < slips["full"] < 0.14 and 0.045 < slips["private"] < 0.075, slips

    # the classmate reads a chain's last number at face value: right on legible chains, wrong on private ones
    # (no number reads the same in both notations)
    right = {"full": 0, "private": 0}
    for p in train[:1000]:
        for style in right:
            cot, _ = W.sample_trace(p, rng, W.WorldConfig(step_error=0.0, private_step_error=0.0), style=style,
                                    spec=G.SPEC)
            right[style] += W.last_number(cot) == p.answer
    assert right["full"] == 1000 and right["private"] == 0, right


def test_the_classmate_learns_to_read_private_chains_at_face_value(tok):
    from openrlhf_classmate.demo.warmstart import classmate_examples

    problems, _ = W.make_splits(0, 400, 10, G.SPEC)
    examples = classmate_examples(tok, tok, problems, random.Random(0), spec=G.SPEC, reads=G.CLASSMATE_READS)
    private = 0
    for p, (prompt, target) in zip(problems, examples):
        text = tok.decode(prompt)
        cot = text.split("<think>")[-1].split("</think>")[0].split()
        if cot and cot[0] == W.private_number(p.first) != str(p.first) and len(cot) == 4 * len(p.steps) + 1:
            private += 1
            assert tok.decode(target[:-1]) == str(int(cot[-1]))  # the last number as written, never deciphered
    assert private > 20


def _running(problem):
    value, out = problem.first, []
    for op, d in problem.steps:
        value = W.apply(value, op, d)
        out.append(str(value))
    return out


def test_bpe_tokenizer_numbers_are_several_tokens_and_the_think_tags_one_id_each(tok):
    ids = tok.encode("<think> 37 + 45 = 82 </think> 82", add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:4] == ["<think>", " ", "3", "7"] and pieces.count("</think>") == 1
    assert len(tok.encode("182", add_special_tokens=False)) == 3
    assert tok.decode(ids) == "<think> 37 + 45 = 82 </think> 82"  # byte-level: exact round trip
    text = tok.apply_chat_template([{"role": "user", "content": "1 + 2 = ?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\n1 + 2 = ?<|im_end|>\n<|im_start|>assistant\n"
    assert G.stop_ids(tok) == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_model_sizes_and_head_dimensions(tok):
    import torch

    G.FULL_SIZES.check_head_dims()
    G.TINY_SIZES.check_head_dims()
    with pytest.raises(ValueError, match="head dimension"):
        G.Sizes(main=G.FULL_SIZES.main, classmate=G.ModelSize(96, 2, 3)).check_head_dims()  # 32
    with torch.device("meta"):
        main, classmate = G.new_models(tok, G.FULL_SIZES, seed=0)
    main_params = sum(p.numel() for p in main.parameters())
    classmate_params = sum(p.numel() for p in classmate.parameters())
    assert 20e6 <= main_params <= 30e6 and 5e6 <= classmate_params <= 10e6, (main_params, classmate_params)
    assert main.config.model_type == "llama" and main.config.eos_token_id == G.stop_ids(tok)


# ── flags ──

def _parse_demo(argv):
    from openrlhf_classmate.demo.cli import parse_args

    return parse_args(argv)


@pytest.mark.parametrize("argv, message", [
    (["--tiny"], "--tiny belongs to the GPU demo: add --gpu"),
    (["--budget-s", "100"], "--budget-s belongs to the GPU demo"),
    (["--gpu", "--quick"], "--quick is the CPU demo's short run"),
    (["--gpu", "--eval-every", "5"], "--eval-every: the GPU demo evaluates before and after"),
    (["--gpu", "--engine", "hf"], "--engine hf runs the tiny CPU check only"),
    (["--gpu", "--tiny", "--engine", "hf", "--eval-backend", "vllm"], "the CPU check has no vLLM"),
    (["--gpu", "--budget-s", "0"], "--budget-s must be > 0"),
    (["--gpu", "--tiny", "--enforce-eager"], "--enforce-eager is for vLLM engines"),
    (["--gpu", "--sequential-rl"], "--sequential-rl orders the two RL runs of --compare-grpo"),
    (["--sequential-rl"], "--sequential-rl belongs to the GPU demo: add --gpu"),
])
def test_misused_flags_are_refused_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit):
        _parse_demo(argv)
    assert message in capsys.readouterr().err


def test_a_later_call_with_other_settings_is_refused(tmp_path):
    from openrlhf_classmate.demo import gpu

    first = gpu.settings_from_args(_parse_demo(["--gpu", "--tiny"]))
    gpu._check_settings(str(tmp_path), first)
    gpu._check_settings(str(tmp_path), first)  # the same settings go on
    other = gpu.settings_from_args(_parse_demo(["--gpu", "--tiny", "--compare-grpo", "--lr", "3e-4"]))
    with pytest.raises(SystemExit, match=r"other settings \(compare_grpo, parallel_rl, rl differ\).*--fresh"):
        gpu._check_settings(str(tmp_path), other)
    # the evaluations' backend may change from one call to the next (each evaluation records its own)
    full = gpu.settings_from_args(_parse_demo(["--gpu"]))
    gpu._check_settings(str(tmp_path / "full"), full)
    gpu._check_settings(str(tmp_path / "full"), gpu.settings_from_args(_parse_demo(["--gpu", "--eval-backend", "vllm"])))


@pytest.mark.parametrize("classmate", [True, False])
def test_launcher_flags_are_the_production_layout(classmate):
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.launch import gpu_launcher_argv
    from openrlhf_classmate.integration.launch.args import parse_args

    s = gpu.FULL
    argv = gpu_launcher_argv("/tmp/run", "policy", "train.jsonl", s.rl, 0, "classmate" if classmate else None,
                             engine="vllm", max_len=s.max_len)
    args = parse_args(argv)
    assert args.train.colocate_all and args.vllm.enable_sleep and not args.vllm.enforce_eager
    assert args.vllm.sync_backend == "nccl" and args.engine.backend == "vllm"  # CUDA IPC under colocate_all
    assert args.rollout.batch_size == 64 and args.rollout.n_samples_per_prompt == 8
    assert args.train.batch_size == 512 and args.data.max_samples == 100 * 64  # 100 steps, one optimizer step each
    assert args.ckpt.load_enable and args.ckpt.save_steps == 10 and not args.ckpt.disable_ds
    assert args.data.max_len == s.max_len >= 41 + s.rl.max_new_tokens
    # fixed KV caches: the engines start without profiling the GPU's memory, so the two runs can share it
    assert args.engine.kv_cache_gib == 2.0
    eager = parse_args(gpu_launcher_argv("/tmp/run", "policy", "train.jsonl", s.rl, 0, None, engine="vllm",
                                         max_len=s.max_len, enforce_eager=True))
    assert eager.vllm.enforce_eager
    if classmate:
        assert args.classmate.estimator == "gdpo" and args.classmate.placement == "colocate"
        assert args.vllm.gpu_memory_utilization + args.classmate.gpu_memory_utilization < 1
    else:
        assert args.algo.advantage.estimator == "group_norm" and not args.classmate.model_name_or_path


def test_compare_grpo_runs_both_rl_runs_at_once_unless_sequential(tmp_path):
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import PARALLEL_SLOWDOWN, GPUDemo

    def demo(*flags):
        settings = gpu.settings_from_args(_parse_demo(["--gpu", *flags]))
        return GPUDemo(settings, str(tmp_path / "_".join(flags)), [])

    parallel = demo("--compare-grpo")
    assert parallel.s.parallel_rl and parallel.s.eval_backend == "hf"
    # with the HF evaluation backend (the default) the evaluation before RL runs beside the RL runs
    assert parallel.stage_names() == ["warmstart", "rl_parallel", "eval_after", "report"]
    assert [s.name for s in parallel.stages()] == parallel.stage_names()
    assert parallel.task_names() == ["eval_before", "rl_classmate", "eval_classmate", "rl_grpo", "eval_grpo"]
    assert parallel._evals_at_once
    # a vLLM evaluation profiles the GPU's memory: it runs alone, before the RL runs, and the ones after in turn
    vllm_eval = demo("--compare-grpo", "--eval-backend", "vllm")
    assert vllm_eval.stage_names() == ["warmstart", "eval_before", "rl_parallel", "eval_after", "report"]
    assert [s.name for s in vllm_eval.stages()] == vllm_eval.stage_names() and not vllm_eval._evals_at_once
    sequential = demo("--compare-grpo", "--sequential-rl")
    assert not sequential.s.parallel_rl
    assert sequential.stage_names() == ["warmstart", "eval_before", "rl_classmate", "eval_classmate", "rl_grpo",
                                        "eval_grpo", "report"]
    # without a measurement, a run beside another is expected to step slower than alone
    assert parallel.rl_step("grpo") == pytest.approx(PARALLEL_SLOWDOWN * sequential.rl_step("grpo"))
    assert not demo().s.parallel_rl  # one RL run: nothing to run beside it


def test_a_parallel_stage_runs_its_tasks_at_once_and_marks_itself_done_when_all_are(tmp_path):
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import GPUDemo

    out = str(tmp_path)
    demo = GPUDemo(gpu.settings_from_args(_parse_demo(["--gpu", "--tiny", "--compare-grpo"])), out, [])
    started, barrier = {}, threading.Barrier(2, timeout=10)

    def task(name, finish=True):
        def run(deadline):
            started[name] = time.time()
            barrier.wait()  # returns only once both tasks run: they do run at once
            if finish:
                ST.mark_done(out, name, {})
            return finish
        return run

    assert not demo._run_at_once("rl_parallel", [("a", task("a")), ("b", task("b", finish=False))], time.time() + 60)
    assert ST.is_done(out, "a") and not ST.is_done(out, "rl_parallel")
    assert set(demo.timings.data) == {"a", "b"}  # each task's wall time, written from its thread
    # the next call runs only what is left; the stage is done once every task is
    barrier = threading.Barrier(1, timeout=10)
    assert demo._run_at_once("rl_parallel", [("a", task("a")), ("b", task("b"))], time.time() + 60)
    assert ST.is_done(out, "rl_parallel") and len(demo.timings.data["a"]["seconds"]) == 1

    def failing(deadline):
        time.sleep(0.2)
        raise SystemExit("error: stage c failed")

    def long_task(deadline):  # an RL run: it ends when told to stop (tasks check demo.stop)
        started["e"] = time.time()
        while not demo.stop.wait(0.05):
            if time.time() > deadline:
                return False
        return False

    t0 = time.time()
    with pytest.raises(SystemExit, match="stage c failed"):
        demo._run_at_once("eval_after", [("c", failing), ("e", long_task)], time.time() + 60)
    # the failure stopped the other task at once instead of letting it run to the call's deadline
    assert time.time() - t0 < 10 and not ST.is_done(out, "eval_after")


# ── stages and budget ──

def test_decide():
    assert ST.decide(50, left_s=60, budget_s=500, min_part_s=None) == "run"
    assert ST.decide(100, left_s=60, budget_s=500, min_part_s=30) == "wait"  # fits in a fresh call: wait for it
    assert ST.decide(900, left_s=300, budget_s=500, min_part_s=30) == "part"  # never fits: start a part now ...
    assert ST.decide(900, left_s=200, budget_s=500, min_part_s=30) == "wait"  # ... unless a fresh call does twice
    assert ST.decide(900, left_s=20, budget_s=500, min_part_s=30) == "wait"


def test_stages_run_in_order_within_the_budget_and_never_twice(tmp_path):
    out, ran = str(tmp_path), []

    def stage(name, estimate):
        def run(deadline):
            ran.append((name, deadline - time.time()))
            ST.mark_done(out, name, {"ok": True})
            return True
        return ST.Stage(name, name, lambda: estimate, run)

    stages = [stage("a", 5), stage("b", 5), stage("c", 50)]
    lines = []
    assert ST.run_stages(stages, out, 30, ST.Timings(out), margin_s=0, log=lines.append) == ST.EXIT_UNFINISHED
    assert [n for n, _ in ran] == ["a", "b"] and 29 < ran[0][1] <= 30
    assert any("stopping before 'c'" in line and "Left: c ~0:50" in line for line in lines)
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == 0
    assert [n for n, _ in ran] == ["a", "b", "c"]
    assert ST.run_stages(stages, out, 1, ST.Timings(out), log=lines.append) == 0 and len(ran) == 3
    assert lines[-1] == "every stage is done"
    assert set(ST.Timings(out).data) == {"a", "b", "c"}


def test_a_failed_stage_is_one_line_with_its_log_and_the_rerun_resumes_there(tmp_path):
    # a stage that fails says so in one line naming its log, and the same command again starts at it
    out, ran, broken = str(tmp_path), [], {"b": True}

    def stage(name):
        def run(deadline):
            ran.append(name)
            if broken.get(name):
                time.sleep(0.2)  # the failed attempt's time
                raise RuntimeError(f"the launcher exited with 1 (log: {out}/runs/b/launcher.log); tail:\nTraceback ...")
            ST.mark_done(out, name, {"ok": True})
            return True
        return ST.Stage(name, name, lambda: 1, run)

    stages = [stage("a"), stage("b"), stage("c")]
    lines = []
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == ST.EXIT_FAILED
    assert ran == ["a", "b"]
    failed = [line for line in lines if "failed" in line]
    assert failed == [f"error: stage b failed: the launcher exited with 1 (log: {out}/runs/b/launcher.log); run the "
                      "same command again to go on from stage b (the stages before it are done)"]
    broken["b"] = False
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == 0
    assert ran == ["a", "b", "b", "c"]
    # the failed attempt counts in the stage's time (the demo's device time), not in the next call's estimate
    timings = ST.Timings(out)
    (failed,), (done,) = timings.data["b"]["failed_seconds"], timings.data["b"]["seconds"]
    assert failed >= 0.2 > done and timings.total("b") == pytest.approx(failed + done)


def test_a_stage_failing_in_this_process_keeps_its_traceback_and_names_it(tmp_path):
    # the report stage runs in the demo's own process; a bare KeyError there used to print "failed: 'grpo'" and no
    # more: the line now says what was raised and where its traceback is, and the rerun starts at the stage
    out, broken = str(tmp_path), {"report": True}

    def build_report(deadline):
        if broken["report"]:
            return {}["grpo"]
        ST.mark_done(out, "report", {})
        return True

    stages = [ST.Stage("report", "the report", lambda: 1, build_report)]
    lines = []
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == ST.EXIT_FAILED
    log = os.path.join(out, "stages", "report.log")
    assert lines[-1] == (f"error: stage report failed: KeyError: 'grpo' (traceback: {log}); run the same command "
                         "again to go on from stage report (the stages before it are done)")
    trace = open(log).read()
    assert "in build_report" in trace and trace.rstrip().endswith("KeyError: 'grpo'")
    broken["report"] = False
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == 0


@pytest.mark.slow
def test_a_child_stage_that_cannot_start_names_its_log(tmp_path, capsys):
    # an isolated stage's child process fails before it does anything (here: a flag its parser refuses, as a child
    # that cannot import the package would): the stage's output is kept in stages/<name>.log and named in one line
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import GPUDemo

    out = str(tmp_path / "demo")
    demo = GPUDemo(gpu.settings_from_args(_parse_demo(["--gpu", "--tiny"])), out, ["--gpu", "--no-such-flag"])
    with pytest.raises(ST.StageFailed) as failed:
        demo._isolated("eval_before")(time.time() + 120)
    log = os.path.join(out, "stages", "eval_before.log")
    assert str(failed.value) == f"the child process exited with 2; its output: {log}"
    assert failed.value.log_path == log and "unrecognized arguments: --no-such-flag" in open(log).read()
    assert "--no-such-flag" in capsys.readouterr().out  # the console still shows it as it happens


@pytest.mark.slow
def test_an_evaluation_whose_child_cannot_import_the_package_is_one_line_and_the_next_call_starts_there(
        tmp_path, monkeypatch):
    # the isolated evaluation's child finds a broken openrlhf_classmate ahead of the real one on its path (as after
    # a half-finished install): the call ends with one line naming stages/eval_before.log, which holds the child's
    # ImportError; the stage after it does not run, and the next call starts at the evaluation
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import GPUDemo

    broken = tmp_path / "broken" / "openrlhf_classmate"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('openrlhf_classmate is half installed')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    monkeypatch.chdir(tmp_path)  # not the repository: the child's first path entry is its working directory
    out = str(tmp_path / "demo")
    demo = GPUDemo(gpu.settings_from_args(_parse_demo(["--gpu", "--tiny"])), out, ["--gpu", "--tiny"])
    ran = []

    def stand_in(name):
        def run(deadline):
            ran.append(name)
            ST.mark_done(out, name, {})
            return True
        return ST.Stage(name, name, lambda: 1, run)

    stages = [stand_in("warmstart"), ST.Stage("eval_before", "held-out evaluation", lambda: 60,
                                              demo._isolated("eval_before")), stand_in("rl_classmate")]
    lines = []
    assert ST.run_stages(stages, out, float("inf"), ST.Timings(out), log=lines.append) == ST.EXIT_FAILED
    log = os.path.join(out, "stages", "eval_before.log")
    assert lines[-1] == (f"error: stage eval_before failed: the child process exited with 1; its output: {log}; run "
                         "the same command again to go on from stage eval_before (the stages before it are done)")
    assert "ImportError: openrlhf_classmate is half installed" in open(log).read()
    assert ran == ["warmstart"] and not ST.is_done(out, "eval_before")
    # the next call: the warm start is not run again, and the evaluation is the first stage it takes up (here it
    # does not fit the budget, so the call stops before it and names what is left)
    lines.clear()
    assert ST.run_stages(stages, out, 30, ST.Timings(out), log=lines.append) == ST.EXIT_UNFINISHED
    assert lines[0] == "already done (not run again): warmstart" and ran == ["warmstart"]
    assert any(line.startswith("\nstopping before 'eval_before'") for line in lines), lines


@pytest.mark.slow  # the slow guard sees a demo command line (its child here is a stand-in script, ~4 s)
def test_a_child_stage_stopped_at_the_budget_leaves_no_build_lock_behind(tmp_path, monkeypatch):
    # the warm start's child pre-builds DeepSpeed's FusedAdam; stopped at the call's budget mid-build, its lock must
    # go with it, or the next launcher waits on a build that never ends. The child here: a real process that takes
    # the lock as torch's builder does, then outlives the budget
    from openrlhf_classmate.demo import gpu
    from openrlhf_classmate.demo.gpu_stages import GPUDemo

    ext = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    older = ext / "cpu_adam" / "lock"  # another run's, from before the stage: left alone
    older.parent.mkdir(parents=True)
    older.touch()
    os.utime(older, (time.time() - 600, time.time() - 600))
    child = tmp_path / "child.sh"
    child.write_text('#!/bin/sh\nmkdir -p "$TORCH_EXTENSIONS_DIR/fused_adam"\ntouch "$TORCH_EXTENSIONS_DIR/fused_adam/lock"\n'
                     "echo building\nexec sleep 120\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    demo = GPUDemo(gpu.settings_from_args(_parse_demo(["--gpu", "--tiny"])), str(tmp_path / "demo"), ["--gpu"])
    t0 = time.time()
    assert demo._isolated("warmstart")(time.time() + 3) is False
    assert time.time() - t0 < 30
    assert not (ext / "fused_adam" / "lock").exists() and older.exists()


def test_checkpoint_step_reads_only_complete_checkpoints(tmp_path):
    import torch

    from openrlhf_classmate.demo.rl_stage import checkpoint_step

    actor = tmp_path / "ckpt" / "_actor"
    assert checkpoint_step(str(tmp_path)) == 0
    for step in (2, 4):
        tag = actor / f"global_step{step}"
        tag.mkdir(parents=True)
        for kind in ("model", "optim"):
            torch.save({"x": torch.zeros(2)}, tag / f"zero_pp_rank_0_mp_rank_00_{kind}_states.pt")
    (actor / "latest").write_text("global_step4")
    assert checkpoint_step(str(tmp_path)) == 4
    (actor / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"cut")  # a torn save
    assert checkpoint_step(str(tmp_path)) == 2


STAND_IN = r"""
import json, os, sys, time, zipfile
run_dir, steps, save_every, step_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
actor = os.path.join(run_dir, "ckpt", "_actor")
latest = os.path.join(actor, "latest")
start = int(open(latest).read().removeprefix("global_step")) if os.path.exists(latest) else 0
print("starting, resuming from", start, flush=True)
for step in range(start + 1, steps + 1):
    time.sleep(step_s)
    print(f"(PPOTrainer pid=1) Global step {step}: {{'reward': {step / 100}}}", flush=True)
    if step % save_every == 0:
        tag = os.path.join(actor, f"global_step{step}")
        os.makedirs(tag)
        for kind in ("model", "optim"):  # zip files with an entry, as torch.save writes them
            with zipfile.ZipFile(os.path.join(tag, f"zero_pp_rank_0_mp_rank_00_{kind}_states.pt"), "w") as z:
                z.writestr("data.pkl", b"x")
        with open(latest, "w") as f:
            f.write(f"global_step{step}")
os.makedirs(os.path.join(run_dir, "final"))
open(os.path.join(run_dir, "final", "config.json"), "w").write("{}")
open(os.path.join(run_dir, "final", "model.safetensors"), "w").write("")
"""


def test_an_rl_run_is_stopped_at_once_when_told(tmp_path):
    from openrlhf_classmate.demo import rl_stage as RL

    run_dir = str(tmp_path / "run")
    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    t0 = time.time()
    outcome = RL.run(run_dir, [run_dir, "40", "4", "0.3"], steps=40, save_every=4, deadline=time.time() + 120,
                     kill_grace_s=0.5, program=[sys.executable, "-c", STAND_IN], stop=stop)
    assert not outcome.finished and outcome.stopped.startswith("stopped: another task failed")
    assert time.time() - t0 < 10  # not the 12 s the 40 steps take, nor the deadline
    assert "launcher stopped: stopped: another task failed" in open(os.path.join(run_dir, "launcher.log")).read()


def test_stop_reason():
    from openrlhf_classmate.demo.rl_stage import stop_reason

    # 10 steps of 3 s to the next checkpoint
    assert stop_reason(20, 0, 100, 10, 3.0, left_s=31, max_new_steps=None) == ""
    assert "would not be written" in stop_reason(20, 0, 100, 10, 3.0, left_s=29, max_new_steps=None)
    assert stop_reason(100, 0, 100, 10, 3.0, left_s=1, max_new_steps=None) == ""  # the final save follows
    assert "2 new steps" in stop_reason(4, 2, 10, 2, 3.0, left_s=1e9, max_new_steps=2)
    assert stop_reason(4, 2, 10, 2, 3.0, left_s=1e9, max_new_steps=3) == ""


def test_an_rl_run_stops_after_the_last_checkpoint_that_fits_and_resumes_there(tmp_path):
    # the monitor's logic (checkpoints, deadline, resume, parsed lines) with a stand-in for the launcher that writes
    # a checkpoint every 4 steps of 0.3 s; the real launcher's stop and resume: the slow test below
    from openrlhf_classmate.demo import rl_stage as RL
    from openrlhf_classmate.testing import e2e  # noqa: F401  (run() imports it: not inside the timed part)

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    run_dir = str(tmp_path / "run")
    argv = [run_dir, "40", "4", "0.3"]
    seen = []
    t0 = time.time()
    first = RL.run(run_dir, argv, steps=40, save_every=4, deadline=t0 + 6.0, kill_grace_s=0.5,
                   program=[sys.executable, str(script)], on_step=lambda step, status, _: seen.append(step))
    # stopped after a complete checkpoint (about step 16 on an idle machine), before the deadline
    assert not first.finished and first.step in (4, 8, 12, 16, 20) and time.time() - t0 < 6.0, first
    assert first.stopped and RL.checkpoint_step(run_dir) == first.step
    assert first.step_s == pytest.approx(0.3, abs=0.25)
    second = RL.run(run_dir, argv, steps=40, save_every=4, deadline=time.time() + 60, kill_grace_s=0.5,
                    program=[sys.executable, str(script)], on_step=lambda step, status, _: seen.append(step))
    assert second.finished and second.started_at == first.step and second.step == 40
    assert seen[-(40 - first.step):] == list(range(first.step + 1, 41))  # resumed after the checkpoint
    logged = RL.read_steps(run_dir)
    assert sorted(logged) == list(range(1, 41)) and logged[40] == {"reward": 0.4}
    with open(os.path.join(run_dir, "launcher.log")) as f:
        log = f.read()
    assert log.count("===== launcher started") == 2 and "[demo] launcher stopped:" in log
    # past the deadline itself the run stops wherever it is (here before its first checkpoint)
    third = RL.run(str(tmp_path / "late"), [str(tmp_path / "late"), "20", "4", "0.3"], steps=20, save_every=4,
                   deadline=time.time() + 1.0, kill_grace_s=0.5, program=[sys.executable, str(script)])
    assert not third.finished and third.step == 0 and "ran out" in third.stopped
    # a first checkpoint cut short: nothing to resume from, so the next call starts afresh (the launcher would refuse
    # a checkpoint folder without a complete tag)
    torn = tmp_path / "late" / "ckpt" / "_actor" / "global_step4"
    torn.mkdir(parents=True, exist_ok=True)
    (torn / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"cut")
    fourth = RL.run(str(tmp_path / "late"), [str(tmp_path / "late"), "8", "4", "0.05"], steps=8, save_every=4,
                    deadline=time.time() + 60, kill_grace_s=0.5, program=[sys.executable, str(script)])
    assert fourth.finished and fourth.started_at == 0 and RL.checkpoint_step(str(tmp_path / "late")) == 8
    assert "no complete checkpoint in it" in (tmp_path / "late" / "launcher.log").read_text()


# ── metrics ──

def test_metrics_rows_take_every_step_and_the_mismatch_metrics():
    from openrlhf_classmate.demo.launch import parse_step_line
    from openrlhf_classmate.demo.report import step_line, step_rows

    step, status = parse_step_line("(PPOTrainer pid=7) ✨ Global step 3: {'reward': 0.5, 'classmate/reward': nan, "
                                   "'mismatch/logprob_abs_diff_mean': 0.0021, 'mismatch/kl_k3': 1e-05}")
    assert step == 3 and status["classmate/reward"] is None
    assert step_line("classmate", 3, 4, status) == ("step   3/4  main reward 0.50  classmate reward nan  CoT  nan tok"
                                                    "  |dlogp| 2.1e-03")
    scalars = {"train/reward": {1: 0.1, 2: 0.2, 3: 0.3}, "train/mismatch/logprob_abs_diff_max": {1: 0.5},
               "train/other": {1: 1.0}}
    parsed = {3: status, 4: {"reward": 0.4}}  # step 4: logged before the run was stopped, never flushed
    rows = step_rows("classmate", scalars, parsed, prefer_fallback=True)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["mismatch/logprob_abs_diff_max"] == 0.5 and "other" not in rows[0]
    assert rows[2]["main_reward"] == 0.5  # the parsed line (newest) wins over the event file
    assert rows[2]["mismatch/logprob_abs_diff_mean"] == 0.0021 and rows[2]["mismatch/kl_k3"] == 1e-05
    assert "classmate_reward" not in rows[2]  # a non-finite value is no number
    assert step_rows("classmate", scalars, parsed)[2]["main_reward"] == 0.3


# ── end to end on CPU ──

def _demo(out: str, *extra: str) -> tuple[int, str, float]:
    from openrlhf_classmate.testing.watchdog import run_watched

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    t0 = time.time()
    log = os.path.join(os.path.dirname(out), f"demo_call_{len(os.listdir(os.path.dirname(out)))}.log")
    # under the watchdog (a silent run is killed), not a fixed limit that a loaded machine would overrun
    code = run_watched([sys.executable, "-m", "openrlhf_classmate.demo", "--gpu", "--tiny", "--output-dir", out,
                        *extra], log, cwd=REPO, env=env)
    return code, open(log).read(), time.time() - t0


@pytest.mark.slow
def test_tiny_gpu_demo_on_cpu_runs_its_stages_across_calls_and_redoes_nothing(tmp_path):
    # One launcher start (~50 s of the test): the RL stage's stop at a checkpoint and resume are checked with a
    # stand-in above, and the launcher's own resume by tests/test_faults_cpu.py.
    out = str(tmp_path / "demo")
    # call 1: the budget holds the warm start (estimated 30 s on CPU) but not the RL stage: the call stops before it
    code, log, _ = _demo(out, "--budget-s", "45")
    assert code == ST.EXIT_UNFINISHED, log[-4000:]
    assert "stopping before" in log and "Run the same command again" in log and "Left: " in log, log[-3000:]
    assert ST.is_done(out, "warmstart") and not ST.is_done(out, "rl_classmate")
    assert not os.path.exists(os.path.join(out, "runs"))

    # call 2: the rest, from where call 1 stopped
    code, log, _ = _demo(out)
    assert code == 0, log[-4000:]
    assert "already done (not run again): warmstart" in log and "[warmstart]" not in log
    assert "step   4/4" in log and "every stage is done" in log
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and {r["run"] for r in rows} == {"classmate"}
    assert all(isinstance(r["main_reward"], float) and isinstance(r["cot_tokens"], float) for r in rows)
    # the train-inference mismatch, every step: bf16 rounding only (bf16 actor vs fp32 HF engine, as test_e2e_cpu)
    for row in rows:
        assert 0 < row["mismatch/logprob_abs_diff_mean"] < 0.02 and row["mismatch/kl_k3"] < 1e-3, row
        assert row["mismatch/logprob_abs_diff_max"] >= row["mismatch/logprob_abs_diff_mean"], row
    assert open(os.path.join(out, "curves.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    summary_md = open(os.path.join(out, "summary.md")).read()
    for text in ("| main accuracy |", "| classmate accuracy |", "| rl_classmate |", "acceptance check"):
        assert text in summary_md
    for name in ("eval_before.jsonl", "eval_after_classmate.jsonl"):
        assert len(open(os.path.join(out, name)).readlines()) == 6 * 2
    command = open(os.path.join(out, "runs/classmate/command.txt")).read()
    assert "--train.colocate_all" in command and "--ckpt.load_enable" in command
    assert open(os.path.join(out, "runs/classmate/ckpt/_actor/latest")).read().strip() == "global_step4"
    markers = {n: os.path.getmtime(ST.marker_path(out, n)) for n in ("warmstart", "rl_classmate", "report")}

    # call 3: everything is done; nothing runs (not even an import of torch)
    code, log, seconds = _demo(out)
    assert code == 0 and "every stage is done" in log and "[warmstart]" not in log, log
    assert {n: os.path.getmtime(ST.marker_path(out, n)) for n in markers} == markers
    assert seconds < 30


@pytest.mark.slow
def test_tiny_gpu_demo_on_cpu_runs_both_rl_runs_at_once(tmp_path):
    """--compare-grpo: classmate GDPO and plain GRPO as two launchers at once (each with its own Ray instance),
    the evaluation before RL beside them (HF backend), then both evaluations after at once."""
    out = str(tmp_path / "demo")
    code, log, _ = _demo(out, "--compare-grpo")
    assert code == 0, log[-4000:]
    assert "[rl_parallel]" in log and "[eval_after]" in log and "every stage is done" in log
    for name in ("eval_before", "rl_classmate", "rl_grpo", "eval_classmate", "eval_grpo", "rl_parallel",
                 "eval_after", "report"):
        assert ST.is_done(out, name), name
    timings = ST.Timings(out)
    both = timings.total("rl_classmate") + timings.total("rl_grpo") + timings.total("eval_before")
    # at once: the stage took about as long as its longest task, well under the three in turn
    assert timings.total("rl_parallel") < 0.8 * both, timings.data
    assert timings.total("rl_parallel") >= max(timings.total("rl_classmate"), timings.total("rl_grpo"))
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert {(r["run"], r["step"]) for r in rows} == {(run, s) for run in ("classmate", "grpo") for s in (1, 2, 3, 4)}
    for run in ("classmate", "grpo"):
        launcher_log = open(os.path.join(out, "runs", run, "launcher.log")).read()
        assert launcher_log.count("Started a local Ray instance") == 1, run  # its own, not the other run's
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert set(summary["eval"]) == {"before", "classmate", "grpo"}
    assert summary["timings"]["total"] == pytest.approx(sum(
        timings.total(n) for n in ("warmstart", "rl_parallel", "eval_after")), abs=0.01)
    assert set(summary["task_timings"]) == {"eval_before", "rl_classmate", "eval_classmate", "rl_grpo", "eval_grpo"}


def test_the_acceptance_checks_hold_at_their_thresholds_exactly():
    # accuracies over 3,200 samples: 2,408 - 1,768 correct is 20 points and 3,160 - 3,064 is 3 points in counts, but
    # as means the differences come out a few ulps on the failing side of the thresholds
    from openrlhf_classmate.demo.gpu_report import checks

    assert 0.7525 - 0.5525 < 0.2 and 0.9875 - 0.9575 > 0.03
    before = {"main_accuracy": 0.5525}
    after = {"classmate": {"main_accuracy": 0.7525, "classmate_accuracy": 0.7525},
             "grpo": {"main_accuracy": 0.7525, "classmate_accuracy": 0.5525}}
    assert [passed for _, _, passed in checks(before, after, 25 * 60, "vllm")] == [True, True, True, True]
    after = {"classmate": {"main_accuracy": 0.9875, "classmate_accuracy": 0.9875},
             "grpo": {"main_accuracy": 0.9575, "classmate_accuracy": 0.1}}
    assert [passed for _, _, passed in checks(before, after, 25 * 60, "vllm")] == [True, True, True, True]
    # one sample short of each threshold fails it, and a second past 25 minutes the time check
    after = {"classmate": {"main_accuracy": 2407 / 3200, "classmate_accuracy": 2407 / 3200},
             "grpo": {"main_accuracy": 2407 / 3200 - 97 / 3200, "classmate_accuracy": 0.5525}}
    assert [passed for _, _, passed in checks(before, after, 25 * 60 + 1, "vllm")] == [False, False, False, False]

"""The GPU demo's stages (:mod:`openrlhf_classmate.demo.gpu`): what each does, what it costs, where it writes.

With ``--engine vllm`` the warm-start and evaluation stages run in a child process each (``--_stage NAME``), so
that every stage starts on a GPU that the previous one has fully released (vLLM's engine processes included) and a
stage past the call's budget can be stopped whole. With ``--engine hf`` (the CPU check) they run in this process.
The RL stages are launcher subprocesses in both cases (:mod:`openrlhf_classmate.demo.rl_stage`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from openrlhf_classmate.demo import gpu_world as G
from openrlhf_classmate.demo import world as W
from openrlhf_classmate.demo.stages import MARKERS, Stage, StageFailed, Timings, is_done, mark_done, run_stages

# Seconds on one H100, from the device run of 2026-11-25 (bench/GPU_RESULTS.md section 4); an output folder's
# own measurements (stages/timings.json) replace them as soon as it has some
H100 = {"warmstart": 185, "eval": 115, "report": 15, "rl_startup": {"classmate": 240, "grpo": 200},
        "rl_step": {"classmate": 5.6, "grpo": 4.5}, "rl_end": 20}
CPU_TINY = {"warmstart": 30, "eval": 20, "report": 15, "rl_startup": {"classmate": 60, "grpo": 50},
            "rl_step": {"classmate": 3.0, "grpo": 3.0}, "rl_end": 10}
RUN_TITLES = {"classmate": "classmate GDPO", "grpo": "plain GRPO"}
PARALLEL_SLOWDOWN = 1.3  # two RL runs at once: each step waits on a busier host (an estimate until measured)


def line(text: str) -> None:
    print(f"    {text}", flush=True)


class GPUDemo:
    def __init__(self, settings, out: str, argv: list[str], budget_s: float | None = None,
                 rl_steps_per_call: int | None = None, on_stage_end: Callable[[], None] = lambda: None):
        self.s = settings
        self.on_stage_end = on_stage_end  # after each stage in this process: its children's files are recorded here
        self.out = out
        self.argv = list(argv)
        self.budget_s = float("inf") if budget_s is None else budget_s
        self.rl_steps_per_call = rl_steps_per_call
        self.timings = Timings(out)
        self.stop = threading.Event()  # set: the tasks of a parallel stage end (a failure, or Ctrl-C)
        self.est = dict(H100 if settings.engine == "vllm" else CPU_TINY)
        if settings.engine == "vllm" and settings.tiny:
            self.est.update(warmstart=40, rl_step={"classmate": 1.0, "grpo": 1.0})
        if settings.engine == "vllm" and settings.eval_backend == "hf":
            self.est["eval"] = 50
        self._splits = None

    # ── paths and shared data ──
    def path(self, *parts: str) -> str:
        return os.path.join(self.out, *parts)

    @property
    def main_path(self) -> str:
        return self.path("world", "main_warmstart")

    @property
    def classmate_path(self) -> str:
        return self.path("world", "classmate")

    def splits(self) -> tuple[list[W.Problem], list[W.Problem]]:
        if self._splits is None:
            self._splits = W.make_splits(self.s.seed, self.s.rl.steps * self.s.rl.prompts_per_step, self.s.num_eval,
                                         G.SPEC)
        return self._splits

    @property
    def eval_before_alone(self) -> bool:
        """In parallel mode the evaluation before RL runs beside the RL runs, unless it starts vLLM engines (their
        memory profiling would see the RL engines' allocations)."""
        return not self.s.parallel_rl or self.s.eval_backend == "vllm"

    def stage_names(self) -> list[str]:
        """The stages one call runs in turn (each writes its marker)."""
        if self.s.parallel_rl:
            return ["warmstart"] + (["eval_before"] if self.eval_before_alone else []) + [
                "rl_parallel", "eval_after", "report"]
        names = ["warmstart", "eval_before"]
        for run in self.s.runs:
            names += [f"rl_{run}", f"eval_{run}"]
        return names + ["report"]

    def task_names(self) -> list[str]:
        """The evaluations and RL runs (each writes its marker, also where a parallel stage runs several)."""
        return ["eval_before"] + [f"{kind}_{run}" for run in self.s.runs for kind in ("rl", "eval")]

    def all_done(self) -> bool:
        return all(is_done(self.out, name) for name in self.stage_names())

    # ── the call ──
    def stages(self) -> list[Stage]:
        isolate = self.s.engine == "vllm"
        out = [
            Stage("warmstart", "world, BPE tokenizer, both models; supervised warm-start",
                  lambda: self._measured("warmstart", self.est["warmstart"]),
                  self._isolated("warmstart") if isolate else lambda _: self.warmstart()),
            Stage("eval_before", "held-out evaluation of the warm start",
                  self._eval_estimate,
                  self._isolated("eval_before") if isolate else lambda _: self.evaluate("eval_before")),
        ]
        if self.s.parallel_rl:
            return out[: 1 + self.eval_before_alone] + self._parallel_stages() + [self._report_stage()]
        for run in self.s.runs:
            out += [
                Stage(f"rl_{run}", f"{RUN_TITLES[run]} through the launcher ({self.s.engine} engines)",
                      lambda run=run: self.rl_estimate(run),
                      lambda deadline, run=run: self.rl(run, deadline),
                      min_part_s=self.rl_startup(run) + self.s.rl.save_every * self.rl_step(run) + 30),
                Stage(f"eval_{run}", f"held-out evaluation after {RUN_TITLES[run]}",
                      self._eval_estimate,
                      (self._isolated(f"eval_{run}") if isolate
                       else lambda _, run=run: self.evaluate(f"eval_{run}"))),
            ]
        return out + [self._report_stage()]

    def _report_stage(self) -> Stage:
        return Stage("report", "metrics.jsonl, curves.png, summary.md", lambda: self.est["report"],
                     lambda _: self.report())

    # ── parallel mode: both RL runs at once, on one GPU ──
    def _parallel_stages(self) -> list[Stage]:
        """Both RL runs (and, with the HF evaluation backend, the evaluation before them) at once, then both
        evaluations after. Each run is its own launcher with its own Ray instance and fixed-size vLLM KV caches
        (``--engine.kv_cache_gib``), so neither profiles the memory the other allocates; the models are small, so
        the GPU is far from full and each step mostly waits on the host, where two runs overlap well."""
        rl_tasks = [] if self.eval_before_alone else [("eval_before", self._eval_task("eval_before"))]
        rl_tasks += [(f"rl_{run}", lambda deadline, run=run: self.rl(run, deadline)) for run in self.s.runs]
        eval_tasks = [(f"eval_{run}", self._eval_task(f"eval_{run}")) for run in self.s.runs]
        runs = " and ".join(RUN_TITLES[run] for run in self.s.runs)
        return [
            Stage("rl_parallel", f"{runs} at once through the launcher ({self.s.engine} engines)"
                  + ("" if self.eval_before_alone else ", beside the held-out evaluation of the warm start"),
                  lambda: max(self.rl_estimate(run) for run in self.s.runs),
                  lambda deadline: self._run_at_once("rl_parallel", rl_tasks, deadline),
                  min_part_s=max(self.rl_startup(run) + self.s.rl.save_every * self.rl_step(run)
                                 for run in self.s.runs) + 30),
            Stage("eval_after", "held-out evaluations after RL" + (" at once" if self._evals_at_once else ""),
                  lambda: self._eval_estimate() * (1 if self._evals_at_once else len(eval_tasks)),
                  lambda deadline: self._run_at_once("eval_after", eval_tasks, deadline,
                                                     at_once=self._evals_at_once)),
        ]

    @property
    def _evals_at_once(self) -> bool:
        """Both evaluations after RL at once: in their own processes (``--engine vllm``; transformers' model loading
        is not thread-safe) and without vLLM (its evaluation engines profile the GPU's memory: one at a time)."""
        return self.s.engine == "vllm" and self.s.eval_backend == "hf"

    def _eval_task(self, name: str):
        return self._isolated(name) if self.s.engine == "vllm" else lambda _: self.evaluate(name)

    def _run_at_once(self, stage: str, tasks: list, deadline: float, at_once: bool = True) -> bool:
        """Run the tasks that are not done (each in a thread, or in turn), record each one's wall time, and mark
        ``stage`` done when every task is. A failed task stops the others (``self.stop``) and fails the stage."""
        todo = [(name, task) for name, task in tasks if not is_done(self.out, name)]
        self.splits()  # computed once, before the threads read it
        results: dict[str, bool | BaseException] = {}

        def work(name: str, task) -> None:
            started = time.time()
            try:
                results[name] = task(deadline)
            except BaseException as e:  # noqa: BLE001 (SystemExit from a failed child stage included)
                results[name] = e
                if not self.stop.is_set():
                    # the others stop now (an RL run keeps its last checkpoint): a later call redoes only what is
                    # left, once the cause is fixed
                    line(f"{name} failed; stopping the other tasks of {stage}")
                    self.stop.set()
            self.timings.add(name, time.time() - started)

        self.stop.clear()
        if at_once:
            threads = [threading.Thread(target=work, args=(name, task), name=name) for name, task in todo]
            for thread in threads:
                thread.start()
            try:
                for thread in threads:
                    while thread.is_alive():  # join in steps: Ctrl-C reaches this thread, not the workers
                        thread.join(timeout=0.5)
            except BaseException:
                self.stop.set()  # each task ends its child processes and returns
                for thread in threads:
                    thread.join()
                raise
        else:
            for name, task in todo:
                work(name, task)
        for name, _ in todo:
            if isinstance(results[name], BaseException):
                raise results[name]
        if all(is_done(self.out, name) for name, _ in tasks):
            mark_done(self.out, stage, {"tasks": [name for name, _ in tasks], "at_once": at_once})
            return True
        return False

    def run(self) -> int:
        if self.s.engine == "hf" and not self.all_done():
            import torch

            # the CPU check's tiny models run in this process: one thread each op is several times faster than two
            # threads spinning against each other on a small, busy machine
            torch.set_num_threads(1)
        return run_stages(self.stages(), self.out, self.budget_s, self.timings, on_stage_end=self.on_stage_end)

    def run_stage(self, name: str) -> bool:
        """One stage in this (child) process."""
        if name == "warmstart":
            return self.warmstart()
        if name.startswith("eval_"):
            return self.evaluate(name)
        raise SystemExit(f"error: --_stage {name}: not a stage that runs in its own process")

    def _isolated(self, name: str):
        def run(deadline: float) -> bool:
            from openrlhf_classmate.testing.e2e import stop_session

            command = [sys.executable, "-m", "openrlhf_classmate.demo", *self.argv, "--_stage", name]
            log_path = self.path(MARKERS, f"{name}.log")
            os.makedirs(os.path.dirname(log_path), exist_ok=True)
            started = time.time()
            proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace")
            # the console shows the child's output as it comes, and stages/<name>.log keeps it for the error line
            copier = threading.Thread(target=_tee, args=(proc.stdout, log_path), daemon=True)
            copier.start()
            try:
                while True:
                    try:
                        code = proc.wait(timeout=min(1.0, max(0.01, deadline - time.time())))
                        break
                    except subprocess.TimeoutExpired:
                        if time.time() >= deadline:
                            line(f"stage {name} ran past the call's budget and was stopped; the next call runs it "
                                 "again")
                            return False
                        if self.stop.is_set():
                            line(f"stage {name} stopped; the next call runs it again")
                            return False
            finally:
                if proc.poll() is None:
                    # the warm start's FusedAdam pre-build dies with it, perhaps mid-build: its lock would make the
                    # next launcher wait for a build that will never end
                    stop_session(proc, since=started)
                copier.join(timeout=10)
            if code != 0:
                raise StageFailed(f"the child process exited with {code}; its output: {log_path}", log_path)
            return is_done(self.out, name)

        return run

    # ── estimates ──
    def _measured(self, name: str, default: float) -> float:
        seconds = self.timings.data.get(name, {}).get("seconds")
        return seconds[-1] if seconds else default

    def _eval_estimate(self) -> float:
        """The latest evaluation's time (they all cost the same: two engine starts and the same generation)."""
        names = ["eval_before"] + [f"eval_{run}" for run in self.s.runs]
        measured = [self.timings.last(n, "seconds") for n in names if self.timings.last(n, "seconds") is not None]
        return measured[-1] if measured else self.est["eval"]

    def rl_startup(self, run: str) -> float:
        other = "grpo" if run == "classmate" else "classmate"
        return (self.timings.last(f"rl_{run}", "startup_s") or self.timings.last(f"rl_{other}", "startup_s")
                or self.est["rl_startup"][run])

    def rl_step(self, run: str) -> float:
        """Seconds per step: this run's last measurement, else the other run's, else the default estimate (times
        :data:`PARALLEL_SLOWDOWN` for a run beside another)."""
        other = "grpo" if run == "classmate" else "classmate"
        own = self.timings.last(f"rl_{run}", "step_s")
        if own:
            return own
        return (self.timings.last(f"rl_{other}", "step_s")
                or self.est["rl_step"][run] * (PARALLEL_SLOWDOWN if self.s.parallel_rl else 1.0))

    def rl_estimate(self, run: str) -> float:
        from openrlhf_classmate.demo.rl_stage import checkpoint_step

        left = self.s.rl.steps - checkpoint_step(self.path("runs", run))
        return self.rl_startup(run) + left * self.rl_step(run) + self.est["rl_end"]

    # ── stages ──
    def warmstart(self) -> bool:
        import torch

        from openrlhf_classmate.demo import warmstart as S
        from openrlhf_classmate.demo.evaluate import true_chain

        cuda = self.s.engine == "vllm"
        device = "cuda" if cuda else "cpu"
        prebuild = _prebuild_fused_adam() if cuda else None
        t0 = time.time()
        tok = G.build_tokenizer(self.s.seed)
        train, held = self.splits()
        W.write_prompts(self.path("world", "train.jsonl"), train)
        W.write_prompts(self.path("world", "heldout.jsonl"), held)
        main_model, cm_model = G.new_models(tok, self.s.sizes, self.s.seed)
        info = {"main_params": _params(main_model), "classmate_params": _params(cm_model), "vocab": len(tok),
                "main_size": list(dataclasses.astuple(self.s.sizes.main)),
                "classmate_size": list(dataclasses.astuple(self.s.sizes.classmate)),
                "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                # where two demos share a host (one GPU each), their seeds' times are read with this
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "host_cpus": os.cpu_count()}
        example = held[0]
        chain = W.response_text(W.chain_text(example, true_chain(example)), str(example.answer))
        line(f"{len(train)} training prompts, {len(held)} held-out problems, e.g. '{example.text}' -> {example.answer}")
        line(f"a legible, correct CoT ({len(tok.encode(chain, add_special_tokens=False))} tokens): {chain}")
        line(f"main model {info['main_params']:,} params, classmate {info['classmate_params']:,} params, "
             f"byte-level BPE vocabulary {info['vocab']} tokens")
        rng = random.Random(self.s.seed)
        pool = G.fresh_problems(rng, self.s.main_pool_problems, set(held))
        main_data = S.main_examples(tok, pool, rng, G.TRACES, per_problem=4, spec=G.SPEC)
        cm_data = S.classmate_examples(tok, tok, pool[: self.s.classmate_pool_problems], rng, per_problem=2,
                                       spec=G.SPEC, reads=G.CLASSMATE_READS)
        line(f"{len(main_data):,} main traces, {len(cm_data):,} classmate examples built in {time.time() - t0:.0f} s")
        losses = {}
        every = max(1, self.s.main_sft_steps // 6)
        for name, model, data, steps, seed in (("main", main_model, main_data, self.s.main_sft_steps, self.s.seed),
                                               ("classmate", cm_model, cm_data, self.s.classmate_sft_steps,
                                                self.s.seed + 1)):
            line(f"{name}: {steps} steps x {self.s.sft_batch} on {device}")
            model.to(device)
            losses[name] = S.train(model, data, tok.pad_token_id, steps, self.s.sft_batch, self.s.sft_lr, seed,
                                   log=line, log_every=every, device=device)
            G.save(model.cpu(), tok, self.main_path if name == "main" else self.classmate_path)
        if prebuild is not None:
            _wait_prebuild(prebuild)
        mark_done(self.out, "warmstart", {"models": info, "losses": losses})
        return True

    def evaluate(self, name: str) -> bool:
        from openrlhf_classmate.demo import evaluate as E
        from openrlhf_classmate.demo.report import strip_rows

        run = name.removeprefix("eval_")
        model = self.main_path if run == "before" else self.path("runs", run, "final")
        _, held = self.splits()
        result = E.evaluate_saved(model, self.classmate_path, held, self.s.eval_samples, self.s.seed + 2,
                                  backend=self.s.eval_backend, max_new_tokens=self.s.rl.max_new_tokens,
                                  classmate_max_new_tokens=self.s.rl.classmate_max_new_tokens,
                                  style_names=G.STYLE_NAMES)
        E.write_rows(self.path("eval_before.jsonl" if run == "before" else f"eval_after_{run}.jsonl"), result)
        line(E.summary_line(result))
        line(E.style_line(result))
        mark_done(self.out, name, {"model": model, "backend": self.s.eval_backend, "result": strip_rows(result)})
        return True

    def rl(self, run: str, deadline: float) -> bool:
        from openrlhf_classmate.demo import rl_stage as RL
        from openrlhf_classmate.demo.launch import gpu_launcher_argv
        from openrlhf_classmate.demo.report import step_line

        run_dir = self.path("runs", run)
        steps = self.s.rl.steps
        if RL.final_saved(run_dir) and set(range(1, steps + 1)) <= set(RL.read_steps(run_dir)):
            mark_done(self.out, f"rl_{run}", {"steps": steps, "note": "the launcher had finished"})
            return True
        argv = gpu_launcher_argv(run_dir, self.main_path, self.path("world", "train.jsonl"), self.s.rl,
                                 self.s.seed, self.classmate_path if run == "classmate" else None,
                                 engine=self.s.engine, max_len=self.s.max_len, enforce_eager=self.s.enforce_eager)
        resumed = RL.checkpoint_step(run_dir)
        line(f"{'resuming from the checkpoint of step ' + str(resumed) if resumed else 'starting'}: Ray, DeepSpeed "
             f"and the engines (~{self.rl_startup(run):.0f} s) ...")

        label = f"{RUN_TITLES[run]}: " if self.s.parallel_rl else ""  # two runs print into one console

        def on_step(step: int, status: dict, elapsed: float) -> None:
            line(f"{label}{step_line(run, step, steps, status)}  ({elapsed:.0f}s)")

        env = None
        if self.s.parallel_rl:
            # each run its own vLLM compile cache: the two policy engines would write the same entry at the same
            # time (each launcher starts a Ray instance of its own: ray.init joins only clusters of `ray start`)
            env = {"VLLM_CACHE_ROOT": self.path("cache", f"vllm_{run}")}
        outcome = RL.run(run_dir, argv, steps=steps, save_every=self.s.rl.save_every, env=env, stop=self.stop,
                         deadline=deadline, max_new_steps=self.rl_steps_per_call,
                         step_estimate_s=self.rl_step(run), on_step=on_step)
        self.timings.measure(f"rl_{run}", startup_s=outcome.startup_s, step_s=outcome.step_s)
        line(f"launcher log: {os.path.join(run_dir, 'launcher.log')}")
        if not outcome.finished:
            line(f"stopped after the checkpoint of step {outcome.step} ({outcome.stopped}); the next call resumes "
                 "from it")
            return False
        logged = set(RL.read_steps(run_dir))
        if not set(range(1, steps + 1)) <= logged:
            raise RuntimeError(f"{RUN_TITLES[run]}: steps {sorted(set(range(1, steps + 1)) - logged)} were never "
                               f"logged ({os.path.join(run_dir, 'steps.jsonl')})")
        mark_done(self.out, f"rl_{run}", {"steps": steps, "resumed_from": resumed,
                                          "enforce_eager": self.s.enforce_eager})
        return True

    def report(self) -> bool:
        from openrlhf_classmate.demo.gpu_report import write_report

        write_report(self)
        mark_done(self.out, "report", {"files": ["metrics.jsonl", "curves.png", "summary.md", "summary.json"]})
        return True


def _tee(stream, path: str) -> None:
    """Copy a child's output to the console and to ``path``, line by line."""
    with open(path, "w", encoding="utf-8") as log:
        for text in stream:
            sys.stdout.write(text)
            sys.stdout.flush()
            log.write(text)
            log.flush()


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _prebuild_fused_adam() -> tuple[subprocess.Popen, float] | None:
    """Build DeepSpeed's FusedAdam (a JIT op the launcher's actor needs) while the GPU trains, in a child process;
    the torch-extensions cache then spares the first RL start that build. Best effort: a failure leaves it to the
    launcher."""
    code = "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()"
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL), time.time()
    except OSError:
        return None


def _wait_prebuild(prebuild: tuple[subprocess.Popen, float]) -> None:
    from openrlhf_classmate.testing.e2e import release_build_locks

    proc, started = prebuild
    t0 = time.time()
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        release_build_locks(since=started)  # a later build would wait on the killed one's lock forever
        code = "killed after 300 s"
    if time.time() - t0 > 1:
        line(f"waited {time.time() - t0:.0f} s for the DeepSpeed FusedAdam build (exit {code})")

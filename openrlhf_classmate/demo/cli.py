"""``python -m openrlhf_classmate.demo``: the embedded CPU demo of classmate CoT training, end to end.

Stages: build the arithmetic world (problems, tokenizer, two tiny models) -> warm-start both models with a plain
supervised loop -> evaluate on held-out problems -> classmate GDPO through the real launcher (Ray, DeepSpeed, the
policy and classmate engine groups) -> evaluate the checkpoints -> (``--compare-grpo``) the same with plain GRPO ->
``metrics.jsonl``, ``curves.png``, ``summary.md``, ``summary.json`` and the evaluation details in ``--output-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from openrlhf_classmate.demo import report as R
from openrlhf_classmate.demo.launch import RLConfig

MAIN_SIZE = (64, 2)  # hidden size, layers (4 heads, MLP 4x): ~134k parameters
CLASSMATE_SIZE = (32, 2)  # ~34k parameters
DEFAULT_OUTPUT = "outputs/demo"


@dataclass(frozen=True)
class Settings:
    num_train: int = 2500
    num_eval: int = 200
    eval_samples: int = 4
    main_sft_steps: int = 1000
    classmate_sft_steps: int = 500
    sft_batch: int = 128
    sft_lr: float = 1e-2
    rl: RLConfig = RLConfig(steps=40, save_every=5)


FULL = Settings()
QUICK = Settings(num_eval=100, rl=RLConfig(steps=10, save_every=5))  # same world and warm-start, short RL


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from openrlhf_classmate.demo import gpu

    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_classmate.demo",
        description="Embedded CPU demo: classmate CoT training on a tiny multi-step arithmetic world, through the "
        "real launcher (Ray + DeepSpeed + HF engines). Writes metrics.jsonl, curves.png and summary.md. With --gpu: "
        "the same at GPU scale with vLLM engines, in resumable stages (docs/demo.md).",
    )
    parser.add_argument("--output-dir", default=None,
                        help=f"where everything goes (default {DEFAULT_OUTPUT}; --gpu: {gpu.DEFAULT_OUTPUT}); a later "
                        "run removes the files the demo recorded writing there, and nothing else")
    parser.add_argument("--seed", type=int, default=0, help="seeds the world, the warm-start, RL and evaluation")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default 40; --quick: 10; --gpu: 100)")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="held-out evaluation of a checkpoint every N steps (default 5)")
    parser.add_argument("--compare-grpo", action="store_true",
                        help="also train plain GRPO (no classmate) from the same warm start and plot both")
    parser.add_argument("--quick", action="store_true",
                        help="shortened run (10 RL steps, 100 held-out problems), used by the tests")
    gpu.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.eval_every is not None and args.eval_every < 1:
        parser.error("--eval-every must be >= 1")
    gpu.check_arguments(parser, args)
    R.check_output_dir(args.output_dir or (gpu.DEFAULT_OUTPUT if args.gpu else DEFAULT_OUTPUT))
    return args


class Progress:
    def __init__(self, num_stages: int, on_stage_end: Callable[[], None] = lambda: None):
        self.start = time.time()
        self.num_stages = num_stages
        self.stage = 0
        self.timings: dict[str, float] = {}
        self.on_stage_end = on_stage_end

    def header(self, text: str) -> float:
        self.stage += 1
        print(f"\n[{self.stage}/{self.num_stages}] {text}  (t = {self.clock()})", flush=True)
        return time.time()

    def clock(self) -> str:
        s = int(time.time() - self.start)
        return f"{s // 60}:{s % 60:02d}"

    def done(self, name: str, since: float) -> None:
        self.timings[name] = time.time() - since
        self.on_stage_end()

    @staticmethod
    def line(text: str) -> None:
        print(f"    {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.gpu:
        from openrlhf_classmate.demo import gpu

        return gpu.main(args, argv)

    settings = QUICK if args.quick else FULL
    rl = dataclasses.replace(settings.rl, steps=args.steps or settings.rl.steps,
                             save_every=args.eval_every or settings.rl.save_every)
    if rl.steps * rl.prompts_per_step > settings.num_train:
        raise SystemExit(f"--steps {rl.steps} needs {rl.steps * rl.prompts_per_step} training prompts; the world has "
                         f"{settings.num_train}")
    out = os.path.abspath(args.output_dir or DEFAULT_OUTPUT)
    R.clear_previous_run(out)  # the files earlier runs recorded writing, and nothing else
    since = R.claim_output_dir(out)
    runs = ["classmate"] + (["grpo"] if args.compare_grpo else [])
    progress = Progress(num_stages=3 + 2 * len(runs) + 1, on_stage_end=lambda: R.record_written(out, since))
    try:
        return run_demo(args, settings, rl, out, runs, progress)
    finally:
        # also after a failure or Ctrl-C: the next run can then clear what this one wrote
        R.record_written(out, since)


def run_demo(args: argparse.Namespace, settings: Settings, rl: RLConfig, out: str, runs: list[str],
             progress: Progress) -> int:
    """The stages, writing into ``out`` (claimed by :func:`main`, which records what they write)."""
    import torch  # the package import above has already installed the CPU shims
    from transformers import AutoModelForCausalLM

    from openrlhf_classmate.demo import evaluate as E
    from openrlhf_classmate.demo import launch as L
    from openrlhf_classmate.demo import models as M
    from openrlhf_classmate.demo import transfer as T
    from openrlhf_classmate.demo import warmstart as S
    from openrlhf_classmate.demo import world as W

    print(f"Classmate CoT demo: seed {args.seed}, {rl.steps} RL steps, output {out}"
          f"{' (quick mode)' if args.quick else ''}", flush=True)

    # ── 1. the world ──
    t = progress.header("Building the world: multi-step arithmetic, word-level tokenizer, two tiny models")
    world_dir = os.path.join(out, "world")
    train, held_out = W.make_splits(args.seed, settings.num_train, settings.num_eval)
    prompts_path = W.write_prompts(os.path.join(world_dir, "train.jsonl"), train)
    heldout_path = W.write_prompts(os.path.join(world_dir, "heldout.jsonl"), held_out)
    main_model, main_tok = M.new_model(W.WORDS, M.ModelSize(*MAIN_SIZE), seed=args.seed)
    cm_model, cm_tok = M.new_model(W.WORDS, M.ModelSize(*CLASSMATE_SIZE), seed=args.seed + 1)
    rng = random.Random(args.seed)
    main_data = S.main_examples(main_tok, train, rng, W.WorldConfig(), per_problem=4)
    cm_data = S.classmate_examples(cm_tok, main_tok, train, rng, per_problem=3)
    models_info = {"main_params": M.num_parameters(main_model), "classmate_params": M.num_parameters(cm_model),
                   "vocab": len(main_tok), "main_size": MAIN_SIZE, "classmate_size": CLASSMATE_SIZE}
    progress.line(f"{len(train)} training prompts, {len(held_out)} held-out problems, e.g. "
                  f"'{held_out[0].text}' -> {held_out[0].answer}")
    progress.line(f"main model {models_info['main_params']:,} params, classmate {models_info['classmate_params']:,} "
                  f"params, vocabulary {models_info['vocab']} tokens")
    example = W.response_text(W.chain_text(held_out[0], E.true_chain(held_out[0])), str(held_out[0].answer))
    progress.line(f"a legible, correct CoT: {example}")
    progress.done("build world", t)

    # ── 2. warm-start ──
    t = progress.header("Warm-start (plain supervised loop): main model on imperfect traces, classmate as a CoT reader")
    progress.line(f"main: {settings.main_sft_steps} steps x {settings.sft_batch} traces "
                  "(25% full chain, 35% last step done silently, 40% no CoT; 12% of steps wrong)")
    S.train(main_model, main_data, main_tok.pad_token_id, settings.main_sft_steps, settings.sft_batch,
            settings.sft_lr, args.seed, log=progress.line)
    progress.line(f"classmate: {settings.classmate_sft_steps} steps x {settings.sft_batch} (CoT -> its last number)")
    S.train(cm_model, cm_data, cm_tok.pad_token_id, settings.classmate_sft_steps, settings.sft_batch,
            settings.sft_lr, args.seed + 1, log=progress.line)
    policy_path = M.save_model(main_model, main_tok, os.path.join(world_dir, "main_warmstart"))
    classmate_path = M.save_model(cm_model, cm_tok, os.path.join(world_dir, "classmate"))
    progress.done("warm-start", t)

    # ── 3. evaluation before RL ──
    t = progress.header("Held-out evaluation before RL")

    def evaluate(model) -> dict:
        return E.evaluate(model, main_tok, cm_model, cm_tok, held_out, settings.eval_samples, seed=args.seed + 2)

    before = evaluate(main_model)
    E.write_rows(os.path.join(out, "eval_before.jsonl"), before)
    progress.line(E.summary_line(before))
    progress.done("eval before", t)
    del main_model

    # ── 4. RL runs ──
    results: dict[str, dict] = {}
    curves: dict[str, dict[int, dict]] = {}
    transfer: dict[str, dict] = {}
    metric_rows: list[dict] = []
    for run in runs:
        label = R.RUN_LABELS[run]
        t = progress.header(f"RL with {label} through the launcher (Ray + DeepSpeed + HF engines on CPU)")
        run_dir = os.path.join(out, "runs", run)
        argv = L.launcher_argv(run_dir, policy_path, prompts_path, rl, args.seed,
                               classmate_path if run == "classmate" else None)
        parsed: dict[int, dict] = {}
        progress.line("starting Ray, the DeepSpeed actor and the engine groups (about 30 s) ...")

        def on_step(step: int, metrics: dict, elapsed: float, parsed=parsed, run=run) -> None:
            parsed[step] = metrics
            progress.line(f"{R.step_line(run, step, rl.steps, metrics)}  ({elapsed:.0f}s)")

        L.run_launcher(run_dir, argv, on_step)
        progress.line(f"launcher log: {os.path.join(run_dir, 'launcher.log')}")
        rows = R.step_rows(run, R.read_tensorboard(os.path.join(run_dir, "tensorboard")), parsed)
        if len(rows) != rl.steps:
            raise RuntimeError(f"{label}: expected {rl.steps} logged steps, found {len(rows)}")
        metric_rows += rows
        progress.done(f"RL {label}", t)

        t = progress.header(f"Held-out evaluation of the {label} checkpoints")
        curves[run] = {0: R.strip_rows(before)}
        final_path = os.path.join(run_dir, "final")
        points = {s: p for s, p in L.checkpoints(run_dir).items() if s < rl.steps}
        points[rl.steps] = final_path
        for step in sorted(points):
            model = AutoModelForCausalLM.from_pretrained(points[step], dtype=torch.float32)
            result = evaluate(model)
            curves[run][step] = R.strip_rows(result)
            progress.line(f"step {step:3d}: {E.summary_line(result)}")
            if step == rl.steps:
                results[run] = result
                E.write_rows(os.path.join(out, f"eval_after_{run}.jsonl"), result)
        # truncated-CoT transfer of the same checkpoints and the warm start: evaluate's checkpoint sweep
        transfer[run] = T.run_sweep(T.sweep_argv(
            os.path.join(run_dir, "transfer"), heldout_path, policy_path, classmate_path, points,
            samples=settings.eval_samples, max_new_tokens=E.MAX_NEW_TOKENS,
            classmate_max_new_tokens=E.CLASSMATE_MAX_NEW_TOKENS, seed=args.seed + 2))
        transfer[run]["plot"] = os.path.relpath(transfer[run]["plot"], out)
        for step, curve in transfer[run]["curves"].items():
            progress.line(T.line(step, curve))
        progress.done(f"eval {label}", t)

    # ── 5. report ──
    t = progress.header("Writing metrics.jsonl, curves.png, summary.md")
    R.write_metrics(os.path.join(out, "metrics.jsonl"), metric_rows)
    summary = {
        "seed": args.seed,
        "quick": args.quick,
        "rl": dataclasses.asdict(rl),
        "world": {"num_operands": W.NUM_OPERANDS, "max_operand": W.MAX_OPERAND, "max_result": W.MAX_RESULT,
                  "num_train": len(train), "num_eval": len(held_out), **dataclasses.asdict(W.WorldConfig())},
        "models": models_info,
        "eval": {"before": R.strip_rows(before), **{run: R.strip_rows(r) for run, r in results.items()}},
        "curves": curves,
        "transfer": transfer,
        "timings": progress.timings,
    }
    title = R.headline(f"Classmate CoT demo (seed {args.seed}): held-out accuracy before -> after, classmate GDPO",
                       before, results)
    R.plot(os.path.join(out, "curves.png"), metric_rows, curves, title)
    progress.done("report", t)
    progress.timings["total"] = time.time() - progress.start
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    markdown = R.summary_markdown(summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown)

    print("\n" + markdown, flush=True)
    print(f"Done in {progress.clock()}. Artefacts in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

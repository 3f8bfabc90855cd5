"""``python -m openrlhf_classmate.demo --gpu``: the demo at GPU scale, through the production layout, in resumable
stages (see docs/demo.md, "The GPU demo").

Stages (:mod:`openrlhf_classmate.demo.gpu_stages`): ``warmstart`` (world, tokenizer, both models, supervised
warm-start on the GPU) -> ``eval_before`` -> ``rl_classmate`` (classmate GDPO through the launcher, vLLM engines)
-> ``eval_classmate`` -> with ``--compare-grpo``: ``rl_grpo`` -> ``eval_grpo`` -> ``report``. A finished stage is
never run again; ``--budget-s`` bounds one call (a stage that would not fit is left to the next call, an RL stage
stops at a checkpoint), so the same command is repeated until it exits 0.

``--tiny`` shrinks everything (models, world sizes, steps) and ``--engine hf`` runs the same stages on CPU with the
HF-transformers engines: the check ``tests/test_gpu_demo.py`` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass

from openrlhf_classmate.demo import gpu_world as G
from openrlhf_classmate.demo.launch import RLConfig
from openrlhf_classmate.demo.stages import EXIT_UNFINISHED, read_json, write_json

DEFAULT_OUTPUT = "outputs/gpu_demo"


@dataclass(frozen=True)
class GPUSettings:
    """Everything that defines a GPU demo run (saved to ``settings.json``; a later call must match it)."""

    seed: int
    tiny: bool
    engine: str
    eval_backend: str  # cli.evaluate's generation backend for the held-out evaluations
    enforce_eager: bool  # RL engines without CUDA graphs (a fallback; the production layout captures them)
    compare_grpo: bool
    parallel_rl: bool  # with compare_grpo: both RL runs at once on the one GPU (default), or one after the other
    sizes: G.Sizes
    num_eval: int  # held-out problems
    eval_samples: int  # main-model samples per held-out problem (temperature 1)
    main_sft_steps: int
    classmate_sft_steps: int
    sft_batch: int
    sft_lr: float
    main_pool_problems: int  # the main warm-start traces: 4 per problem of this many fresh problems
    classmate_pool_problems: int  # the classmate's: 2 per problem
    rl: RLConfig

    @property
    def runs(self) -> list[str]:
        return ["classmate"] + (["grpo"] if self.compare_grpo else [])

    @property
    def max_len(self) -> int:
        """``--data.max_len`` (prompt + response): the longest prompt is 41 tokens."""
        return 48 + self.rl.max_new_tokens

    def as_dict(self) -> dict:
        return json.loads(json.dumps(dataclasses.asdict(self)))


FULL = GPUSettings(
    seed=0, tiny=False, engine="vllm", eval_backend="hf", enforce_eager=False, compare_grpo=False, parallel_rl=False,
    sizes=G.FULL_SIZES, num_eval=400,
    eval_samples=8,
    main_sft_steps=1500, classmate_sft_steps=400, sft_batch=256, sft_lr=1e-3, main_pool_problems=24_000,
    classmate_pool_problems=8_000,
    rl=RLConfig(steps=100, prompts_per_step=64, samples_per_prompt=8, lr=1e-4, save_every=10, max_new_tokens=128,
                classmate_max_new_tokens=8),
)
TINY = dataclasses.replace(  # a few seconds per stage on CPU: the mechanics, not the learning
    FULL, tiny=True, engine="hf", eval_backend="hf", sizes=G.TINY_SIZES, num_eval=6, eval_samples=2,
    main_sft_steps=10, classmate_sft_steps=6, sft_batch=16, main_pool_problems=40, classmate_pool_problems=20,
    rl=RLConfig(steps=4, prompts_per_step=4, samples_per_prompt=4, lr=1e-4, save_every=2, max_new_tokens=32,
                classmate_max_new_tokens=8),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    gpu = parser.add_argument_group("GPU demo (--gpu)")
    gpu.add_argument("--gpu", action="store_true",
                     help="the GPU demo: harder world, byte-level BPE, 26M/7M models, classmate GDPO through the "
                          "launcher with vLLM engines in the production layout (see docs/demo.md)")
    gpu.add_argument("--tiny", action="store_true", help="with --gpu: tiny models and a 4-step run (a quick check)")
    gpu.add_argument("--engine", choices=("vllm", "hf"), default=None,
                     help="with --gpu: vllm (default; needs a GPU and vLLM) or hf (with --tiny: HF engines on CPU)")
    gpu.add_argument("--eval-backend", choices=("vllm", "hf"), default=None,
                     help="with --gpu: generation backend of the held-out evaluations: hf (default: transformers "
                          "generate on the GPU, ~30-50 s for these small models, and evaluations can run beside the "
                          "RL runs) or vllm (cli.evaluate's vLLM backend: two engine starts per evaluation, ~2 min)")
    gpu.add_argument("--enforce-eager", action="store_true",
                     help="with --gpu: RL engines without CUDA graphs (--vllm.enforce_eager), a fallback where their "
                          "capture fails; the production layout (default) uses them")
    gpu.add_argument("--sequential-rl", action="store_true",
                     help="with --gpu --compare-grpo: run plain GRPO after classmate GDPO instead of both at once on "
                          "the one GPU (each launcher then has the host to itself; the demo takes longer)")
    gpu.add_argument("--lr", type=float, default=None, help="with --gpu: the RL learning rate (default 1e-4)")
    gpu.add_argument("--budget-s", type=float, default=None,
                     help="with --gpu: seconds this call may take; a stage that would not fit is left to the next "
                          "call (an RL stage stops at a checkpoint), and the call exits 75 with what is left")
    gpu.add_argument("--rl-steps-per-call", type=int, default=None,
                     help="with --gpu: stop an RL stage at the first checkpoint after this many new steps")
    gpu.add_argument("--fresh", action="store_true",
                     help="with --gpu: remove an earlier GPU demo run in --output-dir and start over")
    gpu.add_argument("--_stage", default=None, help=argparse.SUPPRESS)  # internal: one stage in a child process


GPU_ONLY = ("tiny", "engine", "eval_backend", "enforce_eager", "sequential_rl", "lr", "budget_s", "rl_steps_per_call", "fresh", "_stage")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One line per misuse, before anything runs."""
    if not args.gpu:
        for name in GPU_ONLY:
            if getattr(args, name) not in (None, False):
                parser.error(f"--{name.replace('_', '-')} belongs to the GPU demo: add --gpu")
        return
    if args.quick:
        parser.error("--quick is the CPU demo's short run; the GPU demo's is --gpu --tiny")
    if args.eval_every is not None:
        parser.error("--eval-every: the GPU demo evaluates before and after RL only (each evaluation starts two vLLM "
                     "engines); drop it")
    if args.engine == "hf" and not args.tiny:
        parser.error("--engine hf runs the tiny CPU check only: add --tiny, or use --engine vllm on a GPU machine")
    engine = args.engine or ("hf" if args.tiny else "vllm")
    if args.enforce_eager and engine == "hf":
        parser.error("--enforce-eager is for vLLM engines; the CPU check (--engine hf) has none: drop it")
    if args.eval_backend == "vllm" and engine == "hf":
        parser.error("--eval-backend vllm with --engine hf: the CPU check has no vLLM; drop --eval-backend")
    if args.sequential_rl and not args.compare_grpo:
        parser.error("--sequential-rl orders the two RL runs of --compare-grpo: add --compare-grpo, or drop it")
    for name in ("budget_s", "lr"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.rl_steps_per_call is not None and args.rl_steps_per_call < 1:
        parser.error("--rl-steps-per-call must be >= 1")


def settings_from_args(args: argparse.Namespace) -> GPUSettings:
    base = TINY if args.tiny else FULL
    rl = dataclasses.replace(base.rl, steps=args.steps or base.rl.steps, lr=args.lr or base.rl.lr)
    engine = args.engine or ("hf" if args.tiny else "vllm")
    return dataclasses.replace(base, seed=args.seed, compare_grpo=args.compare_grpo, rl=rl, engine=engine,
                               parallel_rl=args.compare_grpo and not args.sequential_rl,
                               eval_backend=args.eval_backend or "hf", enforce_eager=args.enforce_eager)


def _check_machine(settings: GPUSettings) -> None:
    if settings.engine != "vllm":
        return
    from openrlhf_classmate.eval.generation import real_vllm_available

    if not real_vllm_available():
        raise SystemExit("error: --engine vllm: vLLM is not installed here (install it, or run the CPU check with "
                         "--tiny --engine hf)")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: --engine vllm needs a CUDA GPU; none is visible (the CPU check: --tiny --engine hf)")
    settings.sizes.check_head_dims()


PER_CALL = ("eval_backend", "enforce_eager")  # may change between calls: each stage records what it ran with


def _check_settings(out: str, settings: GPUSettings) -> None:
    """Write ``settings.json`` on the first call; refuse a later call whose settings differ (but for
    :data:`PER_CALL`)."""
    path = os.path.join(out, "settings.json")
    saved = read_json(path, None)
    current = settings.as_dict()
    if saved is None:
        write_json(path, current)
        return
    changed = sorted(k for k in current if k not in PER_CALL and saved.get(k) != current.get(k))
    if changed:
        raise SystemExit(f"error: {out} holds a GPU demo run with other settings ({', '.join(changed)} differ): use "
                         "the same flags to go on, another --output-dir, or --fresh to start over")


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """The GPU demo (``args`` parsed and checked by ``demo.cli``; ``argv`` is passed on to stage processes)."""
    from openrlhf_classmate.demo import report as R
    from openrlhf_classmate.demo.gpu_stages import GPUDemo

    settings = settings_from_args(args)
    out = os.path.abspath(args.output_dir or DEFAULT_OUTPUT)
    if args._stage:  # a child process of the call below
        return 0 if GPUDemo(settings, out, argv).run_stage(args._stage) else EXIT_UNFINISHED
    if args.fresh:
        R.clear_previous_run(out)  # the files earlier calls recorded writing, and nothing else
    since = R.claim_output_dir(out)  # resuming: a folder of an earlier GPU demo run, or a new one
    try:
        _check_settings(out, settings)
        # the stages' child processes write, this process records after each stage
        demo = GPUDemo(settings, out, argv, budget_s=args.budget_s, rl_steps_per_call=args.rl_steps_per_call,
                       on_stage_end=lambda: R.record_written(out, since))
        if not demo.all_done():
            _check_machine(settings)
        print(f"GPU classmate CoT demo: seed {settings.seed}, {settings.rl.steps} RL steps of "
              f"{settings.rl.prompts_per_step} prompts x {settings.rl.samples_per_prompt} samples, engine "
              f"{settings.engine}{' (tiny)' if settings.tiny else ''}, output {out}", flush=True)
        code = demo.run()
    finally:
        # also after a failure or Ctrl-C: --fresh can then clear what this call wrote
        R.record_written(out, since)
    sys.stdout.flush()
    return code

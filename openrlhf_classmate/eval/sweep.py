"""``evaluate --run-dir RUN`` / ``--checkpoints DIR...``: every saved checkpoint of a run, evaluated alike.

    python -m openrlhf_classmate.cli.evaluate --run-dir runs/classmate_gdpo --data data/gsm8k/test.jsonl \\
        --classmate Qwen/Qwen3-0.6B --reader meta-llama/Llama-3.2-1B-Instruct --truncate-cot 0,0.25,0.5,0.75,1

1. The checkpoints: ``RUN/ckpt/global_stepN_hf`` (``--ckpt.save_hf``; or ``RUN/global_stepN_hf`` when RUN is the
   ``--ckpt.path`` itself), ``RUN/final`` (``--ckpt.output_dir`` as the train scripts lay it out; its step is
   ``--final-step``, else the last step of ``RUN/tensorboard``'s events) and ``--start-model`` (step 0); or the
   ``--checkpoints`` folders (``DIR`` named ``global_stepN[_hf]`` / ``stepN``, or ``STEP=DIR``). In step order.
2. Each checkpoint is evaluated by ``evaluate`` itself (the same test file, seeds and sampling), into
   ``OUT/<checkpoint>/`` (``samples.jsonl``, ``summary.json``, plots), then ``OUT/<checkpoint>/sweep_entry.json``
   is written atomically: a checkpoint with one is skipped when the sweep runs again (resumable). An entry written
   with other settings (another test file, seed, sampling, readers, ...) is refused, naming what differs.
3. ``OUT/sweep.json`` (settings and every checkpoint's metrics), ``OUT/sweep.csv`` (one row per checkpoint x metric)
   and the plots of :mod:`.sweep_report` (metrics vs step; transfer curves: reader score vs CoT fraction, one line
   per checkpoint).

Everything is checked (the data, the flags, every checkpoint folder and tokenizer, every reader's tokenizer) before
the first checkpoint is evaluated. Engines: each ``evaluate`` loads one engine per model (policy, classmate, each
reader) and frees it before the next, so a checkpoint never shares the GPU with another's engines.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from openrlhf_classmate.eval.common import EvaluationError, hold_output_dir, load_tokenizer, log, write_json

ENTRY = "sweep_entry.json"
# flags that change how fast, where or how verbosely, never what is measured: left out of the resume check
NOT_SETTINGS = frozenset({
    "model", "output_dir", "run_dir", "checkpoints", "start_model", "final_step", "batch_size", "tensor_parallel_size",
    "gpu_memory_utilization", "enforce_eager", "judge_max_concurrency", "judge_timeout", "judge_api_key_env",
    "no_plot", "quiet",
})
_STEP_NAME = re.compile(r"^(?:global_step|step_?)(\d+)(?:_hf)?$")


@dataclass(frozen=True)
class Checkpoint:
    name: str
    """Its folder under the sweep's output directory (``start``, ``global_stepN``, ``stepN``, ``final``)."""
    path: str
    step: int | None
    """Training step; ``None``: unknown (a final model without ``--final-step`` or logged steps)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checkpoint sweep (instead of --model)")
    group.add_argument("--run-dir", default=None, metavar="RUN",
                       help="evaluate every checkpoint of a run: RUN/ckpt/global_stepN_hf (--ckpt.save_hf) and "
                            "RUN/final (--ckpt.output_dir), in step order; resumable")
    group.add_argument("--checkpoints", nargs="+", default=None, metavar="DIR",
                       help="evaluate these model folders in step order (named global_stepN[_hf] / stepN, or "
                            "given as STEP=DIR); resumable")
    group.add_argument("--start-model", default=None, metavar="MODEL",
                       help="also evaluate the starting model (the run's --actor.model_name_or_path) as step 0")
    group.add_argument("--final-step", type=int, default=None,
                       help="training step of RUN/final (default: the last step logged in RUN/tensorboard)")


def is_sweep(args) -> bool:
    return args.run_dir is not None or bool(args.checkpoints)


# ── the checkpoints ──────────────────────────────────────────────────────────────────────────────────────────────


def _last_logged_step(run_dir: str) -> int | None:
    """The largest step in the run's tensorboard event files (the train scripts' ``RUN/tensorboard``), if any."""
    files = glob.glob(os.path.join(run_dir, "tensorboard", "**", "events.out.tfevents.*"), recursive=True)
    if not files:
        return None
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError:
        return None
    steps = [event.step for path in files for event in EventFileLoader(path).Load() if event.HasField("summary")]
    return max(steps) if steps else None


def _run_dir_checkpoints(run_dir: str, final_step: int | None) -> list[Checkpoint]:
    if not os.path.isdir(run_dir):
        raise EvaluationError(f"--run-dir {run_dir} is not a folder")
    out = []
    for folder in (os.path.join(run_dir, "ckpt"), run_dir):
        for path in sorted(glob.glob(os.path.join(folder, "global_step*_hf"))):
            match = _STEP_NAME.match(os.path.basename(path))
            if match and os.path.isdir(path):
                out.append(Checkpoint(os.path.basename(path).removesuffix("_hf"), path, int(match.group(1))))
    final = os.path.join(run_dir, "final")
    if os.path.isdir(final):
        out.append(Checkpoint("final", final, final_step if final_step is not None else _last_logged_step(run_dir)))
    if not out:
        raise EvaluationError(
            f"--run-dir {run_dir} has no checkpoints: expected {os.path.join(run_dir, 'ckpt', 'global_stepN_hf')} "
            f"folders (train with --ckpt.save_hf) or {final} (--ckpt.output_dir); for another layout list the "
            "model folders with --checkpoints")
    return out


def _listed_checkpoints(specs: list[str], final_step: int | None) -> list[Checkpoint]:
    out = []
    for spec in specs:
        step_text, sep, path = spec.partition("=")
        if not sep:
            step_text, path = "", spec
        name = os.path.basename(os.path.normpath(path))
        if step_text:
            if not step_text.isdigit():
                raise EvaluationError(f"--checkpoints {spec}: STEP=DIR needs a step >= 0, got {step_text!r}")
            step = int(step_text)
        elif _STEP_NAME.match(name):
            step = int(_STEP_NAME.match(name).group(1))
        elif name == "final":
            step = final_step
        else:
            raise EvaluationError(f"--checkpoints {spec}: the training step cannot be read from the folder name; "
                                  f"give it as STEP={spec}")
        label = "final" if name == "final" and not step_text else f"step{step}"
        if _STEP_NAME.match(name) and not step_text:
            label = name.removesuffix("_hf")
        out.append(Checkpoint(label, path, step))
    return out


def discover(args) -> list[Checkpoint]:
    """The checkpoints of ``--run-dir`` / ``--checkpoints`` (and ``--start-model``) in step order, checked."""
    if args.model is not None:
        raise EvaluationError("--model evaluates one model; a sweep takes --run-dir or --checkpoints instead")
    if args.run_dir is not None and args.checkpoints:
        raise EvaluationError("give --run-dir RUN or --checkpoints DIR..., not both")
    if args.final_step is not None and args.final_step < 0:
        raise EvaluationError(f"--final-step must be >= 0, got {args.final_step}")
    found = (_run_dir_checkpoints(args.run_dir, args.final_step) if args.run_dir is not None
             else _listed_checkpoints(args.checkpoints, args.final_step))
    if args.start_model is not None:
        found.insert(0, Checkpoint("start", args.start_model, 0))
    for ckpt in found:
        flag = "--start-model" if ckpt.name == "start" else "--run-dir" if args.run_dir else "--checkpoints"
        if not os.path.isdir(ckpt.path) and ckpt.name != "start":
            raise EvaluationError(f"{flag}: {ckpt.path} is not a folder")
        if os.path.isdir(ckpt.path) and not os.path.isfile(os.path.join(ckpt.path, "config.json")):
            raise EvaluationError(f"{flag}: {ckpt.path} has no config.json (a save still being written, or a broken "
                                  "one): finish or remove it, or list the other checkpoints with --checkpoints")
    names = [c.name for c in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise EvaluationError(f"two checkpoints share the name {twice[0]!r} (the same step twice?): "
                              + ", ".join(c.path for c in found if c.name == twice[0]))
    # step order; a final model of unknown step last; equal steps keep their order (global_stepN before final)
    return sorted(found, key=lambda c: (c.step is None, c.step if c.step is not None else 0))


# ── settings and resume ──────────────────────────────────────────────────────────────────────────────────────────


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def settings_of(args) -> dict[str, Any]:
    """What a checkpoint's numbers depend on besides its weights: compared when a sweep resumes."""
    from openrlhf_classmate.eval.generation import resolve_backend
    from openrlhf_classmate.eval.readers import parse_fractions

    out = {k: v for k, v in sorted(vars(args).items()) if k not in NOT_SETTINGS}
    out["backend"] = resolve_backend(args.backend)
    out["truncate_cot"] = list(parse_fractions(args.truncate_cot))
    out["data_sha256"] = _sha256(args.data) if os.path.isfile(args.data) else None
    return out


def _done(out_dir: str, ckpt: Checkpoint, settings: dict) -> dict | None:
    """The entry of a checkpoint evaluated before with these settings, or None; other settings: refused."""
    import json

    path = os.path.join(out_dir, ckpt.name, ENTRY)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        entry = json.load(f)
    differ = [k for k in sorted(set(settings) | set(entry["settings"]))
              if settings.get(k) != entry["settings"].get(k)]
    if entry["checkpoint"]["path"] != os.path.abspath(ckpt.path):
        differ.insert(0, f"checkpoint {entry['checkpoint']['path']} -> {os.path.abspath(ckpt.path)}")
    if differ:
        shown = ", ".join(d if " " in d else f"{d} {entry['settings'].get(d)!r} -> {settings.get(d)!r}"
                          for d in differ[:4])
        raise EvaluationError(f"{os.path.dirname(path)} was evaluated with other settings ({shown}): use another "
                              "--output-dir, or delete that folder to evaluate it again")
    return entry


# ── the sweep ────────────────────────────────────────────────────────────────────────────────────────────────────


def run_sweep(args, evaluate_one: Callable[[argparse.Namespace], dict], check: Callable[[argparse.Namespace], Any]
              ) -> dict[str, Any]:
    """Evaluate every checkpoint (``evaluate_one``: ``evaluate``'s ``run``; ``check``: its input checks) and write
    the sweep's files; returns ``sweep.json``'s content."""
    from tqdm.auto import tqdm

    from openrlhf_classmate.eval import readers
    from openrlhf_classmate.eval.sweep_report import sweep_table, write_csv, write_plots

    checkpoints = discover(args)
    if args.output_dir is None:
        if args.run_dir is None:
            raise EvaluationError("--checkpoints needs --output-dir DIR (where the sweep's files go)")
        args.output_dir = os.path.join(args.run_dir, "eval_sweep")
    out_dir = args.output_dir

    def one(ckpt: Checkpoint) -> argparse.Namespace:
        # overwrite: the sweep's own folders, whose sweep_entry.json (_done) says what is finished and with which
        # settings; a folder with a summary but no entry was cut off before its entry and is evaluated again
        return argparse.Namespace(**{**vars(args), "model": ckpt.path, "output_dir": os.path.join(out_dir, ckpt.name),
                                     "overwrite": True})

    check(one(checkpoints[0]))  # the data, the flags, the readers: before any engine starts
    readers.check_reader_tokenizers(args)
    for ckpt in checkpoints:
        flag = "--start-model" if ckpt.name == "start" else "--run-dir" if args.run_dir else "--checkpoints"
        tokenizer = load_tokenizer(flag, ckpt.path)
        if not args.no_think:
            from openrlhf_classmate.algo.spans import think_token_ids

            try:
                think_token_ids(tokenizer, args.think_open, args.think_close)
            except ValueError as e:
                raise EvaluationError(f"{flag} {ckpt.path}: {e} (set --think-open/--think-close, or --no-think)"
                                      ) from None
    lock = hold_output_dir(out_dir)  # a second sweep into the same folder would replace this one's entries
    settings = settings_of(args)
    done = {c.name: _done(out_dir, c, settings) for c in checkpoints}
    todo = [c for c in checkpoints if done[c.name] is None]
    log(f"{len(checkpoints)} checkpoints (" + ", ".join(_label(c) for c in checkpoints) + f") -> {out_dir}; "
        + (f"{len(checkpoints) - len(todo)} already evaluated, skipped; " if len(todo) < len(checkpoints) else "")
        + f"{len(todo)} to evaluate")
    bar = tqdm(total=len(checkpoints), initial=len(checkpoints) - len(todo), desc="checkpoints", unit="ckpt",
               disable=args.quiet, position=0)
    for ckpt in todo:
        bar.set_postfix_str(_label(ckpt))
        summary = evaluate_one(one(ckpt))
        entry = {"checkpoint": {**asdict(ckpt), "path": os.path.abspath(ckpt.path)}, "settings": settings,
                 "summary": summary}
        write_json(os.path.join(out_dir, ckpt.name, ENTRY), entry)  # last: the checkpoint counts as evaluated
        done[ckpt.name] = entry
        bar.update(1)
    bar.close()
    entries = [{**done[c.name]["checkpoint"], "output_dir": c.name, "metrics": done[c.name]["summary"]["metrics"]}
               for c in checkpoints]
    result = {"settings": settings, "readers": {r.name: r.model for r in readers.readers_of(args)},
              "truncate_cot": list(readers.parse_fractions(args.truncate_cot)), "checkpoints": entries}
    write_csv(os.path.join(out_dir, "sweep.csv"), entries)
    result["plots"] = [] if args.no_plot else [os.path.basename(p) for p in write_plots(entries, out_dir)]
    write_json(os.path.join(out_dir, "sweep.json"), result)
    lock.close()
    print(sweep_table(entries))
    log(f"wrote {out_dir}/sweep.json, sweep.csv" + "".join(f", {p}" for p in result["plots"]))
    return result


def _label(ckpt: Checkpoint) -> str:
    return f"{ckpt.name} (step {'?' if ckpt.step is None else ckpt.step})" if ckpt.name in ("final", "start") \
        else ckpt.name

"""Artefacts of the demo: ``metrics.jsonl`` (from the runs' tensorboard events), ``curves.png`` and ``summary.md``."""

from __future__ import annotations

import glob
import json
import os
import shutil

from openrlhf_classmate.demo.transfer import markdown as transfer_markdown

# metrics.jsonl field <- tensorboard tag (the launcher logs every step under train/)
TAGS = {
    "main_reward": "train/reward",
    "classmate_reward": "train/classmate/reward",
    "cot_tokens": "train/classmate/cot_tokens",
    "response_length": "train/response_length",
    "has_answer": "train/has_answer",
    "classmate_valid": "train/classmate/valid",
    "policy_loss": "train/policy_loss",
    "actor_lr": "train/actor_lr",
    "step_time_s": "train/timing/step_total",
}
RUN_LABELS = {"classmate": "classmate GDPO", "grpo": "plain GRPO"}
COLORS = {"classmate": "tab:blue", "grpo": "tab:orange"}
STYLE_LABELS = {"skip": "skip-last"}  # a CoT shape's name in summary.md


MARKER = ".openrlhf_classmate_demo"  # written into every folder the demo uses: what it may clear later


# what clear_previous_run removes, besides eval_*.jsonl: (files, folders) of every demo run, and the GPU demo's too
RUN_ARTEFACTS = (("metrics.jsonl", "curves.png", "summary.md", "summary.json"), ("runs", "world"))
GPU_ARTEFACTS = (("settings.json",), ("stages",))


def _clearable(out: str) -> list[str]:
    """The entries of ``out`` that :func:`clear_previous_run` would remove (everything else it never touches)."""
    names = {*RUN_ARTEFACTS[0], *RUN_ARTEFACTS[1], *GPU_ARTEFACTS[0], *GPU_ARTEFACTS[1]}
    return sorted(n + ("/" if os.path.isdir(os.path.join(out, n)) else "") for n in os.listdir(out)
                  if n in names or (n.startswith("eval_") and n.endswith(".jsonl")))


def _unmarked_demo_folder(out: str) -> bool:
    """A folder a demo run wrote before :data:`MARKER` existed: its summary or GPU settings name a seed and RL
    settings."""
    for name in ("summary.json", "settings.json"):
        try:
            with open(os.path.join(out, name)) as f:
                if {"seed", "rl"} <= set(json.load(f)):
                    return True
        except (OSError, ValueError, TypeError):
            continue
    return False


def claim_output_dir(out: str) -> None:
    """Make ``out`` the demo's folder: a new one, one holding none of the entries the demo replaces (a log file the
    user redirected there is fine), or one an earlier demo run wrote (:data:`MARKER`). A folder whose ``runs/``,
    ``world/``, ``summary.*``, ... some other program wrote (a folder of training runs has a ``runs/``) is refused
    in one line before anything in it is touched."""
    if os.path.isdir(out) and not os.path.exists(os.path.join(out, MARKER)):
        found = _clearable(out)
        if found and not _unmarked_demo_folder(out):
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise SystemExit(f"error: --output-dir {out} holds {shown}, which no demo run wrote (no {MARKER}): the "
                             "demo replaces these names in its folder; give a new or empty folder")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write("written by python -m openrlhf_classmate.demo: it may clear its own artefacts in this folder\n")


def clear_previous_run(out: str, gpu: bool = False) -> None:
    """Remove the artefacts a previous demo run left in ``out`` (and nothing else); ``gpu``: the GPU demo's too
    (``settings.json`` and the stage markers). Only in a folder :func:`claim_output_dir` accepts."""
    claim_output_dir(out)
    files, folders = RUN_ARTEFACTS
    if gpu:
        files, folders = files + GPU_ARTEFACTS[0], folders + GPU_ARTEFACTS[1]
    for name in files:
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    for name in glob.glob(os.path.join(out, "eval_*.jsonl")):
        os.remove(name)
    for name in folders:
        if os.path.isdir(os.path.join(out, name)):
            shutil.rmtree(os.path.join(out, name))


def strip_rows(result: dict) -> dict:
    """An evaluation result without its per-sample rows."""
    return {k: v for k, v in result.items() if k != "rows"}


def read_tensorboard(tb_dir: str) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(tb_dir, "**", "events.out.tfevents.*"), recursive=True)):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: float(e.value) for e in acc.Scalars(tag)})
    return out


EXTRA_PREFIXES = ("mismatch/",)  # the train-inference mismatch (issue 25), recorded whole wherever it is logged
EXTRA_KEYS = ("vllm_kl",)  # upstream's, with --algo.advantage.is_correction_level


def _extra_tags(scalars: dict[str, dict[int, float]], fallback: dict[int, dict]) -> dict[str, str]:
    keys = {tag.removeprefix("train/") for tag in scalars if tag.startswith("train/")}
    keys |= {k for status in fallback.values() for k in status}
    return {k: f"train/{k}" for k in sorted(keys) if k in EXTRA_KEYS or k.startswith(EXTRA_PREFIXES)}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_rows(run: str, scalars: dict[str, dict[int, float]], fallback: dict[int, dict],
              prefer_fallback: bool = False) -> list[dict]:
    """One row per step; the tensorboard events are the source and the parsed log lines a fallback, or the other
    way round with ``prefer_fallback`` (the GPU demo: its runs can be stopped before the event writer flushes, and
    a resumed run's lines are the newest values of the steps it trains again)."""
    steps = sorted(set(scalars.get(TAGS["main_reward"], {})) | set(fallback))
    names = {**TAGS, **_extra_tags(scalars, fallback)}
    rows = []
    for step in steps:
        row: dict = {"run": run, "step": step}
        for name, tag in names.items():
            logged = _number(scalars.get(tag, {}).get(step))
            parsed = _number(fallback.get(step, {}).get(tag.removeprefix("train/")))
            first, second = (parsed, logged) if prefer_fallback else (logged, parsed)
            value = first if first is not None else second
            if value is not None:
                row[name] = value
        rows.append(row)
    return rows


def _value(status: dict, key: str) -> float:
    value = status.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def step_line(run: str, step: int, steps: int, status: dict) -> str:
    """The progress line of one RL step (from the launcher's parsed ``Global step`` status)."""
    text = f"step {step:3d}/{steps}  main reward {_value(status, 'reward'):.2f}"
    if run == "classmate":
        text += (f"  classmate reward {_value(status, 'classmate/reward'):.2f}"
                 f"  CoT {_value(status, 'classmate/cot_tokens'):4.1f} tok")
    else:
        text += f"  response {_value(status, 'response_length'):4.1f} tok"
    if "mismatch/logprob_abs_diff_mean" in status:
        text += f"  |dlogp| {_value(status, 'mismatch/logprob_abs_diff_mean'):.1e}"
    return text


def headline(prefix: str, before: dict, after: dict[str, dict]) -> str:
    """The plot's title: held-out accuracies before -> after per method."""
    gdpo = after["classmate"]
    text = (f"{prefix}: main {100 * before['main_accuracy']:.0f}% -> {100 * gdpo['main_accuracy']:.0f}%, classmate "
            f"{100 * before['classmate_accuracy']:.0f}% -> {100 * gdpo['classmate_accuracy']:.0f}%")
    if "grpo" in after:
        text += (f"; plain GRPO: main {100 * after['grpo']['main_accuracy']:.0f}%, classmate "
                 f"{100 * after['grpo']['classmate_accuracy']:.0f}%")
    return text


def write_metrics(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def plot(path: str, rows: list[dict], evals: dict[str, dict[int, dict]], title: str) -> None:
    """Three panels over training steps: main reward, classmate reward, CoT length.

    Lines: training rollouts (tensorboard); markers: held-out evaluation of the checkpoints (main accuracy,
    classmate accuracy, CoT tokens). Plain GRPO has no classmate during training, so its classmate panel shows
    only the held-out classmate accuracy (the classmate reading GRPO's CoTs after the fact)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("Main reward / accuracy", "main_reward", "main_accuracy", (0, 1.02)),
        ("Classmate reward / accuracy", "classmate_reward", "classmate_accuracy", (0, 1.02)),
        ("CoT length (tokens)", "cot_tokens", "cot_tokens", None),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    runs = [r for r in RUN_LABELS if any(row["run"] == r for row in rows) or r in evals]
    for ax, (name, train_key, eval_key, ylim) in zip(axes, panels):
        for run in runs:
            color, label = COLORS[run], RUN_LABELS[run]
            points = [(row["step"], row[train_key]) for row in rows if row["run"] == run and train_key in row]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, color=color, lw=1.4, alpha=0.85, label=f"{label}: training rollouts")
            held = sorted((step, result[eval_key]) for step, result in evals.get(run, {}).items())
            if held:
                xs, ys = zip(*held)
                ax.plot(xs, ys, color=color, lw=1.0, ls="--", marker="o", ms=5,
                        label=f"{label}: held-out eval")
        if "grpo" in runs and train_key != "main_reward":
            name += "\n(plain GRPO has no classmate in training: held-out only)"
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("training step")
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, len(labels)), fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _delta(after: float, before: float) -> str:
    return f"{100 * (after - before):+.1f} pts"


def summary_markdown(summary: dict) -> str:
    before = summary["eval"]["before"]
    after = {run: summary["eval"][run] for run in ("classmate", "grpo") if run in summary["eval"]}
    cols = ["before RL"] + [f"after {RUN_LABELS[r]}" for r in after]
    lines = [
        "# Classmate CoT demo: summary",
        "",
        f"Seed {summary['seed']}, {summary['rl']['steps']} RL steps of {summary['rl']['prompts_per_step']} prompts x "
        f"{summary['rl']['samples_per_prompt']} samples{' (quick mode)' if summary['quick'] else ''}. Held-out: "
        f"{before['num_problems']} problems x {before['samples_per_problem']} samples (temperature 1); the classmate "
        "answers greedily from each sampled CoT.",
        "",
        "| held-out metric | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    rows = [
        ("main accuracy", "main_accuracy", True),
        ("classmate accuracy", "classmate_accuracy", True),
        ("complete, correct chain", "chain_correct", True),
        ("CoT length (tokens)", "cot_tokens", False),
    ]
    for name, key, pct in rows:
        cells = [_pct(before[key]) if pct else f"{before[key]:.1f}"]
        for result in after.values():
            cell = _pct(result[key]) if pct else f"{result[key]:.1f}"
            if pct:
                cell += f" ({_delta(result[key], before[key])})"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    names = list(before["styles"])  # the world's CoT shapes (the CPU demo: full, skip, none, other)
    lines.append(f"| CoT styles {' / '.join(STYLE_LABELS.get(k, k) for k in names)} | " + " | ".join(
        " / ".join(f"{100 * r['styles'].get(k, 0.0):.0f}" for k in names) + " %"
        for r in [before, *after.values()]) + " |")
    lines += [""] + transfer_markdown(summary.get("transfer", {}), RUN_LABELS)
    lines += ["| stage | wall time |", "|---|---|"]
    for stage, seconds in summary["timings"].items():
        lines.append(f"| {stage} | {seconds:.0f} s |")
    lines += ["", f"Models: main {summary['models']['main_params']:,} parameters, classmate "
              f"{summary['models']['classmate_params']:,} parameters, vocabulary {summary['models']['vocab']} tokens.",
              "", "Files: `metrics.jsonl` (one line per run and step), `curves.png`, `eval_*.jsonl` (every held-out "
              "sample), `summary.json`, `runs/*/launcher.log`.", ""]
    return "\n".join(lines)

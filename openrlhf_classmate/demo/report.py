"""Artefacts of the demo: ``metrics.jsonl`` (from the runs' tensorboard events), ``curves.png`` and ``summary.md``;
and its output folder: the command-line check of ``--output-dir``, the record of the files the demo wrote there
(:data:`MANIFEST`) and the clearing of those files, and only those, before a new run."""

from __future__ import annotations

import glob
import json
import os

from openrlhf_classmate.demo.stages import write_json
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


MANIFEST = ".openrlhf_classmate_demo.json"  # the demo's record of every file it wrote in its folder
OLD_MARKER = ".openrlhf_classmate_demo"  # what demo versions before that record left in their folder

# where the demo writes in --output-dir: files, and folders it fills (the GPU demo's settings.json and stages/ too).
# runs/ itself may hold other programs' runs: the demo's own are runs/classmate and runs/grpo
OWN_FILES = ("metrics.jsonl", "curves.png", "summary.md", "summary.json", "settings.json", "eval_before.jsonl",
             *(f"eval_after_{run}.jsonl" for run in RUN_LABELS))
OWN_FOLDERS = ("world", "stages", *(f"runs/{run}" for run in RUN_LABELS))
TOP_NAMES = {name.split("/")[0] for name in OWN_FILES + OWN_FOLDERS}


def check_output_dir(path: str) -> None:
    """The command line's check of ``--output-dir`` (both demos), before any work: one line refusing a folder the
    demo must never fill and later clear (the file system's root, the home folder, a repository's root) or cannot
    write (a file, a folder without write permission)."""
    real = os.path.realpath(path)
    existing = real  # the folder itself, or the nearest one above it that exists (the demo creates the rest)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    why = None
    if real == os.path.dirname(real):
        why = "the file system's root"
    elif real == os.path.realpath(os.path.expanduser("~")):
        why = "the home folder"
    elif os.path.exists(os.path.join(real, ".git")):
        why = "a repository's root (it holds .git)"
    elif not os.path.isdir(existing):
        why = "a file, not a folder" if existing == real else f"{existing} is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = "cannot be written" if existing == real else f"{existing} cannot be written"
    if why:
        raise SystemExit(f"error: --output-dir {path}: {why}; give the demo a folder of its own")


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


def _unmarked_demo_folder(out: str) -> bool:
    """A folder a demo run wrote before :data:`OLD_MARKER` existed: its summary or GPU settings name a seed and RL
    settings."""
    for name in ("summary.json", "settings.json"):
        try:
            with open(os.path.join(out, name)) as f:
                if {"seed", "rl"} <= set(json.load(f)):
                    return True
        except (OSError, ValueError, TypeError):
            continue
    return False


def _refuse_unrecorded(out: str) -> None:
    """A folder without :data:`MANIFEST` holding names the demo writes: no record says which files there are the
    demo's, so it is refused in one line, whoever wrote them (another program: a folder of training runs has a
    ``runs/``; or a demo version that kept no record)."""
    found = sorted(n + ("/" if os.path.isdir(os.path.join(out, n)) else "") for n in os.listdir(out)
                   if n in TOP_NAMES)
    if not found:
        return
    if os.path.exists(os.path.join(out, OLD_MARKER)) or _unmarked_demo_folder(out):
        raise SystemExit(f"error: --output-dir {out} holds {_shown(found)} of an earlier demo version, which kept no "
                         "record of the files it wrote: remove them, or give a new --output-dir")
    raise SystemExit(f"error: --output-dir {out} holds {_shown(found)}, which no demo run recorded writing (no "
                     f"{MANIFEST}): the demo writes these names in its folder; give a new or empty folder")


def _read_manifest(out: str) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns]}`` of the files the demo recorded writing in ``out`` ({} without a record)."""
    path = os.path.join(out, MANIFEST)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return {str(k): [int(v[0]), int(v[1])] for k, v in json.load(f)["files"].items()}
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise SystemExit(f"error: --output-dir {out}: the demo's record of its files there, {MANIFEST}, cannot be "
                         f"read ({type(e).__name__}: {e}), so its files cannot be told from others'; give another "
                         "--output-dir") from None


def _write_manifest(out: str, files: dict[str, list[int]]) -> None:
    write_json(os.path.join(out, MANIFEST), {  # atomic: a crash leaves the old record or the new one, whole
        "about": "the files python -m openrlhf_classmate.demo wrote in this folder ([size, mtime_ns]): a later run "
                 "removes these and nothing else",
        "files": dict(sorted(files.items()))})


def _on_disk(out: str) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns]}`` of every file under the names the demo writes (:data:`OWN_FILES`,
    :data:`OWN_FOLDERS`), whoever wrote it."""
    found = {}
    paths = [os.path.join(out, name) for name in OWN_FILES]
    for folder in OWN_FOLDERS:
        paths += [os.path.join(root, name) for root, _, names in os.walk(os.path.join(out, folder)) for name in names]
    for path in paths:
        if os.path.islink(path) or os.path.isfile(path):  # a link is recorded and removed as itself
            st = os.lstat(path)
            found[os.path.relpath(path, out)] = [st.st_size, st.st_mtime_ns]
    return found


def claim_output_dir(out: str) -> int:
    """Make ``out`` the demo's folder (a new one, one holding none of the names the demo writes, or one with its
    :data:`MANIFEST`) and return the time from which :func:`record_written` takes what appears under the demo's names
    for the demo's. A folder holding those names without a record is refused in one line before anything is
    touched."""
    if os.path.isdir(out) and not os.path.exists(os.path.join(out, MANIFEST)):
        _refuse_unrecorded(out)
    os.makedirs(out, exist_ok=True)
    _write_manifest(out, _read_manifest(out))
    # the record's own time stamp rather than time.time(): the file system's clock and granularity, as every file the
    # demo writes next will have (a network file system's clock may differ from this machine's)
    return os.stat(os.path.join(out, MANIFEST)).st_mtime_ns


def record_written(out: str, since_ns: int) -> None:
    """Record in :data:`MANIFEST` what the demo wrote in ``out``: every file under its names modified since
    ``since_ns`` (:func:`claim_output_dir`'s time). What was there before keeps its entry, or stays out of the record:
    a recorded file someone rewrote between two calls of the GPU demo, or another program's file, is then refused by
    a later clear rather than removed. Called at the end of every stage and once more when the call ends, also on a
    failure, so that a later run can clear what a failed one wrote; files that are gone leave the record."""
    recorded = _read_manifest(out)
    _write_manifest(out, {rel: stamp if stamp[1] >= since_ns else recorded[rel]
                          for rel, stamp in _on_disk(out).items() if stamp[1] >= since_ns or rel in recorded})


def clear_previous_run(out: str) -> None:
    """Remove the files that earlier demo runs recorded writing in ``out`` (:data:`MANIFEST`), then the folders that
    leaves empty; nothing else (another program's ``runs/<run>/`` stays). Refused in one line before anything is
    removed where the folder does not match the record: a recorded file changed since the demo wrote it, or a file
    under the names the demo writes that the record lacks (another program's, or one of a run killed before it
    recorded it): a new run would remove or overwrite them. A folder without a record: :func:`claim_output_dir`'s
    rule."""
    if not os.path.isdir(out):
        return
    if not os.path.exists(os.path.join(out, MANIFEST)):
        _refuse_unrecorded(out)
        return
    recorded, on_disk = _read_manifest(out), _on_disk(out)
    odd = [f"{rel} (changed since the demo wrote it)" for rel in sorted(on_disk)
           if rel in recorded and on_disk[rel] != recorded[rel]]
    odd += [f"{rel} (not in the record)" for rel in sorted(on_disk) if rel not in recorded]
    if odd:
        raise SystemExit(f"error: --output-dir {out} holds {_shown(odd)}, which the demo's record ({MANIFEST}) does "
                         "not account for: a new run would remove or overwrite them; move them out of the folder, or "
                         "give another --output-dir")
    # each recorded and unchanged; a recorded path outside the demo's names (an edited record) is never removed
    for rel in on_disk:
        os.remove(os.path.join(out, rel))
        folder = os.path.dirname(os.path.join(out, rel))
        while os.path.normpath(folder) != os.path.normpath(out) and not os.listdir(folder):
            try:
                os.rmdir(folder)
            except OSError:  # a folder linked from elsewhere: the link stays
                break
            folder = os.path.dirname(folder)
    _write_manifest(out, {})


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


EXTRA_PREFIXES = ("mismatch/",)  # the train-inference mismatch, recorded whole wherever it is logged
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

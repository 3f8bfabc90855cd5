"""The GPU demo's report: ``metrics.jsonl`` (one line per run and step: the launcher's rewards, lengths, timings and,
where the build logs them, the train-inference mismatch ``mismatch/*``), ``curves.png``, ``summary.json`` and
``summary.md`` with the demo's acceptance checks (docs/demo.md), the wall time per stage and the launcher commands."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics

from openrlhf_classmate.demo import gpu_world as G
from openrlhf_classmate.demo import report as R
from openrlhf_classmate.demo.rl_stage import read_steps
from openrlhf_classmate.demo.stages import read_marker

MAIN_GAIN = 0.20  # held-out main accuracy, classmate GDPO vs the warm start
CLASSMATE_GAP = 0.20  # held-out classmate accuracy, classmate GDPO vs plain GRPO ...
MAIN_TIE = 0.03  # ... at main accuracies this close
DEVICE_MINUTES = 25.0  # the whole demo, both methods
# accuracies are means over 3,200 samples: a difference that is exactly a threshold in counts (96 of 3,200 = 3 points)
# comes out a few ulps past it in floating point, and must not fail the check
EPS = 1e-9


def mismatch_summary(rows: list[dict]) -> dict:
    """Per run and ``mismatch/*`` metric: mean over the steps, max, first and last step's value."""
    out: dict = {}
    for run in sorted({r["run"] for r in rows}):
        mine = [r for r in rows if r["run"] == run]
        for key in sorted({k for r in mine for k in r if k.startswith(R.EXTRA_PREFIXES) or k in R.EXTRA_KEYS}):
            values = [r[key] for r in mine if key in r]
            out.setdefault(run, {})[key] = {"mean": statistics.fmean(values), "max": max(values),
                                            "first": values[0], "last": values[-1], "steps": len(values)}
    return out


def checks(before: dict, after: dict, total_s: float, engine: str) -> list[tuple[str, str, bool | None]]:
    """(check, measured, passed) of the demo's acceptance checks (docs/demo.md; None: cannot be judged from this
    run)."""
    gdpo = after["classmate"]
    gain = gdpo["main_accuracy"] - before["main_accuracy"]
    out = [(f"held-out main accuracy up >= {100 * MAIN_GAIN:.0f} points (classmate GDPO vs warm start)",
            f"{100 * before['main_accuracy']:.1f}% -> {100 * gdpo['main_accuracy']:.1f}% ({100 * gain:+.1f})",
            gain >= MAIN_GAIN - EPS)]
    if "grpo" in after:
        grpo = after["grpo"]
        gap = gdpo["classmate_accuracy"] - grpo["classmate_accuracy"]
        tie = abs(gdpo["main_accuracy"] - grpo["main_accuracy"])
        out.append((f"classmate accuracy GDPO - GRPO >= {100 * CLASSMATE_GAP:.0f} points",
                    f"{100 * gdpo['classmate_accuracy']:.1f}% vs {100 * grpo['classmate_accuracy']:.1f}% "
                    f"({100 * gap:+.1f})", gap >= CLASSMATE_GAP - EPS))
        out.append((f"... at main accuracy within {100 * MAIN_TIE:.0f} points",
                    f"{100 * gdpo['main_accuracy']:.1f}% vs {100 * grpo['main_accuracy']:.1f}% ({100 * tie:.1f} apart)",
                    tie <= MAIN_TIE + EPS))
    out.append((f"the whole demo within {DEVICE_MINUTES:.0f} minutes of device time (one GPU)",
                f"{total_s / 60:.1f} min of stage wall time", total_s <= 60 * DEVICE_MINUTES if engine == "vllm"
                else None))
    return out


def style_table(evals: dict) -> list[str]:
    """Per evaluation and CoT shape: its share of the samples and the main and classmate accuracies on it (the
    shapes a main-answer reward favours, and those the classmate can follow)."""
    lines = ["| held-out, by CoT style | samples | main accuracy | classmate accuracy |", "|---|---|---|---|"]
    for name, result in evals.items():
        label = "before RL" if name == "before" else f"after {R.RUN_LABELS.get(name, name)}"
        for style, v in result.get("by_style", {}).items():
            if v["samples"]:
                lines.append(f"| {label}: {style} | {v['samples']} | {100 * v['main_accuracy']:.1f}% | "
                             f"{100 * v['classmate_accuracy']:.1f}% |")
    return lines


def _markdown_extra(summary: dict) -> str:
    lines = ["## GPU demo", "",
             f"Engine `{summary['engine']}` ({summary['models'].get('device', '?')}); world: "
             f"{G.SPEC.min_operands}-{G.SPEC.max_operands} operands in 1..{G.SPEC.max_operand}, running results in "
             f"0..{G.SPEC.max_result}; byte-level BPE tokenizer trained at run time ({summary['models']['vocab']} "
             "tokens). Evaluation backends: "
             + ", ".join(f"{name} {backend}" for name, backend in summary["eval_backends"].items()) + ".", "",
             "| acceptance check | measured | |", "|---|---|---|"]
    for name, measured, passed in summary["checks"]:
        lines.append(f"| {name} | {measured} | {'-' if passed is None else ('pass' if passed else 'FAIL')} |")
    lines += ["", *style_table(summary["eval"])]
    lines += ["", "| RL run | startup s (per call) | s per step (median, per call) |", "|---|---|---|"]
    for run, m in summary["rl_measured"].items():
        lines.append(f"| {R.RUN_LABELS[run]} | {m.get('startup_s')} | {m.get('step_s')} |")
    lines.append("")
    if summary["mismatch"]:
        lines += ["| train-inference mismatch | run | mean over steps | max | first -> last step |", "|---|---|---|---|---|"]
        for run, metrics in summary["mismatch"].items():
            for key, m in metrics.items():
                lines.append(f"| {key} | {R.RUN_LABELS[run]} | {m['mean']:.3g} | {m['max']:.3g} | "
                             f"{m['first']:.3g} -> {m['last']:.3g} |")
    else:
        lines.append("Train-inference mismatch: not logged by this build (no `mismatch/*` metric in the runs).")
    lines += ["", "Launcher commands: `runs/<run>/command.txt`.", ""]
    return "\n".join(lines)


def write_report(demo) -> None:
    s, out = demo.s, demo.out
    before = read_marker(out, "eval_before")["result"]
    after = {run: read_marker(out, f"eval_{run}")["result"] for run in s.runs}
    rows = []
    for run in s.runs:
        run_dir = demo.path("runs", run)
        scalars = R.read_tensorboard(os.path.join(run_dir, "tensorboard"))
        rows += [r for r in R.step_rows(run, scalars, read_steps(run_dir), prefer_fallback=True)
                 if r["step"] <= s.rl.steps]
    curves = {run: {0: before, s.rl.steps: after[run]} for run in s.runs}
    timings = {name: demo.timings.total(name) for name in demo.stage_names() if name != "report"}
    total = sum(timings.values())
    summary = {
        "seed": s.seed, "quick": s.tiny, "gpu": True, "engine": s.engine, "settings": s.as_dict(),
        "rl": dataclasses.asdict(s.rl),
        "world": {**dataclasses.asdict(G.SPEC), **dataclasses.asdict(G.TRACES), "num_eval": s.num_eval},
        "models": read_marker(out, "warmstart")["models"],
        "eval": {"before": before, **after},
        "curves": curves,
        "timings": {**timings, "total": total},
        # each evaluation's and RL run's own wall time (in parallel mode several run within one stage)
        "task_timings": {name: demo.timings.total(name) for name in demo.task_names()},
        "rl_measured": {run: {k: v for k, v in demo.timings.data.get(f"rl_{run}", {}).items() if k != "seconds"}
                        for run in s.runs},
        "mismatch": mismatch_summary(rows),
        "checks": checks(before, after, total, s.engine),
        "eval_backends": {name: read_marker(out, name).get("backend")
                          for name in ["eval_before"] + [f"eval_{run}" for run in s.runs]},
    }
    title = R.headline(f"GPU classmate CoT demo (seed {s.seed}): held-out, classmate GDPO", before, after)
    R.plot(os.path.join(out, "curves.png"), rows, curves, title)
    R.write_metrics(os.path.join(out, "metrics.jsonl"), rows)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    markdown = R.summary_markdown(summary) + "\n" + _markdown_extra(summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown)
    print("\n" + markdown, flush=True)

"""Truncated-CoT transfer of the demo's checkpoints, computed by ``evaluate``'s checkpoint sweep itself
(``python -m openrlhf_classmate.cli.evaluate --checkpoints ... --truncate-cot ...``, called in-process): the
classmate answers after reading only the first 0 / 25 / 50 / 75 / 100 % of each held-out CoT, for the warm start
and every checkpoint of a run. Nothing here computes a metric; it builds the command and formats its ``sweep.json``.
"""

from __future__ import annotations

import contextlib
import json
import os

FRACTIONS = ("0", "0.25", "0.5", "0.75", "1")


def sweep_argv(out_dir: str, data: str, start_model: str, classmate: str, points: dict[int, str], *, samples: int,
               max_new_tokens: int, classmate_max_new_tokens: int, seed: int) -> list[str]:
    """The command line: the demo's held-out sampling (temperature 1, ``samples`` per problem) and a greedy
    classmate, as the demo's own evaluation."""
    return ["--checkpoints", *(f"{step}={path}" for step, path in sorted(points.items())),
            "--start-model", start_model, "--data", data, "--output-dir", out_dir, "--classmate", classmate,
            "--truncate-cot", ",".join(FRACTIONS), "--backend", "hf", "--samples", str(samples), "--temperature",
            "1.0", "--max-new-tokens", str(max_new_tokens), "--classmate-max-new-tokens",
            str(classmate_max_new_tokens), "--seed", str(seed), "--batch-size", "256", "--quiet"]


def run_sweep(argv: list[str]) -> dict:
    """Run the sweep (its log goes to ``<output-dir>/evaluate.log``); returns the transfer table of its
    ``sweep.json``: ``{"curves": {step: {fraction: classmate accuracy}}, "plot": path, "sweep": path}``."""
    from openrlhf_classmate.cli import evaluate

    out_dir = argv[argv.index("--output-dir") + 1]
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "evaluate.log")
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        code = evaluate.main(argv)
    if code != 0:
        with open(log_path) as f:
            raise RuntimeError(f"the evaluate sweep failed (exit {code}); {log_path}:\n{f.read()[-3000:]}")
    with open(os.path.join(out_dir, "sweep.json")) as f:
        sweep = json.load(f)
    curves = {}
    for entry in sweep["checkpoints"]:
        transfer = entry["metrics"]["arithmetic"]["transfer"]["classmate"]
        curves[entry["step"]] = {f: transfer[f]["accuracy"] for f in FRACTIONS}
    return {"curves": curves, "plot": os.path.join(out_dir, "transfer.png"), "sweep": os.path.join(out_dir, "sweep.json")}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def line(step: int, curve: dict[str, float | None]) -> str:
    return f"step {step:3d}: classmate accuracy after 0/25/50/75/100% of the CoT: " + " / ".join(
        _pct(curve[f]) for f in FRACTIONS)


def markdown(transfer: dict[str, dict], labels: dict[str, str]) -> list[str]:
    """The summary's section: one row per run and checkpoint, one column per CoT fraction."""
    if not transfer:
        return []
    lines = ["## Truncated-CoT transfer", "",
             "Held-out classmate accuracy when it reads only the first fraction of each CoT (cut on a character "
             "boundary, as `random_truncate` cuts in training), before RL (step 0, the warm start) and at each "
             "checkpoint; computed by `python -m openrlhf_classmate.cli.evaluate --checkpoints ... --truncate-cot "
             f"{','.join(FRACTIONS)}` on fresh samples, so its 100 % column is a second estimate of the classmate "
             "accuracy above.", "",
             "| run | checkpoint | " + " | ".join(f"{100 * float(f):.0f} % of the CoT" for f in FRACTIONS) + " |",
             "|---|---|" + "---|" * len(FRACTIONS)]
    for run, result in transfer.items():
        steps = sorted(result["curves"], key=int)
        for step in steps:
            name = "step 0 (before RL)" if int(step) == 0 else f"step {step}" + (
                " (after RL)" if step == steps[-1] else "")
            lines.append(f"| {labels[run]} | {name} | " + " | ".join(_pct(result["curves"][step][f])
                                                                  for f in FRACTIONS) + " |")
    plots = ", ".join(f"`{r['plot']}`" for r in transfer.values())
    return lines + ["", f"Curves: {plots} (one line per checkpoint); every number: `sweep.json` / `sweep.csv` next to "
                    "them.", ""]

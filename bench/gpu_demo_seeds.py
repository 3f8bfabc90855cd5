"""The GPU demo over seeds: each seed's held-out figures and acceptance checks, read from the ``summary.json`` its
run wrote, side by side, then the mean and range of each figure (the table of docs/demo.md).

    python bench/gpu_demo_seeds.py [FOLDER ...] [--json OUT]

FOLDER: a demo output folder or its copy under ``bench/gpu_results/`` (default: ``gpu_demo`` for seed 0, then
``gpu_demo_seed1`` and ``gpu_demo_seed2``; default folders not run yet are named and left out). Pure reading: no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = [os.path.join(REPO, "bench", "gpu_results", name) for name in ("gpu_demo", "gpu_demo_seed1",
                                                                          "gpu_demo_seed2")]
# (column, how to read it from summary.json): accuracies in percent, times in minutes or seconds. The times are
# the device's: a mean over seeds run on different cards mixes them, so the table names each seed's device
COLUMNS = [
    ("main before", lambda s: 100 * s["eval"]["before"]["main_accuracy"]),
    ("main after GDPO", lambda s: 100 * s["eval"]["classmate"]["main_accuracy"]),
    ("classmate before", lambda s: 100 * s["eval"]["before"]["classmate_accuracy"]),
    ("classmate after GDPO", lambda s: 100 * s["eval"]["classmate"]["classmate_accuracy"]),
    ("main after GRPO", lambda s: 100 * s["eval"]["grpo"]["main_accuracy"]),
    ("classmate after GRPO", lambda s: 100 * s["eval"]["grpo"]["classmate_accuracy"]),
    ("gap GDPO - GRPO", lambda s: 100 * (s["eval"]["classmate"]["classmate_accuracy"]
                                         - s["eval"]["grpo"]["classmate_accuracy"])),
    ("demo minutes", lambda s: s["timings"]["total"] / 60),
    ("GDPO start-up s", lambda s: s["rl_measured"]["classmate"]["startup_s"][0]),
    ("GDPO s/step", lambda s: s["rl_measured"]["classmate"]["step_s"][0]),
]


def read_seed(folder: str) -> dict:
    """One seed's row: its figures, device and acceptance checks; SystemExit naming the folder and what is missing
    where its summary cannot give them."""
    path = os.path.join(folder, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {path}: no demo summary ({e})")
    if "grpo" not in summary.get("eval", {}):
        sys.exit(f"error: {path}: no plain GRPO evaluation (run the demo with --compare-grpo)")
    figures = {}
    for name, read in COLUMNS:
        try:
            figures[name] = read(summary)
        except (KeyError, IndexError, TypeError):
            sys.exit(f"error: {path}: the summary has no '{name}' (a demo that did not finish?)")
    try:
        seed, checks = summary["seed"], [(name, measured, passed) for name, measured, passed in summary["checks"]]
    except (KeyError, TypeError, ValueError):
        sys.exit(f"error: {path}: the summary has no seed or no acceptance checks")
    return {"folder": folder, "seed": seed, "device": summary.get("models", {}).get("device", "?"),
            "figures": figures, "checks": checks}


def spread(rows: list[dict]) -> dict:
    """Per figure: mean, min and max over the seeds."""
    out = {}
    for name, _ in COLUMNS:
        values = [r["figures"][name] for r in rows]
        out[name] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}
    return out


def verdict(checks: list[tuple]) -> str:
    """The acceptance checks in a word: a failed one is named; one the run cannot judge (None: the time check of a
    run without vLLM engines) is not counted as passed."""
    failed = [name for name, _, passed in checks if passed is False]
    if failed:
        return "failed: " + "; ".join(failed)
    unjudged = [name for name, _, passed in checks if passed is None]
    return "all pass" if not unjudged else "pass, not judged: " + "; ".join(unjudged)


def table(rows: list[dict], s: dict | None) -> str:
    """A markdown table: one row per seed, then the mean [min, max] of each figure (``s``, :func:`spread`) where
    there are several seeds."""
    names = [name for name, _ in COLUMNS]
    lines = ["| seed | " + " | ".join(names) + " | checks | device |", "|---" * (len(names) + 3) + "|"]
    for r in rows:
        lines.append(f"| {r['seed']} | " + " | ".join(f"{r['figures'][n]:.1f}" for n in names)
                     + f" | {verdict(r['checks'])} | {r['device']} |")
    if s is not None:
        lines.append("| mean [min, max] | " + " | ".join(
            f"{s[n]['mean']:.1f} [{s[n]['min']:.1f}, {s[n]['max']:.1f}]" for n in names) + " | | |")
        devices = sorted({r["device"] for r in rows})
        if len(devices) > 1:
            lines += ["", f"The times (demo minutes, start-up, seconds a step) mix devices: {', '.join(devices)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Print the seeds' table; return (and with --json write) the rows and the spread."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="demo output folders (default: the committed seed folders)")
    p.add_argument("--json", default=None, help="also write the rows and the spread here")
    a = p.parse_args(argv)
    folders = a.folders
    if not folders:
        folders = [f for f in DEFAULT if os.path.isdir(f)]
        for f in DEFAULT:
            if f not in folders:
                print(f"not run yet: {os.path.relpath(f, REPO)}")
    if not folders:
        sys.exit("error: no demo folder to read (give the demo output folders)")
    rows = [read_seed(f) for f in folders]
    seen: dict = {}
    for r in rows:  # two copies of one seed's run would pass for a spread over seeds
        if r["seed"] in seen:
            sys.exit(f"error: seed {r['seed']} twice: {seen[r['seed']]} and {r['folder']}")
        seen[r["seed"]] = r["folder"]
    result = {"seeds": rows, "spread": spread(rows) if len(rows) > 1 else None}
    print(table(rows, result["spread"]))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.json)
    return result


if __name__ == "__main__":
    main()

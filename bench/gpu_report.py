"""Markdown tables for bench/GPU_RESULTS.md from the JSON files the GPU steps write (gpu_validate.sh).

    python bench/gpu_report.py bench/gpu_results/        # every *.json there (and tests.txt), tables to stdout

Knows ``<plan>.json`` (bench/gpu_validate.py), ``evaluate.json`` (bench/gpu_evaluate.py) and
``step_time_<N>gpu.json`` (bench/step_time.py), ``capacity*.json`` (bench/capacity.py); other files are listed by
name.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys


def _fmt(v, spec: str = ".2f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    if isinstance(v, list):
        return ", ".join(_fmt(x, spec) for x in v)
    return str(v)


def validate_table(name: str, data: dict) -> str:
    lines = [f"### `{name}` on {data.get('device')}", "",
             "| run | flags | exit | wall s | steps | weight syncs policy / classmate | max abs weight change | "
             "converted vs HF save | classmate stage s | overlap s | checks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        if "skipped" in r:
            lines.append(f"| {r['run']} | | skipped: {r['skipped']} | | | | | | | | |")
            continue
        if r.get("exit") != 0:
            lines.append(f"| {r['run']} | `{r.get('flags', '')}` | {r['exit']} | {r['wall_s']} | | | | | | | failed |")
            continue
        failed = [k for k, v in r["checks"].items() if not v]
        checks = "all pass" if not failed else "FAILED: " + "; ".join(failed)
        lines.append(
            f"| {r['run']} (ZeRO-{r['zero']}, {r['estimator']}, {r['gpus']} GPU) | `{r['flags']}` | {r['exit']} | "
            f"{r['wall_s']} | {len(r['steps'])} | {r['policy_updates']} / {r['classmate_updates']} | "
            f"{r['weight_change']:.1e} | {_fmt(r['converted_vs_hf_save'], '.1e')} | "
            f"{_fmt(r['classmate_stage_s'])} | {_fmt(r['classmate_overlap_s'])} | {checks} |")
    return "\n".join(lines)


def evaluate_table(data: dict) -> str:
    lines = [f"### `cli.evaluate` ({data.get('backend')} backend) on {data.get('device')}", "",
             "| run | exit | wall s | records | finish reasons | checks |", "|---|---|---|---|---|---|"]
    for r in data["runs"]:
        if r.get("exit") != 0:
            lines.append(f"| {r['run']} | {r['exit']} | {r['wall_s']} | | | failed |")
            continue
        failed = [k for k, v in r["checks"].items() if not v]
        lines.append(f"| {r['run']} | 0 | {r['wall_s']} | {r['records']} | {', '.join(r['finish_reasons'])} | "
                     f"{'all pass' if not failed else 'FAILED: ' + '; '.join(failed)} |")
    return "\n".join(lines)


def step_time_table(data: dict) -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from step_time import ROWS, verdict

    grpo, gdpo = data["runs"].get("grpo", {}), data["runs"].get("gdpo", {})
    steady = gdpo.get("steady_steps") or grpo.get("steady_steps")
    lines = [f"### Step time, {data['gpus']} GPU(s), {data['device']}", "",
             f"{data['batch']}; vocabulary {data['vocab_size']:,}; CUDA graphs "
             f"{'off (enforce_eager)' if data.get('enforce_eager') else 'on'}; seconds, mean of steps {steady}.", "",
             "| component | GRPO | GDPO | GDPO - GRPO |", "|---|---|---|---|"]
    for label, tag in ROWS:
        g, c = (grpo.get("mean") or {}).get(tag), (gdpo.get("mean") or {}).get(tag)
        delta = _fmt(c - g) if g is not None and c is not None else ""
        lines.append(f"| {label.strip()} | {_fmt(g)} | {_fmt(c)} | {delta} |")
    ratio = data.get("ratio")
    if ratio is not None:
        lines += ["", f"GDPO / GRPO = **{ratio:.3f}** ({verdict(ratio, data['gpus'])})."]
    for name, run in data["runs"].items():
        if run.get("exit") != 0:
            lines.append(f"\n{name}: exit {run.get('exit')} {run.get('skipped', '')}")
    return "\n".join(lines)


def main(folder: str) -> None:
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)[:-5]
        data = json.load(open(path))
        if name == "evaluate":
            print(evaluate_table(data))
        elif name.startswith("step_time_"):
            print(step_time_table(data))
        elif name.startswith("capacity") and isinstance(data, dict) and "cells" in data:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from capacity import print_table as capacity_table  # the capacity script's own table

            print(f"### {name}.json")
            capacity_table(data)
        elif isinstance(data, dict) and "runs" in data and isinstance(data["runs"], list):
            print(validate_table(name, data))
        else:
            print(f"### {name}.json (not a known result file)")
        print()
    tests = os.path.join(folder, "tests.txt")
    if os.path.exists(tests):
        counts = [line for line in open(tests) if re.search(r"\d+ (passed|failed)", line)]
        print(f"### vLLM-touching test files against the real vLLM\n\n`{counts[-1].strip() if counts else '?'}`")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "gpu_results"))

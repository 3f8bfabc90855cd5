"""The files of a checkpoint sweep (:mod:`.sweep`): ``sweep.csv``, the printed table and the plots.

Each entry is one checkpoint: ``name``, ``step`` (``None`` when unknown), ``path`` and ``metrics``, the per-scorer
groups of ``evaluate``'s ``summary.json`` (:func:`.report.summarize`), with ``transfer`` =
``{reader: {CoT fraction: {score_mean, valid_fraction[, accuracy]}}}``.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence

from openrlhf_classmate.eval.report import fmt, format_columns

CSV_FIELDS = ("checkpoint", "step", "scorer", "metric", "reader", "fraction", "value")


def _rows(entry: dict) -> list[dict]:
    base = {"checkpoint": entry["name"], "step": entry["step"]}
    rows = []
    for scorer, group in entry["metrics"].items():
        for key, value in group.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append({**base, "scorer": scorer, "metric": key, "value": value})
        for key, value in (group.get("monitor") or {}).items():
            rows.append({**base, "scorer": scorer, "metric": f"monitor/{key}", "value": value})
        for reader, by_fraction in (group.get("transfer") or {}).items():
            for fraction, values in by_fraction.items():
                rows += [{**base, "scorer": scorer, "metric": f"transfer/{key}", "reader": reader,
                          "fraction": fraction, "value": value} for key, value in values.items()]
    return rows


def write_csv(path: str, entries: Sequence[dict]) -> None:
    """One row per checkpoint x metric (a transfer metric: per reader and CoT fraction); undefined values empty."""
    from openrlhf_classmate.eval.common import replace_into

    def write(f) -> None:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for entry in entries:
            for row in _rows(entry):
                value = row["value"]
                writer.writerow({**row, "value": "" if value is None or value != value else value})

    replace_into(path, write)


def headline_group(metrics: dict) -> str:
    """The group the sweep's table and plots show: ``all`` when there are several scorers, else the one."""
    return "all" if "all" in metrics else next(iter(metrics))


def main_score(group: dict) -> float | None:
    return group.get("accuracy", group.get("mean_rating", group.get("score_mean")))


def _num(value) -> float:
    return math.nan if value is None else float(value)


def sweep_table(entries: Sequence[dict]) -> str:
    """Per checkpoint: step, main score, CoT length, and each reader's score per CoT fraction."""
    first = entries[0]["metrics"][headline_group(entries[0]["metrics"])]
    transfer = first.get("transfer") or {}
    columns = [(reader, fraction) for reader, by_fraction in transfer.items() for fraction in by_fraction]
    rows = [["checkpoint", "step", "main", "CoT tok", *(f"{reader} @{float(f):.0%}" for reader, f in columns)]]
    for entry in entries:
        group = entry["metrics"][headline_group(entry["metrics"])]
        cells = [fmt(((group.get("transfer") or {}).get(r) or {}).get(f, {}).get("score_mean")) for r, f in columns]
        rows.append([entry["name"], fmt(entry["step"]), fmt(main_score(group)), fmt(group.get("cot_tokens_mean")),
                     *cells])
    return format_columns(rows)


def _x_positions(entries: Sequence[dict]) -> list[float]:
    """Each checkpoint's step; one of unknown step (a final model) one step past the last known one."""
    known = [e["step"] for e in entries if e["step"] is not None]
    last = max(known, default=0)
    return [float(e["step"]) if e["step"] is not None else last + 1.0 for e in entries]


def write_plots(entries: Sequence[dict], out_dir: str) -> list[str]:
    """``sweep_metrics.png`` (main, classmate and reader scores, CoT length and monitor vs step) and ``transfer.png``
    (each reader's score vs the fraction of the CoT it read, one line per checkpoint); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [e["metrics"][headline_group(e["metrics"])] for e in entries]
    xs = _x_positions(entries)
    readers = list(groups[0].get("transfer") or {})
    monitor_key = next((k for k in ("mse", "f1") if k in (groups[0].get("monitor") or {})), None)
    panels = 2 + (monitor_key is not None)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4), squeeze=False)
    ax = axes[0][0]
    ax.plot(xs, [_num(main_score(g)) for g in groups], marker="o", label="main answer")
    for reader in readers:
        ax.plot(xs, [_num(((g.get("transfer") or {}).get(reader) or {}).get("1", {}).get("score_mean"))
                     for g in groups], marker="o", label=f"{reader} (whole CoT)")
    ax.set_title("Score vs training step")
    ax.legend(fontsize=8)
    axes[0][1].plot(xs, [_num(g.get("cot_tokens_mean")) for g in groups], marker="o", color="tab:gray")
    axes[0][1].set_title("CoT length (tokens)")
    if monitor_key:
        axes[0][2].plot(xs, [_num((g.get("monitor") or {}).get(monitor_key)) for g in groups], marker="o",
                        color="tab:purple")
        axes[0][2].set_title(f"CoT monitor {monitor_key}")
    labels = [_tick(e) for e in entries]
    for ax in axes[0]:
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    paths = [os.path.join(out_dir, "sweep_metrics.png")]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if readers:
        paths.append(plot_transfer(os.path.join(out_dir, "transfer.png"), entries, readers))
    return paths


def _tick(entry: dict) -> str:
    return "final" if entry["step"] is None else str(entry["step"])


def plot_transfer(path: str, entries: Sequence[dict], readers: Sequence[str], title: str | None = None) -> str:
    """One panel per reader: score vs CoT fraction, one line per checkpoint (light = early, dark = late)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(readers), figsize=(5.2 * len(readers), 4), squeeze=False)
    colors = plt.get_cmap("viridis_r")
    for ax, reader in zip(axes[0], readers):
        for k, entry in enumerate(entries):
            by_fraction = entry["metrics"][headline_group(entry["metrics"])].get("transfer", {}).get(reader, {})
            fractions = sorted(by_fraction, key=float)
            ax.plot([float(f) for f in fractions], [_num(by_fraction[f]["score_mean"]) for f in fractions],
                    marker="o", color=colors(0.15 + 0.85 * k / max(1, len(entries) - 1)),
                    label=f"{entry['name']} (step {_tick(entry)})")
        ax.set_title(f"{reader}: score after reading the first fraction of the CoT", fontsize=9)
        ax.set_xlabel("fraction of the CoT read")
        ax.set_ylabel("score (accuracy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

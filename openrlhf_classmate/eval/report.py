"""Summary metrics, the printed table and the PNG plots of ``openrlhf_classmate.cli.evaluate``.

Each per-sample record (a row of ``samples.jsonl``) carries ``scorer``, ``prompt_index``, ``score``, ``valid``,
``has_answer``, ``finish_reason``, ``cot_tokens``, ``response_tokens`` and, when run, ``classmate_*``, ``monitor_*``
and ``transfer`` (``{reader: {CoT fraction: score or None}}``, see :mod:`.readers`) fields. A scorer is *rating*-valued (the sycophancy judge, 1-10) or *binary* (every valid score 0/1:
accuracy); anything else is reported as a mean score.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

RATING_SCORERS = frozenset({"sycophancy_judge"})


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def score_kind(scorer: str, records: Sequence[dict]) -> str:
    if scorer in RATING_SCORERS:
        return "rating"
    valid = [r["score"] for r in records if r["valid"]]
    return "binary" if all(v in (0.0, 1.0) for v in valid) else "score"


def _main_metrics(records: Sequence[dict], kind: str) -> dict[str, float]:
    valid = [r for r in records if r["valid"]]
    scores = [r["score"] for r in valid]
    out: dict[str, float] = {
        "samples": float(len(records)),
        "prompts": float(len({r["prompt_index"] for r in records})),
        "valid_fraction": len(valid) / len(records) if records else math.nan,
        "answer_fraction": _mean([float(r["has_answer"]) for r in records]),
        "truncated_fraction": _mean([float(r["finish_reason"] == "length") for r in records]),
        "score_mean": _mean(scores),
    }
    if kind == "binary":
        out["accuracy"] = out["score_mean"]
        per_prompt: dict[int, list[float]] = {}
        for r in valid:
            per_prompt.setdefault(r["prompt_index"], []).append(r["score"])
        k = max((len(v) for v in per_prompt.values()), default=0)
        if k > 1:
            out[f"pass@{k}"] = _mean([float(max(v) >= 0.5) for v in per_prompt.values()])
    elif kind == "rating":
        out["mean_rating"] = out["score_mean"]
    cot = [r["cot_tokens"] for r in records if r.get("cot_tokens") is not None]
    out["cot_tokens_mean"] = _mean(cot)
    out["cot_tokens_median"] = float(statistics.median(cot)) if cot else math.nan
    out["response_tokens_mean"] = _mean([r["response_tokens"] for r in records])
    return out


def _classmate_metrics(records: Sequence[dict], kind: str) -> dict[str, float]:
    ran = [r for r in records if "classmate_valid" in r]
    if not ran:
        return {}
    valid = [r for r in ran if r["classmate_valid"]]
    both = [r for r in valid if r["valid"]]
    out = {
        "classmate_skipped_fraction": sum(r.get("classmate_input_tokens") is None for r in ran) / len(ran),
        "classmate_valid_fraction": len(valid) / len(ran),
        "classmate_score_mean": _mean([r["classmate_score"] for r in valid]),
    }
    if kind == "binary":
        out["classmate_accuracy"] = out["classmate_score_mean"]
        out["classmate_agreement"] = _mean([float((r["score"] >= 0.5) == (r["classmate_score"] >= 0.5)) for r in both])
    else:
        out["classmate_agreement"] = _mean([float(r["score"] == r["classmate_score"]) for r in both])
        out["classmate_score_mae"] = _mean([abs(r["score"] - r["classmate_score"]) for r in both])
    answered = [r for r in both if r.get("extracted") is not None and r.get("classmate_extracted") is not None]
    out["classmate_answer_agreement"] = _mean(
        [float(str(r["extracted"]).strip() == str(r["classmate_extracted"]).strip()) for r in answered]
    )
    return out


def _transfer_metrics(records: Sequence[dict], kind: str) -> dict[str, Any]:
    """Per reader and CoT fraction: the mean of the valid scores (``accuracy`` for binary scorers) and the valid
    fraction; an invalid score (``None``) is masked, never 0."""
    ran = [r["transfer"] for r in records if r.get("transfer")]
    if not ran:
        return {}
    out: dict[str, Any] = {}
    for reader, by_fraction in ran[0].items():
        out[reader] = {}
        for fraction in by_fraction:
            scores = [t[reader][fraction] for t in ran]
            valid = [v for v in scores if v is not None]
            entry = {"score_mean": _mean(valid), "valid_fraction": len(valid) / len(scores)}
            if kind == "binary":
                entry["accuracy"] = entry["score_mean"]
            out[reader][fraction] = entry
    return {"transfer": out}


def summarize(records: Sequence[dict], monitor: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Per scorer and overall (``all``): main metrics, classmate metrics, monitor metrics (passed in per scorer)."""
    by_scorer: dict[str, list[dict]] = {}
    for r in records:
        by_scorer.setdefault(r["scorer"], []).append(r)
    groups: dict[str, Any] = {}
    for scorer, recs in sorted(by_scorer.items()):
        kind = score_kind(scorer, recs)
        groups[scorer] = {"kind": kind, **_main_metrics(recs, kind), **_classmate_metrics(recs, kind),
                          **_transfer_metrics(recs, kind)}
        if monitor and scorer in monitor:
            groups[scorer]["monitor"] = monitor[scorer]
    if len(groups) > 1:
        kinds = {g["kind"] for g in groups.values()}
        kind = kinds.pop() if len(kinds) == 1 else "score"
        groups["all"] = {"kind": kind, **_main_metrics(records, kind), **_classmate_metrics(records, kind),
                         **_transfer_metrics(records, kind)}
    return groups


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def format_table(groups: dict[str, Any]) -> str:
    """One line per scorer (and ``all``): the headline numbers."""
    header = ["scorer", "samples", "score", "valid", "answered", "CoT tok", "classmate", "agree", "monitor"]
    rows = [header]
    for name, g in groups.items():
        score = g.get("accuracy", g.get("mean_rating", g.get("score_mean")))
        label = {"binary": "acc ", "rating": "rtg "}.get(g["kind"], "")
        mon = g.get("monitor") or {}
        monitor = (f"mse {fmt(mon['mse'])}" if "mse" in mon else f"f1 {fmt(mon['f1'])}" if "f1" in mon else "-")
        rows.append([name, fmt(int(g["samples"])), label + fmt(score), fmt(g["valid_fraction"]),
                     fmt(g["answer_fraction"]), fmt(g["cot_tokens_mean"]), fmt(g.get("classmate_score_mean")),
                     fmt(g.get("classmate_agreement")), monitor])
    text = format_columns(rows)
    transfer = [(name, g["transfer"]) for name, g in groups.items() if g.get("transfer")]
    fractions = list(next(iter(transfer[0][1].values()))) if transfer else []
    if len(fractions) > 1 or any(set(by_reader) != {"classmate"} for _, by_reader in transfer):
        rows = [["scorer", "reader", *(f"CoT {float(f):.0%}" for f in fractions)]]
        for name, by_reader in transfer:
            for reader, by_fraction in by_reader.items():
                rows.append([name, reader, *(fmt(by_fraction[f]["score_mean"]) for f in fractions)])
        text += "\n\nreader scores after the first fraction of the CoT (truncated-CoT transfer)\n" + format_columns(rows)
    return text


def format_columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_plots(records: Sequence[dict], groups: dict[str, Any], out_dir: str) -> list[str]:
    """PNG files where a distribution says more than a number; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: list[str] = []
    scorers = [s for s in groups if s != "all"]
    with_cot = [r for r in records if r.get("cot_tokens") is not None]
    if with_cot:
        fig, axes = plt.subplots(1, len(scorers), figsize=(5 * len(scorers), 3.6), squeeze=False)
        for ax, scorer in zip(axes[0], scorers):
            recs = [r for r in with_cot if r["scorer"] == scorer]
            lengths = [r["cot_tokens"] for r in recs]
            bins = min(30, max(5, len(set(lengths))))
            if groups[scorer]["kind"] == "binary":
                ok = [r["cot_tokens"] for r in recs if r["valid"] and r["score"] >= 0.5]
                bad = [r["cot_tokens"] for r in recs if not (r["valid"] and r["score"] >= 0.5)]
                ax.hist([ok, bad], bins=bins, label=["correct", "incorrect / invalid"], color=["tab:green", "tab:red"],
                        stacked=True)
                ax.legend()
            else:
                ax.hist(lengths, bins=bins, color="tab:blue")
            ax.set_title(f"CoT length: {scorer}")
            ax.set_xlabel("CoT tokens")
            ax.set_ylabel("samples")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "cot_length.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    rating = [s for s in scorers if groups[s]["kind"] == "rating"]
    if rating:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        values = list(range(0, 11))
        main = [sum(1 for r in records if r["scorer"] in rating and r["valid"] and r["score"] == v) for v in values]
        width = 0.4
        ax.bar([v - width / 2 for v in values], main, width=width, label="main answer")
        if any("classmate_valid" in r for r in records):
            cm = [sum(1 for r in records if r["scorer"] in rating and r.get("classmate_valid")
                      and r["classmate_score"] == v) for v in values]
            ax.bar([v + width / 2 for v in values], cm, width=width, label="classmate answer")
        ax.set_xticks(values)
        ax.set_xlabel("judge rating")
        ax.set_ylabel("samples")
        ax.set_title("Rating distribution")
        ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "ratings.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    monitored = [r for r in records if r.get("monitor_valid") and r["valid"]]
    if monitored:
        fig, ax = plt.subplots(figsize=(4.8, 4.2))
        xs = [r["score"] for r in monitored]
        ys = [r["monitor_score"] for r in monitored]
        counts: dict[tuple[float, float], int] = {}
        for x, y in zip(xs, ys):
            counts[(x, y)] = counts.get((x, y), 0) + 1
        ax.scatter([k[0] for k in counts], [k[1] for k in counts], s=[30 + 20 * c for c in counts.values()],
                   alpha=0.6)
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("main score (judge / verifier)")
        ax.set_ylabel("monitor prediction from the CoT")
        ax.set_title("CoT monitor vs main score")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "monitor.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths

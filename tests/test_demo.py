"""The embedded demo, shortened (``--quick``: the same world and warm-start, 10 RL steps, 100 held-out problems),
run as a user runs it: ``python -m openrlhf_classmate.demo`` in a subprocess, through the real launcher (Ray +
DeepSpeed + HF engines on CPU). Checks the artefacts and that training moved the metrics the right way.

Margins: quick runs measured (seeds 0, 2, 3) held-out main accuracy +29 to +35 points, classmate accuracy +35 to
+39 points, CoT length +4 to +5 tokens, and training-rollout classmate reward +0.33 to +0.37 (first 2 steps -> last
3); truncated-CoT transfer (seed 0, evaluate's checkpoint sweep): the classmate reading the whole CoT 15.8% before
RL -> 49.0% after, reading none of it 0% (it has nothing to repeat). The warm-start is bit-reproducible for a seed; the RL stage is seeded but not bit-exact (the HF engine batches
requests as they arrive), so the thresholds below sit at about half of the smallest measured change.
"""

import json
import os
import subprocess
import sys

import pytest

from openrlhf_classmate.testing.watchdog import run_watched

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_STEPS = 10
QUICK_EVAL_ROWS = 100 * 4


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo"))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    log_path = os.path.join(out, "demo.log")
    # no fixed time limit (the demo prints every stage and step; a silent one is killed): a loaded machine slows it
    code = run_watched([sys.executable, "-m", "openrlhf_classmate.demo", "--quick", "--seed", "0", "--output-dir",
                        out], log_path, cwd=REPO, env=env)
    with open(log_path) as f:
        text = f.read()
    if code != 0:
        pytest.fail(f"demo exited with {code}; log tail:\n{text[-6000:]}")
    return out, text


def test_quick_demo_writes_the_artefacts(quick_demo):
    out, log = quick_demo
    for stage in ("[1/6]", "[2/6]", "[3/6]", "[4/6]", "[5/6]", "[6/6]"):
        assert stage in log
    assert f"step  {QUICK_STEPS}/{QUICK_STEPS}" in log  # per-step progress lines

    rows = _read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, QUICK_STEPS + 1))
    assert {r["run"] for r in rows} == {"classmate"}
    for row in rows:
        for key in ("main_reward", "classmate_reward", "cot_tokens", "response_length", "step_time_s"):
            assert isinstance(row[key], float), (key, row)
        assert row["classmate_valid"] == 1.0

    with open(os.path.join(out, "curves.png"), "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

    with open(os.path.join(out, "summary.md")) as f:
        summary_md = f.read()
    for text in ("| main accuracy |", "| classmate accuracy |", "| CoT length (tokens) |", "| warm-start |",
                 "| RL classmate GDPO |", "| total |"):
        assert text in summary_md

    assert len(_read_jsonl(os.path.join(out, "eval_before.jsonl"))) == QUICK_EVAL_ROWS
    after = _read_jsonl(os.path.join(out, "eval_after_classmate.jsonl"))
    assert len(after) == QUICK_EVAL_ROWS
    assert {"problem", "response", "cot", "answer", "main_correct", "classmate_answer", "classmate_correct"} <= set(after[0])

    with open(os.path.join(out, "runs", "classmate", "ckpt", "engine_weight_updates.json")) as f:
        updates = json.load(f)
    assert updates["classmate"] == [0] and updates["policy"][0] >= QUICK_STEPS  # the classmate stays frozen


def test_quick_demo_metrics_move_the_right_way(quick_demo):
    out, _ = quick_demo
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    before, after = summary["eval"]["before"], summary["eval"]["classmate"]
    # held-out, 400 samples each
    assert after["main_accuracy"] - before["main_accuracy"] >= 0.15, (before, after)
    assert after["classmate_accuracy"] - before["classmate_accuracy"] >= 0.18, (before, after)
    assert after["cot_tokens"] - before["cot_tokens"] >= 2.0, (before, after)  # the policy writes its chains out
    assert after["styles"]["full"] - before["styles"]["full"] >= 0.2, (before, after)
    assert set(summary["curves"]["classmate"]) == {"0", "5", "10"}

    rows = _read_jsonl(os.path.join(out, "metrics.jsonl"))

    def mean(key, part):
        return sum(r[key] for r in part) / len(part)

    first, last = rows[:2], rows[-3:]
    assert mean("classmate_reward", last) - mean("classmate_reward", first) >= 0.15, rows
    assert mean("main_reward", last) - mean("main_reward", first) >= 0.12, rows
    assert mean("cot_tokens", last) - mean("cot_tokens", first) >= 2.0, rows


def test_quick_demo_summary_shows_the_transfer_curve_of_the_evaluate_sweep(quick_demo):
    out, log = quick_demo
    with open(os.path.join(out, "summary.json")) as f:
        transfer = json.load(f)["transfer"]["classmate"]
    with open(os.path.join(out, "runs", "classmate", "transfer", "sweep.json")) as f:
        sweep = json.load(f)  # what evaluate --checkpoints ... --truncate-cot wrote
    fractions = ["0", "0.25", "0.5", "0.75", "1"]
    assert [(c["name"], c["step"]) for c in sweep["checkpoints"]] == [("start", 0), ("step5", 5), ("step10", 10)]
    for entry in sweep["checkpoints"]:
        by_fraction = entry["metrics"]["arithmetic"]["transfer"]["classmate"]
        assert transfer["curves"][str(entry["step"])] == {f: by_fraction[f]["accuracy"] for f in fractions}
    before, after = transfer["curves"]["0"], transfer["curves"]["10"]
    assert after["1"] - before["1"] >= 0.15, (before, after)  # RL made the whole CoT more useful to the classmate
    assert after["1"] - after["0"] >= 0.25, after  # ... and it is the CoT that carries the answer
    with open(os.path.join(out, "summary.md")) as f:
        summary_md = f.read()
    assert "## Truncated-CoT transfer" in summary_md and "`runs/classmate/transfer/transfer.png`" in summary_md
    row = "| classmate GDPO | step 10 (after RL) | " + " | ".join(f"{100 * after[f]:.1f}%" for f in fractions) + " |"
    assert row in summary_md and "step  10: classmate accuracy after 0/25/50/75/100% of the CoT" in log


def test_the_demo_refuses_a_folder_it_did_not_write_before_touching_it(tmp_path):
    # the command line of tests/test_demo_folder.py's rule: one error line, the folder as it was
    foreign = tmp_path / "mine"
    (foreign / "runs" / "classmate_gdpo" / "ckpt").mkdir(parents=True)
    (foreign / "runs" / "classmate_gdpo" / "ckpt" / "latest").write_text("global_step100")
    (foreign / "summary.json").write_text("{}")
    res = subprocess.run([sys.executable, "-m", "openrlhf_classmate.demo", "--quick", "--output-dir", str(foreign)],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1].startswith(f"error: --output-dir {foreign} ")
    assert (foreign / "runs" / "classmate_gdpo" / "ckpt" / "latest").read_text() == "global_step100"
    assert sorted(os.listdir(foreign)) == ["runs", "summary.json"]

"""bench/vrcli_reward.py at a tiny size on CPU: real Ray, two ReferenceModelActor ranks under ZeRO-3 (DeepSpeed on its
CPU accelerator), both modes; the JSON it writes, and the same NLLs from both modes (which also
shows that the lock-step padding keeps two ZeRO-3 ranks in step: a rank with a missing forward would hang the run,
which the watchdog stops)."""

import json
import os
import sys

import pytest

from openrlhf_classmate.testing.watchdog import run_watched

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_vrcli_reward_bench_runs_tiny_on_cpu(tmp_path):
    # ZeRO-3 only: the hook's code is the same at every stage; ZeRO-3 adds the partitioned forwards that need the
    # ranks in lock-step (a ZeRO-2 case, another Ray + DeepSpeed start of ~1 minute, exercised nothing more of ours)
    zero_stage = 3
    out = tmp_path / "out"
    cmd = [sys.executable, "bench/vrcli_reward.py", "--preset", "tiny", "--samples", "5", "--seq-len", "48",
           "--gold-len", "16", "--micro-batch-size", "2", "--ranks", "2", "--zero-stage", str(zero_stage),
           "--warmup", "0",
           "--repeats", "1", "--out", str(out)]
    log = tmp_path / "bench.log"
    code = run_watched(cmd, str(log), cwd=REPO, env={**os.environ, "PYTHONPATH": REPO, "TOKENIZERS_PARALLELISM": "false"})
    output = log.read_text()
    assert code == 0, output[-6000:]
    report = json.loads((out / "vrcli_reward.json").read_text())
    assert set(report["results"]) == {"batched", "per_sample"}
    for mode in report["results"].values():
        assert mode["seconds"] > 0 and mode["sequences_per_s"] == pytest.approx(5 / mode["seconds"])
    assert report["speedup_batched_over_per_sample"] > 0
    assert report["max_abs_nll_difference"] < 2e-2  # bf16 on CPU; padding and batch composition differ
    assert 3.0 < report["mean_nll"] < 9.0  # a random 512-token model: about ln(512) = 6.2
    assert report["config"]["ranks"] == 2 and report["config"]["zero_stage"] == zero_stage
    assert report["device"] == "cpu"
    assert "speed-up batched / per-sample" in output

"""bench/actor_update.py --chunked-logprobs --tiny on CPU (the GPU step ``chunkbench`` of bench/gpu_validate.sh runs
the same code at 0.5B and, with --long-context, 1.5B shapes): every variant trains, the reference-side measurements
run, the two paths agree on the batch's log-probs and VR-CLI NLLs, and the JSON the lead reads has every field."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, *flags):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "bench/actor_update.py", "--chunked-logprobs", "--tiny", *flags,
                          "--ref-repeats", "1", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "PYTHONPATH": REPO, "TOKENIZERS_PARALLELISM": "false"})
    assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
    return json.loads(out.read_text()), res.stdout


def test_chunked_bench_runs_tiny_on_cpu(tmp_path):
    report, stdout = _run(tmp_path)
    variants = {f"{p}/{loss}" for p in ("stock", "chunked") for loss in ("stock", "separated", "vanilla_classmate")}
    assert set(report["results"]) == variants
    for name, r in report["results"].items():
        assert r["tokens_per_s"] > 0 and len(r["times"]) == 1, name
    assert set(report["chunked_vs_stock"]) == {"stock", "separated", "vanilla_classmate"}
    assert all(r["tokens_per_s_ratio"] > 0 for r in report["chunked_vs_stock"].values())
    for key in ("reference_forward", "vrcli_nll"):
        assert set(report[key]) == {"stock", "chunked"} and all(m["tokens_per_s"] > 0 for m in report[key].values())
    eq = report["equality"]
    assert eq["max_abs_logprob_diff"] < 2e-2 and eq["max_abs_nll_diff"] < 2e-3  # bf16 on CPU
    assert eq["mean_logprob"] < -3  # a random 512-token model: about -ln(512) = -6.2, so a real comparison
    assert {"stock", "chunk_8", "chunk_16"} <= set(report["lm_head"]) and report["lm_head"]["chunk_8"]["ms"] > 0
    assert report["config"]["chunk_size"] == 8 and report["device"] == "cpu"
    assert report["compile_errors"] == {"chunk_stats": None, "chunk_grad": None}
    assert "chunked / stock per loss" in stdout


def test_long_context_mode_runs_chunked_first(tmp_path):
    report, stdout = _run(tmp_path, "--long-context")
    assert list(report["results"]) == ["chunked/stock", "stock/stock"]
    assert report["config"]["micro_batch"] == 1 and report["config"]["preset"] == "tiny"
    assert report["chunked_vs_stock"]["stock"]["tokens_per_s_ratio"] > 0
    assert stdout.index("chunked/stock") < stdout.index("stock/stock")

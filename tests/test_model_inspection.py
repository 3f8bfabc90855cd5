"""``integration/rollout/model_inspection.py``: vLLM's model-class inspection started by the launcher before Ray, so
that the engines find its cache warm; and ``bench/cold_start.py``'s reading of a cold launch's log.

The inspection itself is vLLM's (a subprocess importing the model's module, its result cached in
``$VLLM_CACHE_ROOT/modelinfos``); vLLM does not install on this machine, so the registry here is a stand-in with the
same two members the launcher uses (``models``, each entry's ``inspect_model_cls``) whose inspection is a real
subprocess writing a cache file. Its effect on a cold start is measured on the GPU (``bench/cold_start.py``)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from openrlhf_classmate.integration.rollout import model_inspection
from openrlhf_classmate.testing.tiny_models import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Entry:
    """A registry entry whose inspection runs a Python subprocess (vLLM's does) and writes its cache file."""

    def __init__(self, cache: str, seconds: float = 0.0, fail: bool = False):
        self.cache, self.seconds, self.fail, self.calls = cache, seconds, fail, 0

    def inspect_model_cls(self) -> dict:
        self.calls += 1
        if self.fail:
            raise RuntimeError("Error raised in subprocess: ModuleNotFoundError")
        code = f"import json, time; time.sleep({self.seconds}); json.dump({{'ok': 1}}, open({self.cache!r}, 'w'))"
        subprocess.run([sys.executable, "-c", code], check=True)
        return {"ok": 1}


def test_the_architectures_come_from_each_local_config_once(tmp_path):
    a = save_tiny_model(str(tmp_path / "a"), ["x"], hidden_size=8, num_layers=1, num_heads=2)
    b = save_tiny_model(str(tmp_path / "b"), ["y"], hidden_size=8, num_layers=1, num_heads=2)
    arch = json.load(open(os.path.join(a, "config.json")))["architectures"]
    assert model_inspection.architectures([a, b, "Qwen/Qwen2.5-7B", str(tmp_path / "none")]) == arch


def test_the_inspection_runs_beside_the_launcher_and_fills_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(model_inspection.NO_INSPECTION_ENV, raising=False)
    policy = save_tiny_model(str(tmp_path / "p"), ["x"], hidden_size=8, num_layers=1, num_heads=2)
    arch = model_inspection.architectures([policy])[0]
    entry = _Entry(str(tmp_path / "modelinfo.json"), seconds=1.5)
    registry = SimpleNamespace(models={arch: entry, "OtherForCausalLM": _Entry(str(tmp_path / "other.json"))})
    t0 = time.time()
    thread, how = model_inspection.start_inspection([policy, policy], registry=lambda: registry)
    assert time.time() - t0 < 1.0 and thread.is_alive()  # the launcher goes on while the subprocess runs
    assert how == f"started for {arch}"
    thread.join(timeout=60)
    assert entry.calls == 1 and os.path.isfile(tmp_path / "modelinfo.json")  # each architecture once
    assert not os.path.exists(tmp_path / "other.json")  # only the run's models
    assert 1.5 <= thread.results[arch] < 30


def test_a_failed_inspection_is_one_line_and_nothing_starts_where_nothing_can(tmp_path, monkeypatch):
    monkeypatch.delenv(model_inspection.NO_INSPECTION_ENV, raising=False)
    policy = save_tiny_model(str(tmp_path / "p"), ["x"], hidden_size=8, num_layers=1, num_heads=2)
    arch = model_inspection.architectures([policy])[0]
    lines: list[str] = []
    registry = SimpleNamespace(models={arch: _Entry("", fail=True)})
    thread, _ = model_inspection.start_inspection([policy], registry=lambda: registry, log=lines.append)
    thread.join(timeout=30)
    assert lines == [f"vLLM's model inspection of {arch} ahead of the engines failed (RuntimeError: Error raised in "
                     "subprocess: ModuleNotFoundError); the engines inspect it themselves"]
    # a machine without vLLM: the registry's import fails, nothing starts
    def no_vllm():
        raise ImportError("No module named 'vllm.model_executor'")

    thread, how = model_inspection.start_inspection([policy], registry=no_vllm)
    assert thread is None and how == ("not started: vLLM's model registry is not readable here (ImportError: No module "
                                      "named 'vllm.model_executor')")
    assert model_inspection.start_inspection(["Qwen/Qwen2.5-7B"], registry=lambda: registry)[1] == (
        "not started: no local model folder names an architecture in its config.json")
    assert model_inspection.start_inspection([policy], registry=lambda: SimpleNamespace(models={}))[1] == (
        f"not started: vLLM's registry has none of {arch} to inspect ahead")
    monkeypatch.setenv(model_inspection.NO_INSPECTION_ENV, "1")  # the cold-start bench's before path
    assert model_inspection.start_inspection([policy], registry=lambda: registry)[0] is None


@pytest.fixture(scope="module")
def cold_start():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import cold_start

    return cold_start


def test_cold_start_reads_the_inspection_inside_the_engines_from_the_launcher_log(cold_start):
    # the two launches of 2026-11-29 (GPU_RESULTS section 12): cache warm (0 s), then removed (21 s)
    logs = {name: gzip.open(os.path.join(REPO, f"bench/gpu_results/wave15/{name}/{name[-1]}_gdpo_1gpu.log.gz"), "rt",
                            errors="replace").read() for name in ("pyc_a", "pyc_b")}
    assert cold_start.inspection_gaps(logs["pyc_a"]) == {"12033": 0.0}
    assert cold_start.inspection_gaps(logs["pyc_b"]) == {"14689": 21.0}


def test_cold_start_pairs_each_after_launch_with_the_before_launch_after_it(cold_start):
    rows = [{"path": "after", "first_step_s": 150.0, "startup_s": {"engines_ready_s": 60.0}},
            {"path": "before", "first_step_s": 172.5, "startup_s": {"engines_ready_s": 85.0}},
            {"path": "after", "first_step_s": 149.0, "startup_s": {"engines_ready_s": 59.0}},
            {"path": "before", "first_step_s": 171.0, "startup_s": {}}]
    assert cold_start.pairs(rows) == {
        "first_step_s": {"before_minus_after": [22.5, 22.0], "median": 22.2},
        "engines_ready_s": {"before_minus_after": [25.0], "median": 25.0}}


def test_the_committed_cold_pairs_give_the_figures_the_readme_quotes(cold_start):
    # GPU_RESULTS sections 13 and 14, README "Engines sharing a GPU": three cold pairs on two machines; the pairs read
    # again from the committed launches, and the inspection inside the engines 0 s after, 20-28 s before
    launches = []
    for folder in ("wave16/cold_start", "wave17/cold_start_a", "wave17/cold_start_b"):
        path = os.path.join(REPO, "bench", "gpu_results", *folder.split("/"), "cold_start.json")
        rows = json.load(open(path))["launches"]
        assert [r["path"] for r in rows] == ["after", "before"] and all(r["exit"] == 0 for r in rows)
        assert max(rows[0]["inspection_in_engines_s"].values()) == 0.0
        assert 20.0 <= max(rows[1]["inspection_in_engines_s"].values()) <= 28.0
        launches += rows
    paired = cold_start.pairs(launches)["first_step_s"]
    assert paired == {"before_minus_after": [17.8, 39.6, 23.5], "median": 23.5}
    after = sorted(r["first_step_s"] for r in launches if r["path"] == "after")
    before = sorted(r["first_step_s"] for r in launches if r["path"] == "before")
    assert [round(x, 1) for x in after] == [132.8, 146.8, 147.7]
    assert [round(x, 1) for x in before] == [165.5, 170.3, 172.4]

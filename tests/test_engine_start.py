"""The actor/ref models load while the vLLM engines start: upstream's real ``create_vllm_engines`` under
``patches.engine_sleep_deferred`` returns as soon as the engine actors exist, and the sleeps it sent finish once each
engine is up, in real Ray (engines that take 3 s to start stand in for vLLM, which does not run here)."""

import os
import sys
import textwrap
import time

import pytest
import ray

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_S = 3.0

ENGINE = textwrap.dedent(f'''
    import time

    class SlowEngine:
        """Upstream RolloutRayActor's constructor arguments and sleep(); up {START_S} s after its creation."""

        def __init__(self, **kwargs):
            if kwargs["model"] == "broken":
                raise RuntimeError("engine for model broken failed to start")
            time.sleep({START_S})
            self.asleep_at = None

        def sleep(self, level=1):
            self.asleep_at = time.time()
            return "asleep"
''')


@pytest.fixture()
def slow_engines(tmp_path, monkeypatch):
    import openrlhf.trainer.ray.vllm_engine as vllm_engine

    (tmp_path / "slow_engine.py").write_text(ENGINE)
    sys.path.insert(0, str(tmp_path))
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{tmp_path}:{REPO}"}})
    import slow_engine

    monkeypatch.setattr(vllm_engine, "RolloutRayActor", ray.remote(slow_engine.SlowEngine))
    yield vllm_engine
    ray.shutdown()
    sys.path.remove(str(tmp_path))


def _create(vllm_engine, model="m"):
    # upstream train()'s call under --vllm.enable_sleep: one engine on its own (logical) GPU
    return vllm_engine.create_vllm_engines(1, 1, model, 0, False, False, True, 64, None, 0.3, True)


@pytest.mark.slow
def test_upstreams_engine_creation_returns_at_once_and_the_engines_sleep_once_up(slow_engines):
    from openrlhf_classmate.integration import patches

    original = slow_engines.batch_vllm_engine_call
    t0 = time.time()
    _create(slow_engines)  # upstream: waits for both engines to start and fall asleep
    assert time.time() - t0 >= START_S

    pending: list = []
    t0 = time.time()
    with patches.engine_sleep_deferred(pending):
        engines = _create(slow_engines)
    returned = time.time() - t0
    assert returned < START_S / 2 and len(engines) == 1 and len(pending) == 1
    assert slow_engines.batch_vllm_engine_call is original  # rebound for the block only
    assert ray.get(pending) == ["asleep"] and time.time() - t0 >= START_S

    # an engine that fails to start: creation still returns, the wait on its sleep raises the engine's error
    pending.clear()
    with patches.engine_sleep_deferred(pending):
        _create(slow_engines, model="broken")
    with pytest.raises(Exception, match="engine for model broken failed to start"):
        ray.get(pending)

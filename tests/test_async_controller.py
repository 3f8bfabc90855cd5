"""The async controller's training actor under real Ray: Ray ships our subclass of upstream's
``TrainingActor`` to its worker with by-value copies of the inherited methods, whose zero-argument ``super()`` then
fails; our ``broadcast_to_vllm`` calls upstream's own function so the weight sync still runs under upstream's
vLLM lock. A probe subclass (in a module the worker can import, as ours is) calls the real method chain."""

import os
import sys
import textwrap

import pytest
import ray

pytestmark = pytest.mark.slow  # a real Ray cluster
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent('''
    import openrlhf_classmate  # noqa: F401
    from types import SimpleNamespace

    from openrlhf_classmate.integration.trainer import ClassmateTrainingActor


    class Probe(ClassmateTrainingActor):
        """Just enough state for broadcast_to_vllm: upstream's lock, our HF-engine sync with no engines."""

        def __init__(self, lock):
            self.vllm_lock = lock
            self._partial_rollout = False
            self.args = SimpleNamespace(engine=SimpleNamespace(backend="hf"))
            self.calls = []
            self.actor_model_group = SimpleNamespace(
                async_run_method=lambda method_name: self.calls.append(method_name) or [])
            self.vllm_engines = []

        def sync(self):
            self.broadcast_to_vllm()
            return self.calls
''')


@pytest.fixture()
def ray_with_probe(tmp_path):
    (tmp_path / "classmate_probe.py").write_text(PROBE)
    sys.path.insert(0, str(tmp_path))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": f"{tmp_path}:{REPO}", "DS_ACCELERATOR": "cpu"}})
    yield
    ray.shutdown()
    sys.path.remove(str(tmp_path))


def test_training_actor_weight_sync_runs_under_upstreams_lock_in_a_ray_worker(ray_with_probe):
    import classmate_probe
    from openrlhf.trainer.ppo_trainer_async import VLLMLock

    probe = ray.remote(classmate_probe.Probe).remote(VLLMLock.remote())
    # a hang guard far above the ~10 s the actor takes to start (a loaded machine slows it several times over)
    assert ray.get(probe.sync.remote(), timeout=900) == ["hf_engine_state_dict"]

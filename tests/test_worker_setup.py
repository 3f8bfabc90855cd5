"""``patches.worker_setup`` (Ray's ``worker_process_setup_hook``, run in every worker process): each patch is applied
where its module is first imported, so a worker that never imports upstream's trainer (a vLLM or HF engine) is
spared DeepSpeed and ``openrlhf.models``, and one that does gets every rebinding as before."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from openrlhf_classmate.integration import patches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=300)


def test_an_engine_worker_imports_no_deepspeed_and_a_trainer_worker_gets_every_patch():
    # one fresh process as Ray starts a worker: the hook, then an experience unpickled (the async trainer's queue
    # actor's first import: the lazy rebinding once met ClassmateExperience half-imported there, 2026-11-29), an
    # engine's module, then upstream's trainer modules
    import pickle

    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    blob = pickle.dumps(ClassmateExperience(classmate_advantages=torch.ones(1, 3)))
    res = _python(f"""
        import pickle, sys
        from openrlhf_classmate.integration import patches
        patches.worker_setup()  # what Ray runs first in each worker
        e = pickle.loads({blob!r})
        import openrlhf_classmate.integration.rollout.hf_engine  # an engine actor's module
        print("engine", "deepspeed" in sys.modules, "openrlhf.models" in sys.modules)
        import openrlhf.trainer.ray.ppo_actor as ppo_actor  # a trainer worker imports upstream's modules
        import openrlhf.utils.deepspeed.deepspeed as ds_module
        import torch
        from openrlhf_classmate.integration.experience.experience import ClassmateExperience
        for name in patches.EXPERIENCE_MODULES:
            __import__(name)
            assert sys.modules[name].Experience is ClassmateExperience, name
        batch = sys.modules["openrlhf.trainer.ppo_utils.experience"].Experience.concat_experiences([e, e], 0)
        print("batch", type(batch).__name__, tuple(batch.classmate_advantages.shape))
        assert ppo_actor.NaiveReplayBuffer.__name__ == "CpuReplayBuffer"
        assert ds_module.init_device_mesh.__name__ == "cpu_device_mesh"
        assert torch.cuda.current_device() == "cpu"
        print("trainer ok", not patches._AFTER_IMPORT.pending)
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "engine False False" in res.stdout  # the old hook imported both in every worker (2-4 CPU-s)
    assert "batch ClassmateExperience (2, 3)" in res.stdout  # the classmate fields survive upstream's batching
    assert "trainer ok True" in res.stdout


def test_a_patch_runs_after_the_modules_code_once_and_at_once_for_an_imported_module(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("VALUE = 1\n\ndef f():\n    return VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch():
        module = sys.modules["late_module"]
        seen.append(module.VALUE)  # the module's own code has run
        module.VALUE = 2

    patches.after_import("late_module", patch)
    assert seen == [] and "late_module" not in sys.modules
    try:
        import late_module

        assert seen == [1] and late_module.f() == 2
        import inspect

        assert "def f()" in inspect.getsource(late_module)  # the real loader still serves the source
        patches.after_import("late_module", lambda: seen.append("now"))  # imported already: at once
        assert seen == [1, "now"] and "late_module" not in patches._AFTER_IMPORT.pending
    finally:
        sys.modules.pop("late_module", None)


def test_a_patch_that_finds_upstream_changed_fails_the_import_loudly(tmp_path, monkeypatch):
    (tmp_path / "changed_upstream.py").write_text("OTHER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    patches.after_import("changed_upstream", lambda: patches._rebind_experience("changed_upstream"))
    try:
        with pytest.raises(patches.UpstreamChangedError,
                           match="changed_upstream no longer has a module-global `Experience` to rebind"):
            import changed_upstream  # noqa: F401
    finally:
        sys.modules.pop("changed_upstream", None)


@pytest.mark.parametrize("name", [name for name, _ in patches.CPU_RUNTIME_PATCHES])
def test_each_cpu_runtime_patch_names_an_importable_module(name):
    __import__(name)  # a renamed upstream module would leave its patch pending for ever, silently

"""``patches.worker_setup`` (Ray's ``worker_process_setup_hook``, run in every worker process): each patch is applied
where its module is first imported, so a worker that never imports upstream's trainer (an engine, an idle worker)
is spared DeepSpeed and ``openrlhf.models``, and one that does gets every rebinding as before."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from openrlhf_classmate.integration import patches

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, tmp_path=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, str(tmp_path or "")) if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_an_engine_worker_imports_no_deepspeed_and_a_trainer_worker_gets_every_patch():
    res = _python("""
        import sys
        from openrlhf_classmate.integration import patches
        patches.worker_setup()  # what Ray runs first in each worker
        import openrlhf_classmate.integration.rollout.hf_engine  # an engine actor's module
        print("engine", "deepspeed" in sys.modules, "openrlhf.models" in sys.modules)
        import openrlhf.trainer.ray.ppo_actor as ppo_actor  # a trainer worker imports upstream's modules
        import openrlhf.utils.deepspeed.deepspeed as ds_module
        import torch
        from openrlhf_classmate.integration.experience.experience import ClassmateExperience
        for name in patches.EXPERIENCE_MODULES:
            __import__(name)
            assert sys.modules[name].Experience is ClassmateExperience, name
        assert ppo_actor.NaiveReplayBuffer.__name__ == "CpuReplayBuffer"
        assert ds_module.init_device_mesh.__name__ == "cpu_device_mesh"
        assert torch.cuda.current_device() == "cpu"
        print("trainer ok", not patches._AFTER_IMPORT.pending)
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "engine False False" in res.stdout  # the old hook imported both in every worker (~6 CPU-s)
    assert "trainer ok True" in res.stdout


def test_unpickling_an_experience_as_a_workers_first_import_works_and_keeps_its_fields():
    # the async trainer's queue actor: its first import is ClassmateExperience's module, through pickle; the lazy
    # rebinding of the ppo_utils package's modules then met that module half-imported (ImportError, 2026-11-29)
    import pickle

    import torch

    from openrlhf_classmate.integration.experience.experience import ClassmateExperience

    blob = pickle.dumps(ClassmateExperience(classmate_advantages=torch.ones(1, 3)))
    res = _python(f"""
        import pickle, sys
        from openrlhf_classmate.integration import patches
        patches.worker_setup()
        e = pickle.loads({blob!r})
        import openrlhf.trainer.ppo_utils.experience as upstream
        batch = upstream.Experience.concat_experiences([e, e], 0)
        print(type(batch).__name__, tuple(batch.classmate_advantages.shape))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ClassmateExperience (2, 3)" in res.stdout


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


def test_a_patch_that_finds_upstream_changed_fails_the_import_loudly(tmp_path):
    (tmp_path / "changed_upstream.py").write_text("OTHER = 1\n")
    res = _python("""
        from openrlhf_classmate.integration import patches
        patches.after_import("changed_upstream", lambda: patches._rebind_experience("changed_upstream"))
        import changed_upstream
    """, tmp_path)
    assert res.returncode == 1
    assert "UpstreamChangedError: changed_upstream no longer has a module-global `Experience` to rebind" in res.stderr


@pytest.mark.parametrize("name", [name for name, _ in patches.CPU_RUNTIME_PATCHES])
def test_each_cpu_runtime_patch_names_an_importable_module(name):
    __import__(name)  # a renamed upstream module would leave its patch pending for ever, silently

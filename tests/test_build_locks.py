"""Build locks of killed DeepSpeed op builds (integration/launch/build_locks.py): an old one stops the launch with one
line (tests/test_bad_inputs.py runs the launcher on one); a fresh one may be a build that is running and is left alone."""

from __future__ import annotations

import os
import time

from openrlhf_classmate.integration.launch.build_locks import STALE_AFTER_S, build_locks, stale_lock_message


def _lock(root, op: str, age_s: float) -> str:
    path = root / op / "lock"
    path.parent.mkdir(parents=True)
    path.touch()
    when = time.time() - age_s
    os.utime(path, (when, when))
    return str(path)


def test_only_locks_older_than_a_build_can_take_are_named(tmp_path):
    running = _lock(tmp_path, "fused_adam", 60)  # a build started a minute ago, perhaps by another run
    assert stale_lock_message(root=str(tmp_path)) is None
    stale = _lock(tmp_path, "py311_cpu/cpu_adam", STALE_AFTER_S + 120)
    assert sorted(p for p, _ in build_locks(str(tmp_path))) == sorted([running, stale])
    message = stale_lock_message(root=str(tmp_path))
    assert message.startswith(f"{stale} is a build lock 17 min old") and f"(rm {stale})" in message
    assert running not in message and "\n" not in message


def test_the_root_is_torchs_unless_the_environment_names_one(tmp_path, monkeypatch):
    _lock(tmp_path, "cpu_adam", STALE_AFTER_S + 60)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert "cpu_adam/lock" in stale_lock_message()
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stale_lock_message() is None  # ~/.cache/torch_extensions of an empty home


def test_the_test_watchdog_removes_only_the_locks_of_the_session_it_killed(tmp_path, monkeypatch):
    from openrlhf_classmate.testing.watchdog import release_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    older = _lock(tmp_path, "fused_adam", 600)  # from before the killed session started: not its builder's
    started = time.time() - 30
    newer = _lock(tmp_path, "cpu_adam", 5)
    assert release_build_locks(since=started) == [newer]
    assert os.path.exists(older) and not os.path.exists(newer)

"""The watchdog of the end-to-end subprocesses (launcher, demo, benchmarks): a run is killed when it stops making
progress (no new output for ``quiet`` seconds), not when a fixed time has passed, so a loaded machine that makes every
stage slower does not fail a healthy run (the demo fixture's fixed 1200 s limit did)."""

import os
import subprocess
import sys
import time

from openrlhf_classmate.testing.watchdog import TIMEOUT_EXIT, run_watched


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_a_run_that_keeps_printing_outlives_its_quiet_limit(tmp_path):
    log = tmp_path / "run.log"
    # 2.5 s of work, a line every 0.25 s: far longer than the 1 s quiet limit, never quiet for 1 s
    body = "import time\nfor i in range(10):\n    print(i, flush=True)\n    time.sleep(0.25)\n"
    t0 = time.time()
    assert run_watched(_script(body), str(log), quiet=1.0) == 0
    assert time.time() - t0 >= 2.5
    assert log.read_text().split() == [str(i) for i in range(10)]


def test_a_silent_run_is_killed_with_its_whole_session_after_the_quiet_limit(tmp_path):
    log = tmp_path / "run.log"
    pid_file = tmp_path / "grandchild.pid"
    # a grandchild (as Ray's daemons are) and then silence, as a hung run would be
    body = (f"import subprocess, time\np = subprocess.Popen(['sleep', '300'])\nopen({str(pid_file)!r}, 'w')"
            ".write(str(p.pid))\nprint('started', flush=True)\ntime.sleep(300)\n")
    t0 = time.time()
    assert run_watched(_script(body), str(log), quiet=1.5, grace=2) == TIMEOUT_EXIT
    assert time.time() - t0 < 30
    text = log.read_text()
    assert text.startswith("started") and "killed after 1.5 s without output (no progress)" in text
    grandchild = int(pid_file.read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(grandchild)], capture_output=True, text=True).stdout
    assert state.strip() in ("", "Z")  # gone (or a zombie awaiting its reaper)


def test_the_hard_cap_still_stops_a_run_that_prints_forever(tmp_path):
    log = tmp_path / "run.log"
    body = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)\n"
    assert run_watched(_script(body), str(log), quiet=60, timeout=1.0, grace=2) == TIMEOUT_EXIT
    assert "killed after 1.0 s (timeout)" in log.read_text()


def test_the_environment_and_working_directory_reach_the_run(tmp_path):
    log = tmp_path / "run.log"
    body = "import os\nprint(os.getcwd(), os.environ['WATCHED'])\n"
    assert run_watched(_script(body), str(log), cwd=str(tmp_path), env={**os.environ, "WATCHED": "yes"}) == 0
    assert log.read_text().split() == [str(tmp_path), "yes"]


def test_until_stops_a_run_early_as_a_success_with_its_whole_session(tmp_path):
    # bench/capacity.py stops the launcher once the steps it measures are logged (the final save is not measured)
    log = tmp_path / "run.log"
    body = "import time\nfor i in range(600):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"

    def until():
        return "step 5 was logged" if "step 5\n" in log.read_text() else None

    t0 = time.time()
    assert run_watched(_script(body), str(log), quiet=60, grace=2, until=until) == 0
    assert time.time() - t0 < 30
    text = log.read_text()
    assert "[watchdog] stopped: step 5 was logged" in text and "step 599" not in text

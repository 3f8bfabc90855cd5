"""The fast loop (``scripts/run_tests.sh --fast`` = ``pytest -m "not slow"``) must not start Ray, DeepSpeed, the
launcher or the demo: the guard of ``openrlhf_classmate.testing.slow_guard`` (active in every run) fails a test that
does without the ``slow`` marker, naming what it started and what to do."""

import textwrap

INNER = textwrap.dedent('''
    import subprocess
    import sys

    import deepspeed
    import pytest
    import ray


    def test_ray():
        ray.init(num_cpus=1)


    def test_deepspeed():
        deepspeed.init_distributed(dist_backend="gloo")


    def test_launcher():
        subprocess.run([sys.executable, "-c", "pass", "-m", "openrlhf_classmate.cli.train_ppo_ray", "--x", "1"])


    def test_demo():
        subprocess.Popen(sys.executable + " -m openrlhf_classmate.demo --quick", shell=True).wait()


    def test_launcher_check_and_help_start_nothing():
        for flag in ("--check", "--help"):
            argv = [sys.executable, "-c", "pass", "-m", "openrlhf_classmate.cli.train_ppo_ray", flag]
            assert subprocess.run(argv).returncode == 0


    @pytest.mark.slow
    def test_marked_slow():
        assert not hasattr(ray.init, "slow_guard") and not hasattr(deepspeed.initialize, "slow_guard")
''')


def test_heavy_work_without_the_slow_marker_fails_with_one_clear_message(pytester):
    pytester.makepyfile(test_inner=INNER)
    # in a subprocess: this test's own guard (it is not slow) would otherwise also wrap the inner tests
    result = pytester.runpytest_subprocess("-p", "openrlhf_classmate.testing.slow_guard", "-p", "no:cacheprovider",
                                          "-q", "-o", "markers=slow: end-to-end runs")
    result.assert_outcomes(passed=2, failed=4)
    text = result.stdout.str()
    for name, what in (("test_ray", "Ray (ray.init)"), ("test_deepspeed", "DeepSpeed (deepspeed.init_distributed)"),
                       ("test_launcher", "the launcher"), ("test_demo", "the demo")):
        assert (f"test_inner.py::{name} starts {what} but is not marked slow: mark it @pytest.mark.slow "
                "(scripts/run_tests.sh --fast runs pytest -m \"not slow\", without Ray, DeepSpeed, the launcher and "
                "the demo)") in text, text
    assert "Connecting to" not in text and "Started a local Ray instance" not in text  # refused before starting

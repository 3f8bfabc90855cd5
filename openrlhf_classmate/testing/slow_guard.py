"""pytest plugin (registered in ``tests/conftest.py``): a test that starts Ray, DeepSpeed, the launcher or the demo
must be marked ``slow``, so that the fast loop (``scripts/run_tests.sh --fast`` = ``pytest -m "not slow"``) never
waits on an end-to-end run. Active in every run: an unmarked test fails at the call that would start the heavy work,
with one line naming the test, what it started and what to do."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

# modules whose run starts Ray and DeepSpeed, and the flags with which they start neither
HEAVY_MODULES = {"openrlhf_classmate.cli.train_ppo_ray": "the launcher", "openrlhf_classmate.demo": "the demo"}
HARMLESS_FLAGS = {"--check", "--help", "-h"}


def heavy_command(args) -> str | None:
    """What ``args`` (a ``Popen`` argument: a list, or a string for a shell) would start, or ``None``."""
    if isinstance(args, (str, bytes, os.PathLike)):
        tokens = shlex.split(os.fsdecode(args))
    else:
        tokens = [os.fsdecode(a) for a in args]
    for module, what in HEAVY_MODULES.items():
        if module in tokens and not HARMLESS_FLAGS & set(tokens):
            return what
    return None


@pytest.fixture(autouse=True)
def _heavy_work_needs_the_slow_marker(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return

    def refuse(what: str):
        pytest.fail(f"{request.node.nodeid} starts {what} but is not marked slow: mark it @pytest.mark.slow "
                    "(scripts/run_tests.sh --fast runs pytest -m \"not slow\", without Ray, DeepSpeed, the launcher "
                    "and the demo)", pytrace=False)

    def guard(what: str):
        def refused(*args, **kwargs):
            refuse(what)
        refused.slow_guard = True
        return refused

    # Ray and DeepSpeed as the test modules imported them (importing them here would cost every test session seconds)
    ray, deepspeed = sys.modules.get("ray"), sys.modules.get("deepspeed")
    if ray is not None:
        monkeypatch.setattr(ray, "init", guard("Ray (ray.init)"))
    if deepspeed is not None:
        monkeypatch.setattr(deepspeed, "initialize", guard("DeepSpeed (deepspeed.initialize)"))
        for name in ("deepspeed", "deepspeed.comm", "deepspeed.comm.comm"):
            if hasattr(sys.modules.get(name), "init_distributed"):
                monkeypatch.setattr(sys.modules[name], "init_distributed",
                                    guard("DeepSpeed (deepspeed.init_distributed)"))
    popen_init = subprocess.Popen.__init__

    def guarded_init(self, args, *rest, **kwargs):
        what = heavy_command(args)
        if what:
            refuse(what)
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_init)
    yield
    # imported by the test itself: what it left running
    if ray is None and getattr(sys.modules.get("ray"), "is_initialized", lambda: False)():
        refuse("Ray (ray.init)")
    comm = sys.modules.get("deepspeed.comm")
    if deepspeed is None and comm is not None and getattr(comm, "is_initialized", lambda: False)():
        refuse("DeepSpeed (deepspeed.init_distributed)")

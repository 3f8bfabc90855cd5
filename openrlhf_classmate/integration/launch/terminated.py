"""``SIGTERM`` (a scheduler's preemption, ``kill``, ``timeout``) told in one line.

``ray.init`` gives the driver its own ``SIGTERM`` handler (a local cluster's stops Ray's processes, then exits 1),
and Ray's C++ signal handler aborts the driver (exit -6) when the signal also reached Ray's daemons, as a signal to
the process group does. Either way the run ended without a word on what happened or where to resume.
:func:`install_sigterm_handler`, called after ``ray.init``, keeps Ray's handler (so the workers, a checkpoint writer
among them, are stopped first), then prints one ``error:`` line naming the signal and the checkpoint a resume takes,
and exits 1 at once: an interpreter exit would then spend seconds in Ray's shutdown reaching the stopped daemons
(10 s against 0.9 s measured on 2 loaded cores), a share of a scheduler's grace period before its ``SIGKILL``; the
``atexit`` hooks it skips hold nothing of the run (the controller and its loggers are Ray actors, stopped already).
Where the signal lands inside a save, the tag being written has no marker and ``latest`` still names the previous one
(``integration/training/checkpoints.py``): the line names that one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def sigterm_message(ckpt_path: str | None) -> str:
    from openrlhf_classmate.integration.launch.actor_died import resume_hint

    return (f"error: the run received SIGTERM (a scheduler's preemption, kill or timeout) and stopped. "
            f"{resume_hint(ckpt_path)}")


def install_sigterm_handler(ckpt_path: str | None) -> None:
    """Wrap the process's ``SIGTERM`` handler (Ray's, after ``ray.init``); main thread only, as Python's signals."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        if callable(previous):
            try:
                previous(signum, frame)  # Ray's: stops the local cluster's processes, then sys.exit
            except SystemExit:
                pass
        print(sigterm_message(ckpt_path), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)

    signal.signal(signal.SIGTERM, on_sigterm)

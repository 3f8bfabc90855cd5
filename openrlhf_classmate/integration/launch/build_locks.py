"""Build locks that a killed build left behind: with one in place, a run waits forever at its model set-up.

DeepSpeed builds its ops (CPU Adam for an offloaded optimizer, fused Adam, ...) on first use with
``torch.utils.cpp_extension``, which guards each build with a ``lock`` file in the op's build folder and makes every
other process wait while the file exists. A build killed half-way (Ctrl-C, ``kill -9``, a lost job) leaves the file;
the next run then hangs in ``deepspeed.initialize`` without a word (seen in this repository's own test runs: a lock
from a killed build stopped a later run for 20 minutes, until it was removed by hand)."""

from __future__ import annotations

import glob
import os
import time

# a build of one op takes 1-3 minutes on a CPU core; a lock older than this has no build behind it
STALE_AFTER_S = 15 * 60


def extensions_root() -> str:
    """Where torch builds extensions: ``$TORCH_EXTENSIONS_DIR``, else torch's default under ``~/.cache``."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "torch_extensions")


def build_locks(root: str | None = None) -> list[tuple[str, float]]:
    """``(path, modification time)`` of every build lock under ``root`` (default :func:`extensions_root`)."""
    found = []
    for lock in glob.glob(os.path.join(root or extensions_root(), "**", "lock"), recursive=True):
        try:
            found.append((lock, os.path.getmtime(lock)))
        except OSError:  # removed meanwhile: its build ended
            pass
    return found


def stale_lock_message(now: float | None = None, root: str | None = None) -> str | None:
    """One line naming the build locks older than :data:`STALE_AFTER_S`, or None when there are none."""
    now = time.time() if now is None else now
    stale = sorted((path, now - mtime) for path, mtime in build_locks(root) if now - mtime > STALE_AFTER_S)
    if not stale:
        return None
    paths = " ".join(path for path, _ in stale)
    return (f"{stale[0][0]} is a build lock {stale[0][1] / 60:.0f} min old, left by a killed build of a DeepSpeed op: "
            f"this run would wait for it forever while setting up its models; with no build running, remove it "
            f"(rm {paths}) and start again")

"""Whether a tool can write into an output folder, asked before any work: one phrase for the tool's one error line.

The permission bits (``os.access``) answer for most users, with the clearest words; root passes every such check,
yet ``/proc``, ``/sys`` or a read-only mount refuse the write anyway, so the write is also tried for real: the
missing folders are created and a probe file is written, then both are removed again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


def write_problem(path: str) -> str | None:
    """Why files cannot be written into the folder ``path`` (created when missing), as a phrase to follow the path
    ("is a file, not a directory", "cannot be created: /x is not writable", ...); None when they can."""
    target = os.path.abspath(os.path.expanduser(path))
    parent = target
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return "is a file, not a directory" if parent == target else f"cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return "is not writable" if parent == target else f"cannot be created: {parent} is not writable"
    missing = []
    folder = target
    while folder != parent:
        missing.append(folder)
        folder = os.path.dirname(folder)
    created: list[str] = []
    try:
        for folder in reversed(missing):
            os.mkdir(folder)
            created.append(folder)
        fd, probe = tempfile.mkstemp(dir=target, prefix=".write_probe_")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        if len(created) < len(missing):
            return f"cannot be created ({reason}: {e.filename or target})"
        return f"cannot be written ({reason})"
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(folder)
    return None


def replace_folder(tmp: str, out: str) -> None:
    """Rename the finished folder ``tmp`` to ``out``, replacing what was there only once the new one is complete (the
    old one is moved aside first and removed last, so a crash leaves one of the two whole)."""
    old = None
    if os.path.lexists(out):
        old = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old:
        shutil.rmtree(old, ignore_errors=True)

"""The processes of a run, read from ``/proc`` (Linux): for fault tests and ``bench/faults.py``, which kill a run's
engine, a rank or the whole run as a node failure would. Ray's daemons and workers start sessions of their own, so a
run's processes are found by parent links, not by its session alone."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(entry)] = (int(fields[1]), int(fields[3]))
            except (OSError, IndexError, ValueError):
                continue
    return out


def descendants(roots: Iterable[int], table: dict[int, tuple[int, int]] | None = None) -> set[int]:
    """``roots`` and every process started under one of them (``table``: :func:`process_table`, read now if None)."""
    table = process_table() if table is None else table
    found = set(roots)
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def process_title(pid: int) -> str:
    """The first word of a process's command line (Ray names its workers ``ray::<Class>...`` there); "" if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

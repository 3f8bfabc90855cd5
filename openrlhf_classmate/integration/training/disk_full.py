"""A save that failed because the disk is full, told in one line.

``torch.save`` on a full disk raises ``RuntimeError: [enforce fail at inline_container.cc:...] . unexpected pos
576 vs 534`` (the C++ writer drops the errno), wrapped by Ray in a remote traceback: nothing says "disk". The
launcher asks :func:`no_space_message` about any exception that ends a run: an ``ENOSPC`` / ``EDQUOT`` anywhere in
the exception chain, or a failed torch write while a save folder's file system has (almost) no space left, becomes
``error: no space left on <path> ...``, naming the checkpoint ``latest`` still points at (upstream writes ``latest``
only after a tag is complete, so a resume uses the last complete one).
"""

from __future__ import annotations

import errno
import os
import shutil

from openrlhf_classmate.errors import exception_chain

NEARLY_FULL = 64 * 1024 * 1024
"""Free bytes below which a failed write is taken for a full disk."""
_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28")
_WRITE_FAILED_TEXT = ("PytorchStreamWriter failed", "file write failed", "unexpected pos", "basic_ios::clear")


def _free_bytes(path: str) -> int | None:
    """Free bytes on the file system of ``path`` (its nearest existing ancestor)."""
    target = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(target) and os.path.dirname(target) != target:
        target = os.path.dirname(target)
    try:
        return shutil.disk_usage(target).free
    except OSError:
        return None


def latest_tag(ckpt_path: str) -> str | None:
    """The tag ``<ckpt.path>/_actor/latest`` names, or None."""
    try:
        with open(os.path.join(ckpt_path, "_actor", "latest"), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def no_space_message(exc: BaseException, folders: list[tuple[str, str]], ckpt_path: str | None) -> str | None:
    """One ``error:`` line when ``exc`` is a write that failed for lack of disk space in one of ``folders`` ((flag,
    path) pairs: where the run saves), else None."""
    chain = list(exception_chain(exc))
    text = " ".join(str(e) for e in chain)
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain) or any(
        t in text for t in _FULL_TEXT)
    free = [(flag, path, _free_bytes(path)) for flag, path in folders if path]
    free = [f for f in free if f[2] is not None]
    if not free or not (full or any(t in text for t in _WRITE_FAILED_TEXT)):
        return None
    flag, path, left = min(free, key=lambda f: f[2])
    if not full and left >= NEARLY_FULL:
        return None  # a failed write on a disk with room: some other problem, keep its own error
    tag = latest_tag(ckpt_path) if ckpt_path else None
    resume = (f"; {os.path.join(ckpt_path, '_actor', 'latest')} still names {tag}, the last complete checkpoint "
              "(--ckpt.load_enable resumes from it)") if tag else ""
    return (f"error: no space left on {path} ({flag}; {left // (1024 * 1024)} MiB free) while the run was writing: "
            "free some space, e.g. by removing old checkpoints (a save needs room for --ckpt.max_num + 1 of them: "
            f"the oldest goes only after the new one is complete){resume}")

"""Checkpoint folders on disk: which DeepSpeed tag a resume can use (:func:`resume_choice`), and rotation of the tags
(:func:`rotate_tags`, after a save is complete) and of the ``*_hf`` folders.

DeepSpeed writes a tag's files (``*model_states.pt``, ``*optim_states.pt``) and only then the ``latest`` file, but
a run killed mid-save, a full disk or a partial copy leaves a *torn* tag: a missing rank's file, or a ``.pt`` file cut
short (torch writes a zip whose central directory comes last, so a truncated file no longer opens as a zip). Loading
such a tag fails deep inside ``torch.load`` with an error that names neither the file nor a way out. Here a tag is
checked file by file in milliseconds (no tensor is read): :func:`choose_resume_tag` takes ``latest`` when it is
complete and otherwise the newest older complete tag, naming the broken file.

The files alone cannot show a lost file of the *highest* rank: a 2-rank tag without rank 1's files looks like a
1-rank tag, so a resume took it and rank 1 died in ``torch.load``. ``ResilientDeepspeedStrategy.save_ckpt``
therefore writes a completeness marker, :data:`MARKER`, into the tag folder last, once every rank's files are on
disk (:func:`mark_complete`): the data-parallel world size and every file with its size, so a file lost, cut short
or replaced since is named. A save that dies leaves no marker; so that a missing marker means "not finished" and not
"saved by an older version", the save folder's :data:`MARKED_FROM` records the first step saved with markers
(:func:`begin_marked_save`). Tags without marker and record (upstream's saves, this project's before the marker) get
the file checks only, as before. The resume choice and the rotation (torn tags first) see all of it through
:func:`inspect_tag`.

Nothing here imports DeepSpeed, so the launcher's preflight uses the same checks before Ray starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

_TAG_RE = re.compile(r"^(?:best_)?global_step(\d+)$")
_RANK_RE = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_(model|optim)_states\.pt$")
_HF_RE = re.compile(r"^(best_)?global_step(\d+)_hf$")

MARKER = "checkpoint_complete.json"
"""In a tag folder, written last: ``{"dp_world_size", "zero_stage", "files": {relative path: bytes}}``."""
MARKED_FROM = "checkpoint_markers.json"
"""In the save folder: ``{"from_step": N}``, the tags of step N and later carry a :data:`MARKER`."""


class CheckpointError(RuntimeError):
    """No complete checkpoint to resume from; the message names each broken file and the ways out."""


def tag_step(tag: str) -> int | None:
    m = _TAG_RE.match(tag)
    return int(m.group(1)) if m else None


def _torch_file_problem(path: str) -> str | None:
    """Why ``path`` is not a complete torch.save file (zip format), or None."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if size == 0:
        return "is empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as z:
            if not z.namelist():
                return "is a zip archive without entries"
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] == b"\x80":  # the legacy (pre-zip) torch.save format cannot be checked cheaply: accept it
            return None
        return f"is cut short or corrupt ({size} bytes, no complete zip directory)"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None


def _write_json(path: str, data: dict) -> None:
    """Whole or not at all: a reader never sees half a file (a crash leaves at most the ``.tmp`` file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def begin_marked_save(save_dir: str, tag: str) -> None:
    """Before every rank writes ``tag`` into ``save_dir`` (rank 0, ahead of the save's first barrier): record that
    tags from this step on carry a :data:`MARKER` (once per folder: the first such save's step; a tag without a
    marker from then on is a save that did not finish), and remove the marker of an earlier save of the same tag,
    which would otherwise vouch for a mix of old and new files should this save die."""
    step = tag_step(tag)
    record = os.path.join(save_dir, MARKED_FROM)
    if step is not None and _read_json(record) is None:
        _write_json(record, {"from_step": step})
    try:
        os.remove(os.path.join(save_dir, tag, MARKER))
    except FileNotFoundError:
        pass


def tag_files(tag_dir: str) -> dict[str, int]:
    """``{path relative to tag_dir: size in bytes}`` of every file under ``tag_dir`` but the marker."""
    files = {}
    for folder, _, names in os.walk(tag_dir):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, tag_dir)
            if not rel.startswith(MARKER):
                files[rel] = os.path.getsize(path)
    return files


def mark_complete(tag_dir: str, dp_world_size: int, zero_stage: int | None) -> None:
    """Write ``tag_dir``'s :data:`MARKER` (rank 0, once every rank's files are on disk): the files and their sizes
    as saved, so that a file lost or cut short later is seen, the highest rank's included."""
    _write_json(os.path.join(tag_dir, MARKER), {"dp_world_size": dp_world_size, "zero_stage": zero_stage,
                                                "files": tag_files(tag_dir)})


def inspect_tag(tag_dir: str, zero_stage: int | None = None) -> str | None:
    """Why the checkpoint tag folder ``tag_dir`` cannot be resumed from (naming the file), or None if complete.

    ``zero_stage`` >= 1: the optimizer states live in per-rank ``*optim_states.pt`` files, so at least one must be
    there (DeepSpeed writes them before ``latest``). Then the completeness marker (module docstring): every file it
    lists present with its size, or, where the save folder's record says the tag's step carries one, the marker
    itself."""
    if not os.path.isdir(tag_dir):
        return f"{tag_dir} does not exist"
    names = sorted(os.listdir(tag_dir))
    model_files = [n for n in names if n.endswith("model_states.pt")]
    if not model_files:
        return f"{tag_dir} has no *model_states.pt file (the save did not finish)"
    for kind in ("model", "optim"):
        ranks = sorted({int(m.group(1)) for n in names if (m := _RANK_RE.search(n)) and m.group(3) == kind})
        if ranks and ranks != list(range(ranks[-1] + 1)):
            missing = sorted(set(range(ranks[-1] + 1)) - set(ranks))
            return f"{tag_dir} lacks the {kind} states of data-parallel rank(s) {missing} (the save did not finish)"
    if zero_stage and not any(n.endswith("optim_states.pt") for n in names):
        return f"{tag_dir} has no *optim_states.pt file (ZeRO stage {zero_stage} writes one per rank; the save did " \
               "not finish)"
    for name in names:
        if name.endswith(".pt"):
            problem = _torch_file_problem(os.path.join(tag_dir, name))
            if problem:
                return f"{os.path.join(tag_dir, name)} {problem}"
    return _marker_problem(tag_dir)


def _marker_problem(tag_dir: str) -> str | None:
    """What the tag's :data:`MARKER` says is lost (a file, or the marker itself where the save folder's record says
    this step carries one), or None; a tag without marker or record (an older save) passes."""
    tag_dir = os.path.normpath(tag_dir)
    path = os.path.join(tag_dir, MARKER)
    if not os.path.exists(path):
        record = _read_json(os.path.join(os.path.dirname(tag_dir), MARKED_FROM)) or {}
        from_step, step = record.get("from_step"), tag_step(os.path.basename(tag_dir))
        if isinstance(from_step, int) and step is not None and step >= from_step:
            return (f"{tag_dir} has no {MARKER}: the save did not finish (saves into {os.path.dirname(tag_dir)} from "
                    f"step {from_step} on write it last, after every rank's files)")
        return None
    marker = _read_json(path)
    files = marker.get("files") if marker else None
    if not isinstance(files, dict):
        return f"{path} cannot be read"
    for name, size in files.items():
        try:
            actual = os.path.getsize(os.path.join(tag_dir, name))
        except OSError:
            m = _RANK_RE.search(name)
            whose = f" (the {m.group(3)} states of data-parallel rank {int(m.group(1))} of " \
                    f"{marker.get('dp_world_size')})" if m else ""
            return (f"{os.path.join(tag_dir, name)} is missing{whose}: the save wrote it ({MARKER} lists it), so it "
                    "was removed or not copied since")
        if actual != size:
            return (f"{os.path.join(tag_dir, name)} has {actual} bytes, not the {size} it had when saved ({MARKER}): "
                    "cut short or changed since")
    return None


@dataclass
class ResumeChoice:
    tag: str
    """The tag to load."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(tag, why) of newer tags passed over."""

    def notes(self, load_dir: str) -> list[str]:
        return [f"checkpoint {os.path.join(load_dir, tag)} is incomplete: {why}; resuming from {self.tag} instead "
                f"(the steps after it are trained again)" for tag, why in self.skipped]


def read_latest(load_dir: str) -> str | None:
    try:
        with open(os.path.join(load_dir, "latest"), encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def choose_resume_tag(load_dir: str, zero_stage: int | None = None) -> ResumeChoice | None:
    """The tag a resume from ``load_dir`` (a ``--ckpt.path``'s ``_actor`` folder) should load.

    ``latest`` when that tag is complete; otherwise the newest complete tag older than it (or, without a readable
    ``latest``, the newest complete tag). None when ``load_dir`` holds no checkpoint at all (a fresh start).
    Raises :class:`CheckpointError` when there are checkpoints but none is complete. ``zero_stage``: see
    :func:`inspect_tag`.
    """
    if not os.path.isdir(load_dir):
        return None
    tags = sorted((d for d in os.listdir(load_dir) if tag_step(d) is not None and os.path.isdir(
        os.path.join(load_dir, d))), key=lambda d: (tag_step(d), not d.startswith("best_")), reverse=True)
    latest = read_latest(load_dir)
    skipped: list[tuple[str, str]] = []
    if latest is not None:
        problem = inspect_tag(os.path.join(load_dir, latest), zero_stage)
        if problem is None:
            return ResumeChoice(latest)
        skipped.append((latest, problem))
        limit = tag_step(latest)
        tags = [t for t in tags if t != latest and (limit is None or tag_step(t) <= limit)]
    elif not tags:
        return None
    elif os.path.exists(os.path.join(load_dir, "latest")):
        skipped.append(("latest", "the 'latest' file is empty or unreadable"))
    for tag in tags:
        problem = inspect_tag(os.path.join(load_dir, tag), zero_stage)
        if problem is None:
            return ResumeChoice(tag, skipped)
        skipped.append((tag, problem))
    broken = "; ".join(why for _, why in skipped)
    raise CheckpointError(
        f"no complete checkpoint to resume from in {load_dir}: {broken}. Restore the named file(s), or start "
        "without --ckpt.load_enable in another --ckpt.path"
    )


def saved_checkpoints(ckpt_path: str) -> list[str]:
    """What earlier runs saved under ``ckpt_path``, relative to it: the DeepSpeed tags and ``latest`` of its ``_*``
    folders (``_actor``, ``_critic``) and the ``*_hf`` folders of ``--ckpt.save_hf``."""
    found = []
    for name in sorted(os.listdir(ckpt_path)) if os.path.isdir(ckpt_path) else []:
        sub = os.path.join(ckpt_path, name)
        if name.startswith("_") and os.path.isdir(sub):
            found += [f"{name}/{t}" for t in sorted(os.listdir(sub)) if t == "latest" or tag_step(t) is not None]
        elif _HF_RE.match(name):
            found.append(name)
    return found


def resume_choice(ckpt_path: str, zero_stage: int | None = None) -> ResumeChoice | None:
    """What ``--ckpt.load_enable`` with ``--ckpt.path ckpt_path`` loads: the tag of ``<ckpt_path>/_actor``
    (:func:`choose_resume_tag`), or None for a fresh start because nothing was saved there yet.

    Raises :class:`CheckpointError` when the folder holds something but nothing to resume from: an ``_actor``
    folder without a complete tag (upstream would load nothing from it and then fail inside Ray on the missing
    training state), DeepSpeed tags directly in ``ckpt_path`` (the ``_actor`` folder passed as ``--ckpt.path``), or
    only Hugging Face ``*_hf`` saves."""
    load_dir = os.path.join(ckpt_path, "_actor")
    ways_out = "start without --ckpt.load_enable in another --ckpt.path, or pass the --ckpt.path of the run to resume"
    if os.path.lexists(load_dir) and not os.path.isdir(load_dir):
        raise CheckpointError(f"{load_dir} is not a folder: {ways_out}")
    choice = choose_resume_tag(load_dir, zero_stage)
    if choice is not None:
        return choice
    if os.path.isdir(load_dir):
        found = sorted(os.listdir(load_dir))
        what = "is empty" if not found else "holds no 'latest' file and no global_stepN/ folder (only " + \
            ", ".join(found[:3]) + (", ..." if len(found) > 3 else "") + ")"
        raise CheckpointError(f"{load_dir} {what}, so there is no checkpoint to resume from: remove that folder "
                              f"to start fresh there, or {ways_out}")
    names = sorted(os.listdir(ckpt_path)) if os.path.isdir(ckpt_path) else []
    if "latest" in names or any(tag_step(n) is not None for n in names):
        raise CheckpointError(f"{ckpt_path} holds DeepSpeed tags itself ('latest', global_stepN/), but a resume "
                              "reads them from <ckpt.path>/_actor: pass the folder above it as --ckpt.path")
    hf = [n for n in names if _HF_RE.match(n)]
    if hf:
        raise CheckpointError(f"{ckpt_path} holds Hugging Face saves ({hf[0]}) but no DeepSpeed checkpoint "
                              f"(_actor/), which a resume needs (was --ckpt.disable_ds set?): {ways_out}")
    return None


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def rotate_tags(save_dir: str, new_tag: str, max_num: int, max_mem_gb: float,
                read_metric: Callable[[str], float | None], zero_stage: int | None = None) -> list[tuple[str, str]]:
    """Upstream's ``save_ckpt`` rotation of the DeepSpeed tags in ``save_dir``, run *after* ``new_tag`` is complete
    (upstream runs it before writing the new tag, so a crash during the save at ``--ckpt.max_num 1`` left nothing).

    Same policy as upstream, with the new tag never a candidate: saving a ``best*`` tag removes the other ``best*``
    folders; otherwise folders are evicted while the others number ``max_num`` or more (best ones not counted) or
    weigh more than ``max_mem_gb`` GiB (all counted), never a best one. Order: incomplete folders first (a torn save
    is no checkpoint: ``max_num`` N keeps N complete tags), then those without a metric, the worst metric, the
    oldest. ``read_metric(folder)`` is the strategy's metric reader. Returns (folder, why) of each folder removed."""
    removed: list[tuple[str, str]] = []
    is_best = new_tag.startswith("best")
    others = [os.path.join(save_dir, d) for d in sorted(os.listdir(save_dir))
              if d != new_tag and os.path.isdir(os.path.join(save_dir, d))]
    if is_best:
        for path in [p for p in others if os.path.basename(p).startswith("best")]:
            shutil.rmtree(path)
            others.remove(path)
            removed.append((path, "older best checkpoint"))
    regular = [p for p in others if not os.path.basename(p).startswith("best")]
    total = sum(_tree_bytes(p) for p in others)

    def key(path: str) -> tuple:
        metric = read_metric(path)
        return (inspect_tag(path, zero_stage) is None, metric is not None,
                metric if metric is not None else float("-inf"), os.path.getmtime(path))

    for path in sorted(regular, key=key):
        over_num = not is_best and len(regular) >= max_num
        if not over_num and total <= max_mem_gb * 1024**3:
            break
        problem = inspect_tag(path, zero_stage)
        metric = read_metric(path)
        why = f"incomplete: {problem}" if problem else f"metric={metric}" if metric is not None else "no metric (oldest)"
        size = _tree_bytes(path)
        shutil.rmtree(path)
        regular.remove(path)
        total -= size
        removed.append((path, why))
    return removed


def rotate_hf_folders(ckpt_path: str, max_num: int) -> list[str]:
    """Keep the newest ``max_num`` ``global_step*_hf`` folders of ``ckpt_path`` and the newest ``best_*_hf``
    (as upstream rotates the DeepSpeed tags with ``--ckpt.max_num``); returns the folders removed."""
    if not os.path.isdir(ckpt_path) or max_num < 1:
        return []
    regular, best = [], []
    for name in os.listdir(ckpt_path):
        m = _HF_RE.match(name)
        if m and os.path.isdir(os.path.join(ckpt_path, name)):
            (best if m.group(1) else regular).append((int(m.group(2)), name))
    doomed = [name for _, name in sorted(regular, reverse=True)[max_num:]]
    doomed += [name for _, name in sorted(best, reverse=True)[1:]]
    for name in doomed:
        shutil.rmtree(os.path.join(ckpt_path, name), ignore_errors=True)
    return doomed

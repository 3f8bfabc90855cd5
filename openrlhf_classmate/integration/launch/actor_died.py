"""A Ray actor of the run that died (an engine killed mid-rollout, a training rank lost, the OOM killer), or a worker
Ray's memory monitor killed (``ray.exceptions.OutOfMemoryError``: the node's host memory ran out), told in one line.

Ray reports it as ``ActorDiedError`` (a ``RayActorError``) inside the controller's ``RayTaskError``, about 60 lines of
two tracebacks with the useful part, the dead actor's class, in the middle. The launcher asks
:func:`actor_died_message` about any exception that ends a run: it names the actor's class and process, what Ray says
of its exit, and the checkpoint a resume takes (``--ckpt.load_enable`` reads ``<ckpt.path>/_actor``).
"""

from __future__ import annotations

import re

from openrlhf_classmate.errors import exception_chain
from openrlhf_classmate.integration.training.checkpoints import CheckpointError, resume_choice

_FIELD_RE = r"^\s*{}:\s*(\S+)\s*$"
_EXIT_RE = re.compile(r"Worker exit type: (\w+)")


def _field(text: str, name: str) -> str | None:
    found = re.search(_FIELD_RE.format(name), text, re.MULTILINE)
    return found.group(1) if found else None


# Ray's memory-monitor line (2.55; older releases say "name=" and "memory used="), each field's patterns in order of
# preference; Ray's "GB" are GiB (bytes / 2**30)
_NUMBER = r"(\d+(?:\.\d+)?)"
_KILLED_RE = {name: [re.compile(p) for p in patterns] for name, patterns in (
    ("task", (r"task name=([^,\s]+)", r"\bname=([^,\s]+)")), ("pid", (r"\bpid=(\d+)",)),
    ("used", (rf"actual memory used={_NUMBER}\s*GB", rf"memory used={_NUMBER}\s*GB")),
    ("node", (rf"Memory on the node .*? was {_NUMBER}\s*GB / {_NUMBER}\s*GB",)),
    ("threshold", (rf"threshold of {_NUMBER}",)))}


def _search(name: str, text: str) -> re.Match | None:
    return next((m for pattern in _KILLED_RE[name] if (m := pattern.search(text))), None)


def memory_killed_message(text: str, ckpt_path: str | None) -> str:
    """The line for a worker Ray's memory monitor killed (``ray.exceptions.OutOfMemoryError``'s text); whatever of
    it cannot be read is left out of the line."""
    found = {name: _search(name, text) for name in _KILLED_RE}
    who = found["task"].group(1) if found["task"] else "a worker"
    what = ", ".join(x for x in (f"process {found['pid'].group(1)}" if found["pid"] else None,
                                 f"{found['used'].group(1)} GiB" if found["used"] else None) if x)
    node = (f" with its node's memory at {found['node'].group(1)} / {found['node'].group(2)} GiB"
            if found["node"] else "")
    threshold = f", above its threshold {float(found['threshold'].group(1)):g}" if found["threshold"] else ""
    return (f"error: Ray's memory monitor killed {who}{f' ({what})' if what else ''}{node}{threshold}: the run's "
            "processes need more host memory than the node has (--check lists what the offload and sleep flags keep "
            f"there); the run stopped. {resume_hint(ckpt_path)}")


def actor_died_message(exc: BaseException, ckpt_path: str | None) -> str | None:
    """One ``error:`` line when ``exc`` holds a Ray actor's death or a worker killed for host memory, else None."""
    from ray.exceptions import OutOfMemoryError, RayActorError

    chain = list(exception_chain(exc))
    killed = next((e for e in chain if isinstance(e, OutOfMemoryError)), None)
    if killed is not None:
        return memory_killed_message(str(killed), ckpt_path)
    dead = next((e for e in chain if isinstance(e, RayActorError)), None)
    if dead is None:
        return None
    text = str(dead)
    who = _field(text, "class_name") or "an actor"
    pid = _field(text, "pid")
    exit_type = _EXIT_RE.search(text)
    how = f"its process{f' {pid}' if pid else ''} exited ({exit_type.group(1) if exit_type else 'no reason given'}: " \
          "killed, out of memory, or its node lost)"
    return f"error: a process of the run died: {who}, {how}; the run stopped. {resume_hint(ckpt_path)}"


def resume_hint(ckpt_path: str | None) -> str:
    """What a resume takes: the last complete checkpoint under ``ckpt_path`` and the flag that loads it."""
    if not ckpt_path:
        return "Nothing was saved (no --ckpt.path)."
    try:
        choice = resume_choice(ckpt_path)
    except CheckpointError as e:
        return f"No checkpoint to resume from: {e}"
    if choice is None:
        return "No checkpoint was saved yet: start again (--ckpt.save_steps sets how often one is written)."
    return (f"The last complete checkpoint is {choice.tag} in {ckpt_path}/_actor: run the same command with "
            "--ckpt.load_enable to resume from it.")

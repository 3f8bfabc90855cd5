"""A Ray actor of the run that died (an engine killed mid-rollout, a training rank lost, the OOM killer), told in one
line.

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


def actor_died_message(exc: BaseException, ckpt_path: str | None) -> str | None:
    """One ``error:`` line when ``exc`` holds a Ray actor's death, else None."""
    from ray.exceptions import RayActorError

    dead = next((e for e in exception_chain(exc) if isinstance(e, RayActorError)), None)
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

"""``integration/launch/actor_died.py``: a dead Ray actor ends the run in one line naming it and the checkpoint to resume
from (the whole launcher run, an engine killed mid-rollout, a training rank killed mid-step: ``tests/test_faults_cpu.py``)."""

from __future__ import annotations

import os

from ray.exceptions import ActorDiedError

from openrlhf_classmate.integration.launch.actor_died import actor_died_message


def _raised_in_the_controller() -> RuntimeError:
    """A controller exception whose cause is an actor's death, as Ray chains them."""
    try:
        try:
            raise ActorDiedError()
        except ActorDiedError as died:
            raise RuntimeError("fit failed") from died
    except RuntimeError as e:
        return e


def test_a_death_names_the_checkpoint_to_resume_from_or_says_there_is_none(tmp_path):
    e = _raised_in_the_controller()
    assert actor_died_message(RuntimeError("other"), str(tmp_path)) is None
    assert actor_died_message(e, str(tmp_path / "none")) == (
        "error: a process of the run died: an actor, its process exited (no reason given: killed, out of memory, or "
        "its node lost); the run stopped. No checkpoint was saved yet: start again (--ckpt.save_steps sets how "
        "often one is written).")
    actor = tmp_path / "ckpt" / "_actor"
    os.makedirs(actor)
    assert "No checkpoint to resume from: " in actor_died_message(e, str(tmp_path / "ckpt"))  # an empty _actor
    assert actor_died_message(e, None).endswith("the run stopped. Nothing was saved (no --ckpt.path).")

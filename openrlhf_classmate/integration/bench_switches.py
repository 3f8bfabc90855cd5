"""The step-time benchmark's switches (``bench/step_time.py``), read from the environment by the launcher's processes.

A training run never sets them. They let one launcher run time several paths under the same engines, weights and
machine drift, so that each comparison is a pair measured inside one device call:

* ``OPENRLHF_CLASSMATE_BENCH_ALTERNATE=1``: odd rollout batches are classmate GDPO steps, even ones plain GRPO
  (:class:`~openrlhf_classmate.integration.experience.experience_maker.ClassmateExperienceMaker`).
* ``OPENRLHF_CLASSMATE_BENCH_BEFORE=<change>[,<change>...]``: some steps take the path from before a change of
  :data:`BEFORE_CHANGES`. The steps cycle through the launcher's own path ("after") and each listed change's before
  path (:func:`before_path`); the experience maker logs each rollout batch's path index as ``bench/before``, which
  ``bench/step_time.py --before`` splits the steps by.

The pairs recorded so far had their before paths removed (``dispatch``, ``seeds``, ``syncs``: ``bench/GPU_RESULTS.md``
section 9, ``bench/gpu_results/wave9``; ``weightsync``, ``mismatch``, ``tokenizer``: sections 10 and 11,
``wave13``, ``wave14``); :data:`BEFORE_CHANGES` lists the pairs not measured yet. A new pair plugs in with two
edits: its name in
:data:`BEFORE_CHANGES`, and one branch where its old code ran, ``if before_path(step) == "<name>": <the old path>``,
``step`` being the 1-based rollout batch (the experience maker's ``_batches_made``; a process without it, such as
the actor, counts its own steps from the run's start). Remove both once its figures are recorded.
"""

from __future__ import annotations

import os

ALTERNATE_ENV = "OPENRLHF_CLASSMATE_BENCH_ALTERNATE"
BEFORE_ENV = "OPENRLHF_CLASSMATE_BENCH_BEFORE"
# the changes whose before path the code still holds, each measured as before/after in one run
# (bench/step_time.py --interleave --before ...): none today
BEFORE_CHANGES: tuple[str, ...] = ()


def alternating() -> bool:
    """Whether the run alternates GDPO (odd) and plain GRPO (even) steps."""
    return os.environ.get(ALTERNATE_ENV) == "1"


def parse_changes(raw: str) -> tuple[str, ...]:
    """The changes of a comma-separated list (``--before`` of ``bench/step_time.py``, or :data:`BEFORE_ENV`), in its
    order; empty for "". A list with an unknown change or one twice raises ValueError: a benchmark that silently
    measured nothing would report a pair of equal paths."""
    changes = tuple(raw.split(",")) if raw else ()
    if any(c not in BEFORE_CHANGES for c in changes) or len(set(changes)) != len(changes):
        known = ", ".join(BEFORE_CHANGES) or "no change (none has a before path today)"
        raise ValueError(f"a comma-separated list of {known}, each at most once")
    return changes


def before_changes() -> tuple[str, ...]:
    """The changes of :data:`BEFORE_ENV` (:func:`parse_changes`; empty when unset)."""
    raw = os.environ.get(BEFORE_ENV, "")
    try:
        return parse_changes(raw)
    except ValueError as e:
        raise ValueError(f"{BEFORE_ENV}={raw}: {e}") from None


def path_index(step: int) -> int:
    """The path step ``step`` (1-based; an actor update or a rollout batch) takes: 0 for the launcher's own, else the
    1-based position in :data:`BEFORE_ENV` of the change whose before path it takes (the experience maker logs it as
    ``bench/before``).

    The steps go in blocks: one step, or under the GDPO / GRPO alternation two (a GDPO step and the GRPO step after
    it share a path). Block 1 takes the own path, block 2 the first change's before path, block 3 the second's, ...,
    then the cycle repeats. One change under the alternation: steps 1-2 after, 3-4 before, 5-6 after, ...; three
    changes in a GDPO-only run: step 1 after, 2 the first change, 3 the second, 4 the third, 5 after, ... So every
    before step has an after step of its kind ``index * block`` steps earlier, in the same cycle."""
    changes = before_changes()
    if not changes or step < 1:
        return 0
    return (step - 1) // block() % (len(changes) + 1)


def before_path(step: int) -> str | None:
    """The change whose before path step ``step`` takes (:func:`path_index`), or None for the launcher's own path:
    the one call a change's old path branches on (module docstring)."""
    index = path_index(step)
    return before_changes()[index - 1] if index else None


def block() -> int:
    """Steps per block of :func:`path_index`: 2 under the GDPO / GRPO alternation, else 1."""
    return 2 if alternating() else 1

"""Exceptions shared across the layers: defined here, below ``integration``, so that a reward hook in ``rewards`` can
stop the run without importing the trainer that calls it."""

from __future__ import annotations

from collections.abc import Iterator


class TrainingStopped(RuntimeError):
    """The run cannot go on; the launcher prints the message as its one ``error:`` line."""


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it: ``__cause__``, ``__context__`` and Ray's ``RayTaskError.cause`` (where
    Ray keeps the remote exception), each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 32:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]

"""Exceptions shared across the layers: defined here, below ``integration``, so that a reward hook in ``rewards`` can
stop the run without importing the trainer that calls it."""

from __future__ import annotations


class TrainingStopped(RuntimeError):
    """The run cannot go on; the launcher prints the message as its one ``error:`` line."""

"""What the preflight's checks share (:mod:`~openrlhf_classmate.integration.launch.preflight`, its dataset half
:mod:`~openrlhf_classmate.integration.launch.preflight_data` and the layout checks of
:mod:`~openrlhf_classmate.integration.launch.layout`): the one-line error, the report of what was checked, the tokenizers
loaded once per preflight, and the test that tells a local path from a hub id."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class PreflightError(ValueError):
    """One line: what is wrong and where (flag, file:line, field)."""


@dataclass
class PreflightReport:
    lines: list[str] = field(default_factory=list)
    """What was checked, for ``--check``."""
    warnings: list[str] = field(default_factory=list)
    """Problems the run survives (printed as ``warning: ...``)."""


_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_local(path: str) -> bool:
    """Absolute, ./, ../, ~, or more than one "/" (a hub id is NAME or ORG/NAME)."""
    return path.startswith(("/", "./", "../", "~")) or path.count("/") > 1 or not _HUB_ID_RE.match(path)


class TokenizerCache:
    """The tokenizers the checks need, each loaded once per preflight."""

    def __init__(self, load: Callable[[str], Any] | None = None):
        if load is None:
            from transformers import AutoTokenizer

            def load(path: str):
                return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        self._load = load
        self._cache: dict[str, Any] = {}

    def require(self, flag: str, path: str):
        """The tokenizer of ``path``; PreflightError when it cannot be loaded."""
        if path not in self._cache:
            try:
                self._cache[path] = self._load(path)
            except Exception as e:  # noqa: BLE001  (transformers raises OSError, ValueError, ... for unusable folders)
                self._cache[path] = PreflightError(f"{flag} {path}: cannot load its tokenizer ({type(e).__name__}: "
                                                   f"{str(e).splitlines()[0][:200] if str(e) else ''})")
        value = self._cache[path]
        if isinstance(value, PreflightError):
            raise value
        return value

    def get(self, flag: str, path: str):
        """Like :meth:`require`, but None for a hub id that cannot be loaded here (offline): checks that need it are
        skipped (a local folder without a usable tokenizer is still an error)."""
        try:
            return self.require(flag, path)
        except PreflightError:
            if os.path.isdir(os.path.expanduser(path)):
                raise
            return None

"""``vllm.exceptions`` as in vLLM 0.29: request validation errors are ``VLLMValidationError`` (not a ``ValueError``
there; vLLM 0.26 derives it from ``ValueError``, so catch both where it matters)."""

from __future__ import annotations

from typing import Any


class VLLMError(Exception):
    """Base class of vLLM's own errors."""


class VLLMClientError(VLLMError):
    """An error caused by the request."""


class VLLMValidationError(VLLMClientError):
    """A request parameter failed validation (``parameter`` / ``value`` name it when known)."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        base = super().__str__()
        extras = [f"parameter={self.parameter}"] if self.parameter is not None else []
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{base} ({', '.join(extras)})" if extras else base

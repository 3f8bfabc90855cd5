"""Stand-in for ``vllm`` 0.29.0 on machines where vLLM cannot be installed (see ``openrlhf_classmate.shims``).

Only the names OpenRLHF 0.11.2 and openrlhf_classmate import exist. Sampling parameters are a plain dataclass with
vLLM's field names; anything that would run an engine raises :class:`VLLMNotInstalledError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__version__ = "0.29.0"
__openrlhf_classmate_shim__ = True


class VLLMNotInstalledError(RuntimeError):
    """Raised by every stand-in that would need a real vLLM engine."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} needs vLLM, but vLLM is not installed (this is openrlhf_classmate's CPU import shim). "
            "Install the GPU stack (scripts/setup.sh on a CUDA machine), or use the HF engine "
            "(--classmate.engine hf / automatic when vLLM is absent)."
        )


@dataclass
class SamplingParams:
    """vLLM's sampling parameters, by field name (the subset OpenRLHF and openrlhf_classmate use)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    detokenize: bool = True
    extra_args: dict[str, Any] | None = field(default=None)


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise VLLMNotInstalledError(type(self).__name__)

    @classmethod
    def from_engine_args(cls, *args, **kwargs):
        raise VLLMNotInstalledError(f"{cls.__name__}.from_engine_args")


class AsyncEngineArgs(_Unavailable):
    pass


class AsyncLLMEngine(_Unavailable):
    pass


class LLM(_Unavailable):
    pass


class LLMEngine(_Unavailable):
    pass

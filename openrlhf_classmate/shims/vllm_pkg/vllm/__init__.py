"""Stand-in for ``vllm`` 0.29.0 on machines where vLLM cannot be installed (see ``openrlhf_classmate.shims``).

Only the names OpenRLHF 0.11.2 and openrlhf_classmate import exist. ``SamplingParams`` validates and normalises as
vLLM 0.29's does (``vllm/sampling_params.py`` here); anything that would run an engine raises
:class:`VLLMNotInstalledError`.
"""

from __future__ import annotations

from vllm.sampling_params import SamplingParams  # noqa: F401

__version__ = "0.29.0"
__openrlhf_classmate_shim__ = True


class VLLMNotInstalledError(RuntimeError):
    """Raised by every stand-in that would need a real vLLM engine."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} needs vLLM, but vLLM is not installed (this is openrlhf_classmate's CPU import shim). "
            "Install the GPU stack (scripts/setup.sh on a CUDA machine), or use the HF engine "
            "(--engine.backend hf; automatic when vLLM is absent)."
        )


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

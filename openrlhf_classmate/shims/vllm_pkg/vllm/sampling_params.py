"""``vllm.SamplingParams`` of the CPU stand-in, with vLLM 0.29's construction-time behaviour.

Real vLLM validates sampling parameters when they are built (``SamplingParams.__post_init__`` / ``_verify_args``);
this stand-in applies the same normalisations and rejects the same values with the same messages, so that a CPU run
(HF engine) fails where a GPU run (vLLM engine) would, instead of quietly sampling something else:

* ``stop`` / ``stop_token_ids`` / ``bad_words``: ``None`` becomes ``[]``, a single stop string a one-element list,
  duplicate stop ids are kept (as vLLM does); ``logprobs=True`` / ``prompt_logprobs=True`` mean 1; ``seed=-1`` means no seed;
* a temperature in (0, 0.01) is raised to 0.01 (vLLM warns: smaller values overflow);
* a temperature below 1e-5 is greedy: ``top_p``, ``top_k`` and ``min_p`` are reset, and ``n`` must be 1;
* ranges: ``n`` >= 1, penalties, ``temperature`` in [0, 2], ``top_p`` in (0, 1], ``top_k`` >= -1 (0 and -1 = off),
  ``min_p`` in [0, 1], ``max_tokens`` >= 1, 0 <= ``min_tokens`` <= ``max_tokens``, (prompt_)logprobs >= -1, no
  empty stop strings.

Engine-level checks (``max_logprobs``, prompt longer than ``max_model_len``) happen in the engine, not here.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from vllm.exceptions import VLLMValidationError

_SAMPLING_EPS = 1e-5  # below this temperature vLLM samples greedily
_MIN_TEMPERATURE = 1e-2  # positive temperatures are raised to at least this

logger = logging.getLogger("vllm.sampling_params")


def _max_n() -> int:
    return int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))


class RequestOutputKind(Enum):
    """vLLM's: what each ``RequestOutput`` of a request carries (the HF engine returns one final output anyway)."""

    CUMULATIVE = 0  # the whole output so far, after every step
    DELTA = 1  # only what is new
    FINAL_ONLY = 2  # no intermediate outputs


@dataclass
class SamplingParams:
    """vLLM's sampling parameters (every field OpenRLHF 0.11.2 and openrlhf_classmate pass, with vLLM's defaults)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    flat_logprobs: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    bad_words: list[str] | None = None
    output_text_buffer_length: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MIN_TEMPERATURE:
            logger.warning("temperature %s is less than %s, which may cause numerical errors nan or inf in tensors. "
                           "We have maxed it out to %s.", self.temperature, _MIN_TEMPERATURE, _MIN_TEMPERATURE)
            self.temperature = _MIN_TEMPERATURE
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self.bad_words = [] if self.bad_words is None else list(dict.fromkeys(self.bad_words))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify_args(self) -> None:
        if not isinstance(self.n, int):
            raise VLLMValidationError(f"n must be an int, but is of type {type(self.n)}")
        if self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if self.n > _max_n():
            raise VLLMValidationError(f"n must be at most {_max_n()}, got {self.n}. To increase this limit, set the "
                                      "VLLM_MAX_N_SEQUENCES environment variable.")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise VLLMValidationError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not math.isfinite(self.repetition_penalty):
            raise VLLMValidationError(f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        if self.repetition_penalty <= 0.0:
            raise VLLMValidationError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        t = self.temperature
        if not math.isfinite(t):
            raise VLLMValidationError(f"temperature must be a finite number, got {t}.", parameter="temperature", value=t)
        if t < 0.0:
            raise VLLMValidationError(f"temperature must be non-negative, got {t}.", parameter="temperature", value=t)
        if t > 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {t}.", parameter="temperature", value=t)
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.", parameter="top_p",
                                      value=self.top_p)
        if self.top_k < -1:  # -1 is accepted as "off", like 0
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not isinstance(self.top_k, int):
            raise VLLMValidationError(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.",
                                      parameter="max_tokens", value=self.max_tokens)
        if self.min_tokens < 0:
            raise VLLMValidationError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise VLLMValidationError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got "
                                      f"{self.min_tokens}.")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value != -1 and value < 0:
                raise VLLMValidationError(f"{name} must be non-negative or -1, got {value}.", parameter=name,
                                          value=value)
        if not all(isinstance(i, int) for i in self.stop_token_ids):
            raise VLLMValidationError(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if any(not s for s in self.stop):
            raise VLLMValidationError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise VLLMValidationError("stop strings are only supported when detokenize is True. Set detokenize=True "
                                      "to use stop.")
        if any(not w for w in self.bad_words):
            raise VLLMValidationError(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")

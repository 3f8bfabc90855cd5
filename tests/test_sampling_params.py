"""``vllm.SamplingParams`` rejects and normalises what vLLM 0.29 does, whichever ``vllm`` is importable: on CPU the
stand-in (``openrlhf_classmate/shims/vllm_pkg/vllm/sampling_params.py``), on the GPU machine the real vLLM. The same
file runs on both, so a value the CPU accepts is one the GPU accepts too."""

import math

import pytest
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

# vLLM 0.26 raises ValueError (and TypeError for a float top_k); 0.29 raises VLLMValidationError, not a ValueError
REJECTED = (VLLMValidationError, ValueError, TypeError)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be at least 1, got 0"),
        ({"n": 2.0}, "n must be an int"),
        ({"temperature": -0.1}, "temperature must be non-negative"),
        ({"temperature": 2.5}, r"temperature must be in \[0, 2\]"),
        ({"temperature": math.inf}, "temperature must be a finite number"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k must be 0 \\(disable\\), or at least 1"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must be less than or equal to max_tokens=4"),
        ({"logprobs": -2}, "logprobs must be non-negative or -1"),
        ({"prompt_logprobs": -2}, "prompt_logprobs must be non-negative or -1"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -3.0}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero"),
        ({"stop": ["a", ""]}, "stop cannot contain an empty string"),
        ({"stop": "x", "detokenize": False}, "stop strings are only supported when detokenize is True"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids must contain only integers"),
        ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling, got 2"),
    ],
)
def test_rejects_what_vllm_rejects(kwargs, message):
    with pytest.raises(REJECTED, match=message):
        SamplingParams(**kwargs)


def test_greedy_normalises_the_sampling_knobs():
    sp = SamplingParams(temperature=0.0, top_p=0.5, top_k=7, min_p=0.2, max_tokens=3)
    assert (sp.top_p, sp.top_k, sp.min_p, sp.n) == (1.0, 0, 0.0, 1)
    # only 0 is greedy: a tiny positive temperature is raised to 0.01 first, and samples (n > 1 allowed)
    tiny = SamplingParams(temperature=1e-6, top_k=3, n=3)
    assert tiny.top_k == 3 and tiny.temperature == pytest.approx(0.01)


def test_small_positive_temperature_is_raised_to_the_floor():
    assert SamplingParams(temperature=0.001).temperature == pytest.approx(0.01)
    assert SamplingParams(temperature=0.5).temperature == 0.5


def test_list_fields_and_flags_are_normalised():
    sp = SamplingParams(stop=None, stop_token_ids=None)
    assert sp.stop == [] and sp.stop_token_ids == []
    # real vLLM 0.26 keeps duplicate stop ids as given (checked on the H100), so the shim does too
    sp = SamplingParams(stop="\n\n", stop_token_ids=[5, 5, 7], logprobs=True, prompt_logprobs=True, seed=-1)
    assert sp.stop == ["\n\n"] and sp.stop_token_ids == [5, 5, 7]
    assert (sp.logprobs, sp.prompt_logprobs, sp.seed) == (1, 1, None)


def test_defaults_match_vllm():
    sp = SamplingParams()
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens, sp.min_tokens) == (
        1, 1.0, 1.0, 0, 0.0, 16, 0)
    assert (sp.logprobs, sp.prompt_logprobs, sp.skip_special_tokens, sp.detokenize) == (None, None, True, True)


def test_what_openrlhf_and_this_project_build_is_accepted():
    # OpenRLHF 0.11.2's rollout (samples_generator._dispatch_prompts_to_vllm): max_tokens None = dynamic, then the
    # agent executor sets it on a copy; top_k -1 is vLLM's accepted "off"
    sp = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1,
                        skip_special_tokens=False, logprobs=None)
    sp.max_tokens = 12
    assert sp.top_k == -1 and sp.max_tokens == 12
    # the classmate stage (greedy classmate, vanilla_classmate's prompt_logprobs)
    sp = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=8, seed=3, prompt_logprobs=0,
                        skip_special_tokens=True)
    assert sp.prompt_logprobs == 0 and sp.top_k == 0

"""Agent executor of the classmate engine group (loaded by path through ``create_vllm_engines(agent_func_path=...)``).

A classmate request's ``prompt`` is a dict ``{"input_ids", "cot_offset", "cot_len"}`` built by the controller; the
executor generates one answer and, when the sampling parameters ask for ``prompt_logprobs``, returns the classmate's
log-probabilities of the CoT tokens ``input_ids[cot_offset : cot_offset + cot_len]`` (what ``vanilla_classmate``
needs). Scoring happens in the controller, batched, so nothing here depends on the task.
"""

from __future__ import annotations

import time
from copy import deepcopy

from openrlhf.utils.agent import AgentExecutorBase


def cot_prompt_logprobs(prompt_logprobs, input_ids: list[int], offset: int, length: int) -> list[float]:
    """Read vLLM's ``prompt_logprobs`` (``None`` or ``{token_id: Logprob}`` per position) for the CoT slice."""
    values = []
    for pos in range(offset, offset + length):
        entry = prompt_logprobs[pos] if prompt_logprobs is not None and pos < len(prompt_logprobs) else None
        logprob = entry.get(input_ids[pos]) if entry else None
        values.append(float(logprob.logprob) if logprob is not None else float("-inf"))
    return values


class AgentExecutor(AgentExecutorBase):
    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        input_ids = list(prompt["input_ids"])
        output = await llm_engine.generate(input_ids, deepcopy(sampling_params))
        completion = output.outputs[0]
        cot_logprobs = None
        if sampling_params.prompt_logprobs is not None:
            cot_logprobs = cot_prompt_logprobs(output.prompt_logprobs, input_ids, prompt["cot_offset"], prompt["cot_len"])
        return {
            "output_token_ids": list(completion.token_ids),
            "finish_reason": completion.finish_reason,
            "cot_logprobs": cot_logprobs,
            "finished_at": time.time(),
        }

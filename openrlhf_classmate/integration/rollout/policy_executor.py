"""Agent executor of the policy engines when the scorer registry is the main reward (the launcher's default).

Upstream's ``SingleTurnAgentExecutor`` hands a reward function decoded text only (``decode(prompt_ids +
response_ids)``): there a ``</think>`` written as ordinary BPE pieces cannot be told from the real tag id, and a
normalising tokenizer or upstream's left-truncation of long prompts breaks any attempt to cut the prompt back off.
This executor (loaded by path through ``create_vllm_engines(agent_func_path=...)``, which the launcher's
``EngineFactory.policy`` sets only when the registry reward is in use and the user gave no ``--train.agent_func_path``)
runs upstream's own ``execute`` unchanged (prompt truncation, sampling, rollout log-probs) without reward endpoints,
then splits the response on its token ids with :class:`~openrlhf_classmate.algo.response_split.ThinkFormat` (the
split the classmate stage and ``evaluate`` use) and scores the decoded answer with
:func:`openrlhf_classmate.reward_func.reward_func`.

Settings come from environment variables that the launcher sets for every Ray worker (upstream constructs the
executor without arguments): ``OPENRLHF_CLASSMATE_THINK_OPEN`` / ``_THINK_CLOSE`` (the tags, one token each),
``OPENRLHF_CLASSMATE_FINAL_ANSWER`` (``after_think`` or ``whole_response``) and ``OPENRLHF_CLASSMATE_STOP_IDS``
(JSON list: every EOS id of the actor's generation config).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from openrlhf.utils.agent import SingleTurnAgentExecutor

from openrlhf_classmate.algo.response_split import ThinkFormat, decoded_answer, load_stop_token_ids


def think_format_from_env(tokenizer) -> ThinkFormat:
    """The policy's split settings, as the launcher exported them (``reward_env``)."""
    raw = os.environ.get("OPENRLHF_CLASSMATE_STOP_IDS")
    stops = json.loads(raw) if raw else load_stop_token_ids(getattr(tokenizer, "name_or_path", None), tokenizer)
    if os.environ.get("OPENRLHF_CLASSMATE_FINAL_ANSWER", "after_think") == "whole_response":
        return ThinkFormat.of(tokenizer, think_open=None, think_close=None, stop_ids=stops)
    return ThinkFormat.of(tokenizer, think_open=os.environ.get("OPENRLHF_CLASSMATE_THINK_OPEN", "<think>"),
                          think_close=os.environ.get("OPENRLHF_CLASSMATE_THINK_CLOSE", "</think>"), stop_ids=stops)


_REPORTED: set[str] = set()


def _invalid(message: str, has_answer: bool) -> dict:
    if message not in _REPORTED:
        _REPORTED.add(message)
        print(f"[openrlhf_classmate.policy_executor] scoring failed: {message}", file=sys.stderr, flush=True)
    # the same extra_logs keys as reward_func's replies: upstream stacks them across samples
    return {"rewards": 0.0, "scores": 0.0, "extra_logs": {"has_answer": float(has_answer), "main_valid": 0.0}}


class AgentExecutor(SingleTurnAgentExecutor):
    def __init__(self):
        super().__init__(None)  # no reward endpoints: upstream's execute scores nothing, we score on the ids below

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        from openrlhf_classmate.reward_func import reward_func

        output = await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
        tokens = output["observation_tokens"]
        start, end = output["action_ranges"][0]
        answer = None
        try:
            form = think_format_from_env(hf_tokenizer)
            split = form.split(tokens[:start], tokens[start:end])
            answer = decoded_answer(hf_tokenizer, tokens[start:end], split)
            query = hf_tokenizer.decode(tokens, skip_special_tokens=False)
            info = await asyncio.to_thread(reward_func, [query], [prompt], [label], answers=[answer])
        except Exception as e:  # noqa: BLE001 - upstream would swallow it and fail later with a misleading message
            info = _invalid(f"{type(e).__name__}: {e}", answer is not None)
        score = info.get("scores")
        output.update(reward=info.get("rewards"), scores=info.get("rewards") if score is None else score,
                      extra_logs=info.get("extra_logs") or {})
        return output

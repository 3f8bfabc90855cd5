"""``vllm.inputs.TokensPrompt``: in vLLM a TypedDict, so a plain dict here too."""

from __future__ import annotations

from typing import Any, TypedDict


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    multi_modal_data: Any
    mm_processor_kwargs: dict[str, Any]

"""The demo's tiny models: ``testing.tiny_models`` Llama causal LMs with the demo's word-level tokenizer.

Llama because, with transformers 5, ``AutoTokenizer`` maps the model type ``qwen2`` to ``Qwen2Tokenizer`` whatever
``tokenizer_config.json`` says, and that class rebuilds a byte-level BPE from the vocabulary (a reloaded word-level
tokenizer would split ``14`` into ``1 4``); ``save_model`` checks that the saved tokenizer reloads identically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_layers: int
    num_heads: int = 4
    intermediate_size: int | None = None


def new_model(words: list[str], size: ModelSize, seed: int, max_positions: int = 128):
    """A randomly initialised model and its tokenizer (nothing saved)."""
    from openrlhf_classmate.testing.tiny_models import new_tiny_model

    return new_tiny_model(words, size.hidden_size, size.num_layers, size.num_heads,
                          size.intermediate_size or 4 * size.hidden_size, seed, max_positions)


def save_model(model, tokenizer, path: str) -> str:
    """Save both and check that ``AutoTokenizer`` reloads the exact same tokenizer (ids and decoded text)."""
    from transformers import AutoTokenizer

    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    probe = "<think> 7 + 5 = 12 </think> 12"
    reloaded = AutoTokenizer.from_pretrained(path)
    ids = tokenizer.encode(probe, add_special_tokens=False)
    if reloaded.encode(probe, add_special_tokens=False) != ids or reloaded.decode(ids) != tokenizer.decode(ids):
        raise RuntimeError(f"the tokenizer saved in {path} does not reload identically ({type(reloaded).__name__})")
    return path


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())

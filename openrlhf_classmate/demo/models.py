"""The demo's tiny models: Llama-architecture causal LMs with the demo's word-level tokenizer, saved as HF dirs.

Why Llama and not the Qwen2 of ``testing.tiny_models``: with transformers 5, ``AutoTokenizer`` maps the model type
``qwen2`` to ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says, and that class rebuilds a byte-level BPE
from the vocabulary, so a reloaded word-level tokenizer splits ``14`` into ``1 4`` and drops the spaces when
decoding. For model type ``llama`` the saved ``tokenizers`` pipeline is loaded as is (checked in ``save_model``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from openrlhf_classmate.testing.tokenizers import build_word_tokenizer


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_layers: int
    num_heads: int = 4
    intermediate_size: int | None = None


def new_model(words: list[str], size: ModelSize, seed: int, max_positions: int = 128):
    """A randomly initialised model and its tokenizer (nothing saved)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_word_tokenizer(words)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size or 4 * size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads,
        head_dim=size.hidden_size // size.num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id
    )
    return model, tokenizer


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

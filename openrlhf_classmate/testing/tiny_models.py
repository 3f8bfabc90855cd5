"""Tiny causal LMs with local tokenizers, saved as Hugging Face model directories (nothing is downloaded).

Used by the tests, the CPU end-to-end runs and the demo: ``save_tiny_model(path, words)`` writes a randomly
initialised Llama-architecture model (a few thousand to a few million parameters) plus a word-level tokenizer with
``<think>`` / ``</think>`` and a chat template, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``. Pass
``tokenizer=`` (e.g. a BPE tokenizer of :mod:`openrlhf_classmate.testing.bpe_world`) instead of ``words`` to put the
model over another tokenizer, and ``stop_token_ids=`` for a generation config that stops on several ids.

``save_random_lm`` saves a model alone (no tokenizer) of any vocabulary size, and ``ragged_batch`` makes a micro-batch
in upstream's experience layout (left-padded prompts, right-padded responses), for tests of the actor forward.
"""

from __future__ import annotations

import os

import torch

from openrlhf_classmate.testing.tokenizers import build_word_tokenizer


def new_tiny_model(
    words: list[str] | None,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
    max_position_embeddings: int = 512,
    chat_template: str | None = None,
    *,
    tokenizer=None,
    stop_token_ids: list[int] | None = None,
):
    """A randomly initialised Llama causal LM and its tokenizer (nothing saved): a word-level tokenizer over
    ``words``, or ``tokenizer`` as given. ``stop_token_ids`` (default: the tokenizer's EOS) become the generation
    config's ``eos_token_id``.

    Llama, not Qwen2: transformers forces its Qwen2 (byte-level BPE) tokenizer class onto any qwen2 model directory,
    which would silently re-tokenise our word-level vocabulary when the directory is reloaded.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if tokenizer is None:
        tokenizer = build_word_tokenizer(words, chat_template=chat_template)
    eos = list(stop_token_ids) if stop_token_ids else tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=bos)
    return model, tokenizer


def save_tiny_model(
    path: str,
    words: list[str],
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
    max_position_embeddings: int = 512,
    chat_template: str | None = None,
) -> str:
    """``new_tiny_model`` saved to ``path`` (model + tokenizer); returns ``path``."""
    model, tokenizer = new_tiny_model(words, hidden_size, num_layers, num_heads, intermediate_size, seed,
                                      max_position_embeddings, chat_template)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def save_random_lm(path: str, *, vocab_size: int = 300, hidden_size: int = 32, tie: bool = True, seed: int = 0) -> str:
    """A random 2-layer Llama causal LM of ``vocab_size`` tokens saved to ``path`` (no tokenizer); returns ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=tie, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def ragged_batch(vocab_size: int, prompts: list[int], responses: list[int], seed: int = 0):
    """(sequences, attention_mask, action_mask) of random tokens >= 3 with the given prompt / response lengths per row,
    as upstream's experiences hold them: prompts left-padded, responses right-padded, pad id 0, and the action mask
    over the response columns (log-prob column j scores response token j)."""
    g = torch.Generator().manual_seed(seed)
    p, r = max(prompts), max(responses)
    sequences = torch.randint(3, vocab_size, (len(prompts), p + r), generator=g)
    cols = torch.arange(p + r)
    attention = torch.stack([(cols >= p - pl) & (cols < p + rl) for pl, rl in zip(prompts, responses)]).long()
    return sequences * attention, attention, attention[:, p:].bool()

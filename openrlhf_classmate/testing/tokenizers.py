"""Tiny word-level tokenizers built locally, so tests never download a model.

``build_word_tokenizer`` returns a real ``transformers.PreTrainedTokenizerFast`` (backed by a ``tokenizers``
WordLevel model) with a chat template, which is all the classmate-prompt code needs from a tokenizer.

Tokenisation rules: runs of spaces/tabs separate words and are dropped; every ``"\\n"`` is its own token; unknown
words map to ``<unk>``. Decoding joins tokens with single spaces, so ``decode(encode(text))`` re-encodes to the same
ids (a token-level round trip), although the text itself is not byte-identical.

Special tokens (never split, ``special=True``): ``<pad>``, ``<unk>``, ``<eos>``, ``<|system|>``, ``<|user|>``,
``<|assistant|>``. The think tags ``<think>`` / ``</think>`` are added tokens with ``special=False``, as in Qwen3,
so ``decode(..., skip_special_tokens=True)`` keeps them.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<unk>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>")
THINK_TOKENS = ("<think>", "</think>")


def default_chat_template(think_in_template: bool = False) -> str:
    """``<|role|>\\n{content}<eos>\\n`` per message; the generation prompt is ``<|assistant|>\\n`` (+ ``<think>\\n``)."""
    generation = "<|assistant|>\n" + ("<think>\n" if think_in_template else "")
    return (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}" + generation + "{% endif %}"
    )


def build_word_tokenizer(
    words: list[str], chat_template: str | None = None, think_in_template: bool = False, think_tags: bool = True
) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over ``words`` (plus ``"\\n"``), the specials above and the think tags.

    Ids are assigned in order: specials (``<pad>`` = 0, ``<unk>`` = 1, ``<eos>`` = 2, ...), ``"\\n"``, then ``words``
    (duplicates ignored), then ``<think>``, ``</think>``. Two tokenizers built from the same ``words`` therefore have
    identical vocabularies; different ``words`` give different ones.
    ``chat_template`` overrides the default template (see ``default_chat_template``; ``think_in_template`` only
    affects the default). ``think_tags=False`` leaves the think tags out (``<think>`` then encodes to ``<unk>``), as a
    model without them that ``cli/prepare_policy.py`` must prepare.
    """
    vocab: dict[str, int] = {}
    for w in (*SPECIAL_TOKENS, "\n", *words):
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed"), pre_tokenizers.Split("\n", behavior="isolated")]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if think_tags:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>", model_max_length=1 << 20
    )
    hf.chat_template = chat_template if chat_template is not None else default_chat_template(think_in_template)
    return hf

"""A realistic tokenizer world for tests: byte-level BPE tokenizers trained at test time with HF ``tokenizers``.

Every tokenizer is trained on a small generated corpus (well under a second, deterministic: the same merges in every
process) and wrapped as a ``transformers.PreTrainedTokenizerFast`` with a chat template and the stop ids of its
generation config. The kinds mirror the real families the trainer meets:

* ``qwen3``: Qwen2/3-style byte-level BPE (NFC normaliser, Qwen's split regex, one digit per token), ChatML
  specials ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>``, ``<think>`` / ``</think>`` as added *non-special*
  tokens, EOS ``<|im_end|>``, generation stops on ``<|im_end|>`` and ``<|endoftext|>``; plain generation prompt
  ``<|im_start|>assistant\\n``.
* ``qwen3_thinking``: the same tokenizer with a template whose generation prompt opens the think block
  (``...assistant\\n<think>\\n``, as R1-distill / ``*-Thinking-2507``).
* ``llama3``: Llama-3-style byte-level BPE over another corpus (another vocabulary, up to three digits per token, no
  normaliser), header specials, BOS written by the template, EOS ``<|eot_id|>``, stops on ``<|eot_id|>`` and
  ``<|end_of_text|>``.
* ``sentencepiece``: SentencePiece-style BPE (``▁`` word prefix added to the first word only, byte fallback for
  characters outside its alphabet, a decoder that strips the leading space), ``<s>`` / ``</s>`` / ``<unk>``,
  ``[INST] ... [/INST]`` template, stops on ``</s>``.

Text that the corpus never saw (``</think>`` typed as text, emoji) is still encodable: byte-level BPE falls back to
byte tokens and the SentencePiece-style one to ``<0xNN>`` tokens, so a tag *written as pieces* is representable.
``save_world_model`` puts a tiny random Llama model over a world tokenizer into a Hugging Face directory (with the
generation config's stop ids), loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

KINDS = ("qwen3", "qwen3_thinking", "llama3", "sentencepiece")
THINK_TAGS = ("<think>", "</think>")

QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = QWEN_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_THINKING = CHATML.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}")
LLAMA3_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                   "{{ m['content'] }}<|eot_id|>{% endfor %}"
                   "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
INST_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}"
                 "{{ eos_token }}{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}")

# Words of the corpora: reasoning prose, arithmetic, and characters of 2, 3 and 4 UTF-8 bytes.
_WORDS = ("let me think step by step the answer is so we add first then result check again wait total plus equals "
          "question user assistant system kind sky blue light because café naïve Straße résumé 日本語 中文 数学 Ω €").split()


@dataclasses.dataclass(frozen=True)
class Kind:
    """How one world tokenizer is built."""

    specials: tuple[str, ...]  # special added tokens, ids 0.. in this order (trainer special tokens)
    bos: str | None
    eos: str
    pad: str | None
    stops: tuple[str, ...]  # the generation config's eos_token_id list
    template: str
    vocab_size: int
    corpus_seed: int


KIND_SPECS = {
    "qwen3": Kind(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", "<|endoftext|>",
                  ("<|im_end|>", "<|endoftext|>"), CHATML, 520, 0),
    "llama3": Kind(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>", "<|finetune_right_pad_id|>"), "<|begin_of_text|>", "<|eot_id|>",
                   "<|finetune_right_pad_id|>", ("<|eot_id|>", "<|end_of_text|>"), LLAMA3_TEMPLATE, 440, 1),
    "sentencepiece": Kind(("<unk>", "<s>", "</s>"), "<s>", "</s>", None, ("</s>",), INST_TEMPLATE, 360, 2),
}
KIND_SPECS["qwen3_thinking"] = dataclasses.replace(KIND_SPECS["qwen3"], template=CHATML_THINKING)


def corpus(seed: int, lines: int = 1500) -> list[str]:
    """Deterministic training text: prose, sums, and multi-byte words (no chat markup, no think tags)."""
    rng = random.Random(seed)
    words = list(_WORDS)
    rng.shuffle(words)
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        prose = " ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
        out.append(f"{prose}: {a} + {b} = {a + b}.\n" if rng.random() < 0.7 else f"{prose}, {a}?\n\n")
    return out


def train_byte_level(lines: list[str], vocab_size: int, specials: tuple[str, ...], split: str = QWEN_SPLIT,
                     normalizer=None) -> Tokenizer:
    """A byte-level BPE (GPT-2 / Qwen style: ``split`` pre-tokenises, every byte has a token) trained on ``lines``,
    with ``specials`` as the first ids. The specials are not yet registered as added tokens (the caller adds them
    and any other added token, e.g. the think tags)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def _byte_level(spec: Kind, split: str, normalizer) -> Tokenizer:
    return train_byte_level(corpus(spec.corpus_seed), spec.vocab_size, spec.specials, split, normalizer)


def _sentencepiece(spec: Kind) -> Tokenizer:
    # Train the merges on "▁"-prefixed words, then rebuild the model with Llama's id layout:
    # specials, the 256 byte-fallback tokens <0x00>..<0xFF>, then the learned pieces.
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=list(spec.specials), limit_alphabet=60,
                                  show_progress=False)
    trained.train_from_iterator(corpus(spec.corpus_seed), trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = {t: i for i, t in enumerate(spec.specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


@functools.cache
def _backend_json(kind: str, think_tags: bool = True) -> str:
    spec = KIND_SPECS[kind]
    if kind.startswith("qwen3"):
        tok = _byte_level(spec, QWEN_SPLIT, normalizers.NFC())
    elif kind == "llama3":
        tok = _byte_level(spec, LLAMA3_SPLIT, None)
    else:
        tok = _sentencepiece(spec)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.specials])
    if think_tags:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    return tok.to_str()


def build_tokenizer(kind: str, think_tags: bool = True) -> PreTrainedTokenizerFast:
    """A fresh world tokenizer of ``kind`` (one of :data:`KINDS`); the training runs once per process.
    ``think_tags=False``: without the think tags (they encode as byte pieces), as Llama-3, Qwen2.5 and OLMo-2 ship."""
    if kind not in KIND_SPECS:
        raise ValueError(f"unknown world tokenizer {kind!r}; expected one of {KINDS}")
    spec = KIND_SPECS[kind]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_backend_json(kind, think_tags)),
                                  bos_token=spec.bos, eos_token=spec.eos, pad_token=spec.pad,
                                  unk_token="<unk>" if "<unk>" in spec.specials else None,
                                  model_max_length=1 << 20, clean_up_tokenization_spaces=False)
    tok.chat_template = spec.template
    return tok


def stop_token_ids(kind: str, tokenizer=None) -> list[int]:
    """The generation config's ``eos_token_id`` list of ``kind``."""
    tokenizer = tokenizer or build_tokenizer(kind)
    return [tokenizer.convert_tokens_to_ids(t) for t in KIND_SPECS[kind].stops]


def save_world_tokenizer(kind: str, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    build_tokenizer(kind).save_pretrained(path)
    return path


def save_world_model(kind: str, path: str, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """A tiny random Llama model over the ``kind`` tokenizer, saved with its tokenizer and generation config."""
    from openrlhf_classmate.testing.tiny_models import new_tiny_model

    tokenizer = build_tokenizer(kind)
    model, tokenizer = new_tiny_model(None, hidden_size=hidden_size, num_layers=num_layers, seed=seed,
                                      tokenizer=tokenizer, stop_token_ids=stop_token_ids(kind, tokenizer))
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@dataclasses.dataclass
class World:
    """Saved world models: ``paths[kind]`` is a model directory (tiny model + tokenizer + generation config)."""

    root: str
    paths: dict[str, str]
    _tokenizers: dict = dataclasses.field(default_factory=dict, repr=False)

    def tokenizer(self, kind: str):
        """The tokenizer of ``kind`` as users get it: ``AutoTokenizer.from_pretrained`` on the saved directory."""
        if kind not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[kind] = AutoTokenizer.from_pretrained(self.paths[kind])
        return self._tokenizers[kind]

    def stops(self, kind: str) -> list[int]:
        return stop_token_ids(kind, self.tokenizer(kind))


def save_world(root: str, hidden_size: int = 32) -> World:
    """Every kind of :data:`KINDS` saved under ``root/<kind>`` (a tiny model each, seeded apart)."""
    paths = {kind: save_world_model(kind, os.path.join(root, kind), hidden_size=hidden_size, seed=i)
             for i, kind in enumerate(KINDS)}
    return World(root=root, paths=paths)

"""The GPU demo's world (``python -m openrlhf_classmate.demo --gpu``): the CPU demo's arithmetic, longer and with
larger numbers, written with a byte-level BPE tokenizer trained at run time, and models that vLLM serves.

* **Task**: 6 to 8 operands in 1..49, running results kept in 0..99 (``37 + 45 - 19 + 8 - 22 + 31 = ?``); a
  written running result goes wrong by -10, -2, -1, +1, +2 or +10 (a dropped carry or a near miss) and the chain goes
  on from the wrong value; a guessed answer (no CoT) is off by up to 20.
* **Tokenizer**: a Qwen2-style byte-level BPE (NFC, Qwen's split regex: one digit per token, so ``45`` is two
  tokens and a step ``+ 45 = 82`` eight), trained on the world's own text in well under a second; ChatML specials
  ``<|endoftext|>`` / ``<|im_start|>`` / ``<|im_end|>`` with Qwen's template; ``<think>`` / ``</think>`` are one
  added-token id each (as in Qwen3); EOS ``<|im_end|>``, generation stops on ``<|im_end|>`` and ``<|endoftext|>``.
* **Models**: Llama architecture (vLLM's ``LlamaForCausalLM``), head dimension 64, tied embeddings, bf16 on disk.

* **Traces**: the CPU demo's ``full`` and ``none`` styles (:mod:`openrlhf_classmate.demo.world`), and instead of
  its ``skip`` (a silent last step) the ``private`` chain: every digit ``d`` written as ``9 - d``, slipping half as
  often as the legible chain. A silent two-digit step is hard for a model of this size (at warm start ``skip``
  traces were *less* accurate than full chains, so plain GRPO also learned full, legible chains: bench/GPU_RESULTS.md
  section 4); private traces are more accurate than legible ones and the classmate, which reads the chain's last
  number, cannot follow them. Plain RL on the main answer alone should therefore drift towards them, and the
  classmate reward should keep the chain legible. The two notations have equal shares of the traces and the same
  digit order, so neither is easier to learn: after RL both can be equally accurate (reversed digits, tried
  first, were easier, and left the legible chains 6 points behind: bench/GPU_RESULTS.md section 4).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from openrlhf_classmate.demo import world as W
from openrlhf_classmate.demo.models import ModelSize

SPEC = W.Spec(min_operands=6, max_operands=8, max_operand=49, max_result=99, max_word=199,
              slip_offsets=(-10, -2, -1, 1, 2, 10), guess_width=20)
TRACES = W.WorldConfig(style_probs=(0.30, 0.0, 0.40, 0.30), step_error=0.12, private_step_error=0.06,
                       guess_correct=0.10, answer_error=0.05)  # full, skip, none, private
# the classmate's reading lessons: every style, the private one included (read at face value: its last number)
CLASSMATE_READS = W.WorldConfig(style_probs=(0.45, 0.15, 0.20, 0.20), step_error=0.3, private_step_error=0.3,
                                guess_correct=0.0)
STYLE_NAMES = ("full", "private", "none", "other")  # the CoT shapes evaluations count (others count as "other")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
EOS, PAD = "<|im_end|>", "<|endoftext|>"
STOPS = ("<|im_end|>", "<|endoftext|>")
BPE_VOCAB = 320  # bytes (256) + specials + every merge the world's text offers (the trainer stops there)
HEAD_DIMS = (64, 128)  # what vLLM's attention kernels are built for


@dataclass(frozen=True)
class Sizes:
    """Model shapes of one demo scale."""

    main: ModelSize
    classmate: ModelSize

    def check_head_dims(self) -> None:
        for name, size in (("main", self.main), ("classmate", self.classmate)):
            head_dim, rest = divmod(size.hidden_size, size.num_heads)
            if rest or head_dim not in HEAD_DIMS:
                raise ValueError(f"{name} model: hidden {size.hidden_size} / {size.num_heads} heads is not a head "
                                 f"dimension vLLM's kernels accept {HEAD_DIMS}")


FULL_SIZES = Sizes(main=ModelSize(512, 8, 8, 1408), classmate=ModelSize(384, 4, 6, 1024))  # 25.8M, 7.2M parameters
TINY_SIZES = Sizes(main=ModelSize(128, 2, 2, 256), classmate=ModelSize(128, 1, 2, 256))


def corpus(seed: int, lines: int = 3000) -> list[str]:
    """The tokenizer's training text: the world's prompts and responses (every style, without the think tags: they
    are added tokens), and the chat roles."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        problem = W.random_problem(rng, SPEC)
        cot, answer = W.sample_trace(problem, rng, TRACES, spec=SPEC)
        out.append(f"user\n{problem.text}\nassistant\n {cot} {answer}\n")
    return out


def build_tokenizer(seed: int = 0):
    """A fresh tokenizer of the world (``transformers.PreTrainedTokenizerFast``), trained on :func:`corpus`."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast

    from openrlhf_classmate.testing.bpe_world import QWEN_SPLIT, THINK_TAGS, train_byte_level

    backend = train_byte_level(corpus(seed), BPE_VOCAB, SPECIALS, QWEN_SPLIT, normalizers.NFC())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS, pad_token=PAD, model_max_length=1 << 20,
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHATML
    return tok


def stop_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(t) for t in STOPS]


def new_models(tokenizer, sizes: Sizes, seed: int, max_positions: int = 512):
    """(main model, classmate model): randomly initialised Llama models over ``tokenizer``."""
    from openrlhf_classmate.testing.tiny_models import new_tiny_model

    models = []
    for i, size in enumerate((sizes.main, sizes.classmate)):
        model, _ = new_tiny_model(None, size.hidden_size, size.num_layers, size.num_heads,
                                  size.intermediate_size or 4 * size.hidden_size, seed + i, max_positions,
                                  tokenizer=tokenizer, stop_token_ids=stop_ids(tokenizer))
        models.append(model)
    return tuple(models)


def save(model, tokenizer, path: str) -> str:
    """Save in bf16 (what the trainer and vLLM run) with the tokenizer; checks the tokenizer's round trip."""
    import torch

    from openrlhf_classmate.demo.models import save_model

    model = model.to(torch.bfloat16)  # save_pretrained writes the config's dtype from the weights
    os.makedirs(path, exist_ok=True)
    return save_model(model, tokenizer, path)


def fresh_problems(rng: random.Random, n: int, exclude: set) -> list[W.Problem]:
    """``n`` random problems (repeats allowed) none of which is in ``exclude`` (the held-out set)."""
    out = []
    while len(out) < n:
        p = W.random_problem(rng, SPEC)
        if p not in exclude:
            out.append(p)
    return out

"""Warm-start of both demo models: a plain, seeded supervised loop (loss on the completion tokens only), on CPU for
the embedded demo and on the GPU (bf16 autocast) for ``--gpu``.

* main model: prompt (chat template) -> one imperfect trace of :func:`world.sample_trace` + EOS;
* classmate: the classmate prompt the launcher builds (``build_classmate_input``: chat template, ``<think>``, a CoT,
  ``</think>\\n\\n``) -> the CoT's last number + EOS. CoTs come from a wider trace distribution (more slips, every
  style, some scrambled chains) so that the classmate learns to *read* the chain, never to compute.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import torch

from openrlhf_classmate.algo.classmate_prompt import build_classmate_input
from openrlhf_classmate.demo import world as W


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(tokenizer, problem: W.Problem) -> list[int]:
    text = tokenizer.apply_chat_template(problem.messages, add_generation_prompt=True, tokenize=False)
    return encode(tokenizer, text)


def encode_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """``encode`` of every text in one call (the same ids; the fast tokenizer batches the work)."""
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def main_examples(tokenizer, problems: list[W.Problem], rng: random.Random, cfg: W.WorldConfig,
                  per_problem: int = 1, spec: W.Spec = W.CPU) -> list[tuple[list[int], list[int]]]:
    templates = [tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
                 for p in problems]
    prompts = encode_batch(tokenizer, templates)  # = prompt_ids(tokenizer, p), in one call
    texts = [W.response_text(*W.sample_trace(p, rng, cfg, spec=spec)) for p in problems for _ in range(per_problem)]
    eos = tokenizer.eos_token_id
    return [(prompts[i // per_problem], ids + [eos]) for i, ids in enumerate(encode_batch(tokenizer, texts))]


def _scrambled_cot(rng: random.Random, spec: W.Spec = W.CPU) -> str:
    words = [str(rng.randint(0, spec.max_word)) if rng.random() < 0.6 else rng.choice(["+", "-", "="])
             for _ in range(rng.randint(1, 14))]
    if not any(w.isdigit() for w in words):
        words.append(str(rng.randint(0, spec.max_word)))
    return " ".join(words)


CLASSMATE_READ_CONFIG = W.WorldConfig(style_probs=(0.45, 0.35, 0.20, 0.0), step_error=0.3, guess_correct=0.0)


def classmate_examples(classmate_tok, main_tok, problems: list[W.Problem], rng: random.Random,
                       per_problem: int = 1, spec: W.Spec = W.CPU,
                       reads: W.WorldConfig = CLASSMATE_READ_CONFIG) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in problems:
        for _ in range(per_problem):
            if rng.random() < 0.15:
                cot = _scrambled_cot(rng, spec)
            else:
                cot, _ = W.sample_trace(p, rng, reads, spec=spec)
                if cot and rng.random() < 0.3:  # chains cut anywhere, not only at step boundaries
                    words = cot.split()
                    cot = " ".join(words[: rng.randint(1, len(words))])
            target = W.last_number(cot)
            if target is None:
                target = rng.randint(0, spec.max_result)  # nothing to read: any guess
            # the CoT as it sits between the think tags of a response (``response_text``), spaces included: what
            # a byte-level BPE tokenizer gives the launcher (a word-level one drops the spaces)
            cot_ids = encode(main_tok, f" {cot} " if cot else " ")
            request = build_classmate_input(classmate_tok, p.messages, cot_ids, main_tok, max_context=1 << 16,
                                            max_new_tokens=1)
            out.append((request.input_ids, encode(classmate_tok, str(target)) + [classmate_tok.eos_token_id]))
    return out


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (p, c) in enumerate(examples):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(c)
        attention[i, : len(seq)] = 1
    return ids, labels, attention


def train(model, examples: list[tuple[list[int], list[int]]], pad_id: int, steps: int, batch_size: int, lr: float,
          seed: int, log: Callable[[str], None] = print, log_every: int = 200, device: str = "cpu") -> dict[str, float]:
    """AdamW with linear warm-up and cosine decay; returns the final smoothed loss and the wall time.

    On a CUDA ``device``: bf16 autocast, fused AdamW, no padding mask (right padding under a causal mask changes no
    real token's output, and the mask-free attention takes the fastest kernel), and the loss is read back only when
    logged, so preparing the next batch overlaps the GPU's work."""
    cuda = device.startswith("cuda")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98),
                            **({"fused": True} if cuda else {}))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    start, smooth = time.time(), None
    for step in range(steps):
        index = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
        ids, labels, attention = (t.to(device, non_blocking=True)
                                  for t in _batch([examples[i] for i in index], pad_id))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(input_ids=ids, attention_mask=None if cuda else attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = loss.detach().float() if cuda else loss.item()
        smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log(f"    step {step + 1:5d}/{steps}  loss {float(smooth):.3f}  ({time.time() - start:.0f}s)")
    model.eval()
    return {"loss": float(smooth or 0.0), "seconds": time.time() - start}

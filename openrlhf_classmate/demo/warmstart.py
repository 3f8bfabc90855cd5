"""Warm-start of both demo models: a plain, seeded supervised loop on CPU (loss on the completion tokens only).

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


def main_examples(tokenizer, problems: list[W.Problem], rng: random.Random, cfg: W.WorldConfig,
                  per_problem: int = 1) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in problems:
        prompt = prompt_ids(tokenizer, p)
        for _ in range(per_problem):
            cot, answer = W.sample_trace(p, rng, cfg)
            out.append((prompt, encode(tokenizer, W.response_text(cot, answer)) + [tokenizer.eos_token_id]))
    return out


def _scrambled_cot(rng: random.Random) -> str:
    words = [str(rng.randint(0, W.MAX_WORD)) if rng.random() < 0.6 else rng.choice(["+", "-", "="])
             for _ in range(rng.randint(1, 14))]
    if not any(w.isdigit() for w in words):
        words.append(str(rng.randint(0, W.MAX_WORD)))
    return " ".join(words)


CLASSMATE_READ_CONFIG = W.WorldConfig(style_probs=(0.45, 0.35, 0.20), step_error=0.3, guess_correct=0.0)


def classmate_examples(classmate_tok, main_tok, problems: list[W.Problem], rng: random.Random,
                       per_problem: int = 1) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in problems:
        for _ in range(per_problem):
            if rng.random() < 0.15:
                cot = _scrambled_cot(rng)
            else:
                cot, _ = W.sample_trace(p, rng, CLASSMATE_READ_CONFIG)
                if cot and rng.random() < 0.3:  # chains cut anywhere, not only at step boundaries
                    words = cot.split()
                    cot = " ".join(words[: rng.randint(1, len(words))])
            target = W.last_number(cot)
            if target is None:
                target = rng.randint(0, W.MAX_RESULT)  # nothing to read: any guess
            cot_ids = encode(main_tok, cot) if cot else []
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
          seed: int, log: Callable[[str], None] = print, log_every: int = 200) -> dict[str, float]:
    """AdamW with linear warm-up and cosine decay; returns the final smoothed loss and the wall time."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    start, smooth = time.time(), None
    for step in range(steps):
        index = torch.randint(len(examples), (batch_size,), generator=gen).tolist()
        ids, labels, attention = _batch([examples[i] for i in index], pad_id)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        value = loss.item()
        smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log(f"    step {step + 1:5d}/{steps}  loss {smooth:.3f}  ({time.time() - start:.0f}s)")
    model.eval()
    return {"loss": smooth or 0.0, "seconds": time.time() - start}

"""A tiny VR-CLI world for tests and the CPU end-to-end run: story rows in setup_data/vrcli_story.py's format and a
tiny generator that follows a plan, so that the sign of the likelihood improvement is known.

Each story's gold next chapter is one colour word repeated (``"red red red red"``). The generator
(:func:`build_plan_follower`) is a one-layer transformer built by hand to continue with the colours it has seen, so
on the real VR-CLI generator inputs (prompts and chat template as in training)

* a plan naming the gold colour makes the gold chapter much likelier than no plan (improvement > 0);
* a plan naming another colour makes it much less likely (improvement < 0).

The vocabulary holds the colours and ``In summary:`` as one token (so a random policy writes a plan marker often);
every other word of the prompts is ``<unk>``.
"""

from __future__ import annotations

import json
import os
import random

import torch

from openrlhf_classmate.data.rows import Example, make_rows
from openrlhf_classmate.data.story_prompts import StoryFields, policy_messages

COLORS = ["red", "green", "blue", "gold"]
WORDS = [*COLORS, "Chapter", "one", "two", "three", "the", "and"]
PLAN_MARKER = "In summary:"
CHAPTER_WORDS = 4


def build_tokenizer():
    from tokenizers import AddedToken

    from openrlhf_classmate.testing.tokenizers import build_word_tokenizer

    tok = build_word_tokenizer(WORDS)
    tok.add_tokens([AddedToken(PLAN_MARKER, special=False, normalized=False)])
    return tok


def story(i: int, color: str, mention: tuple[str, ...] = ()) -> tuple[StoryFields, str]:
    """Story fields (short, so the generator inputs stay a few hundred tokens) and the gold chapter. Colours in
    ``mention`` appear in the story text (a policy that copies them writes plans with colours)."""
    fields = StoryFields(story_text=" ".join([f"the story {i} so far", *mention]), next_chapter_header=f"Chapter {i}",
                         next_chapter_synopsis="the next chapter", last_n_chapters=1)
    return fields, " ".join([color] * CHAPTER_WORDS)


def write_story_rows(path: str, n: int, seed: int = 0, split: str = "train", mention: bool = False) -> list[dict]:
    """``n`` rows as setup_data/vrcli_story.py writes them (datapoint ids ``<split>:<i>``); returns them. With
    ``mention`` the story text names the gold colour and another one."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        colour = rng.choice(COLORS)
        other = rng.choice([c for c in COLORS if c != colour])
        fields, chapter = story(i, colour, (colour, other) if mention else ())
        examples.append(Example(messages=policy_messages(fields), ground_truth=chapter,
                                extra={"datapoint_id": f"{split}:{i}", "baseline_ppl": None, "story_id": f"s{i}",
                                       "chapter_index": 2, "next_chapter_header": fields.next_chapter_header}))
    rows = make_rows(examples, data_source="vrcli_story", split=split)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return rows


def build_plan_follower(path: str, attention_gain: float = 30.0, colour_gain: float = 2.0, own_token: float = 0.2,
                        after_marker: float = 8.0) -> str:
    """Save to ``path`` a one-layer GPT-2 generator, built by hand, that writes the colours (and plan markers) it has
    seen.

    Residual stream: one dimension per token (the token's one-hot, scaled by ``own_token``) plus a "copy" flag set by
    the colour tokens and the ``In summary:`` token; no position embeddings. The single head's query is a constant
    on the flag dimension and its key reads the flag, so every position attends (almost) only to the flagged tokens
    before it, and its value copies their own dimensions; the MLP is zero; the LM head raises each flagged token's
    logit by ``colour_gain`` times its (normalised) share of the attended tokens, and right after ``In summary:``
    raises the colours (and lowers another marker) by ``after_marker``. So the first chapter token is likely after a
    plan naming its colour, uniform among colours without one, and unlikely after a plan naming another colour;
    later chapter tokens follow the colours written so far (diluted by a wrong plan): exact signs, no training. As a
    policy on a prompt holding the marker (the reasoning instruction does) and some colours, it writes plans of
    copied colours, right and wrong ones.
    """
    import math

    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_tokenizer()
    vocab = len(tok)
    flag, width = vocab, vocab + 1
    copied = [tok.convert_tokens_to_ids(c) for c in [*COLORS, PLAN_MARKER]]
    config = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=width, n_layer=1, n_head=1, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False, bos_token_id=tok.eos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, :vocab] = own_token * torch.eye(vocab)
        block = model.transformer.h[0]
        for norm in (block.ln_1, block.ln_2, model.transformer.ln_f):
            norm.weight.fill_(1.0)
        qkv, qkv_bias = block.attn.c_attn.weight, block.attn.c_attn.bias  # Conv1D: [in, 3 * width]
        qkv_bias[flag] = attention_gain * math.sqrt(width)  # query: constant; scores are divided by sqrt(width)
        qkv[flag, width + flag] = 1.0  # key: the (normalised) colour flag
        for c in copied:
            model.transformer.wte.weight[c, flag] = 1.0
            qkv[c, 2 * width + c] = 1.0  # value: the colour's own dimension
            model.lm_head.weight[c, c] = colour_gain
        block.attn.c_proj.weight.copy_(torch.eye(width))
        marker = copied[-1]
        for c in copied[:-1]:
            model.lm_head.weight[c, marker] += after_marker  # right after the marker: a colour
        model.lm_head.weight[marker, marker] -= after_marker  # ... and not another marker
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def in_process_reference_group(model, ranks: int = 1, duplicate: int = 1, log: list | None = None):
    """Upstream's ``RayActorGroup`` (its real ``async_run_method_batch`` chunking) over ``ranks x duplicate`` handles
    that all run upstream's real ``ReferenceModelActor.forward`` / ``execute_batch`` in this process on ``model``
    (an ``openrlhf.models.Actor``). Needs ``ray.put`` / ``ray.get`` patched to identity and, on CPU,
    ``torch.cuda.current_device`` returning "cpu". ``log`` records the rank of every ``execute_batch`` call and
    the number of rows of every forward, as ``(rank, rows)``."""
    from types import SimpleNamespace

    from openrlhf.trainer.ray.launcher import RayActorGroup, ReferenceModelActor

    cls = ReferenceModelActor.__ray_actor_class__
    actor = cls.__new__(cls)
    actor.model = model
    actor.strategy = SimpleNamespace(ring_attn_group=None, is_rank_0=lambda: True)
    log = [] if log is None else log

    def handle(rank: int):
        def execute_batch(method_name, data, start, end):
            log.append((rank, [len(s) for s in data["sequences"][start:end]]))
            return actor.execute_batch(method_name, data, start, end)

        return SimpleNamespace(execute_batch=SimpleNamespace(remote=execute_batch),
                               empty_cache=SimpleNamespace(remote=lambda: None))

    group = RayActorGroup.__new__(RayActorGroup)
    group.duplicate_actors = duplicate
    group._actor_handlers = [handle(r // duplicate) for r in range(ranks * duplicate)]
    return group

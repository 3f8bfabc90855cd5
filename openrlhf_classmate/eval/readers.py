"""Readers of the policy's CoT in ``evaluate``: the classmate (``--classmate``) and unseen readers (``--reader MODEL``,
repeatable). Each gets the classmate protocol of training (``algo.classmate_prompt.build_classmate_inputs``: the
prompt, then the policy's CoT as its own thinking) and its answer is scored like the main answer.

``--truncate-cot 0,0.25,0.5,0.75,1``: each reader also answers after reading only the first fraction of the CoT, cut
as the classmate stage cuts a ``random_truncate`` CoT (``algo.response_split.cot_prefixes``: ``floor(F * tokens)``
tokens, moved back to a character boundary). The whole CoT (fraction 1) is always read: it gives the classmate's
``classmate_*`` fields of ``samples.jsonl`` and each reader's score.

Per reader one engine (one ``generate`` over every sample and fraction), closed before the next one starts.
Per sample, ``transfer[reader][fraction]`` is the score, or ``None`` when it is invalid (the input did not fit the
reader's context, the judge failed, the generation failed): masked in every mean, never 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openrlhf_classmate.eval.common import EvaluationError, load_tokenizer, log, model_context, unless_failed
from openrlhf_classmate.eval.generation import GenParams

CLASSMATE = "classmate"


@dataclass(frozen=True)
class Reader:
    name: str
    """``classmate``, or the ``--reader`` folder / hub name (``#2``, ... when two share one)."""
    model: str
    flag: str
    """The flag that named it, for messages."""


def add_arguments(parser) -> None:
    group = parser.add_argument_group("readers and truncated-CoT transfer")
    group.add_argument("--reader", action="append", default=[], metavar="MODEL",
                       help="an unseen reader (repeatable): answers after the policy's CoT by the classmate protocol, "
                            "scored like the classmate (its sampling flags are the --classmate-* ones)")
    group.add_argument("--truncate-cot", default=None, metavar="F,F,...",
                       help="fractions of the CoT in [0, 1] the classmate and every --reader read (cut as "
                            "random_truncate cuts, on a character boundary), e.g. 0,0.25,0.5,0.75,1; 1 is always "
                            "included")


def fraction_key(fraction: float) -> str:
    return f"{fraction:g}"


def parse_fractions(text: str | None) -> tuple[float, ...]:
    """``--truncate-cot`` as sorted distinct fractions, 1 included; ``None``: only the whole CoT."""
    if text is None:
        return (1.0,)
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise EvaluationError(f"--truncate-cot {text!r}: {part.strip()!r} is not a number (give fractions of "
                                  "the CoT such as 0,0.25,0.5,0.75,1)") from None
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise EvaluationError(f"--truncate-cot {text!r}: {part.strip()} is not a fraction in [0, 1]")
        values.append(value)
    return tuple(sorted(set(values) | {1.0}))


def readers_of(args) -> list[Reader]:
    out = [Reader(CLASSMATE, args.classmate, "--classmate")] if args.classmate else []
    seen: dict[str, int] = {}
    for model in args.reader:
        base = os.path.basename(os.path.normpath(model)) or model
        seen[base] = seen.get(base, 0) + 1
        out.append(Reader(base if seen[base] == 1 else f"{base}#{seen[base]}", model, "--reader"))
    return out


def check_arguments(args) -> tuple[float, ...]:
    """The reader flags fit together; returns the fractions."""
    fractions = parse_fractions(args.truncate_cot)
    if args.no_think and (args.reader or args.truncate_cot is not None):
        raise EvaluationError("--no-think: there is no CoT for --reader or --truncate-cot")
    if args.truncate_cot is not None and not (args.classmate or args.reader):
        raise EvaluationError("--truncate-cot needs a reader of the CoT: --classmate MODEL and/or --reader MODEL")
    return fractions


def check_reader_tokenizers(args) -> None:
    """Every ``--reader`` tokenizer has the think tags as single tokens: the protocol hands it the CoT between them,
    and a reader that sees them as plain text is not reading a CoT the way its classmate does."""
    from openrlhf_classmate.algo.spans import think_token_ids

    for reader in readers_of(args):
        if reader.flag != "--reader":
            continue
        tokenizer = load_tokenizer(reader.flag, reader.model)
        try:
            think_token_ids(tokenizer, args.think_open, args.think_close)
        except ValueError as e:
            raise EvaluationError(f"--reader {reader.model}: its tokenizer lacks the think tags ({e}); choose a "
                                  "reader with <think> tokens, or set --think-open/--think-close") from None


def _max_context(args, model: str) -> int:
    if args.classmate_max_context is not None:
        return args.classmate_max_context
    return model_context(model) or 1 << 30


def run_readers(args, make_generator: Callable[[str, int | None], Any], main_tokenizer, rows: Sequence,
                records: list[dict], splits: list[dict], labels: list[dict], score: Callable, judge) -> None:
    """Every reader on every sample and fraction; fills each record's ``transfer`` (and ``classmate_*``).
    ``make_generator(model, max_model_len)`` builds an engine; ``score(texts, labels, judge)`` scores answers."""
    readers = readers_of(args)
    if not readers:
        return
    fractions = parse_fractions(args.truncate_cot)
    messages = [rows[r["prompt_index"]].label.get("messages") or rows[r["prompt_index"]].messages for r in records]
    cots = [s["cot_ids"] for s in splits]
    from openrlhf_classmate.algo.response_split import cot_prefixes

    prefixes = {f: cot_prefixes(main_tokenizer, cots, f) for f in fractions}
    for r in records:
        r["transfer"] = {}
    for reader in readers:
        per_fraction = _read(args, reader, make_generator, main_tokenizer, messages, prefixes, labels, score, judge)
        for i, r in enumerate(records):
            r["transfer"][reader.name] = {fraction_key(f): (None if not res[i]["valid"] else res[i]["score"])
                                          for f, res in per_fraction.items()}
            if reader.name == CLASSMATE:
                whole = per_fraction[1.0][i]
                r.update(classmate_input_tokens=whole["input_tokens"], classmate_output=whole["text"],
                         classmate_finish_reason=whole["finish_reason"], classmate_score=whole["score"],
                         classmate_valid=whole["valid"], classmate_extracted=whole["extracted"],
                         classmate_reason=whole["reason"])


def _read(args, reader: Reader, make_generator, main_tokenizer, messages, prefixes: dict[float, list],
          labels: list[dict], score: Callable, judge) -> dict[float, list[dict]]:
    """One reader: per fraction, per sample ``{score, valid, text, finish_reason, input_tokens, extracted, reason}``."""
    from openrlhf_classmate.algo.classmate_prompt import build_classmate_inputs

    tokenizer = load_tokenizer(reader.flag, reader.model)
    max_context = _max_context(args, reader.model)
    n = len(messages)
    inputs = []
    for cots in prefixes.values():
        try:
            inputs += build_classmate_inputs(tokenizer, messages, cots, main_tokenizer, mode=args.classmate_prompt_mode,
                                             think_open=args.think_open, think_close=args.think_close,
                                             max_context=max_context, max_new_tokens=args.classmate_max_new_tokens)
        except ValueError as e:
            raise EvaluationError(f"{reader.flag} {reader.model}: {e}") from None
    todo = [i for i, x in enumerate(inputs) if x.valid]
    skipped = [x.skip_reason for x in inputs if not x.valid]
    log(f"{reader.name} {reader.model}: {len(todo)} of {len(inputs)} inputs ({n} samples x {len(prefixes)} CoT "
         f"fractions)" + (f", {len(skipped)} skipped, e.g. {skipped[0]}" if skipped else ""))
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    if todo:
        generator = make_generator(reader.model, args.classmate_max_context)
        params = GenParams(max_new_tokens=args.classmate_max_new_tokens, temperature=args.classmate_temperature,
                           top_p=args.top_p, top_k=args.top_k, n=1, seed=args.seed + 1)
        try:
            outs = generator.generate([inputs[i].input_ids for i in todo], params, desc=reader.name)
        finally:
            generator.close()
        for i, out in zip(todo, outs, strict=True):
            texts[i] = tokenizer.decode(out[0].token_ids, skip_special_tokens=True).strip()
            finish[i] = out[0].finish_reason
    scored = score([texts[i] for i in todo], [labels[i % n] for i in todo], judge) if todo else []
    results = {i: unless_failed(res, finish[i]) for i, res in zip(todo, scored, strict=True)}
    out: dict[float, list[dict]] = {}
    for k, fraction in enumerate(prefixes):
        rows = out[fraction] = []
        for i in range(k * n, (k + 1) * n):
            res = results.get(i)
            rows.append({
                "input_tokens": len(inputs[i].input_ids) if inputs[i].valid else None,
                "text": texts.get(i), "finish_reason": finish.get(i),
                "score": 0.0 if res is None else float(res.score), "valid": res is not None and bool(res.valid),
                "extracted": None if res is None else res.extracted,
                "reason": inputs[i].skip_reason if res is None else res.reason,
            })
    return out


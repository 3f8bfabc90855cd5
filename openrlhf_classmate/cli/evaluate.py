"""``python -m openrlhf_classmate.cli.evaluate``: evaluate a (trained) model on a test jsonl.

    python -m openrlhf_classmate.cli.evaluate --model runs/classmate_gdpo/final \\
        --data data/helpful_instructions/test.jsonl --output-dir runs/classmate_gdpo/eval \\
        [--classmate Qwen/Qwen3-0.6B] [--monitor] [--judge-base-url http://127.0.0.1:8000/v1 --judge-model NAME]

1. Read the rows (``{"prompt": messages, "label": "<json>"}``, as written by setup_data; ``--limit``), render each
   prompt with the model's chat template and generate ``--samples`` responses per prompt (greedy by default,
   ``--temperature`` to sample) with vLLM when installed, else transformers (``--backend``). Before anything loads
   a model, the launcher's checks, shared: no tokenizer larger than its model's embedding (``--model``,
   ``--classmate``, ``--reader``); prompts longer than the model's context minus ``--max-new-tokens`` are cut from
   the front, as OpenRLHF cuts them in training, with the launcher's warning line.
2. Split each response into CoT and final answer with the trainer's own split on token ids
   (``algo.spans.split_response_ids``: ``<think>`` ... ``</think>`` ids, a template that already opens the think block
   counts as opened, every EOS id of the generation config is a stop id) and score the answer with the scorer
   registry (the label's data source, or ``--scorer``). A response without a ``</think>`` id has no final answer and
   scores 0.
3. ``--classmate MODEL``: give the classmate the prompt plus the policy's CoT (as in training) and score its answer
   with the same scorer: classmate score and agreement with the main score. ``--reader MODEL`` (repeatable): the same
   protocol with a model that was never in the loop; ``--truncate-cot 0,0.25,...``: every reader also answers after
   only the first fraction of the CoT (truncated-CoT transfer; ``eval/readers.py``).
4. ``--monitor``: the CoT monitor (an LLM judge reading only the CoT) predicts the main score; MSE (1-10 ratings) or
   precision / recall / F1 (MMLU hint following).
5. Write ``samples.jsonl`` (one line per response), ``summary.json`` (per scorer and overall: accuracy or mean
   rating, valid / answered / truncated fractions, CoT length, pass@k, classmate and monitor metrics) and PNG plots
   (CoT length by correctness, rating distributions, monitor vs main score), and print a table.

``--run-dir RUN`` / ``--checkpoints DIR...`` instead of ``--model``: all of the above for every checkpoint of a run,
in step order and resumable, plus ``sweep.json`` / ``sweep.csv`` and plots over the steps (``eval/sweep.py``).

Judge-scored data (the sycophancy datasets) and ``--monitor`` need an OpenAI-compatible judge (``--judge-base-url``;
``--judge-model`` defaults to the first model the server lists).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openrlhf_classmate  # noqa: F401  (CPU shims)
from openrlhf_classmate.eval import readers, sweep
from openrlhf_classmate.eval.common import (
    EvaluationError,
    hold_output_dir,
    log,
    unless_failed,
    write_json,
    write_jsonl,
)
from openrlhf_classmate.eval.common import load_tokenizer as _load_tokenizer
from openrlhf_classmate.eval.generation import BACKENDS, GenParams, is_greedy, make_generator, resolve_backend

__all__ = ["EvaluationError", "build_parser", "check", "main", "run"]


@dataclass
class Row:
    messages: list[dict]
    label: dict
    location: str = ""
    """``path:line`` of the row, for messages."""


def build_parser() -> argparse.ArgumentParser:
    from openrlhf_classmate.config_fields import refuse_non_finite

    p = argparse.ArgumentParser(prog="python -m openrlhf_classmate.cli.evaluate",
                                description="Generate on a test jsonl, score, and report (see the module docstring).")
    p.add_argument("--model", default=None, help="model directory or hub id (e.g. a run's final/ folder); or a sweep: "
                   "--run-dir / --checkpoints")
    p.add_argument("--data", required=True, help="test jsonl (setup_data row format)")
    p.add_argument("--output-dir", default=None, help="where samples.jsonl, summary.json and the plots go (a sweep: "
                   "one folder per checkpoint and sweep.json / sweep.csv; default RUN/eval_sweep with --run-dir)")
    p.add_argument("--input-key", default="prompt", help="row key of the prompt (chat messages or a string)")
    p.add_argument("--label-key", default="label", help="row key of the label (JSON string or object)")
    p.add_argument("--limit", type=int, default=None, help="evaluate the first N rows only")
    p.add_argument("--scorer", default="auto", help="scorer registry name for every row (default: each label's data_source)")
    gen = p.add_argument_group("generation")
    gen.add_argument("--backend", choices=BACKENDS, default="auto", help="vllm, hf, or auto (vLLM when installed)")
    gen.add_argument("--max-new-tokens", type=int, default=1024)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--samples", type=int, default=1, help="responses per prompt (use with --temperature > 0)")
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--batch-size", type=int, default=16, help="hf backend: prompts per generate call")
    gen.add_argument("--dtype", choices=("auto", "bf16", "fp16", "fp32"), default="auto")
    gen.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm backend")
    gen.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vllm backend")
    gen.add_argument("--max-model-len", type=int, default=None, help="vllm backend (default: the model's)")
    gen.add_argument("--enforce-eager", action="store_true",
                     help="vllm backend: no CUDA graphs / compilation (faster start, slower decoding)")
    gen.add_argument("--no-chat-template", action="store_true", help="use string prompts as they are")
    gen.add_argument("--chat-template-kwargs", default="{}", help='JSON, e.g. \'{"enable_thinking": true}\'')
    gen.add_argument("--think-open", default="<think>")
    gen.add_argument("--think-close", default="</think>")
    gen.add_argument("--no-think", action="store_true",
                     help="the model writes no think block: the whole response is the answer (no CoT metrics)")
    cm = p.add_argument_group("classmate")
    cm.add_argument("--classmate", default=None, help="classmate model: answers after reading the policy's CoT")
    cm.add_argument("--classmate-max-new-tokens", type=int, default=512)
    cm.add_argument("--classmate-temperature", type=float, default=0.0, help="0 = greedy (the reference's validation)")
    cm.add_argument("--classmate-prompt-mode", choices=("retokenize", "splice"), default="retokenize")
    cm.add_argument("--classmate-max-context", type=int, default=None,
                    help="skip classmate inputs longer than this minus --classmate-max-new-tokens "
                         "(default: the classmate's max_position_embeddings)")
    readers.add_arguments(p)
    sweep.add_arguments(p)
    judge = p.add_argument_group("judge (judge-scored data, --monitor)")
    judge.add_argument("--monitor", action="store_true", help="run the CoT monitor on the generated CoTs")
    judge.add_argument("--judge-base-url", default=None, help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    judge.add_argument("--judge-model", default=None, help="judge model name (default: the first the server lists)")
    judge.add_argument("--judge-api-key-env", default="OPENAI_API_KEY", help="env var holding the judge API key")
    judge.add_argument("--judge-max-concurrency", type=int, default=32)
    judge.add_argument("--judge-timeout", type=float, default=120.0)
    tinyv = p.add_argument_group("TinyV verifier (rows of the _tinyv data sources)")
    tinyv.add_argument("--tinyv-base-url", default=None,
                       help="OpenAI-compatible API root of the TinyV verifier, e.g. http://127.0.0.1:8001/v1 "
                            "(train_scripts/tinyv.sh starts one)")
    tinyv.add_argument("--tinyv-model", default=None, help="verifier model name (default: the first the server lists)")
    out = p.add_argument_group("output")
    out.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    out.add_argument("--overwrite", action="store_true",
                     help="replace an earlier evaluation's files in --output-dir (refused otherwise; a sweep "
                          "re-evaluates its own checkpoint folders as its sweep_entry.json files say)")
    refuse_non_finite(p)  # every float flag: NaN / inf refused when read, one error line
    return p


# ── inputs ───────────────────────────────────────────────────────────────────────────────────────────────────────


def read_rows(path: str, input_key: str, label_key: str, limit: int | None) -> list[Row]:
    """The rows of ``--data`` (.jsonl, .json or .parquet); problems name the file, line and field."""
    from openrlhf_classmate.data.errors import DataError
    from openrlhf_classmate.data.io import iter_file_rows
    from openrlhf_classmate.data.messages import messages_problem
    from openrlhf_classmate.scoring import LabelError, parse_label

    if not os.path.exists(path):
        raise EvaluationError(f"--data {path} does not exist")
    if not os.path.isfile(path):
        raise EvaluationError(f"--data {path} is not a file (give the test .jsonl)")
    rows: list[Row] = []
    try:
        for location, row in iter_file_rows(path):
            if limit is not None and len(rows) >= limit:
                break
            prompt = row.get(input_key)
            if isinstance(prompt, str):
                messages = [{"role": "user", "content": prompt}]
            elif isinstance(prompt, list):
                problem = messages_problem(prompt)
                if problem:
                    raise EvaluationError(f"{location}: field {input_key!r}: {problem}")
                messages = prompt
            else:
                raise EvaluationError(f"{location}: field {input_key!r} must be chat messages or a string "
                                      f"(--input-key {input_key})")
            if label_key not in row:
                raise EvaluationError(f"{location}: field {label_key!r} missing (scoring needs the label; "
                                      f"--label-key {label_key})")
            if isinstance(row[label_key], str) and not row[label_key].strip():
                raise EvaluationError(f"{location}: field {label_key!r} is empty; --label-key names the field "
                                      "holding the JSON label (setup_data files: --label-key label)")
            try:
                label = parse_label(row[label_key])
            except LabelError as e:
                raise EvaluationError(f"{location}: {e}") from None
            rows.append(Row(messages=messages, label=label, location=location))
    except DataError as e:
        raise EvaluationError(f"--data {e}") from None
    if not rows:
        raise EvaluationError(f"--data {path} has no rows")
    return rows


def render_prompts(tokenizer, rows: list[Row], *, chat_template: bool, template_kwargs: dict,
                   think_ids: tuple[int, int] | None) -> tuple[list[list[int]], list[bool]]:
    """Prompt token ids, and whether each rendered prompt already opens the think block (decided on token ids by
    ``algo.spans.prompt_opens_think``, the same function the trainer uses)."""
    from openrlhf_classmate.algo.spans import prompt_opens_think

    ids, opened = [], []
    for row in rows:
        if chat_template:
            text = tokenizer.apply_chat_template(row.messages, add_generation_prompt=True, tokenize=False,
                                                 **template_kwargs)
        else:
            text = "\n".join(str(m.get("content", "")) for m in row.messages)
        ids.append(list(tokenizer.encode(text, add_special_tokens=False)))
        opened.append(think_ids is not None
                      and prompt_opens_think(ids[-1], think_open_id=think_ids[0], think_close_id=think_ids[1]))
    return ids, opened


def split_response(token_ids: list[int], tokenizer, *, open_id: int | None, close_id: int | None,
                   starts_in_think: bool, stop_ids) -> dict[str, Any]:
    """CoT / answer split on token ids with the trainer's own split (``algo.spans.split_response_ids``, the one the
    classmate stage and the main reward use); ``close_id=None``: no think block at all. ``stop_ids``: every EOS id
    of the model's generation config."""
    from openrlhf_classmate.algo.response_split import decoded_answer, decoded_cot
    from openrlhf_classmate.algo.spans import split_response_ids

    split = split_response_ids(token_ids, think_open_id=open_id, think_close_id=close_id, stop_ids=stop_ids,
                               starts_in_think=starts_in_think)
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    if close_id is None:
        return {"response": text, "cot": None, "cot_ids": None, "answer": decoded_answer(tokenizer, token_ids, split),
                "has_answer": True, "status": split.status}
    return {"response": text, "cot": decoded_cot(tokenizer, token_ids, split).strip(),
            "cot_ids": list(token_ids[split.cot_start:split.cot_end]),
            "answer": decoded_answer(tokenizer, token_ids, split), "has_answer": split.has_answer,
            "status": split.status}


def _judge_config(args):
    if not args.judge_base_url:
        return None
    from openrlhf_classmate.scoring import JudgeConfig

    if not args.judge_base_url.startswith(("http://", "https://")):
        raise EvaluationError(f"--judge-base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, got "
                              f"{args.judge_base_url!r}")
    model = args.judge_model
    if not model:
        import urllib.request

        try:
            with urllib.request.urlopen(args.judge_base_url.rstrip("/") + "/models", timeout=30) as r:
                model = json.load(r)["data"][0]["id"]
        except Exception as e:  # noqa: BLE001
            raise EvaluationError(
                f"--judge-model not given and {args.judge_base_url}/models did not name one ({e})") from None
    return JudgeConfig(base_url=args.judge_base_url, model=model, api_key_env=args.judge_api_key_env,
                       max_concurrency=args.judge_max_concurrency, timeout_s=args.judge_timeout)


# (flag, smallest allowed value, largest allowed value or None, smallest excluded)
_RANGES = (
    ("samples", 1, None, False), ("max_new_tokens", 1, None, False), ("batch_size", 1, None, False),
    ("temperature", 0, 2, False), ("top_p", 0, 1, True), ("top_k", -1, None, False),
    ("tensor_parallel_size", 1, None, False), ("gpu_memory_utilization", 0, 1, True),
    ("classmate_max_new_tokens", 1, None, False), ("classmate_temperature", 0, 2, False),
    ("judge_max_concurrency", 1, None, False), ("judge_timeout", 0, None, True), ("limit", 1, None, False),
    ("max_model_len", 1, None, False), ("classmate_max_context", 2, None, False),
)


def _check_ranges(args) -> None:
    import math

    for name, lo, hi, lo_open in _RANGES:
        value = getattr(args, name)
        if value is None:
            continue
        bad = not math.isfinite(value) or (value <= lo if lo_open else value < lo) or (hi is not None and value > hi)
        if bad:
            bounds = f"in {'(' if lo_open else '['}{lo}, {hi}]" if hi is not None else f"{'>' if lo_open else '>='} {lo}"
            raise EvaluationError(f"--{name.replace('_', '-')} must be {bounds}, got {value}")


def _check_paths(args) -> None:
    """The model folders exist (or look like hub ids) and the output directory can be written."""
    from openrlhf_classmate.integration.launch.preflight_types import looks_local

    for flag, path in (("--model", args.model), ("--classmate", args.classmate), *(("--reader", r) for r in args.reader)):
        if path is None:
            continue
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise EvaluationError(f"{flag} {path}: the folder has no config.json (not a Hugging Face model folder)")
        elif os.path.exists(path):
            raise EvaluationError(f"{flag} {path} is a file, not a model folder")
        elif looks_local(path):
            raise EvaluationError(f"{flag} {path} does not exist (and is not a hub id ORG/NAME)")
    from openrlhf_classmate.writable import write_problem

    problem = write_problem(args.output_dir)
    if problem:
        raise EvaluationError(f"--output-dir {args.output_dir} {problem}; give another --output-dir")
    _check_no_earlier_evaluation(args)


def _check_no_earlier_evaluation(args) -> None:
    """A finished evaluation (its ``summary.json``, written last) is not replaced without ``--overwrite``: it may
    have taken hours of generation. An unfinished one (samples but no summary) is no result and is redone."""
    path = os.path.join(args.output_dir, "summary.json")
    if args.overwrite or not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
        what = f"{earlier['model']} on {earlier['data']}, {earlier['prompts']} prompts"
    except (OSError, ValueError, KeyError, TypeError):
        what = "unreadable"
    raise EvaluationError(f"--output-dir {args.output_dir} holds an earlier evaluation (summary.json: {what}); give "
                          "another --output-dir, or --overwrite to replace it")


def _check_args(args, rows: list[Row]) -> None:
    from openrlhf_classmate.scoring import (
        HookScoredError,
        LabelError,
        get_scorer,
        monitor_is_binary,
        resolve_data_source,
    )
    from openrlhf_classmate.scoring.sycophancy import JudgeNotConfiguredError
    from openrlhf_classmate.scoring.tinyv import TinyVNotConfiguredError

    if args.no_think and (args.classmate or args.monitor):
        raise EvaluationError("--no-think: there is no CoT for --classmate or --monitor")
    readers.check_arguments(args)
    if not args.no_think:
        from openrlhf_classmate.algo.spans import think_tags_problem

        problem = think_tags_problem(args.think_open, args.think_close)
        if problem:
            raise EvaluationError(f"--think-open / --think-close: {problem}")
    if args.monitor and not args.judge_base_url:
        raise EvaluationError("--monitor needs a judge: --judge-base-url (and --judge-model)")
    if args.samples < 1 or args.max_new_tokens < 1:
        raise EvaluationError("--samples and --max-new-tokens must be >= 1")
    _check_sampling("", args.samples, args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    if args.classmate or args.reader:
        _check_sampling("classmate-", 1, args.classmate_temperature, args.top_p, args.top_k,
                        args.classmate_max_new_tokens)
    if args.samples > 1 and is_greedy(args.temperature):
        log(f"note: greedy decoding: the {args.samples} samples per prompt are identical (generated once); "
            "set --temperature > 0 to sample")
    checked: set[str] = set()
    for row in rows:
        source = args.scorer if args.scorer != "auto" else row.label.get("data_source")
        try:
            name = resolve_data_source(source)
            get_scorer(name).check_label(row.label)
            if args.monitor:
                monitor_is_binary(source)
        except TinyVNotConfiguredError:
            raise EvaluationError(f"{row.location}: data_source {source!r} is scored by the TinyV verifier: pass "
                                  "--tinyv-base-url (e.g. http://127.0.0.1:8001/v1; train_scripts/tinyv.sh starts "
                                  "one), or --scorer math_verify for the rule verdict alone") from None
        except HookScoredError:
            raise EvaluationError(f"{row.location}: data_source {source!r} is scored only in training (by a reward "
                                  "hook of the trainer); evaluate has no scorer for it: leave those rows out of "
                                  "--data, or give --scorer NAME") from None
        except LabelError as e:
            hint = " (--scorer)" if args.scorer != "auto" else ""
            raise EvaluationError(f"{row.location}: {e}{hint}") from None
        if name in checked:
            continue
        checked.add(name)
        try:
            getattr(get_scorer(name), "check_config", lambda: None)()
        except JudgeNotConfiguredError:
            if not args.judge_base_url:
                raise EvaluationError(f"{row.location}: scorer {name!r} rates answers with an LLM judge: pass "
                                      "--judge-base-url (and --judge-model)") from None


def _check_content_parts(rows: list[Row], tokenizer, model: str, *, chat_template: bool) -> None:
    """Content-part lists only where ``model``'s chat template renders them (never without a template)."""
    from openrlhf_classmate.data.messages import first_parts_message, parts_problem

    for row in rows:
        i = first_parts_message(row.messages)
        if i is None:
            continue
        problem = parts_problem(row.messages, tokenizer, model) if chat_template else (
            f"message {i}: content parts (a list) cannot be joined into a prompt with --no-chat-template")
        if problem:
            raise EvaluationError(f"{row.location}: {problem}")


def _check_sampling(prefix: str, n: int, temperature: float, top_p: float, top_k: int, max_new_tokens: int) -> None:
    """Refuse up front what vLLM's ``SamplingParams`` refuses (the CPU stand-in checks the same), naming the flags."""
    from vllm import SamplingParams

    try:
        # greedy with several samples is generated once (eval.generation.generate_n): check it with n=1 as it runs
        SamplingParams(n=1 if is_greedy(temperature) else n, temperature=temperature, top_p=top_p, top_k=top_k,
                       max_tokens=max_new_tokens)
    except Exception as e:  # noqa: BLE001  (vLLM 0.26 raises ValueError/TypeError, 0.29 VLLMValidationError)
        raise EvaluationError(f"--{prefix}temperature {temperature} / --top-p {top_p} / --top-k {top_k} / "
                              f"--{prefix}max-new-tokens {max_new_tokens}: vLLM rejects these sampling settings: "
                              f"{e}") from None


# ── the run ──────────────────────────────────────────────────────────────────────────────────────────────────────


def _scorer_name(args, label: dict) -> str:
    from openrlhf_classmate.scoring import resolve_data_source

    return resolve_data_source(args.scorer if args.scorer != "auto" else label["data_source"])


def _score_labels(args, labels: list[dict]) -> list[dict]:
    return labels if args.scorer == "auto" else [{**label, "data_source": args.scorer} for label in labels]


def _generator(args, factory: Callable, model: str, max_model_len: int | None = None):
    return factory(args.backend, model, batch_size=args.batch_size, dtype=args.dtype, seed=args.seed,
                   tensor_parallel_size=args.tensor_parallel_size, gpu_memory_utilization=args.gpu_memory_utilization,
                   max_model_len=max_model_len, progress=not args.quiet, enforce_eager=args.enforce_eager)


def _configure_tinyv(args) -> None:
    """``--tinyv-base-url`` / ``--tinyv-model``: the TinyV verifier of the _tinyv rows (in this process)."""
    if args.tinyv_base_url is None:
        if args.tinyv_model is not None:
            raise EvaluationError("--tinyv-model is set but --tinyv-base-url is not: give the verifier's URL (e.g. "
                                  "http://127.0.0.1:8001/v1)")
        return
    if not args.tinyv_base_url.startswith(("http://", "https://")):
        raise EvaluationError(f"--tinyv-base-url must be an http(s) URL such as http://127.0.0.1:8001/v1, got "
                              f"{args.tinyv_base_url!r}")
    from openrlhf_classmate.scoring import TinyVConfig, configure_tinyv

    configure_tinyv(TinyVConfig(base_url=args.tinyv_base_url, model=args.tinyv_model))


def _check_models(args, tokenizer) -> None:
    """The launcher's check of every model it loads, shared: no tokenizer larger than its model's embedding
    (``--model``, ``--classmate``, every ``--reader``); with ``--classmate-prompt-mode splice``, readers with the
    policy's vocabulary (checked before any generation, not after the policy's)."""
    from openrlhf_classmate.algo.classmate_prompt import check_splice_compatible
    from openrlhf_classmate.integration.launch.preflight import vocab_problem

    problem = vocab_problem("--model", args.model, lambda: tokenizer)
    for reader in readers.readers_of(args):
        if problem:
            break
        reader_tokenizer = _load_tokenizer(reader.flag, reader.model)
        problem = vocab_problem(reader.flag, reader.model, lambda t=reader_tokenizer: t)
        if problem is None and args.classmate_prompt_mode == "splice":
            try:
                check_splice_compatible(tokenizer, reader_tokenizer, mode_flag="--classmate-prompt-mode")
            except ValueError as e:
                problem = f"{reader.flag} {reader.model}: {e}"
    if problem:
        raise EvaluationError(problem)


def _fit_context(args, rows: list[Row], prompt_ids: list[list[int]], backend: str) -> list[list[int]]:
    """Prompts longer than the model's context leaves them next to ``--max-new-tokens`` are cut from the front, as
    OpenRLHF cuts them in training, with the launcher's warning on the same file (``LongPrompts``, shared); a
    ``--max-new-tokens`` that fills the context alone is refused, as the launcher refuses ``--data.max_len`` <=
    ``--rollout.max_new_tokens``."""
    from openrlhf_classmate.eval.common import model_context
    from openrlhf_classmate.integration.launch.preflight_data import LongPrompts

    if backend == "vllm" and args.max_model_len:
        context, source = args.max_model_len, "--max-model-len"
    else:
        context, source = model_context(args.model), "config.json max_position_embeddings"
    if context is None:
        return prompt_ids
    if args.max_new_tokens >= context:
        raise EvaluationError(f"--max-new-tokens {args.max_new_tokens} leaves no room for a prompt in the context of "
                              f"--model {args.model} ({context} tokens, {source}): lower --max-new-tokens")
    long = LongPrompts(room=context - args.max_new_tokens)
    for row, ids in zip(rows, prompt_ids, strict=True):
        long.add(len(ids), row.location)
    warning = long.warning(f"--data {args.data}", f"--model's context {context} ({source}) - --max-new-tokens "
                           f"{args.max_new_tokens}", "evaluate cuts them from the front, as OpenRLHF does in "
                           "training, so the model never sees their beginning; lower --max-new-tokens or drop those "
                           "rows")
    if warning is None:
        return prompt_ids
    print(f"warning: {warning}", file=sys.stderr, flush=True)
    return [ids[-long.room:] for ids in prompt_ids]


def check(args) -> list[Row]:
    """The cheap input checks (flags, paths, the data file and its labels); returns the rows."""
    _check_ranges(args)
    _check_paths(args)
    _configure_tinyv(args)
    rows = read_rows(args.data, args.input_key, args.label_key, args.limit)
    _check_args(args, rows)
    return rows


def run(args, generator_factory: Callable = make_generator) -> dict[str, Any]:
    """Evaluate as the module docstring says; returns the summary (also written to ``summary.json``)."""

    from openrlhf_classmate.algo.response_split import load_stop_token_ids
    from openrlhf_classmate.algo.spans import think_token_ids
    from openrlhf_classmate.eval.report import format_table, summarize, write_plots
    from openrlhf_classmate.scoring import score_responses

    started = time.time()
    rows = check(args)
    judge = _judge_config(args)
    try:
        template_kwargs = json.loads(args.chat_template_kwargs)
    except json.JSONDecodeError as e:
        raise EvaluationError(f"--chat-template-kwargs is not JSON ({e.msg})") from None
    if not isinstance(template_kwargs, dict):
        raise EvaluationError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": true}'")
    tokenizer = _load_tokenizer("--model", args.model)
    _check_models(args, tokenizer)
    _check_content_parts(rows, tokenizer, args.model, chat_template=not args.no_chat_template)
    if args.classmate:
        _check_content_parts(rows, _load_tokenizer("--classmate", args.classmate), args.classmate,
                             chat_template=True)
    readers.check_reader_tokenizers(args)
    for reader in args.reader:
        _check_content_parts(rows, _load_tokenizer("--reader", reader), reader, chat_template=True)
    lock = hold_output_dir(args.output_dir)  # held until this evaluation has written its files
    open_id = close_id = None
    if not args.no_think:
        try:
            open_id, close_id = think_token_ids(tokenizer, think_open=args.think_open, think_close=args.think_close)
        except ValueError as e:
            raise EvaluationError(f"{e}; set --think-open/--think-close, --no-think for a model without a think "
                                  "block, or add the tags as tokens: python -m openrlhf_classmate.cli.prepare_policy "
                                  f"{args.model} OUT") from None
    think_ids = None if args.no_think else (open_id, close_id)
    stop_ids = load_stop_token_ids(args.model, tokenizer)  # every id generation stops on, as in training
    prompt_ids, opened = render_prompts(tokenizer, rows, chat_template=not args.no_chat_template,
                                        template_kwargs=template_kwargs, think_ids=think_ids)
    backend = resolve_backend(args.backend)
    prompt_ids = _fit_context(args, rows, prompt_ids, backend)
    log(f"{len(rows)} prompts x {args.samples} samples, model {args.model}, backend {backend}")

    generator = _generator(args, generator_factory, args.model, args.max_model_len)
    params = GenParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                       top_k=args.top_k, n=args.samples, seed=args.seed)
    try:
        generations = generator.generate(prompt_ids, params, desc="policy")
    finally:
        generator.close()

    records: list[dict[str, Any]] = []
    splits: list[dict[str, Any]] = []
    for p, (row, gens) in enumerate(zip(rows, generations, strict=True)):
        for s, gen in enumerate(gens):
            split = split_response(gen.token_ids, tokenizer, open_id=open_id, close_id=close_id,
                                   starts_in_think=opened[p], stop_ids=stop_ids)
            splits.append(split)
            records.append({
                "index": len(records), "prompt_index": p, "sample_index": s,
                "data_source": row.label.get("data_source"), "scorer": _scorer_name(args, row.label),
                "prompt": row.messages, "response": split["response"], "cot": split["cot"],
                "answer": split["answer"], "has_answer": split["has_answer"], "split_status": split["status"],
                "finish_reason": gen.finish_reason,
                "response_tokens": len(gen.token_ids),
                "cot_tokens": None if split["cot_ids"] is None else len(split["cot_ids"]),
            })
    labels = [rows[r["prompt_index"]].label for r in records]
    log(f"scoring {len(records)} answers")
    main_results = score_responses([r["answer"] for r in records], _score_labels(args, labels), judge=judge)
    main_results = [unless_failed(res, r["finish_reason"]) for r, res in zip(records, main_results, strict=True)]
    for r, res in zip(records, main_results, strict=True):
        r.update(score=float(res.score), valid=bool(res.valid), extracted=res.extracted,
                 explanation=res.explanation, reason=res.reason)

    readers.run_readers(args, lambda model, max_len: _generator(args, generator_factory, model, max_len), tokenizer,
                        rows, records, splits, labels,
                        lambda texts, labels, judge: score_responses(texts, _score_labels(args, labels), judge=judge),
                        judge)

    monitor = None
    if args.monitor:
        monitor = _run_monitor(records, _score_labels(args, labels), main_results, judge)

    groups = summarize(records, monitor)
    write_jsonl(os.path.join(args.output_dir, "samples.jsonl"), records)
    plots = [] if args.no_plot else write_plots(records, groups, args.output_dir)
    summary = {
        "model": args.model, "data": args.data, "classmate": args.classmate, "backend": backend,
        "readers": {r.name: r.model for r in readers.readers_of(args)},
        "truncate_cot": list(readers.parse_fractions(args.truncate_cot)),
        "prompts": len(rows), "samples_per_prompt": args.samples,
        "generation": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                       "top_k": args.top_k, "seed": args.seed},
        "judge": None if judge is None else {"base_url": judge.base_url, "model": judge.model},
        "metrics": groups, "plots": [os.path.basename(p) for p in plots],
        "elapsed_s": round(time.time() - started, 2),
    }
    write_json(os.path.join(args.output_dir, "summary.json"), summary)  # written last: the sweep's "done" mark
    print(format_table(groups))
    log(f"wrote {args.output_dir}/samples.jsonl, summary.json" + (f", {', '.join(summary['plots'])}" if plots else ""))
    lock.close()
    return summary


def _run_monitor(records, labels, main_results, judge) -> dict[str, dict[str, float]]:
    """Monitor predictions per CoT (``labels`` as scored) and ``monitor_metrics`` per scorer."""
    from openrlhf_classmate.scoring import monitor_is_binary, monitor_metrics, monitor_predictions

    log(f"CoT monitor on {len(records)} chains of thought")
    preds = monitor_predictions([r["cot"] if r["cot_tokens"] else None for r in records], labels, judge)
    for r, pred in zip(records, preds, strict=True):
        r.update(monitor_score=float(pred.score), monitor_valid=bool(pred.valid), monitor_reason=pred.reason,
                 monitor_explanation=pred.explanation)
    out: dict[str, dict[str, float]] = {}
    by_scorer: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_scorer.setdefault(r["scorer"], []).append(i)
    for scorer, idx in by_scorer.items():
        binary = monitor_is_binary(scorer)
        out[scorer] = monitor_metrics([preds[i] for i in idx], [main_results[i] for i in idx], binary)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if sweep.is_sweep(args):
            sweep.run_sweep(args, run, check)
        elif args.model is None or args.output_dir is None:
            raise EvaluationError("give --model MODEL and --output-dir DIR (one model), or --run-dir RUN / --checkpoints "
                                  "DIR... (every checkpoint of a run)")
        else:
            run(args)
    except EvaluationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

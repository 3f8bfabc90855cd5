#!/usr/bin/env python
"""Baseline perplexities for VR-CLI: the gold next chapter's perplexity under the generator
prompt *without* a plan, written into the rows of setup_data/vrcli_story.py's jsonl files.

The generator is the RL reference model, i.e. the policy's starting checkpoint: pass the model you train from (the
launcher's --actor.model_name_or_path) and the dtype it runs in (--ds.param_dtype). Inputs, template and masking are
built by the same code as the training reward (openrlhf_classmate.rewards.vrcli.generator_sequence), and the forward
is upstream's Actor.forward (temperature 1). Each label gains

    baseline_ppl       exp(mean NLL of the gold chapter and its end-of-turn tokens)
    baseline_model     --model as given
    baseline_checksum  sha256 of the model's weight, config and tokenizer files (openrlhf_classmate.rewards.likelihood)
    baseline_dtype     --dtype

and training with --vrcli.baseline dataset (the default) refuses rows whose checksum or dtype differ from the
reference model's. Files are rewritten atomically as JSON Lines: into --output-dir (same file names, a .json or
.parquet input's with the suffix .jsonl), or in place with --in-place (.jsonl inputs only).

    python setup_data/vrcli_baseline_ppl.py --model Qwen/Qwen2.5-3B-Instruct --in-place \\
        data/vrcli_story/train.jsonl data/vrcli_story/val.jsonl data/vrcli_story/test.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

import openrlhf_classmate  # noqa: E402,F401  (CPU shims before openrlhf imports)
from openrlhf_classmate.data.errors import DataError  # noqa: E402

CHUNK_ROWS = 64  # rows per batched call (progress granularity; micro-batching happens inside)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="setup_data/vrcli_baseline_ppl.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("files", nargs="+", help="jsonl files written by setup_data/vrcli_story.py")
    p.add_argument("--model", required=True, help="the reference model: HF id or local path (= the policy's start)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="must equal training's --ds.param_dtype")
    p.add_argument("--attn-implementation", default="sdpa",
                   help="transformers attention implementation (flash_attention_2 on GPUs with flash-attn)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--label-key", default="label", help="the rows' label column (training's --data.label_key)")
    p.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward")
    p.add_argument("--max-tokens-per-forward", type=int, default=16384, help="padded tokens per forward (0: no limit)")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--output-dir", help="write the updated files here (same names; .json / .parquet -> .jsonl)")
    out.add_argument("--in-place", action="store_true", help="replace the input files (atomically; .jsonl only)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.micro_batch_size < 1 or args.max_tokens_per_forward < 0:
        p.error("--micro-batch-size must be >= 1 and --max-tokens-per-forward >= 0")
    if args.in_place:
        # the output is JSON Lines: written under a .parquet or .json name it would ruin that file
        other = [f for f in args.files if not f.lower().endswith(".jsonl")]
        if other:
            p.error(f"--in-place rewrites the files as JSON Lines, and {other[0]} is no .jsonl file; use --output-dir "
                    "(it is written there as .jsonl)")
    names = [output_name(f) for f in args.files]
    if len(set(names)) != len(names):
        p.error("two input files share an output file name; process them in separate runs")
    return args


def output_name(path: str) -> str:
    """The updated file's name: the input's, with the suffix .jsonl for a .json or .parquet input (the rows are
    written as JSON Lines)."""
    name = os.path.basename(path)
    return name if name.lower().endswith(".jsonl") else os.path.splitext(name)[0] + ".jsonl"


def read_rows(path: str, label_key: str) -> list[tuple[str, dict, dict]]:
    """(location, row, parsed VR-CLI label) per row; DataError naming file:line on a bad row."""
    from openrlhf_classmate.data.io import iter_file_rows
    from openrlhf_classmate.rewards.vrcli import parse_vrcli_label

    rows = []
    for location, row in iter_file_rows(path):
        try:
            rows.append((location, row, parse_vrcli_label(row.get(label_key))))
        except ValueError as e:
            raise DataError(str(e), location=location) from None
    return rows


def load_reference(model: str, dtype: str, attn_implementation: str, device: str):
    from openrlhf.models import Actor
    from transformers import AutoTokenizer

    actor = Actor(model, attn_implementation=attn_implementation, param_dtype=dtype, temperature=1.0)
    actor.eval().to(device)
    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
    return actor, tokenizer


def compute(args, rows_by_file, actor, tokenizer, device) -> dict[str, float]:
    """Baseline perplexity per datapoint id (each datapoint computed once)."""
    from tqdm import tqdm

    from openrlhf_classmate.rewards.likelihood import gold_mean_nll, local_forward
    from openrlhf_classmate.rewards.vrcli import generator_sequence

    todo: dict[str, tuple[str, dict]] = {}
    for rows in rows_by_file.values():
        for location, _, label in rows:
            todo.setdefault(label["datapoint_id"], (location, label))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    forward = local_forward(actor, device)
    ids = list(todo)
    ppl: dict[str, float] = {}
    bar = tqdm(total=len(ids), desc="baseline ppl", unit=" rows", disable=args.quiet)
    for begin in range(0, len(ids), CHUNK_ROWS):
        chunk = ids[begin : begin + CHUNK_ROWS]
        items = []
        for key in chunk:
            location, label = todo[key]
            try:
                items.append(generator_sequence(tokenizer, label, None))
            except ValueError as e:
                raise DataError(str(e), location=location) from None
        nll = gold_mean_nll(forward, items, pad_id=pad, micro_batch_size=args.micro_batch_size,
                            max_tokens=args.max_tokens_per_forward or None)
        for key, value in zip(chunk, nll):
            if not math.isfinite(value):
                raise DataError(f"the model gave a non-finite NLL ({value}) for datapoint {key!r}",
                                location=todo[key][0])
            ppl[key] = math.exp(value)
        bar.update(len(chunk))
    bar.close()
    return ppl


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from openrlhf_classmate.data.io import atomic_outputs, check_output_dir, check_outputs_spare_inputs
    from openrlhf_classmate.integration.launch.preflight import PreflightError, PreflightReport, check_model_path
    from openrlhf_classmate.rewards.likelihood import model_checksum

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if not args.in_place:
            check_output_dir(args.output_dir)
            check_outputs_spare_inputs(args.output_dir, [output_name(f) for f in args.files], args.files,
                                       hint="use --in-place to update the input files, or another --output-dir")
        check_model_path("--model", args.model, PreflightReport())  # the launcher's check of a model path
        rows_by_file = {path: read_rows(path, args.label_key) for path in args.files}
    except (DataError, PreflightError, OSError) as e:
        print(f"vrcli_baseline_ppl: error: {e}", file=sys.stderr)
        return 1
    try:
        checksum = model_checksum(args.model)
        actor, tokenizer = load_reference(args.model, args.dtype, args.attn_implementation, device)
    except Exception as e:  # noqa: BLE001  (a hub id not reachable, a folder transformers cannot load: one line)
        detail = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"vrcli_baseline_ppl: error: --model {args.model}: cannot load it ({type(e).__name__}: {detail})",
              file=sys.stderr)
        return 1
    try:
        ppl = compute(args, rows_by_file, actor, tokenizer, device)
    except DataError as e:
        print(f"vrcli_baseline_ppl: error: {e}", file=sys.stderr)
        return 1
    fields = {"baseline_model": args.model, "baseline_checksum": checksum, "baseline_dtype": args.dtype}
    # all files are written to temp files first and renamed together, per output directory
    by_dir: dict[str, list[str]] = {}
    for path in args.files:
        by_dir.setdefault(os.path.dirname(os.path.abspath(path)) if args.in_place else args.output_dir, []).append(path)
    for out_dir, paths in by_dir.items():
        with atomic_outputs(out_dir) as writer:
            for path in paths:
                updated = []
                for _, row, label in rows_by_file[path]:
                    label = {**label, "baseline_ppl": ppl[label["datapoint_id"]], **fields}
                    raw = row.get(args.label_key)
                    updated.append({**row, args.label_key: json.dumps(label, ensure_ascii=False)
                                    if isinstance(raw, str) else label})
                writer.write_jsonl(output_name(path), updated)
    values = sorted(ppl.values())
    median = values[len(values) // 2] if values else float("nan")
    print(f"vrcli_baseline_ppl: {len(ppl)} datapoints in {len(args.files)} file(s), model {args.model} "
          f"({args.dtype}, checksum {checksum[:12]}), median baseline ppl {median:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

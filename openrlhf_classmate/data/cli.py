"""The common command line of the ``setup_data/`` scripts: flags, input-to-split assignment, progress, summary.

A script declares its *source splits* (name -> hub split) and a ``build`` function that turns the rows of those
source splits into output splits; :func:`run_script` does the rest (read, build, write atomically, summarise).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openrlhf_classmate.data.errors import DataError
from openrlhf_classmate.data.io import (
    Located,
    atomic_outputs,
    check_output_dir,
    check_outputs_spare_inputs,
    expand_input,
    load_rows,
)

# Words that name a split in hub snapshot file names (e.g. ``all/test-00000-of-00001.parquet``).
_SPLIT_WORDS = {"train", "test", "validation", "val", "dev", "eval"}


@dataclass
class Summary:
    name: str
    read: int = 0
    unused: int = 0
    written: dict[str, int] = field(default_factory=dict)
    filtered: Counter = field(default_factory=Counter)

    def filter(self, reason: str) -> None:
        self.filtered[reason] += 1

    def line(self) -> str:
        wrote = " ".join(f"{split}={n}" for split, n in self.written.items()) or "nothing"
        total = sum(self.filtered.values())
        text = f"{self.name}: read {self.read} rows, wrote {wrote}, filtered {total}"
        if total:
            text += " (" + ", ".join(f"{reason}: {n}" for reason, n in sorted(self.filtered.items())) + ")"
        if self.unused:
            text += f", unused {self.unused}"
        return text


def make_parser(
    name: str,
    description: str | None,
    *,
    hub_name: str | None,
    sources: Mapping[str, str],
    hub_config: str | None = None,
) -> argparse.ArgumentParser:
    """The flags every script shares; scripts add their own size flags to the returned parser."""
    parser = argparse.ArgumentParser(
        prog=f"setup_data/{name}.py",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    split_names = ", ".join(sources)
    parser.add_argument(
        "--input",
        action="append",
        metavar="[SPLIT=]PATH",
        help=(
            "local .jsonl/.json/.parquet file or directory instead of the hub; repeatable. "
            f"Source splits: {split_names}. Prefix SPLIT= to say which one a path holds; otherwise it is read "
            "from the file name (e.g. test.jsonl, train-00000-of-00001.parquet)"
        ),
    )
    parser.add_argument("--output-dir", default=os.path.join("data", name), help="where the .jsonl files go")
    parser.add_argument("--seed", type=int, default=42, help="seed of every random choice (shuffles, hints)")
    parser.add_argument("--max-rows", type=int, default=None, help="read at most this many rows per source split")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--hub-name", default=hub_name, help="Hugging Face hub data set (used without --input)")
    parser.add_argument("--hub-config", default=hub_config, help="configuration (subset) of the hub data set")
    return parser


def _tokens(text: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", text.lower())) - {""}


def _infer_split(file: str, relname: str, sources: Mapping[str, str], *, from_directory: bool) -> str | None:
    """The source split ``file`` holds, judged by ``relname`` (its name, or its path inside the directory given);
    None means skip it (a directory's file of a split this script does not read)."""
    tokens = _tokens(relname)
    matched = [s for s, hub_split in sources.items() if {s, hub_split} & tokens]
    if len(matched) == 1:
        return matched[0]
    if len(matched) > 1:
        raise DataError(
            f"file name matches several source splits ({', '.join(matched)}); name it SPLIT=PATH", location=file
        )
    names_other_split = bool(tokens & _SPLIT_WORDS)
    if from_directory and names_other_split:
        return None
    if len(sources) == 1:
        return next(iter(sources))
    raise DataError(
        f"cannot tell which source split this file holds ({', '.join(sources)}); name it SPLIT=PATH", location=file
    )


def assign_inputs(inputs: Sequence[str], sources: Mapping[str, str]) -> tuple[dict[str, list[str]], list[str]]:
    """Map ``--input`` values to source splits. Returns the files per split and the directory files skipped."""
    by_split: dict[str, list[str]] = {s: [] for s in sources}
    skipped: list[str] = []
    for spec in inputs:
        prefix, sep, rest = spec.partition("=")
        if sep and prefix in sources:
            by_split[prefix].extend(expand_input(rest))
            continue
        if sep and prefix in _SPLIT_WORDS and not Path(spec).exists():
            raise DataError(f"this script reads no split '{prefix}' (its source splits: {', '.join(sources)})")
        path = spec
        files = expand_input(path)  # an empty or missing path: an error before Path("") reads as the working directory
        if Path(path).is_dir():
            for file in files:
                split = _infer_split(file, os.path.relpath(file, path), sources, from_directory=True)
                if split is None:
                    skipped.append(file)
                else:
                    by_split[split].append(file)
        else:
            split = _infer_split(path, Path(path).name, sources, from_directory=False)
            assert split is not None  # only directory members are ever skipped
            by_split[split].append(path)
    return by_split, skipped


def progress(items, *, desc: str, quiet: bool, total: int | None = None):
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, unit=" rows", disable=quiet or not sys.stderr.isatty(), leave=False)


def read_sources(
    args: argparse.Namespace,
    summary: Summary,
    sources: Mapping[str, str],
    *,
    hub_configs: Sequence[str | None] | None = None,
) -> dict[str, Iterator[Located]]:
    """Lazy ``(location, row)`` iterators per source split; rows consumed are counted in ``summary.read``.

    Without ``--input`` the rows come from the hub: ``hub_configs`` (default: ``--hub-config``) are read one after
    the other for every source split.
    """
    configs = list(hub_configs) if hub_configs is not None else [args.hub_config]
    if args.input:
        by_split, skipped = assign_inputs(args.input, sources)
        for file in skipped:
            print(
                f"{summary.name}: note: skipping {file} (its name names a split this script does not read)",
                file=sys.stderr,
            )
        for split, files in by_split.items():
            if not files:
                print(
                    f"{summary.name}: note: no input for source split '{split}'; its outputs stay empty",
                    file=sys.stderr,
                )

        def opener(split: str) -> Iterator[Located]:
            files = by_split[split]
            return load_rows(files, None, None, split) if files else iter(())

    else:

        def opener(split: str) -> Iterator[Located]:
            return itertools.chain.from_iterable(
                load_rows(None, args.hub_name, config, sources[split]) for config in configs
            )

    def counted(split: str) -> Iterator[Located]:
        rows = opener(split)
        if args.max_rows is not None:
            rows = itertools.islice(rows, args.max_rows)
        for item in progress(rows, desc=f"{summary.name} {split}", quiet=args.quiet):
            summary.read += 1
            yield item

    return {split: counted(split) for split in sources}


def input_files(inputs: Sequence[str] | None) -> list[str]:
    """Every existing file an ``--input`` value names (``SPLIT=PATH`` or ``PATH``; a directory's files)."""
    files: list[str] = []
    for spec in inputs or []:
        for path in {spec, spec.partition("=")[2]} - {""}:
            p = Path(path)
            if p.is_dir():
                files.extend(str(f) for f in p.rglob("*") if f.is_file())
            elif p.is_file():
                files.append(path)
    return files


def write_outputs(output_dir: str, splits: Mapping[str, list[dict[str, Any]]], summary: Summary,
                  inputs: Sequence[str] = ()) -> None:
    """Write ``<split>.jsonl`` for every split; nothing is replaced until all files are written, and nothing at all
    when a file would replace one of the ``inputs`` (the ``--input`` files)."""
    check_outputs_spare_inputs(output_dir, [f"{split}.jsonl" for split in splits], input_files(inputs),
                               hint="choose another --output-dir")
    with atomic_outputs(output_dir) as writer:
        for split, rows in splits.items():
            summary.written[split] = writer.write_jsonl(f"{split}.jsonl", rows)


def run_script(
    parser: argparse.ArgumentParser,
    build: Callable[[argparse.Namespace, Summary], Mapping[str, list[dict[str, Any]]]],
    argv: Sequence[str] | None = None,
    *,
    validate: Callable[[argparse.Namespace], str | None] | None = None,
) -> int:
    """Parse flags, build the splits, write them, print the summary line. A DataError ends with exit status 1;
    ``validate`` may return a usage message for flag combinations argparse cannot check (exit status 2)."""
    args = parser.parse_args(argv)
    problem = validate(args) if validate else None
    if problem:
        parser.error(problem)
    name = parser.prog.removeprefix("setup_data/").removesuffix(".py")
    summary = Summary(name)
    if args.max_rows is not None and args.max_rows < 1:
        parser.error("--max-rows must be at least 1")
    try:
        check_output_dir(args.output_dir)
        splits = build(args, summary)
        write_outputs(args.output_dir, splits, summary, args.input or ())
    except DataError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a file-size limit, an unreadable input: one line (nothing was committed)
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"{name}: error: {exc.strerror or exc}{where} (output folder {args.output_dir}: no file in it is left "
              "half-written)", file=sys.stderr)
        return 1
    print(summary.line(), flush=True)
    return 0


def take_sizes(items: list, sizes: Mapping[str, int]) -> dict[str, list]:
    """Consecutive slices of ``items`` with the given sizes, in order (a later slice may come up short or empty)."""
    out: dict[str, list] = {}
    start = 0
    for split, size in sizes.items():
        out[split] = items[start : start + size]
        start += size
    return out


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value

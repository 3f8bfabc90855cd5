"""Reading dataset rows (local files or the Hugging Face hub) and writing outputs atomically.

Rows are yielded as ``(location, row)`` pairs so that every later error can name the file and line it came from.
Local files are read lazily, so a script that needs only the first rows of a big file stops early.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from openrlhf_classmate.data.errors import DataError

SUPPORTED_SUFFIXES = (".jsonl", ".json", ".parquet")

Located = tuple[str, dict[str, Any]]


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _iter_jsonl_lines(path: str, lines: Iterable[str], first_lineno: int = 1) -> Iterator[Located]:
    for lineno, line in enumerate(lines, first_lineno):
        if not line.strip():
            continue  # blank lines (a trailing newline, an editor's empty last line) carry no row
        location = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"invalid JSON ({exc.msg} at column {exc.colno})", location=location) from None
        if not isinstance(obj, dict):
            raise DataError(f"expected a JSON object per line, got {_type_name(obj)}", location=location)
        yield location, obj


def _iter_jsonl(path: str) -> Iterator[Located]:
    try:
        with open(path, encoding="utf-8") as f:
            yield from _iter_jsonl_lines(path, f)
    except UnicodeDecodeError as exc:
        raise DataError(f"not valid UTF-8 text ({exc.reason} at byte {exc.start})", location=path) from None


def _iter_json(path: str) -> Iterator[Located]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"not valid UTF-8 text ({exc.reason} at byte {exc.start})", location=path) from None
    if not text.lstrip().startswith("["):
        # `datasets.Dataset.to_json` writes JSON Lines under a .json name; accept that layout too.
        yield from _iter_jsonl_lines(path, text.splitlines())
        return
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON ({exc.msg} at column {exc.colno})", location=f"{path}:{exc.lineno}") from None
    for i, obj in enumerate(items, 1):
        location = f"{path}:row {i}"
        if not isinstance(obj, dict):
            raise DataError(f"expected a list of JSON objects, got {_type_name(obj)}", location=location)
        yield location, obj


def _iter_parquet(path: str) -> Iterator[Located]:
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(path)
        batches = pfile.iter_batches(batch_size=1024)
        index = 0
        for batch in batches:
            for obj in batch.to_pylist():
                index += 1
                yield f"{path}:row {index}", obj
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises several unrelated types for corrupt or non-parquet files
        raise DataError(f"cannot read parquet file ({type(exc).__name__}: {exc})", location=path) from None


def iter_file_rows(path: str) -> Iterator[Located]:
    """Rows of one local .jsonl / .json / .parquet file; an empty file is an error."""
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        rows = _iter_jsonl(path)
    elif suffix == ".json":
        rows = _iter_json(path)
    elif suffix == ".parquet":
        rows = _iter_parquet(path)
    else:
        raise DataError(f"unsupported input format '{suffix}' (use .jsonl, .json or .parquet)", location=path)
    count = 0
    for item in rows:
        count += 1
        yield item
    if count == 0:
        raise DataError("empty input file (no rows)", location=path)


def expand_input(path: str) -> list[str]:
    """A file stays itself; a directory becomes its supported files (recursively, sorted for a stable order)."""
    if not path.strip():  # Path("") is the working directory: an unset shell variable would read all of it
        raise DataError("an empty --input path (an unset shell variable?)")
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUPPORTED_SUFFIXES)
        if not files:
            raise DataError("no .jsonl, .json or .parquet files in this directory", location=path)
        return files
    if not p.exists():
        raise DataError("no such file or directory", location=path)
    return [path]


def _iter_hub(hub_name: str, hub_config: str | None, hub_split: str) -> Iterator[Located]:
    where = f"hf://{hub_name}" + (f"/{hub_config}" if hub_config else "") + f"/{hub_split}"
    try:
        import datasets

        dataset = datasets.load_dataset(hub_name, hub_config, split=hub_split)
    except Exception as exc:  # network, auth, unknown config: all end the same way for the user
        raise DataError(
            f"cannot load from the Hugging Face hub ({type(exc).__name__}: {exc}); pass --input FILE to run offline",
            location=where,
        ) from None
    if len(dataset) == 0:
        raise DataError("empty hub split (no rows)", location=where)
    for i, obj in enumerate(dataset, 1):
        yield f"{where}:row {i}", dict(obj)


def load_rows(
    input_path: str | Sequence[str] | None,
    hub_name: str | None,
    hub_config: str | None,
    hub_split: str,
) -> Iterator[Located]:
    """Rows from local files when ``input_path`` is given (file, directory or several), else from the hub.

    The hub is only touched when no local input is given, so ``--input`` runs stay offline.
    """
    if input_path is not None:
        paths = [input_path] if isinstance(input_path, str) else list(input_path)
        for path in paths:
            for file in expand_input(path):
                yield from iter_file_rows(file)
        return
    if not hub_name:
        raise DataError("no hub copy of this data set is known; pass --input FILE (or --hub-name NAME)")
    yield from _iter_hub(hub_name, hub_config, hub_split)


def check_output_dir(output_dir: str, flag: str = "--output-dir") -> None:
    """DataError unless ``output_dir`` is a writable directory or can be created (checked before any work, by a real
    write: :func:`openrlhf_classmate.writable.write_problem`)."""
    from openrlhf_classmate.writable import write_problem

    problem = write_problem(output_dir)
    if problem:
        raise DataError(f"output directory {problem}; choose another {flag}", location=output_dir)


def check_outputs_spare_inputs(output_dir: str, names: Iterable[str], inputs: Iterable[str], *, hint: str) -> None:
    """DataError when writing file ``names`` into ``output_dir`` would replace one of the ``inputs`` files: the same
    path after resolving symlinks, or the same file (a hard link). Checked before anything is written. ``hint``
    says what to do instead."""
    inputs = list(inputs)
    for name in names:
        target = os.path.join(output_dir, name)
        if not os.path.lexists(target):
            continue  # a new file cannot be an input
        for source in inputs:
            try:
                same = os.path.realpath(target) == os.path.realpath(source) or os.path.samefile(target, source)
            except OSError:  # a dangling symlink: nothing to compare with
                same = False
            if same:
                raise DataError(f"writing {name} here would replace the input file {source}; {hint}",
                                location=target)


class AtomicWriter:
    """Writes each output to a hidden temp file next to its target; ``commit`` renames them all into place.

    Until ``commit`` no target file is touched, so a failed run leaves the previous outputs intact.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self._pending: list[tuple[str, str]] = []  # (temp path, final path)

    def _temp_path(self, filename: str) -> str:
        return os.path.join(self.output_dir, f".{filename}.{os.getpid()}.{secrets.token_hex(4)}.tmp")

    def write_jsonl(self, filename: str, rows: Iterable[dict[str, Any]]) -> int:
        final = os.path.join(self.output_dir, filename)
        temp = self._temp_path(filename)
        # O_EXCL: never clobber a concurrent run's temp file; 0o666 lets the umask decide the final mode.
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self._pending.append((temp, final))
        count = 0
        with open(fd, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False))
                f.write("\n")
                count += 1
            f.flush()
            os.fsync(f.fileno())
        return count

    def commit(self) -> None:
        while self._pending:
            temp, final = self._pending[0]
            os.replace(temp, final)
            self._pending.pop(0)

    def abort(self) -> None:
        for temp, _ in self._pending:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temp)
        self._pending.clear()


@contextlib.contextmanager
def atomic_outputs(output_dir: str) -> Iterator[AtomicWriter]:
    """Context manager around :class:`AtomicWriter`: commit on success, remove every temp file on any exception.

    A directory created here is removed again (if still empty) when the run fails.
    """
    created = not os.path.isdir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    writer = AtomicWriter(output_dir)
    try:
        yield writer
        writer.commit()
    except BaseException:
        writer.abort()
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(output_dir)
        raise

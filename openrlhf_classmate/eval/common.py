"""Pieces shared by ``evaluate`` (one model), its readers (:mod:`.readers`) and the checkpoint sweep (:mod:`.sweep`):
the user-facing error, tokenizer loading, masking failed generations, and atomic file writes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from openrlhf_classmate.eval.generation import FAILED_FINISH_REASONS


class EvaluationError(ValueError):
    """A user-facing input problem (bad data file, missing judge, unsupported combination): one line, no traceback."""


def log(message: str) -> None:
    print(f"[evaluate] {message}", file=sys.stderr, flush=True)


def load_tokenizer(flag: str, path: str):
    """``AutoTokenizer`` of ``path``; an unusable folder is one :class:`EvaluationError` line naming ``flag``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    except Exception as e:  # noqa: BLE001  (transformers raises OSError, ValueError, ... for unusable folders)
        raise EvaluationError(f"{flag} {path}: cannot load its tokenizer ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200]})") from None


def model_context(model: str) -> int | None:
    """The context length ``model``'s config states (``max_position_embeddings``, of the text model for multimodal
    configs); None when the config cannot be read or names none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=True)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
    except Exception:  # noqa: BLE001  (a hub id offline, an unknown architecture: the check is skipped)
        return None
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def unless_failed(result, finish_reason: str | None):
    """A generation vLLM aborted or failed is no answer: its score is invalid (masked), never the scorer's 0."""
    from openrlhf_classmate.scoring import ScoreResult

    if finish_reason in FAILED_FINISH_REASONS:
        return ScoreResult.invalid(f"generation finished with {finish_reason!r}")
    return result


def finite(value):
    """NaN (an undefined metric) -> null, so the JSON files are strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def replace_into(path: str, write) -> None:
    """Write through a temporary file of this writer's own beside ``path`` and rename: a reader (or a resumed sweep)
    sees the old file or the whole new one, never a part, and never a mix of two writers' rows."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def hold_output_dir(directory: str, flag: str = "--output-dir"):
    """Create ``directory`` and hold it for this process (an exclusive ``flock`` on its ``.evaluate.lock``) until the
    returned file is closed or the process ends: a second evaluation writing into it at the same time would replace
    this one's files with its own, so it is refused in one line."""
    os.makedirs(directory, exist_ok=True)
    f = open(os.path.join(directory, ".evaluate.lock"), "a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise EvaluationError(f"{flag} {directory}: another evaluation ({holder}) is writing there; wait for it to "
                              f"finish or give another {flag}") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    return f


def write_json(path: str, data: Any) -> None:
    replace_into(path, lambda f: json.dump(finite(data), f, indent=2))


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
    replace_into(path, lambda f: f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

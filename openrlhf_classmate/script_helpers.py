"""Small programs ``train_scripts/lib.sh`` runs: ``python -m openrlhf_classmate.script_helpers COMMAND ARGS``.

Logic that bash would do badly (HTTP, JSON) lives here, as functions with tests, instead of inline Python in the
shell library. Standard library only: it runs before (and without) any training stack.

Commands:

* ``http-ok URL``: exit 0 when GET URL answers with a status below 400 within 5 s (as ``curl -f``), 1 otherwise
  (lib.sh's fallback where curl is missing);
* ``first-model-id BASE_URL``: print the first model id of GET BASE_URL/models (an OpenAI-compatible server);
* ``ray-runtime-env ROOT NAME...``: print the Ray job's runtime env as JSON: ROOT as working directory (large folders
  excluded) and the environment variables NAME... that are set.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

# never uploaded with the Ray job's working directory: environments, history, outputs and weights. Ray reads these as
# .gitignore lines: the repository's own runs/, outputs/ and data/ folders are anchored at its root ("/data/"), as a bare
# "data/" also dropped the package openrlhf_classmate/data/ from the job's copy
RAY_JOB_EXCLUDES = [".venv/", ".git/", "/runs/", "/outputs/", "/data/", "*.safetensors", "*.pt"]


def http_ok(url: str, timeout_s: float = 5.0) -> bool:
    """True when GET ``url`` answers with a status below 400 (redirects followed) within ``timeout_s``."""
    try:
        urllib.request.urlopen(url, timeout=timeout_s).close()
        return True
    except (OSError, ValueError):  # URLError, HTTPError, timeouts, connection refused; ValueError: a malformed URL
        return False


def first_model_id(base_url: str, timeout_s: float = 10.0) -> str:
    """The first model id served at ``base_url``/models."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout_s) as response:
        return json.load(response)["data"][0]["id"]


def ray_runtime_env(root: str, names: Sequence[str], environ: Mapping[str, str] = os.environ) -> dict:
    """The runtime env of a ``ray job submit``: ``root`` as working directory and the listed variables that are set
    (each once, in the order given)."""
    env = {name: environ[name] for name in dict.fromkeys(names) if name in environ}
    return {"working_dir": root, "excludes": list(RAY_JOB_EXCLUDES), "env_vars": env}


USAGE = "usage: python -m openrlhf_classmate.script_helpers {http-ok URL | first-model-id BASE_URL | " \
        "ray-runtime-env ROOT [NAME ...]}"


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "http-ok":
        return 0 if http_ok(argv[1]) else 1
    if len(argv) == 2 and argv[0] == "first-model-id":
        try:
            print(first_model_id(argv[1]))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"error: cannot read the served model name from {argv[1]}/models: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) >= 2 and argv[0] == "ray-runtime-env":
        print(json.dumps(ray_runtime_env(argv[1], argv[2:]), separators=(",", ":")))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

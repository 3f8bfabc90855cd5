"""Small programs ``train_scripts/lib.sh`` runs: ``python -m openrlhf_classmate.script_helpers COMMAND ARGS``.

Logic that bash would do badly (HTTP, JSON, YAML) lives here, as functions with tests, instead of inline Python in
the shell library. Standard library only (and PyYAML, the launcher's config reader, for ``fit-micro-batches``): it
runs before (and without) any training stack.

Commands:

* ``http-ok URL [KEY_ENV]``: exit 0 when GET URL answers with a status below 400 within 5 s (as ``curl -f``), 1
  otherwise (lib.sh's fallback where curl is missing);
* ``first-model-id BASE_URL [KEY_ENV]``: print the first model id of GET BASE_URL/models (an OpenAI-compatible
  server);
  both send ``Authorization: Bearer <key>`` where the environment variable KEY_ENV holds a key (its name, not the key,
  is the argument: a process listing shows arguments);
* ``ray-runtime-env ROOT NAME...``: print the Ray job's runtime env as JSON: ROOT as working directory (large folders
  excluded) and the environment variables NAME... that are set;
* ``fit-micro-batches CONFIG ACTOR_GPUS FLAG...``: print (one token a line) the ``--train.micro_batch_size`` /
  ``--rollout.micro_batch_size`` flags that fit the batch sizes of CONFIG, overridden by FLAG..., to ACTOR_GPUS
  actor GPUs (``integration/launch/layout.py``: ``fit_micro_batches``); nothing when the config's fit, or when no
  micro-batch size would (the launcher's preflight then names values that work). A micro-batch size among FLAG...
  is the user's and kept. Says what it changed on stderr.
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


def _get(url: str, api_key_env: str | None) -> urllib.request.Request:
    """A GET request for ``url``, with the API key of the environment variable ``api_key_env`` where it holds one."""
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})


def http_ok(url: str, timeout_s: float = 5.0, api_key_env: str | None = None) -> bool:
    """True when GET ``url`` answers with a status below 400 (redirects followed) within ``timeout_s``."""
    try:
        urllib.request.urlopen(_get(url, api_key_env), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):  # URLError, HTTPError, timeouts, connection refused; ValueError: a malformed URL
        return False


def first_model_id(base_url: str, timeout_s: float = 10.0, api_key_env: str | None = None) -> str:
    """The first model id served at ``base_url``/models."""
    with urllib.request.urlopen(_get(base_url.rstrip("/") + "/models", api_key_env), timeout=timeout_s) as response:
        return json.load(response)["data"][0]["id"]


def ray_runtime_env(root: str, names: Sequence[str], environ: Mapping[str, str] = os.environ) -> dict:
    """The runtime env of a ``ray job submit``: ``root`` as working directory and the listed variables that are set
    (each once, in the order given)."""
    env = {name: environ[name] for name in dict.fromkeys(names) if name in environ}
    return {"working_dir": root, "excludes": list(RAY_JOB_EXCLUDES), "env_vars": env}


def _config_values(path: str) -> dict[str, object]:
    """The config's values of the flags the batch arithmetic reads, by their dotted names (nested or dotted keys)."""
    import yaml

    def flat(tree: object, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in (tree.items() if isinstance(tree, dict) else ()):
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
        return out

    with open(path, encoding="utf-8") as f:
        return flat(yaml.safe_load(f))


def fit_micro_batches_flags(config: str, actor_gpus: int, flags: Sequence[str]) -> tuple[list[str], str | None]:
    """The micro-batch flags that fit CONFIG (overridden by ``flags``) to ``actor_gpus`` actor GPUs, and a line saying
    why; ``([], None)`` when nothing needs to change or nothing would help."""
    from openrlhf_classmate.integration.launch.layout import FLAGS, UPSTREAM_DEFAULTS, Batches, fit_micro_batches

    values = _config_values(config)
    given: set[str] = set()
    batches: dict[str, object] = {}
    for name, flag in FLAGS.items():
        value: object = values.get(flag[2:], UPSTREAM_DEFAULTS[name])
        for i, token in enumerate(flags):  # the last one wins, as in argparse
            if name == "dynamic":
                value = value or token == flag
                continue
            if token == flag and i + 1 < len(flags):
                value = flags[i + 1]
            elif token.startswith(flag + "="):
                value = token.split("=", 1)[1]
            else:
                continue
            given.add(name)
        batches[name] = bool(value) if name == "dynamic" else int(str(value))
    b = Batches(actor_gpus=actor_gpus, **batches)  # type: ignore[arg-type]
    fitted = fit_micro_batches(b, keep=given)
    if fitted is None or fitted == b:
        return [], None
    out, said = [], []
    for name in ("train_micro", "rollout_micro"):
        if getattr(fitted, name) != getattr(b, name):
            out += [FLAGS[name], str(getattr(fitted, name))]
            said.append(f"{FLAGS[name]} {getattr(fitted, name)} (the config's {getattr(b, name)} per GPU)")
    return out, (f"{actor_gpus} actor GPUs: {', '.join(said)}, so that each GPU trains a whole number of "
                 f"micro-batches per optimizer step of --train.batch_size {b.train_batch}")


USAGE = "usage: python -m openrlhf_classmate.script_helpers {http-ok URL [KEY_ENV] | first-model-id BASE_URL [KEY_ENV] | " \
        "ray-runtime-env ROOT [NAME ...] | fit-micro-batches CONFIG ACTOR_GPUS [FLAG ...]}"


def main(argv: Sequence[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "http-ok":
        return 0 if http_ok(argv[1], api_key_env=(argv[2:] or [None])[0]) else 1
    if len(argv) in (2, 3) and argv[0] == "first-model-id":
        try:
            print(first_model_id(argv[1], api_key_env=(argv[2:] or [None])[0]))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            print(f"error: cannot read the served model name from {argv[1]}/models: {e}", file=sys.stderr)
            return 1
        return 0
    if len(argv) >= 2 and argv[0] == "ray-runtime-env":
        print(json.dumps(ray_runtime_env(argv[1], argv[2:]), separators=(",", ":")))
        return 0
    if len(argv) >= 3 and argv[0] == "fit-micro-batches":
        try:
            flags, why = fit_micro_batches_flags(argv[1], int(argv[2]), argv[3:])
        except (OSError, ValueError, TypeError) as e:  # an unreadable config or a non-number: the preflight says it
            print(f"[train_scripts] micro-batch sizes not fitted ({type(e).__name__}: {e})", file=sys.stderr)
            return 0
        if why:
            print(f"[train_scripts] {why}", file=sys.stderr)
        if flags:
            print("\n".join(flags))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""Where the launcher's own seconds go before Ray starts (``startup/launcher_preflight_s``: ~20 s on the H200 machine,
1.8 s on a 2-core CPU machine): ``train_ppo_ray.main(["--check", ...])`` under cProfile, on a tiny local model.

    python bench/launcher_profile.py --out DIR [--model FOLDER] [--backend auto|vllm|hf]

Writes ``DIR/launcher_profile.json``: the wall seconds of ``main``, the 40 functions with the most cumulative and the
most own time, and every socket name lookup or connection with its seconds and the frames that made it (a machine
without network answers a DNS lookup only after its resolver's timeout, a constant cost that cProfile shows as time
inside ``getaddrinfo``). ``--check`` runs the same parsing, upstream pin check and preflight as a real launch, and
writes nothing else.

``--imports`` adds what cProfile cannot show well: each heavy package imported alone in a fresh process (twice: the
second under ``-X importtime``, which says which packages' modules took the time), a bare interpreter's start, the CUDA
driver's start (``torch.cuda.device_count()`` after ``import torch``), and ``python -X importtime`` of the same
``main(["--check", ...])`` in a fresh process, summed per top-level package (``imports`` in the JSON). On the GPU
machine the launcher's preflight took 12-18 s where this 2-core machine takes 2.6 s (GPU_RESULTS section 13): this
says whether it is the imports, the driver, or neither.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

LOOKUPS = ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getfqdn", "create_connection")


def watch_sockets(record: list[dict]) -> None:
    """Time every name lookup and connection this process makes, with the 8 innermost frames outside this file; a
    call inside another watched one (``create_connection`` looks its host up) is the outer one's time, not counted
    twice."""
    depth = threading.local()
    for name in LOOKUPS:
        original = getattr(socket, name)

        def timed(*a, _original=original, _name=name, **k):
            if getattr(depth, "n", 0):
                return _original(*a, **k)
            depth.n = 1
            t = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                depth.n = 0
                frames = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]
                          if f.filename != __file__][-8:]
                record.append({"call": _name, "args": repr(a[:2])[:120], "s": round(time.perf_counter() - t, 3),
                               "frames": frames})

        setattr(socket, name, timed)


def top(profile: cProfile.Profile, key: str, n: int = 40) -> list[dict]:
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (path, line, func), (_cc, calls, own, cum, _callers) in stats.stats.items():
        rows.append({"function": f"{path}:{line} {func}", "calls": calls, "own_s": round(own, 3),
                     "cumulative_s": round(cum, 3)})
    rows.sort(key=lambda r: -r[key])
    return rows[:n]


# the launcher's heavy imports, and what an engine actor imports before vLLM's engine starts (our rollout module)
HEAVY = ("torch", "transformers", "ray", "deepspeed", "vllm", "openrlhf.trainer.ray",
         "openrlhf_classmate.integration.rollout.vllm_engine")
CUDA_START = ("import time, torch; t = time.perf_counter(); n = torch.cuda.device_count() if torch.cuda.is_available() "
              "else 0; print(n, time.perf_counter() - t)")


def timed_process(code: list[str], timeout_s: float = 300) -> dict:
    """Wall seconds of one fresh Python process running ``code`` (its arguments after the interpreter), its output,
    and ``error`` (the last stderr line that is not ``-X importtime``'s) when it failed or ran past ``timeout_s``."""
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    try:
        run = subprocess.run([sys.executable, *code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"s": None, "error": f"over {timeout_s:.0f} s", "stdout": "", "stderr": ""}
    out = {"s": round(time.perf_counter() - t, 3), "stdout": run.stdout, "stderr": run.stderr}
    if run.returncode:
        said = [line for line in run.stderr.strip().splitlines() if not line.startswith("import time:")]
        out["error"] = (said or [f"exit {run.returncode}"])[-1][-300:]
    return out


def importtime_by_package(stderr: str) -> tuple[float, list[dict]]:
    """``python -X importtime``'s lines (``import time: self [us] | cumulative | name``, nested names indented) per
    top-level package: ``s``, the outermost imports' cumulative seconds (a package that imports torch first carries
    torch's time), and ``own_s``, its modules' own seconds wherever they were imported from. Returns the total of the
    outermost imports and the packages, the largest of either figure first.

    Two limits of the format: a module loaded by ``importlib.import_module`` (upstream's CLI through
    ``launch/args.py``, transformers' lazy modules) has no line, so its own seconds are missing and its imports count
    as outermost; and the interpreter's own start-up imports (``site``, ``encodings``, ...) are among the packages."""
    outer: collections.Counter = collections.Counter()  # microseconds, summed as integers
    own: collections.Counter = collections.Counter()
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header line
        name = parts[2][1:].rstrip()  # after the separator's space, two more per level of nesting
        package = name.strip().split(".")[0]
        own[package] += int(parts[0])
        if not name.startswith(" "):  # not nested inside an outer import (that one's cumulative holds it)
            outer[package] += int(parts[1])
    rows = [{"package": k, "s": round(outer[k] / 1e6, 3), "own_s": round(own[k] / 1e6, 3)}
            for k in sorted(own, key=lambda k: -max(outer[k], own[k]))]
    return round(sum(outer.values()) / 1e6, 3), rows


def cuda_start(stdout: str) -> dict:
    """The CUDA probe's last line, ``<devices> <seconds>`` (anything a library printed before it is not the probe's)."""
    count, seconds = (stdout.strip().splitlines() or [""])[-1].split()
    return {"devices": int(count), "s": round(float(seconds), 3)}


def import_costs(argv: list[str], modules: tuple[str, ...]) -> dict:
    """Fresh processes: the bare interpreter, each module alone (twice: the second under ``-X importtime``), the CUDA
    driver's start, and ``-X importtime`` of the launcher's ``main(--check)``. They run after this process's own
    profile, so the files are in the page cache for both runs."""
    result: dict = {"bare_s": timed_process(["-c", "pass"])["s"], "modules": {}}
    for module in modules:
        runs = [timed_process([*flags, "-c", f"import {module}"]) for flags in ([], ["-X", "importtime"])]
        errors = [r["error"] for r in runs if r.get("error")]
        result["modules"][module] = {"s": [r["s"] for r in runs], "error": errors[-1] if errors else None,
                                     "packages": importtime_by_package(runs[-1]["stderr"])[1][:10]}
    cuda = timed_process(["-c", CUDA_START])
    try:
        result["cuda_start"] = {**cuda_start(cuda["stdout"]), "process_s": cuda["s"]}
    except ValueError:
        result["cuda_start"] = {"error": cuda.get("error") or cuda["stdout"][-300:]}
    check = timed_process(["-X", "importtime", "-c", "import sys; from openrlhf_classmate.cli.train_ppo_ray import "
                           f"main; main({argv!r})"])
    total, packages = importtime_by_package(check["stderr"])
    result["check"] = {"process_s": check["s"], "error": check.get("error"), "import_s": total,
                       "packages": packages[:25]}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for launcher_profile.json")
    p.add_argument("--model", help="a model folder for the policy and classmate (default: a tiny one built here)")
    p.add_argument("--backend", default="auto", choices=("auto", "vllm", "hf"), help="--engine.backend")
    p.add_argument("--imports", action="store_true", help="also time imports and the CUDA driver in fresh processes")
    p.add_argument("--modules", default=",".join(HEAVY), help="with --imports: the modules imported one at a time")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lookups: list[dict] = []
    watch_sockets(lookups)

    work = tempfile.mkdtemp(prefix="launcher_profile_")
    policy = a.model
    if policy is None:  # the tiny model's build imports torch and transformers before main(): --model does not
        from openrlhf_classmate.testing.tiny_models import save_tiny_model

        policy = save_tiny_model(os.path.join(work, "policy"), ["1", "2", "+", "=", "?"], hidden_size=8, num_layers=1,
                                 num_heads=2)
    chat = [{"role": "user", "content": "1 + 1 = ?"}]
    data = os.path.join(work, "train.jsonl")
    label = json.dumps({"data_source": "gsm8k", "ground_truth": "2", "messages": chat})
    with open(data, "w") as f:
        f.writelines(json.dumps({"prompt": chat, "label": label}) + "\n" for _ in range(64))
    argv = ["--check", "--actor.model_name_or_path", policy, "--classmate.model_name_or_path", policy,
            "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--vllm.num_engines", "1",
            "--engine.backend", a.backend, "--data.prompt_dataset", data, "--data.input_key", "prompt",
            "--data.label_key", "label", "--data.apply_chat_template", "--rollout.n_samples_per_prompt", "2",
            "--rollout.batch_size", "2", "--rollout.micro_batch_size", "1", "--train.batch_size", "4",
            "--ckpt.path", os.path.join(work, "ckpt")]
    if a.backend != "hf":  # one GPU: the production layout, as bench/step_time.py launches it
        argv += ["--train.colocate_all", "--classmate.placement", "share", "--vllm.gpu_memory_utilization", "0.3",
                 "--classmate.gpu_memory_utilization", "0.2"]
    lookups.clear()  # the tiny model's own imports are not the launcher's

    t0 = time.perf_counter()
    from openrlhf_classmate.cli import train_ppo_ray  # what `python -m` imports before main()

    imported = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    error = None
    try:
        train_ppo_ray.main(argv)
    except SystemExit as e:  # a refused preflight still shows where its seconds went
        error = str(e)
    finally:
        profile.disable()
    done = time.perf_counter()
    result = {"backend": a.backend, "error": error, "import_s": round(imported - t0, 3), "main_s": round(done - imported, 3),
              "lookups": lookups, "lookup_s": round(sum(r["s"] for r in lookups), 3),
              "cumulative": top(profile, "cumulative_s"), "own": top(profile, "own_s")}
    if a.imports:
        result["imports"] = import_costs(argv, tuple(m for m in a.modules.split(",") if m))
    path = os.path.join(a.out, "launcher_profile.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"launcher import {result['import_s']:.2f} s, main(--check) {result['main_s']:.2f} s, "
          f"{len(lookups)} socket lookups/connections {result['lookup_s']:.2f} s -> {path}")
    for r in result["cumulative"][:25]:
        print(f"  {r['cumulative_s']:8.2f} {r['own_s']:8.2f}  {r['function'][-110:]}")
    for r in lookups:
        print(f"  socket {r['call']}{r['args']} {r['s']:.2f} s  <- {' <- '.join(reversed(r['frames'][-3:]))}")
    if a.imports:
        imports = result["imports"]
        print(f"fresh processes: bare interpreter {imports['bare_s']} s; CUDA start {imports['cuda_start']}")
        for module, r in imports["modules"].items():
            own = ", ".join(f"{p['package']} {p['own_s']:.1f}" for p in sorted(r["packages"], key=lambda p: -p["own_s"])[:5])
            print(f"  import {module}: {r['s']} s" + (f"  ({r['error']})" if r["error"] else f"  own: {own}"))
        check = imports["check"]
        print(f"  main(--check) in a fresh process {check['process_s']} s, of which imports {check['import_s']} s:")
        print("    outermost  own  package")
        for r in check["packages"][:12]:
            print(f"    {r['s']:8.2f} {r['own_s']:6.2f}  {r['package']}")


if __name__ == "__main__":
    main()

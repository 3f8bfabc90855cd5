"""GPU validation of the launcher end to end (run by gpu_validate.sh; results in bench/GPU_RESULTS.md).

Each run builds the tiny world of ``openrlhf_classmate.testing.e2e`` (12 prompts x 4 samples, rollout batch 4: 3
steps), starts the launcher as a subprocess under local Ray with the real GPU(s), checkpoints every step, saves the
HF model, converts the last DeepSpeed checkpoint with ``convert_checkpoint`` and checks:

* 3 steps logged; every policy engine received 3 complete weight syncs and every classmate engine none
  (``engine_weight_updates.json``: the HF engine counts ``load_weights``, the vLLM engine ``CountingRolloutActor``);
* the classmate advantage is 0 outside the CoT (``classmate/adv_abs_outside_cot``, logged by the separated losses);
* the policy weights changed; the converted checkpoint equals the HF save (bf16 tolerance);
* ``vanilla_classmate``: real classmate log-probs of the CoT (``classmate/cot_logprob`` finite and negative);
* classmate engines not sharing the actor/ref GPUs' turn (``share`` on two GPUs, ``separate``): their generation
  overlapped the actor/ref forwards (``classmate/stage_overlap_time`` > 0).

A run needing more GPUs than the device has (``gpus_needed``: ``separate`` gives every engine a GPU of its own) is
skipped with the reason instead of waiting for Ray's placement groups.

Runs with ``engine="vllm"`` use real vLLM engines (hidden 256 / 4 heads: a head dimension vLLM's kernels accept) and
the weight sync upstream uses on a GPU: CUDA IPC with ``--train.colocate_all``, NCCL broadcast otherwise.
``--engine hf`` runs the same plans with HF engines and gloo (the CPU check of this script; no GPU needed).

Writes ``<plan>.json`` (after every run) and ``<plan>.log`` (the tail of each failed run's logs) to ``--out``, and
prints a table last. ``--budget-s``: runs that would not finish inside it are skipped (recorded as such), so a device
call of limited length still returns its results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import openrlhf_classmate  # noqa: E402,F401
from openrlhf_classmate.testing.e2e import (  # noqa: E402
    build_world,
    launcher_argv,
    max_weight_change,
    model_weights,
    run_launcher,
    tensorboard_scalars,
)

COLOCATE_ALL = ["--train.colocate_all", "--vllm.enable_sleep"]
CLASSMATE_COLOCATE = ["--classmate.placement", "colocate"]
CLASSMATE_SHARE = ["--classmate.placement", "share"]
CLASSMATE_SEPARATE = ["--classmate.placement", "separate"]
VANILLA = ["--classmate.loss", "vanilla_classmate", "--classmate.prompt_mode", "splice"]


@dataclass(frozen=True)
class Run:
    gpus: int
    engine: str  # "vllm" or "hf"
    zero: int
    estimator: str
    extra: list[str] = field(default_factory=list)
    policy_engines: int = 1
    classmate_engines: int = 1
    actor_gpus: int = 1
    expect_overlap: bool = False
    estimate_s: int = 240  # wall time on one H100 incl. engine start and conversion (budget planning)


RUNS = {
    # the HF-engine runs of the first GPU validation (bench/GPU_RESULTS.md section 1)
    "hf_zero2_separated": Run(1, "hf", 2, "separated", estimate_s=120),
    "hf_zero3_gdpo": Run(1, "hf", 3, "gdpo", estimate_s=90),
    # one GPU, real vLLM: everything colocated (upstream then syncs weights through CUDA IPC)
    "zero2_separated_colocate": Run(1, "vllm", 2, "separated", COLOCATE_ALL + CLASSMATE_COLOCATE),
    "zero3_gdpo_share": Run(1, "vllm", 3, "gdpo", COLOCATE_ALL + CLASSMATE_SHARE),
    "zero3_vanilla_colocate": Run(1, "vllm", 3, "separated", COLOCATE_ALL + CLASSMATE_COLOCATE + VANILLA),
    # two GPUs: actor/ref on one, policy + classmate engines on the other (NCCL broadcast across GPUs) ...
    "zero2_gdpo_share_2gpu": Run(2, "vllm", 2, "gdpo", CLASSMATE_SHARE, expect_overlap=True),
    # ... and ZeRO-3 over both GPUs with every engine colocated (one policy + one classmate engine per GPU)
    "zero3_gdpo_colocate_2gpu": Run(2, "vllm", 3, "gdpo", COLOCATE_ALL + CLASSMATE_COLOCATE
                                    + ["--classmate.num_engines", "2"], policy_engines=2, classmate_engines=2,
                                    actor_gpus=2, estimate_s=270),
    # the deployment shape of the reference implementation, --classmate.placement separate (engines of their own: one whole GPU each, so
    # it cannot fit two GPUs): actor + ref on GPU 0, the policy engine on GPU 1 (NCCL broadcast across GPUs), the
    # classmate engine on GPU 2, its generation overlapping the actor/ref forwards; 3 GPUs (kind nvidia-h200-x4)
    "zero2_gdpo_separate_3gpu": Run(3, "vllm", 2, "gdpo", CLASSMATE_SEPARATE, expect_overlap=True),
    # the closest two-GPU layout: actor/ref + policy engine on GPU 0 (colocate_all, CUDA IPC), the classmate engine
    # separate on GPU 1, overlapping the actor/ref forwards (the NCCL broadcast is zero2_gdpo_share_2gpu's)
    "zero2_gdpo_separate_2gpu": Run(2, "vllm", 2, "gdpo", COLOCATE_ALL + CLASSMATE_SEPARATE, expect_overlap=True),
}
PLANS = {
    "hf": ["hf_zero2_separated", "hf_zero3_gdpo"],
    "vllm1": ["zero2_separated_colocate", "zero3_gdpo_share", "zero3_vanilla_colocate"],
    "vllm2": ["zero2_gdpo_share_2gpu", "zero3_gdpo_colocate_2gpu", "zero2_gdpo_separate_2gpu"],
    "vllm3": ["zero2_gdpo_separate_3gpu"],
}


def gpus_needed(args) -> int:
    """GPUs a parsed launch asks Ray for: the launcher's own count (``integration/launch/layout.py``: upstream gives the
    actor group, the reference group (unless colocated with the actor), the policy engines (unless
    ``--train.colocate_all``) and the classmate engines of placement ``separate`` one whole-GPU Ray bundle per rank;
    colocated and shared groups take none of their own; HF engines none at all)."""
    from openrlhf_classmate.integration.launch.layout import layout_of

    return layout_of(args).total


def too_few_gpus(run: Run, engine: str, device_gpus: int) -> str | None:
    """Why ``run`` cannot start on a device with ``device_gpus`` GPUs (Ray would wait for its placement groups
    forever), or None; a machine without GPUs runs everything on Ray's logical GPUs."""
    if engine != "vllm" or device_gpus == 0 or device_gpus >= run.gpus:
        return None
    return f"needs {run.gpus} GPUs, the device has {device_gpus}"


def _set_flag(argv: list[str], flag: str, value: str) -> None:
    argv[argv.index(flag) + 1] = value


def run_argv(run: Run, world: dict[str, str], engine: str) -> list[str]:
    argv = launcher_argv(world, zero_stage=run.zero, estimator=run.estimator, max_samples=12,
                         extra=list(run.extra))  # 12 prompts / rollout batch 4 = 3 steps
    if run.actor_gpus > 1:
        _set_flag(argv, "--actor.num_gpus_per_node", str(run.actor_gpus))
        _set_flag(argv, "--ref.num_gpus_per_node", str(run.actor_gpus))
    _set_flag(argv, "--vllm.num_engines", str(run.policy_engines))
    if engine == "vllm":
        _set_flag(argv, "--vllm.sync_backend", "nccl")
        argv += ["--engine.backend", "vllm", "--vllm.enforce_eager", "--vllm.gpu_memory_utilization", "0.2",
                 "--classmate.gpu_memory_utilization", "0.15"]
    else:
        argv += ["--engine.backend", "hf"]
    return argv


def _steady(values: dict[int, float]) -> list[float]:
    return [round(v, 3) for _, v in sorted(values.items())]


def validate(name: str, run: Run, engine: str, work: str, out: str, timeout: int) -> dict:
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)  # no stale tensorboard events or checkpoints of an earlier attempt
    hidden = 256 if engine == "vllm" else None
    world = build_world(root, **({"policy_hidden": hidden, "classmate_hidden": hidden} if hidden else {}))
    argv = run_argv(run, world, engine)
    log = os.path.join(work, f"{name}.launcher.log")
    t0 = time.time()
    code = run_launcher(argv, log, timeout=timeout)
    if os.path.exists(log):  # the whole log comes back (the console keeps only a tail of a failed run)
        with open(log, "rb") as src, gzip.open(os.path.join(out, f"{name}.launcher.log.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    row: dict = {"run": name, "engine": engine, "gpus": run.gpus, "zero": run.zero, "estimator": run.estimator,
                 "flags": " ".join(run.extra), "exit": code, "wall_s": round(time.time() - t0, 1), "log": log}
    if code != 0:
        row["ok"] = False
        return row
    tb = tensorboard_scalars(os.path.join(root, "tb"))
    with open(os.path.join(root, "ckpt", "engine_weight_updates.json")) as f:
        updates = json.load(f)
    latest = open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip()
    change = max_weight_change(model_weights(world["policy"]), model_weights(os.path.join(root, "hf_final")))
    converted = os.path.join(root, "converted")
    try:
        conv = subprocess.run([sys.executable, "-m", "openrlhf_classmate.cli.convert_checkpoint",
                               os.path.join(root, "ckpt"), converted, "--base-model", world["policy"]],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        conv = subprocess.CompletedProcess(e.cmd, 124, stdout=str(e.stdout or ""), stderr="conversion timed out")
    conv_diff = None
    if conv.returncode == 0:
        conv_diff = max_weight_change(model_weights(os.path.join(root, "ckpt", f"{latest}_hf")),
                                      model_weights(converted))
    else:
        with open(os.path.join(work, f"{name}.convert.log"), "w") as f:
            f.write(conv.stdout + conv.stderr)
    steps = sorted(tb.get("train/classmate/reward", {}))
    outside = list(tb.get("train/classmate/adv_abs_outside_cot", {}).values())
    cot_logprob = list(tb.get("train/classmate/cot_logprob", {}).values())
    overlap = _steady(tb.get("train/classmate/stage_overlap_time", {}))
    checks = {
        "3 steps": steps == [1, 2, 3],
        "policy engines synced every step": updates["policy"] == [3] * run.policy_engines,
        "classmate engines never synced": updates["classmate"] == [0] * run.classmate_engines,
        "weights changed": change > 1e-4,
        "converted == HF save": conv.returncode == 0 and conv_diff is not None and conv_diff < 2e-2,
    }
    if outside:
        checks["classmate advantage 0 outside the CoT"] = all(v == 0.0 for v in outside)
    if "vanilla_classmate" in run.extra:
        checks["real classmate log-probs of the CoT"] = bool(cot_logprob) and all(
            math.isfinite(v) and -30 < v < 0 for v in cot_logprob)
    if run.expect_overlap:
        checks["classmate overlapped the actor/ref forwards"] = max(overlap, default=0.0) > 0
    row.update(
        steps=steps,
        policy_updates=updates["policy"],
        classmate_updates=updates["classmate"],
        latest_ckpt=latest,
        weight_change=change,
        converted_vs_hf_save=conv_diff,
        convert_exit=conv.returncode,
        adv_abs_outside_cot=outside,
        cot_logprob=[round(v, 3) for v in cot_logprob],
        step_time_s=_steady(tb.get("train/timing/step_total", {})),
        generation_s=_steady(tb.get("train/timing/generation", {})),
        weight_sync_s=_steady(tb.get("train/timing/broadcast", {})),
        classmate_stage_s=_steady(tb.get("train/classmate/stage_time", {})),
        classmate_overlap_s=overlap,
        main_reward=_steady(tb.get("train/reward", {})),
        classmate_reward=_steady(tb.get("train/classmate/reward", {})),
        checks=checks,
        ok=all(checks.values()),
    )
    return row


def _device() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _write_json(path: str, payload: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(path + ".tmp", path)


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return f"(no {path})\n"


def print_table(rows: list[dict]) -> None:
    print(f"\n{'run':<26}{'exit':>5}{'wall s':>8}{'steps':>6}  {'syncs policy/cm':<18}{'|dW|':>9}{'conv Δ':>9}  "
          f"{'cm stage s':<17}{'overlap s':<17}ok")
    for r in rows:
        if "skipped" in r:
            print(f"{r['run']:<26}  skipped: {r['skipped']}")
            continue
        if r["exit"] != 0 or "checks" not in r:
            print(f"{r['run']:<26}{r['exit']!s:>5}{r['wall_s']!s:>8}   failed (see the .log) {r.get('error', '')}")
            continue
        syncs = f"{r['policy_updates']}/{r['classmate_updates']}"
        conv = f"{r['converted_vs_hf_save']:.1e}" if r["converted_vs_hf_save"] is not None else "fail"
        stage = ",".join(f"{v:.2f}" for v in r["classmate_stage_s"])
        overlap = ",".join(f"{v:.2f}" for v in r["classmate_overlap_s"])
        failed = [k for k, v in r["checks"].items() if not v]
        print(f"{r['run']:<26}{r['exit']:>5}{r['wall_s']:>8}{len(r['steps']):>6}  {syncs:<18}"
              f"{r['weight_change']:>9.1e}{conv:>9}  {stage:<17}{overlap:<17}{r['ok']}"
              + (f"  failed: {'; '.join(failed)}" if failed else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", choices=sorted(PLANS), default="hf", help="which runs (see PLANS)")
    p.add_argument("--runs", default=None, help="comma-separated run names instead of a plan (see RUNS)")
    p.add_argument("--engine", choices=("plan", "hf"), default="plan",
                   help="hf: run the plan's runs with HF engines and gloo instead (CPU check of this script)")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_validate_out"))
    p.add_argument("--work", default=os.path.join(os.environ.get("WORK", "/tmp"), "gpu_validate"))
    p.add_argument("--budget-s", type=float, default=float("inf"), help="skip runs that would not end within this")
    p.add_argument("--name", default=None, help="file stem of the outputs (default: the plan)")
    p.add_argument("--fresh", action="store_true",
                   help="run again runs that an earlier call on this machine completed (default: reuse them)")
    a = p.parse_args()
    names = a.runs.split(",") if a.runs else PLANS[a.plan]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"error: unknown run(s) {unknown}; known: {sorted(RUNS)}")
    stem = a.name or (a.plan if not a.runs else "runs")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    device = _device()
    gpus = _gpu_count()
    start = time.time()
    rows: list[dict] = []
    with open(os.path.join(a.out, f"{stem}.log"), "w") as tails:
        for name in names:
            run = RUNS[name]
            engine = run.engine if a.engine == "plan" else "hf"
            left = a.budget_s - (time.time() - start)
            done = os.path.join(a.work, f"{name}.{engine}.result.json")
            if os.path.isfile(done) and not a.fresh:
                # a passing run of an earlier call on this (warm) machine: a plan can span several device calls
                rows.append({**json.load(open(done)), "from_earlier_call": True})
                print(f"{name}: passed in an earlier call on this machine (--fresh to run it again)", flush=True)
            elif too_few_gpus(run, engine, gpus):
                rows.append({"run": name, "skipped": too_few_gpus(run, engine, gpus), "ok": False})
            elif left < run.estimate_s:
                rows.append({"run": name, "skipped": f"{left:.0f} s left of --budget-s, about {run.estimate_s} s "
                             "needed", "ok": False})
            else:
                try:
                    row = validate(name, run, engine, a.work, a.out, timeout=int(min(600, left - 30)))
                except Exception as e:  # noqa: BLE001  (one broken run must not cost the others' results)
                    row = {"run": name, "exit": "error", "wall_s": None, "ok": False, "error": repr(e)[-2000:],
                           "log": os.path.join(a.work, f"{name}.launcher.log")}
                rows.append(row)
                if row.get("ok"):
                    _write_json(done, row)
                if not row.get("ok"):
                    for log in (row["log"], os.path.join(a.work, f"{name}.convert.log")):
                        if os.path.exists(log):
                            tails.write(f"===== {name}: {log} (last 150 lines)\n{_tail(log, 150)}\n")
                    tails.flush()
            _write_json(os.path.join(a.out, f"{stem}.json"), {"device": device, "engine": a.engine, "runs": rows})
    print_table(rows)
    sys.exit(0 if all(r.get("ok") for r in rows) else 1)


if __name__ == "__main__":
    main()

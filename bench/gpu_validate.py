"""GPU validation of the CPU end-to-end classmate run, unchanged except for the device (run by gpu_validate.sh).

For each (ZeRO stage, estimator) in the plan: the tiny world of ``openrlhf_classmate.testing.e2e``, the launcher as a
subprocess under local Ray with the real GPU (actor and ref colocated, policy and classmate HF engines on the GPU),
3 steps, a DeepSpeed checkpoint every step, the HF save, then the conversion entry point on the GPU-made checkpoint.
Prints a table last and writes ``gpu_validate.json`` (and the launcher logs) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

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

PLAN = [(2, "separated"), (3, "gdpo")]


def validate(zero: int, estimator: str, work: str, out: str) -> dict:
    root = os.path.join(work, f"zero{zero}_{estimator}")
    world = build_world(root)
    argv = launcher_argv(world, zero_stage=zero, estimator=estimator, max_samples=12)  # 12 prompts / 4 = 3 steps
    log = os.path.join(out, f"launcher_zero{zero}_{estimator}.log")
    t0 = time.time()
    code = run_launcher(argv, log, timeout=540)
    row = {"zero": zero, "estimator": estimator, "exit": code, "wall_s": round(time.time() - t0, 1)}
    if code != 0:
        return row
    tb = tensorboard_scalars(os.path.join(root, "tb"))
    with open(os.path.join(root, "ckpt", "engine_weight_updates.json")) as f:
        updates = json.load(f)
    latest = open(os.path.join(root, "ckpt", "_actor", "latest")).read().strip()
    change = max_weight_change(model_weights(world["policy"]), model_weights(os.path.join(root, "hf_final")))
    converted = os.path.join(root, "converted")
    conv = subprocess.run([sys.executable, "-m", "openrlhf_classmate.cli.convert_checkpoint",
                           os.path.join(root, "ckpt"), converted, "--base-model", world["policy"]],
                          capture_output=True, text=True, timeout=300)
    conv_diff = None
    if conv.returncode == 0:
        conv_diff = max_weight_change(model_weights(os.path.join(root, "ckpt", f"{latest}_hf")),
                                      model_weights(converted))
    else:
        with open(os.path.join(out, f"convert_zero{zero}_{estimator}.log"), "w") as f:
            f.write(conv.stdout + conv.stderr)
    steps = sorted(tb.get("train/classmate/reward", {}))
    row.update(
        steps=steps,
        policy_updates=updates["policy"],
        classmate_updates=updates["classmate"],
        latest_ckpt=latest,
        weight_change=change,
        converted_vs_hf_save=conv_diff,
        convert_exit=conv.returncode,
        step_time_s=[round(v, 2) for v in tb.get("train/timing/step_total", {}).values()],
        classmate_stage_s=[round(v, 2) for v in tb.get("train/classmate/stage_time", {}).values()],
        main_reward=[round(v, 3) for v in tb.get("train/reward", {}).values()],
        classmate_reward=[round(v, 3) for v in tb.get("train/classmate/reward", {}).values()],
        ok=(steps == [1, 2, 3] and updates == {"policy": [3], "classmate": [0]} and change > 1e-4
            and conv.returncode == 0 and conv_diff is not None and conv_diff < 2e-2),
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_validate_out"))
    p.add_argument("--work", default="/tmp/gpu_validate")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import torch

    rows = [validate(zero, est, a.work, a.out) for zero, est in PLAN]
    with open(os.path.join(a.out, "gpu_validate.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "runs": rows},
                  f, indent=1)
    print(f"\n{'run':<16}{'exit':>5}{'wall s':>8}{'steps':>8}{'policy/cm syncs':>17}{'|dW|':>9}{'conv Δ':>9}  ok")
    for r in rows:
        name = f"ZeRO-{r['zero']} {r['estimator']}"
        if r["exit"] != 0:
            print(f"{name:<16}{r['exit']:>5}{r['wall_s']:>8}   (see launcher log)")
            continue
        syncs = f"{r['policy_updates']}/{r['classmate_updates']}"
        conv = f"{r['converted_vs_hf_save']:.1e}" if r["converted_vs_hf_save"] is not None else "fail"
        print(f"{name:<16}{r['exit']:>5}{r['wall_s']:>8}{len(r['steps']):>8}{syncs:>17}{r['weight_change']:>9.1e}"
              f"{conv:>9}  {r['ok']}")
    sys.exit(0 if all(r.get("ok") for r in rows) else 1)


if __name__ == "__main__":
    main()

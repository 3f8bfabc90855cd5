"""``python -m openrlhf_classmate.cli.evaluate`` on the GPU machine with the vLLM backend (run by gpu_validate.sh).

Two evaluations of the tiny e2e world's models (hidden 256 / 4 heads, so vLLM's kernels accept them), each a real
subprocess as a user would start it, both at evaluate's default ``--gpu-memory-utilization 0.85`` for the main model
*and* the classmate (so the second ``LLM`` starts only if the first one's memory was really freed):

1. ``judge``: judge-scored rows (``helpful_instructions``) against a local fake judge server: main model +
   classmate + CoT monitor, greedy with ``--samples 2`` (real vLLM refuses ``SamplingParams(n=2, temperature=0)``:
   evaluate generates once and repeats, so both samples of a prompt must be identical);
2. ``sampled``: the arithmetic rows, ``--temperature 1.0 --samples 4`` with the classmate (binary scores, pass@4).

Checks exit codes, the backend, record counts, that the classmate and the monitor ran, greedy samples identical,
finish reasons among vLLM's. Writes ``evaluate.json`` to ``--out`` and prints a table. ``--backend hf`` runs the same
on CPU (the check of this script).
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
from openrlhf_classmate.testing.e2e import TIMEOUT_EXIT, build_world, kill_session  # noqa: E402
from openrlhf_classmate.testing.judge_server import serve_judge as serve_in_thread  # noqa: E402

VLLM_FINISH_REASONS = {"stop", "length", "repetition", "abort", "error"}


def judge_rows(path: str, n: int = 12) -> str:
    with open(path, "w") as f:
        for i in range(n):
            messages = [{"role": "user", "content": f"{i % 5} + {(i // 5) % 5} = ?"}]
            label = {"data_source": "helpful_instructions", "ground_truth": None,
                     "raw_question_for_monitor": f"question {i}", "messages": messages}
            f.write(json.dumps({"prompt": messages, "label": json.dumps(label)}) + "\n")
    return path


def evaluate(name: str, argv: list[str], out_dir: str, timeout: int) -> dict:
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "openrlhf_classmate.cli.evaluate", *argv, "--output-dir", out_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_session(proc)  # evaluate and its vLLM engine-core processes
        stdout, stderr = proc.communicate()
        stderr, code = stderr + f"\n(killed after {timeout} s)", TIMEOUT_EXIT
    row = {"run": name, "exit": code, "wall_s": round(time.time() - t0, 1), "argv": " ".join(argv),
           "output_tail": (stdout + stderr)[-3000:]}
    if code != 0:
        row["ok"] = False
        return row
    summary = json.load(open(os.path.join(out_dir, "summary.json")))
    records = [json.loads(line) for line in open(os.path.join(out_dir, "samples.jsonl"))]
    row.update(summary={k: summary[k] for k in ("backend", "prompts", "samples_per_prompt", "metrics", "elapsed_s")},
               finish_reasons=sorted({r["finish_reason"] for r in records}),
               records=len(records))
    row["table"] = stdout.strip()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_evaluate_out"))
    p.add_argument("--work", default=os.path.join(os.environ.get("WORK", "/tmp"), "gpu_evaluate"))
    p.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--budget-s", type=float, default=900.0, help="both evaluations must end within this")
    a = p.parse_args()
    start = time.time()

    def timeout() -> int:
        return max(30, int(min(420, a.budget_s - (time.time() - start) - 10)))

    os.makedirs(a.out, exist_ok=True)
    world = build_world(os.path.join(a.work, "world"), num_prompts=8, policy_hidden=256, classmate_hidden=256)
    data = judge_rows(os.path.join(a.work, "judge.jsonl"))
    common = ["--model", world["policy"], "--classmate", world["classmate"], "--backend", a.backend,
              "--dtype", "bf16", "--quiet", "--no-plot"]
    if a.backend == "vllm":
        common.append("--enforce-eager")  # tiny models: start fast; decoding speed is not measured here
    rows = []
    with serve_in_thread() as judge:
        judge_argv = common + ["--data", data, "--monitor", "--judge-base-url", judge.base_url, "--samples", "2",
                               "--max-new-tokens", "24", "--classmate-max-new-tokens", "12"]
        row = evaluate("judge", judge_argv, os.path.join(a.work, "judge_eval"), timeout=timeout())
        row["judge_requests"] = len(judge.requests)
        rows.append(row)
    sampled_argv = common + ["--data", world["data"], "--temperature", "1.0", "--samples", "4",
                             "--max-new-tokens", "24", "--classmate-max-new-tokens", "12"]
    rows.append(evaluate("sampled", sampled_argv, os.path.join(a.work, "sampled_eval"), timeout=timeout()))

    for row in rows:
        if row["exit"] != 0:
            continue
        out_dir = os.path.join(a.work, f"{row['run']}_eval")
        records = [json.loads(line) for line in open(os.path.join(out_dir, "samples.jsonl"))]
        metrics = next(iter(row["summary"]["metrics"].values()))
        checks = {
            "backend": row["summary"]["backend"] == a.backend,
            "all samples": row["records"] == row["summary"]["prompts"] * row["summary"]["samples_per_prompt"],
            "classmate ran": metrics.get("classmate_valid_fraction") is not None,
            "vLLM finish reasons": set(row["finish_reasons"]) <= VLLM_FINISH_REASONS,
        }
        if row["run"] == "judge":
            by_prompt: dict[int, set] = {}
            for r in records:
                by_prompt.setdefault(r["prompt_index"], set()).add(r["response"])
            checks["greedy samples identical"] = all(len(v) == 1 for v in by_prompt.values())
            checks["monitor ran"] = "monitor" in metrics and row["judge_requests"] > 0
        else:
            checks["pass@4 reported"] = "pass@4" in metrics
        row.update(checks=checks, ok=all(checks.values()))
    device = "cpu"
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    with open(os.path.join(a.out, "evaluate.json"), "w") as f:
        json.dump({"device": device, "backend": a.backend, "runs": rows}, f, indent=1)
    print(f"\n{'evaluate run':<14}{'exit':>5}{'wall s':>8}{'records':>9}  finish reasons        ok")
    for row in rows:
        if row["exit"] != 0:
            print(f"{row['run']:<14}{row['exit']:>5}{row['wall_s']:>8}   failed:\n{row['output_tail'][-1500:]}")
            continue
        failed = [k for k, v in row["checks"].items() if not v]
        print(f"{row['run']:<14}{row['exit']:>5}{row['wall_s']:>8}{row['records']:>9}  "
              f"{','.join(row['finish_reasons']):<22}{row['ok']}" + (f"  failed: {failed}" if failed else ""))
        print(row["table"])
    sys.exit(0 if all(r.get("ok") for r in rows) else 1)


if __name__ == "__main__":
    main()
